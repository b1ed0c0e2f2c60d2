"""The BM25 index: a corpus's words in posting lists (`SparseBM25`), scored as Lucene or as rank-bm25 scores them.

A passage's text becomes words through an analyzer (`ANALYZERS`); `SparseBM25.build` stores, for each word, the
passages that hold it (its posting list) with each one's precomputed term score, so a query adds up only the posting
lists of its words. retriever.BM25Retriever searches with it, and caches each built index on disk
(`index_cache_file`). Two variants (`BM25_VARIANTS`, train.py and evaluate.py `--bm25`; SparseBM25 has the formulas):
  * "lucene" (default): what Search-R1's BM25 baseline runs, pyserini's LuceneSearcher over wiki-18 with Anserini's
    defaults: Lucene's BM25Similarity (idf ln(1 + (N - df + 0.5) / (df + 0.5)), k1=0.9, b=0.4, no (k1 + 1) factor, in
    float32) over Lucene's English analysis (UAX #29 words, possessive 's removed, lower-cased, 33 stop words, Porter
    stems; `english_analyze`), a repeated query word weighted by its count (Anserini's bag-of-words query). Matched:
    the float32 arithmetic step by step, the passage length as Lucene stores it, in one byte (SmallFloat: exact below
    40 tokens, 4 significant bits above; `lucene_doc_length`), N counting only passages with a word (Lucene's
    docCount), Java's letter-by-letter lower-casing, the 255-character word limit. tests/test_bm25.py checks words and
    scores against Lucene 8.7 itself; docs/retrieval.md gives the agreement measured on a 13,823-passage corpus.
  * "okapi": rank-bm25's BM25Okapi (ATIRE idf ln((N - df + 0.5) / (df + 0.5)), negative idfs floored at 0.25 * mean
    idf, (k1 + 1) factor) over lower-cased \\w+ words (`tokenize`), bitwise rank-bm25's floats. It is not Lucene at
    all (no stemming, no stop words, another idf), and finds fewer supporting passages in the top 3
    (benchmarks/bench_retrieval.py).

Departures from Search-R1's BM25 (pyserini; numbered, NOTE(departure) marks the lines):
  1. "lucene" splits words by the regex module's Unicode tables (UAX #29), Lucene by those its StandardTokenizer was
     generated from (older ones; pyserini's Lucene 9 has others again): alone between spaces, 30,115 of the 1,112,064
     code points are treated differently by Lucene 8.7, mostly letters encoded since and symbols reclassified since;
     in our development corpus, only the music signs ♭ ♮ ♯ (Lucene 8.7 makes words of them, we drop them). Flag
     and keycap emoji sequences are not words here; words over 255 characters are cut by code points, not UTF-16
     units. Java's Math.log may differ from C's log in the last bit of a float64, which the float32 idf then hides
     almost always.
  2. Ties are broken by passage order (`top_k`), Anserini's by the passage id string.

Shapes: D = passages in the corpus, V = distinct words, nnz = (word, passage) pairs; `scores` is [D] per query.

Run `python bm25.py` for a demo: both analyzers on one question, both variants' top passages of a 3-passage corpus.
"""

import functools
import hashlib
import importlib.metadata
import json
import math
import os
import pickle
import re
import unicodedata
import zipfile
from array import array
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import regex

BM25_VARIANTS = ("lucene", "okapi")  # --bm25 choices, the default first (SparseBM25 says what each computes)
DEFAULT_ANALYZER = {"lucene": "english", "okapi": "words"}  # each variant's analyzer (ANALYZERS, below)
INDEX_VERSION = 2  # part of the cache key: bump it when SparseBM25's arrays change meaning


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


# ----------------------------------------------------------------------------------------------------------------------
# The index: rank-bm25's or Lucene's scores from posting lists, and its file in the on-disk cache


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

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:12]

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
    cand = np.flatnonzero(scores > 0)  # [n] ascending passage index; NOTE(departure 2): Anserini ties by id string
    if len(cand) > k:
        kth = np.partition(scores[cand], len(cand) - k)[len(cand) - k]  # the k-th largest score
        cand = cand[scores[cand] >= kth]  # keeps every passage tied with it, still in passage order
    return cand[np.argsort(-scores[cand], kind="stable")[:k]]


# ----------------------------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    question = "Who founded the X-Men's comics?"
    print(english_analyze(question))  # ['who', 'found', 'x', 'men', 'comic']   lucene: stop word out, Porter stems
    print(tokenize(question))  # ['who', 'founded', 'the', 'x', 'men', 's', 'comics']   okapi: lower-cased \\w+ words
    passages = ["Paris is the capital of France.", "Berlin is the capital of Germany.", "An apple is a fruit."]
    for variant in BM25_VARIANTS:
        analyze = ANALYZERS[DEFAULT_ANALYZER[variant]]
        index = SparseBM25.build(map(analyze, passages), variant=variant)
        order, scores = index.top(analyze("capital of France"), 3)
        print(variant, order.tolist(), [round(s, 4) for s in scores.tolist()])
    # lucene [0, 1] [0.7459, 0.2416]   "of" is a stop word: passage 0 holds capit + franc, passage 1 capit
    # okapi [0, 1] [0.5303, 0.0251]    "capital" and "of" (in 2 of 3 passages) count at the floored idf
