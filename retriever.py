"""
BM25 retrieval over a wiki-style passage corpus: the search engine behind the agent's <search> calls.

What it matches in Search-R1:
  * `search_r1/search/retrieval_server.py` (BM25 path): one ranked list per query, best first, at most `topk`
    passages, each returned as {"document": corpus row, "score": float}, the `/retrieve` response shape with
    `return_scores=true`. The corpus is jsonl rows {"id": str, "contents": '"Title"\\ntext'}.
  * its HTTP API, served by `python retriever.py serve` and spoken by `RemoteRetriever`: POST /retrieve
    {"queries": [str], "topk": int, "return_scores": bool} -> {"result": [[{"document", "score"}, ...], ...]}, or
    {"result": [[document, ...], ...]} when return_scores is false. So train.py --retriever-url can also point at
    Search-R1's own e5/faiss or pyserini server (wiki-18, 21M passages).
  * `search_r1/llm_agent/generation.py` `_passages2string`: the hits of one query become one observation string,
    one line per passage, "Doc {i}(Title: {first line}) {other lines}" (no space before "(Title:"); see
    `format_passages`.

Scoring (`--bm25`, SparseBM25 has the formulas):
  * "lucene" (default): what Search-R1's BM25 baseline runs, pyserini's LuceneSearcher over wiki-18 with Anserini's
    defaults: Lucene's BM25Similarity (idf ln(1 + (N - df + 0.5) / (df + 0.5)), k1=0.9, b=0.4, no (k1 + 1) factor, in
    float32) over Lucene's English analysis (UAX #29 words, possessive 's removed, lower-cased, 33 stop words, Porter
    stems; `english_analyze`), a repeated query word weighted by its count (Anserini's bag-of-words query). Matched:
    the float32 arithmetic step by step, the passage length as Lucene stores it, in one byte (SmallFloat: exact below
    40 tokens, 4 significant bits above; `lucene_doc_length`), N counting only passages with a word (Lucene's
    docCount), Java's letter-by-letter lower-casing, the 255-character word limit, ties by passage order (Lucene's doc
    id). Checked against Lucene 8.7 itself (tests/test_retriever.py, test_lucene_itself_*): on our QA bundle (13,823
    passages and 3,865 questions) our analyzer gives Lucene's words for all but 7 texts (20 of 886,928 words, the
    ♭ ♮ ♯ of departure 1); fed Lucene's words, our scoring gives Lucene's top-10 bitwise (ids and float32 scores) for
    every question; end to end, every question's top-3 ids are Lucene's, with scores off by a median 3e-6 (relative;
    those 20 words shift avgdl), up to 2% for the few passages that hold them. Not matched: departure 1.
  * "okapi": rank-bm25's BM25Okapi (ATIRE idf ln((N - df + 0.5) / (df + 0.5)), negative idfs floored at 0.25 * mean
    idf, (k1 + 1) factor) over lower-cased \\w+ words, bitwise rank-bm25's floats: this project's scoring up to issue
    12. On the bundle's 877 questions it finds fewer supporting passages in the top 3 (benchmarks/bench_retrieval.py).

Departures from Search-R1 (numbered; NOTE(departure) marks the lines):
  1. "lucene" splits words by the regex module's Unicode tables (UAX #29), Lucene by those its StandardTokenizer was
     generated from (older ones; pyserini's Lucene 9 has others again): alone between spaces, 30,115 of the 1,112,064
     code points are treated differently by Lucene 8.7, mostly letters encoded since and symbols reclassified since;
     in the QA bundle, only the music signs ♭ ♮ ♯ (Lucene 8.7 makes words of them, we drop them). Flag and keycap emoji
     sequences are not words here; words over 255 characters are cut by code points, not UTF-16 units. Java's Math.log
     may differ from C's log in the last bit of a float64, which the float32 idf then hides almost always. Ties are
     broken by passage order, Anserini's by the passage id string. "okapi" is not Lucene at all (no stemming, no stop
     words, another idf): the project's scoring before issue 12.
  2. (P23) results and scores are always aligned and len <= topk: each hit carries its own score. Search-R1's
     BM25 path reads the scores before cutting the hit list to `num`, so the two lists can differ in length, and its
     server crashes on `return_scores=false` (ours returns the documents).
  3. Only hits with score > 0 are returned, so passages with no query word never are (nor, with okapi in a toy corpus
     whose mean idf is <= 0, passages matching only floored words): a query of unknown words, an empty, a
     whitespace-only or (lucene) a stop-word-only query gives [], and a query matching fewer than `topk` passages gives
     fewer hits, silently (Search-R1 warns "Not enough documents retrieved!"). topk < 1 is an error, not an empty
     list. Ties are broken by passage order.
  4. In-process and exact. okapi has two engines giving bitwise the same scores: "rank_bm25" (the reference, default
     up to SPARSE_ABOVE passages) scores every passage word by word; "sparse" (`SparseBM25`, default above) adds up
     only the posting lists of the query's words in a term-document matrix, >100x faster from 1e4 passages. lucene
     always runs on "sparse" (rank-bm25 has no Lucene BM25). The sparse index is cached on disk, per corpus file,
     variant and analyzer. wiki-18 (21M passages) still calls for Search-R1's own server.

Shapes: D = passages in the corpus, V = distinct words, nnz = (word, passage) pairs; `scores` is [D] per query.

Run (CORPUS.jsonl: your corpus, rows as above):
  python retriever.py                                                  # demo on a built-in 5-passage corpus
  python retriever.py --corpus CORPUS.jsonl "who founded X" ["another query" ...] [--topk 3] [--bm25 okapi]
  python retriever.py serve --corpus CORPUS.jsonl --port 8000 [--bm25 okapi]  # Search-R1's /retrieve API
  python train.py --retriever-url http://127.0.0.1:8000/retrieve ...   # train against that server
"""

import argparse
import codecs
import functools
import hashlib
import http.client
import importlib.metadata
import json
import math
import os
import pickle
import re
import sys
import time
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from array import array
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import regex
from rank_bm25 import BM25Okapi
from tqdm import tqdm

# -----------------------------------------------------------------------------

SPARSE_ABOVE = 20_000  # engine="auto" picks the sparse engine above this many passages (rank-bm25: ~0.1 s/query at 1e4)
BM25_VARIANTS = ("lucene", "okapi")  # --bm25 choices, the default first (SparseBM25 says what each computes)
DEFAULT_ANALYZER = {"lucene": "english", "okapi": "words"}  # each variant's analyzer (ANALYZERS, below)
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llds-grpo" / "bm25"  # sparse indexes
CACHE_ABOVE = 1_000  # from_jsonl caches the sparse indexes of corpora above this many passages (smaller: built in < 1 s)
INDEX_VERSION = 2  # part of the cache key: bump it when SparseBM25's arrays change meaning
# `serve`: the listen() backlog, i.e. connections the kernel queues until a server thread accepts them. Python's
# socketserver default of 5 overflows under a burst (1,000 concurrent requests: 65-90% of them reset or dropped, issue
# 11); 1,024 gave no error. Linux silently caps it at net.core.somaxconn (4,096 since kernel 5.4).
LISTEN_BACKLOG = 1024
SERVER_TIMEOUT = 30.0  # `serve`: seconds a connection may stall (no byte sent or taken) before its thread drops it
MAX_REQUEST_BYTES = 64 << 20  # `serve`: largest request body (Content-Length) accepted
CLIENT_TIMEOUT = 30.0  # RemoteRetriever: seconds a server may stay silent before a try counts as failed

