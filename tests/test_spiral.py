"""lab/spiral.py's per-run measures, fixed before any run (results/spiral/grid4.md's protocol): collapse
on 5-step reward windows (collapsed / degraded / held, and its step), the onsets of the fall of the correct and
incorrect responses' likelihood and the lead of the first over the collapse, the first phase II/III LLD alarm, the
entropy and valid-action ratio at the end; a cell's counts over worlds and seeds; resuming a stopped grid."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

import hang  # noqa: E402
import spiral  # noqa: E402


def history(rewards, phases=None):
    phases = phases or [""] * len(rewards)
    return [{"step": s, "rollout/reward": r, "alarm/phase": p, "grpo/entropy": 0.5 + s, "perf/step_s": 2.0,
             "rollout/valid_action_ratio": 1.0 - s / 20} for s, (r, p) in enumerate(zip(rewards, phases), start=1)]


def test_a_collapse_its_step_the_likelihood_onsets_and_the_alarm():
    rewards = [0.3, 0.35, 0.25, 0.3, 0.3, 0.2, 0.1, 0.05, 0.0, 0.03, 0.0, 0.0, 0.0, 0.0, 0.0]
    phases = ["", "", "stagnation", "steady decay", "acceleration"] + [""] * 10
    correct = [-1.0] * 4 + [-1.05, -1.2, -1.3, -1.4, None, -1.6] + [None] * 5  # falls from step 6 on, for good
    incorrect = [-2.0] * 2 + [-2.2, -2.4, -2.6, -2.8] + [-3.0] * 9
    h = [{**r, "diag/logp_correct": c, "diag/logp_incorrect": i}
         for r, c, i in zip(history(rewards, phases), correct, incorrect)]
    m = spiral.measures(h)
    assert m["start_reward"] == pytest.approx(0.3) and m["final_reward"] == pytest.approx(0.0, abs=1e-12)
    assert m["verdict"] == "collapsed"
    # windows of 5 steps from step 6 on: (0.2 + 0.1 + 0.05 + 0 + 0.03) / 5 = 0.076 > 0.3 / 4; from step 7: 0.036,
    # but step 7's own reward, 0.1, is above 0.075: the collapse step moves on to step 8 (0.05)
    assert m["collapse_step"] == 8
    # smoothed (3 values) correct: steps 3-4 -1.0, 5 -1.0167, 6 -1.0833, 7 -1.1833 < -1.0 - 0.1 and below after
    assert m["onset_correct"] == 7 and m["lead"] == 1
    assert m["onset_incorrect"] == 4  # smoothed: step 3 -2.067 (the peak), step 4 -2.2 < -2.067 - 0.1, and lower after
    assert m["alarm_step"] == 4 and m["alarm_lead"] == 4  # "stagnation" (phase I) does not count
    assert m["entropy_end"] == pytest.approx(15.5) and m["valid_actions_end"] == pytest.approx(0.25)
    assert m["s_per_step"] == pytest.approx(2.0)


def test_a_dip_that_recovers_is_no_onset():
    assert spiral.fall_onset([-1.0] * 5 + [-1.5] * 3 + [-1.0] * 5) is None
    assert spiral.fall_onset([-1.0, None, -1.0, None, -1.0, -1.6, -1.6, -1.6]) == 6  # None skipped: (-1 - 1 - 1.6) / 3
    assert spiral.fall_onset([None] * 5) is None and spiral.fall_onset([-1.0, -2.0]) is None  # fewer than 3 values


def test_collapse_verdicts_do_not_flip_on_two_answers_in_160():
    """Collapsed (final <= start / 4) and held (final >= start / 2) are start / 4 apart: two more or fewer correct
    answers in the last 160 (5 steps x 32) move a run at most to or from "degraded", never from one to the other."""
    for start in (0.2, 0.3, 0.5):
        for correct in range(0, 161):
            final = correct / 160
            base = spiral.collapse([start] * 5 + [final] * 10)["verdict"]
            for d in (-2, -1, 1, 2):
                other = spiral.collapse([start] * 5 + [max(0, correct + d) / 160] * 10)["verdict"]
                assert {base, other} != {"collapsed", "held"}, (start, correct, d)
    assert spiral.collapse([0.3] * 5 + [0.063] * 5)["verdict"] == "collapsed"  # the 0.063 after 0.3
    assert spiral.collapse([0.05] * 5 + [0.0] * 5)["verdict"] == "low start"  # nothing to lose
    # a last step above start / 4 inside a collapsed last window: the step is found on full windows, (0.3 + 0 x 4) /
    # 5 <= 0.075 from step 5 on, then moved to the first step whose own reward is low: step 6, not step 5's 0.3
    assert spiral.collapse([0.3] * 5 + [0.0] * 9 + [0.25])["collapse_step"] == 6
    # the case: the first low window starts on a high-reward step (0.469), which is never the collapse step
    got = spiral.collapse([0.47, 0.44, 0.5, 0.45, 0.47, 0.469, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert got["verdict"] == "collapsed" and got["collapse_step"] == 7


def test_no_collapse_when_reward_holds():
    held = spiral.measures(history([0.5, 0.4, 0.3, 0.35, 0.4, 0.3, 0.45], ["", "", "", "steady decay", "", "", ""]))
    assert held["verdict"] == "held" and held["collapse_step"] is None and held["lead"] is None
    assert held["alarm_step"] == 4 and held["alarm_lead"] is None and held["onset_correct"] is None


def test_cell_summary_counts_hits_false_alarms_and_the_order_of_the_falls():
    runs = [  # collapsed: fell first + alarm hit; fell after + late alarm; never fell + no alarm; held with an alarm
        {"verdict": "collapsed", "collapse_step": 10, "onset_correct": 8, "onset_incorrect": 5, "alarm_step": 9},
        {"verdict": "collapsed", "collapse_step": 10, "onset_correct": 12, "onset_incorrect": 15, "alarm_step": 11},
        {"verdict": "collapsed", "collapse_step": 10, "onset_correct": None, "onset_incorrect": 4, "alarm_step": None},
        {"verdict": "held", "collapse_step": None, "onset_correct": None, "onset_incorrect": None, "alarm_step": 3},
        {"verdict": "degraded", "collapse_step": None, "onset_correct": 6, "onset_incorrect": None, "alarm_step": None}]
    assert spiral.cell_summary(runs) == {"runs": 5, "collapsed": 3, "degraded": 1, "held": 1, "fell_first": 1,
                                         "fell_after": 1, "never_fell": 1, "alarm_hits": 1, "false_alarms": 1,
                                         "incorrect_first": 2, "probe_first": 0, "probe_after": 0, "probe_never": 3,
                                         "spiral_first": 0, "probe_only": 0, "diag_only": 2}  # no probe logged


def test_probe_measures_see_a_fall_the_censored_one_cannot():
    """The collapse censors diag/logp_correct (no correct sample after step 6), while the fixed probe responses are
    scored at every step: their fall registers before the collapse, Def. A.3's spiral step too."""
    rewards = [0.3] * 6 + [0.0] * 9
    diag = [-1.0] * 6 + [None] * 9  # censored: undefined from the collapse on
    probe = [-1.0, -1.0, -1.0, -1.05, -1.2, -1.4, -1.6, -1.8, -2.0, -2.0, -2.1, -2.2, -2.2, -2.3, -2.4]
    dlogp = [p + 1.0 for p in probe]
    h = [{**r, "diag/logp_correct": d, "probe/logp_correct": p, "probe/dlogp_correct": x,
          "probe/logp_incorrect": -2.0, "probe/dlogp_incorrect": 0.0}
         for r, d, p, x in zip(history(rewards), diag, probe, dlogp)]
    m = spiral.measures(h)
    assert m["verdict"] == "collapsed" and m["collapse_step"] == 7
    assert m["onset_correct"] is None  # the old measure cannot see it
    # probe, smoothed over 3: step 5 -1.083, step 6 -1.217 < -1.0 - 0.1 (peak -1.0) and lower after
    assert m["probe_correct"] == 6 and m["probe_lead_correct"] == 1 and m["probe_incorrect"] is None
    # dlogp <= -0.1 from step 5 (-0.2) to the end (-1.4 <= -0.2): the spiral step
    assert m["spiral_step"] == 5 and m["dlogp_correct_end"] == pytest.approx(-1.4)
    c = spiral.cell_summary([m])
    assert (c["probe_first"], c["spiral_first"], c["probe_only"], c["diag_only"]) == (1, 1, 1, 0)
    assert spiral.spiral_step([-0.2, -0.3, -0.05, -0.3]) == 4 and spiral.spiral_step([-0.3, -0.5, 0.0]) is None
    assert spiral.spiral_step([-0.3, -0.5, -0.2]) == 3  # it recovered to -0.2 after -0.3: from step 3 on, as defined
    plain = [{"world": 1, "lr": 1e-3, "seed": s, "dlogp_correct_end": -1.0} for s in range(3)]
    llds = [{"world": 1, "lr": 1e-3, "seed": s, "dlogp_correct_end": v} for s, v in enumerate([-0.5, -2.0, None])]
    assert spiral.keeps_up(llds, plain) == (1, 2)


