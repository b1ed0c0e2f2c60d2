"""scripts/plot_run.py: the death-spiral panels of one or more train.py runs, from metrics.jsonl; bad run folders and
bad metrics lines give one clear line."""

import json
import math
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import hang  # noqa: E402
import plot_run as P  # noqa: E402



def fake_run(path, steps=40, llds=0.0, collapse_at=24, with_delta=True):
    """A run dir as train.py writes it: args.json and one metrics line per step, with a death spiral after
    `collapse_at` when llds == 0 (alarm/phase set from 6 steps before), nulls every 7th step and a non-number."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "args.json").write_text(json.dumps({"llds": llds}))
    lines = []
    for s in range(1, steps + 1):
        t = max(0, s - collapse_at) if llds == 0 else 0
        m = {"step": s, "rollout/reward": min(0.5, 0.02 * s) * math.exp(-0.15 * t),
             "diag/logp_correct": None if s % 7 == 0 else -0.3 - 0.002 * s - 0.02 * t ** 1.5,
             "diag/logp_incorrect": -0.5 - 0.004 * s, "grpo/grad_norm": 0.3 + (5.0 if t > 10 else 0.0),
             "grpo/entropy": 0.6 + 0.05 * t, "llds/gate_rate": 0.2 if llds else 0.0, "llds/penalty": 0.01 * (llds > 0),
             "rollout/searches_per_traj": "n/a" if s == 5 else 1.0,
             "alarm/phase": "" if llds or s <= collapse_at - 6 else "stagnation" if t == 0 else "steady decay" if t < 8
             else "acceleration"}
        if with_delta:
            m["diag/delta_correct"] = None if s % 7 == 0 else 0.5 - 0.08 * t ** 1.3
        lines.append(json.dumps(m))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_series_skips_null_and_non_numbers(tmp_path):
    h = P.read_metrics(fake_run(tmp_path / "r"))
    steps, vals = P.series(h, "diag/logp_correct")
    assert len(steps) == 40 - 5 and 7 not in steps and all(isinstance(v, float) for v in vals)  # 7, 14, .., 35 null
    assert 5 not in P.series(h, "rollout/searches_per_traj")[0]  # "n/a" skipped
    assert P.series([{"step": 1, "x": float("nan")}, {"step": 2, "x": True}, {"step": 3, "x": 2}], "x") == ([3], [2])
    assert P.series(h, "never/logged") == ([], [])


def test_plot_two_runs_writes_a_png(tmp_path):
    a, b = fake_run(tmp_path / "l0"), fake_run(tmp_path / "l02", llds=0.2, with_delta=False)
    assert P.run_label(a) == f"{a} (λ=0)" and P.run_label(b) == f"{b} (λ=0.2)"
    assert P.run_label(tmp_path) == str(tmp_path)  # no args.json: the folder alone
    out = P.plot_runs([a, b], tmp_path / "figs" / "both.png", labels=["GRPO", "GRPO+LLDS"])
    w, h = png_size(out)
    assert w > 1500 and h > 700 and out.stat().st_size > 50_000
    with pytest.raises(ValueError, match="1 labels for 2 runs"):
        P.plot_runs([a, b], tmp_path / "x.png", labels=["one"])


def test_bands_draw_each_settings_mean_and_range(tmp_path, monkeypatch):
    """--bands (README's figure): per label one line, the mean over its runs, and one band, their min-max range, on
    reward and on the fixed correct responses' likelihood; the legend names what the line and the band are."""
    runs = []
    for i, (llds, drop) in enumerate([(0, 0.0), (0, 0.5), (0.2, 0.0), (0.2, 0.2)]):
        run = fake_run(tmp_path / f"r{i}", steps=10, llds=llds)
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        for m in lines:
            m["probe/dlogp_correct"] = -drop * m["step"]
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
        runs.append(run)
    import matplotlib.axes

    drawn, real_plot, real_fill = [], matplotlib.axes.Axes.plot, matplotlib.axes.Axes.fill_between
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, x, y, *a, **kw: drawn.append(
        ("line", ax.get_title() or None, kw.get("label"), list(y))) or real_plot(ax, x, y, *a, **kw))
    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", lambda ax, x, lo, hi, *a, **kw: drawn.append(
        ("band", None, None, (list(lo), list(hi)))) or real_fill(ax, x, lo, hi, *a, **kw))
    out = P.plot_bands(runs, ["GRPO", "GRPO", "LLDS", "LLDS"], tmp_path / "bands.png")
    assert png_size(out)[0] > 1000
    lines = [d for d in drawn if d[0] == "line"]
    assert [d[2] for d in lines] == ["GRPO: mean of 2 runs, band min-max", "LLDS: mean of 2 runs, band min-max"] * 2
    probe_grpo, probe_llds = lines[2][3], lines[3][3]
    assert probe_grpo[-1] == pytest.approx(-2.5, rel=1e-12) and probe_llds[-1] == pytest.approx(-1.0, rel=1e-12)
    lo, hi = [d[3] for d in drawn if d[0] == "band"][2]  # the probe panel, GRPO: drops 0 and 0.5 a step
    assert lo[-1] == pytest.approx(-5.0, rel=1e-12) and hi[-1] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="3 labels for 4 runs"):
        P.plot_bands(runs, ["a", "b", "c"], tmp_path / "x.png")


def test_plot_command_default_path_and_bad_run_dirs(tmp_path):
    run = fake_run(tmp_path / "old", steps=12, with_delta=False)  # an old run: no delta_correct at all
    r = hang.run([sys.executable, "scripts/plot_run.py", str(run)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (run / "diagnostics.png").exists() and png_size(run / "diagnostics.png")[0] > 1500
    with pytest.raises(SystemExit, match=f"error: no metrics.jsonl in {re.escape(str(tmp_path))}"):
        P.main([str(tmp_path)])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("\n")
    with pytest.raises(SystemExit, match="metrics.jsonl: empty"):
        P.main([str(tmp_path / "empty")])
    bad = run / "metrics.jsonl"
    bad.write_text(bad.read_text().splitlines()[0] + '\n{"step": 2, "rollout/reward": 0.1\n')
    with pytest.raises(ValueError, match=re.escape(f"{bad}:2: not valid JSON")):
        P.read_metrics(run)
    bad.write_text('{"rollout/reward": 0.1}\n')
    with pytest.raises(ValueError, match=re.escape(f"{bad}:1: expected a JSON object with a numeric 'step'")):
        P.read_metrics(run)