# A 5-passage corpus for the demos (`python retriever.py`, `python rollout.py`).
DEMO_CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital of France.'},
    {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "2", "contents": '"Eiffel Tower"\nThe Eiffel Tower is in Paris, France.'},
    {"id": "3", "contents": '"Rhine"\nThe Rhine flows through Germany and the Netherlands.'},
    {"id": "4", "contents": '"Apple"\nAn apple is a fruit.'},
]


def tokenize(text: str) -> list[str]:
    """The "words" analyzer: lower-cased \\w+ words, no stemming, no stop words (rank-bm25 users' usual split, our
    `--bm25 okapi`): "Who founded X-Men's?" -> ["who", "founded", "x", "men", "s"]."""
    return re.findall(r"\w+", text.lower())


# --- Lucene's English analyzer (`--bm25 lucene`), as pyserini indexes and searches wiki-18 ----------------------------
# Anserini's DefaultEnglishAnalyzer (pyserini's default), the same chain as Lucene's EnglishAnalyzer: StandardTokenizer
# -> EnglishPossessiveFilter -> LowerCaseFilter -> StopFilter(English stop words) -> PorterStemFilter.

# StandardTokenizer: the words of Unicode's default word segmentation (UAX #29), as the `regex` module draws its word
# boundaries (WORD flag), plus runs of Thai/Lao/Khmer/Myanmar letters (UAX #29 leaves those to a dictionary; Lucene
# keeps each run whole). A segment is a token when it holds a letter, a digit, a kana/ideograph or a pictograph;
# spaces and punctuation are dropped. So "O'Neil's U.S. 3.14 e-mail" -> ["O'Neil's", "U.S", "3.14", "e", "mail"].
# NOTE(departure 1): the regex module's Unicode tables, not those Lucene's tokenizer was generated from.
_SEGMENT = regex.compile(r"\p{Line_Break=Complex_Context}+|\b.+?\b", flags=regex.WORD | regex.V1 | regex.DOTALL)
_TOKEN_CHAR = regex.compile(r"[\p{Word_Break=ALetter}\p{Word_Break=Hebrew_Letter}\p{Word_Break=Numeric}"
                            r"\p{Word_Break=Katakana}\p{Script=Han}\p{Script=Hiragana}\p{Extended_Pictographic}"
                            r"\p{Line_Break=Complex_Context}]")
MAX_TOKEN_CHARS = 255  # StandardTokenizer's default maxTokenLength: a longer word is cut into 255-character pieces
# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (Anserini's default stop words), 33 words.
LUCENE_STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their "
                              "then there these they this to was will with".split())
_POSSESSIVE = regex.compile(r"['\u2019\uFF07][sS]$")  # EnglishPossessiveFilter: a trailing 's, ’s or ＇s


def standard_tokenize(text: str) -> list[str]:
    """Lucene's StandardTokenizer (UAX #29 words, original case): "Paris's 1,000 U.S. e-mail" -> ["Paris's", "1,000",
    "U.S", "e", "mail"]. Words longer than MAX_TOKEN_CHARS characters are cut into pieces of that length."""
    out = []
    for seg in _SEGMENT.findall(text):
        if _TOKEN_CHAR.search(seg):
            out.extend(seg[i:i + MAX_TOKEN_CHARS] for i in range(0, len(seg), MAX_TOKEN_CHARS))
    return out


def java_lower(word: str) -> str:
    """Lower-case as Lucene's LowerCaseFilter does, one code point at a time (Java's Character.toLowerCase): unlike
    str.lower(), "İ" -> "i" (not "i" + a combining dot) and a final "Σ" -> "σ" (not "ς")."""
    low = word.lower()
    if len(low) != len(word) or "ς" in low:  # the rare words where the two differ: redo them letter by letter
        low = "".join(c.lower()[0] for c in word)
    return low


@functools.cache
def _porter_stem():
    """Porter's stemmer as Lucene's PorterStemmer has it: NLTK's MARTIN_EXTENSIONS mode, i.e. Martin Porter's own
    reference implementation ("bli" -> "ble", "logi" -> "log", words of 1-2 letters kept), not the published algorithm
    that snowballstemmer's "porter" follows (101 of the 71,690 words of our QA bundle would stem differently).
    Imported on first use (importing nltk takes ~0.4 s)."""
    from nltk.stem.porter import PorterStemmer

    return functools.partial(PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS).stem, to_lowercase=False)


@functools.lru_cache(maxsize=1 << 20)  # each distinct word is analyzed once: a dict look-up per token after that
def _english_word(word: str) -> str | None:
    """One StandardTokenizer word through the English filters: None for a stop word, else its stem."""
    word = java_lower(_POSSESSIVE.sub("", word))  # EnglishPossessiveFilter, then LowerCaseFilter
    return None if word in LUCENE_STOP_WORDS else _porter_stem()(word)


def english_analyze(text: str) -> list[str]:
    """The "english" analyzer: pyserini's analysis of wiki-18, i.e. Anserini's DefaultEnglishAnalyzer = Lucene's
    EnglishAnalyzer. `standard_tokenize`, then drop a trailing possessive 's, lower-case (`java_lower`), drop
    LUCENE_STOP_WORDS, Porter-stem (`_porter_stem`): "Who founded the X-Men's comics?" -> ["who", "found", "x", "men",
    "comic"]. A text of stop words and punctuation gives []."""
    return [w for w in map(_english_word, standard_tokenize(text)) if w is not None]


ANALYZERS = {"english": english_analyze, "words": tokenize}  # analyzer name -> text -> [words]


