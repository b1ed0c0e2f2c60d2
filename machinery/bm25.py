"""The BM25 index: a corpus's words in posting lists (`SparseBM25`), scored as Lucene or as
rank-bm25 scores them.

An analyzer (`ANALYZERS`) turns each of the N passages d into words; a query q (its words w, repeats
count) scores
    score(q, d) = sum_{w in q} idf(w) * g * tf(w, d) / (tf(w, d) + k1 * (1 - b + b * |d| / avgdl)),
tf(w, d) the count of w in d, |d| the length of d in words, avgdl its mean, df(w) the passages
holding w. Two variants (`BM25_VARIANTS`, train.py and evaluate.py `--bm25`):
  * "lucene" (default), what Search-R1's BM25 baseline runs (pyserini's LuceneSearcher, Anserini's
    defaults): Lucene's BM25Similarity, idf = ln(1 + (N - df + 0.5) / (df + 0.5)), g = 1, k1 = 0.9,
    b = 0.4, in float32 step by step, |d| in Lucene's one byte (SmallFloat: exact below 40;
    `lucene_doc_length`), N = passages with a word (docCount), over Lucene's English analysis (UAX
    #29 words, possessive 's removed, Java lower-casing, 33 stop words, Porter stems, words cut at
    255 characters; `english_analyze`). tests/test_bm25.py checks words and scores against Lucene
    8.7.
  * "okapi": rank-bm25's BM25Okapi, idf = ln((N - df + 0.5) / (df + 0.5)), negative ones floored at
    0.25 * mean idf, g = k1 + 1, over lower-cased \\w+ words (`tokenize`), bitwise rank-bm25's
    floats; not Lucene at all (no stems, no stop words), it finds fewer supporting passages in the
    top 3 (benchmarks/bench_retrieval.py).
`SparseBM25.build` stores each word's posting list (the passages holding it, each with its term
score), so a query adds up only its words' lists; retriever.BM25Retriever searches with it.
Departures (Unicode tables, ties by passage order): docs/departures.md, P37-P38; agreement with
Lucene measured: docs/retrieval.md. Shapes: D = passages in the corpus, V = distinct words, nnz =
(word, passage) pairs; `scores` is [D] per query. Run `python -m machinery.bm25` for a demo: both
analyzers on one question, both variants' top passages of a 3-passage corpus.
"""

import functools
import importlib.util
import itertools
import math
import re
import sys
import threading
from collections import defaultdict

import numpy as np
import regex

from machinery.bm25_numba import topk

# numba compiles the search loop (topk.py; SparseBM25.prepare); without it, or NUMBA = False,
# SparseBM25 searches with numpy, the same floats (benchmarks/bench_speed_retrieval.py compares the
# two). A numba that cannot run sets it False.
NUMBA = importlib.util.find_spec("numba") is not None
# top_many compiles from this many passages (below, numba saves less than its ~0.7 s import)
NUMBA_FROM = 2_000
# the compiled lucene search prunes (topk.py) from this many passages: below, its sums fit the
PRUNE_FROM = 50_000
# CPU's cache and walking every list was as fast (benchmarks/bench_speed_retrieval.py)
# top_many deals queries to its threads by their postings from this many passages (_shares)
BALANCE_FROM = 50_000

# --bm25 choices, the default first (SparseBM25 says what each computes)
BM25_VARIANTS = ("lucene", "okapi")
# each variant's analyzer (ANALYZERS, below)
DEFAULT_ANALYZER = {"lucene": "english", "okapi": "words"}
BUILD_CHUNK = 1 << 16  # SparseBM25.build counts the words of this many passages at a time
INDEX_VERSION = 2  # part of the cache key: bump it when SparseBM25's arrays change meaning


def tokenize(text: str) -> list[str]:
    """The "words" analyzer: lower-cased \\w+ words, no stemming, no stop words (rank-bm25 users'
    usual split, our `--bm25 okapi`): "Who founded X-Men's?" -> ["who", "founded", "x", "men",
    "s"]."""
    return re.findall(r"\w+", text.lower())


