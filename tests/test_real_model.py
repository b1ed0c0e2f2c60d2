"""lab/real_model.py, the measures results/real_model/PROTOCOL.md fixed before its runs: the steps without a mixed
group and whether a collapse was driven by the policy gradient or was drift, the paired bootstrap of a difference
in held-out EM (checked against a hand computation and its limits), and bad input as one line."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

import real_model as R  # noqa: E402


def write_run(folder: Path, rewards, zero_std, lr=1e-4, llds=0.0, seed=0, dlogp=None) -> Path:
    """A run's args.json and metrics.jsonl; the fixed probe on even steps: probe/dlogp_correct = dlogp(step) (default
    -0.01 a step) and probe/logp_correct = -0.5 + that change."""
    folder.mkdir(parents=True)
    (folder / "args.json").write_text(json.dumps({"lr": lr, "llds": llds, "seed": seed, "entropy_coef": 0.001}))
    dlogp = dlogp or (lambda s: -0.01 * s)
    rows = [{"step": s, "rollout/reward": r, "rollout/frac_zero_std_groups": z, "rollout/searches_per_traj": 2.0,
             "rollout/valid_action_ratio": 1.0, "grpo/entropy": 0.5, "grpo/kl": 0.01, "perf/step_s": 100.0,
             "perf/step_cpu_s": 360.0, "probe/dlogp_correct": dlogp(s) if s % 2 == 0 else None,
             "probe/logp_correct": -0.5 + dlogp(s) if s % 2 == 0 else None}
            for s, (r, z) in enumerate(zip(rewards, zero_std), start=1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_collapse_with_signal_and_one_by_drift(tmp_path):
    rewards = [0.4, 0.3, 0.4, 0.3, 0.4] + [0.0] * 10  # start 0.36, collapses at step 6
    signal = R.run_row(write_run(tmp_path / "a", rewards, [0.5] * 4 + [1.0] + [1.0] * 10))
    assert signal["verdict"] == "collapsed" and signal["collapse_step"] == 6
    # steps 1-5 before the collapse: 4 of 5 held a mixed group = 0.8, the protocol's bar
    assert signal["signal_share"] == pytest.approx(0.8) and signal["driven_by"] == "policy gradient"
    assert signal["no_signal_steps"] == list(range(5, 16))
    assert signal["cpu_h"] == pytest.approx(15 * 360 / 3600) and signal["dlogp_correct_end"] == pytest.approx(-0.14)
    drift = R.run_row(write_run(tmp_path / "b", rewards, [0.5] * 3 + [1.0] * 12))
    assert drift["signal_share"] == pytest.approx(0.6) and drift["driven_by"] == "drift"
    held = R.run_row(write_run(tmp_path / "c", [0.3] * 15, [0.5] * 15))
    assert held["verdict"] == "held" and held["driven_by"] is None and held["signal_share"] is None
    table = R.rows_table([tmp_path / "a", tmp_path / "b"])
    assert table.count("\n| a |") == 1 and "| collapsed (6) |" in table and "| drift |" in table


def test_grid_verdicts_by_the_protocols_rules(tmp_path):
    collapsing = [0.4] * 9 + [0.0] * 11  # collapses at step 10
    held, mixed = [0.4] * 20, [0.5] * 20
    # the probe on even steps; its onset smooths 3 probes: falls_early's onset is 8 (spiral step 4), falls_late's 12
    falls_early = lambda s: 0.0 if s < 4 else -0.3 * (s - 2)  # noqa: E731
    falls_late = lambda s: 0.0 if s < 12 else -0.3 * (s - 10)  # noqa: E731
    for seed, dlogp in enumerate((falls_early, falls_early, falls_late)):
        write_run(tmp_path / f"l0_s{seed}", collapsing, mixed, seed=seed, dlogp=dlogp)
    for seed, (rewards, end) in enumerate(((held, -0.05), (collapsing, -0.05), (held, -9.0))):
        write_run(tmp_path / f"l2_s{seed}", rewards, mixed, llds=0.2, seed=seed, dlogp=lambda s, e=end: e * s / 20)
    assert [R.run_row(tmp_path / f"l0_s{k}")["probe_correct"] for k in range(3)] == [8, 8, 12]
    lines = R.grid_verdicts(sorted(tmp_path.iterdir()))
    assert lines == ["mechanism (probe onset at or before the collapse): shows (2 of 3)",
                     "Def. A.3 (spiral step at or before the collapse): visible (2 of 3)",
                     "LLDS keeps the probe likelihood up (pairs): keeps (2 of 3)",
                     "LLDS prevents the collapse: prevents (1 of 3 collapsed against plain GRPO's 3 of 3)"]
    assert R.share_verdict(1, 3, "yes", "no") == "no (1 of 3)"
    assert R.share_verdict(0, 0, "yes", "no") == "not tested (0 of 0)"
    assert R.share_verdict(1, 2, "yes", "no") == "inconclusive (1 of 2)"
    write_run(tmp_path / "short", held[:15], mixed, llds=0.2, seed=2)  # a run cut short is said
    assert R.grid_verdicts([tmp_path / "l0_s2", tmp_path / "short"])[-1].startswith("note: the runs differ in length")
    one = R.grid_verdicts([tmp_path / "l0_s0", tmp_path / "l2_s0"])  # plain GRPO collapsed once: nothing to prevent
    assert one[0].endswith("inconclusive (plain GRPO collapsed in 1 of 1, under 2)") and "not tested" in one[3]


def test_paired_bootstrap_by_hand_and_its_limits():
    base = np.array([0, 0, 1, 1, 0, 1, 0, 0])
    run = np.array([1, 0, 1, 0, 1, 1, 0, 1])  # differences +1, 0, 0, -1, +1, 0, 0, +1: mean 2/8
    d, lo, hi = R.paired_bootstrap(base, run, n=20_000)
    assert d == pytest.approx(0.25) and lo < 0.25 < hi
    # the resampled mean of 8 differences in {-1, 0, +1} with p = (1/8, 4/8, 3/8): sd sqrt((4/8 - 1/16) / 8) = 0.234
    assert (hi - lo) / (2 * 1.96) == pytest.approx(np.sqrt((0.5 - 0.0625) / 8), rel=0.1)
    same = R.paired_bootstrap(base, base)
    assert same == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)  # no difference: a degenerate interval at 0
    assert R.paired_bootstrap(np.zeros(50), np.ones(50))[1] == pytest.approx(1.0)  # every question gained
    with pytest.raises(ValueError, match="two equal, non-empty"):
        R.paired_bootstrap(base, run[:-1])


def test_em_table_pairs_by_question_and_bad_input_is_one_line(tmp_path):
    def records(path, ems):
        path.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Q{i}?", "em": e}) + "\n"
                                for i, e in enumerate(ems)))
        return path
    base = records(tmp_path / "base.jsonl", [0] * 40 + [1] * 10)
    better = records(tmp_path / "better.jsonl", [1] * 40 + [1] * 10)
    table = R.em_table(base, [better])
    assert "EM 0.200 on 50 questions" in table and "| 1.000 | +0.800 [+0." in table and table.endswith("| yes |")
    (tmp_path / "bad.jsonl").write_text('{"id": "q0", "question": "Q0?", "em": 1}\nnot json\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: not an evaluate.py record"):
        R.main(["em", "--base", str(base), str(tmp_path / "bad.jsonl")])
    with pytest.raises(SystemExit, match="args.json: not found"):
        R.main(["rows", str(tmp_path)])


def plotted_labels(draw) -> list:
    """The label of every line `draw()` plots (matplotlib's Axes.plot watched while it runs)."""
    import matplotlib.pyplot as plt

    seen, real_plot = [], plt.Axes.plot
    plt.Axes.plot = lambda self, *a, **k: seen.append(k.get("label")) or real_plot(self, *a, **k)
    try:
        draw()
    finally:
        plt.Axes.plot = real_plot
    return seen


def test_figure_puts_the_toy_beside_the_real_model_a_band_per_lambda(tmp_path, capsys):
    """figure OUT TITLE=RUN,... : a 5.5 x 7-inch column per title at 100 dpi (two: 1100 x 700 px); runs of one lambda
    drawn as one mean line and band; a column without '=' or a folder that is not a run is one line."""
    from PIL import Image

    runs = {(lam, s): write_run(tmp_path / f"l{lam}_s{s}", [0.3 - 0.01 * s * k for k in range(10)], [0.5] * 10,
                                llds=lam) for lam in (0.0, 0.2) for s in range(3)}
    toy = ",".join(str(runs[0.0, s]) for s in range(3)) + "," + ",".join(str(runs[0.2, s]) for s in range(3))
    out = tmp_path / "fig.png"
    R.main(["figure", str(out), f"toy={toy}", f"real={runs[0.0, 0]},{runs[0.2, 0]}"])
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    assert Image.open(out).size == (1100, 700)
    seen = plotted_labels(lambda: R.figure([f"toy={toy}"], tmp_path / "one.png"))
    labels = ["GRPO (λ=0): mean of 3 runs, band min-max", "GRPO + LLDS (λ=0.2): mean of 3 runs, band min-max"]
    assert seen == labels * 2  # a line per lambda in each of the two panels
    with pytest.raises(SystemExit, match="is not TITLE=RUN"):
        R.main(["figure", str(out), str(runs[0.0, 0])])
    with pytest.raises(SystemExit, match="args.json: not found"):
        R.main(["figure", str(out), f"x={tmp_path}"])


def test_figure_names_each_cure_its_own_line(tmp_path):
    """Runs with GSPO or CalibAdv on are drawn apart from plain GRPO's, named from args.json; the first run seen of a
    loss sets its colour, so the order on the command line is the legend's."""
    assert R.loss_name({"llds": 0.0}) == "GRPO (λ=0)" and R.loss_name({"llds": 0.2}) == "GRPO + LLDS (λ=0.2)"
    assert R.loss_name({"llds": 0.0, "policy_loss": "gspo", "calib_adv": 0.0}) == "GSPO (λ=0)"
    assert R.loss_name({"llds": 0.0, "policy_loss": "ppo-clip", "calib_adv": 1.0}) == "CalibAdv (λ=0)"
    assert R.loss_name({"llds": 0.2, "policy_loss": "gspo"}) == "GSPO + LLDS (λ=0.2)"
    runs = [write_run(tmp_path / name, [0.3] * 6, [0.5] * 6) for name in ("plain", "gspo", "calibadv")]
    for run, extra in zip(runs[1:], ({"policy_loss": "gspo"}, {"calib_adv": 1.0})):
        args = json.loads((run / "args.json").read_text())
        (run / "args.json").write_text(json.dumps({**args, **extra}))
    seen = plotted_labels(lambda: R.figure(["real=" + ",".join(map(str, runs))], tmp_path / "cures.png"))
    assert seen == [f"{n} (λ=0): 1 run" for n in ("GRPO", "GSPO", "CalibAdv")] * 2
