"""Tests for bm25.py: the index against a plain-loop Okapi (rank-bm25's formula) and a plain-loop Lucene BM25 (and
against Lucene itself, where it is installed), the analyzers, the one-byte passage length, the sparse engine bitwise
against rank-bm25, and the posting-list top-k against the dense one. CPU only, no network. The real passages and
questions are tests/fixtures/qa_sample: 600 passages and 200 questions of a HotpotQA + MuSiQue bundle (its README says
which).

Scores are compared bitwise (lines marked `# exact:`, see tests/test_float_compare.py) where bit for bit is the claim:
Lucene's float32 scores, rank-bm25's float64 ones, SparseBM25.top against the dense path, ties. bm25.py computes them in
elementwise IEEE operations and math.log, in a fixed order, with no vectorised reduction, so no CPU rounds them
differently; and a tolerance would let the "float64" mistake of test_lucene_reference_tells_wrong_formulas_apart pass
(it moves scores by a float32 ulp). The plain-loop Okapi reference (other arithmetic) is compared to 1e-6."""

import base64
import json
import math
import random
import re
import shutil
import struct
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import hang  # noqa: E402
from machinery import bm25  # noqa: E402
from machinery.bm25 import (  # noqa: E402
    BM25_VARIANTS, LUCENE_STOP_WORDS, SparseBM25, english_analyze, java_lower, lucene_doc_length, standard_tokenize,
    tokenize, top_k, uax29_tokenize,
)
from machinery.data import DEMO_CORPUS, load_corpus  # noqa: E402
from retriever import BM25Retriever  # noqa: E402
from conftest import (LUCENE_QUERIES, LUCENE_TOY, QA_SAMPLE, TOY, brute_force_bm25,  # noqa: E402, F401
                      brute_force_stats)




# --- against the brute-force reference (conftest.brute_force_bm25: the Okapi formula in plain loops) ---






def brute_force_topk(corpus, query, k, **kw):
    scores = brute_force_bm25(corpus, query, **kw)
    order = sorted(range(len(corpus)), key=lambda i: -scores[i])  # sorted() is stable: ties keep passage order
    return [(corpus[i]["id"], scores[i]) for i in order if scores[i] > 0][:k]


def assert_matches_brute_force(retriever, corpus, queries, k, **kw):
    stats = brute_force_stats(corpus)
    for query, hits in zip(queries, retriever.search(queries, topk=k), strict=True):
        expected = brute_force_topk(corpus, query, k, stats=stats, **kw)
        assert [h["document"]["id"] for h in hits] == [i for i, _ in expected], query
        for hit, (_, score) in zip(hits, expected):
            assert hit["score"] == pytest.approx(score, abs=1e-6), query


@pytest.fixture(scope="module")
def real():
    """(corpus, okapi retriever) over the 600 real passages, built once."""
    corpus = load_corpus(QA_SAMPLE / "corpus.jsonl")
    return corpus, BM25Retriever(corpus, bm25="okapi")


# --- BM25 == brute force ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k1,b", [(0.9, 0.4), (1.5, 0.75)])
def test_topk_matches_brute_force_toy(k1, b):
    queries = ["capital of France", "Paris", "Lyon Rhone", "city city city", "is the a", "Troy Helen Paris", "zebra"]
    retriever = BM25Retriever(TOY, k1=k1, b=b, bm25="okapi")
    for k in (1, 3, len(TOY) + 5):
        assert_matches_brute_force(retriever, TOY, queries, k, k1=k1, b=b)
    hits = retriever.search(["Lyon"], topk=5)[0]  # duplicate passages tie: the earlier one comes first
    assert [h["document"]["id"] for h in hits] == ["b", "g"] and hits[0]["score"] == hits[1]["score"]  # exact: a tie


