"""Search a passage corpus, in this process or over HTTP: the search engine behind the agent's
<search> calls.

`BM25Retriever` indexes a jsonl corpus in this process with BM25 (machinery/bm25.py: Lucene's
scoring by default, as pyserini, or rank-bm25's Okapi), scoring a query q against a passage d as
    s(q, d) = sum_{w in q} idf(w) * g * tf(w, d) / (tf(w, d) + k1 * (1 - b + b * |d| / avgdl))
and `search` returns the <= topk passages of highest s(q, d) > 0, best first, with their scores.
`RemoteRetriever` (machinery/remote.py) asks a server with Search-R1's /retrieve API instead, for
paper-scale corpora (wiki-18; the paper retrieves with E5). Both give rollout.rollout its
`search(queries, topk) -> hits per query`; `make_retriever` picks one. Matches Search-R1's
`search_r1/search/retrieval_server.py` (BM25 path) and its API; corpus rows are {"id", "contents":
'"Title"\\ntext'}; departures: docs/departures.md.

    python retriever.py                                   # a demo on a built-in 5-passage corpus
    python retriever.py --corpus CORPUS.jsonl "who founded X" ["another query" ...] [--topk 3] \
        [--bm25 okapi]
    python scripts/retrieval_server.py --corpus CORPUS.jsonl --port 8000   # for --retriever-url
"""

import argparse
import os
import sys
import time
from pathlib import Path

from rank_bm25 import BM25Okapi
from tqdm import tqdm

from machinery.bm25 import (
    ANALYZERS,
    BM25_VARIANTS,
    DEFAULT_ANALYZER,
    SparseBM25,
    top_k,
)
from machinery.data import DEMO_CORPUS, load_corpus
from machinery.index_cache import index_cache_file, load_index, save_index
from machinery.remote import (  # noqa: F401 (BadAnswer, check_hits: public here too)
    CLIENT_TIMEOUT, BadAnswer, RemoteRetriever, check_hits, check_request)

# engine="auto" picks the sparse engine above this many passages (rank-bm25: ~0.1 s/query at 1e4)
SPARSE_ABOVE = 20_000
# sparse indexes
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llds-grpo" / "bm25"
# from_jsonl caches the sparse index of a corpus above this many passages (a smaller one: < 1 s)
CACHE_ABOVE = 1_000

# --------------------------------------------------------------------------------------------------
# Search in this process: BM25 over a corpus held in memory


