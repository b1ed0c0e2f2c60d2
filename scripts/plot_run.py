"""Plot a training run's death-spiral diagnostics (v2 Sec. 5.1, Figs. 2, 4, 8, 9b) from train.py's metrics.jsonl.

One panel per quantity (reward, log-likelihood of correct and incorrect responses and their change over a step,
gradient norm, entropy, LLDS gate rate and penalty, searches, and the fixed probe responses of probe.py: their
likelihood, its change since step 0, and the correct ones' by action), one line per run, so a GRPO run and a GRPO +
LLDS run can be compared at a glance: in the paper the likelihood of correct responses falls first, the gradient norm
then spikes, and reward collapses last. The legend and the LLD alarms have a panel of their own (off the curves); a
panel whose scale a few outlying values would set (beyond 3 interquartile ranges) is scaled to the rest, and says
how many values are off it.

    python scripts/plot_run.py runs/l0 runs/l02 --out spiral.png    # two runs, one figure
    python scripts/plot_run.py runs/default                          # -> runs/default/diagnostics.png
    python scripts/plot_run.py runs/s0 runs/s1 runs/l0 runs/l1 --labels GRPO GRPO LLDS LLDS --bands --out b.png
"""

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machinery.data import read_jsonl  # noqa: E402


PANELS = (  # (title, y label, ((metrics key, line style, legend suffix), ...))
    ("Reward", "EM reward, mean over trajectories", (("rollout/reward", "-", ""),)),
    ("Log-likelihood of responses", "log π (nats / token)",
     (("diag/logp_correct", "-", "correct"), ("diag/logp_incorrect", ":", "incorrect"))),
    ("Per-step likelihood change over the update", "Δ log π (nats / response)",
     (("diag/delta_correct", "-", "correct"), ("diag/delta_incorrect", ":", "incorrect"))),
    ("Gradient norm", "pre-clip L2 norm (log scale)", (("grpo/grad_norm", "-", ""),)),
    ("Entropy", "nats / token", (("grpo/entropy", "-", ""),)),
    ("LLDS gate rate", "fraction of units gated", (("llds/gate_rate", "-", ""),)),
    ("LLDS penalty", "loss value, before λ", (("llds/penalty", "-", ""),)),
    ("Searches", "searches / trajectory", (("rollout/searches_per_traj", "-", ""),)),
    ("Probe: likelihood of fixed responses", "log π (nats / token)",
     (("probe/logp_correct", "-", "correct"), ("probe/logp_incorrect", ":", "incorrect"))),
    ("Probe: change since step 0 (Def. A.3)", "Δ log π (nats / token)",
     (("probe/dlogp_correct", "-", "correct"), ("probe/dlogp_incorrect", ":", "incorrect"))),
    ("Probe: correct responses by action (Fig. 5)", "log π (nats / token)",
     (("probe/logp_correct_first", "-", "first action"), ("probe/logp_correct_later", "--", "later actions"),
      ("probe/logp_correct_answer", ":", "answer span"))),
)


