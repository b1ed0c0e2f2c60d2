"""Benchmark: retrieval quality of the BM25 variants, and speed of rank-bm25 (the reference engine) vs the sparse
engine of bm25.py, side by side in one run.

Quality (--part recall): recall@3 of the supporting titles, for three scorings: okapi over \\w+ words (rank-bm25's
BM25Okapi, `--bm25 okapi`), lucene over \\w+ words (Lucene's BM25 formula alone) and lucene over Lucene's English
analyzer (`--bm25 lucene`, the default). Question set: every question of the --data folder's *.jsonl files (not
corpus.jsonl) whose metadata lists supporting titles (scripts/prepare_data.py writes them; the README's figures are
from our 877-question HotpotQA + MuSiQue bundle with a 13,823-passage corpus). Metric, per question: its text is the
query, the 3 best passages are searched (`BM25Retriever.search`) and their titles taken from the hits
(evaluate.retrieved_titles), and
recall = |supporting titles among them| / |supporting titles| (evaluate.recall: case- and space-insensitive); the
table gives the mean over the questions, the mean per dataset, and the share of questions with every supporting
title in the top 3. Deterministic: no sampling, ties broken by passage order.

Speed (--part speed): for each corpus size it builds each engine, each in a fresh subprocess (so memory is measured
cleanly), and reports build time, index memory (resident memory after the build minus before; peak in brackets),
per-query latency (`BM25Retriever.search([q], 3)` on real questions from --data) and the speedup over
rank-bm25, and checks that the okapi engines return identical top-3 lists (ids and scores). "sparse" is okapi on the
sparse engine, "lucene" the default --bm25 lucene (sparse engine, English analyzer: its build time is mostly the
analyzer). Larger corpora repeat the real 13,823 passages (ids renumbered), so every passage has many exact
duplicates: ties are broken by passage order, which the check covers too. Not a test: nothing is asserted on time.
Also prints retrieval's share of a CPU training step (--metrics).

    python benchmarks/bench_retrieval.py                 # recall, then 10K, 13,823 (real), 100K, 1M: ~30 min
    python benchmarks/bench_retrieval.py --part recall   # the quality table alone: ~30 s
    python benchmarks/bench_retrieval.py --part speed --sizes 10000 13823 100000           # ~10 min
    python benchmarks/bench_retrieval.py --part speed --sizes 10000 100000 --queries 100
"""

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machinery.data import load_corpus  # noqa: E402
from retriever import BM25Retriever, load_index, save_index  # noqa: E402

DATA = Path(os.environ.get("BENCH_DATA", ROOT / "data" / "hotpotqa"))  # --data (children read it from the env)


def rss_mb() -> float:
    """Resident memory of this process now (Linux /proc)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def questions(n: int) -> list[str]:
    """n real questions, round-robin over the question files so every dataset is represented."""
    files = [[json.loads(line)["question"] for line in open(f, encoding="utf-8")]
             for f in sorted(DATA.glob("*.jsonl")) if f.name != "corpus.jsonl"]
    return [q for group in zip(*files) for q in group][:n]


ENGINES = {"rank_bm25": dict(engine="rank_bm25", bm25="okapi"), "sparse": dict(engine="sparse", bm25="okapi"),
           "lucene": dict(engine="sparse", bm25="lucene")}  # speed rows -> BM25Retriever arguments
VARIANTS = [("okapi", "words"), ("lucene", "words"), ("lucene", "english")]  # quality rows: (--bm25, analyzer)


def supporting_questions() -> list[dict]:
    """The bundle's questions whose metadata lists supporting titles, file by file (sorted names), in file order."""
    rows = []
    for f in sorted(DATA.glob("*.jsonl")):
        if f.name != "corpus.jsonl":
            rows += [r for r in map(json.loads, open(f, encoding="utf-8"))
                     if (r.get("metadata") or {}).get("supporting_titles")]
    return rows


def recall_table():
    """Print recall@3 of the supporting titles for each of VARIANTS (metric and question set: module docstring)."""
    from evaluate import recall, retrieved_titles  # the project's own rule, as evaluate.py scores trajectories

    corpus, rows = load_corpus(DATA / "corpus.jsonl"), supporting_questions()
    sources = sorted({r["data_source"] for r in rows})
    per = {s: sum(r["data_source"] == s for r in rows) for s in sources}
    print(f"recall@3 of the supporting titles, {len(rows)} questions ({', '.join(f'{s} {n}' for s, n in per.items())})")
    print(f"{'--bm25':<7} | {'analyzer':<8} | {'recall@3':>8} | " + " | ".join(f"{s:>9}" for s in sources) +
          f" | {'all found':>9} | {'build s':>7} | {'ms/query':>8}")
    for bm25, analyzer in VARIANTS:
        t0 = time.perf_counter()
        retriever = BM25Retriever(corpus, engine="sparse", bm25=bm25, analyzer=analyzer)  # okapi: rank-bm25's floats
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        hits = retriever.search([r["question"] for r in rows], 3)
        query_ms = 1000 * (time.perf_counter() - t0) / len(rows)
        scores = [recall(r["metadata"]["supporting_titles"], retrieved_titles([h])) for r, h in zip(rows, hits)]
        by_source = [fmean([x for x, r in zip(scores, rows) if r["data_source"] == s]) for s in sources]
        print(f"{bm25:<7} | {analyzer:<8} | {fmean(scores):>8.3f} | " + " | ".join(f"{x:>9.3f}" for x in by_source) +
              f" | {fmean([x == 1 for x in scores]):>9.3f} | {build_s:>7.1f} | {query_ms:>8.2f}", flush=True)