def test_topk_matches_brute_force_real_corpus(real):
    corpus, retriever = real
    with open(QA_SAMPLE / "hotpotqa_test.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line)["question"] for line in f][:20]
    assert_matches_brute_force(retriever, corpus, queries, k=5)


# --- the sparse engine: bitwise rank-bm25 -----------------------------------------------------------------------------


def real_questions(n):
    """n real questions, round-robin over the question files of the sample (every dataset represented)."""
    files = [[json.loads(line)["question"] for line in open(f, encoding="utf-8")]
             for f in sorted(QA_SAMPLE.glob("*.jsonl")) if f.name != "corpus.jsonl"]
    return [q for group in zip(*files) for q in group][:n]


def rank_bm25_topk(bm25, query, k, word_scores):
    """The reference top-k from rank-bm25's own arithmetic and a full stable argsort (as the retriever ranked before
    the sparse engine). BM25Okapi.get_scores(words) is, by its code, `score += contribution(w)` for w in words from 0,
    and contribution(w) is get_batch_scores([w], passages containing w) there and 0.0 elsewhere: the same float64
    expression. Caching contributions per word keeps 200 queries fast; the bitwise get_scores check below backs it."""
    if "postings" not in word_scores:  # word -> passages containing it, from rank-bm25's own term counts
        word_scores["postings"] = {}
        for d, freqs in enumerate(bm25.doc_freqs):
            for w in freqs:
                word_scores["postings"].setdefault(w, []).append(d)
    scores = np.zeros(bm25.corpus_size)  # [D]
    for w in re.findall(r"\w+", query.lower()):
        if w not in word_scores:
            word_scores[w] = np.zeros(bm25.corpus_size)
            docs = word_scores["postings"].get(w, [])
            if docs:
                word_scores[w][docs] = bm25.get_batch_scores([w], docs)
        scores += word_scores[w]
    order = np.argsort(-scores, kind="stable")[:k]
    return [(str(i), float(scores[i])) for i in order if scores[i] > 0]


def test_sparse_equals_rank_bm25_real_corpus_200_queries(real):
    corpus, reference = real  # 600 passages: engine "auto" is rank_bm25 here
    assert reference.engine == "rank_bm25"
    sparse = BM25Retriever(corpus, engine="sparse", bm25="okapi")
    queries = real_questions(200)
    assert len(set(queries)) == 200
    word_scores = {}
    for query, hits in zip(queries, sparse.search(queries, topk=5), strict=True):
        expected = rank_bm25_topk(reference.bm25, query, 5, word_scores)
        assert [(h["document"]["id"], h["score"]) for h in hits] == expected, query  # exact: ids, order, scores
    for query in queries[:5]:  # and the whole score vector, bitwise, straight from BM25Okapi.get_scores (slow)
        assert np.array_equal(sparse.bm25.get_scores(tokenize(query)),  # exact: bitwise, the module docstring
                              reference.bm25.get_scores(tokenize(query)))


NEGATIVE_IDF = [{"id": str(i), "contents": c} for i, c in enumerate(["a b", "a c", "a b c a"])]  # mean idf < 0


@pytest.mark.parametrize("corpus", [TOY, NEGATIVE_IDF])
def test_sparse_scores_bitwise_on_toy_corpora(corpus):
    """TOY, and a corpus whose mean idf is < 0 (floored idfs, negative scores): every score vector is identical."""
    ref = BM25Retriever(corpus, engine="rank_bm25", bm25="okapi")
    fast = BM25Retriever(corpus, engine="sparse", bm25="okapi")
    for query in ("France capital city", "Paris Paris capital", "a", "a b c", "b b", "zebra", "Lyon Rhone"):
        assert np.array_equal(ref.bm25.get_scores(tokenize(query)),  # exact: bitwise, the module docstring
                              fast.bm25.get_scores(tokenize(query))), query
        assert ref.search([query], 10) == fast.search([query], 10)  # exact: bitwise


@pytest.mark.parametrize("engine", ["rank_bm25", "sparse"])
def test_bad_input_and_ties_both_engines(engine):
    retriever = BM25Retriever(TOY, engine=engine, bm25="okapi")
    assert retriever.search(["", "   \n\t", "?!", "zebra xylophone"], topk=3) == [[], [], [], []]  # no crash, no hits
    everything = retriever.search(["is the of a"], topk=100)[0]  # topk > corpus: every passage with a query word
    assert len(everything) == sum(s > 0 for s in brute_force_bm25(TOY, "is the of a")) < 100
    lyon = retriever.search(["Lyon Rhone"], topk=2)[0]  # "b" and "g" are the same passage: a tie, kept in order
    assert [h["document"]["id"] for h in lyon] == ["b", "g"] and lyon[0]["score"] == lyon[1]["score"]  # exact: tie
    assert_matches_brute_force(retriever, TOY, ["France capital city", "Paris Paris Troy", "Rhone"], k=4)
    with pytest.raises(ValueError, match="topk"):
        retriever.search(["Paris"], topk=0)
    with pytest.raises(ValueError, match="engine"):
        BM25Retriever(TOY, engine="faiss")
    with pytest.raises(ValueError, match="no word tokens"):
        BM25Retriever([{"id": "0", "contents": "?!"}], engine=engine, bm25="okapi")


# --- --bm25 lucene: Lucene's English analyzer and BM25Similarity ----------------------------------------------------
# Expected words and scores marked "Lucene 8.7" were printed by Lucene itself (Debian's liblucene8-java 8.7.0: a
# StandardTokenizer -> EnglishPossessiveFilter -> LowerCaseFilter -> StopFilter(ENGLISH_STOP_WORDS_SET) ->
# PorterStemFilter chain, i.e. Anserini's DefaultEnglishAnalyzer, and BM25Similarity(0.9f, 0.4f) over a one-segment
# index with Anserini's bag-of-words query); LUCENE_JAVA below is the program, test_lucene_itself_* reruns it.

LUCENE_ANALYZED = [  # (text, Lucene 8.7's StandardTokenizer tokens, its English analyzer's words)
    ("O'Neil's dog’s DOGS＇S U.S. e-mail 3.14 1,000 a:b foo_bar don't",
     ["O'Neil's", "dog’s", "DOGS＇S", "U.S", "e", "mail", "3.14", "1,000", "a:b", "foo_bar", "don't"],
     ["o'neil", "dog", "dog", "u.", "e", "mail", "3.14", "1,000", "a:b", "foo_bar", "don't"]),
    ("Who founded the X-Men's comics?", ["Who", "founded", "the", "X", "Men's", "comics"],
     ["who", "found", "x", "men", "comic"]),
    ("İSTANBUL ΣΊΣΥΦΟΣ Ströme naïve café", ["İSTANBUL", "ΣΊΣΥΦΟΣ", "Ströme", "naïve", "café"],
     ["istanbul", "σίσυφοσ", "ströme", "naïv", "café"]),
    ("日本語のテキスト カタカナ ภาษาไทย 한국어 © ™ 😀",
     ["日", "本", "語", "の", "テキスト", "カタカナ", "ภาษาไทย", "한국어", "©", "™", "😀"],
     ["日", "本", "語", "の", "テキスト", "カタカナ", "ภาษาไทย", "한국어", "©", "™", "😀"]),
    ("To be, or not to be: that is the question.",
     ["To", "be", "or", "not", "to", "be", "that", "is", "the", "question"], ["question"]),
    ("The archaeology and anthology of possibly assembled assemblies",
     ["The", "archaeology", "and", "anthology", "of", "possibly", "assembled", "assemblies"],
     ["archaeolog", "antholog", "possibl", "assembl", "assembl"]),  # Porter's reference code: "logi"/"bli" rules
    ("as us is ms 1s 2s flies dying agreed conditional relational hopping",
     ["as", "us", "is", "ms", "1s", "2s", "flies", "dying", "agreed", "conditional", "relational", "hopping"],
     ["us", "ms", "1s", "2s", "fli", "dy", "agre", "condit", "relat", "hop"]),  # 2-letter words are not stemmed
]


@pytest.mark.parametrize("text, tokens, words", LUCENE_ANALYZED)
def test_english_analyzer_matches_lucene(text, tokens, words):
    assert standard_tokenize(text) == tokens
    assert english_analyze(text) == words


def test_english_analyzer_parts():
    assert len(LUCENE_STOP_WORDS) == 33 and {"the", "a", "of", "it", "with"} <= LUCENE_STOP_WORDS
    assert "who" not in LUCENE_STOP_WORDS and "its" not in LUCENE_STOP_WORDS
    assert english_analyze("Its") == ["it"]  # stop words go before stemming: "its" stems to "it", which stays
    assert english_analyze("Paris's PARIS'S Paris’s Paris") == ["pari"] * 4  # possessive, lower-case, stem
    assert english_analyze("it's 's") == ["s"]  # "it's" -> the stop word "it"; "'s" alone: "'" is no word, "s" is
    assert java_lower("İSTANBUL") == "istanbul" != "İSTANBUL".lower()  # Java: one letter for one letter
    assert java_lower("ΟΔΟΣ") == "οδοσ" != "ΟΔΟΣ".lower()  # no final sigma in Java's Character.toLowerCase
    assert java_lower("Straße ÉTÉ") == "straße été"
    assert standard_tokenize("x" * 600) == ["x" * 255, "x" * 255, "x" * 90]  # StandardTokenizer's maxTokenLength
    assert english_analyze("") == english_analyze(" ?! -- ") == english_analyze("The of, and to!") == []
    assert tokenize("Who founded X-Men's?") == ["who", "founded", "x", "men", "s"]  # the okapi ("words") analyzer


def sample_texts() -> list[str]:
    """Every passage and question of tests/fixtures/qa_sample (real text: 600 passages, 200 questions)."""
    return [r["contents"] for r in load_corpus(QA_SAMPLE / "corpus.jsonl")] + real_questions(200)


def test_fast_tokenizer_gives_the_unicode_words():
    """standard_tokenize (Python's re on ASCII, the regex module on pieces with other characters) gives the words of
    uax29_tokenize (the regex module's UAX #29 boundaries alone) on real text and on 20,000 fuzzed strings, dense in
    what the fast path must get right: ASCII words joined across : . ' , ; (U.S., 3.14, 1,000, it's), "_", spaces and
    control characters, and non-ASCII letters, combining marks, joiners and format characters, also right after a
    space, where UAX #29 binds them to it."""
    rng = np.random.default_rng(0)
    ascii_parts = list("abcXYZ019_:.',;-/ \t\n\r\x0b\x0c\x1c\"!?()") + ["U.S.", "1,0", "it's", "a:b", "3.14", "__"]
    other = ["é", "\u0301", "\u0300", "\u200d", "\u00ad", "\u00a0", "\u2019", "\u2018", "\u4e2d", "\u0e01\u0e02",
             "\U0001f600", "\U0001f44d\U0001f3fd", "\uff53", "\u2060", "\u0663", "\u3000", "\u2028", "\x85", "\u00df",
             "\u0130", "\u05d0", "\u05f3", "\u30ab\u30fc", "\u200b", "\ufeff", "\U0001f1eb\U0001f1f7", "\uff0e", "\u2024"]
    texts = sample_texts()
    for i in range(20_000):
        parts = ascii_parts if i % 2 else ascii_parts + other
        texts.append("".join(parts[j] for j in rng.integers(0, len(parts), size=rng.integers(0, 30))))
    assert sum(t.isascii() for t in texts) > 10_000 and sum(not t.isascii() for t in texts) > 8_000
    for text in texts:
        assert standard_tokenize(text) == uax29_tokenize(text), repr(text)


def test_fast_stemmer_gives_martin_porters_stems():
    """bm25._porter_stem (PyStemmer's Snowball "porter" where it agrees with Martin Porter's code, NLTK's
    MARTIN_EXTENSIONS elsewhere) gives NLTK's stem for every word of the real sample and 20,000 fuzzed words built
    from Porter's suffixes (those where the two algorithms differ, -bli -logi, double consonants, 1-2 letters,
    among them), half of them with digits, accented letters and punctuation; without PyStemmer, _porter_stem is
    NLTK's alone."""
    from nltk.stem.porter import PorterStemmer

    martin = PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS)
    stem = bm25._porter_stem()
    words = {java_lower(w) for t in sample_texts() for w in standard_tokenize(t)}
    rng = random.Random(0)
    suffixes = ("ing ed ation ational izer bli logi alli entli eli ousli ization ator alism iveness fulness ousness "
                "aliti iviti biliti icate ative alize iciti ical ful ness al ance ence er ic able ible ant ement ment "
                "ent ion sion tion ou ism ate iti ous ive ize s ss ies sses eed y e ll l abli ly li ey ying ied").split()
    for i in range(20_000):  # half with digits, accents and marks, which both algorithms take for consonants
        consonants = "bcdfghjklmnpqrstvwxyz" + ("0189\u00e9\u00f8\u0142\u0438._'" if i % 2 else "")
        stem_part = "".join(rng.choice(consonants) * rng.choice([1, 1, 2]) + rng.choice("aeiouy") for _ in range(3))
        words.add(stem_part[:rng.randrange(7)] + "".join(rng.choices(suffixes, k=rng.randrange(3))))
    words.discard("")
    assert len(words) > 10_000
    assert [w for w in words if stem(w) != martin.stem(w, to_lowercase=False)] == []
    bm25._porter_stem.cache_clear()
    real_find_spec = bm25.importlib.util.find_spec
    try:
        bm25.importlib.util.find_spec = lambda name: None if name == "Stemmer" else real_find_spec(name)
        assert bm25._porter_stem()("relational") == "relat"  # NLTK alone
    finally:
        bm25.importlib.util.find_spec = real_find_spec
        bm25._porter_stem.cache_clear()