def read_jsonl(path, name=None):
    """Yield (line number, JSON value) for each non-blank line of a UTF-8 jsonl file; `name` (default: path) labels
    errors. Lines end at "\n" only (a U+2028 inside a JSON string is text, not a line break).

    A UTF-8 byte-order mark at the very start of the file is skipped (utf-8-sig: Windows editors write one); at the
    start of any other line it is an error naming the line (Python's json rejects it too; there it usually means files
    were concatenated). Raises ValueError "<name>:<lineno>: not UTF-8 (byte 0xff at column 12)" (column: 1-based
    character position), "<name>:<lineno>: a UTF-8 byte-order mark (BOM) starts this line ..." or "<name>:<lineno>: not
    valid JSON: ...". The file is read line by line (wiki-18's 14 GB never sit in memory as text).
    """
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            elif raw.startswith(codecs.BOM_UTF8):
                raise ValueError(f"{name or path}:{lineno}: a UTF-8 byte-order mark (BOM) starts this line; only the "
                                 "file's first line may have one (were files concatenated?)")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:  # everything before e.start decoded, so the column is exact
                column = len(raw[:e.start].decode("utf-8")) + 1
                raise ValueError(f"{name or path}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {column})"
                                 ) from None
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{name or path}:{lineno}: not valid JSON: {e}") from None
            yield lineno, value


def load_corpus(path) -> list[dict]:
    """Read a jsonl corpus into [D] rows {"id": str, "contents": str}; other keys are dropped, blank lines skipped.

    Format as Search-R1's `load_corpus` reads it (wiki-18 / FlashRAG style), UTF-8 with an optional BOM at the start
    (`read_jsonl`). Raises FileNotFoundError if `path` does not exist, and ValueError "<path>:<lineno>: ..." for a line
    that is not UTF-8 or not a JSON object or lacks a string 'contents' or an 'id', and for a file with no passages.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    rows = []
    for lineno, row in read_jsonl(path):
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


def passage_title(hit: dict) -> str:
    """A hit's title: the first line of its contents, as `format_passages` shows it, without its outer quotes."""
    title = hit["document"]["contents"].split("\n", 1)[0]
    return title[1:-1] if len(title) >= 2 and title[0] == title[-1] == '"' else title


# -----------------------------------------------------------------------------
# The sparse engine: rank-bm25's or Lucene's scores from posting lists, and its on-disk cache


def lucene_doc_length(n: int) -> int:
    """The passage length (tokens) Lucene's BM25 sees: the length is stored in one byte per passage (SmallFloat's
    intToByte4, decoded by byte4ToInt), exact below 40, then n - 24 rounded down to 4 significant bits: 41 -> 40,
    100 -> 96, 1000 -> 984."""
    if n < 24:  # SmallFloat's 24 "free values": small lengths are stored as they are
        return n
    x = n - 24
    shift = max(x.bit_length() - 4, 0)  # keep the 4 most significant bits of n - 24
    return 24 + (x >> shift << shift)


