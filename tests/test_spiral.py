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
    assert m["entropy_end"] == pytest.approx(11.5) and m["valid_actions_end"] == pytest.approx(0.45)
    assert m["s_per_step"] == pytest.approx(2.0)


def test_no_collapse_when_reward_holds_or_never_started():
    held = spiral.measures(history([0.5, 0.4, 0.3, 0.35, 0.4, 0.3, 0.45], ["", "", "", "steady decay", "", "", ""]))
    assert held["collapse_step"] is None and held["lead"] is None and held["alarm_step"] == 4
    never = spiral.measures(history([0.1, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0]))  # start < 0.2: nothing to lose
    assert never["collapse_step"] is None and never["final_reward"] == pytest.approx(0.0)


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


def test_an_unfinished_run_resumes_a_finished_one_of_other_steps_is_refused(tmp_path):
    """spiral.py passed --overwrite to train.py for every unfinished run, so the same command after Ctrl-C deleted the
    checkpoint Ctrl-C had just saved and started from step 1. A folder that holds a run is resumed now; one whose run
    has another length is refused rather than overwritten."""
    run = tmp_path / "run"
    assert spiral.resume_flags(run, 20) == []  # nothing there yet: a fresh run
    run.mkdir()
    assert spiral.resume_flags(run, 20) == []
    (run / "checkpoints").mkdir()  # killed inside its first save: train.py --resume starts it over
    assert spiral.resume_flags(run, 20) == ["--resume", str(run)]
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    assert spiral.resume_flags(run, 20) == ["--resume", str(run)]
    assert spiral.resume_flags(run, 20, fresh=True) == []  # --overwrite among the train.py flags: start afresh
    with pytest.raises(ValueError, match=f"{run} holds a run of 2 steps, not --steps 1: pass --steps 2 to reuse it"):
        spiral.resume_flags(run, 1)
    (run / "eval.json").write_text("{}")
    with pytest.raises(ValueError, match=f"{run} holds a finished run of 2 steps, not --steps 20"):
        spiral.resume_flags(run, 20, fresh=True)


def test_main_resumes_and_says_how_to_continue(tmp_path, monkeypatch, capsys):
    """spiral.main hands train.py --resume for a stopped run (never --overwrite) and its own rerun advice; a finished
    run is not trained again; a run folder of another length stops the grid before anything runs."""
    world, out = tmp_path / "world", tmp_path / "grid"
    (world / "policy").mkdir(parents=True)
    (world / "policy" / "config.json").write_text("{}")  # a built world: search_world is not run
    stopped, done = out / "lr0.001_llds0_seed0", out / "lr0.001_llds0_seed1"
    for run, steps in ((stopped, 2), (done, 5)):
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("{}\n" * steps)
    (done / "eval.json").write_text("{}")
    trained = []
    monkeypatch.setattr(spiral.train, "main", lambda args, rerun="": trained.append((args, rerun)))
    monkeypatch.setattr(spiral, "evaluate_on_test", lambda *a: 0.5)
    monkeypatch.setattr(spiral.plot_run, "read_metrics", lambda run: [
        {"step": s, "rollout/reward": 0.3, "rollout/valid_action_ratio": 1.0, "perf/step_s": 1.0} for s in range(5)])
    monkeypatch.setattr(spiral.plot_run, "plot_runs", lambda runs, path, labels: path)
    argv = ["--world", str(world), "--out", str(out), "--lambdas", "0", "--seeds", "0", "1", "--steps", "5"]
    spiral.main(argv)
    [(args, rerun)] = trained  # the finished seed 1 is reused
    assert (args.out_dir, args.resume, args.overwrite) == (str(stopped), str(stopped), False)
    assert rerun == "the same spiral.py command"
    with pytest.raises(SystemExit) as stop:
        spiral.main([*argv[:-1], "6"])  # seed 1 finished 5 steps: refused, not extended or overwritten
    assert stop.value.code == 2 and f"{done} holds a finished run of 5 steps, not --steps 6" in capsys.readouterr().err
    assert len(trained) == 1 and (done / "metrics.jsonl").read_text() == "{}\n" * 5


@pytest.mark.parametrize("flag", ["--world", "--out"])
def test_a_file_for_a_folder_is_one_line(tmp_path, capsys, flag):
    """--world FILE and --out FILE were FileExistsError tracebacks (after the world was built, for --out)."""
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as stop:
        spiral.main([flag, str(tmp_path / "file"), *(["--world", str(tmp_path / "w")] * (flag == "--out"))])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1].endswith(f"error: {flag} {tmp_path}/file: {tmp_path}/file is a file, "
                                                     "not a folder"), err


def test_ctrl_c_outside_a_training_step_is_one_line(tmp_path):
    """Ctrl-C while spiral.py builds the world or evaluates (or a second Ctrl-C inside train.py) was a KeyboardInterrupt
    traceback; it is one line saying that the same command continues."""
    import os
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "spiral.py"), "--world", str(tmp_path / "world"),
                             "--out", str(tmp_path / "grid")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout.readline().startswith("building the world")  # inside main, building
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == ("interrupted. Continue with the same spiral.py command: finished runs are "
                                            "kept and an unfinished one resumes from its newest complete checkpoint")