# --- Lucene's English analyzer (`--bm25 lucene`), as pyserini indexes and searches wiki-18 ---
# Anserini's DefaultEnglishAnalyzer (pyserini's default), the same chain as Lucene's
# EnglishAnalyzer: StandardTokenizer -> EnglishPossessiveFilter -> LowerCaseFilter ->
# StopFilter(English stop words) -> PorterStemFilter.

# StandardTokenizer: the words of Unicode's default word segmentation (UAX #29), as the `regex`
# module draws its word boundaries (WORD flag), plus runs of Thai/Lao/Khmer/Myanmar letters (UAX #29
# leaves those to a dictionary; Lucene keeps each run whole). A segment is a token when it holds a
# letter, a digit, a kana/ideograph or a pictograph; spaces and punctuation are dropped. So
# "O'Neil's U.S. 3.14 e-mail" -> ["O'Neil's", "U.S", "3.14", "e", "mail"]. NOTE(P37): the
# regex module's Unicode tables, not those Lucene's tokenizer was generated from.
_SEGMENT = regex.compile(r"\p{Line_Break=Complex_Context}+|\b.+?\b",
                         flags=regex.WORD | regex.V1 | regex.DOTALL)
_TOKEN_CHAR = regex.compile(
    r"[\p{Word_Break=ALetter}\p{Word_Break=Hebrew_Letter}\p{Word_Break=Numeric}"
    r"\p{Word_Break=Katakana}\p{Script=Han}\p{Script=Hiragana}\p{Extended_Pictographic}"
    r"\p{Line_Break=Complex_Context}]"
)
# StandardTokenizer's default maxTokenLength: a longer word is cut into 255-character pieces
MAX_TOKEN_CHARS = 255
# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (Anserini's default stop words), 33 words.
LUCENE_STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or "
                              "such that the their "
                              "then there these they this to was will with".split())
# EnglishPossessiveFilter: trailing 's, ’s, ＇s
_POSSESSIVE = tuple(q + s for q in "'\u2019\uFF07" for s in "sS")
MAX_CACHED_WORDS = 1 << 17  # english_analyze's memory of analyzed words


# The same words fast: in ASCII, UAX #29 joins letters, digits and "_", a letter to a letter across
# one of : . ' and a digit to a digit across one of , . ; ' (rules WB5-WB13b); Python's re finds
# those words (_ASCII_WORDS) 10x faster than the regex module's word boundaries, which only the
# whitespace-delimited pieces holding a non-ASCII character go through. ASCII whitespace ends a word
# whatever surrounds it, except before a combining mark, format character or joiner, which UAX #29
# (WB4, WB3c) binds to it: a piece starting so sends the whole text through the regex module.
# tests/test_bm25.py checks both ways give the same words on fuzzed text and on real passages.
# (Written for speed: a word starts with a letter or digit after any "_" (a run of "_" alone is no
# word), the quantifiers are possessive (never give back) and the look-behinds follow the character
# they check, so a failed try costs one comparison.)
_ASCII_WORDS = re.compile(
    r"_*+[A-Za-z0-9]\w*+"  # \w: [A-Za-z0-9_]
    r"(?:[:.'](?<=[A-Za-z][:.'])(?=[A-Za-z])\w++|[,.;'](?<=[0-9].)(?=[0-9])\w++)*",
    re.ASCII,
)
_NON_ASCII, _REST_OF_PIECE = re.compile(r"[^\x00-\x7f]"), re.compile(r"\S*", re.ASCII)
_JOINS_BACK = regex.compile(r"[\p{Word_Break=Extend}\p{Word_Break=Format}\p{Word_Break=ZWJ}]")


