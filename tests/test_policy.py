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
from data import DEMO_CORPUS  # noqa: E402
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
    assert len(tok) > 100 and torch.equal(model.lm_head.weight,  # exact: the same file's bytes, loaded twice
                                          load_policy(str(tiny), "float32", "cpu")[0].lm_head.weight)
    shutil.rmtree(tmp_path / "checkpoints")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ValueError, match="a run folder without a complete checkpoint"):
        load_policy(str(tmp_path))


# ----------------------------------------------------------------------------------------------------------------------
# Log-probs under temperature


def test_p17_logp_from_logits_divides_logits_by_temperature():
    from policy import logp_from_logits
    from torch.testing import assert_close

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 11, generator=g) * 3
    targets = torch.randint(0, 11, (2, 4), generator=g)
    T = 0.7
    lp = logp_from_logits(logits, targets, temperature=T)
    want = torch.log_softmax(logits / T, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    assert_close(lp, want)
    # dividing the log-probs instead (the P17 bug) is a different quantity
    wrong = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1) / T
    assert (lp - wrong).abs().max().item() > 0.1
    # T = 1 is plain log_softmax; and the same call twice gives ratio exactly 1 (on-policy)
    plain = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    assert_close(logp_from_logits(logits, targets), plain)
    assert ((lp - logp_from_logits(logits, targets, temperature=T)).exp() == 1).all()  # exact: the same call twice
    # bf16 logits are computed in float32
    assert logp_from_logits(logits.bfloat16(), targets, T).dtype == torch.float32


def test_logp_and_entropy_from_one_log_softmax():
    from policy import logp_and_entropy_from_logits, logp_from_logits

    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    logp, ent = logp_and_entropy_from_logits(logits, targets, 0.7)
    torch.testing.assert_close(logp, logp_from_logits(logits, targets, 0.7))
    p = torch.softmax(logits / 0.7, -1)  # entropy written out by hand: -sum p log p of the T-scaled distribution
    torch.testing.assert_close(ent, -(p * p.log()).sum(-1))

def test_response_logp_agrees_with_the_plain_computation():
    """The memory-lean response_logp (all-padding columns cut, only the response positions' logits, chunked
    log-softmax, checkpointed entropy) gives the same logp [b, T] as response_logp_plain (the full forward, one
    log-softmax), for a micro-batch of mixed prompt and response lengths, at temperature 0.7, and its gradient too."""
    from policy import collate, response_logp, response_logp_plain
    from rollout import Episode

    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    g = torch.Generator().manual_seed(0)
    eps = []
    for i, (lp, lr) in enumerate([(5, 9), (12, 3), (7, 70), (3, 1)]):  # 70 > one 64-token chunk
        ids = torch.randint(3, len(tok), (lp + lr,), generator=g).tolist()
        mask = [1 if k % 5 else 0 for k in range(lr)]  # some observation tokens (0) inside the response
        eps.append(Episode("q", ["a"], "t", group_id=i, prompt_ids=ids[:lp], response_ids=ids[lp:], loss_mask=mask,
                           answer_mask=[0] * lr))
    batch = collate(eps, tok.pad_token_id)
    for rows in (slice(0, 4), slice(1, 3)):
        lean, ent = response_logp(model, batch, rows, 0.7, len(tok), with_entropy=True)
        plain = response_logp_plain(model, batch, rows, 0.7, len(tok))
        real = batch["attention_mask"][rows, -lean.shape[1]:] > 0  # [b, T] the response tokens that exist
        assert lean.shape == plain.shape == batch["loss_mask"][rows].shape and real.sum() >= 73
        torch.testing.assert_close(lean[real], plain[real], atol=1e-5, rtol=1e-5)
        assert ent.shape == lean.shape and (ent[real] > 0).all()
    w = batch["loss_mask"]  # 0 on padding too
    lean_grad = torch.autograd.grad((response_logp(model, batch, slice(0, 4), 0.7, len(tok))[0] * w).sum(),
                                    model.lm_head.weight)[0]
    plain_grad = torch.autograd.grad((response_logp_plain(model, batch, slice(0, 4), 0.7, len(tok)) * w).sum(),
                                     model.lm_head.weight)[0]
    torch.testing.assert_close(lean_grad, plain_grad, atol=1e-5, rtol=1e-4)


def test_policy_py_runs_alone(tiny):
    """`python policy.py MODEL`: checks and loads the folder and says what it is; a broken folder is one line."""
    r = subprocess.run([sys.executable, "policy.py", str(tiny)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1].startswith("Qwen2ForCausalLM: 0.2M parameters, 816 embedding rows, "
                                                        "tokenizer 800 tokens")
    r = subprocess.run([sys.executable, "policy.py", str(tiny / "nope")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and r.stderr.strip() == f"error: --model {tiny / 'nope'}: no such folder or file (pass a " \
                                                      "hub id, a model folder or a .gguf)"