def test_english_analyzer_forgets_words_past_its_bound(monkeypatch):
    """english_analyze remembers at most MAX_CACHED_WORDS analyzed words (then starts afresh), with the same words."""
    texts = sample_texts()[:100]
    expected = [english_analyze(t) for t in texts]
    monkeypatch.setattr(bm25, "MAX_CACHED_WORDS", 50)
    bm25._ENGLISH_WORDS.clear()
    assert [english_analyze(t) for t in texts] == expected
    assert 0 < len(bm25._ENGLISH_WORDS) <= 50


def int_to_byte4(i: int) -> int:
    """Lucene's SmallFloat.intToByte4, written out from its definition: values below NUM_FREE_VALUES = 24 stand for
    themselves; above, longToInt4(i - 24) keeps 4 significant bits (3 stored, 1 implicit) and the bit shift + 1."""
    if i < 24:
        return i
    i -= 24
    num_bits = i.bit_length()
    if num_bits < 4:
        return 24 + i  # "subnormal"
    shift = num_bits - 4
    return 24 + (((i >> shift) & 0x07) | ((shift + 1) << 3))


def byte4_to_int(byte: int) -> int:
    """Lucene's SmallFloat.byte4ToInt (via int4ToLong)."""
    if byte < 24:
        return byte
    i = byte - 24
    bits, shift = i & 0x07, (i >> 3) - 1
    return 24 + (bits if shift == -1 else (bits | 0x08) << shift)


