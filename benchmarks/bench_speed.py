"""Benchmark (issue 27): a rollout's two costs, generation and retrieval, ours against the peers, in one process.

One command for both halves, each interleaved within itself (each repeat runs every engine in turn) and printing its
ratios side by side, with the machine's load before and after:
  * generation (benchmarks/bench_speed_generation.py): hf (Hugging Face `generate` on static batches, the former
    default), hf-kv, cb (continuous batching, the default) and plain one-row `generate`: useful tokens per decoded
    slot and useful tokens/s, ratios to hf;
  * retrieval (benchmarks/bench_speed_retrieval.py): ours before (numpy) and now (numba) against bm25s' numpy and numba
    backends: ms/query single and in 128-query batches, index build seconds, ratios to bm25s numba.
Best-of-N figures are labelled so in each table. docs/scaling.md ("Generation engines") and docs/retrieval.md
("Against bm25s") quote these tables with the load they ran under.

    nice -n 5 python benchmarks/bench_speed.py --data DIR      # ~30 min on 2 cores (DIR: corpus.jsonl, *_train.jsonl)
    python benchmarks/bench_speed.py --quick                   # the shipped fixtures: a smoke run, ~3 min
"""

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_speed_generation  # noqa: E402
import bench_speed_retrieval  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(bench_speed_retrieval.DATA), help="retrieval: corpus.jsonl and *_train.jsonl")
    ap.add_argument("--sizes", type=int, nargs="+", default=[13_823, 100_000], help="retrieval: passages")
    ap.add_argument("--quick", action="store_true", help="fewer rows and repeats, the shipped fixtures: a smoke run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for generation (1: steadier figures)")
    args = ap.parse_args(argv)
    if not args.quick and not (Path(args.data) / "corpus.jsonl").is_file():
        raise SystemExit(f"error: --data {args.data}: no corpus.jsonl there (scripts/prepare_data.py writes one; "
                         "--quick runs on the shipped fixtures)")
    print(f"{os.cpu_count()} CPUs; load average (1/5/15 min) at the start: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    torch.set_num_threads(args.threads)
    print("\n== generation (benchmarks/bench_speed_generation.py)", flush=True)
    bench_speed_generation.print_table(bench_speed_generation.run(quick=args.quick))
    print("\n== retrieval (benchmarks/bench_speed_retrieval.py)", flush=True)
    sizes = [3_000] if args.quick else args.sizes
    bench_speed_retrieval.print_table(bench_speed_retrieval.run(args.quick, sizes, data=Path(args.data)))
    print(f"\nload average (1/5/15 min) at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