class SparseBM25:
    """Exact BM25 from a sparse term-document matrix [V, D] stored by term (CSR): the postings of word t are passages
    docs[indptr[t]:indptr[t+1]] (ascending), each with one float `values[i]`. A query adds up only the posting lists
    of its words. Two variants:

    "okapi": bitwise rank_bm25.BM25Okapi. values [nnz] float64 are the impacts
        idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))     (tf: count of t in the passage, dl: length)
    each computed by the same float64 operations, in the same order, as BM25Okapi.get_scores. A query's scores are
    summed word by word in query order (a repeated word counts again), again as rank-bm25 does, so every score is the
    identical float; a passage without the word gets nothing added, where rank-bm25 adds an exact 0.0.

    "lucene": Lucene's BM25Similarity (8.x to 10.x; pyserini's scoring), in float32 as Lucene computes it:
        idf(t) = log(1 + (N - df + 0.5) / (df + 0.5))           N: passages with >= 1 token, df: passages holding t
        score(t, passage) = w - w / (1 + tf * inv(dl)),  w = count of t in the query * idf(t)
        inv(dl) = 1 / (k1 * ((1 - b) + b * L(dl) / avgdl))    L: `lucene_doc_length`, avgdl: tokens / N
    i.e. w * tf / (tf + k1 * (1 - b + b * L / avgdl)): Lucene 8 dropped rank-bm25's (k1 + 1) factor, a constant
    that changes no ranking; we drop it too, so scores are pyserini's. values [nnz] float32 are tf * inv(dl), idf [V]
    float32. A word repeated in the query is one term weighted by its count (Anserini's bag-of-words query); the
    words' float32 scores are summed in float64 (exact for any realistic spread of magnitudes, so their order does
    not matter) and the sum rounded to float32 once, as Lucene's disjunction scorers do.
    """

    def __init__(self, vocab: dict, indptr: np.ndarray, docs: np.ndarray, values: np.ndarray, num_docs: int,
                 variant: str = "okapi", idf: np.ndarray | None = None):
        self.vocab = vocab  # word -> term id t
        self.indptr, self.docs, self.values = indptr, docs, values  # [V+1] int64, [nnz] int32, [nnz] float64/32
        self.num_docs = num_docs  # D
        self.variant = variant  # "okapi" or "lucene"
        self.idf = idf  # [V] float32 for "lucene"; None for "okapi" (the idf is inside its values)

    @classmethod
    def build(cls, tokenized, k1: float = 0.9, b: float = 0.4, epsilon: float = 0.25,
              variant: str = "okapi") -> "SparseBM25":
        """Index an iterable of [D] word lists (consumed once). Needs at least one word in the corpus. epsilon: the
        okapi idf floor (rank-bm25's default); Lucene's idf is always > 0 and has none."""
        vocab = defaultdict()  # term ids in order of first occurrence: the order rank-bm25 sums its idfs in
        vocab.default_factory = vocab.__len__  # an unseen word gets the next id
        terms, tfs, doc_len, distinct = array("i"), array("i"), [], []  # compact 4-byte buffers: nnz reaches 1e8
        for words in tokenized:
            counts = Counter(words)  # insertion order = first occurrence
            terms.extend(map(vocab.__getitem__, counts))
            tfs.extend(counts.values())
            doc_len.append(len(words))
            distinct.append(len(counts))
        D = len(doc_len)
        terms = np.frombuffer(terms, dtype=np.int32)  # [nnz]
        tf = np.frombuffer(tfs, dtype=np.int32).astype(np.int64)  # [nnz]
        doc = np.repeat(np.arange(D, dtype=np.int32), distinct)  # [nnz] passage of each (word, passage) pair
        df = np.bincount(terms, minlength=len(vocab))  # [V] passages containing each word
        if variant == "okapi":
            values, idf = cls._okapi_impacts(terms, tf, doc, df, doc_len, k1, b, epsilon), None
        else:
            values, idf = cls._lucene_values(tf, doc, df, doc_len, k1, b)
        order = np.argsort(terms, kind="stable")  # [nnz] by word, then by passage
        indptr = np.concatenate([[0], np.cumsum(df)])  # [V+1]
        return cls(dict(vocab), indptr, doc[order], values[order], D, variant, idf)

    @staticmethod
    def _okapi_impacts(terms, tf, doc, df, doc_len, k1, b, epsilon) -> np.ndarray:
        """[nnz] float64 rank-bm25 impacts, by BM25Okapi's own float64 operations in its order."""
        dl = np.array(doc_len)[doc]  # [nnz] int64, as rank-bm25's doc_len array
        avgdl = sum(doc_len) / len(doc_len)
        idf = [math.log(len(doc_len) - n + 0.5) - math.log(n + 0.5) for n in df.tolist()]  # math.log, as rank-bm25
        idf_sum = 0.0
        for x in idf:  # a plain running sum, as rank-bm25 (np.sum and Python 3.12's sum() round differently)
            idf_sum += x
        floor = epsilon * (idf_sum / len(idf))
        idf = np.array([floor if x < 0 else x for x in idf])  # [V] negative idfs floored at eps * mean idf
        weight = tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))  # [nnz] rank-bm25's expression, verbatim
        return idf[terms] * weight  # [nnz]

    @staticmethod
    def _lucene_values(tf, doc, df, doc_len, k1, b) -> tuple[np.ndarray, np.ndarray]:
        """([nnz] tf * inv(dl), [V] idf), both float32, by BM25Similarity's operations in its order: its idf() and
        avgFieldLength() in float64 then rounded to float32, its 256-entry norm cache in float32."""
        doc_len = np.array(doc_len)  # [D]
        N = int(np.count_nonzero(doc_len))  # Lucene's docCount: passages with at least one token in the field
        idf = np.array([math.log(1 + (N - n + 0.5) / (n + 0.5)) for n in df.tolist()], dtype=np.float32)  # [V]
        avgdl = np.float32(doc_len.sum() / N)  # (float) (sumTotalTermFreq / (double) docCount)
        k1, b, one = np.float32(k1), np.float32(b), np.float32(1)
        lengths = {n: lucene_doc_length(n) for n in np.unique(doc_len).tolist()}  # the decoded one-byte norms
        L = np.array([lengths[n] for n in doc_len.tolist()], dtype=np.float32)  # [D] exact small ints
        inv = one / (k1 * ((one - b) + b * L / avgdl))  # [D] float32, Lucene's cache[norm] expression
        return tf.astype(np.float32) * inv[doc], idf  # [nnz] float32: Lucene's freq * normInverse

    def get_scores(self, words: list[str]) -> np.ndarray:
        """Scores [D] float64 of a tokenized query. okapi: as BM25Okapi.get_scores returns them (repeated words count
        again). lucene: Lucene's float32 scores (as float64), a repeated word weighted by its count."""
        scores = np.zeros(self.num_docs)  # [D]
        if self.variant == "okapi":
            for w in words:
                t = self.vocab.get(w)
                if t is not None:  # unknown words add 0, as in rank-bm25
                    lo, hi = self.indptr[t], self.indptr[t + 1]
                    scores[self.docs[lo:hi]] += self.values[lo:hi]  # a posting list holds each passage once
            return scores
        for w, count in Counter(words).items():
            t = self.vocab.get(w)
            if t is not None:
                lo, hi = self.indptr[t], self.indptr[t + 1]
                weight = np.float32(count) * self.idf[t]  # BM25Scorer.weight = boost * idf, in float32
                scores[self.docs[lo:hi]] += weight - weight / (np.float32(1) + self.values[lo:hi])  # float32 terms
        return scores.astype(np.float32).astype(np.float64)  # the float64 sum rounded to float32 once, as Lucene

    def top(self, words: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(passages [<=k] int, scores [<=k] float64) of a tokenized query's k best passages: exactly
        `top_k(get_scores(words), k)` and those scores, bit for bit, but from the query's posting lists alone when
        they are short. The dense path costs O(D) per query (a [D] score vector and a pass over it for the top k);
        this one O(n log n) in the n postings the query touches (a name: tens to hundreds). Measured on synthetic
        1M-passage indexes (benchmarks/bench_retrieval_scale.py): 16x faster for names, 3.6x for question words.
        Each candidate's terms are added in the dense path's order (np.bincount adds its weights in input order,
        starting from 0.0), so every score is the same float. When n > D / 8 the dense path is the cheaper one and
        is taken."""
        if self.variant == "okapi":  # every word again, in query order (rank-bm25's sum)
            terms = [(t, None) for t in map(self.vocab.get, words) if t is not None]
        else:  # each distinct word once, weighted by its count (Anserini's bag of words)
            terms = [(t, np.float32(c) * self.idf[t]) for w, c in Counter(words).items()
                     if (t := self.vocab.get(w)) is not None]
        n = sum(int(self.indptr[t + 1] - self.indptr[t]) for t, _ in terms)
        if n * 8 > self.num_docs:
            scores = self.get_scores(words)  # [D]
            order = top_k(scores, k)
            return order, scores[order]
        if not terms:
            return np.zeros(0, np.int64), np.zeros(0)
        spans = [(slice(self.indptr[t], self.indptr[t + 1]), weight) for t, weight in terms]
        docs = np.concatenate([self.docs[span] for span, _ in spans])  # [n] passages, word after word
        parts = [self.values[span] if weight is None else weight - weight / (np.float32(1) + self.values[span])
                 for span, weight in spans]  # [n] each posting's term score, float64 (okapi) or float32 (lucene)
        cand, slot = np.unique(docs, return_inverse=True)  # [c] touched passages, ascending; [n] each posting's slot
        sums = np.bincount(slot, weights=np.concatenate(parts).astype(np.float64), minlength=len(cand))  # [c]
        if self.variant == "lucene":
            sums = sums.astype(np.float32).astype(np.float64)  # rounded to float32 once, as get_scores
        order = top_k(sums, k)  # positions in cand: ties by position = by passage order
        return cand[order], sums[order]

    def save(self, path: Path):
        """Write the index as one .npz, atomically (temp file in the same folder, then rename). Raises OSError (a
        read-only or full disk, a file where the folder should be) after removing the temp file."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        words = np.frombuffer("\n".join(self.vocab).encode("utf-8"), dtype=np.uint8)  # no word holds a newline
        idf = np.zeros(0, np.float32) if self.idf is None else self.idf
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                np.savez(f, vocab=words, indptr=self.indptr, docs=self.docs, values=self.values,
                         num_docs=self.num_docs, variant=np.array(self.variant), idf=idf)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)  # no half-written index left to fill the disk
            raise

    @classmethod
    def load(cls, path: Path) -> "SparseBM25":
        """Read an index written by `save`. Raises OSError if the file cannot be opened, and ValueError "<path>: damaged
        index file (...)" for anything else np.load and the checks below can hit on a truncated, garbage or foreign
        file (a zip's CRC catches flipped bits too), so that callers can rebuild on one exception type."""
        try:
            with np.load(path) as z:  # allow_pickle=False: a garbage file is a ValueError, never unpickled
                words = z["vocab"].tobytes().decode("utf-8").split("\n")
                variant = str(z["variant"])
                index = cls({w: t for t, w in enumerate(words)}, z["indptr"], z["docs"], z["values"],
                            int(z["num_docs"]), variant, z["idf"] if variant == "lucene" else None)
        except (zipfile.BadZipFile, EOFError, ValueError, KeyError, TypeError, IndexError, pickle.UnpicklingError) as e:
            raise ValueError(f"{path}: damaged index file ({type(e).__name__}: {e})") from None
        if (len(index.indptr) != len(words) + 1 or not index.indptr[-1] == len(index.docs) == len(index.values)
                or variant not in BM25_VARIANTS or (variant == "lucene" and len(index.idf) != len(words))):
            raise ValueError(f"{path}: damaged index file (inconsistent index arrays)")
        return index