@pytest.mark.parametrize("variant", BM25_VARIANTS)
def test_build_in_chunks_is_the_build_in_one(variant, monkeypatch):
    """SparseBM25.build counts words BUILD_CHUNK passages at a time (each chunk sorted by word, then merged): 600 real
    passages in chunks of 7 give the same arrays, byte for byte, as in one chunk."""
    analyze = bm25.ANALYZERS[bm25.DEFAULT_ANALYZER[variant]]
    words = [analyze(r["contents"]) for r in load_corpus(QA_SAMPLE / "corpus.jsonl")]
    whole = SparseBM25.build(words, variant=variant)
    monkeypatch.setattr(bm25, "BUILD_CHUNK", 7)
    chunked = SparseBM25.build(iter(words), variant=variant)
    assert list(chunked.vocab.items()) == list(whole.vocab.items())
    for name in ("indptr", "docs", "values", "idf"):
        a, b = getattr(chunked, name), getattr(whole, name)
        assert (a is None and b is None) or (a.dtype == b.dtype and a.tobytes() == b.tobytes()), name


def test_lucene_doc_length_is_smallfloat():
    """The passage length Lucene's BM25 sees is stored in one byte: exact below 24 (and up to 39), then 4 significant
    bits of length - 24, rounded down."""
    assert [lucene_doc_length(n) for n in (0, 1, 23, 24, 31, 39, 40, 41, 42, 43, 100, 1000)] == \
        [0, 1, 23, 24, 31, 39, 40, 40, 42, 42, 96, 984]
    for n in list(range(5000)) + [10**5 + 7, 10**6 + 3, 2**31 - 1]:
        assert lucene_doc_length(n) == byte4_to_int(int_to_byte4(n)), n
    assert int_to_byte4(2**31 - 1) == 255  # the longest passage still fits the byte


# A corpus for the Lucene tests: TOY, a passage of 43 words whose one-byte length reads 42 (passage "h"), and one of
# stop words only, which Lucene leaves out of N (passage "i").
LUCENE_TOY_HITS = {  # Lucene 8.7's hits on LUCENE_TOY, best first (ties by passage order), float32 scores in hex
    "capital of France": [("a", "0x1.20a8bep+0"), ("c", "0x1.769ba6p-1"), ("b", "0x1.9db86ap-2"),
                          ("g", "0x1.9db86ap-2"), ("d", "0x1.8d7282p-2")],
    "Paris": [("a", "0x1.dcd8a8p-1"), ("f", "0x1.d6d5a8p-1")],
    "Lyon Rhone": [("b", "0x1.197f9ep+0"), ("g", "0x1.197f9ep+0"), ("h", "0x1.74ac24p-1"), ("d", "0x1.fd8fe6p-2")],
    "city city city": [("b", "0x1.a6cad0p+0"), ("g", "0x1.a6cad0p+0"), ("a", "0x1.9e4f7ap+0")],
    "is the a": [],
    "Troy Helen Paris": [("f", "0x1.9ac824p+1"), ("a", "0x1.dcd8a8p-1")],
    "zebra": [],
    "Rhone's source glaciers": [("h", "0x1.9a6800p+0"), ("d", "0x1.fd8fe6p-2"), ("b", "0x1.9db86ap-2"),
                                ("g", "0x1.9db86ap-2")],
    "rivers flowing through France": [("h", "0x1.113e06p+1"), ("d", "0x1.d29a3ep+0"), ("b", "0x1.9db86ap-2"),
                                      ("g", "0x1.9db86ap-2"), ("a", "0x1.956bacp-2")],
    "U.S. 813 km": [("h", "0x1.c863ccp+0")],
    "Paris Paris capital": [("a", "0x1.4c133ep+1"), ("f", "0x1.d6d5a8p+0"), ("c", "0x1.769ba6p-1")],
}
LUCENE_TOY_HITS = {q: [(i, float.fromhex(x)) for i, x in hits] for q, hits in LUCENE_TOY_HITS.items()}


def test_lucene_scores_are_lucene_8_7s_on_toy():
    """Ids, order and float32 scores, bitwise, for every hit; the long passage "h" is scored with its one-byte length
    (42, not 43) and N leaves out the stop-word passage "i" (without either, "h"'s scores change)."""
    retriever = BM25Retriever(LUCENE_TOY)
    assert (retriever.variant, retriever.analyzer, retriever.engine) == ("lucene", "english", "sparse")
    for query, hits in zip(LUCENE_QUERIES, retriever.search(LUCENE_QUERIES, topk=20), strict=True):
        assert [(h["document"]["id"], h["score"]) for h in hits] == LUCENE_TOY_HITS[query], query  # exact: bitwise


def test_lucene_hand_computed_scores():
    """DEMO_CORPUS by hand: "capital of France" -> words capit, franc (each in 2 of the 5 passages, so idf = ln(1 +
    3.5/2.5) = ln 2.4); passage lengths 4, 4, 6, 6, 3 words (avgdl 23/5); tf part tf / (tf + 0.9 * (0.6 + 0.4 * dl /
    avgdl)), no (k1 + 1). "Paris Paris capital": pari is one term with boost 2 and tf 2 in "Paris"."""
    idf = math.log(2.4)  # 0.87547

    def part(tf, dl):
        return tf / (tf + 0.9 * (0.6 + 0.4 * dl / 4.6))

    retriever = BM25Retriever(DEMO_CORPUS)
    assert [english_analyze(r["contents"]) for r in DEMO_CORPUS][0] == ["pari", "pari", "capit", "franc"]
    hits = retriever.search(["capital of France", "Paris Paris capital"], topk=5)
    expected = [[("0", 2 * idf * part(1, 4)), ("1", idf * part(1, 4)), ("2", idf * part(1, 6))],  # .94490 .47245 .43565
                [("0", 2 * idf * part(2, 4) + idf * part(1, 4)), ("2", 2 * idf * part(1, 6)), ("1", idf * part(1, 4))]]
    for got, want in zip(hits, expected, strict=True):
        assert [h["document"]["id"] for h in got] == [i for i, _ in want]
        assert [h["score"] for h in got] == pytest.approx([s for _, s in want], rel=1e-6)  # float32 rounding
    assert hits[0][0]["score"] == pytest.approx(0.9448982, rel=1e-6)


