"""Tests for retriever.py: BM25 against a plain-loop Okapi and a plain-loop Lucene BM25 (and against Lucene itself),
P23 result shapes, the Search-R1 passage format, input errors and the CLI. CPU only, no network; the real corpus is read
from ../shared/data (never copied into the repo).

Scores are compared bitwise (lines marked `# exact:`, see tests/test_float_compare.py) where bit for bit is the claim:
Lucene's float32 scores, rank-bm25's float64 ones, SparseBM25.top against the dense path, ties, a cached index, the
server's JSON. retriever.py computes them in elementwise IEEE operations and math.log, in a fixed order, with no
vectorised reduction, so no CPU rounds them differently; and a tolerance would let the "float64" mistake of
test_lucene_reference_tells_wrong_formulas_apart pass (it moves scores by a float32 ulp). The plain-loop Okapi
reference (other arithmetic) is compared to 1e-6."""

import base64
import json
import math
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import retriever as retriever_module  # noqa: E402

from checkpoint import io_errors_stop_the_run  # noqa: E402
from retriever import (  # noqa: E402
    BadAnswer, BM25_VARIANTS, DEFAULT_ANALYZER, DEMO_CORPUS, LUCENE_STOP_WORDS, BM25Retriever, RemoteRetriever, SparseBM25,
    english_analyze, format_passages, index_cache_file, java_lower, load_corpus, lucene_doc_length, make_retriever,
    make_server, passage_title, standard_tokenize, tokenize, top_k, MAX_REQUEST_BYTES,
)

DATA = REPO.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "corpus.jsonl").is_file(),
                                reason="needs the maintainers' 13,823-passage development corpus (not in the repository)")

TOY = [
    {"id": "a", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "b", "contents": '"Lyon"\nLyon is a city in France, on the Rhone.'},
    {"id": "c", "contents": '"Berlin"\nBerlin is the capital of Germany. Berlin is large.'},
    {"id": "d", "contents": '"Rhone"\nThe Rhone flows from Switzerland through France.'},
    {"id": "e", "contents": '"Apple"\nAn apple is a fruit.'},
    {"id": "f", "contents": '"Paris (mythology)"\nParis of Troy took Helen to Troy.'},
    {"id": "g", "contents": '"Lyon"\nLyon is a city in France, on the Rhone.'},  # duplicate of "b": tie on every query
]


# --- brute-force reference: the Okapi formula written out with plain Python loops ------------------------------------


def brute_force_stats(corpus, epsilon=0.25):
    """Per-passage term counts, lengths, avgdl and idf, computed with plain loops (independent of retriever.py):
    idf(w) = ln((N - n_w + 0.5) / (n_w + 0.5)); negative idfs become epsilon * (mean idf over the vocabulary)."""
    docs = [re.findall(r"\w+", row["contents"].lower()) for row in corpus]
    N = len(docs)
    df = Counter()
    for d in docs:
        for w in set(d):
            df[w] += 1
    idf = {w: math.log(N - n + 0.5) - math.log(n + 0.5) for w, n in df.items()}
    floor = epsilon * sum(idf.values()) / len(idf)
    idf = {w: (floor if v < 0 else v) for w, v in idf.items()}
    return [Counter(d) for d in docs], [len(d) for d in docs], sum(len(d) for d in docs) / N, idf


def brute_force_bm25(corpus, query, k1=0.9, b=0.4, stats=None):
    """Scores [D]: sum over query words q (repeats counted) of
    idf(q) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))."""
    tfs, dls, avgdl, idf = stats or brute_force_stats(corpus)
    scores = []
    for tf_d, dl in zip(tfs, dls):
        s = 0.0
        for q in re.findall(r"\w+", query.lower()):
            tf = tf_d.get(q, 0)
            s += idf.get(q, 0.0) * (tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)))
        scores.append(s)
    return scores


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
    """(corpus, okapi retriever) over the real 13,823-passage corpus, built once (~1 s)."""
    corpus = load_corpus(DATA / "corpus.jsonl")
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


