"""One command for the LLD death spiral on a laptop: world -> warm start -> GRPO and GRPO + LLDS -> test EM -> figure.

Builds each search world (lab/search_world.py, once: reused when the folder holds it) with its warm-started tiny
policy: for world 0 the committed one (lab/world0_policy, the same weights on every machine; --train-warm-start
trains one here instead, ~15 minutes), for other worlds trained here. Then for every (world, lr, lambda, seed) of
the grid trains the policy with the unchanged train.py, scores it on the held-out people with the unchanged
evaluate.py, and finally prints the grid, every run and then every (lr, lambda) cell over its worlds and seeds, with
the measures results/spiral/grid5.md fixed before the runs: the collapse on 5-step reward windows (collapsed / degraded /
held, and its step), the onsets of the sustained fall of the correct and of the incorrect responses' likelihood, the
lead of the first over the collapse (the paper's order: likelihood first), the first LLD alarm of phase II/III (hits
and false alarms against the collapses), the entropy and valid-action ratio at the end, and test EM against the warm
start's. Two figures of the first world and lr (scripts/plot_run.py): spiral.png, reward and the fixed correct
responses' likelihood, per lambda the mean over seeds and their range; diagnostics.png, every diagnostic of every run.
A finished run (its metrics and eval.json complete) is not run again, and an unfinished one (Ctrl-C, a kill) resumes
from its newest complete checkpoint (train.py --resume): the same command continues a stopped grid where it stopped.
A run folder that holds a finished run of another --steps is refused, never overwritten.

    python lab/spiral.py                                      # lr 1e-3, lambda 0 and 0.2, seeds 0-2: ~10 min
    python lab/spiral.py --lrs 1e-4 3e-4 1e-3 --out runs/grid --mini-batch-size 16 --micro-batch-size 16  # grid 1
    python lab/spiral.py --out runs/g8 --group-size 8 --prompts-per-step 4   # any other flag goes to train.py
    python lab/spiral.py --world data/w --world-seeds 11 12 13 --lambdas 0 0.1 0.2 --lrs 3e-4 --steps 100 \\
        --world-flags="--redraw-errors --wrong-frac 0 --guess-frac 0.4 --sft-steps 3000" --out runs/grid4_slow
                                                      # the fourth grid's slow regime: three new worlds (results/spiral/grid4.md)
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lab"), str(ROOT / "scripts")]  # scripts/: plot_run

import evaluate  # noqa: E402
import plot_run  # noqa: E402
import search_world  # noqa: E402
import train  # noqa: E402
from machinery.checkpoint import atomic_write, folder_problem  # noqa: E402

# Every run's train.py flags besides --lr, --llds, --seed (results/spiral/grid1.md, "Protocol"): 4 optimizer steps per rollout
# step, the second grid's cell where plain GRPO collapsed in every seed (the first grid: --mini-batch-size 16)
# (--amp off and the probe every step: what every grid ran with when they were the defaults on a CPU)
RL = ["--prompts-per-step", "8", "--group-size", "4", "--mini-batch-size", "8", "--micro-batch-size", "8",
      "--max-turns", "2", "--max-new-tokens", "48", "--max-obs-tokens", "120", "--warmup-ratio", "0",
      "--save-every", "1000", "--log-rollouts-every", "5", "--amp", "off", "--probe-questions", "8",
      "--probe-every", "1"]
EVAL = ["--max-turns", "2", "--max-new-tokens", "48", "--max-obs-tokens", "120", "--batch-size", "64"]
RERUN = "the same spiral.py command"  # how a stopped grid continues (train.py's lines say so after Ctrl-C or an error)
# The committed warm start of world 0: `search_world.py --seed 0` with these flags saved it (its folder copied here)
COMMITTED = ROOT / "lab" / "world0_policy"
COMMITTED_FLAGS = "--redraw-errors --wrong-frac 0 --guess-frac 0.4 --sft-steps 3000"


def world_files(world: Path) -> dict:
    return {"corpus": world / "corpus.jsonl", "train": world / "world_train.jsonl", "test": world / "world_test.jsonl",
            "policy": world / "policy"}


def evaluate_on_test(model: Path, files: dict, out: Path) -> float:
    """Greedy EM of `model` on every test question (evaluate.py, unchanged), cached in `out`. A killed evaluation's
    records (eval.jsonl.partial, without eval.json) are replaced."""
    if not out.is_file():
        evaluate.main(["--model", str(model), "--data", str(files["test"]), "--corpus", str(files["corpus"]), *EVAL,
                       "--out", str(out), "--overwrite"])
    records = json.loads(out.read_text())["records"]
    return sum(r["em"] for r in records) / len(records)


def sampled_on_test(model: Path, files: dict, out: Path, samples: int) -> dict:
    """Sampled test reward of `model`: `samples` trajectories per test question (temperature 1, top-p 0.95, as train.py
    samples; warm_start.sampled_em, sampling seed 0, EVAL's turn budget), so it measures the policy RL trains, not
    its greedy mode.
    Returns {"reward", "searches"} (mean EM and searches per trajectory), cached in `out`."""
    if not out.is_file():
        import warm_start
        from machinery.policy import load_policy
        from machinery.data import load_corpus
        from retriever import BM25Retriever

        policy, tok, _ = load_policy(str(model), device="cpu")
        rows = [json.loads(line) for line in files["test"].read_text(encoding="utf-8").splitlines()]
        budget = {flag[2:].replace("-", "_"): int(value)  # max_turns, max_new_tokens, max_obs_tokens
                  for flag, value in zip(EVAL[::2], EVAL[1::2]) if flag != "--batch-size"}
        m = warm_start.sampled_em(policy, tok, rows, BM25Retriever(load_corpus(str(files["corpus"]))).search,
                                  group_size=samples, seed=0, **budget)  # the turn budget of EVAL, greedy's
        atomic_write(out, json.dumps({"reward": m["em"], "searches": m["searches"], "samples": samples}))
    return json.loads(out.read_text())


def finished(run: Path, steps: int) -> bool:
    """Whether `run` holds a finished run of `steps` steps: its metrics and its evaluation are complete."""
    metrics = run / "metrics.jsonl"
    return metrics.is_file() and len(metrics.read_text().splitlines()) == steps and (run / "eval.json").is_file()


def resume_flags(run: Path, steps: int, fresh: bool = False) -> list[str]:
    """train.py's flags for the run folder `run` that is not finished(run, steps): --resume RUN when it holds a run
    (Ctrl-C or a kill stopped it; train.py continues from its newest complete checkpoint, or starts over if none was
    saved), none for a new folder or with `fresh` (--overwrite among the train.py flags). Raises ValueError (one line)
    for a folder whose run is of another length: a finished one (eval.json) or one beyond `steps`."""
    metrics = run / "metrics.jsonl"
    done = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    if (run / "eval.json").is_file() or (done > steps and not fresh):
        raise ValueError(f"{run} holds a {'finished ' * (run / 'eval.json').is_file()}run of {done} steps, not "
                         f"--steps {steps}: pass --steps {done} to reuse it, or another --out for runs of {steps}")
    return [] if fresh or not (metrics.exists() or (run / "checkpoints").exists()) else ["--resume", str(run)]


# ----------------------------------------------------------------------------------------------------------------------
# The measures of the mechanism (results/spiral/grid4.md, its protocol), pure functions of metrics.jsonl

WINDOW = 5  # rollout steps per reward window: 5 x 32 trajectories = 160 answers
FALL = 0.1  # nats per token: a sustained fall of a likelihood by less than this is not counted
MIN_START = 0.1  # a run whose first window's reward is below this has nothing to collapse from


def collapse(reward: list, w: int = WINDOW) -> dict:
    """Whether and when a run's reward collapsed, judged on w-step windows so that one or two answers cannot flip it.

    reward: rollout/reward per step. start = the mean of the first w steps, final = of the last w. verdict:
    "collapsed" if final <= start / 4, "held" if final >= start / 2, "degraded" in between (a margin of start / 4: 12
    answers of 160 at start 0.3, where the old rule, final < 0.05, flipped on 2); "low start" if start < MIN_START
    (nothing to lose). collapse_step (only if collapsed): the first step t from which every w-step window (steps
    t..t+w-1, and every later full one) has a mean <= start / 4, moved on to the first step from t whose own reward
    is <= start / 4 (so it never lands on a high-reward step; the fifth grid's protocol).
    """
    start, final = sum(reward[:w]) / len(reward[:w]), sum(reward[-w:]) / len(reward[-w:])
    verdict = ("low start" if start < MIN_START else "collapsed" if final <= start / 4
               else "held" if final >= start / 2 else "degraded")
    step = None
    if verdict == "collapsed":
        windows = [sum(reward[t:t + w]) / w for t in range(len(reward) - w + 1)]  # full windows only; the last is final
        first = next(t for t in range(len(windows)) if all(m <= start / 4 for m in windows[t:]))
        step = next(t + 1 for t in range(first, len(reward)) if reward[t] <= start / 4)
    return {"start_reward": start, "final_reward": final, "verdict": verdict, "collapse_step": step}


def fall_onset(logp: list, fall: float = FALL, w: int = 3) -> int | None:
    """The step where a likelihood series starts to fall for good, or None.

    logp: per step, a token-mean log-likelihood in nats/token (diag/logp_correct or diag/logp_incorrect: the responses
    of that step under the rollout policy), None on steps without such a response (skipped). Smoothed by the mean of
    the last w defined values (defined once there are w). The onset is the first step whose smoothed value is more
    than `fall` below the highest smoothed value so far and stays below that mark at every later defined step.
    """
    smooth, seen = [], []
    for x in logp:
        seen += [] if x is None else [x]
        smooth.append(sum(seen[-w:]) / w if x is not None and len(seen) >= w else None)
    steps = [t for t, s in enumerate(smooth) if s is not None]
    for i, t in enumerate(steps):
        mark = max(smooth[s] for s in steps[:i + 1]) - fall
        if all(smooth[s] < mark for s in steps[i:]):
            return t + 1
    return None


def spiral_step(dlogp: list, eps: float = FALL) -> int | None:
    """Def. A.3 made a measure: the first step from which a likelihood change since step 0 (probe/dlogp_correct, in
    nats/token; None on steps without a probe) stays <= -eps at every later defined step and ends at or below its
    value there (falling further, or at least not recovering), or None."""
    steps = [t for t, x in enumerate(dlogp) if x is not None]
    for i, t in enumerate(steps):
        if all(dlogp[s] <= -eps for s in steps[i:]) and dlogp[steps[-1]] <= dlogp[t]:
            return t + 1
    return None


def alarm_step(history: list[dict]) -> int | None:
    """The first step whose LLD alarm is phase II or III ("steady decay", "acceleration"; llds.lld_alarm), or None."""
    return next((h["step"] for h in history if h.get("alarm/phase") in ("steady decay", "acceleration")), None)


def measures(history: list[dict]) -> dict:
    """A run's measures (docs/spiral.md) from its metrics.jsonl records: the collapse (`collapse`), the onsets of the
    fall of the correct and incorrect responses' likelihood (`fall_onset`), lead = collapse step - correct onset
    (> 0: the correct responses' likelihood fell first, the paper's order), the alarm step and its lead, entropy and
    valid actions at the end, seconds per step; and on the fixed probe responses (probe.py, the fifth grid):
    probe_correct / probe_incorrect (onsets of probe/logp_*), probe_lead_* (collapse step - onset), spiral_step
    (`spiral_step` of probe/dlogp_correct) and dlogp_*_end (the last probe/dlogp_*); None where not logged."""
    out = collapse([h["rollout/reward"] for h in history])
    onset_c = fall_onset([h.get("diag/logp_correct") for h in history])
    onset_i = fall_onset([h.get("diag/logp_incorrect") for h in history])
    alarm, c = alarm_step(history), out["collapse_step"]
    probe = {f"probe_{k}": fall_onset([h.get(f"probe/logp_{k}") for h in history]) for k in ("correct", "incorrect")}
    probe["spiral_step"] = spiral_step([h.get("probe/dlogp_correct") for h in history])
    for k in ("correct", "incorrect"):
        probe[f"probe_lead_{k}"] = c - probe[f"probe_{k}"] if c is not None and probe[f"probe_{k}"] is not None \
            else None
        probe[f"dlogp_{k}_end"] = next((h[f"probe/dlogp_{k}"] for h in reversed(history)
                                        if h.get(f"probe/dlogp_{k}") is not None), None)
    return {**out, **probe, "onset_correct": onset_c, "onset_incorrect": onset_i,
            "lead": c - onset_c if c is not None and onset_c is not None else None,
            "alarm_step": alarm, "alarm_lead": c - alarm if c is not None and alarm is not None else None,
            "entropy_end": history[-1].get("grpo/entropy"),
            "valid_actions_end": history[-1]["rollout/valid_action_ratio"],
            "s_per_step": sum(h["perf/step_s"] for h in history) / len(history)}


def cell_summary(runs: list[dict]) -> dict:
    """One grid cell's counts over its runs (every world and seed): collapsed / degraded / held; among collapsed runs,
    the correct likelihood's fall first (onset before the collapse step), after, or never; the alarm's hits (phase
    II/III at or before the collapse step), late alarms, misses; false alarms (an alarm in a run that did not
    collapse); the incorrect likelihood's fall before the correct one's."""
    col = [r for r in runs if r["verdict"] == "collapsed"]
    def first(r):  # the correct likelihood fell at or before the collapse
        return r["onset_correct"] is not None and r["onset_correct"] <= r["collapse_step"]
    return {"runs": len(runs), **{v: sum(r["verdict"] == v for r in runs) for v in ("collapsed", "degraded", "held")},
            "fell_first": sum(first(r) for r in col),
            "fell_after": sum(r["onset_correct"] is not None and not first(r) for r in col),
            "never_fell": sum(r["onset_correct"] is None for r in col),
            "alarm_hits": sum(r["alarm_step"] is not None and r["alarm_step"] <= r["collapse_step"] for r in col),
            "false_alarms": sum(r["alarm_step"] is not None for r in runs if r["verdict"] != "collapsed"),
            "incorrect_first": sum(r["onset_incorrect"] is not None and (r["onset_correct"] is None
                                   or r["onset_incorrect"] < r["onset_correct"]) for r in runs),
            # the fifth grid's, on the fixed probe responses (None where a run logged no probe)
            "probe_first": sum(r.get("probe_lead_correct") is not None and r["probe_lead_correct"] >= 0 for r in col),
            "probe_after": sum(r.get("probe_lead_correct") is not None and r["probe_lead_correct"] < 0 for r in col),
            "probe_never": sum(r.get("probe_correct") is None for r in col),
            "spiral_first": sum(r.get("spiral_step") is not None and r["spiral_step"] <= r["collapse_step"] for r in col),
            "probe_only": sum(r.get("probe_correct") is not None and r["onset_correct"] is None for r in col),
            "diag_only": sum(r.get("probe_correct") is None and r["onset_correct"] is not None for r in col)}


def keeps_up(cell: list[dict], plain: list[dict]) -> tuple[int, int]:
    """(pairs where the cell's final probe/dlogp_correct is above plain GRPO's, pairs compared): runs paired by
    (world, lr, seed), skipping pairs where either has no probe figure."""
    base = {(r["world"], r["lr"], r["seed"]): r.get("dlogp_correct_end") for r in plain}
    pairs = [(r.get("dlogp_correct_end"), base.get((r["world"], r["lr"], r["seed"]))) for r in cell]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    return sum(a > b for a, b in pairs), len(pairs)


def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def world_folder(world: Path, seed: int) -> Path:
    """The folder of the world of `seed`: --world itself for seed 0 (the one command's), WORLD_seedN for the others."""
    return world if seed == 0 else world.with_name(f"{world.name}_seed{seed}")


RUN_COLUMNS = ("world", "lr", "lambda", "seed", "start reward", "final reward", "verdict", "collapse step",
               "correct falls", "incorrect falls", "lead", "probe: correct falls", "probe: incorrect falls",
               "probe lead", "spiral (A.3)", "probe dlogp correct / incorrect (end)", "alarm", "entropy (end)",
               "valid (end)", "test EM", "min")
CELL_COLUMNS = ("lr", "lambda", "runs", "collapsed / degraded / held", "correct fell first / after / never (collapsed)",
                "probe: correct fell first / after / never (collapsed)", "spiral at or before the collapse",
                "probe onset only / diag onset only (collapsed)", "probe dlogp correct above lambda 0's (pairs)",
                "alarm hits / false alarms", "incorrect fell first", "final reward", "test EM")


def tables(rows: list[dict], warm: dict) -> list[str]:
    """The grid as markdown: every run (world, lr, lambda, seed), then one line per (lr, lambda) cell over its worlds
    and seeds (cell_summary). warm: world seed -> {"em"} (and "reward", "searches" with --test-samples)."""
    sampled = any(r["test_reward"] is not None for r in rows)
    head = RUN_COLUMNS[:-1] + (("test reward (sampled)", "test searches/traj") if sampled else ()) + RUN_COLUMNS[-1:]
    lines = ["warm start, per world: " + "; ".join(
        f"world {w}: test EM {m['em']:.3f}" + (f", sampled test reward {m['reward']:.3f}" if "reward" in m else "")
        for w, m in warm.items()), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cols = [r["world"], f"{r['lr']:g}", f"{r['llds']:g}", r["seed"], fmt(r["start_reward"]),
                fmt(r["final_reward"]), r["verdict"], fmt(r["collapse_step"], "d"), fmt(r["onset_correct"], "d"),
                fmt(r["onset_incorrect"], "d"), fmt(r["lead"], "+d"), fmt(r.get("probe_correct"), "d"),
                fmt(r.get("probe_incorrect"), "d"), fmt(r.get("probe_lead_correct"), "+d"),
                fmt(r.get("spiral_step"), "d"),
                f"{fmt(r.get('dlogp_correct_end'), '+.3f')} / {fmt(r.get('dlogp_incorrect_end'), '+.3f')}",
                fmt(r["alarm_step"], "d"), fmt(r["entropy_end"]),
                fmt(r["valid_actions_end"]), f"{r['test_em']:.3f}"]
        cols += [fmt(r["test_reward"], ".3f"), fmt(r["test_searches"])] if sampled else []
        lines.append("| " + " | ".join(map(str, cols + [f"{r['minutes']:.1f}"])) + " |")
    lines += ["", "| " + " | ".join(CELL_COLUMNS) + " |", "|" + "---|" * len(CELL_COLUMNS)]
    for lr, lam in dict.fromkeys((r["lr"], r["llds"]) for r in rows):
        cell = [r for r in rows if (r["lr"], r["llds"]) == (lr, lam)]
        c = cell_summary(cell)
        def mean(k, cell=cell):
            return sum(r[k] for r in cell) / len(cell)
        up, pairs = keeps_up(cell, [r for r in rows if r["lr"] == lr and r["llds"] == 0]) if lam else (0, 0)
        lines.append(f"| {lr:g} | {lam:g} | {c['runs']} ({len({r['world'] for r in cell})} worlds) | "
                     f"{c['collapsed']} / {c['degraded']} / {c['held']} | "
                     f"{c['fell_first']} / {c['fell_after']} / {c['never_fell']} | "
                     f"{c['probe_first']} / {c['probe_after']} / {c['probe_never']} | {c['spiral_first']} | "
                     f"{c['probe_only']} / {c['diag_only']} | {f'{up} of {pairs}' if pairs else '-'} | "
                     f"{c['alarm_hits']} / "
                     f"{c['false_alarms']} | {c['incorrect_first']} | {mean('final_reward'):.3f} | "
                     f"{mean('test_em'):.3f} |")
    return lines


def delta_tables(paths: list[str]) -> list[str]:
    """One markdown table of `python probe.py --out` results (Fig. 3a's Delta(x)): a row per file x (k, lambda), with
    the model probed, the mixed groups, the fraction with Delta(x) < 0 and its 95% interval, and the mean Delta of the
    correct and incorrect responses, in all and by part (first action / later actions / answer span; nats/response)."""
    lines = ["| model probed | k | lambda | mixed / groups | Delta < 0 [95% CI] | correct: all / first / later / "
             "answer | incorrect: all / first / later / answer |", "|---|---|---|---|---|---|---|"]
    for path in paths:
        data = json.loads(Path(path).read_text())
        for r in data["rows"]:
            def parts(s):
                return " / ".join(fmt(r[f"delta_{s}{p}"], "+.2f") for p in ("", "_first", "_later", "_answer"))
            neg = "-" if r["frac_neg"] is None else f"{r['frac_neg']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"
            lines.append(f"| {data['args']['model']} | {r['k']} | {r['llds']:g} | {r['mixed']} / {r['groups']} | {neg} "
                         f"| {parts('correct')} | {parts('incorrect')} |")
    return lines


def figure_columns(columns: list[str], flag: str) -> list[tuple[str, list[Path]]]:
    """[(title, [run folders])] of "TITLE=RUN[,RUN...]" strings; ValueError naming `flag` on one without '='."""
    cols = []
    for c in columns:
        if "=" not in c:
            raise ValueError(f"{flag}: {c!r} is not TITLE=RUN[,RUN...]")
        title, runs = c.split("=", 1)
        cols.append((title, [Path(r) for r in runs.split(",")]))
    return cols


def probe_figure(columns: list[str], out) -> Path:
    """Side by side, one column per "TITLE=RUN[,RUN...]" (a world's runs, a model's runs): the reward, and the fixed
    probe responses' likelihood change since step 0 (probe/dlogp_*, nats/token: Def. A.3's quantity), correct and
    incorrect, one line per run (labelled by its lambda), each run's collapse step (`collapse`) a dashed line. Each
    panel keeps its own scale: the toy's probe moves by nats, a real model's at lr 1e-5 by thousandths. Raises
    ValueError on a column without '='."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = figure_columns(columns, "--probe-figure")
    keys = (("rollout/reward", "reward (EM, the step's samples)"),
            ("probe/dlogp_correct", "correct probe: Δ log π, nats/token"),
            ("probe/dlogp_incorrect", "incorrect probe: Δ log π, nats/token"))
    fig, axes = plt.subplots(3, len(cols), figsize=(6 * len(cols), 9), squeeze=False, sharex="col",
                             layout="constrained")
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lams = {run: json.loads((run / "args.json").read_text()).get("llds", 0.0) for _, runs in cols for run in runs}
    color = {lam: palette[i % len(palette)] for i, lam in enumerate(sorted(set(lams.values())))}  # a lambda, a colour
    for j, (title, runs) in enumerate(cols):
        for run in runs:
            history, lam = plot_run.read_metrics(run), lams[run]
            c = collapse([h["rollout/reward"] for h in history])["collapse_step"]
            for ax, (key, ylabel) in zip(axes[:, j], keys):
                ax.plot(*plot_run.series(history, key), color=color[lam], lw=1.6,
                        label=f"λ {lam:g}" + (f", collapsed at step {c}" if c else ", no collapse"))
                if c:
                    ax.axvline(c, color=color[lam], ls="--", lw=0.9)
                ax.set_ylabel(ylabel, fontsize=8)
                ax.grid(alpha=0.3)
        axes[0, j].set_title(title)
        axes[0, j].legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.08), ncol=2, frameon=False)
        axes[-1, j].set_xlabel("training step")
        axes[-1, j].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="data/world", help="world folder (built by lab/search_world.py if absent)")
    ap.add_argument("--world-seeds", type=int, nargs="+", default=[0],
                    help="search_world.py --seed of each world: 0 is --world, N is WORLD_seedN (built if absent)")
    ap.add_argument("--world-flags", default="", help="search_world.py flags for the warm starts trained here, one "
                    "string: --world-flags=\"--sft-steps 3000 ...\" (with =); world 0 takes the committed warm start "
                    f"unless they differ from its recipe ({COMMITTED_FLAGS}) or --train-warm-start")
    ap.add_argument("--train-warm-start", action="store_true",
                    help="train world 0's warm start here (~15 minutes on 2 cores) instead of the committed one")
    ap.add_argument("--out", default="runs/spiral", help="one folder per run, the grid table and the figure")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3], help="learning rates (the figure: the first)")
    ap.add_argument("--lambdas", type=float, nargs="+", default=[0.0, 0.2], help="--llds values")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="train.py --seed values")
    ap.add_argument("--steps", type=int, default=20, help="rollout steps per run")
    ap.add_argument("--test-samples", type=int, default=0,
                    help="also measure the sampled test reward, this many trajectories per test question (0: off)")
    ap.add_argument("--delta-tables", nargs="+", default=[], metavar="JSON",
                    help="print one markdown table of these `probe.py --out` files and exit")
    ap.add_argument("--probe-figure", nargs="+", default=[], metavar="OUT TITLE=RUN,RUN",
                    help="draw the probe side by side (PNG OUT, then a column per TITLE=RUN[,RUN...]) and exit")
    args, extra = ap.parse_known_args(argv)
    if args.probe_figure:
        if len(args.probe_figure) < 2:
            ap.error("--probe-figure needs OUT and at least one TITLE=RUN[,RUN...]")
        try:
            print(f"wrote {probe_figure(args.probe_figure[1:], args.probe_figure[0])}")
        except (ValueError, FileNotFoundError) as err:
            ap.error(str(err))
        return
    if args.delta_tables:
        print("\n".join(delta_tables(args.delta_tables)))
        return
    train.parse_args(RL + extra)  # a bad train.py flag stops here, before the world is built, with train.py's line
    if (args.steps < 5 or any(lr <= 0 for lr in args.lrs) or any(lam < 0 for lam in args.lambdas)
            or args.test_samples < 0 or any(w < 0 for w in args.world_seeds)):
        ap.error("--steps must be >= 5, every --lrs > 0, every --lambdas >= 0, every --world-seeds >= 0 and "
                 "--test-samples >= 0")
    out, t0 = Path(args.out), time.time()
    worlds = {w: world_files(world_folder(Path(args.world), w)) for w in args.world_seeds}
    for flag, folder, needed in [*(("--world", f["policy"].parent, not (f["policy"] / "config.json").is_file())
                                   for f in worlds.values()), ("--out", out, True)]:
        if needed and (problem := folder_problem(folder)):
            ap.error(f"{flag} {folder}: {problem}")
    def tag(w):  # one world 0: the old names
        return f"world{w}_" if len(worlds) > 1 or w != 0 else ""
    cells = [(w, lr, lam, seed, out / f"{tag(w)}lr{lr:g}_llds{lam:g}_seed{seed}")
             for w in worlds for lr in args.lrs for lam in args.lambdas for seed in args.seeds]
    try:  # every run folder is checked before anything is built, trained or written
        flags = {run: resume_flags(run, args.steps, "--overwrite" in extra) for *_, run in cells
                 if not finished(run, args.steps)}
    except ValueError as err:
        ap.error(str(err))
    warm = {}
    for w, files in worlds.items():
        if (files["policy"] / "config.json").is_file():  # a world built earlier: say whose warm start it holds
            mine = files["policy"] / "model.safetensors"
            same = w == 0 and mine.is_file() and mine.read_bytes() == (COMMITTED / "model.safetensors").read_bytes()
            print(f"world {w}: the warm start already in {files['policy']}" + (" (the committed one)" if same else
                  " (trained here, not the committed one; another --world builds afresh)"))
        else:
            committed = w == 0 and not args.train_warm_start and args.world_flags.split() in ([],
                                                                                              COMMITTED_FLAGS.split())
            if committed:  # the world (0.2 s) and the committed weights: the same start on every machine
                print(f"building the world 0 in {files['policy'].parent} with the committed warm start "
                      f"({COMMITTED.relative_to(ROOT)}: {COMMITTED_FLAGS}; --train-warm-start trains one here)")
                search_world.main(["--out", str(files["policy"].parent), "--seed", "0", "--sft-steps", "0"])
                shutil.copytree(COMMITTED, files["policy"])
            else:
                from machinery.policy import busy_cpu_note

                print(f"building the world {w} and warm-starting its policy in {files['policy'].parent} (once; ~15 "
                      "min on 2 idle cores)")
                if note := busy_cpu_note():
                    print(note)
                search_world.main(["--out", str(files["policy"].parent), "--seed", str(w), *args.world_flags.split()])
        out.mkdir(parents=True, exist_ok=True)
        em = evaluate_on_test(files["policy"], files, out / f"{tag(w)}warm_start_eval.json")
        sampled = sampled_on_test(files["policy"], files, out / f"{tag(w)}warm_start_sampled.json",
                                  args.test_samples) if args.test_samples else {}
        warm[w] = {"em": em, **sampled}
        print(f"world {w} warm start: test EM {em:.3f} over all test questions (the table's average row: the "
              "mean of its kinds)"
              + (f", sampled test reward {sampled['reward']:.3f}, searches/traj {sampled['searches']:.2f}"
                 if sampled else ""))

    rows = []
    for w, lr, lam, seed, run in cells:
        files = worlds[w]
        if run in flags:
            print(f"\n=== run {cells.index((w, lr, lam, seed, run)) + 1} of {len(cells)}: world {w}, lr {lr:g}, "
                  f"lambda {lam:g}, seed {seed}: {run}" + (" (resumed)" if flags[run] else ""))
            train.main(train.parse_args(["--model", str(files["policy"]), "--train-data", str(files["train"]),
                                         "--corpus", str(files["corpus"]), *RL, *extra, "--steps", str(args.steps),
                                         "--lr", str(lr), "--llds", str(lam), "--seed", str(seed),
                                         "--out-dir", str(run), *flags[run]]), rerun=RERUN)
        history = plot_run.read_metrics(run)
        em = evaluate_on_test(run, files, run / "eval.json")
        test = sampled_on_test(run, files, run / "sampled.json", args.test_samples) if args.test_samples else {}
        m = measures(history)
        rows.append({"world": w, "lr": lr, "llds": lam, "seed": seed, "run": str(run), "test_em": em, **m,
                     "minutes": m["s_per_step"] * len(history) / 60,
                     "test_reward": test.get("reward"), "test_searches": test.get("searches")})

    lines = tables(rows, warm)
    if extra:
        lines[0] += f"; train.py flags besides the protocol's: {' '.join(extra)}"
    print("\n" + "\n".join(lines))
    atomic_write(out / "grid.md", "\n".join(lines) + "\n")
    atomic_write(out / "grid.json", json.dumps({"warm_start": warm, "train_flags": extra,
                                                  "world_flags": args.world_flags, "runs": rows}, indent=1))
    first = [r for r in rows if r["lr"] == args.lrs[0] and r["world"] == args.world_seeds[0]]
    figure = plot_run.plot_bands([r["run"] for r in first], [name(r["llds"]) for r in first], out / "spiral.png")
    panels = plot_run.plot_runs([r["run"] for r in first], out / "diagnostics.png",
                                labels=[f"λ={r['llds']:g} seed {r['seed']}" for r in first])
    steps = len(rows) * args.steps
    print(f"wrote {out / 'grid.md'}, {out / 'grid.json'}, {figure} (reward and the probe, mean and range over "
          f"seeds) and {panels} (every diagnostic, every run); {len(rows)} runs, {time.time() - t0:.0f} s in "
          f"all ({steps / sum(r['s_per_step'] * args.steps for r in rows):.2f} training steps/s)")


def name(llds: float) -> str:
    """The figure's label of a lambda: 'GRPO (λ=0)' or 'GRPO + LLDS (λ=0.2)'."""
    return f"GRPO + LLDS (λ={llds:g})" if llds else "GRPO (λ=0)"


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # a second Ctrl-C: train.py stopped at once, without saving the step in progress
        raise SystemExit(f"interrupted. Continue with {RERUN}: finished runs are kept and an unfinished one resumes "
                         "from its newest complete checkpoint") from None