# --- a plain-Python Lucene BM25, written from BM25Similarity's formulas, passage by passage --------------------------


def f32(x: float) -> float:
    """x rounded to the nearest float32 (struct packs with round-half-even): applied after each float64 operation on
    float32 inputs, it gives exactly Java's float result (float64 holds > 2 * 24 + 2 bits)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def brute_force_lucene_stats(corpus, analyze=english_analyze):
    """Per-passage word counts and lengths, N (passages with a word), df and the float32 avgdl, with plain loops."""
    docs = [analyze(row["contents"]) for row in corpus]
    n = sum(1 for d in docs if d)
    df = Counter(w for d in docs for w in set(d))
    return [Counter(d) for d in docs], [len(d) for d in docs], n, df, f32(sum(map(len, docs)) / n)


def brute_force_lucene(corpus, query, k1=0.9, b=0.4, stats=None, wrong=None):
    """Scores [D] of Lucene's BM25Similarity in float32, one passage at a time: for each distinct query word w with
    count c, idf = f32(ln(1 + (N - df + 0.5) / (df + 0.5))), weight = f32(c * idf), inv = 1 / (k1 * ((1 - b) + b *
    L(dl) / avgdl)) in float32 steps, score = weight - weight / (1 + tf * inv); the words' scores summed in float64,
    the sum rounded to float32. `wrong` swaps in a plausible mistake, to show the comparisons can fail."""
    tfs, dls, n, df, avgdl = stats or brute_force_lucene_stats(corpus)
    if wrong == "N counts every passage":
        n = len(corpus)
    k1, b = f32(k1), f32(b)
    query_words = Counter(english_analyze(query))
    scores = []
    for tf_d, dl in zip(tfs, dls):
        total = 0.0
        for w, count in query_words.items():
            tf = tf_d.get(w, 0)
            if tf == 0:
                continue
            idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
            if wrong == "idf without the +1":
                idf = math.log((n - df[w] + 0.5) / (df[w] + 0.5))
            length = dl if wrong == "exact lengths" else byte4_to_int(int_to_byte4(dl))
            if wrong == "float64":
                inv = 1 / (k1 * ((1 - b) + b * length / avgdl))
                total += count * idf - count * idf / (1 + tf * inv)
                continue
            inv = f32(1 / f32(k1 * f32(f32(1 - b) + f32(f32(b * length) / avgdl))))
            if wrong == "repeats scored one by one":
                s = f32(f32(idf) - f32(f32(idf) / f32(1 + f32(tf * inv))))
                total += count * s
                continue
            weight = f32(count * f32(idf))
            s = f32(weight - f32(weight / f32(1 + f32(tf * inv))))
            if wrong == "(k1 + 1) factor":
                s = f32(s * f32(k1 + 1))
            total += s
        scores.append(f32(total))
    return scores


def brute_force_lucene_topk(corpus, query, k, **kw):
    scores = brute_force_lucene(corpus, query, **kw)
    order = sorted(range(len(corpus)), key=lambda i: -scores[i])  # stable: ties keep passage order
    return [(corpus[i]["id"], scores[i]) for i in order if scores[i] > 0][:k]


def lucene_matches_reference(retriever, corpus, queries, k, stats, **kw) -> bool:
    """Bitwise: the same hits (ids, order) with the same float32 scores, and the same full score vector [D]."""
    for query, hits in zip(queries, retriever.search(queries, topk=k), strict=True):
        if [(h["document"]["id"], h["score"]) for h in hits] != brute_force_lucene_topk(corpus, query, k,
                                                                                      stats=stats, **kw):  # exact:
            return False  # bitwise is the claim: see the module docstring
        words = english_analyze(query)
        if words and not np.array_equal(retriever.bm25.get_scores(words),  # exact: bitwise, the module docstring
                                        np.array(brute_force_lucene(corpus, query, stats=stats, **kw))):
            return False
    return True


@pytest.mark.parametrize("k1,b", [(0.9, 0.4), (1.2, 0.75)])
def test_lucene_matches_plain_python_reference_toy(k1, b):
    retriever = BM25Retriever(LUCENE_TOY, k1=k1, b=b)
    stats = brute_force_lucene_stats(LUCENE_TOY)
    for k in (1, 3, len(LUCENE_TOY)):
        assert lucene_matches_reference(retriever, LUCENE_TOY, LUCENE_QUERIES, k, stats, k1=k1, b=b)
    if (k1, b) == (0.9, 0.4):  # exact: parameters; and the reference itself reproduces Lucene's scores
        assert [brute_force_lucene_topk(LUCENE_TOY, q, 20, stats=stats) for q in LUCENE_QUERIES] == \
            [LUCENE_TOY_HITS[q] for q in LUCENE_QUERIES]  # exact: bitwise


@pytest.mark.parametrize("wrong", ["idf without the +1", "(k1 + 1) factor", "exact lengths", "N counts every passage",
                                   "repeats scored one by one", "float64"])
def test_lucene_reference_tells_wrong_formulas_apart(wrong):
    """Each plausible mistake changes some hit or some score bit on LUCENE_TOY, so the comparisons above would catch
    an engine that made it."""
    retriever = BM25Retriever(LUCENE_TOY)
    stats = brute_force_lucene_stats(LUCENE_TOY)
    assert not lucene_matches_reference(retriever, LUCENE_TOY, LUCENE_QUERIES, len(LUCENE_TOY), stats, wrong=wrong)


@pytest.fixture(scope="module")
def real_lucene():
    """(corpus, lucene retriever, plain-Python stats) over the real passages; the corpus is analyzed once."""
    corpus = load_corpus(QA_SAMPLE / "corpus.jsonl")
    docs = [english_analyze(row["contents"]) for row in corpus]
    retriever = BM25Retriever(corpus, index=SparseBM25.build(docs, variant="lucene"))
    n, df = sum(1 for d in docs if d), Counter(w for d in docs for w in set(d))
    return corpus, retriever, ([Counter(d) for d in docs], [len(d) for d in docs], n, df, f32(sum(map(len, docs)) / n))


def test_lucene_matches_plain_python_reference_real_corpus(real_lucene):
    """40 real questions (every dataset): top-5 ids and float32 scores, and the full [600] score vector, bitwise."""
    corpus, retriever, stats = real_lucene
    assert stats[2] == len(corpus)  # every real passage has a word
    assert lucene_matches_reference(retriever, corpus, real_questions(40), 5, stats)
    assert not lucene_matches_reference(retriever, corpus, real_questions(2), 5, stats, wrong="exact lengths")

def test_lucene_and_okapi_rank_the_real_corpus_differently(real_lucene):
    """The variants are different retrievers (a check that --bm25 reaches the scoring): many top-3 lists differ."""
    corpus, lucene, _ = real_lucene
    okapi = BM25Retriever(corpus, bm25="okapi", engine="sparse")
    queries = real_questions(30)

    def ids(retriever):
        return [[h["document"]["id"] for h in q] for q in retriever.search(queries, 3)]

    assert sum(a != b for a, b in zip(ids(lucene), ids(okapi))) >= 10


# --- Lucene itself, where it is installed (Debian: apt-get install default-jdk-headless liblucene8-java) -------------

LUCENE_JARS = sorted(Path("/usr/share/java").glob("lucene-core-8*.jar")) + \
    sorted(Path("/usr/share/java").glob("lucene-analyzers-common-8*.jar"))
needs_lucene = pytest.mark.skipif(len(LUCENE_JARS) < 2 or not shutil.which("javac"),
                                  reason="needs javac and Lucene 8's core and analyzers-common jars in /usr/share/java")

LUCENE_JAVA = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import org.apache.lucene.analysis.*;
import org.apache.lucene.analysis.en.*;
import org.apache.lucene.analysis.standard.StandardTokenizer;
import org.apache.lucene.analysis.tokenattributes.CharTermAttribute;
import org.apache.lucene.document.*;
import org.apache.lucene.index.*;
import org.apache.lucene.search.*;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.ByteBuffersDirectory;

// java LuceneRef analyze TEXTS            -> per text, its words joined by spaces
// java LuceneRef search CORPUS QUERIES K  -> per query, its top K as "passage:float32 bits in hex"
// TEXTS, CORPUS, QUERIES: files of base64 UTF-8 texts, one a line.
public class LuceneRef {
  static Analyzer english() {  // Anserini's DefaultEnglishAnalyzer.newDefaultInstance(), pyserini's default
    return new Analyzer() {
      protected TokenStreamComponents createComponents(String field) {
        Tokenizer source = new StandardTokenizer();
        TokenStream result = new EnglishPossessiveFilter(source);
        result = new LowerCaseFilter(result);
        result = new StopFilter(result, EnglishAnalyzer.ENGLISH_STOP_WORDS_SET);
        return new TokenStreamComponents(source, new PorterStemFilter(result));
      }
    };
  }

  static List<String> analyze(Analyzer analyzer, String text) throws IOException {
    List<String> words = new ArrayList<>();
    try (TokenStream ts = analyzer.tokenStream("contents", text)) {
      CharTermAttribute term = ts.addAttribute(CharTermAttribute.class);
      ts.reset();
      while (ts.incrementToken()) words.add(term.toString());
      ts.end();
    }
    return words;
  }

  static List<String> read(String path) throws IOException {
    List<String> texts = new ArrayList<>();
    for (String line : java.nio.file.Files.readAllLines(java.nio.file.Paths.get(path)))
      texts.add(new String(Base64.getDecoder().decode(line), StandardCharsets.UTF_8));
    return texts;
  }

  public static void main(String[] args) throws Exception {
    PrintStream out = new PrintStream(new BufferedOutputStream(System.out), false, "UTF-8");
    Analyzer analyzer = english();
    if (args[0].equals("analyze")) {
      for (String text : read(args[1])) out.println(String.join(" ", analyze(analyzer, text)));
    } else {
      BM25Similarity bm25 = new BM25Similarity(0.9f, 0.4f);  // Anserini's defaults
      ByteBuffersDirectory dir = new ByteBuffersDirectory();
      try (IndexWriter writer = new IndexWriter(dir, new IndexWriterConfig(analyzer).setSimilarity(bm25))) {
        for (String text : read(args[1])) {
          Document doc = new Document();
          doc.add(new TextField("contents", text, Field.Store.NO));
          writer.addDocument(doc);
        }
        writer.forceMerge(1);  // one segment: Lucene's doc ids are the passage numbers
      }
      IndexSearcher searcher = new IndexSearcher(DirectoryReader.open(dir));
      searcher.setSimilarity(bm25);
      for (String query : read(args[2])) {  // Anserini's BagOfWordsQueryGenerator: one clause per word, boost = count
        Map<String, Integer> counts = new LinkedHashMap<>();
        for (String word : analyze(analyzer, query)) counts.merge(word, 1, Integer::sum);
        BooleanQuery.Builder bool = new BooleanQuery.Builder();
        for (Map.Entry<String, Integer> e : counts.entrySet())
          bool.add(new BoostQuery(new TermQuery(new Term("contents", e.getKey())), (float) e.getValue()),
                   BooleanClause.Occur.SHOULD);
        StringJoiner hits = new StringJoiner(" ");
        if (!counts.isEmpty())
          for (ScoreDoc hit : searcher.search(bool.build(), Integer.parseInt(args[3])).scoreDocs)
            hits.add(hit.doc + ":" + Integer.toHexString(Float.floatToIntBits(hit.score)));
        out.println(hits);
      }
    }
    out.flush();
  }
}
"""


