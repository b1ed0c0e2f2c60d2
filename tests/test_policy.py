"""policy.load_policy: every broken model folder, an unreachable hub and a mismatched tokenizer give one clear line that
names --model and the file (today's main: an empty tokenizer and an IndexError at step 1, safetensors' Rust error,
transformers' OSError, ~50 s of retries and an 80-line traceback)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policy import load_policy, safetensors_problem  # noqa: E402
from test_train import QUESTIONS  # noqa: E402
from retriever import DEMO_CORPUS  # noqa: E402
from tiny import build_model, build_tokenizer, save_tiny  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Path(save_tiny(tmp_path_factory.mktemp("policy") / "model"))


def broken(tiny, tmp_path, change) -> str:
    folder = tmp_path / "broken"
    shutil.copytree(tiny, folder)
    change(folder)
    return str(folder)


def truncate(name, keep=0.5):
    def change(folder):
        os.truncate(folder / name, int((folder / name).stat().st_size * keep))
    return change


def remove(*names):
    def change(folder):
        for name in names:
            (folder / name).unlink()
    return change


@pytest.mark.parametrize("change, message", [
    (remove("tokenizer.json", "tokenizer_config.json"), "no tokenizer files (tokenizer.json, tokenizer.model"),
    (remove("model.safetensors"), "no weights (model.safetensors or pytorch_model.bin)"),
    (truncate("model.safetensors"), "model.safetensors is truncated: 358876 bytes, its header describes 717752"),
    (truncate("model.safetensors", 0.001), "model.safetensors is truncated: 717 bytes, its header alone needs"),
    (lambda f: (f / "config.json").write_text('{"model_type": "qwen2", '), "config.json is not valid JSON (Expecting"),
    (remove("config.json"), "no config.json"),
])
def test_broken_model_folder_is_one_clear_line(tiny, tmp_path, change, message):
    folder = broken(tiny, tmp_path, change)
    with pytest.raises(ValueError) as err:
        load_policy(folder, "float32", "cpu")
    assert str(err.value).startswith(f"--model {folder}: ") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_safetensors_check_accepts_whole_files(tiny):
    assert safetensors_problem(tiny / "model.safetensors") is None
    load_policy(str(tiny), "float32", "cpu")  # and the folder loads


def test_tokenizer_larger_than_the_model_vocabulary(tmp_path):
    """A tokenizer from another model: ids past the embedding would fail inside the forward pass at step 1."""
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    model.resize_token_embeddings(len(tok) - 100)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"the tokenizer has {len(tok)} tokens but the model's embedding only "
                                         f"{len(tok) - 100} rows"):
        load_policy(str(tmp_path), "float32", "cpu")


def test_unreachable_hub_is_one_line_within_seconds(tmp_path):
    """A hub id not in the local cache, with the hub unreachable (HF_ENDPOINT on a closed loopback port, so the test
    behaves the same with or without internet): train.py stops in seconds with one line saying how to pass a local
    folder (today's main: ~50 s of retries, then an 80-line traceback)."""
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in DEMO_CORPUS))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    env.pop("HF_HUB_OFFLINE", None)
    t0 = time.time()
    r = subprocess.run([sys.executable, "train.py", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--train-data",
                        str(tmp_path / "q.jsonl"), "--corpus", str(tmp_path / "c.jsonl"), "--prompts-per-step", "2",
                        "--out-dir", str(tmp_path / "run")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("error: --model Qwen/Qwen2.5-0.5B-Instruct: not in the local cache and the Hugging Face "
                            "hub cannot be reached") and "hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir" in error
    assert time.time() - t0 < 60


def test_missing_path_and_a_non_gguf_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="--model /nope/model: no such folder or file"):
        load_policy("/nope/model")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="a file, but not a .gguf one"):
        load_policy(str(tmp_path / "weights.bin"))


def test_a_run_folder_loads_its_newest_checkpoint(tiny, tmp_path):
    import checkpoint

    for step in (1, 2):
        checkpoint.save(tmp_path, step, lambda folder: shutil.copytree(tiny, folder, dirs_exist_ok=True))
    model, tok, _ = load_policy(str(tmp_path), "float32", "cpu")
    assert len(tok) > 100 and torch.equal(model.lm_head.weight,
                                          load_policy(str(tiny), "float32", "cpu")[0].lm_head.weight)
    shutil.rmtree(tmp_path / "checkpoints")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ValueError, match="a run folder without a complete checkpoint"):
        load_policy(str(tmp_path))
