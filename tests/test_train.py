"""train.py and evaluate.py end to end on the tiny model, plus the log-prob pass they share (P14, P17, P18)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"

from retriever import DEMO_CORPUS, BM25Retriever  # noqa: E402
from rollout import rollout  # noqa: E402
from tiny import build_model, build_tokenizer, save_tiny  # noqa: E402
from train import batch_logp, collate, parse_args, response_logp  # noqa: E402

QUESTIONS = [
    {"question": "Where is the Eiffel Tower", "golden_answers": ["Paris"], "data_source": "toy"},
    {"question": "What is the capital of Germany", "golden_answers": ["Berlin"], "data_source": "toy"},
    {"question": "Which river flows through the Netherlands", "golden_answers": ["Rhine"], "data_source": "toy"},
]


def run(*cmd, cwd=ROOT):
    return subprocess.run([sys.executable, *cmd], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    (d / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (d / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in DEMO_CORPUS))
    return {"dir": d, "model": save_tiny(d / "model"), "q": str(d / "q.jsonl"), "corpus": str(d / "corpus.jsonl")}


SMALL = ["--prompts-per-step", "2", "--group-size", "4", "--max-turns", "2", "--max-new-tokens", "16",
         "--max-obs-tokens", "48", "--mini-batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-3"]


def test_train_runs_two_steps_and_writes_metrics_and_checkpoint(files):
    out = files["dir"] / "out"
    r = run("train.py", "--model", files["model"], "--train-data", files["q"], "--corpus", files["corpus"],
            "--steps", "2", "--llds", "0.1", "--out-dir", str(out), *SMALL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 1 |" in r.stdout + r.stderr and "step 2 |" in r.stdout + r.stderr
    lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for key in ("rollout/reward", "grpo/pg_loss", "grpo/kl", "grpo/entropy", "grpo/grad_norm", "grpo/clip_frac",
                "llds/penalty", "llds/gate_rate", "rollout/searches_per_traj", "diag/logp_incorrect"):
        assert key in lines[0], key
    # 8 trajectories in mini-batches of 4: the second mini-batch is off-policy, so LLDS sees a non-zero Delta
    assert any(m["llds/gate_rate"] > 0 for m in lines)
    assert (out / "checkpoint" / "config.json").exists() and not (out / "checkpoint.tmp").exists()
    assert (out / "rollouts_step1.jsonl").exists()

    ev = run("evaluate.py", "--model", str(out / "checkpoint"), "--data", files["q"], "--corpus", files["corpus"],
             "--max-new-tokens", "8", "--max-turns", "1", "--out", str(files["dir"] / "eval.json"))
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "average" in ev.stdout and "toy" in ev.stdout
    res = json.loads((files["dir"] / "eval.json").read_text())
    assert res["scores"]["toy"]["n"] == 3 and len(res["records"]) == 3


@pytest.mark.parametrize("bad, message", [
    ('{"question": "q?", "golden_answers": ["a"]}\n{"question": "no gold"}\n', ":2: field 'golden_answers'"),
    ('{"question": "q?", "golden_answers": ["a"]}\nnot json\n', ":2: not valid JSON"),
    ("", "no questions"),
])
def test_train_bad_question_file_is_one_clear_line(files, bad, message):
    f = files["dir"] / "bad.jsonl"
    f.write_text(bad)
    r = run("train.py", "--model", files["model"], "--train-data", str(f), "--corpus", files["corpus"], "--steps", "1")
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr


def test_train_missing_files_are_one_clear_line(files):
    r = run("train.py", "--model", files["model"], "--train-data", files["q"], "--corpus", "/nope/corpus.jsonl")
    assert r.returncode != 0 and "/nope/corpus.jsonl" in r.stderr and "Traceback" not in r.stderr
    r = run("train.py", "--model", "/nope/model", "--train-data", files["q"], "--corpus", files["corpus"])
    assert r.returncode != 0 and "/nope/model" in r.stderr and "Traceback" not in r.stderr


def test_parse_args_rejects_unknown_choices():
    assert parse_args(["--llds", "0.1", "--llds-gate", "response"]).llds_gate == "response"
    with pytest.raises(SystemExit):
        parse_args(["--llds-gate", "sentence"])


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_p17_p18_ratio_is_exactly_one_with_lr_zero(temperature):
    """Dropout in the config and T != 1: the rollout policy's log-probs recomputed for the update give ratio == 1."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(tok, seed=0, dropout=0.3)
    model.train()  # even if someone leaves the model in train mode, the passes below must be deterministic
    model.eval()
    eps = rollout(model, tok, QUESTIONS[:2], BM25Retriever(DEMO_CORPUS), group_size=2, max_turns=1,
                  max_new_tokens=12, max_obs_tokens=40, temperature=temperature, top_p=1.0)
    batch = collate(eps, tok.pad_token_id)
    old = batch_logp(model, batch, 2, temperature, len(tok))
    for i in range(0, len(eps), 2):
        logp, _ = response_logp(model, batch, slice(i, i + 2), temperature, len(tok), with_entropy=True)
        ratio = torch.exp(logp.detach() - old[i:i + 2]) * batch["loss_mask"][i:i + 2]
        assert torch.equal(ratio, batch["loss_mask"][i:i + 2])
    # and the log-probs are those of the temperature-scaled policy: at T=1 they differ
    other = batch_logp(model, batch, 2, 1.0, len(tok))
    assert not torch.allclose(other * batch["loss_mask"], old * batch["loss_mask"])


def test_collate_masks_by_position_not_by_pad_value():
    """P9/P10: a response whose last token is the pad id (pad == eos) keeps it in the loss and attention masks."""
    tok = build_tokenizer()

    class E:  # the fields collate reads
        def __init__(self, p, r, m):
            self.prompt_ids, self.response_ids, self.loss_mask, self.answer_mask = p, r, m, [0] * len(r)

    pad = tok.pad_token_id
    b = collate([E([5, 6, 7], [8, pad], [1, 1]), E([5], [8, 9, 10, 11], [1, 0, 0, 1])], pad)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, pad, pad, pad], [pad, pad, 5, 8, 9, 10, 11]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4, 4], [0, 0, 0, 1, 2, 3, 4]]
    assert b["loss_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 1]]


@pytest.mark.parametrize("script", ["retriever.py", "rollout.py", "grpo.py", "llds.py"])
def test_concept_file_runs_alone(script):
    r = run(script)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip()


def test_p24_eval_subset_is_fixed_and_seeded():
    from evaluate import score_table, select

    rows = [{"question": f"q{i}", "golden_answers": ["a"], "data_source": "x"} for i in range(50)]
    assert select(rows, 5, seed=0) == select(rows, 5, seed=0)  # the same questions at every evaluation
    assert select(rows, 5, seed=0) != select(rows, 5, seed=1)
    assert select(rows, 0, seed=0) == rows and select(rows, 500, seed=0) == rows
    table = score_table([{"data_source": "a", "em": 1.0}, {"data_source": "a", "em": 0.0}, {"data_source": "b", "em": 1.0}])
    assert table["a"] == {"em": 0.5, "n": 2} and table["b"] == {"em": 1.0, "n": 1}
    assert table["average"] == {"em": 0.75, "n": 3}  # unweighted mean over sources, as the paper's Avg