def run_lucene(tmp_path, *args: str) -> list[str]:
    """Compile LUCENE_JAVA once into tmp_path and run it; its output lines."""
    classpath = ":".join(map(str, LUCENE_JARS)) + f":{tmp_path}"
    if not (tmp_path / "LuceneRef.class").exists():
        (tmp_path / "LuceneRef.java").write_text(LUCENE_JAVA, encoding="utf-8")
        hang.run(["javac", "-cp", classpath, "-d", str(tmp_path), str(tmp_path / "LuceneRef.java")], check=True,
                 capture_output=True)
    out = hang.run(["java", "-cp", classpath, "LuceneRef", *args], check=True, capture_output=True)
    return out.stdout.decode("utf-8").split("\n")[:-1]


def base64_lines(path: Path, texts: list[str]) -> str:
    path.write_text("".join(base64.b64encode(t.encode("utf-8")).decode("ascii") + "\n" for t in texts))
    return str(path)


@needs_lucene
def test_lucene_itself_on_toy(tmp_path):
    """LUCENE_ANALYZED and LUCENE_TOY_HITS are what this Lucene prints (so they can be regenerated)."""
    texts = [text for text, _, _ in LUCENE_ANALYZED]
    words = run_lucene(tmp_path, "analyze", base64_lines(tmp_path / "t.b64", texts))
    assert [line.split(" ") if line else [] for line in words] == [w for _, _, w in LUCENE_ANALYZED]
    lines = run_lucene(tmp_path, "search", base64_lines(tmp_path / "c.b64", [r["contents"] for r in LUCENE_TOY]),
                       base64_lines(tmp_path / "q.b64", LUCENE_QUERIES), "20")
    hits = [[(LUCENE_TOY[int(h.split(":")[0])]["id"], struct.unpack(">f", bytes.fromhex(h.split(":")[1].zfill(8)))[0])
             for h in line.split()] for line in lines]
    assert hits == [LUCENE_TOY_HITS[q] for q in LUCENE_QUERIES]  # exact: Lucene's own float32 bits, stored


