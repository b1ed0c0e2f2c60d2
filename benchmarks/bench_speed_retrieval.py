"""Benchmark (issue 27): BM25 search and index build, ours against bm25s, in one process, interleaved.

Engines, all over the same words (our analyzers'), so that the posting lists are the same and only the search differs:
  ours numpy   SparseBM25 with bm25.NUMBA = False: the numpy path, what search was before issue 27 (query by query);
  ours numba   SparseBM25.top_many: one compiled call per batch, one thread per core (the default with numba);
  bm25s numpy  bm25s.BM25(backend="numpy").retrieve;  bm25s numba  bm25s.BM25(backend="numba").retrieve.
Single queries: bm25s with its default n_threads=0 (one thread); 128-query batches: n_threads=-1 (all cores), ours
too. What each computes: ours gives Lucene's float32 scores (one-byte passage lengths, `--bm25 lucene`) or rank-bm25's
float64 ones (`--bm25 okapi`), exact, ties by passage order; bm25s method "lucene" scores idf * tf / (tf + k1 * (1 - b
+ b * dl / avgdl)) with exact lengths, float32 sums (so its top-3 differs from Lucene's now and then: the "same top-3"
column), and for okapi its method "robertson" (rank-bm25's idf without the 0.25 * mean-idf floor: ranks alike, the
scores differ). Both return the top 3. Timed: the search of analyzed queries (list of words -> top-k ids and scores),
not the analysis of the question text, which is the same work for both.

Build: from the passage texts to a searchable index. Ours: the analyzer (english_analyze, its word memory emptied
first; `words` for okapi) then SparseBM25.build. "ours before": the same with bm25.py as it was before issue 27
(git show BEFORE:bm25.py, loaded as a module; no numba or PyStemmer use). bm25s: bm25s.tokenize (its \\w\\w+ words:
one-letter words and Lucene's joins like U.S. and 3.14 differ; lower-cased; our 33 stop words; PyStemmer's Snowball
porter for lucene, no stemmer for okapi) then BM25.index.

Corpora: the real passages of --data's corpus.jsonl (our figures: the development bundle's 13,823 Wikipedia
passages, HotpotQA and MuSiQue contexts) and, as benchmarks/bench_retrieval.py makes its 100K and 1M cases, that corpus
repeated (passage i is real passage i mod 13,823), so every passage has exact duplicates (ties, broken by passage
order) and the vocabulary stays the bundle's. Queries: --data's real training questions (*_train.jsonl, alternately),
analyzed, keeping those with a word in the index: 512 of them (--queries), timed one by one (ms/query single) and in
batches of 128 (ms/query batched = batch time / 128). Repeats are interleaved (each repeat runs every engine in
turn); the table gives the best of N repeats (labelled so) and the median; os.getloadavg() is printed before and after.

    python benchmarks/bench_speed_retrieval.py --data DIR                 # 13,823 and 100K passages: ~15 min on 2 cores
    python benchmarks/bench_speed_retrieval.py --data DIR --sizes 1000000 --repeats 2 --build-repeats 1 --queries 256
    python benchmarks/bench_speed_retrieval.py --quick                    # the shipped sample: a smoke run, ~1 min
"""

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machinery import bm25  # noqa: E402
from machinery.bm25 import LUCENE_STOP_WORDS, SparseBM25, english_analyze, tokenize  # noqa: E402

DATA = Path(os.environ.get("BENCH_DATA", ROOT / "data" / "hotpotqa"))  # --data: scripts/prepare_data.py writes it
BEFORE = "78d3157"  # the last commit before issue 27's retrieval work ("ours before" build)
BATCH = 128
ANALYZER = {"lucene": english_analyze, "okapi": tokenize}
BM25S_METHOD = {"lucene": "lucene", "okapi": "robertson"}


def load_texts(data: Path, size: int) -> list[str]:
    """`size` passage texts: the real corpus, repeated (passage i = real passage i mod len(real))."""
    real = [json.loads(line)["contents"] for line in open(data / "corpus.jsonl", encoding="utf-8")]
    return [real[i % len(real)] for i in range(size)]


def load_questions(data: Path) -> list[str]:
    """The bundle's training questions, alternating between its question files."""
    files = [[json.loads(line)["question"] for line in open(f, encoding="utf-8")]
             for f in sorted(data.glob("*_train.jsonl"))]
    return [q for group in zip(*files) for q in group]