def one(engine: str, size: int, num_queries: int, cache: str) -> dict:
    """Build one engine (ENGINES) over `size` passages and time it (runs in its own process)."""
    real = load_corpus(DATA / "corpus.jsonl")
    corpus = [{"id": str(i), "contents": real[i % len(real)]["contents"]} for i in range(size)]
    queries = questions(num_queries)
    gc.collect()
    before = rss_mb()
    t0 = time.perf_counter()
    retriever = BM25Retriever(corpus, **ENGINES[engine])
    build_s = time.perf_counter() - t0
    gc.collect()
    out = {"build_s": build_s, "index_mb": rss_mb() - before,
           "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before}
    retriever.search(queries[:1], 3)  # imports and the compiled search loaded (numba: ~0.7 s) outside the timing
    t0 = time.perf_counter()
    hits = [retriever.search([q], 3)[0] for q in queries]
    out["query_ms"] = 1000 * (time.perf_counter() - t0) / len(queries)
    out["topk"] = [[(h["document"]["id"], h["score"]) for h in q] for q in hits]
    if engine != "rank_bm25":  # the on-disk cache: what a second run pays instead of build_s
        path = Path(cache) / f"bench-{engine}-{size}.npz"
        save_index(retriever.bm25, path)
        t0 = time.perf_counter()
        load_index(path)
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


def speed_table(args):
    print(f"{'passages':>10} | {'engine':<9} | {'build s':>8} | {'index MB (peak)':>16} | {'ms/query':>9} | "
          f"{'speedup':>8} | {'same top-3':>10} | cache: load s, MB")
    per_query = {}
    for size in args.sizes:
        ref = run_one("rank_bm25", size, max(10, min(args.queries, int(args.ref_budget // size))), args.cache)
        fast = run_one("sparse", size, args.queries, args.cache)
        lucene = run_one("lucene", size, args.queries, args.cache) if "lucene" in args.engines else None
        n = len(ref["topk"])
        same = fast["topk"][:n] == ref["topk"]  # exact: same ids, same order, bitwise the same scores
        per_query[size] = (ref["query_ms"], fast["query_ms"])
        for name, r in (("rank_bm25", ref), ("sparse", fast), ("lucene", lucene)):
            if r is None:
                continue
            mem = f"{r['index_mb']:.0f} ({r['peak_mb']:.0f})"
            check = {"rank_bm25": "", "sparse": f"{same} ({n} q)", "lucene": "(other)"}[name]
            tail = (f"{ref['query_ms'] / r['query_ms']:>7.0f}x | {check:>10} | {r['load_s']:.2f} s, "
                    f"{r['cache_mb']:.0f} MB" if name != "rank_bm25" else f"{'':>8} | {'':>10} |")
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


def main():
    global DATA
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA), help="folder with corpus.jsonl and question files (*.jsonl) whose "
                    "metadata lists supporting_titles (default: scripts/prepare_data.py's output)")
    ap.add_argument("--part", default="all", choices=["all", "recall", "speed"], help="which table(s) to print")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 13_823, 100_000, 1_000_000])
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES),
                    help="speed rows (rank_bm25 and sparse always run: the reference and its check)")
    ap.add_argument("--queries", type=int, default=200, help="questions timed on the sparse engines")
    ap.add_argument("--ref-budget", type=float, default=2e6, help="rank-bm25 times max(10, budget / size) questions")
    ap.add_argument("--metrics", default="runs/cpu/metrics.jsonl", help="a CPU training run, for the step-time share")
    ap.add_argument("--cache", default="/tmp", help="folder for the cache load timing")
    ap.add_argument("--one", nargs=2, metavar=("ENGINE", "SIZE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    DATA = Path(args.data)
    os.environ["BENCH_DATA"] = args.data  # the --one subprocesses
    if not (DATA / "corpus.jsonl").is_file():
        raise SystemExit(f"--data {DATA}: no corpus.jsonl (make one: python scripts/prepare_data.py --out-dir {DATA})")
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.queries, args.cache)))
        return
    if args.part in ("all", "recall"):
        recall_table()
    if args.part in ("all", "speed"):
        speed_table(args)


if __name__ == "__main__":
    main()