@needs_lucene
def test_lucene_itself_on_the_real_corpus(tmp_path, real_lucene):
    """On the 600 real passages (the 7 with music signs included) and the 200 questions: (1) our English analyzer
    gives Lucene 8.7's words for every text but those with the music signs ♭ ♮ ♯, which Lucene 8.7 makes words of
    (P37); (2) fed Lucene's own words, our engine gives Lucene's top-10 bitwise (ids, order, float32 scores);
    (3) end to end, with our words, every question's top-3 ids are Lucene's. (docs/retrieval.md gives the same checks
    on the whole 13,823-passage bundle.)"""
    corpus, ours, _ = real_lucene
    questions = real_questions(10_000)
    texts = [r["contents"] for r in corpus] + questions
    lucene_words = [line.split(" ") if line else [] for line in
                    run_lucene(tmp_path, "analyze", base64_lines(tmp_path / "t.b64", texts))]
    differ = [i for i, (text, words) in enumerate(zip(texts, lucene_words)) if english_analyze(text) != words]
    assert len(differ) <= 7
    for i in differ:
        assert english_analyze(texts[i]) == [w for w in lucene_words[i] if w not in ("♭", "♮", "♯")]

    lines = run_lucene(tmp_path, "search", base64_lines(tmp_path / "c.b64", texts[:len(corpus)]),
                       base64_lines(tmp_path / "q.b64", questions), "10")
    lucene_hits = [[(h.split(":")[0], struct.unpack(">f", bytes.fromhex(h.split(":")[1].zfill(8)))[0])
                    for h in line.split()] for line in lines]
    fed = SparseBM25.build(lucene_words[:len(corpus)], variant="lucene")
    for words, hits in zip(lucene_words[len(corpus):], lucene_hits, strict=True):
        scores = fed.get_scores(words)
        assert [(str(i), float(scores[i])) for i in top_k(scores, 10)] == hits  # exact: bitwise, Lucene's
    ours_top3 = [[h["document"]["id"] for h in q] for q in ours.search(questions, 3)]
    assert ours_top3 == [[i for i, _ in hits[:3]] for hits in lucene_hits]


# --- sub-linear top-k: the query's posting lists alone give the dense path's hits, bit for bit ------------------------


NUMBA = pytest.param("numba", marks=pytest.mark.skipif(not bm25.NUMBA, reason="numba is not installed"))


@pytest.mark.parametrize("engine", [NUMBA, "numpy"])
@pytest.mark.parametrize("variant", BM25_VARIANTS)
def test_posting_list_topk_is_the_dense_topk_bit_for_bit(variant, engine, monkeypatch):
    """SparseBM25.top == top_k(get_scores) with the same float scores, on both of its paths: short posting lists
    (names, rare words: the sub-linear path) and long ones (n > D / 8: the dense path), with repeated and unknown
    words and exact ties (every passage twice); compiled by numba (forced on this small corpus; one path) and in
    numpy (both paths); and top_many of all the queries at once (in threads, with numba) == top of each."""
    monkeypatch.setattr(bm25, "NUMBA", engine == "numba")
    monkeypatch.setattr(bm25, "NUMBA_FROM", 0)
    sys.path.insert(0, str(REPO / "lab"))
    import search_world

    rows = search_world.make_world(seed=1, people=120, towns=12)["corpus"]
    corpus = rows + [{"id": f"dup{r['id']}", "contents": r["contents"]} for r in rows] + TOY  # ties everywhere
    retriever = BM25Retriever(corpus, bm25=variant, engine="sparse")
    index, rng = retriever.bm25, np.random.default_rng(0)
    words = sorted(index.vocab)
    queries = [[str(w) for w in rng.choice(words, size=rng.integers(1, 6))] for _ in range(300)]
    queries += [q + q[:1] + ["zzzunknown"] for q in queries[:50]] + [["zzzunknown"], retriever.analyze("born town")]
    paths = Counter()
    for q in queries:
        n = sum(int(index.indptr[index.vocab[w] + 1] - index.indptr[index.vocab[w]]) for w in q if w in index.vocab)
        paths["dense" if n * 8 > index.num_docs else "postings"] += 1
        scores = index.get_scores(q)
        for k in (1, 3, 10, 40):
            order, top = index.top(q, k)
            assert order.tolist() == top_k(scores, k).tolist() and \
                np.array_equal(top, scores[order]), (q, k)  # exact: ids; scores bit for bit, the claim
    assert paths["dense"] >= 5 and paths["postings"] >= 200, paths  # both paths were checked
    for k in (1, 3, 10):
        for (order, top), q in zip(index.top_many(queries + [[]], k), queries + [[]], strict=True):
            expected = index.top(q, k)
            assert order.tolist() == expected[0].tolist() and \
                np.array_equal(top, expected[1]), (q, k)  # exact: ids; scores bit for bit, the claim
    texts = ["Lyon", "", "born town", "the of is", "zebra", "Rhone Lyon Lyon"]  # a turn's searches, some empty
    assert retriever.search(texts, 3) == [retriever.search([t], 3)[0] for t in texts]  # exact: the same hits
    hits = retriever.search(["Lyon"], topk=5)[0]
    assert [h["document"]["id"] for h in hits] == ["b", "g"] and hits[0]["score"] == hits[1]["score"]  # exact: tie


