"""Benchmark: retrieval at wiki-18 scale (21M passages), where a query's cost decides the step time, on synthetic
indexes of 1M and 5M passages: SparseBM25's dense top-k (a [D] score vector per query) against its posting-list
top-k (SparseBM25.top: only the passages the query's words occur in), side by side in one run, with the results
checked identical (passages and float scores) on every query.

The synthetic index: D passages of 45 distinct words each (wiki-18's 100-word passages after the English analyzer's
stop words), words drawn from a Zipf-Mandelbrot vocabulary of 1M words (p(t) ~ 1 / (t + 10)^1.07, so df falls from
~D/5 for the commonest word), a Lucene-like value per posting, idf from df. No text: nothing here depends on the
analyzer, only on posting-list lengths and D. Three query sets of 200 queries x 5 words:
  "question": words drawn by frequency, the 100 commonest left out (a question's content words after stop words);
  "rare": words of df <= 100 only (names: what the search world's and most Search-R1 queries hold);
  "common": words drawn by frequency, none left out (the worst case).
Prints ms per query (mean, median) per engine and the ratio, and the per-step retrieval cost at the paper's scale
extrapolated linearly in D (the dense path is linear in D; the posting path in the postings, themselves ~ D).
With bm25s installed (`pip install bm25s`; not a requirement) it is timed on the same postings up to --bm25s-max.

    python benchmarks/bench_retrieval_scale.py                      # 1M and 5M passages: ~10 min, ~6 GB peak
    python benchmarks/bench_retrieval_scale.py --sizes 100000 1000000
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machinery.bm25 import SparseBM25, top_k  # noqa: E402

V, WORDS_PER_PASSAGE, QUERY_WORDS = 1_000_000, 45, 5
PAPER_D, PAPER_SEARCHES = 21_015_324, 7_700  # wiki-18 passages; searches per paper step (512 x 5 x ~3 turns)


def synthetic_index(D: int, seed: int = 0) -> SparseBM25:
    """A lucene-variant SparseBM25 of D synthetic passages (see the module docstring); ~20 bytes per posting."""
    rng = np.random.default_rng(seed)
    p = 1.0 / (np.arange(V) + 10.0) ** 1.07
    cdf = np.cumsum(p / p.sum())
    terms = np.searchsorted(cdf, rng.random(D * WORDS_PER_PASSAGE)).astype(np.int64)  # [n] word of each posting
    key = np.unique(terms * D + np.repeat(np.arange(D, dtype=np.int64), WORDS_PER_PASSAGE))  # (word, passage), once
    del terms
    term, docs = key // D, (key % D).astype(np.int32)  # sorted by word, then passage: the CSR order
    del key
    df = np.bincount(term, minlength=V)  # [V]
    indptr = np.concatenate([[0], np.cumsum(df)])  # [V+1]
    values = rng.uniform(0.3, 1.5, len(docs)).astype(np.float32)  # tf * inv(dl), as Lucene's range
    idf = np.log1p((D - df + 0.5) / (df + 0.5)).astype(np.float32)  # [V]
    return SparseBM25({str(t): t for t in range(V)}, indptr, docs, values, D, "lucene", idf)


def query_sets(index: SparseBM25, n: int, seed: int = 1) -> dict[str, list[list[str]]]:
    rng = np.random.default_rng(seed)
    df = np.diff(index.indptr)  # [V]
    by_freq = df / df.sum()
    question = by_freq.copy()
    question[np.argsort(-df)[:100]] = 0
    rare = np.where((df > 0) & (df <= 100), 1.0, 0.0)
    sets = {}
    for name, p in (("question", question), ("rare", rare), ("common", by_freq)):
        p = p / p.sum()
        sets[name] = [[str(t) for t in rng.choice(V, QUERY_WORDS, p=p)] for _ in range(n)]
    return sets


def time_queries(fn, queries) -> tuple[list, np.ndarray]:
    """(fn's results, ms per query [len(queries)]), after one untimed warm-up call."""
    fn(queries[0])
    out, ms = [], []
    for q in queries:
        t = time.perf_counter()
        out.append(fn(q))
        ms.append((time.perf_counter() - t) * 1e3)
    return out, np.array(ms)


def bm25s_search(index: SparseBM25):
    """bm25s (if installed: `pip install bm25s`; not a requirement) over the same (word, passage) pairs, each with
    tf 1, method "lucene", k1 0.9, b 0.4, one thread: words -> (passages [3], scores [3]). Its scores are its own
    (it sees tf 1 and equal lengths, not our synthetic values): compared for speed, not results."""
    import bm25s
    from bm25s.tokenization import Tokenized

    D = index.num_docs
    order = np.argsort(index.docs, kind="stable")  # postings by passage
    terms = np.repeat(np.arange(V), np.diff(index.indptr))[order]
    ids = [a.tolist() for a in np.split(terms, np.cumsum(np.bincount(index.docs, minlength=D))[:-1])]
    engine = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
    engine.index(Tokenized(ids=ids, vocab=index.vocab), show_progress=False)
    return lambda words: engine.retrieve([words], k=3, show_progress=False, n_threads=1)


def dense(index, words, k=3):
    scores = index.get_scores(words)  # [D]
    order = top_k(scores, k)
    return order, scores[order]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000], help="passages per index")
    ap.add_argument("--queries", type=int, default=200, help="queries per set")
    ap.add_argument("--bm25s-max", type=int, default=1_000_000, help="time bm25s too (if installed) up to this size")
    args = ap.parse_args()
    if min(args.sizes) < 1000 or args.queries < 1:
        ap.error("--sizes must be >= 1000 and --queries >= 1")
    print(f"{'passages':>10} {'queries':>9} {'postings/query':>15} {'dense ms':>16} {'postings ms':>16} {'speed-up':>9}"
          f"  identical  {'bm25s ms':>16}")
    for D in args.sizes:
        t0 = time.time()
        index = synthetic_index(D)
        built, other = time.time() - t0, None
        if D <= args.bm25s_max:
            try:
                other = bm25s_search(index)
            except ImportError:
                print("(bm25s not installed: pip install bm25s to time it too)")
        for name, queries in query_sets(index, args.queries).items():
            n = np.mean([sum(index.indptr[int(w) + 1] - index.indptr[int(w)] for w in q) for q in queries])
            a, ms_a = time_queries(lambda q: dense(index, q), queries)
            b, ms_b = time_queries(lambda q: index.top(q, 3), queries)
            same = all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])  # exact: SparseBM25.top's claim:
                       for x, y in zip(a, b))  # the dense path's passages and scores, bit for bit, on any CPU
            ms_c = time_queries(other, queries)[1] if other else None
            print(f"{D:>10,} {name:>9} {n:>15,.0f} {ms_a.mean():>8.2f} ({np.median(ms_a):>5.2f}) "
                  f"{ms_b.mean():>8.2f} ({np.median(ms_b):>5.2f}) {ms_a.mean() / ms_b.mean():>8.1f}x  {str(same):>9}  "
                  + (f"{ms_c.mean():>8.2f} ({np.median(ms_c):>5.2f})" if other else f"{'-':>16}"))
            if name == "question":
                scale = PAPER_D / D
                print(f"{'':>10} at 21M passages x {PAPER_SEARCHES:,} searches a step (linear in D): dense "
                      f"{ms_a.mean() * scale * PAPER_SEARCHES / 6e4:.0f} min, postings "
                      f"{ms_b.mean() * scale * PAPER_SEARCHES / 6e4:.0f} min per step")
        print(f"{'':>10} (index of {len(index.docs):,} postings built in {built:.0f} s)")
        del index


if __name__ == "__main__":
    main()