class BM25Retriever:
    """Exact BM25 top-k over an in-memory corpus: Lucene's scoring with its English analyzer
    (pyserini's, the default), or rank-bm25's Okapi with \\w+ words, by rank_bm25.BM25Okapi or
    bm25.SparseBM25."""

    def __init__(self, corpus: list[dict], k1: float = 0.9, b: float = 0.4, engine: str = "auto",
                 index=None,
                 bm25: str = "lucene", analyzer: str | None = None):
        """corpus: [D] rows {"id", "contents"} as data.load_corpus returns. k1, b: BM25
        term-saturation and length-norm constants (Anserini defaults). bm25: the scoring
        (`BM25_VARIANTS`): "lucene" (Lucene's BM25Similarity) or "okapi" (rank-bm25's BM25Okapi),
        see SparseBM25. analyzer: text -> words (`ANALYZERS`); None: the variant's own
        (`DEFAULT_ANALYZER`: "english" for lucene, "words" for okapi). engine: "rank_bm25"
        (rank-bm25 itself, okapi only), "sparse" (okapi: the same scores; lucene: the only engine)
        or "auto" (lucene: sparse; okapi: sparse above SPARSE_ABOVE passages). index: a prebuilt
        SparseBM25 of this corpus, variant and analyzer (from the cache). Raises ValueError on an
        empty corpus, one without a single word (after the analyzer), an unknown variant, analyzer
        or engine, or engine "rank_bm25" with bm25 "lucene"."""
        if bm25 not in BM25_VARIANTS:
            raise ValueError(f"--bm25 must be one of {', '.join(BM25_VARIANTS)}; got {bm25!r}")
        analyzer = DEFAULT_ANALYZER[bm25] if analyzer is None else analyzer
        if analyzer not in ANALYZERS:
            raise ValueError(f"analyzer must be one of {', '.join(ANALYZERS)}; got {analyzer!r}")
        if engine not in ("auto", "rank_bm25", "sparse"):
            raise ValueError(f"engine must be 'auto', 'rank_bm25' or 'sparse', got {engine!r}")
        if engine == "rank_bm25" and bm25 != "okapi":
            raise ValueError(f"engine 'rank_bm25' scores only --bm25 okapi (rank-bm25 has no "
                             f"Lucene BM25); use engine "
                             f"'sparse' or 'auto' for --bm25 {bm25}")
        if not corpus:
            raise ValueError("corpus is empty: need at least one passage")
        self.analyze = ANALYZERS[analyzer]  # text -> [words]
        # stops at the first passage with a word
        if not any(self.analyze(row["contents"]) for row in corpus):
            raise ValueError(f"corpus has no word tokens ({analyzer} analyzer): every passage is "
                             f"empty or punctuation"
                             + (" or stop words" if analyzer == "english" else ""))
        self.corpus, self.variant, self.analyzer = corpus, bm25, analyzer
        self.engine = engine if engine != "auto" else \
            "sparse" if bm25 != "okapi" or len(corpus) > SPARSE_ABOVE else "rank_bm25"
        if index is None:
            docs = tqdm(corpus, desc="tokenize", unit="doc", disable=len(corpus) <= 50_000)
            # [D] lists of words, made one at a time
            tokenized = (self.analyze(row["contents"]) for row in docs)
            if self.engine == "sparse":
                index = SparseBM25.build(tokenized, k1=k1, b=b, variant=bm25)
            else:
                # rank-bm25's default epsilon=0.25 floors negative idfs
                index = BM25Okapi(tokenized, k1=k1, b=b)
        self.bm25 = index  # either engine: .get_scores(words) -> [D]
        best = (
            index.values.max()
            if isinstance(index, SparseBM25)
            else max(index.idf.values(), default=0.0)
        )
        # NOTE(P36): only scores > 0 are hits, so none ever is
        if bm25 == "okapi" and not best > 0:
            print(f"warning: --bm25 okapi finds no passage in this {len(corpus)}-passage corpus: "
                  f"rank-bm25's idf "
                  "ln((N - df + 0.5) / (df + 0.5)) is <= 0 for every word (each is in half the "
                  "passages or more); "
                  "--bm25 lucene's is > 0", file=sys.stderr, flush=True)

    @classmethod
    def from_jsonl(cls, path, k1: float = 0.9, b: float = 0.4, engine: str = "auto",
                   cache_dir=CACHE_DIR,
                   bm25: str = "lucene", analyzer: str | None = None) -> "BM25Retriever":
        """Build the index from a jsonl corpus file (errors as data.load_corpus and __init__). The
        sparse index of a corpus of more than CACHE_ABOVE passages is read from, or written to,
        `cache_dir` (None: no cache), so the second run over the corpus skips indexing
        (`index_cache_file`: one file per corpus, variant and analyzer). A cache folder that cannot
        be written (read-only, full) costs one warning line on stderr, and the run goes on."""
        corpus = load_corpus(path)
        # checked before the cache key is made (the first check of __init__)
        if bm25 not in BM25_VARIANTS:
            return cls(corpus, k1=k1, b=b, engine=engine, bm25=bm25, analyzer=analyzer)
        analyzer = DEFAULT_ANALYZER[bm25] if analyzer is None else analyzer
        sparse = engine == "sparse" or (
            engine == "auto" and (bm25 != "okapi" or len(corpus) > SPARSE_ABOVE)
        )
        if (
            cache_dir is None
            or not sparse
            or len(corpus) <= CACHE_ABOVE
            or analyzer not in ANALYZERS
        ):
            return cls(corpus, k1=k1, b=b, engine=engine, bm25=bm25, analyzer=analyzer)
        file = index_cache_file(path, k1, b, cache_dir, bm25, analyzer)
        try:
            index = load_index(file) if file.is_file() else None
        # a damaged file (killed writer, full disk, copy): rebuild it
        except (OSError, ValueError) as err:
            print(f"warning: rebuilding the unreadable BM25 index cache: {err}", file=sys.stderr)
            index = None
        if index is not None and index.num_docs == len(corpus) and index.variant == bm25:
            return cls(corpus, k1=k1, b=b, engine="sparse", index=index, bm25=bm25,
                       analyzer=analyzer)
        retriever = cls(corpus, k1=k1, b=b, engine="sparse", bm25=bm25, analyzer=analyzer)
        # the cache is optional: a read-only or full cache folder costs the next run the indexing,
        # nothing more
        try:
            # this corpus and variant's stale ones
            for old in file.parent.glob(file.name.rsplit("-", 1)[0] + "-*.npz"):
                old.unlink(missing_ok=True)
            save_index(retriever.bm25, file)
        except OSError as err:
            print(f"warning: BM25 index cache not written to {file.parent} "
                  f"({err.strerror or err}); going on without "
                  "it (the next run indexes this corpus again)", file=sys.stderr)
        return retriever

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        """For each query, its best <= topk passages as [{"document": {"id", "contents"}, "score":
        float}, ...].

        Matches the `/retrieve` response of Search-R1's retrieval_server.py (one list per query,
        best first), except P36-P38: only passages with score > 0 (i.e. containing a query
        word) are returned, ties keep passage order, and an empty/whitespace/unknown-word query
        gives []. Raises ValueError if topk < 1, TypeError if `queries` is a single string.
        """
        check_request(queries, topk)
        words = [self.analyze(query) for query in queries]  # [Q] word lists
        # NOTE(P36): no word (empty, whitespace, stop words) -> no hits
        live = [w for w in words if w]
        # a turn's queries in one call, each from its posting lists
        if isinstance(self.bm25, SparseBM25):
            tops = iter(self.bm25.top_many(live, topk))
        else:  # rank-bm25: one [D] score vector per query, as Search-R1's BM25 _batch_search loops
            tops = ((order, scores[order]) for scores in map(self.bm25.get_scores, live)
                    # [<=topk] best first; NOTE(P36): score > 0
                    for order in [top_k(scores, topk)])
        # NOTE(P23): doc and score travel together, so they can never misalign or exceed
        # topk (P23).
        return [[self._hit(i, score) for i, score in zip(*next(tops))] if w else [] for w in words]

    def prepare(self, say=None):
        """Get the search ready now rather than in the first query: the sparse engine's compiled
        search (SparseBM25.prepare: numba's compile or its cache, once per process, under a lock;
        one line saying what it cost, to `say` or stderr). Nothing to do for rank-bm25 or the numpy
        path."""
        if isinstance(self.bm25, SparseBM25):
            self.bm25.prepare(say)

    def _hit(self, i: int, score: float) -> dict:
        row = self.corpus[i]
        return {"document": {"id": row["id"], "contents": row["contents"]}, "score": float(score)}

    def __str__(self):
        return (f"{len(self.corpus)} passages (BM25 {self.variant}, {self.analyzer} analyzer, "
                f"{self.engine} engine)")