def index_cache_file(corpus_path, k1: float, b: float, cache_dir, bm25: str, analyzer: str) -> Path:
    """<cache_dir>/bm25-<corpus name>-<path hash>-<bm25>-<analyzer>-<key hash>.npz. The key covers the corpus file's
    absolute path, size and modification time (as make and rsync judge a file changed), the BM25 variant and
    parameters, and the analyzer with what decides its words (Python's Unicode tables; for "english" also the regex
    and nltk versions): editing or replacing the corpus, or changing any of those, misses the cache. Each variant and
    analyzer has its own file name, so indexes of one corpus under different scorings live side by side."""
    path = Path(corpus_path).resolve()
    st = path.stat()
    key = json.dumps([st.st_size, st.st_mtime_ns, k1, b, bm25, analyzer, analyzer_version(analyzer), INDEX_VERSION])
    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()[:12]  # noqa: E731
    return Path(cache_dir) / f"bm25-{path.stem}-{digest(str(path))}-{bm25}-{analyzer}-{digest(key)}.npz"


def analyzer_version(analyzer: str) -> list[str]:
    """What, besides our code, decides an analyzer's words: the Unicode tables of Python (str.lower, \\w) and, for
    "english", of the regex module (word boundaries) and nltk (the stemmer)."""
    versions = [unicodedata.unidata_version]
    if analyzer == "english":
        versions += [regex.__version__, importlib.metadata.version("nltk")]
    return versions


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the <= k best scores > 0, best first, ties by passage order: the first k of a stable descending
    argsort, without sorting all D scores (np.partition finds the k-th best, then only the survivors are sorted)."""
    cand = np.flatnonzero(scores > 0)  # [n] ascending passage index; NOTE(departure 1): Anserini ties by id string
    if len(cand) > k:
        kth = np.partition(scores[cand], len(cand) - k)[len(cand) - k]  # the k-th largest score
        cand = cand[scores[cand] >= kth]  # keeps every passage tied with it, still in passage order
    return cand[np.argsort(-scores[cand], kind="stable")[:k]]


# -----------------------------------------------------------------------------


class BM25Retriever:
    """Exact BM25 top-k over an in-memory corpus: Lucene's scoring with its English analyzer (pyserini's, the default),
    or rank-bm25's Okapi with \\w+ words, by rank_bm25.BM25Okapi or `SparseBM25` (departures 1, 4)."""

    def __init__(self, corpus: list[dict], k1: float = 0.9, b: float = 0.4, engine: str = "auto", index=None,
                 bm25: str = "lucene", analyzer: str | None = None):
        """corpus: [D] rows {"id", "contents"} as `load_corpus` returns. k1, b: BM25 term-saturation and length-norm
        constants (Anserini defaults). bm25: the scoring (`BM25_VARIANTS`): "lucene" (Lucene's BM25Similarity) or
        "okapi" (rank-bm25's BM25Okapi), see SparseBM25. analyzer: text -> words (`ANALYZERS`); None: the variant's
        own (`DEFAULT_ANALYZER`: "english" for lucene, "words" for okapi). engine: "rank_bm25" (rank-bm25 itself,
        okapi only), "sparse" (okapi: the same scores; lucene: the only engine) or "auto" (lucene: sparse; okapi:
        sparse above SPARSE_ABOVE passages). index: a prebuilt SparseBM25 of this corpus, variant and analyzer (from
        the cache). Raises ValueError on an empty corpus, one without a single word (after the analyzer), an unknown
        variant, analyzer or engine, or engine "rank_bm25" with bm25 "lucene"."""
        if bm25 not in BM25_VARIANTS:
            raise ValueError(f"--bm25 must be one of {', '.join(BM25_VARIANTS)}; got {bm25!r}")
        analyzer = DEFAULT_ANALYZER[bm25] if analyzer is None else analyzer
        if analyzer not in ANALYZERS:
            raise ValueError(f"analyzer must be one of {', '.join(ANALYZERS)}; got {analyzer!r}")
        if engine not in ("auto", "rank_bm25", "sparse"):
            raise ValueError(f"engine must be 'auto', 'rank_bm25' or 'sparse', got {engine!r}")
        if engine == "rank_bm25" and bm25 != "okapi":
            raise ValueError(f"engine 'rank_bm25' scores only --bm25 okapi (rank-bm25 has no Lucene BM25); use engine "
                             f"'sparse' or 'auto' for --bm25 {bm25}")
        if not corpus:
            raise ValueError("corpus is empty: need at least one passage")
        self.analyze = ANALYZERS[analyzer]  # text -> [words]
        if not any(self.analyze(row["contents"]) for row in corpus):  # stops at the first passage with a word
            raise ValueError(f"corpus has no word tokens ({analyzer} analyzer): every passage is empty or punctuation"
                             + (" or stop words" if analyzer == "english" else ""))
        self.corpus, self.variant, self.analyzer = corpus, bm25, analyzer
        self.engine = engine if engine != "auto" else \
            "sparse" if bm25 != "okapi" or len(corpus) > SPARSE_ABOVE else "rank_bm25"
        if index is None:
            docs = tqdm(corpus, desc="tokenize", unit="doc", disable=len(corpus) <= 50_000)
            tokenized = (self.analyze(row["contents"]) for row in docs)  # [D] lists of words, made one at a time
            if self.engine == "sparse":
                index = SparseBM25.build(tokenized, k1=k1, b=b, variant=bm25)
            else:
                index = BM25Okapi(tokenized, k1=k1, b=b)  # rank-bm25's default epsilon=0.25 floors negative idfs
        self.bm25 = index  # either engine: .get_scores(words) -> [D]

    @classmethod
    def from_jsonl(cls, path, k1: float = 0.9, b: float = 0.4, engine: str = "auto", cache_dir=CACHE_DIR,
                   bm25: str = "lucene", analyzer: str | None = None) -> "BM25Retriever":
        """Build the index from a jsonl corpus file (errors as `load_corpus` and __init__). The sparse index of a
        corpus of more than CACHE_ABOVE passages is read from, or written to, `cache_dir` (None: no cache), so the
        second run over the corpus skips indexing (`index_cache_file`: one file per corpus, variant and analyzer). A
        cache folder that cannot be written (read-only, full) costs one warning line on stderr, and the run goes on."""
        corpus = load_corpus(path)
        if bm25 not in BM25_VARIANTS:  # checked before the cache key is made (the first check of __init__)
            return cls(corpus, k1=k1, b=b, engine=engine, bm25=bm25, analyzer=analyzer)
        analyzer = DEFAULT_ANALYZER[bm25] if analyzer is None else analyzer
        sparse = engine == "sparse" or (engine == "auto" and (bm25 != "okapi" or len(corpus) > SPARSE_ABOVE))
        if cache_dir is None or not sparse or len(corpus) <= CACHE_ABOVE or analyzer not in ANALYZERS:
            return cls(corpus, k1=k1, b=b, engine=engine, bm25=bm25, analyzer=analyzer)
        file = index_cache_file(path, k1, b, cache_dir, bm25, analyzer)
        try:
            index = SparseBM25.load(file) if file.is_file() else None
        except (OSError, ValueError) as err:  # a damaged file (killed writer, full disk, copy): rebuild it
            print(f"warning: rebuilding the unreadable BM25 index cache: {err}", file=sys.stderr)
            index = None
        if index is not None and index.num_docs == len(corpus) and index.variant == bm25:
            return cls(corpus, k1=k1, b=b, engine="sparse", index=index, bm25=bm25, analyzer=analyzer)
        retriever = cls(corpus, k1=k1, b=b, engine="sparse", bm25=bm25, analyzer=analyzer)
        try:  # the cache is optional: a read-only or full cache folder costs the next run the indexing, nothing more
            for old in file.parent.glob(file.name.rsplit("-", 1)[0] + "-*.npz"):  # this corpus and variant's stale ones
                old.unlink(missing_ok=True)
            retriever.bm25.save(file)
        except OSError as err:
            print(f"warning: BM25 index cache not written to {file.parent} ({err.strerror or err}); going on without "
                  "it (the next run indexes this corpus again)", file=sys.stderr)
        return retriever

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        """For each query, its best <= topk passages as [{"document": {"id", "contents"}, "score": float}, ...].

        Matches the `/retrieve` response of Search-R1's retrieval_server.py (one list per query, best first), except
        departures 2-4: only passages with score > 0 (i.e. containing a query word) are returned, ties keep passage
        order, and an empty/whitespace/unknown-word query gives []. Raises ValueError if topk < 1, TypeError if
        `queries` is a single string.
        """
        check_request(queries, topk)
        results = []
        for query in queries:  # one at a time, as Search-R1's BM25 _batch_search loops
            words = self.analyze(query)
            if not words:
                results.append([])  # NOTE(departure 3): an empty, whitespace or stop-word query -> no hits
                continue
            if isinstance(self.bm25, SparseBM25):  # from the query's posting lists: the same hits, sub-linear in D
                order, scores = self.bm25.top(words, topk)
            else:
                scores = self.bm25.get_scores(words)  # [D]
                order = top_k(scores, topk)  # [<=topk] best first, ties by passage order; NOTE(departure 3): score > 0
                scores = scores[order]
            # NOTE(departure 2): doc and score travel together, so they can never misalign or exceed topk (P23).
            results.append([self._hit(i, score) for i, score in zip(order, scores)])
        return results

    def _hit(self, i: int, score: float) -> dict:
        row = self.corpus[i]
        return {"document": {"id": row["id"], "contents": row["contents"]}, "score": float(score)}

    def __call__(self, queries: list[str], topk: int = 3) -> list[str]:
        """Queries -> one observation string per query (`format_passages` of its hits; "" when nothing matched)."""
        return [format_passages(hits) for hits in self.search(queries, topk)]

    def __str__(self):
        return f"{len(self.corpus)} passages (BM25 {self.variant}, {self.analyzer} analyzer, {self.engine} engine)"


