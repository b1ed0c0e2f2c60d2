"""The real-model runs' measures (results/real_model/PROTOCOL.md): one row per run, the learning test, the figure.

`rows` applies the toy's measures (lab/spiral.py `measures`: the collapse on 5-step reward windows, the fixed
probe's onsets and leads, Def. A.3's spiral step) to each run's metrics.jsonl and adds what a real model needs
beside them: the steps with no mixed group (every group's rewards equal, so no update of that step carried a reward
signal) and whether a collapse was driven by the policy gradient (>= 80% of the steps before it held a mixed group)
or was drift; the entropy, searches and KL at the end; the CPU hours. `em` is the learning test: the paired bootstrap
interval of a run's greedy held-out EM minus the warm start's, over the same questions.

    python lab/real_model.py rows results/real_model/pilot_*             # markdown rows
    python lab/real_model.py verdicts results/real_model/grid_*          # part 3's verdicts, by seed pair
    python lab/real_model.py em --base warm_eval.jsonl run1_eval.jsonl ... # evaluate.py's records files
    python lab/real_model.py copy runs/rm/NAME ... --to results/real_model  # metrics.jsonl + args.json, no rollouts
    python lab/real_model.py figure OUT.png "toy=RUN,RUN,..." "SmolLM2=RUN,..." # mean and band per loss
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent),
                str(Path(__file__).resolve().parents[1] / "scripts")]  # repo, lab/, scripts/ (plot_run)

from spiral import figure_columns, measures  # noqa: E402

SIGNAL = 0.8  # a collapse is driven by the policy gradient if at least this share of the steps before it held a
# mixed group (a group whose rewards differ: its advantages are not all 0)


def read(run: Path) -> tuple[dict, list[dict]]:
    """(args.json, metrics.jsonl's records) of a train.py --out-dir. Raises FileNotFoundError naming the file."""
    for f in ("args.json", "metrics.jsonl"):
        if not (run / f).is_file():
            raise FileNotFoundError(f"{run / f}: not found (a train.py --out-dir holds args.json and metrics.jsonl)")
    history = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines() if s.strip()]
    return json.loads((run / "args.json").read_text()), history


def run_row(run: Path) -> dict:
    """A run's measures: spiral.measures, plus the signal count and verdict, the flags that differ between runs, and
    the figures at the end. no_signal_steps: steps with rollout/frac_zero_std_groups == 1 (no mixed group)."""
    args, history = read(run)
    m = measures(history)
    no_signal = [h["step"] for h in history if h["rollout/frac_zero_std_groups"] >= 1.0]  # exact: a fraction of 1
    c = m["collapse_step"]
    before = [h for h in history if c is not None and h["step"] < c]
    share = sum(h["rollout/frac_zero_std_groups"] < 1.0 for h in before) / len(before) if before else None
    last = history[-1]
    return {"run": run.name, "lr": args["lr"], "llds": args["llds"], "seed": args["seed"],
            "entropy_coef": args["entropy_coef"], "steps": len(history), **m, "no_signal_steps": no_signal,
            "signal_share": share, "driven_by": None if c is None else "policy gradient" if share >= SIGNAL
            else "drift", "searches_end": last["rollout/searches_per_traj"], "kl_end": last.get("grpo/kl"),
            "cpu_h": sum(h.get("perf/step_cpu_s", 0.0) for h in history) / 3600}


def fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def rows_table(runs: list[Path]) -> str:
    head = ("| run | lr | lambda | entropy | seed | steps | reward, first / last 5 steps | verdict (step) | "
            "steps without a mixed group | driven by | probe onset correct / incorrect (lead) | spiral step | "
            "probe change at the end, correct / incorrect | entropy end | searches end | KL end | CPU h |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for run in runs:
        r = run_row(run)
        lead = "" if r["probe_lead_correct"] is None else f" ({r['probe_lead_correct']:+d})"
        lines.append(
            f"| {r['run']} | {r['lr']:g} | {r['llds']:g} | {r['entropy_coef']:g} | {r['seed']} | {r['steps']} | "
            f"{r['start_reward']:.3f} / {r['final_reward']:.3f} | {r['verdict']}"
            f"{'' if r['collapse_step'] is None else ' (' + str(r['collapse_step']) + ')'} | "
            f"{len(r['no_signal_steps'])} {r['no_signal_steps'] if r['no_signal_steps'] else ''} | "
            f"{r['driven_by'] or '-'} | {fmt(r['probe_correct'], 'd')} / {fmt(r['probe_incorrect'], 'd')}{lead} | "
            f"{fmt(r['spiral_step'], 'd')} | {fmt(r['dlogp_correct_end'])} / {fmt(r['dlogp_incorrect_end'])} | "
            f"{fmt(r['entropy_end'], '.2f')} | {r['searches_end']:.2f} | {fmt(r['kl_end'], '.4f')} | "
            f"{r['cpu_h']:.2f} |")
    return "\n".join(lines)


def share_verdict(k: int, n: int, yes: str, no: str) -> str:
    """The protocol's 2-of-3 rule on k of n cases: `yes` if k >= 2/3 of n, `no` if k <= 1/3 of n, else inconclusive;
    always with the counts."""
    word = "not tested" if n == 0 else yes if 3 * k >= 2 * n else no if 3 * k <= n else "inconclusive"
    return f"{word} ({k} of {n})"


def grid_verdicts(runs: list[Path]) -> list[str]:
    """PROTOCOL.md part 3's verdicts over a grid's runs, lambda 0 against lambda > 0 paired by (lr, seed): the mechanism
    (plain GRPO collapses in >= 2 runs and the fixed probe's correct onset is at or before the collapse step in >= 2/3
    of those collapses; refuted at <= 1/3), Def. A.3 (a spiral step at or before the collapse step in >= 2/3 of them),
    LLDS keeps the probe likelihood up (its final probe/dlogp_correct above lambda 0's in >= 2/3 of the pairs; not at
    <= 1/3) and LLDS prevents the collapse (at most half lambda 0's collapses, lambda 0 at >= 2). One line each."""
    rows = [run_row(run) for run in runs]
    plain, llds = [r for r in rows if r["llds"] == 0], [r for r in rows if r["llds"] > 0]
    col = [r for r in plain if r["verdict"] == "collapsed"]
    onset = sum(r["probe_correct"] is not None and r["probe_correct"] <= r["collapse_step"] for r in col)
    spiral = sum(r["spiral_step"] is not None and r["spiral_step"] <= r["collapse_step"] for r in col)
    base = {(r["lr"], r["seed"]): r["dlogp_correct_end"] for r in plain}
    pairs = [(r["dlogp_correct_end"], base[(r["lr"], r["seed"])]) for r in llds if (r["lr"], r["seed"]) in base]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    n_llds = sum(r["verdict"] == "collapsed" for r in llds)
    mechanism = share_verdict(onset, len(col), "shows", "refuted") if len(col) >= 2 else \
        f"inconclusive (plain GRPO collapsed in {len(col)} of {len(plain)}, under 2)"
    prevents = (f"not tested (plain GRPO collapsed in {len(col)} of {len(plain)}, under 2)" if len(col) < 2 else
                f"{'prevents' if 2 * n_llds <= len(col) else 'does not prevent'} ({n_llds} of {len(llds)} "
                f"collapsed against plain GRPO's {len(col)} of {len(plain)})")
    return [f"mechanism (probe onset at or before the collapse): {mechanism}",
            f"Def. A.3 (spiral step at or before the collapse): {share_verdict(spiral, len(col), 'visible', 'not')}",
            f"LLDS keeps the probe likelihood up (pairs): "
            f"{share_verdict(sum(a > b for a, b in pairs), len(pairs), 'keeps', 'does not')}",
            f"LLDS prevents the collapse: {prevents}"] + \
        [f"note: the runs differ in length ({sorted({r['steps'] for r in rows})} steps): their ends are compared"] * \
        (len({r["steps"] for r in rows}) > 1)


def paired_bootstrap(base: np.ndarray, run: np.ndarray, n: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """(mean(run - base), 2.5% and 97.5% quantiles of that mean over n resamples of the questions, with replacement):
    the paired bootstrap of a difference in EM. base, run: [Q] 0/1 scores of the same Q questions in the same order.
    Raises ValueError if the shapes differ or Q is 0."""
    base, run = np.asarray(base, dtype=float), np.asarray(run, dtype=float)
    if base.shape != run.shape or base.size == 0:
        raise ValueError(f"paired_bootstrap needs two equal, non-empty score vectors, got {base.shape} and {run.shape}")
    diff = run - base
    idx = np.random.default_rng(seed).integers(0, diff.size, size=(n, diff.size))
    means = diff[idx].mean(axis=1)
    return float(diff.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def em_scores(path: Path) -> dict:
    """{question id (or the question text): em} from evaluate.py's records .jsonl. Raises ValueError on a line that is
    not a record, naming the file and line."""
    out = {}
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            r = json.loads(line)
            out[r.get("id") or r["question"]] = float(r["em"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i}: not an evaluate.py record with 'question' and 'em' ({e})") from None
    return out


def em_table(base: Path, runs: list[Path]) -> str:
    b = em_scores(base)
    lines = [f"warm start {base}: EM {np.mean(list(b.values())):.3f} on {len(b)} questions",
             "| records | EM | EM - warm start [95% paired bootstrap] | learned |", "|---|---|---|---|"]
    for run in runs:
        r = em_scores(run)
        if set(r) != set(b):
            raise ValueError(f"{run}: scores other questions than {base} ({len(set(r) ^ set(b))} differ)")
        keys = sorted(b)
        d, lo, hi = paired_bootstrap(np.array([b[k] for k in keys]), np.array([r[k] for k in keys]))
        lines.append(f"| {run} | {np.mean(list(r.values())):.3f} | {d:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                     f"{'yes' if lo > 0 else 'no'} |")
    return "\n".join(lines)


def copy(runs: list[Path], to: Path) -> None:
    """Each run's metrics.jsonl and args.json into to/<run name>/ (no rollouts, no weights)."""
    for run in runs:
        read(run)
        (to / run.name).mkdir(parents=True, exist_ok=True)
        for f in ("metrics.jsonl", "args.json"):
            shutil.copy(run / f, to / run.name / f)


def loss_name(args: dict) -> str:
    """A run's loss as the figure's legend names it, from its args.json: "GRPO (λ=0)", "GRPO + LLDS (λ=0.2)", and
    "GSPO" (`policy_loss` gspo) or "CalibAdv" (`calib_adv` > 0) in place of "GRPO" where the run turned one on."""
    lam = float(args.get("llds", 0.0))
    base = ("GSPO" if args.get("policy_loss") == "gspo" else
            "CalibAdv" if float(args.get("calib_adv", 0.0)) > 0 else "GRPO")
    return f"{base}{' + LLDS' * (lam > 0)} (λ={lam:g})"


def figure(columns: list[str], out) -> Path:
    """Part 5's figure: one column per "TITLE=RUN[,RUN...]" (the toy's runs, the real model's), two rows: the reward
    and the fixed correct probe responses' likelihood change since step 0 (`probe/dlogp_correct`, nats/token). In
    each panel the runs are grouped by their loss (`loss_name`: the lambda, and GSPO or CalibAdv where args.json turns
    one on): the mean over the group's runs as a line, their range (min to max at each step) as a band; each panel
    keeps its own scale. Writes a PNG and returns its path.
    Raises ValueError on a column without '=' and FileNotFoundError on a folder that is not a run."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import plot_run

    cols = figure_columns(columns, "figure")
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, len(cols), figsize=(5.5 * len(cols), 7), squeeze=False, layout="constrained")
    for j, (title, runs) in enumerate(cols):
        groups = {}
        for run in runs:
            args, history = read(run)
            groups.setdefault(loss_name(args), []).append(history)
        for ax, key, ylabel in zip(axes[:, j], ("rollout/reward", "probe/dlogp_correct"),
                                   ("reward (EM of the step's samples)", "correct probe: Δ log π, nats/token")):
            for i, (name, histories) in enumerate(groups.items()):
                by_step = {}
                for history in histories:
                    for x, y in zip(*plot_run.series(history, key)):
                        by_step.setdefault(x, []).append(y)
                xs = sorted(by_step)
                ax.fill_between(xs, [min(by_step[x]) for x in xs], [max(by_step[x]) for x in xs],
                                color=palette[i % len(palette)], alpha=0.2, lw=0)
                ax.plot(xs, [sum(by_step[x]) / len(by_step[x]) for x in xs], color=palette[i % len(palette)], lw=2,
                        label=f"{name}: mean of {len(histories)} runs, band min-max" if len(histories) > 1 else
                        f"{name}: 1 run")
            ax.set_ylabel(ylabel, fontsize=9)
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # steps
        axes[0, j].set_title(title)
        axes[0, j].legend(fontsize=8, frameon=False)
        axes[-1, j].set_xlabel("training step")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("rows", help="one markdown row per run").add_argument("runs", nargs="+", type=Path)
    e = sub.add_parser("em", help="greedy held-out EM against the warm start's, paired bootstrap")
    e.add_argument("--base", type=Path, required=True, help="the warm start's evaluate.py records (.jsonl)")
    e.add_argument("runs", nargs="+", type=Path, help="the runs' evaluate.py records (.jsonl), same questions")
    sub.add_parser("verdicts", help="the grid's verdicts, lambda 0 against lambda > 0 by seed").add_argument(
        "runs", nargs="+", type=Path)
    c = sub.add_parser("copy", help="metrics.jsonl and args.json of each run, into --to/<run>/")
    c.add_argument("runs", nargs="+", type=Path)
    c.add_argument("--to", type=Path, required=True)
    f = sub.add_parser("figure", help="toy and real model side by side: reward and correct probe, band per loss")
    f.add_argument("out", type=Path)
    f.add_argument("columns", nargs="+", help="TITLE=RUN[,RUN...], one per column")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "rows":
            print(rows_table(a.runs))
        elif a.cmd == "verdicts":
            print("\n".join(grid_verdicts(a.runs)))
        elif a.cmd == "em":
            print(em_table(a.base, a.runs))
        elif a.cmd == "copy":
            copy(a.runs, a.to)
        else:
            print(f"wrote {figure(a.columns, a.out)}")
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(str(err)) from None


if __name__ == "__main__":
    main()