def test_a_killed_evaluation_is_run_again(tmp_path):
    """evaluate.py keeps an earlier evaluation's files unless --overwrite: the records a killed evaluation left
    (eval.jsonl.partial, no eval.json) must not stop spiral.py's rerun, which evaluates the run again."""
    import json

    from machinery.data import DEMO_CORPUS
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

    def as_from_a_shell():  # the child starts with SIGINT at its default and unblocked, as a user's command does
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    proc = subprocess.Popen([sys.executable, str(ROOT / "lab" / "spiral.py"), "--world", str(tmp_path / "world"),
                             "--out", str(tmp_path / "grid")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=as_from_a_shell)
    try:
        assert hang.readline(proc, "spiral.py's first line").startswith("building the world 0")  # inside main
        # In the full suite (never alone) the child ignored every SIGINT: it inherits this pytest process's signal
        # state, which earlier tests leave changed below Python's view (getsignal and the main thread's mask read
        # clean), so the child above starts from a shell's state. One Ctrl-C, then its effect is awaited: pressing
        # again every 5 s killed a clean exit that took longer on a busy machine (rc -2).
        proc.send_signal(signal.SIGINT)
        _, err = hang.wait(proc, "spiral.py still running after one Ctrl-C")
    finally:
        proc.kill()
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == ("interrupted. Continue with the same spiral.py command: finished runs are "
                                            "kept and an unfinished one resumes from its newest complete checkpoint")


def test_world_seeds_name_their_folders_and_the_tables_count_every_world():
    assert spiral.world_folder(Path("data/world"), 0) == Path("data/world")  # the one command's world
    assert spiral.world_folder(Path("data/world"), 12) == Path("data/world_seed12")
    run = {"lr": 1e-3, "llds": 0.0, "seed": 0, "start_reward": 0.3, "final_reward": 0.0, "verdict": "collapsed",
           "collapse_step": 9, "onset_correct": 6, "onset_incorrect": 4, "lead": 3, "alarm_step": 7, "alarm_lead": 2,
           "entropy_end": 1.5, "valid_actions_end": 0.5, "test_em": 0.01, "minutes": 1.25, "test_reward": None,
           "test_searches": None}
    rows = [{**run, "world": 11}, {**run, "world": 12, "verdict": "held", "final_reward": 0.3, "collapse_step": None,
                                   "lead": None, "test_em": 0.2}]
    lines = spiral.tables(rows, {11: {"em": 0.25}, 12: {"em": 0.3}})
    assert lines[0] == "warm start, per world: world 11: test EM 0.250; world 12: test EM 0.300"
    assert ("| 11 | 0.001 | 0 | 0 | 0.30 | 0.00 | collapsed | 9 | 6 | 4 | +3 | - | - | - | - | - / - | 7 | 1.50 | 0.50 "
            "| 0.010 | 1.2 |") in lines  # a run without probe figures: "-"
    assert lines[-1] == ("| 0.001 | 0 | 2 (2 worlds) | 1 / 0 / 1 | 1 / 0 / 0 | 0 / 0 / 1 | 0 | 0 / 1 | - | 1 / 1 | 2 "
                         "| 0.150 | 0.105 |")


def test_world_0_starts_from_the_committed_warm_start_and_another_recipe_trains_one(tmp_path, monkeypatch, capsys):
    """The one command's world 0 takes lab/world0_policy's weights (the same start on every machine) with the
    world rebuilt from its seed; --train-warm-start, or --world-flags of another recipe, trains one here."""
    class Built(Exception):
        pass

    def stop(*a, **kw):
        raise Built
    monkeypatch.setattr(spiral, "evaluate_on_test", stop)  # called once the world and its policy exist
    with pytest.raises(Built):
        spiral.main(["--world", str(tmp_path / "w"), "--out", str(tmp_path / "out")])
    policy = tmp_path / "w" / "policy"
    assert (policy / "model.safetensors").read_bytes() == (spiral.COMMITTED / "model.safetensors").read_bytes()
    assert (tmp_path / "w" / "corpus.jsonl").is_file() and (tmp_path / "w" / "world_train.jsonl").is_file()
    assert "with the committed warm start" in capsys.readouterr().out
    calls = []
    monkeypatch.setattr(spiral.search_world, "main", lambda argv: calls.append(argv))
    for flags in (["--train-warm-start"], ["--world-flags=--sft-steps 7"]):
        with pytest.raises(Built):
            spiral.main(["--world", str(tmp_path / f"w{len(calls)}"), "--out", str(tmp_path / "out"), *flags])
    assert [c[-1] for c in calls] == ["0", "7"]  # trained: --seed 0 with the default recipe; --sft-steps 7


def test_delta_tables_prints_every_row_of_every_file(tmp_path, capsys):
    """--delta-tables: one markdown row per probe.py result file x (k, lambda), the fraction with its interval, the
    set means by part; a probe with no mixed group reads "-" (nothing to average), never a number."""
    import json

    cells = {f"delta_{s}{p}": v for s, v in (("correct", 0.5), ("incorrect", -2.0))
             for p in ("", "_first", "_later", "_answer")}
    rows = [{"k": 1, "llds": 0.0, "groups": 48, "mixed": 7, "frac_neg": 2 / 7, "ci95": [0.08, 0.64], **cells},
            {"k": 2, "llds": 0.2, "groups": 48, "mixed": 0, "frac_neg": None, "ci95": [0.0, 1.0],
             **dict.fromkeys(cells)}]
    (tmp_path / "a.json").write_text(json.dumps({"args": {"model": "ckpt/step_5"}, "rows": rows}))
    spiral.main(["--delta-tables", str(tmp_path / "a.json")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[1].startswith("|---")
    assert lines[2] == ("| ckpt/step_5 | 1 | 0 | 7 / 48 | 0.29 [0.08, 0.64] | +0.50 / +0.50 / +0.50 / +0.50 "
                        "| -2.00 / -2.00 / -2.00 / -2.00 |")
    assert lines[3] == "| ckpt/step_5 | 2 | 0.2 | 0 / 48 | - | - / - / - / - | - / - / - / - |"


def test_probe_figure_draws_a_column_per_title_and_refuses_a_bad_one(tmp_path, capsys):
    """--probe-figure OUT TITLE=RUN,RUN ...: one 6-inch column per title at 100 dpi (two: 1200 px wide); a column
    without '=' is one argparse line naming the form."""
    import json

    import matplotlib.image

    runs = []
    for lam, rewards in ((0.0, [0.4, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0]), (0.2, [0.4, 0.3, 0.3, 0.4, 0.3, 0.4, 0.3])):
        run = tmp_path / f"llds{lam:g}"
        run.mkdir()
        (run / "args.json").write_text(json.dumps({"llds": lam}))
        (run / "metrics.jsonl").write_text("".join(json.dumps({**h, "probe/dlogp_correct": -0.1 * h["step"],
                                                               "probe/dlogp_incorrect": -0.2 * h["step"]}) + "\n"
                                                   for h in history(rewards)))
        runs.append(str(run))
    out = tmp_path / "side.png"
    spiral.main(["--probe-figure", str(out), f"toy={runs[0]},{runs[1]}", f"again={runs[1]}"])
    assert f"wrote {out}" in capsys.readouterr().out
    assert matplotlib.image.imread(out).shape[1] == 1200
    with pytest.raises(SystemExit):
        spiral.main(["--probe-figure", str(out), runs[0]])
    assert "is not TITLE=RUN[,RUN...]" in capsys.readouterr().err


def write_run(folder: Path, world: int, seed: int, rewards: list, dlogp: list, em: float, cpu_s: float = 3.0):
    """A finished spiral.py run folder as lab/cures.py reads it: metrics.jsonl, args.json and eval.json."""
    run = folder / f"world{world}_lr0.001_llds0_seed{seed}"
    run.mkdir(parents=True)
    h = [{**m, "probe/dlogp_correct": d, "probe/logp_correct": -1.0 + d, "perf/step_cpu_s": cpu_s}
         for m, d in zip(history(rewards), dlogp)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in h))
    (run / "args.json").write_text("{}")
    (run / "eval.json").write_text(json.dumps({"records": [{"em": em}, {"em": 0.0}]}))


def test_cures_judges_each_cell_against_the_baseline_by_the_protocols_rules(tmp_path, capsys):
    """lab/cures.py (issue 49): a cure that never collapses where the baseline collapsed 3 of 3, with its probe kept
    higher in every pair, "stops" the spiral; one that collapses as often but later "delays" it; the baseline's own
    twin has "no effect". The copy holds metrics and args, never rollouts or weights."""
    import cures

    fall = [0.4] * 6 + [0.0] * 9  # collapses at step 7
    late = [0.4] * 9 + [0.0] * 6  # collapses at step 10
    held = [0.4] * 15
    sinking, flat = [-0.05 * s for s in range(15)], [0.0] * 15
    for seed in range(3):
        write_run(tmp_path / "plain", 11, seed, fall, sinking, em=0.0, cpu_s=2.0)
        write_run(tmp_path / "twin", 11, seed, fall, sinking, em=0.0, cpu_s=2.0)
        write_run(tmp_path / "cure", 11, seed, held, flat, em=0.2, cpu_s=3.0)
        write_run(tmp_path / "later", 11, seed, late, sinking, em=0.0, cpu_s=2.0)
    (tmp_path / "plain" / "world11_lr0.001_llds0_seed9").mkdir()  # unfinished (no eval.json): left out
    cells = {name: cures.read_cell(tmp_path / name) for name in ("plain", "twin", "cure", "later")}
    assert [len(c) for c in cells.values()] == [3, 3, 3, 3]
    assert cures.verdict(cells["cure"], cells["plain"]) == "stops"
    assert cures.verdict(cells["later"], cells["plain"]) == "delays"
    assert cures.verdict(cells["twin"], cells["plain"]) == "no effect"
    assert cures.verdict(cells["twin"], cells["cure"]) == \
        "untested: the baseline collapsed in fewer than 3 runs"  # a baseline that never collapsed
    for seed, rewards in enumerate((fall, held, held)):  # a baseline with 1 collapse, its probe sinking in all 3
        write_run(tmp_path / "one", 11, seed, rewards, sinking, em=0.0)
    one = cures.read_cell(tmp_path / "one")  # the cure: fewer collapses, the probe kept up, but "stops" needs >= 3
    assert cures.verdict(cells["cure"], one) == "untested: the baseline collapsed in fewer than 3 runs"
    assert cures.verdict(cells["twin"][:1] + cells["later"][1:], cells["twin"]) == "delays"  # later in 2 of 3
    table = cures.tables(cells)
    assert "| cure | 3 | 0 / 0 / 3 | 0.400 | +0.000 [+0.000, +0.000] | 3 of 3 | 0 of 0 | 0.100 [0.100, 0.100] | " \
           "1.50x | stops |" in table
    cures.copy_runs(cells, tmp_path / "results")
    copied = sorted(p.relative_to(tmp_path / "results").as_posix() for p in (tmp_path / "results").rglob("*")
                    if p.is_file())
    assert copied[:2] == ["cure_world11_lr0.001_llds0_seed0/args.json", "cure_world11_lr0.001_llds0_seed0/metrics.jsonl"]
    assert len(copied) == 24
    with pytest.raises(SystemExit, match="no finished spiral.py run"):
        cures.read_cell(tmp_path / "results")