class BadAnswer(ValueError, OSError):
    """A /retrieve server's answer that is none: a rejected request (4xx) or a body of another shape. A ValueError by
    meaning, and an OSError too, so that train.py and evaluate.py stop on it with one line at any step, as on a server
    that stopped answering (checkpoint.io_errors_stop_the_run, evaluate.py's loop)."""


def check_hits(result: list, url: str):
    """Raise BadAnswer (one line, showing the first bad item) unless `result` holds, per query, a list of hits
    {"document": {"contents": str, ...}, ...}: what format_passages and passage_title read."""
    for hits in result:
        bad = hits if not isinstance(hits, list) else next(
            (h for h in hits if not (isinstance(h, dict) and isinstance(h.get("document"), dict)
                                     and isinstance(h["document"].get("contents"), str))), None)
        if bad is not None:
            shown = json.dumps(bad, ensure_ascii=False)
            raise BadAnswer(f"retriever at {url} answered hits of another shape: "
                            f"{shown if len(shown) <= 120 else shown[:117] + '...'}; a /retrieve server answers, per "
                            'query, a list of {"document": {"id", "contents"}, "score"} (Search-R1\'s, with '
                            '"return_scores": true)')


def check_request(queries, topk):
    """The argument checks shared by the local and the remote retriever."""
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, got one str; pass [query]")
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")


# -----------------------------------------------------------------------------
# Search-R1's HTTP API: a client (train.py / evaluate.py --retriever-url) and a standard-library server