def standard_tokenize(text: str) -> list[str]:
    """Lucene's StandardTokenizer (UAX #29 words, original case): "Paris's 1,000 U.S. e-mail" ->
    ["Paris's", "1,000", "U.S", "e", "mail"]. Words longer than MAX_TOKEN_CHARS characters are cut
    into pieces of that length. ASCII words by Python's re, the rest by `uax29_tokenize` (the same
    words: the comment above)."""
    if text.isascii():  # (most passages)
        words = _ASCII_WORDS.findall(text)
    else:
        words, start, rfind = [], 0, text.rfind
        # the next piece holding a non-ASCII character: text[lo:hi]
        while found := _NON_ASCII.search(text, start):
            i = found.start()
            lo = 1 + max(rfind(" ", start, i), rfind("\n", start, i), rfind("\t", start, i),
                         rfind("\r", start, i),
                         # after the last ASCII whitespace
                         rfind("\f", start, i), rfind("\v", start, i), start - 1)
            hi = _REST_OF_PIECE.match(text, i).end()
            if _JOINS_BACK.match(text, lo):
                return uax29_tokenize(text)
            words += _ASCII_WORDS.findall(text, start, lo)
            words += uax29_tokenize(text[lo:hi])
            start = hi
        words += _ASCII_WORDS.findall(text, start)
    # an ASCII word to cut (uax29_tokenize's words are cut)
    if words and max(map(len, words)) > MAX_TOKEN_CHARS:
        return [
            piece
            for word in words
            for piece in (uax29_tokenize(word) if len(word) > MAX_TOKEN_CHARS else [word])
        ]
    return words


def uax29_tokenize(text: str) -> list[str]:
    """`standard_tokenize` by the regex module's Unicode word boundaries alone (slow: ~4 us a
    word)."""
    out = []
    for seg in _SEGMENT.findall(text):
        if _TOKEN_CHAR.search(seg):
            out.extend(seg[i:i + MAX_TOKEN_CHARS] for i in range(0, len(seg), MAX_TOKEN_CHARS))
    return out


def java_lower(word: str) -> str:
    """Lower-case as Lucene's LowerCaseFilter does, one code point at a time (Java's
    Character.toLowerCase): unlike str.lower(), "İ" -> "i" (not "i" + a combining dot) and a final
    "Σ" -> "σ" (not "ς")."""
    low = word.lower()
    # the rare words where the two differ: redo them letter by letter
    if len(low) != len(word) or "ς" in low:
        low = "".join(c.lower()[0] for c in word)
    return low


# Snowball's "porter" (PyStemmer's C code, what bm25s stems with) is the published algorithm, where
# Martin Porter's code has "bli" -> "ble" and "logi" -> "log", undoubles any final double consonant
# but l, s, z (Snowball only bb dd ff gg mm nn pp rr tt) and keeps 1-2 letter words. Words that
# could meet those rules go to NLTK (a doubled digit, accented letter or mark too: both count any
# character outside a-z as a consonant); the rest stem the same, 10x faster (tests/test_bm25.py: all
# 68,278 words of our QA bundle; and 167,176 fuzzed words with digits, accents, punctuation).
_NLTK_ONLY, _A_Z = re.compile(r"bl|log|cc|hh|jj|kk|qq|vv|ww|xx|yy|([^a-z])\1|^.{0,2}$"), re.compile(
    "[a-z]"
)


@functools.cache
def _porter_stem():
    """Porter's stemmer as Lucene's PorterStemmer has it: NLTK's MARTIN_EXTENSIONS mode, i.e. Martin
    Porter's own reference implementation ("bli" -> "ble", "logi" -> "log", words of 1-2 letters
    kept), not the published algorithm that snowballstemmer's "porter" follows (101 of the 71,690
    words of our QA bundle would stem differently); sped up by PyStemmer's Snowball "porter" where
    the two agree (_NLTK_ONLY), if PyStemmer is installed. Imported on first use (importing nltk
    takes ~0.4 s)."""
    from nltk.stem.porter import PorterStemmer

    martin = functools.partial(PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS).stem,
                               to_lowercase=False)
    if importlib.util.find_spec("Stemmer") is None:
        return martin
    import Stemmer

    # and a word without a-z has no suffix to strip: kept as it is
    snowball = Stemmer.Stemmer("porter").stemWord
    return lambda word: (
        snowball(word)
        if not _NLTK_ONLY.search(word)
        else martin(word) if _A_Z.search(word) else word
    )