def read_metrics(run_dir) -> list[dict]:
    """The step records of RUN_DIR/metrics.jsonl. FileNotFoundError if absent; ValueError naming file:line if a line
    is not a JSON object with a numeric "step", or if there is no step at all."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir} (is it a train.py --out-dir?)")
    history = []
    for n, m in read_jsonl(path):  # ValueError naming file:line for bad bytes or JSON
        if not isinstance(m, dict) or not _num(m.get("step")):
            raise ValueError(f"{path}:{n}: expected a JSON object with a numeric 'step'")
        history.append(m)
    if not history:
        raise ValueError(f"{path}: empty, no step logged yet")
    return history


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def series(history: list[dict], key: str) -> tuple[list, list]:
    """(steps, values) of `key`, skipping steps where it is missing, null, non-numeric or not finite."""
    pts = [(m["step"], m[key]) for m in history if _num(m.get(key))]
    return [s for s, _ in pts], [v for _, v in pts]


def run_label(run_dir) -> str:
    """"runs/l0 (λ=0)": the run folder and its args.json `llds` (lambda), when there is one."""
    try:
        return f"{run_dir} (λ={json.loads((Path(run_dir) / 'args.json').read_text())['llds']:g})"
    except (OSError, ValueError, KeyError, TypeError):
        return str(run_dir)


def robust_limits(values: list, k: float = 3.0):
    """(low, high, how many values lie outside) for a y axis: the values' range, unless some lie more than k
    interquartile ranges beyond the quartiles (one -190 among values of -10 to 2), which are then left off scale;
    None when nothing would be left off."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if len(v) < 4:
        return None
    q1, q3 = np.percentile(v, [25, 75])
    iqr = max(q3 - q1, 1e-9)
    inside = v[(v >= q1 - k * iqr) & (v <= q3 + k * iqr)]
    off = len(v) - len(inside)
    if not off:
        return None
    pad = 0.1 * max(inside.max() - inside.min(), 1e-6)
    return inside.min() - pad, inside.max() + pad, off


