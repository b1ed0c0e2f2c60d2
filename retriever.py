"""
BM25 retrieval over a wiki-style passage corpus: the search engine behind the agent's <search> calls.

What it matches in Search-R1:
  * `search_r1/search/retrieval_server.py` (BM25 path): one ranked list per query, best first, at most `topk`
    passages, each returned as {"document": corpus row, "score": float}, the `/retrieve` response shape with
    `return_scores=true`. The corpus is jsonl rows {"id": str, "contents": '"Title"\\ntext'}.
  * `search_r1/llm_agent/generation.py` `_passages2string`: the hits of one query become one observation string,
    one line per passage, "Doc {i}(Title: {first line}) {other lines}" (no space before "(Title:"); see
    `format_passages`.

Departures from Search-R1 (numbered; NOTE(departure) marks the lines):
  1. Scoring is rank-bm25's BM25Okapi (ATIRE idf ln((N-n+0.5)/(n+0.5)), negative idfs floored at 0.25 * mean idf) with
     lower-cased \\w+ tokens, instead of pyserini/Lucene (Porter stemming, stop words, idf ln(1 + ...)). Same k1=0.9,
     b=0.4 as Anserini's defaults, but scores and rankings are not Lucene's. Repeated query words count repeatedly.
  2. (PITFALLS P23) results and scores are always aligned and len <= topk: each hit carries its own score. Search-R1's
     BM25 path reads the scores before cutting the hit list to `num`, so the two lists can differ in length, and its
     server crashes on `return_scores=false`.
  3. Only hits with score > 0 are returned, so passages with no query word never are (nor, in a toy corpus whose mean
     idf is <= 0, passages matching only floored words): a query of unknown words, an empty or a whitespace-only query
     gives [], and a query matching fewer than `topk` passages gives fewer hits, silently (Search-R1 warns "Not enough
     documents retrieved!"). topk < 1 is an error, not an empty list.
  4. In-process and exact: every query scores every passage (fine for ~1e4-1e5 passages, far too slow for the 21M
     passages of wiki-18, which need a real inverted index). Ties are broken by passage order.

Shapes: D = passages in the corpus; `scores` is [D] per query.

Run:
  python retriever.py                                                  # demo on a built-in 5-passage corpus
  python retriever.py --corpus ../shared/data/corpus.jsonl "who founded X" ["another query" ...] [--topk 3]
"""

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np
from rank_bm25 import BM25Okapi
from tqdm import tqdm

# -----------------------------------------------------------------------------

# A 5-passage corpus for the demos (`python retriever.py`, `python rollout.py`).
DEMO_CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital of France.'},
    {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "2", "contents": '"Eiffel Tower"\nThe Eiffel Tower is in Paris, France.'},
    {"id": "3", "contents": '"Rhine"\nThe Rhine flows through Germany and the Netherlands.'},
    {"id": "4", "contents": '"Apple"\nAn apple is a fruit.'},
]


def tokenize(text: str) -> list[str]:
    """Lower-cased \\w+ words, no stemming and no stop words: "Who founded X-Men?" -> ["who", "founded", "x", "men"]."""
    return re.findall(r"\w+", text.lower())