def make_retriever(corpus, url: str = "", engine: str = "auto", cache_dir=CACHE_DIR,
                   timeout: float = CLIENT_TIMEOUT,
                   bm25: str = "lucene"):
    """The retriever train.py and evaluate.py use: a RemoteRetriever when `url` is set (checked with
    one query, so a server that is down fails before the model loads), else an in-process
    BM25Retriever over the jsonl `corpus`, scored by `bm25` (--bm25: "lucene" or "okapi", each with
    its own analyzer; a server's is set where it starts). timeout: the RemoteRetriever's seconds per
    try (--retriever-timeout; unused without `url`). The in-process one is prepared
    (`BM25Retriever.prepare`), so a run's first search does not pay numba's compile. Raises as
    BM25Retriever.from_jsonl, or ConnectionError / ValueError as RemoteRetriever."""
    if not url:
        retriever = BM25Retriever.from_jsonl(corpus, engine=engine, cache_dir=cache_dir, bm25=bm25)
        retriever.prepare()
        return retriever
    retriever = RemoteRetriever(url, timeout=timeout)
    retriever.search(["test"], 1)
    return retriever


# --------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    # what the model sees of the hits (imported here: a server needs no torch)
    from rollout import format_passages

    parser = argparse.ArgumentParser(description="BM25 search over a jsonl corpus; no arguments "
                                     "runs a toy demo.",
                                     epilog="To serve a corpus over HTTP (Search-R1's POST "
                                     "/retrieve, for train.py and "
                                     "evaluate.py --retriever-url): python "
                                     "scripts/retrieval_server.py --corpus CORPUS "
                                     "--port 8000")
    parser.add_argument("queries", nargs="*", help="one or more query strings (needs --corpus)")
    parser.add_argument("--corpus", help="jsonl corpus with {'id', 'contents'} rows")
    parser.add_argument("--topk", type=int, default=3,
                        help="passages per query (Search-R1 default 3)")
    parser.add_argument("--k1", type=float, default=0.9, help="BM25 k1 (Anserini default)")
    parser.add_argument("--b", type=float, default=0.4, help="BM25 b (Anserini default)")
    parser.add_argument("--bm25", default=BM25_VARIANTS[0], choices=BM25_VARIANTS,
                        help="scoring: lucene (Lucene's "
                        "BM25 and English analyzer, as pyserini) or okapi (rank-bm25's BM25Okapi, "
                        "\\w+ words)")
    parser.add_argument("--engine", default="auto", choices=["auto", "rank_bm25", "sparse"],
                        help="BM25 engine (rank_bm25: --bm25 okapi only)")
    args = parser.parse_args()
    if args.corpus is None and args.queries:
        parser.error("queries need --corpus PATH (run with no arguments for the toy demo)")
    if args.corpus is not None and not args.queries:
        parser.error("--corpus given but no query: add one or more query strings")

    if args.corpus is None:  # toy demo: 5 passages, expected output in the comments
        try:
            retriever = BM25Retriever(DEMO_CORPUS, k1=args.k1, b=args.b, engine=args.engine,
                                      bm25=args.bm25)
        # --engine rank_bm25 with --bm25 lucene: one clear line, no traceback
        except ValueError as err:
            raise SystemExit(f"error: {err}") from None
        print(retriever.analyze("capital of France"))
        # ['capit', 'franc']   lucene: "of" is a stop word, the rest Porter stems
        #                      (okapi: ['capital', 'of', 'france'])
        for hit in retriever.search(["capital of France"], topk=3)[0]:
            print(hit["document"]["id"], round(hit["score"], 4))
        # 0 0.9449   "Paris": capit + franc (each in 2 of 5 passages: idf ln(1 + 3.5/2.5) = 0.8755)
        # 1 0.4724   "Berlin": capit
        # 2 0.4357   "Eiffel Tower": franc, in a longer passage
        #            ("Rhine" and "Apple" match nothing: never shown)
        # (okapi: 1.0247, 0.6832, 0.3251: "of" counts there, idf ln(3.5/2.5) = 0.3365 per word)
        print(format_passages(retriever.search(["Rhine"], topk=3)[0]), end="")
        # Doc 1(Title: "Rhine") The Rhine flows through Germany and the Netherlands.
        print(retriever.search(["zebra", "   "]))
        # [[], []]   unknown word and whitespace query: no hits (P36)
    else:
        t0 = time.perf_counter()
        try:
            retriever = BM25Retriever.from_jsonl(args.corpus, k1=args.k1, b=args.b,
                                                 engine=args.engine,
                                             bm25=args.bm25)
        except (FileNotFoundError, ValueError) as err:  # bad input: one clear line, no traceback
            raise SystemExit(f"error: {err}") from None
        print(f"index: {retriever} in {time.perf_counter() - t0:.2f}s")
        # numba's compile (or its cache), where it is used, apart from the first query's time
        retriever.prepare()
        for query in args.queries:
            t0 = time.perf_counter()
            hits = retriever.search([query], topk=args.topk)[0]
            print(f"\nquery: {query!r}  ({len(hits)} hits, {1000 * (time.perf_counter() - t0):.1f} "
                  f"ms)")
            for rank, hit in enumerate(hits, start=1):
                print(f"  {rank}. id={hit['document']['id']} score={hit['score']:.4f}")
            print(format_passages(hits) if hits else "(no passage contains a query word)", end="")
