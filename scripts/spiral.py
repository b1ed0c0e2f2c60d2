"""One command for the LLD death spiral on a laptop: world -> warm start -> GRPO and GRPO + LLDS -> test EM -> figure.

Builds the search world and its warm-started tiny policy (scripts/search_world.py, once: reused when --world holds
them), then for every (lr, lambda, seed) of the grid trains the policy with the unchanged train.py, scores it on the
held-out people with the unchanged evaluate.py, and finally prints the grid (every cell and every seed) with the
measures that docs/spiral.md fixes before any run: start and final reward, the collapse step, the first LLD alarm of
phase II/III and its lead over the collapse, the entropy and valid-action ratio at the end, and test EM against the
warm start's. The figure draws the runs of the first lr, all seeds, lambda by colour (scripts/plot_run.py).
A finished run (its metrics and eval.json complete) is not run again, and an unfinished one (Ctrl-C, a kill) resumes
from its newest complete checkpoint (train.py --resume): the same command continues a stopped grid where it stopped.
A run folder that holds a finished run of another --steps is refused, never overwritten.

    python scripts/spiral.py                                      # lr 1e-3, lambda 0 and 0.2, seeds 0-2: ~10 min
    python scripts/spiral.py --lrs 1e-4 3e-4 1e-3 --out runs/grid --mini-batch-size 16 --micro-batch-size 16  # grid 1
    python scripts/spiral.py --out runs/g8 --group-size 8 --prompts-per-step 4   # any other flag goes to train.py
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import evaluate  # noqa: E402
import plot_run  # noqa: E402
import search_world  # noqa: E402
import train  # noqa: E402
from checkpoint import atomic_write, folder_problem  # noqa: E402

# Every run's train.py flags besides --lr, --llds, --seed (docs/spiral.md, "Protocol"): 4 optimizer steps per rollout
# step, the second grid's cell where plain GRPO collapsed in every seed (the first grid: --mini-batch-size 16)
RL = ["--prompts-per-step", "8", "--group-size", "4", "--mini-batch-size", "8", "--micro-batch-size", "8",
      "--max-turns", "2", "--max-new-tokens", "48", "--max-obs-tokens", "120", "--warmup-ratio", "0",
      "--save-every", "1000", "--log-rollouts-every", "5"]
EVAL = ["--max-turns", "2", "--max-new-tokens", "48", "--max-obs-tokens", "120", "--batch-size", "64"]
RERUN = "the same spiral.py command"  # how a stopped grid continues (train.py's lines say so after Ctrl-C or an error)


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
        from policy import load_policy
        from retriever import BM25Retriever, load_corpus

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


def measures(history: list[dict]) -> dict:
    """The per-run measures of docs/spiral.md from a run's metrics.jsonl records."""
    reward = [h["rollout/reward"] for h in history]
    start, final = sum(reward[:2]) / len(reward[:2]), sum(reward[-5:]) / len(reward[-5:])
    collapsed = final < 0.05 and start >= 0.2
    collapse_step = None
    if collapsed:
        collapse_step = next(h["step"] for i, h in enumerate(history) if all(r < 0.1 for r in reward[i:]))
    alarm_step = next((h["step"] for h in history if h.get("alarm/phase") in ("steady decay", "acceleration")), None)
    lead = collapse_step - alarm_step if collapse_step is not None and alarm_step is not None else None
    return {"start_reward": start, "final_reward": final, "collapse_step": collapse_step, "alarm_step": alarm_step,
            "lead": lead, "entropy_end": history[-1].get("grpo/entropy"),
            "valid_actions_end": history[-1]["rollout/valid_action_ratio"],
            "s_per_step": sum(h["perf/step_s"] for h in history) / len(history)}