def load_corpus(path) -> list[dict]:
    """Read a jsonl corpus into [D] rows {"id": str, "contents": str}; other keys are dropped, blank lines skipped.

    Format as Search-R1's `load_corpus` reads it (wiki-18 / FlashRAG style). Raises FileNotFoundError if `path` does not
    exist, and ValueError "<path>:<lineno>: ..." for a line that is not a JSON object or lacks a string 'contents' or an
    'id', and for a file with no passages.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {e}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            if not isinstance(row.get("contents"), str):
                raise ValueError(f"{path}:{lineno}: missing field 'contents' (a string)")
            if row.get("id") is None:
                raise ValueError(f"{path}:{lineno}: missing field 'id'")
            rows.append({"id": str(row["id"]), "contents": row["contents"]})
    if not rows:
        raise ValueError(f"{path}: no passages (empty corpus)")
    return rows


def format_passages(hits: list[dict]) -> str:
    """One query's hits -> the observation text, as Search-R1's `_passages2string` (generation.py) builds it.

    Each hit's contents '"Title"\\ntext' gives the line f"Doc {i+1}(Title: {title}) {text}\\n", where title is the first
    line (quotes kept) and text the remaining lines joined by "\\n". No hits -> "".
    """
    out = ""
    for i, hit in enumerate(hits):
        lines = hit["document"]["contents"].split("\n")
        title, text = lines[0], "\n".join(lines[1:])
        out += f"Doc {i + 1}(Title: {title}) {text}\n"
    return out


class BM25Retriever:
    """Exact BM25 top-k over an in-memory corpus (a thin wrapper around rank_bm25.BM25Okapi; departure 1)."""

    def __init__(self, corpus: list[dict], k1: float = 0.9, b: float = 0.4):
        """corpus: [D] rows {"id", "contents"} as `load_corpus` returns. k1, b: BM25 term-saturation and length-norm
        constants (Anserini defaults). Raises ValueError on an empty corpus or one without a single word token."""
        if not corpus:
            raise ValueError("corpus is empty: need at least one passage")
        docs = tqdm(corpus, desc="tokenize", unit="doc", disable=len(corpus) <= 50_000)
        tokenized = [tokenize(row["contents"]) for row in docs]  # [D] lists of words
        if not any(tokenized):
            raise ValueError("corpus has no word tokens: every passage is empty or punctuation")
        self.corpus = corpus
        self.bm25 = BM25Okapi(tokenized, k1=k1, b=b)  # rank-bm25's default epsilon=0.25 floors negative idfs

    @classmethod
    def from_jsonl(cls, path, k1: float = 0.9, b: float = 0.4) -> "BM25Retriever":
        """Build the index from a jsonl corpus file (errors as `load_corpus`)."""
        return cls(load_corpus(path), k1=k1, b=b)

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        """For each query, its best <= topk passages as [{"document": {"id", "contents"}, "score": float}, ...].

        Matches the `/retrieve` response of Search-R1's retrieval_server.py (one list per query, best first), except
        departures 2-4: only passages with score > 0 (i.e. containing a query word) are returned, ties keep passage
        order, and an empty/whitespace/unknown-word query gives []. Raises ValueError if topk < 1, TypeError if
        `queries` is a single string.
        """
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings, got one str; pass [query]")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        results = []
        for query in queries:  # one at a time, as Search-R1's BM25 _batch_search loops
            words = tokenize(query)
            if not words:
                results.append([])  # NOTE(departure 3): empty or whitespace query -> no hits
                continue
            scores = self.bm25.get_scores(words)  # [D]
            order = np.argsort(-scores, kind="stable")[:topk]  # [<=topk] best first, ties by passage order
            # NOTE(departure 2, P23): doc and score travel together, so they can never misalign or exceed topk.
            results.append([self._hit(i, scores[i]) for i in order if scores[i] > 0])  # NOTE(departure 3)
        return results

    def _hit(self, i: int, score: float) -> dict:
        row = self.corpus[i]
        return {"document": {"id": row["id"], "contents": row["contents"]}, "score": float(score)}

    def __call__(self, queries: list[str], topk: int = 3) -> list[str]:
        """Queries -> one observation string per query (`format_passages` of its hits; "" when nothing matched)."""
        return [format_passages(hits) for hits in self.search(queries, topk)]


# -----------------------------------------------------------------------------

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="BM25 search over a jsonl corpus; no arguments runs a toy demo.")
    parser.add_argument("queries", nargs="*", help="one or more query strings (needs --corpus)")
    parser.add_argument("--corpus", help="jsonl corpus with {'id', 'contents'} rows")
    parser.add_argument("--topk", type=int, default=3, help="passages per query (Search-R1 default 3)")
    parser.add_argument("--k1", type=float, default=0.9, help="BM25 k1 (Anserini default)")
    parser.add_argument("--b", type=float, default=0.4, help="BM25 b (Anserini default)")
    args = parser.parse_args()
    if args.corpus is None and args.queries:
        parser.error("queries need --corpus PATH (run with no arguments for the toy demo)")
    if args.corpus is not None and not args.queries:
        parser.error("--corpus given but no query: add one or more query strings")

    if args.corpus is None:  # toy demo: 5 passages, expected output in the comments
        retriever = BM25Retriever(DEMO_CORPUS)
        for hit in retriever.search(["capital of France"], topk=3)[0]:
            print(hit["document"]["id"], round(hit["score"], 4))
        # 0 1.0247   "Paris": capital + of + france (each word is in 2 of 5 passages: idf ln(3.5/2.5) = 0.3365)
        # 1 0.6832   "Berlin": capital + of
        # 2 0.3251   "Eiffel Tower": france only ("Rhine" and "Apple" match nothing, so they never appear)
        print(retriever(["Rhine"], topk=3)[0], end="")
        # Doc 1(Title: "Rhine") The Rhine flows through Germany and the Netherlands.
        print(retriever.search(["zebra", "   "]))
        # [[], []]   unknown word and whitespace query: no hits (departure 3)
    else:
        t0 = time.perf_counter()
        try:
            retriever = BM25Retriever.from_jsonl(args.corpus, k1=args.k1, b=args.b)
        except (FileNotFoundError, ValueError) as err:  # bad input: one clear line, no traceback
            raise SystemExit(f"error: {err}") from None
        print(f"index: {len(retriever.corpus)} passages in {time.perf_counter() - t0:.2f}s")
        for query in args.queries:
            t0 = time.perf_counter()
            hits = retriever.search([query], topk=args.topk)[0]
            print(f"\nquery: {query!r}  ({len(hits)} hits, {1000 * (time.perf_counter() - t0):.1f} ms)")
            for rank, hit in enumerate(hits, start=1):
                print(f"  {rank}. id={hit['document']['id']} score={hit['score']:.4f}")
            print(format_passages(hits) if hits else "(no passage contains a query word)", end="")