@needs_data
def test_topk_matches_brute_force_real_corpus(real):
    corpus, retriever = real
    with open(DATA / "hotpotqa_test.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line)["question"] for line in f][:20]
    assert_matches_brute_force(retriever, corpus, queries, k=5)


# --- P23: results and scores aligned, len <= k -----------------------------------------------------------------------


def check_p23_shape(hits, k):
    assert isinstance(hits, list) and len(hits) <= k
    for hit in hits:
        assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
        assert isinstance(hit["score"], float) and hit["score"] > 0
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_p23_zero_hit_query_returns_empty():
    retriever = BM25Retriever(TOY, bm25="okapi")
    assert retriever.search(["zebra xylophone"], topk=3) == [[]]
    assert retriever(["zebra xylophone"], topk=3) == [""]


def test_p23_fewer_than_k_hits_are_aligned():
    hits = BM25Retriever(TOY, bm25="okapi").search(["Troy"], topk=3)[0]  # only passage "f" mentions Troy
    check_p23_shape(hits, 3)
    assert [h["document"]["id"] for h in hits] == ["f"]
    assert hits[0]["score"] == pytest.approx(brute_force_bm25(TOY, "Troy")[5], abs=1e-9)


def test_p23_k_hit_query_is_cut_to_k():
    retriever = BM25Retriever(TOY, bm25="okapi")
    assert sum(s > 0 for s in brute_force_bm25(TOY, "France capital city")) > 3  # more matches than k
    for k in (1, 2, 3):
        hits = retriever.search(["France capital city"], topk=k)[0]
        check_p23_shape(hits, k)
        assert len(hits) == k


def test_p23_empty_and_whitespace_queries():
    retriever = BM25Retriever(TOY, bm25="okapi")
    assert retriever.search(["", "   \n\t", "?!", "Paris"], topk=3)[:3] == [[], [], []]
    assert retriever(["", " "]) == ["", ""]
    assert retriever.search([], topk=3) == []


def test_p23_topk_larger_than_corpus_and_bad_topk():
    retriever = BM25Retriever(TOY, bm25="okapi")
    hits = retriever.search(["is"], topk=100)[0]
    check_p23_shape(hits, len(TOY))
    with pytest.raises(ValueError, match="topk"):
        retriever.search(["Paris"], topk=0)
    with pytest.raises(TypeError, match="list of strings"):
        retriever.search("Paris")


def searchr1_search(retriever, query, num, return_score=True):
    """Search-R1 retrieval_server.py BM25Retriever._search, over our index: the searcher's ranked hits, `scores` read
    from them *before* the hit list is cut to `num`, and a bare list (no scores) when return_score is False."""
    words = re.findall(r"\w+", query.lower())
    raw = retriever.bm25.get_scores(words) if words else []
    hits = sorted((i for i, sc in enumerate(raw) if sc > 0), key=lambda i: -raw[i])  # every matching passage
    if len(hits) < 1:
        return ([], []) if return_score else []
    scores = [float(raw[i]) for i in hits]
    hits = hits[:num]  # (Search-R1 warns "Not enough documents retrieved!" when len(hits) < num)
    results = [retriever.corpus[i] for i in hits]
    return (results, scores) if return_score else results


def test_p23_searchr1_scores_before_cut_misalign():
    retriever = BM25Retriever(TOY, bm25="okapi")
    k = 2
    for query in ("France capital city", "Troy", "zebra", ""):
        ours = retriever.search([query], topk=k)[0]
        check_p23_shape(ours, k)  # ours: aligned and <= k on k-hit, < k-hit, 0-hit and empty queries
        results, scores = searchr1_search(retriever, query, k)
        assert [h["document"] for h in ours] == results  # the same passages ...
        if query == "France capital city":  # ... but on a query with more than k matches the scores are not cut
            assert len(scores) > len(results) == k
        else:
            assert len(scores) == len(results) < k
    # the server unpacks `results, scores = batch_search(..., return_score=False)`: a crash (or, for exactly two
    # queries, two result lists silently taken as "results" and "scores")
    bare = [searchr1_search(retriever, q, k, return_score=False) for q in ("France capital city", "Troy", "Lyon")]
    with pytest.raises(ValueError):
        results, scores = bare


@needs_data
def test_p23_shapes_on_real_corpus(real):
    _, retriever = real
    queries = ["Eve Beglarian Armenian", "zzqxwv", "", "   ", "Beglarian"]
    for hits in retriever.search(queries, topk=3):
        check_p23_shape(hits, 3)
    assert [len(h) for h in retriever.search(queries[1:4], topk=3)] == [0, 0, 0]


# --- Search-R1 passage format ----------------------------------------------------------------------------------------


def test_format_passages_exact_string():
    hits = [
        {"document": {"id": "7", "contents": '"Evan Morris"\nEvan L. Morris was a lobbyist.'}, "score": 2.5},
        {"document": {"id": "9", "contents": '"Genentech"\nA company.\nIt is in California.'}, "score": 1.0},
    ]
    expected = (
        'Doc 1(Title: "Evan Morris") Evan L. Morris was a lobbyist.\n'
        'Doc 2(Title: "Genentech") A company.\nIt is in California.\n'
    )
    assert format_passages(hits) == expected
    assert format_passages([]) == ""


def test_passage_title_is_the_first_line_without_its_quotes():
    doc = lambda contents: {"document": {"id": "0", "contents": contents}, "score": 1.0}  # noqa: E731
    assert passage_title(doc('"Evan Morris"\nEvan L. Morris was a lobbyist.')) == "Evan Morris"
    assert passage_title(doc('""Weird Al" Yankovic"\nA musician.')) == '"Weird Al" Yankovic'  # outer quotes only
    assert passage_title(doc("Zach Bogosian\nDoc 2(Title: x) in the text")) == "Zach Bogosian"  # unquoted; text unread
    assert passage_title(doc('"')) == '"' and passage_title(doc("")) == ""


# --- load_corpus errors ----------------------------------------------------------------------------------------------


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_corpus_ok_skips_blank_lines_and_extra_keys(tmp_path):
    lines = ['{"id": "0", "contents": "\\"T\\"\\nx", "title": "T"}', "", '{"id": 1, "contents": "y"}']
    p = write_lines(tmp_path / "c.jsonl", lines)
    assert load_corpus(p) == [{"id": "0", "contents": '"T"\nx'}, {"id": "1", "contents": "y"}]


def test_load_corpus_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_corpus(tmp_path / "nope.jsonl")


def test_load_corpus_bad_json_names_line(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", ['{"id": "0", "contents": "a"}', "", "{not json"])
    with pytest.raises(ValueError, match=r"c\.jsonl:3: not valid JSON"):
        load_corpus(p)


def test_load_corpus_missing_fields(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", ['{"id": "0", "contents": "a"}', '{"id": "1", "text": "b"}'])
    with pytest.raises(ValueError, match=r":2: missing field 'contents'"):
        load_corpus(p)
    p = write_lines(tmp_path / "d.jsonl", ['{"id": "0", "contents": 5}'])
    with pytest.raises(ValueError, match=r":1: missing field 'contents'"):
        load_corpus(p)
    p = write_lines(tmp_path / "e.jsonl", ['{"contents": "a"}'])
    with pytest.raises(ValueError, match=r":1: missing field 'id'"):
        load_corpus(p)


def test_load_corpus_not_utf8_names_line_and_column(tmp_path):
    good = [json.dumps({"id": str(i), "contents": f"passage {i}"}).encode() for i in range(6)]
    p = tmp_path / "c.jsonl"
    p.write_bytes(b"\n".join(good + ['{"id": "7", "contents": "caf\u00e9'.encode() + b' \xff"}']) + b"\n")
    # column counts characters: the 2-byte \u00e9 before it is one column; 0xff is the 31st character
    with pytest.raises(ValueError, match=re.escape(f"{p}:7: not UTF-8 (byte 0xff at column 31)")):
        load_corpus(p)


def test_load_corpus_bom_only_at_file_start(tmp_path):
    rows = [json.dumps({"id": str(i), "contents": f"passage {i}"}).encode() for i in range(3)]
    p = tmp_path / "c.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(rows) + b"\r\n")  # as a Windows editor saves it (utf-8-sig, CRLF)
    assert load_corpus(p) == [{"id": str(i), "contents": f"passage {i}"} for i in range(3)]
    p.write_bytes(b"\n".join(rows[:2] + [b"\xef\xbb\xbf" + rows[2]]) + b"\n")  # e.g. two files concatenated
    with pytest.raises(ValueError, match=re.escape(f"{p}:3: a UTF-8 byte-order mark (BOM) starts this line")):
        load_corpus(p)


def test_load_corpus_empty_file(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.jsonl"):
        load_corpus(p)
    with pytest.raises(ValueError, match="empty"):
        BM25Retriever([])


# --- CLI -------------------------------------------------------------------------------------------------------------


def test_demo_runs():
    out = subprocess.run([sys.executable, "retriever.py"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'Doc 1(Title: "Rhine")' in out.stdout


@needs_data
def test_cli_on_real_corpus():
    cmd = [sys.executable, "retriever.py", "--corpus", str(DATA / "corpus.jsonl"), "Eve Beglarian composer"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Doc 1(Title:" in out.stdout and "score=" in out.stdout
    bad = subprocess.run(cmd[:4], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no query" in bad.stderr


# --- the sparse engine: bitwise rank-bm25 -----------------------------------------------------------------------------


def real_questions(n):
    """n real questions, round-robin over the question files in ../shared/data (every dataset represented)."""
    files = [[json.loads(line)["question"] for line in open(f, encoding="utf-8")]
             for f in sorted(DATA.glob("*.jsonl")) if f.name != "corpus.jsonl"]
    return [q for group in zip(*files) for q in group][:n]


def rank_bm25_topk(bm25, query, k, word_scores):
    """The reference top-k from rank-bm25's own arithmetic and a full stable argsort (as retriever.py ranked before the
    sparse engine). BM25Okapi.get_scores(words) is, by its code, `score += contribution(w)` for w in words from 0, and
    contribution(w) is get_batch_scores([w], passages containing w) there and 0.0 elsewhere: the same float64
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


@needs_data
def test_sparse_equals_rank_bm25_real_corpus_200_queries(real):
    corpus, reference = real  # 13,823 passages: engine "auto" is rank_bm25 here
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
LUCENE_TOY = TOY + [
    {"id": "h", "contents": '"Rhone (river)"\nThe Rhone\'s source is the Rhone Glacier in the Swiss canton of '
                            'Valais. It flows through Lake Geneva, then Lyon, where the Saône joins it, and on through '
                            'Avignon and Arles to the Mediterranean Sea; the river is 813 km long, and the U.S. has no '
                            'river like it. Its delta, the Camargue, is a wetland of lagoons, marshes and salt pans, '
                            'home to pink flamingos and white horses.'},
    {"id": "i", "contents": "To be, or not to be: that is it."},
]
LUCENE_QUERIES = ["capital of France", "Paris", "Lyon Rhone", "city city city", "is the a", "Troy Helen Paris", "zebra",
                  "Rhone's source glaciers", "rivers flowing through France", "U.S. 813 km", "Paris Paris capital"]
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
    part = lambda tf, dl: tf / (tf + 0.9 * (0.6 + 0.4 * dl / 4.6))  # noqa: E731
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
    """(corpus, lucene retriever, plain-Python stats) over the real corpus; the corpus is analyzed once (~10 s)."""
    corpus = load_corpus(DATA / "corpus.jsonl")
    docs = [english_analyze(row["contents"]) for row in corpus]
    retriever = BM25Retriever(corpus, index=SparseBM25.build(docs, variant="lucene"))
    n, df = sum(1 for d in docs if d), Counter(w for d in docs for w in set(d))
    return corpus, retriever, ([Counter(d) for d in docs], [len(d) for d in docs], n, df, f32(sum(map(len, docs)) / n))


@needs_data
def test_lucene_matches_plain_python_reference_real_corpus(real_lucene):
    """40 real questions (every dataset): top-5 ids and float32 scores, and the full [13,823] score vector, bitwise."""
    corpus, retriever, stats = real_lucene
    assert stats[2] == len(corpus)  # every real passage has a word
    assert lucene_matches_reference(retriever, corpus, real_questions(40), 5, stats)
    assert not lucene_matches_reference(retriever, corpus, real_questions(2), 5, stats, wrong="exact lengths")


@pytest.mark.parametrize("variant", BM25_VARIANTS)
def test_variants_and_their_errors(variant):
    retriever = BM25Retriever(TOY, bm25=variant)
    assert retriever.analyzer == DEFAULT_ANALYZER[variant] and retriever.search(["Troy"], 3)[0][0]["document"] == \
        {"id": "f", "contents": TOY[5]["contents"]}
    assert retriever.search(["", "?!", "zebra"], 3) == [[], [], []]
    with pytest.raises(ValueError, match=r"--bm25 must be one of lucene, okapi; got 'bm26'"):
        BM25Retriever(TOY, bm25="bm26")
    with pytest.raises(ValueError, match=r"analyzer must be one of english, words; got 'snowball'"):
        BM25Retriever(TOY, bm25=variant, analyzer="snowball")
    with pytest.raises(ValueError, match="no word tokens"):
        BM25Retriever([{"id": "0", "contents": "?!"}], bm25=variant)
    assert BM25Retriever(TOY, bm25="lucene").search(["is the a"], 3) == [[]]  # stop words only: no hits
    with pytest.raises(ValueError, match="stop words"):
        BM25Retriever([{"id": "0", "contents": "The, and a"}], bm25="lucene")  # words, but only stop words
    with pytest.raises(ValueError, match="engine 'rank_bm25' scores only --bm25 okapi"):
        BM25Retriever(TOY, bm25="lucene", engine="rank_bm25")
    mixed = BM25Retriever(TOY, bm25="lucene", analyzer="words")  # the benchmark's middle row: Lucene on \w+ words
    assert mixed.analyze("Paris's capitals") == ["paris", "s", "capitals"] and mixed.search(["capitals"], 3) == [[]]


@needs_data
def test_lucene_and_okapi_rank_the_real_corpus_differently(real_lucene):
    """The variants are different retrievers (a check that --bm25 reaches the scoring): many top-3 lists differ."""
    corpus, lucene, _ = real_lucene
    okapi = BM25Retriever(corpus, bm25="okapi", engine="sparse")
    queries = real_questions(30)
    ids = lambda r: [[h["document"]["id"] for h in q] for q in r.search(queries, 3)]  # noqa: E731
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
        subprocess.run(["javac", "-cp", classpath, "-d", str(tmp_path), str(tmp_path / "LuceneRef.java")], check=True,
                       capture_output=True, timeout=120)
    out = subprocess.run(["java", "-cp", classpath, "LuceneRef", *args], check=True, capture_output=True, timeout=600)
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
@needs_data
def test_lucene_itself_on_the_real_corpus(tmp_path, real_lucene):
    """On the 13,823 real passages and the 877 questions: (1) our English analyzer gives Lucene 8.7's words for every
    text but those with the music signs ♭ ♮ ♯, which Lucene 8.7 makes words of (departure 1); (2) fed Lucene's own
    words, our engine gives Lucene's top-10 bitwise (ids, order, float32 scores); (3) end to end, with our words,
    every question's top-3 ids are Lucene's."""
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


# --- the on-disk index cache -----------------------------------------------------------------------------------------


@pytest.fixture
def cache_small(monkeypatch):
    """Cache the indexes of corpora of any size (the default caches only above CACHE_ABOVE passages)."""
    monkeypatch.setattr(retriever_module, "CACHE_ABOVE", 0)


def test_small_corpora_are_not_cached(tmp_path):
    """Toy and test corpora build in milliseconds: no index file is written for them (none piles up in ~/.cache)."""
    path = write_lines(tmp_path / "c.jsonl", [json.dumps(r) for r in TOY])
    for variant in BM25_VARIANTS:
        BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=tmp_path / "cache", bm25=variant)
    assert len(TOY) <= retriever_module.CACHE_ABOVE and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("variant", BM25_VARIANTS)
def test_index_cache_hit_miss_and_invalidation(tmp_path, monkeypatch, variant, cache_small):
    path, cache = write_lines(tmp_path / "c.jsonl", [json.dumps(r) for r in TOY]), tmp_path / "cache"
    first = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=cache, bm25=variant)  # miss: built, written
    files = list(cache.glob("*.npz"))
    assert [f.name for f in files] == [index_cache_file(path, 0.9, 0.4, cache, variant, DEFAULT_ANALYZER[variant]).name]
    assert not list(cache.glob("*.tmp"))  # written atomically: no temp file left behind

    builds = []
    real_build = SparseBM25.build
    monkeypatch.setattr(SparseBM25, "build", lambda *a, **kw: builds.append(1) or real_build(*a, **kw))
    second = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=cache, bm25=variant)  # hit: nothing rebuilt
    assert builds == [] and second.search(["France capital"], 5) == first.search(["France capital"], 5)  # exact: cache

    BM25Retriever.from_jsonl(path, k1=1.2, engine="sparse", cache_dir=cache, bm25=variant)  # other parameters: miss
    assert builds == [1]
    write_lines(path, [json.dumps(r) for r in TOY] + ['{"id": "h", "contents": "Zebras live in Kenya."}'])
    third = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=cache, bm25=variant)  # the corpus changed: miss
    assert builds == [1, 1] and third.search(["zebras"], 3)[0][0]["document"]["id"] == "h"
    assert len(list(cache.glob("*.npz"))) == 1  # the stale indexes of this corpus file were removed

    next(cache.glob("*.npz")).write_bytes(b"not an npz")  # a damaged cache file: warn and rebuild
    fourth = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=cache, bm25=variant)
    assert builds == [1, 1, 1] and fourth.search(["zebras"], 3) == third.search(["zebras"], 3)  # exact: one index
    BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=cache, bm25=variant)
    assert builds == [1, 1, 1]  # ... and the rebuilt file is used again

    BM25Retriever.from_jsonl(path, cache_dir=tmp_path / "auto", bm25=variant)  # engine "auto" on a small corpus:
    assert (tmp_path / "auto").exists() == (variant == "lucene")  # okapi runs rank_bm25, uncached; lucene is sparse


def test_index_cache_keeps_one_index_per_variant_and_analyzer(tmp_path, monkeypatch, cache_small):
    """The key holds the variant and the analyzer: each combination gets its own file, none evicts another, and each
    is read back as itself."""
    path, cache = write_lines(tmp_path / "c.jsonl", [json.dumps(r) for r in LUCENE_TOY]), tmp_path / "cache"
    combos = [("lucene", None), ("okapi", None), ("lucene", "words"), ("okapi", "english")]
    built = [BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=cache, bm25=v, analyzer=a) for v, a in combos]
    names = {index_cache_file(path, 0.9, 0.4, cache, r.variant, r.analyzer).name for r in built}
    assert len(names) == 4 and {f.name for f in cache.glob("*.npz")} == names
    monkeypatch.setattr(SparseBM25, "build", lambda *a, **kw: pytest.fail("rebuilt an index that is cached"))
    for (variant, analyzer), first in zip(combos, built):
        again = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=cache, bm25=variant, analyzer=analyzer)
        assert (again.variant, again.analyzer, again.bm25.variant) == (first.variant, first.analyzer, variant)
        assert again.search(LUCENE_QUERIES, 20) == first.search(LUCENE_QUERIES, 20)  # exact: the cached index
    lucene, okapi = built[0].search(["Paris"], 3)[0], built[1].search(["Paris"], 3)[0]
    assert [h["score"] for h in lucene] != [h["score"] for h in okapi]  # really two different scorings


@pytest.mark.parametrize("damage", ["truncated", "empty", "bit flip"])
def test_damaged_index_cache_is_rebuilt_with_one_warning(tmp_path, capsys, damage, cache_small):
    """A cache file cut short by a killed run or a full disk (zipfile.BadZipFile), emptied (EOFError) or with a flipped
    bit (the zip's CRC: BadZipFile) is rebuilt with a one-line warning, and the rebuilt file is then read back."""
    path, cache = write_lines(tmp_path / "c.jsonl", [json.dumps(r) for r in TOY]), tmp_path / "cache"
    expected = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=cache).search(["France capital", "Troy"], 5)
    file = index_cache_file(path, 0.9, 0.4, cache, "lucene", "english")  # the defaults
    data = file.read_bytes()
    file.write_bytes({"truncated": data[: len(data) // 2], "empty": b"",
                      "bit flip": data[:200] + bytes([data[200] ^ 4]) + data[201:]}[damage])
    capsys.readouterr()
    rebuilt = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=cache)
    assert rebuilt.search(["France capital", "Troy"], 5) == expected  # exact: the same index, rebuilt here
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: rebuilding") and f"{file}: damaged index file" in err[0], err
    assert SparseBM25.load(file).num_docs == len(TOY)  # rewritten whole


def test_an_unwritable_index_cache_is_one_warning_and_the_run_goes_on(tmp_path, capsys, monkeypatch, cache_small):
    """A read-only or full cache folder was an OSError traceback from SparseBM25.save, though the cache is optional: it
    is one warning line now, the retriever is the uncached one, and a full disk keeps no half-written temp file. (As
    root every folder is writable, so "read-only" is a cache folder below a regular file here.)"""
    path = write_lines(tmp_path / "c.jsonl", [json.dumps(r) for r in TOY])
    expected = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=None).search(["France capital", "Troy"], 5)
    (tmp_path / "file").write_text("")
    capsys.readouterr()
    blocked = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=tmp_path / "file" / "cache")
    err = capsys.readouterr().err.splitlines()
    assert blocked.search(["France capital", "Troy"], 5) == expected
    assert len(err) == 1 and err[0].startswith(f"warning: BM25 index cache not written to {tmp_path}/file/cache (")
    assert "going on without it" in err[0], err

    real_savez = np.savez

    def disk_full(f, **arrays):
        real_savez(f, **arrays)  # written, then the disk is full before the end
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(retriever_module.np, "savez", disk_full)
    full = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=tmp_path / "cache")
    monkeypatch.undo()
    err = capsys.readouterr().err.splitlines()
    assert full.search(["France capital", "Troy"], 5) == expected
    assert len(err) == 1 and f"not written to {tmp_path}/cache (No space left on device); going on" in err[0], err
    assert list((tmp_path / "cache").iterdir()) == []  # no temp file, no index


# --- Search-R1's HTTP API: server and client -------------------------------------------------------------------------


@pytest.fixture
def server():
    """A `make_server` over TOY (default lucene scoring, sparse engine) on 127.0.0.1 and a free port, in a thread;
    shut down afterwards."""
    srv = make_server(BM25Retriever(TOY, engine="sparse"), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def post(url, body):
    """(status, JSON answer) of one bounded POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_server_round_trip_matches_in_process(server):
    local = BM25Retriever(TOY)  # the same default scoring (lucene), in process
    remote = RemoteRetriever(server)  # a bare host:port gets /retrieve
    queries = ["France capital city", "Troy", "", "zebra", "Lyon Rhone", "Paris Paris"]
    assert remote.url == server + "/retrieve"
    assert remote.search(queries, 3) == local.search(queries, 3)  # exact: floats survive JSON (repr round trips)
    assert remote(queries, 2) == local(queries, 2) and remote([], 3) == []  # exact: the same code, this machine
    status, answer = post(server + "/retrieve", {"queries": ["Troy", "zebra"], "topk": 3, "return_scores": True})
    assert status == 200 and answer == {"result": local.search(["Troy", "zebra"], 3)}  # exact: JSON round trip
    # return_scores false: bare documents (Search-R1's own server crashes here), and topk falls back to 3
    status, answer = post(server + "/retrieve", {"queries": ["France capital city"], "return_scores": False})
    assert status == 200 and answer == {"result": [[h["document"] for h in local.search(["France capital city"])[0]]]}
    assert post(server + "/retrieve", {"queries": ["Troy"], "topk": 0})[1]["result"] == [[TOY[5]]]


@pytest.mark.parametrize("body, message", [
    (b"{not json", "JSONDecodeError"), ({"topk": 3}, "queries"), ({"queries": "Paris"}, "list of strings"),
    ({"queries": ["a", 3]}, "list of strings"), ({"queries": ["a"], "topk": -2}, "topk"),
    ({"queries": ["a"], "topk": "3"}, "topk"), ({"queries": ["a"], "return_scores": "yes"}, "return_scores"),
])
def test_server_rejects_bad_requests(server, body, message):
    status, answer = post(server + "/retrieve", body)
    assert status == 400 and message in answer["error"]


def raw_exchange(port: int, data: bytes, timeout: float = 3.0) -> bytes:
    """Send raw bytes to 127.0.0.1:port and read until the server closes; TimeoutError if it is silent `timeout` s."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("length", ["-1", "abc", "+5", "1_0", str(MAX_REQUEST_BYTES + 1), None])
def test_server_rejects_bad_content_length(server, length):
    """-1 used to hang the thread for good (rfile.read(-1) waits for EOF); int() also took "+5" and "1_0"."""
    header = b"" if length is None else f"Content-Length: {length}\r\n".encode()
    answer = raw_exchange(urllib.parse.urlsplit(server).port, b"POST /retrieve HTTP/1.0\r\n" + header + b"\r\n")
    assert answer.startswith(b"HTTP/1.0 400 ") and b"Content-Length" in answer, answer


def test_server_drops_stalled_clients():
    """With timeout=0.3, a body shorter than its Content-Length gets 408 and a silent client is disconnected, both
    within a bounded time; the server keeps answering."""
    srv = make_server(BM25Retriever(TOY), "127.0.0.1", 0, timeout=0.3)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    port = srv.server_address[1]
    try:
        t0 = time.monotonic()
        answer = raw_exchange(port, b"POST /retrieve HTTP/1.0\r\nContent-Length: 100\r\n\r\n" + b'{"queries"')
        assert answer.startswith(b"HTTP/1.0 408 ") and b"stalled for 0.3 s" in answer, answer
        assert raw_exchange(port, b"") == b""  # nothing sent at all: the server hangs up
        assert time.monotonic() - t0 < 3
        assert post(f"http://127.0.0.1:{port}/retrieve", {"queries": ["Troy"]})[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()


def test_server_is_quiet_when_a_client_hangs_up(server, capsys):
    """A client that resets the connection mid-request (a killed train.py, a timed-out client) is no server error: no
    traceback on the server's terminal, and the server keeps answering."""
    port = urllib.parse.urlsplit(server).port
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(b"POST /retrieve HTTP/1.0\r\nContent-Length: 100\r\n\r\n{")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends a reset
    assert post(server + "/retrieve", {"queries": ["Troy"]})[0] == 200  # by now the reset request has been handled
    assert "Traceback" not in capsys.readouterr().err


def count_connections(port: int, n: int, timeout: float = 0.3) -> int:
    """Open up to n connections, one after another, keeping them open; how many connected before one timed out."""
    socks = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
    except OSError:  # the accept queue is full: the kernel drops our SYN, and connect() times out
        pass
    finally:
        for s in socks:
            s.close()
    return len(socks)


def test_server_listen_backlog_holds_a_burst():
    """Connections wait in the kernel's accept queue until the server takes them. Nothing is accepted here (no
    serve_forever), so the backlog alone must hold a burst of 64: Python's default of 5 held 6 (issue 11: 65-90% of
    1,000 concurrent requests failed); a backlog of 2 shows that the count does measure it."""
    def burst(**kwargs):
        srv = make_server(BM25Retriever(TOY), "127.0.0.1", 0, **kwargs)
        try:
            return count_connections(srv.server_address[1], 64)
        finally:
            srv.server_close()

    assert burst() == 64
    assert burst(backlog=2) < 64


def test_client_errors(server):
    with pytest.raises(ValueError, match="404"):  # the server answered: no retry, a clear message
        RemoteRetriever(server + "/search", retries=3, backoff=10).search(["Paris"])
    with pytest.raises(ValueError, match="topk"):
        RemoteRetriever(server).search(["Paris"], topk=0)


@pytest.mark.parametrize("result", [
    [["Paris is the capital of France."]],  # passages as bare strings
    [[{"title": "Paris", "text": "Paris is the capital of France."}]],  # another field layout
    [[{"document": "Paris is the capital of France.", "score": 1.0}]],
    [{"document": {"id": "0", "contents": "x"}}],  # a hit where the query's list should be
])
def test_client_refuses_hits_of_another_shape(result):
    """A /retrieve server answering another hit shape was a TypeError traceback in format_passages at step 1 (the
    start-up check query does not format passages). The client says what it got and what it expects, in one line, as
    an error that is a ValueError and an OSError: train.py and evaluate.py stop on it with one line at any step."""
    body = json.dumps({"result": result}).encode()

    class Fixed(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Fixed)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/retrieve"
    try:
        with pytest.raises(BadAnswer) as err:
            RemoteRetriever(url)(["Paris"])
    finally:
        srv.shutdown()
        srv.server_close()
    message = str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, OSError) and "\n" not in message
    assert message.startswith(f"retriever at {url} answered hits of another shape: ") and '"contents"' in message
    with pytest.raises(SystemExit, match="^error: retriever at .* answered hits of another shape: .*No checkpoint"):
        with io_errors_stop_the_run(Path("/nonexistent-run")):  # train.py's loop: one line
            raise err.value


def test_server_failure_is_a_500_and_the_client_gives_up():
    class Broken:
        def search(self, queries, topk):
            raise MemoryError("index gone")

    srv = make_server(Broken(), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/retrieve"
    try:
        assert post(url, {"queries": ["Paris"]}) == (500, {"error": "MemoryError: index gone"})
        with pytest.raises(ConnectionError, match="failed after 2 tries.*500"):
            RemoteRetriever(url, retries=1, backoff=0.01).search(["Paris"])
    finally:
        srv.shutdown()
        srv.server_close()


def test_client_error_when_nothing_listens():
    with socket.socket() as s:  # a port that was free a moment ago, now closed: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/retrieve"
    with pytest.raises(ConnectionError, match=r"failed after 3 tries.*connection refused.*retriever\.py serve"):
        RemoteRetriever(url, retries=2, backoff=0.01).search(["Paris"])


def test_client_gives_up_on_a_silent_server_warning_on_each_try(capsys):
    """A server that accepts connections but never answers: each try times out after `timeout` s with one warning line
    on stderr, and after the last the ConnectionError is one line saying what to do (it used to take 60 s x 4 tries
    plus 7 s of backoff, silently)."""
    with socket.socket() as s:  # listening, never accepting: the kernel completes the connections, no one answers
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        url = f"http://127.0.0.1:{s.getsockname()[1]}/retrieve"
        t0 = time.monotonic()
        with pytest.raises(ConnectionError) as err:
            RemoteRetriever(url, timeout=0.3, retries=2, backoff=0.05).search(["Paris"])
        elapsed = time.monotonic() - t0
    assert capsys.readouterr().err.splitlines() == [
        f"warning: retriever at {url}: no answer in 0.3 s (try 1 of 3); retrying in 0.05 s",
        f"warning: retriever at {url}: no answer in 0.3 s (try 2 of 3); retrying in 0.1 s",
    ]
    assert 0.9 <= elapsed < 3, elapsed  # 3 x 0.3 s + 0.15 s of backoff
    message = str(err.value)
    assert "\n" not in message
    assert re.search(r"failed after 3 tries in \d+\.\d s \(last: no answer in 0\.3 s\)", message), message
    assert "python retriever.py serve --corpus CORPUS --port" in message and "--retriever-timeout SECONDS" in message
    default = RemoteRetriever(url)
    assert (default.timeout, default.retries) == (30.0, 2)  # exact: defaults; 93 s at most before the error
    with pytest.raises(ValueError, match="--retriever-timeout"):
        RemoteRetriever(url, timeout=0)


def test_make_retriever_passes_its_timeout_on(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(RemoteRetriever, "search", lambda self, queries, topk=3: seen.append(self.timeout) or [[]])
    path = write_lines(tmp_path / "c.jsonl", [json.dumps(r) for r in TOY])
    assert make_retriever(path, "http://127.0.0.1:9/retrieve", timeout=2.5).timeout == 2.5  # exact: a setting
    assert seen == [2.5]  # exact: a setting; the start-up check query already uses it


def test_make_retriever_local_and_remote(server, tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [json.dumps(r) for r in TOY])
    local = make_retriever(path)
    assert isinstance(local, BM25Retriever)
    assert str(local) == "7 passages (BM25 lucene, english analyzer, sparse engine)"
    assert str(make_retriever(path, bm25="okapi")) == "7 passages (BM25 okapi, words analyzer, rank_bm25 engine)"
    remote = make_retriever(path, server + "/retrieve")
    assert isinstance(remote, RemoteRetriever) and remote(["Troy"]) == local(["Troy"])  # exact: JSON round trip


def test_serve_cli_bad_corpus_is_one_line():
    out = subprocess.run([sys.executable, "retriever.py", "serve", "--corpus", "/nope.jsonl", "--port", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "/nope.jsonl" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "retriever.py", "serve", "--corpus", "/nope.jsonl", "--backlog", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--backlog must be >= 1, got 0" in out.stderr and "Traceback" not in out.stderr


def test_bm25_flag_in_every_entry_point(tmp_path):
    """--bm25 in retriever.py (demo, search, serve), train.py and evaluate.py: a bad value is one line naming the flag
    and the choices; both variants run, and `serve --bm25 okapi` answers as BM25Retriever(bm25="okapi") does."""
    def cli(*args):
        return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)

    for args in (["retriever.py", "--bm25", "bm26"], ["retriever.py", "serve", "--corpus", "c", "--bm25", "bm26"],
                 ["evaluate.py", "--model", "m", "--bm25", "bm26"]):
        out = cli(*args)
        assert out.returncode == 2 and re.search(r"argument --bm25: invalid choice: .bm26.", out.stderr), out.stderr
        assert "lucene" in out.stderr and "okapi" in out.stderr and "Traceback" not in out.stderr
    out = cli("train.py", "--bm25", "bm26")
    assert out.returncode == 2 and "--bm25 must be one of ('lucene', 'okapi'), got 'bm26'" in out.stderr, out.stderr
    out = cli("retriever.py", "--engine", "rank_bm25")  # rank-bm25 has no Lucene scoring
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "error: engine 'rank_bm25' scores only --bm25 okapi (rank-bm25 has no Lucene BM25); use engine 'sparse' or "
        "'auto' for --bm25 lucene"]
    assert "\n0 0.9449\n1 0.4724\n2 0.4357\n" in cli("retriever.py").stdout  # the demo's comments, both variants
    assert "\n0 1.0247\n1 0.6832\n2 0.3251\n" in cli("retriever.py", "--bm25", "okapi").stdout

    path = write_lines(tmp_path / "c.jsonl", [json.dumps(r) for r in TOY])
    server = subprocess.Popen([sys.executable, "retriever.py", "serve", "--corpus", str(path), "--port", "0", "--bm25",
                               "okapi", "--engine", "rank_bm25"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("serving 7 passages (BM25 okapi, words analyzer, rank_bm25 engine) at "), line
        queries = ["France capital city", "Paris Paris", "is the a"]
        expected = BM25Retriever(TOY, bm25="okapi").search(queries, 5)
        assert RemoteRetriever(line.split(" at ")[-1].strip()).search(queries, 5) == expected  # exact: same code
        assert expected != BM25Retriever(TOY).search(queries, 5)  # the flag did reach the server
    finally:
        server.terminate()
        server.wait(timeout=10)


# --- sub-linear top-k: the query's posting lists alone give the dense path's hits, bit for bit ------------------------


@pytest.mark.parametrize("variant", BM25_VARIANTS)
def test_posting_list_topk_is_the_dense_topk_bit_for_bit(variant):
    """SparseBM25.top == top_k(get_scores) with the same float scores, on both of its paths: short posting lists
    (names, rare words: the sub-linear path) and long ones (n > D / 8: the dense path), with repeated and unknown
    words and exact ties (every passage twice)."""
    sys.path.insert(0, str(REPO / "scripts"))
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
        for k in (1, 3, 10):
            order, top = index.top(q, k)
            assert order.tolist() == top_k(scores, k).tolist() and \
                np.array_equal(top, scores[order]), (q, k)  # exact: ids; scores bit for bit, the claim
    assert paths["dense"] >= 5 and paths["postings"] >= 200, paths  # both paths were checked
    hits = retriever.search(["Lyon"], topk=5)[0]
    assert [h["document"]["id"] for h in hits] == ["b", "g"] and hits[0]["score"] == hits[1]["score"]  # exact: tie


def test_scale_benchmark_runs_and_finds_the_same_hits():
    """benchmarks/bench_retrieval_scale.py on a tiny synthetic index (seconds), so it does not rot: every query set's
    row says the posting-list top-k returned the dense top-k's passages and scores."""
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_retrieval_scale.py"), "--sizes", "2000",
                        "--queries", "5", "--bm25s-max", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.strip().startswith("2,000")]
    assert [row[1] for row in rows] == ["question", "rare", "common"], r.stdout
    assert all("True" in row and "False" not in row for row in rows), r.stdout  # the "identical" column
