"""Benchmark: rank-bm25 (the reference engine) vs the sparse engine of retriever.py, side by side in one run.

For each corpus size it builds both indexes, each in a fresh subprocess (so memory is measured cleanly), and reports
build time, index memory (resident memory after the build minus before; peak in brackets), per-query latency
(`BM25Retriever.search([q], 3)` on real questions from ../shared/data) and the speedup, and checks that the two
engines return identical top-3 lists (ids and scores). Larger corpora repeat the real 13,823 passages (ids renumbered),
so every passage has many exact duplicates: ties are broken by passage order, which the check covers too.
Not a test: nothing is asserted on time. Also prints retrieval's share of a CPU training step (--metrics).

    python benchmarks/bench_retrieval.py                                  # 10K, 13,823 (real), 100K, 1M: ~10 min
    python benchmarks/bench_retrieval.py --sizes 10000 100000 --queries 100
"""

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retriever import BM25Retriever, SparseBM25, load_corpus  # noqa: E402

DATA = ROOT.parent / "shared" / "data"


def rss_mb() -> float:
    """Resident memory of this process now (Linux /proc)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def questions(n: int) -> list[str]:
    """n real questions, round-robin over the question files so every dataset is represented."""
    files = [[json.loads(line)["question"] for line in open(f, encoding="utf-8")]
             for f in sorted(DATA.glob("*.jsonl")) if f.name != "corpus.jsonl"]
    return [q for group in zip(*files) for q in group][:n]


def one(engine: str, size: int, num_queries: int, cache: str) -> dict:
    """Build one engine over `size` passages and time it (runs in its own process)."""
    real = load_corpus(DATA / "corpus.jsonl")
    corpus = [{"id": str(i), "contents": real[i % len(real)]["contents"]} for i in range(size)]
    queries = questions(num_queries)
    gc.collect()
    before = rss_mb()
    t0 = time.perf_counter()
    retriever = BM25Retriever(corpus, engine=engine)
    build_s = time.perf_counter() - t0
    gc.collect()
    out = {"build_s": build_s, "index_mb": rss_mb() - before,
           "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before}
    t0 = time.perf_counter()
    hits = [retriever.search([q], 3)[0] for q in queries]
    out["query_ms"] = 1000 * (time.perf_counter() - t0) / len(queries)
    out["topk"] = [[(h["document"]["id"], h["score"]) for h in q] for q in hits]
    if engine == "sparse":  # the on-disk cache: what a second run pays instead of build_s
        path = Path(cache) / f"bench-{size}.npz"
        retriever.bm25.save(path)
        t0 = time.perf_counter()
        SparseBM25.load(path)
        out["load_s"] = time.perf_counter() - t0
        out["cache_mb"] = path.stat().st_size / 2**20
        path.unlink()
    return out


def run_one(engine: str, size: int, num_queries: int, cache: str) -> dict:
    cmd = [sys.executable, __file__, "--one", engine, str(size), "--queries", str(num_queries), "--cache", cache]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{engine} at {size} passages failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 13_823, 100_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=200, help="questions timed on the sparse engine")
    ap.add_argument("--ref-budget", type=float, default=2e6, help="rank-bm25 times max(10, budget / size) questions")
    ap.add_argument("--metrics", default="runs/cpu/metrics.jsonl", help="a CPU training run, for the step-time share")
    ap.add_argument("--cache", default="/tmp", help="folder for the cache load timing")
    ap.add_argument("--one", nargs=2, metavar=("ENGINE", "SIZE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.queries, args.cache)))
        return

    print(f"{'passages':>10} | {'engine':<9} | {'build s':>8} | {'index MB (peak)':>16} | {'ms/query':>9} | "
          f"{'speedup':>8} | {'same top-3':>10} | cache: load s, MB")
    per_query = {}
    for size in args.sizes:
        ref = run_one("rank_bm25", size, max(10, min(args.queries, int(args.ref_budget // size))), args.cache)
        fast = run_one("sparse", size, args.queries, args.cache)
        n = len(ref["topk"])
        same = fast["topk"][:n] == ref["topk"]  # exact: same ids, same order, bitwise the same scores
        speedup = ref["query_ms"] / fast["query_ms"]
        per_query[size] = (ref["query_ms"], fast["query_ms"])
        for name, r in (("rank_bm25", ref), ("sparse", fast)):
            mem = f"{r['index_mb']:.0f} ({r['peak_mb']:.0f})"
            tail = (f"{speedup:>7.0f}x | {str(same) + f' ({n} q)':>10} | {r['load_s']:.2f} s, {r['cache_mb']:.0f} MB"
                    if name == "sparse" else f"{'':>8} | {'':>10} |")
            print(f"{size:>10,} | {name:<9} | {r['build_s']:>8.1f} | {mem:>16} | {r['query_ms']:>9.2f} | {tail}",
                  flush=True)

    metrics = Path(args.metrics)
    if metrics.is_file() and 13_823 in per_query:  # the vertical slice trains on the real 13,823-passage corpus
        run = json.loads((metrics.parent / "args.json").read_text())
        steps = [json.loads(line)["perf/step_s"] for line in metrics.read_text().splitlines()]
        step_s = sum(steps) / len(steps)
        n_q = run["prompts_per_step"] * run["group_size"] * run["max_turns"]  # at most: every trajectory searches
        for name, ms in zip(("rank_bm25", "sparse"), per_query[13_823]):
            print(f"vertical slice ({metrics}, {step_s:.0f} s/step, <= {n_q} searches/step): {name} retrieval "
                  f"{n_q * ms / 1000:.2f} s/step = {100 * n_q * ms / 1000 / step_s:.3f}% of a step")


if __name__ == "__main__":
    main()