class RemoteRetriever:
    """The retriever interface (search / __call__) over HTTP, against any Search-R1 /retrieve server: `retriever.py
    serve`, or Search-R1's own retrieval_server.py (e5 + faiss, or pyserini BM25) for paper-scale corpora."""

    def __init__(self, url: str, timeout: float = CLIENT_TIMEOUT, retries: int = 2, backoff: float = 1.0):
        """url: e.g. http://127.0.0.1:8000/retrieve (a bare http://host:port gets /retrieve). timeout: seconds the
        server may stay silent (connecting, or before its answer) before a try fails (train.py / evaluate.py
        --retriever-timeout). retries: further tries after a failed connection, a timeout or a 5xx answer, waiting
        backoff * 2^i seconds; a server that never answers costs (retries + 1) * timeout + backoff * (2^retries - 1)
        seconds (defaults: 93 s) before the ConnectionError. Raises ValueError if timeout <= 0, retries < 0 or
        backoff < 0."""
        if not timeout > 0:
            raise ValueError(f"retriever timeout must be > 0 seconds (--retriever-timeout), got {timeout}")
        if retries < 0 or backoff < 0:
            raise ValueError(f"retries and backoff must be >= 0, got {retries} and {backoff}")
        self.url = url if urllib.parse.urlsplit(url).path not in ("", "/") else url.rstrip("/") + "/retrieve"
        self.timeout, self.retries, self.backoff = timeout, retries, backoff

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        """As BM25Retriever.search, answered by the server (POST {"queries", "topk", "return_scores": true}).

        Each failed try that is retried prints one warning line to stderr ("retriever at URL: no answer in 30 s (try 1
        of 3); retrying in 1 s"). Raises ConnectionError (one line: what failed, after how long, how to start a server,
        which flag sets the timeout) when every try failed, ValueError when the server rejects the request (4xx) or
        answers with something that is not a /retrieve response (BadAnswer, also an OSError: it stops a run with one
        line at any step)."""
        check_request(queries, topk)
        if not queries:
            return []
        body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": True}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        tries, t0 = self.retries + 1, time.monotonic()
        for attempt in range(tries):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    answer = json.load(response)
                break
            except urllib.error.HTTPError as err:  # the server answered: a 4xx is our fault, never worth retrying
                if err.code < 500:
                    raise BadAnswer(f"retriever at {self.url} rejected the request: {err.code} {err.read()[:300]!r}")
                why = f"HTTP {err.code} {err.reason}"
            except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:  # refused, reset,
                why = self._describe(err)  # timed out, cut short (IncompleteRead), garbled (JSONDecodeError)
            if attempt + 1 == tries:
                port = urllib.parse.urlsplit(self.url).port or 80
                raise ConnectionError(
                    f"retriever at {self.url} failed after {tries} tries in {time.monotonic() - t0:.1f} s (last: "
                    f"{why}). Is the server up? Start one with: python retriever.py serve --corpus CORPUS --port "
                    f"{port}; a slow server needs more than {self.timeout:g} s per request: --retriever-timeout SECONDS"
                ) from None
            wait = self.backoff * 2**attempt
            print(f"warning: retriever at {self.url}: {why} (try {attempt + 1} of {tries}); retrying in {wait:g} s",
                  file=sys.stderr, flush=True)
            time.sleep(wait)
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise BadAnswer(f"retriever at {self.url} answered no 'result' list of {len(queries)} hit lists")
        check_hits(result, self.url)
        return result

    def _describe(self, err: Exception) -> str:
        """A failed try in a few words: "no answer in 30 s", "connection refused", ..."""
        reason = err.reason if isinstance(err, urllib.error.URLError) else err  # URLError wraps connect() errors
        if isinstance(reason, TimeoutError):  # socket.timeout is TimeoutError since Python 3.10
            return f"no answer in {self.timeout:g} s"
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, ConnectionResetError):  # http.client.RemoteDisconnected included
            return "connection reset"
        if isinstance(reason, ValueError):
            return f"unreadable answer ({type(reason).__name__}: {reason})"
        return reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"

    def __call__(self, queries: list[str], topk: int = 3) -> list[str]:
        """Queries -> one observation string per query, as BM25Retriever.__call__."""
        return [format_passages(hits) for hits in self.search(queries, topk)]

    def __str__(self):
        return f"retriever at {self.url}"


def make_retriever(corpus, url: str = "", engine: str = "auto", cache_dir=CACHE_DIR, timeout: float = CLIENT_TIMEOUT,
                   bm25: str = "lucene"):
    """The retriever train.py and evaluate.py use: a RemoteRetriever when `url` is set (checked with one query, so a
    server that is down fails before the model loads), else an in-process BM25Retriever over the jsonl `corpus`,
    scored by `bm25` (--bm25: "lucene" or "okapi", each with its own analyzer; `serve --bm25` sets a server's).
    timeout: the RemoteRetriever's seconds per try (--retriever-timeout; unused without `url`). Raises as
    BM25Retriever.from_jsonl, or ConnectionError / ValueError as RemoteRetriever."""
    if not url:
        return BM25Retriever.from_jsonl(corpus, engine=engine, cache_dir=cache_dir, bm25=bm25)
    retriever = RemoteRetriever(url, timeout=timeout)
    retriever.search(["test"], 1)
    return retriever


def make_server(retriever, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
                backlog: int = LISTEN_BACKLOG, timeout: float = SERVER_TIMEOUT) -> ThreadingHTTPServer:
    """An HTTP server (not yet started: call .serve_forever()) answering Search-R1's POST /retrieve with `retriever`.

    Request {"queries": [str], "topk": int (missing, null or 0: default_topk, as Search-R1), "return_scores": bool
    (default false)} -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...] per query]}, or
    [[document, ...] per query] with return_scores false. A malformed request, or a Content-Length that is missing, not
    a decimal integer or over MAX_REQUEST_BYTES, gets 400 {"error": ...}; another path 404. port 0 picks a free port
    (server.server_address[1]). Each connection runs in its own thread, one request per connection (HTTP/1.0).
    backlog: connections the kernel queues before they are accepted (`LISTEN_BACKLOG`). timeout: seconds a connection
    may stall (no byte arrives or leaves) before its thread drops it; a body shorter than its Content-Length then gets
    408. Raises ValueError if backlog < 1 or timeout <= 0, OSError if the port is taken.
    """
    if backlog < 1:
        raise ValueError(f"backlog must be >= 1 (queued connections), got {backlog}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")

    stall_s = timeout  # (a class body cannot read an enclosing name it also assigns)

    class Handler(BaseHTTPRequestHandler):
        # setup() puts this timeout on the socket: a client that sends nothing, or less than its Content-Length, can
        # no longer hold a thread forever (BaseHTTPRequestHandler then drops the connection, or we answer 408 below).
        timeout = stall_s

        def do_POST(self):
            if self.path.rstrip("/") != "/retrieve":
                return self.reply(404, {"error": f"unknown path {self.path}; POST /retrieve"})
            try:
                size = self.headers.get("Content-Length")
                if size is None:
                    raise ValueError("missing Content-Length header")
                if not re.fullmatch(r"[0-9]+", size.strip()) or int(size) > MAX_REQUEST_BYTES:
                    # int() would take "-1" (and rfile.read(-1) then waits for EOF), "+5", " 1_0 "
                    raise ValueError(f"Content-Length must be an integer in [0, {MAX_REQUEST_BYTES}], got {size!r}")
                try:
                    body = self.rfile.read(int(size))
                except TimeoutError:
                    return self.reply(408, {"error": f"request body stalled for {timeout:g} s before its "
                                                     f"Content-Length of {size.strip()} bytes arrived"})
                if len(body) < int(size):  # the client closed early
                    raise ValueError(f"body has {len(body)} bytes, Content-Length says {size.strip()}")
                req = json.loads(body)
                queries, topk = req["queries"], req.get("topk") or default_topk
                if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                    raise ValueError("'queries' must be a list of strings")
                if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
                    raise ValueError(f"'topk' must be an integer >= 1, got {topk!r}")
                if not isinstance(req.get("return_scores", False), bool):
                    raise ValueError("'return_scores' must be true or false")
            except (ValueError, KeyError, TypeError, AttributeError) as err:  # JSONDecodeError is a ValueError
                return self.reply(400, {"error": f"bad request: {type(err).__name__}: {err}"})
            try:
                hits = retriever.search(queries, topk)
            except Exception as err:  # a server-side failure: answer 500 (the client retries), keep serving
                return self.reply(500, {"error": f"{type(err).__name__}: {err}"})
            # NOTE(departure 2): return_scores=false gives the documents; Search-R1's server crashes on it
            docs = [[h["document"] for h in q] for q in hits]
            self.reply(200, {"result": hits if req.get("return_scores") else docs})

        def reply(self, code: int, obj: dict):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # no line per request on stderr (a training step sends several)
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = backlog  # the listen() backlog, read when the constructor binds (default 5: see above)
        daemon_threads = True

        def handle_error(self, request, client_address):
            if isinstance(sys.exc_info()[1], ConnectionError):  # the client hung up (reset, broken pipe): its loss,
                return  # not a server fault, so no traceback on the terminal (a killed train.py or a timed-out client)
            super().handle_error(request, client_address)

    return Server((host, port), Handler)