@pytest.mark.parametrize("variant", BM25_VARIANTS)
def test_batched_topk_on_real_text_is_the_dense_topk_bit_for_bit(variant, monkeypatch):
    """On the real sample (600 passages, 200 questions): top_many of all the questions at once, compiled by numba
    (forced: the sample is below NUMBA_FROM) and in numpy, == top_k(get_scores) of each, ids and scores bit for bit.
    okapi keeps its stop words, so the compiled search adds the words in over half the passages as dense rows. The
    queries go to the threads as t, t + T, ... and dealt by their postings (BALANCE_FROM forced to 0)."""
    monkeypatch.setattr(bm25, "NUMBA_FROM", 0)
    retriever = BM25Retriever(load_corpus(QA_SAMPLE / "corpus.jsonl"), bm25=variant, engine="sparse")
    index, queries = retriever.bm25, [retriever.analyze(q) for q in real_questions(200)]
    for k, balance_from in ((1, 0), (3, 0), (3, 10 ** 9), (10, 10 ** 9)):
        monkeypatch.setattr(bm25, "BALANCE_FROM", balance_from)
        expected = [(top_k(scores, k), scores) for scores in map(index.get_scores, queries)]
        for numba in ([True, False] if bm25.NUMBA else [False]):
            monkeypatch.setattr(bm25, "NUMBA", numba)
            for (order, top), (want, scores) in zip(index.top_many(queries, k), expected, strict=True):
                assert order.tolist() == want.tolist() and \
                    np.array_equal(top, scores[want]), (numba, k)  # exact: ids; scores bit for bit, the claim
    if bm25.NUMBA and variant == "okapi":
        inv = {t: w for w, t in index.vocab.items()}
        assert {"the", "of"} <= {inv[t] for t in np.flatnonzero(index._search_arrays()[7] >= 0)}  # rows were used


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_threads_shares_hold_every_query_once_with_about_equal_postings(threads, monkeypatch):
    """SparseBM25._shares: every query of a batch goes to exactly one thread, and dealt by postings (BALANCE_FROM
    forced to 0) no thread's postings exceed an equal share by more than the largest query's."""
    monkeypatch.setattr(bm25, "BALANCE_FROM", 0)
    index = BM25Retriever(load_corpus(QA_SAMPLE / "corpus.jsonl"), bm25="lucene", engine="sparse").bm25
    rng, df = np.random.default_rng(threads), np.diff(index.indptr)
    lens = rng.integers(0, 9, 50)  # [Q] words a query (0: an empty query)
    qptr, qwords = np.concatenate([[0], np.cumsum(lens)]), rng.integers(-1, len(df), lens.sum())  # -1: unknown
    shares = index._shares(qptr, qwords, threads)
    assert len(shares) == threads and sorted(np.concatenate(shares).tolist()) == list(range(50))
    cost = np.array([df[qwords[a:b][qwords[a:b] >= 0]].sum() for a, b in zip(qptr[:-1], qptr[1:])])  # [Q]
    loads = [cost[share].sum() for share in shares]
    assert max(loads) - cost.sum() / threads <= cost.max()


@pytest.mark.parametrize("engine", [NUMBA, "python"])
def test_pruned_lucene_search_is_the_dense_topk_bit_for_bit(engine, monkeypatch):
    """The pruned lucene search (MaxScore in topk.search_queries, used from PRUNE_FROM passages; forced here on the
    real sample) == top_k(get_scores), ids and scores bit for bit: the sample's questions, and mixes of rare and very
    common words with repeats (a count > 1), k = 1 to 40. "python" runs the loop uncompiled and counts the pruning
    steps, so that the test fails if the bound never cut a query short."""
    monkeypatch.setattr(bm25, "NUMBA_FROM", 0)
    monkeypatch.setattr(bm25, "PRUNE_FROM", 0)
    pruned = Counter()
    if engine == "python":
        from machinery.bm25_numba import topk

        def candidates(*args, _step=topk._candidates):
            pruned["queries"] += 1
            return _step(*args)
        monkeypatch.setattr(topk, "compiled", lambda: (topk.search_queries, None, 1))
        monkeypatch.setattr(topk, "_candidates", candidates)
    retriever = BM25Retriever(load_corpus(QA_SAMPLE / "corpus.jsonl"), bm25="lucene", engine="sparse")
    index, rng = retriever.bm25, np.random.default_rng(0)
    words = sorted(index.vocab, key=lambda w: int(np.diff(index.indptr)[index.vocab[w]]))  # rarest first
    queries = [retriever.analyze(q) for q in real_questions(60)]
    for _ in range(60):
        q = [str(w) for w in rng.choice(words, 3)] + [str(w) for w in rng.choice(words[-40:], rng.integers(0, 6))]
        queries.append(q + q[:rng.integers(0, 3)])
    for k in (1, 3, 10, 40):
        for (order, top), q in zip(index.top_many(queries, k), queries, strict=True):
            scores = index.get_scores(q)
            assert order.tolist() == top_k(scores, k).tolist() and \
                np.array_equal(top, scores[order]), (q, k)  # exact: ids; scores bit for bit, the claim
    assert index._search_arrays()[6], "the search did not prune"
    if engine == "python":
        assert pruned["queries"] >= len(queries), pruned  # most queries (of 4 k's) were cut short


def test_scale_benchmark_runs_and_finds_the_same_hits():
    """benchmarks/bench_retrieval_scale.py on a tiny synthetic index (seconds), so it does not rot: every query set's
    row says the posting-list top-k returned the dense top-k's passages and scores."""
    r = hang.run([sys.executable, str(REPO / "benchmarks" / "bench_retrieval_scale.py"), "--sizes", "2000",
                  "--queries", "5", "--bm25s-max", "0"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.strip().startswith("2,000")]
    assert [row[1] for row in rows] == ["question", "rare", "common"], r.stdout
    assert all("True" in row and "False" not in row for row in rows), r.stdout  # the "identical" column


def test_demo_runs():
    out = hang.run([sys.executable, "-m", "machinery.bm25"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2:] == ["lucene [0, 1] [0.7459, 0.2416]", "okapi [0, 1] [0.5303, 0.0251]"]
