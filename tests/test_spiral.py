"""scripts/spiral.py's per-run measures, fixed in docs/spiral.md before any run: collapse (final reward < 0.05 after a
start of at least 0.2; its step: from where every later reward is < 0.1), the first phase II/III LLD alarm and its
lead over the collapse, the entropy and valid-action ratio at the end."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import spiral  # noqa: E402


def history(rewards, phases=None):
    phases = phases or [""] * len(rewards)
    return [{"step": s, "rollout/reward": r, "alarm/phase": p, "grpo/entropy": 0.5 + s, "perf/step_s": 2.0,
             "rollout/valid_action_ratio": 1.0 - s / 20} for s, (r, p) in enumerate(zip(rewards, phases), start=1)]


def test_a_collapse_its_step_and_the_alarms_lead():
    rewards = [0.5, 0.45, 0.4, 0.3, 0.12, 0.05, 0.0, 0.09, 0.0, 0.0, 0.0]
    phases = ["", "", "stagnation", "steady decay", "acceleration", "", "", "", "", "", ""]
    m = spiral.measures(history(rewards, phases))
    assert m["start_reward"] == pytest.approx(0.475) and m["final_reward"] == pytest.approx(0.018)
    assert m["collapse_step"] == 6  # 0.12 at step 5 is not below 0.1; from step 6 on every reward is
    assert m["alarm_step"] == 4 and m["lead"] == 2  # "stagnation" (phase I) does not count
    assert m["entropy_end"] == 11.5 and m["valid_actions_end"] == pytest.approx(0.45) and m["s_per_step"] == 2.0


def test_no_collapse_when_reward_holds_or_never_started():
    held = spiral.measures(history([0.5, 0.4, 0.3, 0.35, 0.4, 0.3, 0.45], ["", "", "", "steady decay", "", "", ""]))
    assert held["collapse_step"] is None and held["lead"] is None and held["alarm_step"] == 4
    never = spiral.measures(history([0.1, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0]))  # start < 0.2: nothing to lose
    assert never["collapse_step"] is None and never["final_reward"] == 0.0


def test_a_killed_evaluation_is_run_again(tmp_path):
    """evaluate.py keeps an earlier evaluation's files unless --overwrite: the records a killed evaluation left
    (eval.jsonl.partial, no eval.json) must not stop spiral.py's rerun, which evaluates the run again."""
    import json

    from retriever import DEMO_CORPUS
    from tiny import save_tiny

    files = {"test": tmp_path / "test.jsonl", "corpus": tmp_path / "corpus.jsonl"}
    files["test"].write_text("".join(json.dumps({"question": f"Where is thing {i}", "golden_answers": ["Paris"]}) + "\n"
                                     for i in range(2)))
    files["corpus"].write_text("".join(json.dumps(c) + "\n" for c in DEMO_CORPUS))
    out = tmp_path / "eval.json"
    (tmp_path / "eval.jsonl.partial").write_text(json.dumps({"question": "Where is thing 0", "em": 0.0}) + "\n")
    em = spiral.evaluate_on_test(Path(save_tiny(tmp_path / "model")), files, out)
    assert 0.0 <= em <= 1.0 and len(json.loads(out.read_text())["records"]) == 2
    assert not (tmp_path / "eval.jsonl.partial").exists()