def plot_runs(run_dirs: list, out, labels: list | None = None) -> Path:
    """Overlay the runs on PANELS; star the steps with an LLD alarm (alarm/phase, llds.lld_alarm) on the likelihood
    panel and line the first step of each new phase on every panel; the legend, with each run's alarms, is the last
    panel. Writes a PNG to `out` and returns its path."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    if labels and len(labels) != len(run_dirs):
        raise ValueError(f"--labels: {len(labels)} labels for {len(run_dirs)} runs")
    runs = [(labels[i] if labels else run_label(d), read_metrics(d)) for i, d in enumerate(run_dirs)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(3, 4, figsize=(20, 12.5), sharex=True, layout="constrained")
    for ax, (title, ylabel, lines) in zip(axes.flat, PANELS):
        for i, (label, history) in enumerate(runs):
            for key, style, part in lines:
                xs, ys = series(history, key)
                if xs:  # dots too on short runs, where a line alone hides single steps
                    ax.plot(xs, ys, style, color=colors[i % len(colors)], lw=1.6, label=f"{label} {part}".strip(),
                            marker="o" if len(xs) <= 20 else None, ms=3)
        if not ax.lines:  # e.g. diag/delta_correct in runs from before it was logged
            ax.text(0.5, 0.5, "not logged in these runs:\n" + "\n".join(k for k, _, _ in lines), ha="center",
                    va="center", transform=ax.transAxes, color="gray")
        elif title == "Gradient norm" and all(y > 0 for ln in ax.lines for y in ln.get_ydata()):
            ax.set_yscale("log")  # the collapse spikes the norm by orders of magnitude
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 2, 5)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if ax.lines and ax.get_yscale() == "linear" and (lim := robust_limits(
                [y for ln in ax.lines for y in ln.get_ydata()])):
            ax.set_ylim(lim[0], lim[1])
            ax.text(0.99, 0.01, f"{lim[2]} value(s) off scale", transform=ax.transAxes, ha="right", va="bottom",
                    fontsize=8, color="gray")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ll, key_ax, alarms = axes.flat[1], axes.flat[-1], []
    for i, (label, history) in enumerate(runs):
        color, logp = colors[i % len(colors)], dict(zip(*series(history, "diag/logp_correct")))
        flagged = [(m["step"], m["alarm/phase"]) for m in history if isinstance(m.get("alarm/phase"), str)
                   and m["alarm/phase"]]
        dots = [(s, logp[s]) for s, _ in flagged if s in logp]
        if dots:
            ll.plot(*zip(*dots), "o", color="red", ms=4)
        starts = [(step, phase) for k, (step, phase) in enumerate(flagged) if k == 0 or flagged[k - 1][1] != phase]
        for step, phase in starts:  # a new phase starts here: star and line; named in the legend panel
            if step in logp:
                ll.plot(step, logp[step], "*", color="red", mec="black", ms=14)
            for ax in axes.flat[:-1]:
                ax.axvline(step, color=color, ls="--", lw=0.8, alpha=0.6)
        if starts:
            alarms.append(f"{label}: " + ", ".join(f"{phase} at step {step}" for step, phase in starts))
    handles = [plt.Line2D([], [], color=colors[i % len(colors)], lw=2, label=label) for i, (label, _) in enumerate(runs)]
    handles += [plt.Line2D([], [], color="black", ls=style, label=part) for style, part in
                (("-", "correct (by action: first action)"), ("--", "later actions"),
                 (":", "incorrect (by action: answer span)"))]
    key_ax.axis("off")
    key_ax.legend(handles=handles, loc="upper left", fontsize=8, frameon=False)
    key_ax.text(0.0, 0.0, "LLD alarms (red dots; a star and a dashed line where a phase starts):\n" +
                "\n".join(alarms) if alarms else "LLD alarms: none", transform=key_ax.transAxes, fontsize=8,
                va="bottom", wrap=True)
    fig.suptitle("LLD death-spiral diagnostics (cf. arXiv 2512.04220, Fig. 2): " + ", ".join(l for l, _ in runs))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


BANDS = (("Reward", "EM reward, mean over trajectories", "rollout/reward"),
         ("Likelihood of the fixed correct responses", "change since step 0 (nats / token)", "probe/dlogp_correct"))


def plot_bands(run_dirs: list, labels: list, out) -> Path:
    """What a newcomer looks at first: reward and the fixed correct responses' likelihood (probe/dlogp_correct), one
    colour per label (its runs: the seeds of one setting), the mean over its runs as a line and their range (min to
    max at each step) as a band. Writes a PNG to `out` and returns its path. ValueError if the labels do not match
    the runs one to one."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(labels) != len(run_dirs):
        raise ValueError(f"--labels: {len(labels)} labels for {len(run_dirs)} runs")
    groups = {}
    for label, d in zip(labels, run_dirs):
        groups.setdefault(label, []).append(read_metrics(d))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for ax, (title, ylabel, key) in zip(axes, BANDS):
        for i, (label, runs) in enumerate(groups.items()):
            by_step = {}
            for history in runs:
                for x, y in zip(*series(history, key)):
                    by_step.setdefault(x, []).append(y)
            xs = sorted(by_step)
            if not xs:
                continue
            mean = [sum(by_step[x]) / len(by_step[x]) for x in xs]
            color = colors[i % len(colors)]
            ax.fill_between(xs, [min(by_step[x]) for x in xs], [max(by_step[x]) for x in xs], color=color,
                            alpha=0.2, lw=0)
            ax.plot(xs, mean, color=color, lw=2, label=f"{label}: mean of {len(runs)} runs, band min-max")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, frameon=False)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="+", help="train.py --out-dir folders (each with metrics.jsonl)")
    ap.add_argument("--out", help="PNG path (default: RUN_DIR/diagnostics.png for one run, else ./diagnostics.png)")
    ap.add_argument("--labels", nargs="+", help="legend label per run (default: folder and its λ); with --bands, "
                    "runs of one label are one setting's seeds")
    ap.add_argument("--bands", action="store_true", help="two panels only, reward and the fixed correct responses' "
                    "likelihood: per label the mean over its runs and their range")
    args = ap.parse_args(argv)
    out = args.out or (Path(args.run_dirs[0]) / "diagnostics.png" if len(args.run_dirs) == 1 else "diagnostics.png")
    try:
        if args.bands:
            print(f"wrote {plot_bands(args.run_dirs, args.labels or [run_label(d) for d in args.run_dirs], out)}")
            return
        print(f"wrote {plot_runs(args.run_dirs, out, args.labels)}")
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