def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="data/world", help="world folder (built by scripts/search_world.py if absent)")
    ap.add_argument("--out", default="runs/spiral", help="one folder per run, the grid table and the figure")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-3], help="learning rates (the figure: the first)")
    ap.add_argument("--lambdas", type=float, nargs="+", default=[0.0, 0.2], help="--llds values")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="train.py --seed values")
    ap.add_argument("--steps", type=int, default=20, help="rollout steps per run")
    ap.add_argument("--test-samples", type=int, default=0,
                    help="also measure the sampled test reward, this many trajectories per test question (0: off)")
    args, extra = ap.parse_known_args(argv)
    train.parse_args(RL + extra)  # a bad train.py flag stops here, before the world is built, with train.py's line
    if (args.steps < 5 or any(lr <= 0 for lr in args.lrs) or any(lam < 0 for lam in args.lambdas)
            or args.test_samples < 0):
        ap.error("--steps must be >= 5, every --lrs > 0, every --lambdas >= 0 and --test-samples >= 0")
    world, out, t0 = Path(args.world), Path(args.out), time.time()
    files = world_files(world)
    for flag, folder, needed in (("--world", world, not (files["policy"] / "config.json").is_file()),
                                 ("--out", out, True)):
        if needed and (problem := folder_problem(folder)):
            ap.error(f"{flag} {folder}: {problem}")
    cells = [(lr, lam, seed, out / f"lr{lr:g}_llds{lam:g}_seed{seed}")
             for lr in args.lrs for lam in args.lambdas for seed in args.seeds]
    try:  # every run folder is checked before anything is built, trained or written
        flags = {run: resume_flags(run, args.steps, "--overwrite" in extra) for *_, run in cells
                 if not finished(run, args.steps)}
    except ValueError as err:
        ap.error(str(err))
    if not (files["policy"] / "config.json").is_file():
        print(f"building the world and warm-starting the policy in {world} (once; ~5 min on 2 cores)")
        search_world.main(["--out", str(world)])
    out.mkdir(parents=True, exist_ok=True)
    warm_em = evaluate_on_test(files["policy"], files, out / "warm_start_eval.json")
    def sampled(model, cache):  # the sampled test reward, with --test-samples
        return sampled_on_test(model, files, cache, args.test_samples) if args.test_samples else {}

    warm = sampled(files["policy"], out / "warm_start_sampled.json")
    print(f"warm start: test EM {warm_em:.3f}" + (f", sampled test reward {warm['reward']:.3f}, searches/traj "
                                                  f"{warm['searches']:.2f} ({args.test_samples} per question)"
                                                  if warm else ""))

    rows = []
    for lr, lam, seed, run in cells:
        if run in flags:
            print(f"\n=== lr {lr:g}, lambda {lam:g}, seed {seed}: {run}" + " (resumed)" * bool(flags[run]))
            train.main(train.parse_args(["--model", str(files["policy"]), "--train-data", str(files["train"]),
                                         "--corpus", str(files["corpus"]), *RL, *extra, "--steps", str(args.steps),
                                         "--lr", str(lr), "--llds", str(lam), "--seed", str(seed),
                                         "--out-dir", str(run), *flags[run]]), rerun=RERUN)
        history = plot_run.read_metrics(run)
        em = evaluate_on_test(run, files, run / "eval.json")
        test = sampled(run, run / "sampled.json")
        rows.append({"lr": lr, "llds": lam, "seed": seed, "run": str(run), "test_em": em, **measures(history),
                     "test_reward": test.get("reward"), "test_searches": test.get("searches")})

    head = ("| lr | lambda | seed | start reward | final reward | collapse step | alarm step | lead | entropy (end) "
            "| valid actions (end) | test EM |" + (" test reward (sampled) | test searches/traj |" if warm else "")
            + " s/step |")
    lines = [f"warm start test EM: {warm_em:.3f} (greedy, all test questions)" +
             (f"; sampled test reward {warm['reward']:.3f}, searches/traj {warm['searches']:.2f} ({args.test_samples}"
              " per test question)" if warm else "") +
             (f"; train.py flags besides the protocol's: {' '.join(extra)}" if extra else ""),
             "", head, "|" + "---|" * (14 if warm else 12)]
    for r in rows:
        lines.append(f"| {r['lr']:g} | {r['llds']:g} | {r['seed']} | {fmt(r['start_reward'])} | "
                     f"{fmt(r['final_reward'])} | {fmt(r['collapse_step'], 'd')} | {fmt(r['alarm_step'], 'd')} | "
                     f"{fmt(r['lead'], 'd')} | {fmt(r['entropy_end'])} | {fmt(r['valid_actions_end'])} | "
                     f"{r['test_em']:.3f} | " + (f"{r['test_reward']:.3f} | {r['test_searches']:.2f} | "
                                                 if warm else "") + f"{r['s_per_step']:.1f} |")
    print("\n" + "\n".join(lines))
    atomic_write(out / "grid.md", "\n".join(lines) + "\n")
    atomic_write(out / "grid.json", json.dumps({"warm_start_test_em": warm_em, "warm_start_sampled": warm,
                                                  "train_flags": extra, "runs": rows},
                                                 indent=1))
    first = [r for r in rows if r["lr"] == args.lrs[0]]
    figure = plot_run.plot_runs([r["run"] for r in first], out / "spiral.png",
                                labels=[f"λ={r['llds']:g} seed {r['seed']}" for r in first])
    steps = len(rows) * args.steps
    print(f"wrote {out / 'grid.md'}, {out / 'grid.json'} and {figure}; {len(rows)} runs, {time.time() - t0:.0f} s in "
          f"all ({steps / sum(r['s_per_step'] * args.steps for r in rows):.2f} training steps/s)")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # a second Ctrl-C: train.py stopped at once, without saving the step in progress
        raise SystemExit(f"interrupted. Continue with {RERUN}: finished runs are kept and an unfinished one resumes "
                         "from its newest complete checkpoint") from None