def before_module():
    """bm25.py as of BEFORE, as a module (None without git)."""
    try:
        src = subprocess.run(["git", "show", f"{BEFORE}:bm25.py"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path("/tmp") / f"bm25_before_{BEFORE}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"bm25_before_{BEFORE}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_ours(texts, variant, module=bm25):
    """(index, [D] analyzed passages, seconds): the analyzer, then SparseBM25.build, from a cold analyzer."""
    gc.collect()
    if module is bm25:
        bm25._ENGLISH_WORDS.clear()
    elif hasattr(module, "_english_word"):
        module._english_word.cache_clear()
    analyze = {"lucene": module.english_analyze, "okapi": module.tokenize}[variant]
    t0 = time.perf_counter()
    words = list(map(analyze, texts))
    index = module.SparseBM25.build(words, variant=variant)
    return index, words, time.perf_counter() - t0


def build_bm25s(texts, variant, backend="numba"):
    """(retriever, seconds): bm25s.tokenize + BM25.index (module docstring: how its words differ)."""
    import bm25s
    import Stemmer

    gc.collect()
    t0 = time.perf_counter()
    lucene = variant == "lucene"
    tokens = bm25s.tokenize(texts, stopwords=sorted(LUCENE_STOP_WORDS) if lucene else None,
                            stemmer=Stemmer.Stemmer("porter") if lucene else None, show_progress=False)
    engine = bm25s.BM25(method=BM25S_METHOD[variant], k1=0.9, b=0.4, backend=backend)  # our k1, b (retriever.py)
    engine.index(tokens, show_progress=False)
    return engine, time.perf_counter() - t0


def bm25s_on_our_words(words: list[list[str]], variant: str, backend: str):
    """bm25s over our analyzer's words (the same posting lists as ours)."""
    import bm25s

    engine = bm25s.BM25(method=BM25S_METHOD[variant], k1=0.9, b=0.4, backend=backend)  # our k1, b (retriever.py)
    engine.index(words, show_progress=False)
    return engine


def searchers(index: SparseBM25, engines: dict) -> dict:
    """name -> (single(words) -> top-3 ids, batch(list of words) -> [top-3 ids])."""
    def ours(numba):
        def single(q):
            bm25.NUMBA = numba
            return index.top(q, 3)[0]

        def batch(qs):
            bm25.NUMBA = numba
            return [d for d, _ in index.top_many(qs, 3)]
        return single, batch

    def theirs(engine):
        return (lambda q: engine.retrieve([q], k=3, show_progress=False).documents[0],
                lambda qs: list(engine.retrieve(qs, k=3, show_progress=False, n_threads=-1).documents))
    out = {"ours numpy": ours(False), "ours numba": ours(True)}
    out.update({name: theirs(engine) for name, engine in engines.items()})
    return out


def time_search(search, queries) -> tuple[float, float]:
    """(ms/query one by one, ms/query in batches of BATCH)."""
    single, batch = search
    t0 = time.perf_counter()
    for q in queries:
        single(q)
    t1 = time.perf_counter()
    for i in range(0, len(queries), BATCH):
        batch(queries[i:i + BATCH])
    t2 = time.perf_counter()
    return 1000 * (t1 - t0) / len(queries), 1000 * (t2 - t1) / len(queries)


def run(quick: bool = False, sizes=(13_823, 100_000), variants=("lucene", "okapi"), repeats: int = 5,
        build_repeats: int = 3, num_queries: int = 512, data: Path = DATA) -> list[dict]:
    """Rows {passages, variant, engine, single_ms, batch_ms (best of `repeats`), *_median, build_s (best of
    `build_repeats`), same_top3 (share of queries whose top-3 are ours, as sets of real passages: a repeated corpus
    ties its copies)}. quick: tests/fixtures/qa_sample (600
    passages, repeated to 3,000), 1 repeat, 64 queries: seconds, for a smoke test."""
    have_bm25s = importlib.util.find_spec("bm25s") is not None and importlib.util.find_spec("Stemmer") is not None
    if quick:
        data, sizes, repeats, build_repeats, num_queries = ROOT / "tests/fixtures/qa_sample", (3_000,), 1, 1, 64
        files = sorted(data.glob("*_train.jsonl"))
        assert files, data
    before = before_module()
    questions = load_questions(data)
    real = sum(1 for _ in open(data / "corpus.jsonl", encoding="utf-8"))  # passages in the real corpus
    for module in (bm25, before) if before else (bm25,):  # imports (nltk, PyStemmer, regex tables) out of the timing
        module.english_analyze(questions[0]), module.tokenize(questions[0])
    rows = []
    for size in sizes:
        texts = load_texts(data, size)
        for variant in variants:
            builds = {"ours": [], "ours before": [], "bm25s": []}
            index = words = None
            for _ in range(build_repeats):  # interleaved: ours, ours before, bm25s, ours, ...
                index, words, s = build_ours(texts, variant)
                builds["ours"].append(s)
                if before is not None:
                    builds["ours before"].append(build_ours(texts, variant, before)[2])
                if have_bm25s:
                    builds["bm25s"].append(build_bm25s(texts, variant)[1])
            queries = [w for w in map(ANALYZER[variant], questions) if any(x in index.vocab for x in w)][:num_queries]
            engines = {f"bm25s {b}": bm25s_on_our_words(words, variant, b) for b in ("numpy", "numba")} \
                if have_bm25s else {}
            del words
            found = {}
            timings = {name: [] for name in searchers(index, engines)}
            for name, search in searchers(index, engines).items():  # warm up: JIT compiles, scratch arrays
                search[0](queries[0]), search[1](queries[:BATCH])
                found[name] = [sorted(int(i) % real for i in d) for d in search[1](queries)]  # real passages
            for _ in range(repeats):
                for name, search in searchers(index, engines).items():
                    timings[name].append(time_search(search, queries))
            bm25.NUMBA = importlib.util.find_spec("numba") is not None
            build_of = {"ours numba": "ours", "ours numpy": "ours before", "bm25s numpy": "bm25s",
                        "bm25s numba": "bm25s"}
            for name, t in timings.items():
                single, batch = zip(*t)
                build = builds[build_of[name]]
                rows.append(dict(passages=size, variant=variant, engine=name, single_ms=min(single),
                                 batch_ms=min(batch), single_ms_median=statistics.median(single),
                                 batch_ms_median=statistics.median(batch),
                                 build_s=min(build) if build else float("nan"),
                                 same_top3=float(np.mean([a == b for a, b in zip(found[name], found["ours numba"])])),
                                 queries=len(queries), repeats=repeats, build_repeats=len(build)))
            del engines, index
            gc.collect()
    return rows


def print_table(rows: list[dict]):
    """The rows side by side with their ratios to bm25s numba (> 1: that engine is slower than bm25s numba)."""
    print(f"{'passages':>9} {'bm25':<6} {'engine':<11} | {'single ms/q':>11} {'(median)':>8} {'x bm25s-nb':>10} | "
          f"{'batch ms/q':>10} {'(median)':>8} {'x bm25s-nb':>10} | {'build s':>8} {'x bm25s':>7} | same top-3")
    print(f"(ours numpy = before: the numpy search, and the build of bm25.py at {BEFORE}; ours numba = after. "
          "x bm25s-nb: time / bm25s numba's, below 1 = faster)")
    ref = {(r["passages"], r["variant"]): r for r in rows if r["engine"] == "bm25s numba"}
    for r in rows:
        b = ref.get((r["passages"], r["variant"]))
        ratio = (lambda key: f"{r[key] / b[key]:>9.2f}x" if b else f"{'':>10}")
        print(f"{r['passages']:>9,} {r['variant']:<6} {r['engine']:<11} | {r['single_ms']:>11.3f} "
              f"{r['single_ms_median']:>8.3f} {ratio('single_ms')} | {r['batch_ms']:>10.3f} "
              f"{r['batch_ms_median']:>8.3f} {ratio('batch_ms')} | {r['build_s']:>8.2f} "
              f"{ratio('build_s') if b and r['build_s'] == r['build_s'] else '':>8} | {r['same_top3']:.3f}",
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA), help="folder with corpus.jsonl and *_train.jsonl question files")
    ap.add_argument("--sizes", type=int, nargs="+", default=[13_823, 100_000])
    ap.add_argument("--variants", nargs="+", default=["lucene", "okapi"], choices=["lucene", "okapi"])
    ap.add_argument("--repeats", type=int, default=5, help="interleaved search repeats (best and median shown)")
    ap.add_argument("--build-repeats", type=int, default=3, help="interleaved builds of each engine")
    ap.add_argument("--queries", type=int, default=512)
    ap.add_argument("--quick", action="store_true", help="the shipped sample, 1 repeat: a smoke run")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    if args.quick:
        args.repeats = args.build_repeats = 1  # as run(quick=True)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); "
          f"search: best of {args.repeats} interleaved repeats (median beside it), build: best of "
          f"{args.build_repeats}; ms/query", flush=True)
    rows = []
    for size in args.sizes[:1] if args.quick else args.sizes:  # a table per size, as it comes
        rows += run(args.quick, [size], args.variants, args.repeats, args.build_repeats, args.queries, Path(args.data))
        print_table([r for r in rows if r["passages"] == rows[-1]["passages"]])
        print(f"load average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
