"""Tests for retriever.py: BM25 against a plain-loop Okapi, P23 result shapes, the Search-R1 passage format, input
errors and the CLI. CPU only, no network; the real corpus is read from ../shared/data (never copied into the repo)."""

import json
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from retriever import BM25Retriever, format_passages, load_corpus  # noqa: E402

DATA = REPO.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "corpus.jsonl").is_file(), reason=f"no corpus at {DATA}")

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
    """(corpus, retriever) over the real 13,823-passage corpus, built once (~1 s)."""
    corpus = load_corpus(DATA / "corpus.jsonl")
    return corpus, BM25Retriever(corpus)


# --- BM25 == brute force ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k1,b", [(0.9, 0.4), (1.5, 0.75)])
def test_topk_matches_brute_force_toy(k1, b):
    queries = ["capital of France", "Paris", "Lyon Rhone", "city city city", "is the a", "Troy Helen Paris", "zebra"]
    retriever = BM25Retriever(TOY, k1=k1, b=b)
    for k in (1, 3, len(TOY) + 5):
        assert_matches_brute_force(retriever, TOY, queries, k, k1=k1, b=b)
    hits = retriever.search(["Lyon"], topk=5)[0]  # duplicate passages tie: the earlier one comes first
    assert [h["document"]["id"] for h in hits] == ["b", "g"] and hits[0]["score"] == hits[1]["score"]


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
    retriever = BM25Retriever(TOY)
    assert retriever.search(["zebra xylophone"], topk=3) == [[]]
    assert retriever(["zebra xylophone"], topk=3) == [""]


def test_p23_fewer_than_k_hits_are_aligned():
    hits = BM25Retriever(TOY).search(["Troy"], topk=3)[0]  # only passage "f" mentions Troy
    check_p23_shape(hits, 3)
    assert [h["document"]["id"] for h in hits] == ["f"]
    assert hits[0]["score"] == pytest.approx(brute_force_bm25(TOY, "Troy")[5], abs=1e-9)


def test_p23_k_hit_query_is_cut_to_k():
    retriever = BM25Retriever(TOY)
    assert sum(s > 0 for s in brute_force_bm25(TOY, "France capital city")) > 3  # more matches than k
    for k in (1, 2, 3):
        hits = retriever.search(["France capital city"], topk=k)[0]
        check_p23_shape(hits, k)
        assert len(hits) == k


def test_p23_empty_and_whitespace_queries():
    retriever = BM25Retriever(TOY)
    assert retriever.search(["", "   \n\t", "?!", "Paris"], topk=3)[:3] == [[], [], []]
    assert retriever(["", " "]) == ["", ""]
    assert retriever.search([], topk=3) == []


def test_p23_topk_larger_than_corpus_and_bad_topk():
    retriever = BM25Retriever(TOY)
    hits = retriever.search(["is"], topk=100)[0]
    check_p23_shape(hits, len(TOY))
    with pytest.raises(ValueError, match="topk"):
        retriever.search(["Paris"], topk=0)
    with pytest.raises(TypeError, match="list of strings"):
        retriever.search("Paris")


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