class _EnglishWords(dict):
    """word -> "" for a stop word, else its stem: each distinct word is analyzed once, a dict
    look-up per token after that. Emptied at MAX_CACHED_WORDS words (~20 MB), so a large corpus's
    vocabulary does not stay resident."""

    def __missing__(self, word: str) -> str:
        if len(self) >= MAX_CACHED_WORDS:
            self.clear()
        # EnglishPossessiveFilter, LowerCaseFilter
        low = java_lower(word[:-2] if word.endswith(_POSSESSIVE) else word)
        self[word] = stem = "" if low in LUCENE_STOP_WORDS else _porter_stem()(low)
        return stem


_ENGLISH_WORDS = _EnglishWords()


def english_analyze(text: str) -> list[str]:
    """The "english" analyzer: pyserini's analysis of wiki-18, i.e. Anserini's
    DefaultEnglishAnalyzer = Lucene's EnglishAnalyzer. `standard_tokenize`, then drop a trailing
    possessive 's, lower-case (`java_lower`), drop LUCENE_STOP_WORDS, Porter-stem (`_porter_stem`):
    "Who founded the X-Men's comics?" -> ["who", "found", "x", "men", "comic"]. A text of stop words
    and punctuation gives []."""
    # "": a stop word
    return list(filter(None, map(_ENGLISH_WORDS.__getitem__, standard_tokenize(text))))


ANALYZERS = {"english": english_analyze, "words": tokenize}  # analyzer name -> text -> [words]


# --------------------------------------------------------------------------------------------------
# The index: rank-bm25's or Lucene's scores from posting lists (retriever.py keeps its file in the
# on-disk cache)


def lucene_doc_length(n: int) -> int:
    """The passage length (tokens) Lucene's BM25 sees: the length is stored in one byte per passage
    (SmallFloat's intToByte4, decoded by byte4ToInt), exact below 40, then n - 24 rounded down to 4
    significant bits: 41 -> 40, 100 -> 96, 1000 -> 984."""
    if n < 24:  # SmallFloat's 24 "free values": small lengths are stored as they are
        return n
    x = n - 24
    shift = max(x.bit_length() - 4, 0)  # keep the 4 most significant bits of n - 24
    return 24 + (x >> shift << shift)