def serve_cli(argv: list[str]):
    """python retriever.py serve --corpus C [--port 8000] [--host 127.0.0.1]: build the index, then serve until ^C."""
    ap = argparse.ArgumentParser(prog="retriever.py serve", description="Serve Search-R1's POST /retrieve over a "
                                 "jsonl corpus (BM25), for train.py / evaluate.py --retriever-url.")
    ap.add_argument("--corpus", required=True, help="jsonl corpus with {'id', 'contents'} rows")
    ap.add_argument("--host", default="127.0.0.1", help="interface; 0.0.0.0 exposes the server (no authentication)")
    ap.add_argument("--port", type=int, default=8000, help="port (Search-R1's default 8000; 0 picks a free one)")
    ap.add_argument("--topk", type=int, default=3, help="passages for requests without topk (Search-R1 default 3)")
    ap.add_argument("--bm25", default=BM25_VARIANTS[0], choices=BM25_VARIANTS, help="scoring: lucene (Lucene's BM25 "
                    "and English analyzer, as pyserini) or okapi (rank-bm25's BM25Okapi, \\w+ words)")
    ap.add_argument("--engine", default="sparse", choices=["auto", "rank_bm25", "sparse"],
                    help="BM25 engine (sparse: the same scores as rank_bm25, ~25x the requests/s at 13,823 passages; "
                    "rank_bm25: --bm25 okapi only)")
    ap.add_argument("--backlog", type=int, default=LISTEN_BACKLOG, help="connections queued before they are accepted "
                    f"(default {LISTEN_BACKLOG}; Python's default 5 drops or resets bursts of requests)")
    args = ap.parse_args(argv)
    if args.backlog < 1:  # checked before the index is built
        ap.error(f"--backlog must be >= 1, got {args.backlog}")
    try:
        retriever = BM25Retriever.from_jsonl(args.corpus, engine=args.engine, bm25=args.bm25)
        server = make_server(retriever, args.host, args.port, args.topk, backlog=args.backlog)
    except (FileNotFoundError, ValueError, OSError) as err:  # bad corpus, port in use: one line, no traceback
        raise SystemExit(f"error: {err}") from None
    print(f"serving {retriever} at http://{args.host}:{server.server_address[1]}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


# -----------------------------------------------------------------------------

if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve_cli(sys.argv[2:])
        sys.exit(0)
    parser = argparse.ArgumentParser(description="BM25 search over a jsonl corpus; no arguments runs a toy demo.")
    parser.add_argument("queries", nargs="*", help="one or more query strings (needs --corpus)")
    parser.add_argument("--corpus", help="jsonl corpus with {'id', 'contents'} rows")
    parser.add_argument("--topk", type=int, default=3, help="passages per query (Search-R1 default 3)")
    parser.add_argument("--k1", type=float, default=0.9, help="BM25 k1 (Anserini default)")
    parser.add_argument("--b", type=float, default=0.4, help="BM25 b (Anserini default)")
    parser.add_argument("--bm25", default=BM25_VARIANTS[0], choices=BM25_VARIANTS, help="scoring: lucene (Lucene's "
                        "BM25 and English analyzer, as pyserini) or okapi (rank-bm25's BM25Okapi, \\w+ words)")
    parser.add_argument("--engine", default="auto", choices=["auto", "rank_bm25", "sparse"],
                        help="BM25 engine (rank_bm25: --bm25 okapi only)")
    args = parser.parse_args()
    if args.corpus is None and args.queries:
        parser.error("queries need --corpus PATH (run with no arguments for the toy demo)")
    if args.corpus is not None and not args.queries:
        parser.error("--corpus given but no query: add one or more query strings")

    if args.corpus is None:  # toy demo: 5 passages, expected output in the comments
        try:
            retriever = BM25Retriever(DEMO_CORPUS, k1=args.k1, b=args.b, engine=args.engine, bm25=args.bm25)
        except ValueError as err:  # --engine rank_bm25 with --bm25 lucene: one clear line, no traceback
            raise SystemExit(f"error: {err}") from None
        print(retriever.analyze("capital of France"))
        # ['capit', 'franc']   lucene: "of" is a stop word, the rest Porter stems (okapi: ['capital', 'of', 'france'])
        for hit in retriever.search(["capital of France"], topk=3)[0]:
            print(hit["document"]["id"], round(hit["score"], 4))
        # 0 0.9449   "Paris": capit + franc (each in 2 of 5 passages: idf ln(1 + 3.5/2.5) = 0.8755)
        # 1 0.4724   "Berlin": capit
        # 2 0.4357   "Eiffel Tower": franc, in a longer passage ("Rhine" and "Apple" match nothing: never shown)
        # (okapi: 1.0247, 0.6832, 0.3251: "of" counts there, idf ln(3.5/2.5) = 0.3365 per word)
        print(retriever(["Rhine"], topk=3)[0], end="")
        # Doc 1(Title: "Rhine") The Rhine flows through Germany and the Netherlands.
        print(retriever.search(["zebra", "   "]))
        # [[], []]   unknown word and whitespace query: no hits (departure 3)
    else:
        t0 = time.perf_counter()
        try:
            retriever = BM25Retriever.from_jsonl(args.corpus, k1=args.k1, b=args.b, engine=args.engine,
                                             bm25=args.bm25)
        except (FileNotFoundError, ValueError) as err:  # bad input: one clear line, no traceback
            raise SystemExit(f"error: {err}") from None
        print(f"index: {retriever} in {time.perf_counter() - t0:.2f}s")
        for query in args.queries:
            t0 = time.perf_counter()
            hits = retriever.search([query], topk=args.topk)[0]
            print(f"\nquery: {query!r}  ({len(hits)} hits, {1000 * (time.perf_counter() - t0):.1f} ms)")
            for rank, hit in enumerate(hits, start=1):
                print(f"  {rank}. id={hit['document']['id']} score={hit['score']:.4f}")
            print(format_passages(hits) if hits else "(no passage contains a query word)", end="")
