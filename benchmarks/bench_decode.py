"""Benchmark: what bounds a decode step of the rollout (issue 37: generation ran at 9% of the fp32 matmul peak).

One decode step (one new token for each of R rows, KV cache of --context tokens, the model's forward as the cb engine
calls it) is timed in CPU seconds on one thread (OMP_NUM_THREADS=1), the median of --reps after a warm-up, for R in
--rows, in fp32 and under bf16 autocast (only where the CPU has bf16 units), side by side. Beside it, two floors measured in the
same process: the compute floor, 2 N R FLOPs (N: the model's parameters) at this machine's one-thread fp32 matmul
peak (bench_trl.matmul_peak), and the memory floor, the weights' bytes read once at this core's measured read
bandwidth (a sum over a 1 GiB fp32 tensor). A step near the memory floor at few rows and near the compute floor at
many is bounded by the hardware; far above both, by overhead (Python, kernel launches, small shapes). Nothing is
asserted; the figures are printed.

    OMP_NUM_THREADS=1 python benchmarks/bench_decode.py --model ~/.cache/offline-models/smollm2
"""

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def read_bandwidth(gib: float = 1.0, reps: int = 5) -> float:
    """Bytes per CPU-second one thread reads: the best of `reps` sums over a `gib` GiB fp32 tensor."""
    x = torch.ones(int(gib * 2**30) // 4)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        x.sum()
        best = min(best, time.process_time() - t)
    return x.numel() * 4 / best


def decode_step_s(model, rows: int, context: int, amp: bool, reps: int) -> float:
    """Median CPU seconds of one decode step: `rows` rows, one new token each, over a KV cache of `context` tokens
    (prefilled once; each timed step adds its token to the cache, as decoding does)."""
    from transformers import DynamicCache

    ids = torch.randint(0, model.config.vocab_size, (rows, context + reps + 1))
    ctx = torch.autocast("cpu", torch.bfloat16) if amp else torch.autocast("cpu", enabled=False)
    times = []
    with torch.no_grad(), ctx:
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)
        for i in range(reps + 1):
            t = time.process_time()
            model(input_ids=ids[:, context + i:context + i + 1], past_key_values=cache, use_cache=True)
            if i:  # the first is a warm-up
                times.append(time.process_time() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model folder (or hub id)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32], help="rows decoded together (default 1 8 32)")
    ap.add_argument("--context", type=int, default=400, help="tokens already in the KV cache (default 400)")
    ap.add_argument("--reps", type=int, default=7, help="timed decode steps per cell (default 7)")
    a = ap.parse_args()
    from bench_trl import matmul_peak
    from machinery.policy import cpu_has_bf16, load_policy

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' past_key_values rename
    model, _, _ = load_policy(a.model, "float32", "cpu")
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    peak, bw = matmul_peak(), read_bandwidth()
    print(f"CPU {torch.backends.cpu.get_cpu_capability()} (bf16 units: {cpu_has_bf16()}) | one thread: fp32 matmul "
          f"{peak / 1e9:.1f} GFLOP/s, read {bw / 1e9:.1f} GB/s | {n / 1e6:.0f}M parameters, KV cache {a.context}")
    print(f"{'dtype':>6} {'rows':>5} {'step ms':>8} {'tokens/s':>9} {'compute floor ms':>17} {'memory floor ms':>16} "
          f"{'x floor':>8}")
    for rows in a.rows:  # the two dtypes side by side, so a change of load falls on both
        for amp in (False, True) if cpu_has_bf16() else (False,):
            s = decode_step_s(model, rows, a.context, amp, a.reps)
            compute, memory = 2 * n * rows / peak, n * (2 if amp else 4) / bw
            print(f"{'bf16' if amp else 'fp32':>6} {rows:>5} {s * 1e3:>8.1f} {rows / s:>9.1f} {compute * 1e3:>17.1f} "
                  f"{memory * 1e3:>16.1f} {s / max(compute, memory):>8.2f}")


if __name__ == "__main__":
    main()