class SparseBM25:
    """Exact BM25 from a sparse term-document matrix [V, D] stored by term (CSR): the postings of
    word t are passages docs[indptr[t]:indptr[t+1]] (ascending), each with one float `values[i]`. A
    query adds up only the posting lists of its words. Two variants:

    "okapi": bitwise rank_bm25.BM25Okapi. values [nnz] float64 are the impacts
        idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
                                                (tf: count of t in the passage, dl: its length)
    each computed by the same float64 operations, in the same order, as BM25Okapi.get_scores. A
    query's scores are summed word by word in query order (a repeated word counts again), again as
    rank-bm25 does, so every score is the identical float; a passage without the word gets nothing
    added, where rank-bm25 adds an exact 0.0.

    "lucene": Lucene's BM25Similarity (8.x to 10.x; pyserini's scoring), in float32 as Lucene
    computes it:
        idf(t) = log(1 + (N - df + 0.5) / (df + 0.5))
                                           (N: passages with >= 1 token, df: passages holding t)
        score(t, passage) = w - w / (1 + tf * inv(dl)),  w = count of t in the query * idf(t)
        inv(dl) = 1 / (k1 * ((1 - b) + b * L(dl) / avgdl))
                                           (L: `lucene_doc_length`, avgdl: tokens / N)
    i.e. w * tf / (tf + k1 * (1 - b + b * L / avgdl)): Lucene 8 dropped rank-bm25's (k1 + 1)
    factor, a constant that changes no ranking; we drop it too, so scores are pyserini's. values
    [nnz] float32 are tf * inv(dl), idf [V] float32. A word repeated in the query is one term
    weighted by its count (Anserini's bag-of-words query); the words' float32 scores are summed in
    float64 (exact for any realistic spread of magnitudes, so their order does not matter) and the
    sum rounded to float32 once, as Lucene's disjunction scorers do.
    """

    def __init__(self, vocab: dict, indptr: np.ndarray, docs: np.ndarray, values: np.ndarray,
                 num_docs: int,
                 variant: str = "okapi", idf: np.ndarray | None = None):
        self.vocab = vocab  # word -> term id t
        # [V+1] int64, [nnz] int32, [nnz] float64/32
        self.indptr, self.docs, self.values = indptr, docs, values
        self.num_docs = num_docs  # D
        self.variant = variant  # "okapi" or "lucene"
        self.idf = idf  # [V] float32 for "lucene"; None for "okapi" (the idf is inside its values)
        # (topk.top_many's, made on first use; `prepare`'s (search, pool, cores) once it has run the
        # compiled search on this index)
        self._scratch, self._lock, self._arrays, self._ready = [], threading.Lock(), None, None

    @classmethod
    def build(cls, tokenized, k1: float = 0.9, b: float = 0.4, epsilon: float = 0.25,
              variant: str = "okapi") -> "SparseBM25":
        """Index an iterable of [D] word lists (consumed once). Needs at least one word in the
        corpus. epsilon: the okapi idf floor (rank-bm25's default); Lucene's idf is always > 0 and
        has none."""
        # term ids in order of first occurrence: the order rank-bm25 sums its idfs in
        vocab = defaultdict()
        vocab.default_factory = vocab.__len__  # an unseen word gets the next id
        tokenized, keys, tfs, doc_len = iter(tokenized), [], [], []
        while chunk := list(itertools.islice(tokenized, BUILD_CHUNK)):  # bounded memory
            lengths = list(map(len, chunk))  # [passages] tokens in each
            ids = np.fromiter(map(vocab.__getitem__, itertools.chain.from_iterable(chunk)),
                              np.int64, sum(lengths))
            doc = np.repeat(np.arange(len(doc_len), len(doc_len) + len(chunk)), lengths)  # [tokens]
            # [pairs] (word, passage) pairs and counts
            key, tf = np.unique(ids << 32 | doc, return_counts=True)
            keys.append(key)
            tfs.append(tf)
            doc_len += lengths
        D, key, tf = len(doc_len), np.concatenate(keys), np.concatenate(tfs)  # [nnz] each
        # [nnz] word, passage
        terms, doc = (key >> 32).astype(np.int32), (key & 0xFFFFFFFF).astype(np.int32)
        df = np.bincount(terms, minlength=len(vocab))  # [V] passages containing each word
        if variant == "okapi":
            values, idf = cls._okapi_impacts(terms, tf, doc, df, doc_len, k1, b, epsilon), None
        else:
            values, idf = cls._lucene_values(tf, doc, df, doc_len, k1, b)
        # each chunk is in (word, passage) order: merge them, a stable sort by word
        if len(keys) > 1:
            order = np.argsort(terms, kind="stable")  # [nnz]
            doc, values = doc[order], values[order]
        indptr = np.concatenate([[0], np.cumsum(df)])  # [V+1]
        return cls(dict(vocab), indptr, doc, values, D, variant, idf)

    @staticmethod
    def _okapi_impacts(terms, tf, doc, df, doc_len, k1, b, epsilon) -> np.ndarray:
        """[nnz] float64 rank-bm25 impacts, by BM25Okapi's own float64 operations in its order."""
        dl = np.array(doc_len)[doc]  # [nnz] int64, as rank-bm25's doc_len array
        avgdl = sum(doc_len) / len(doc_len)
        # math.log, as rank-bm25
        idf = [math.log(len(doc_len) - n + 0.5) - math.log(n + 0.5) for n in df.tolist()]
        idf_sum = 0.0
        # a plain running sum, as rank-bm25 (np.sum and Python 3.12's sum() round differently)
        for x in idf:
            idf_sum += x
        floor = epsilon * (idf_sum / len(idf))
        # [V] negative idfs floored at eps * mean idf
        idf = np.array([floor if x < 0 else x for x in idf])
        # [nnz] rank-bm25's expression, verbatim
        weight = tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
        return idf[terms] * weight  # [nnz]

    @staticmethod
    def _lucene_values(tf, doc, df, doc_len, k1, b) -> tuple[np.ndarray, np.ndarray]:
        """([nnz] tf * inv(dl), [V] idf), both float32, by BM25Similarity's operations in its order:
        its idf() and avgFieldLength() in float64 then rounded to float32, its 256-entry norm cache
        in float32."""
        doc_len = np.array(doc_len)  # [D]
        # Lucene's docCount: passages with at least one token in the field
        N = int(np.count_nonzero(doc_len))
        dfs, of_term = np.unique(df, return_inverse=True)  # each df once: far fewer than V
        # [V]
        idf = np.array([math.log(1 + (N - n + 0.5) / (n + 0.5)) for n in dfs.tolist()],
                       np.float32)[of_term]
        avgdl = np.float32(doc_len.sum() / N)  # (float) (sumTotalTermFreq / (double) docCount)
        k1, b, one = np.float32(k1), np.float32(b), np.float32(1)
        # the decoded one-byte norms
        lengths = {n: lucene_doc_length(n) for n in np.unique(doc_len).tolist()}
        # [D] exact small ints
        L = np.array([lengths[n] for n in doc_len.tolist()], dtype=np.float32)
        # [D] float32, Lucene's cache[norm] expression
        inv = one / (k1 * ((one - b) + b * L / avgdl))
        return tf.astype(np.float32) * inv[doc], idf  # [nnz] float32: Lucene's freq * normInverse

    def get_scores(self, words: list[str]) -> np.ndarray:
        """Scores [D] float64 of a tokenized query. okapi: as BM25Okapi.get_scores returns them
        (repeated words count again, unknown words add 0). lucene: Lucene's float32 scores (as
        float64), a repeated word weighted by its count: the float64 sum of the float32 term scores
        rounded to float32 once, as Lucene."""
        scores = np.zeros(self.num_docs)  # [D]
        for docs, term_scores in self._postings(words):
            scores[docs] += term_scores  # a posting list holds each passage once
        return scores if self.variant == "okapi" else scores.astype(np.float32).astype(np.float64)

    def _postings(self, words: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """[(passages [n_t] int32, term scores [n_t]) of each term t of a query (`_query_terms`), in
        the order the scores add them]: okapi its float64 values; lucene its float32 term scores w -
        w / (1 + value)."""
        terms, counts = self._query_terms(words)
        spans = [slice(self.indptr[t], self.indptr[t + 1]) for t in terms]
        if self.variant == "okapi":
            return [(self.docs[span], self.values[span]) for span in spans]
        # [terms] BM25Scorer.weight = count * idf, float32
        weights = np.array(counts, np.float32) * self.idf[terms]
        return [(self.docs[span], w - w / (np.float32(1) + self.values[span])) for span,
                w in zip(spans, weights)]

    def top(self, words: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(passages [<=k] int64, scores [<=k] float64) of a tokenized query's k best passages:
        exactly `top_k(get_scores(words), k)` and those scores, bit for bit. `top_many` of one
        query."""
        return self.top_many([words], k)[0]

    def top_many(self, queries: list[list[str]], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """[Q] (passages [<=k] int64, scores [<=k] float64) of Q tokenized queries (a turn's
        searches), each exactly `top_k(get_scores(words), k)` with those scores, bit for bit. With
        numba (NUMBA, `prepare`), topk.top_many: one compiled call per thread, one thread per CPU
        core; without, `_top_numpy` query by query. Either way a query touches only its words'
        posting lists, and all D passages when n > D / 8 (topk.py: lucene's MaxScore pruning from
        PRUNE_FROM passages, dense rows for okapi's stop words)."""
        compiled = bool(queries) and self.prepare()
        if not compiled:
            return [self._top_numpy(words, k) for words in queries]
        return topk.top_many(self, queries, k, *compiled)

    def prepare(self, say=None) -> tuple | None:
        """Get the compiled search ready for this index now rather than in its first search
        (topk.prepare: numba's compile, or its cache), once, under a process-wide lock, so that
        concurrent first searches (a threaded server) wait for one compile; `top_many` calls it.
        say: where its one line goes (default: stderr). Returns topk's (search, pool, cores), or
        None for the numpy path: NUMBA off, fewer than NUMBA_FROM passages, or a numba that cannot
        be imported or compile (one warning line; NUMBA is then False). Never raises for numba."""
        global NUMBA
        say = say or functools.partial(print, file=sys.stderr, flush=True)
        if self._ready is None and NUMBA and self.num_docs >= NUMBA_FROM:
            # one compile at a time in a process: concurrent first searches wait for it
            with topk.LOCK:
                try:
                    # (else another thread did it while this one waited)
                    if self._ready is None and NUMBA:
                        self._ready = topk.prepare(self, say)
                except (
                    Exception
                ) as err:  # noqa: BLE001 (ImportError, numba's own errors: the numpy path is exact)
                    NUMBA, why = False, (str(err).strip().splitlines() or [""])[0][:200]
                    say(f"warning: numba is installed but cannot run ({type(err).__name__}: "
                        f"{why}); BM25 searches "
                        "with numpy instead, the same hits and scores (or: pip install "
                        "--force-reinstall numba)")
        return self._ready if NUMBA and self.num_docs >= NUMBA_FROM else None

    def _shares(self, qptr: np.ndarray, qwords: np.ndarray, threads: int) -> list[np.ndarray]:
        """Each of `threads` threads' queries ([T] int64 arrays): below BALANCE_FROM passages t, t +
        T, ...; from it, by their postings, most first, dealt 0, 1, ..., T-1, T-1, ..., 0, 0, ...
        (1M and 100K lucene batches: 17% faster; t, t + T, ... gave a thread up to 1.33x an equal
        share there; at 13,823 dealing cost 2-6%)."""
        # (below, a query's cost is more its pass over all D)
        if threads == 1 or self.num_docs < BALANCE_FROM:
            return [np.arange(t, len(qptr) - 1, threads) for t in range(threads)]
        # [words]
        postings = np.where(qwords >= 0, self.indptr[qwords + 1] - self.indptr[qwords], 0)
        cum = np.concatenate([[0], np.cumsum(postings)])
        order = np.argsort(cum[qptr[:-1]] - cum[qptr[1:]], kind="stable")  # [Q] most postings first
        lane, rnd = np.arange(len(order)) % threads, np.arange(len(order)) // threads
        # [Q] 0, 1, 1, 0, 0, 1, ... for 2 threads
        thread = np.where(rnd % 2 == 0, lane, threads - 1 - lane)
        return [order[thread == t] for t in range(threads)]

    def _search_arrays(self) -> tuple:
        """topk.search_queries' index arguments, made on the first search: indptr, docs, values,
        count1 [nnz] (lucene: the term scores at count 1, most query words, by _postings' float32
        operations; okapi: values), idf (okapi: values, unused), maxv [V] (each word's largest
        value: its term score's bound), prune (lucene from PRUNE_FROM passages, all values > 0),
        row_of [V] and rows [R, D] float64 (count1 of each word in more than half the passages as a
        dense row, 0.0 where absent; okapi's stop words: 8 rows on our QA bundle, 8 bytes a passage
        each)."""
        count1 = idf = self.values
        if self.variant == "lucene":
            w, idf = np.repeat(self.idf, np.diff(self.indptr)), self.idf
            count1 = w - w / (np.float32(1) + self.values)
        prune = (
            self.variant == "lucene" and self.num_docs >= PRUNE_FROM and bool(self.values.min() > 0)
        )
        # [V] (an index we built has no empty list)
        full = np.diff(self.indptr) > 0 if prune else np.zeros(0, bool)
        # [V] pruning's bounds ([0]: not pruning, unused)
        maxv = np.zeros(len(full), self.values.dtype)
        maxv[full] = np.maximum.reduceat(self.values, self.indptr[:-1][full]) if full.any() else 0
        # [R] words in over half the passages
        common = np.flatnonzero(np.diff(self.indptr) * 2 > self.num_docs)
        row_of, rows = np.full(len(self.indptr) - 1, -1,
                               np.int64), np.zeros((len(common), self.num_docs))
        row_of[common] = np.arange(len(common))
        for row, t in zip(rows, common):
            row[self.docs[self.indptr[t] : self.indptr[t + 1]]] = count1[
                self.indptr[t] : self.indptr[t + 1]
            ]
        self._arrays = (self.indptr, self.docs, self.values, count1, idf, maxv, prune, row_of, rows)
        return self._arrays

    def _query_terms(self, words: list[str]) -> tuple[list[int], list[int]]:
        """(term ids, counts) of a query as the scores add them up: okapi every known word again in
        query order (rank-bm25's sum; counts 1), lucene each distinct word once in first-occurrence
        order with its count (the weight count * idf in float32: Anserini's bag of words,
        BM25Scorer.weight)."""
        terms = [t for t in map(self.vocab.get, words) if t is not None]
        # (most questions repeat no word)
        if self.variant == "okapi" or len(set(terms)) == len(terms):
            return terms, [1] * len(terms)
        counts = dict.fromkeys(terms, 0)  # term id -> count, in first-occurrence order
        for t in terms:
            counts[t] += 1
        return list(counts), list(counts.values())

    def _top_numpy(self, words: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """`top` in numpy (the path without numba): (passages [<=k] int, scores [<=k] float64),
        exactly `top_k(get_scores(words), k)` and those scores, bit for bit, but from the query's
        posting lists alone when they are short: O(n log n) in the n postings the query touches (a
        name: tens to hundreds) instead of O(D). Each candidate's terms are added in get_scores'
        order (np.bincount adds its weights in input order, from 0.0), so every score is the same
        float. When n > D / 8 the dense path (get_scores) is the cheaper one."""
        terms = self._query_terms(words)[0]
        if sum(int(self.indptr[t + 1] - self.indptr[t]) for t in terms) * 8 > self.num_docs:
            scores = self.get_scores(words)  # [D]
            order = top_k(scores, k)
            return order, scores[order]
        if not terms:
            return np.zeros(0, np.int64), np.zeros(0)
        docs, term_scores = zip(*self._postings(words))  # each [n_t], word after word
        # [c] passages, ascending; [n] their slots
        cand, slot = np.unique(np.concatenate(docs), return_inverse=True)
        # [c]
        sums = np.bincount(slot, weights=np.concatenate(term_scores).astype(np.float64),
                           minlength=len(cand))
        if self.variant == "lucene":
            # rounded to float32 once, as get_scores
            sums = sums.astype(np.float32).astype(np.float64)
        order = top_k(sums, k)  # positions in cand: ties by position = by passage order
        return cand[order], sums[order]


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the <= k best scores > 0, best first, ties by passage order: the first k of a
    stable descending argsort, without sorting all D scores (np.partition finds the k-th best, then
    only the survivors are sorted)."""
    # [n] ascending passage index; NOTE(P38): Anserini ties by id string
    cand = np.flatnonzero(scores > 0)
    if len(cand) > k:
        kth = np.partition(scores[cand], len(cand) - k)[len(cand) - k]  # the k-th largest score
        cand = cand[scores[cand] >= kth]  # keeps every passage tied with it, still in passage order
    return cand[np.argsort(-scores[cand], kind="stable")[:k]]


# --------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    question = "Who founded the X-Men's comics?"
    # ['who', 'found', 'x', 'men', 'comic']   lucene: stop word out, Porter stems
    print(english_analyze(question))
    # ['who', 'founded', 'the', 'x', 'men', 's', 'comics']   okapi: lower-cased \\w+ words
    print(tokenize(question))
    passages = ["Paris is the capital of France.", "Berlin is the capital of Germany.",
                "An apple is a fruit."]
    for variant in BM25_VARIANTS:
        analyze = ANALYZERS[DEFAULT_ANALYZER[variant]]
        index = SparseBM25.build(map(analyze, passages), variant=variant)
        order, scores = index.top(analyze("capital of France"), 3)
        print(variant, order.tolist(), [round(s, 4) for s in scores.tolist()])
    # lucene [0, 1] [0.7459, 0.2416]   "of" is a stop word: passage 0 holds capit + franc,
    #                                  passage 1 capit
    # okapi [0, 1] [0.5303, 0.0251]    "capital" and "of" (in 2 of 3 passages) count at the
    #                                  floored idf
