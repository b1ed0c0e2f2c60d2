"""Tests for retriever.py: the search contract (P23 result shapes, no-hit queries), BM25Retriever's arguments and its
on-disk index cache, the HTTP client against servers that fail or answer otherwise, the --bm25 flag in every entry point
and the CLI. CPU only, no network. bm25.py's scoring has its tests in tests/test_bm25.py, our server (and the client
against it) in tests/test_retrieval_server.py.

Hits are compared exactly (lines marked `# exact:`, see tests/test_float_compare.py) where the same index answers
twice: a cached index, a served one (floats survive JSON)."""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import retriever as retriever_module  # noqa: E402
from machinery.bm25 import BM25_VARIANTS, DEFAULT_ANALYZER, SparseBM25  # noqa: E402
from machinery.checkpoint import io_errors_stop_the_run  # noqa: E402
from machinery.data import load_corpus  # noqa: E402
from retriever import (  # noqa: E402
    BadAnswer, BM25Retriever, RemoteRetriever, index_cache_file, load_index, make_retriever,
)
import hang  # noqa: E402
from conftest import (LUCENE_QUERIES, LUCENE_TOY, QA_SAMPLE, TOY, brute_force_bm25,  # noqa: E402
                      compiled_sized_corpus, write_lines)

def check_p23_shape(hits, k):
    assert isinstance(hits, list) and len(hits) <= k
    for hit in hits:
        assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
        assert isinstance(hit["score"], float) and hit["score"] > 0
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_p23_zero_hit_query_returns_empty():
    retriever = BM25Retriever(TOY, bm25="okapi")
    assert retriever.search(["zebra xylophone"], topk=3) == [[]]


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


def test_p23_shapes_on_real_corpus():
    retriever = BM25Retriever(load_corpus(QA_SAMPLE / "corpus.jsonl"), bm25="okapi")
    queries = ["Eve Beglarian Armenian", "zzqxwv", "", "   ", "Beglarian"]
    for hits in retriever.search(queries, topk=3):
        check_p23_shape(hits, 3)
    assert [len(h) for h in retriever.search(queries[1:4], topk=3)] == [0, 0, 0]




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
    with pytest.raises(ValueError, match="empty"):
        BM25Retriever([])


def test_okapi_on_a_corpus_where_it_can_find_nothing_says_so(capsys):
    """rank-bm25's idf is <= 0 for a word in half the passages or more, so okapi on a one-passage corpus never found
    anything, without a word. It still finds nothing (rank-bm25's scores, P36), and says why once."""
    one = [{"id": "0", "contents": "Paris is the capital of France."}]
    for engine in ("rank_bm25", "sparse"):
        assert BM25Retriever(one, bm25="okapi", engine=engine).search(["Paris"], 3) == [[]]
        assert capsys.readouterr().err == (
            "warning: --bm25 okapi finds no passage in this 1-passage corpus: rank-bm25's idf ln((N - df + 0.5) / (df "
            "+ 0.5)) is <= 0 for every word (each is in half the passages or more); --bm25 lucene's is > 0\n")
    assert [h["document"]["id"] for h in BM25Retriever(one).search(["Paris"], 3)[0]] == ["0"]
    BM25Retriever(TOY, bm25="okapi")
    assert capsys.readouterr().err == ""  # a corpus where it can find something: no line


# --- CLI -------------------------------------------------------------------------------------------------------------


def test_demo_runs():
    out = hang.run([sys.executable, "retriever.py"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert 'Doc 1(Title: "Rhine")' in out.stdout
    assert "python scripts/retrieval_server.py --corpus" in hang.run(
        [sys.executable, "retriever.py", "--help"], cwd=REPO, capture_output=True, text=True).stdout


def test_cli_on_real_corpus():
    cmd = [sys.executable, "retriever.py", "--corpus", str(QA_SAMPLE / "corpus.jsonl"), "Eve Beglarian composer"]
    out = hang.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "Doc 1(Title:" in out.stdout and "score=" in out.stdout
    bad = hang.run(cmd[:4], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "no query" in bad.stderr


# --- the compiled search: prepared once, safe from threads, a numba that cannot run ------------------------------




def test_a_numba_that_cannot_be_imported_falls_back_to_numpy_with_one_warning(tmp_path):
    """A numba that is installed but fails to import (one built for another NumPy) was a traceback at the first search,
    in train.py after the model had loaded. Now: one warning line, and the numpy path's hits, which are the same."""
    fake = tmp_path / "site" / "numba"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("Numba needs NumPy 2.2 or less. Got NumPy 2.4.")\n')
    corpus, queries = compiled_sized_corpus(tmp_path), ["Eve Beglarian composer", "river in the north"]
    env = {**os.environ, "PYTHONPATH": str(fake.parent), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = hang.run([sys.executable, "retriever.py", "--corpus", str(corpus), *queries], cwd=REPO, env=env,
                   capture_output=True, text=True)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        "warning: numba is installed but cannot run (ImportError: Numba needs NumPy 2.2 or less. Got NumPy 2.4.); "
        "BM25 searches with numpy instead, the same hits and scores (or: pip install --force-reinstall numba)"]
    printed = re.findall(r"id=(\S+) score=(\S+)", out.stdout)
    bm25_numpy = BM25Retriever(load_corpus(corpus))
    with_numpy = [(h["document"]["id"], f"{h['score']:.4f}") for q in queries for h in bm25_numpy.search([q], 3)[0]]
    assert printed == with_numpy and len(printed) == 6


@pytest.mark.skipif(not importlib.util.find_spec("numba"), reason="numba is not installed")
def test_concurrent_first_searches_compile_once_and_all_answer(tmp_path):
    """topk.compiled() was functools.cache'd but not locked: threads that searched at once each wrapped the jitted
    helpers again ("TypeError: A jit decorator was called on an already jitted function"), a 500 for 89-124 of 1,000
    clients of a fresh server. In a fresh process, 16 threads released together make their first searches on a fresh
    index, the first thread's set-up slowed down (as on a busy machine) so that the others arrive meanwhile: every
    one answers, with the hits of one search at a time, and the compile is said at most once."""
    code = f"""if True:
        import json, sys, threading, time
        import numba

        late = [1.0]  # topk's first numba.njit call takes a second: the other threads reach topk.compiled meanwhile
        def slow_njit(*args, _njit=numba.njit, **kwargs):
            time.sleep(late.pop() if kwargs.get("nogil") and late else 0.0)
            return _njit(*args, **kwargs)
        numba.njit = slow_njit
        from retriever import BM25Retriever
        from machinery.data import load_corpus
        retriever, queries = BM25Retriever(load_corpus({str(compiled_sized_corpus(tmp_path))!r})), sys.argv[1:]
        start, results, errors = threading.Barrier(16), {{}}, [retriever.analyze(q) for q in queries][:0]  # (nltk)

        def first_search(i):
            start.wait()
            try:
                results[i] = retriever.search([queries[i % len(queries)]], 3)
            except Exception as err:
                errors.append(repr(err))
        threads = [threading.Thread(target=first_search, args=(i,)) for i in range(16)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(json.dumps({{"errors": errors, "results": [results.get(i) for i in range(16)]}}))"""
    queries = ["Eve Beglarian composer", "river in the north", "who directed the film"]
    out = hang.run([sys.executable, "-c", code, *queries], cwd=REPO, capture_output=True, text=True,
                   env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    got, alone = json.loads(out.stdout), BM25Retriever(load_corpus(tmp_path / "big.jsonl"))
    assert got["errors"] == [] and got["results"] == [alone.search([queries[i % 3]], 3) for i in range(16)]  # exact
    said = [line for line in out.stderr.splitlines() if line.startswith("BM25 search ")]  # (floats: JSON round trip)
    assert len(said) <= 1 and "Traceback" not in out.stderr, out.stderr  # 0 if this index's types were loaded before


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
    assert load_index(file).num_docs == len(TOY)  # rewritten whole


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

    monkeypatch.setattr(np, "savez", disk_full)
    full = BM25Retriever.from_jsonl(path, engine="sparse", cache_dir=tmp_path / "cache")
    monkeypatch.undo()
    err = capsys.readouterr().err.splitlines()
    assert full.search(["France capital", "Troy"], 5) == expected
    assert len(err) == 1 and f"not written to {tmp_path}/cache (No space left on device); going on" in err[0], err
    assert list((tmp_path / "cache").iterdir()) == []  # no temp file, no index


# --- Search-R1's HTTP API: the client against servers that fail or answer otherwise ----------------------------------
# (against our own server: tests/test_retrieval_server.py)


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
            RemoteRetriever(url).search(["Paris"])
    finally:
        srv.shutdown()
        srv.server_close()
    message = str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, OSError) and "\n" not in message
    assert message.startswith(f"retriever at {url} answered hits of another shape: ") and '"contents"' in message
    with pytest.raises(SystemExit, match="^error: retriever at .* answered hits of another shape: .*No checkpoint"):
        with io_errors_stop_the_run(Path("/nonexistent-run")):  # train.py's loop: one line
            raise err.value


def test_client_error_when_nothing_listens():
    with socket.socket() as s:  # a port that was free a moment ago, now closed: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/retrieve"
    with pytest.raises(ConnectionError, match=r"failed after 3 tries.*connection refused.*retrieval_server\.py"):
        RemoteRetriever(url, retries=2, backoff=0.01).search(["Paris"])


def test_client_gives_up_on_a_silent_server_warning_on_each_try(capsys):
    """A server that accepts connections but never answers: each try times out after `timeout` s with one warning line
    on stderr, and after the last the ConnectionError is one line saying what to do (it used to take 60 s x 4 tries
    plus 7 s of backoff, silently)."""
    with socket.socket() as s:  # listening, never accepting: the kernel completes the connections, no one answers
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        url = f"http://127.0.0.1:{s.getsockname()[1]}/retrieve"
        with pytest.raises(ConnectionError) as err:
            RemoteRetriever(url, timeout=0.3, retries=2, backoff=0.05).search(["Paris"])
    assert capsys.readouterr().err.splitlines() == [
        f"warning: retriever at {url}: no answer in 0.3 s (try 1 of 3); retrying in 0.05 s",
        f"warning: retriever at {url}: no answer in 0.3 s (try 2 of 3); retrying in 0.1 s",
    ]
    message = str(err.value)
    assert "\n" not in message
    assert re.search(r"failed after 3 tries in \d+\.\d s \(last: no answer in 0\.3 s\)", message), message
    assert "python scripts/retrieval_server.py --corpus CORPUS --port" in message
    assert "--retriever-timeout SECONDS" in message
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


def test_bm25_flag_in_every_entry_point(tmp_path):
    """--bm25 in retriever.py (demo, search), scripts/retrieval_server.py, train.py and evaluate.py: a bad value is one
    line naming the flag and the choices; both variants run, and the server started with --bm25 okapi answers as
    BM25Retriever(bm25="okapi") does."""
    def cli(*args):
        return hang.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True)

    for args in (["retriever.py", "--bm25", "bm26"], ["scripts/retrieval_server.py", "--corpus", "c", "--bm25", "bm26"],
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
    server = subprocess.Popen([sys.executable, "scripts/retrieval_server.py", "--corpus", str(path), "--port", "0",
                               "--bm25", "okapi", "--engine", "rank_bm25"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("serving 7 passages (BM25 okapi, words analyzer, rank_bm25 engine) at "), line
        queries = ["France capital city", "Paris Paris", "is the a"]
        expected = BM25Retriever(TOY, bm25="okapi").search(queries, 5)
        assert RemoteRetriever(line.split(" at ")[-1].strip()).search(queries, 5) == expected  # exact: same code
        assert expected != BM25Retriever(TOY).search(queries, 5)  # the flag did reach the server
    finally:
        server.terminate()
        server.wait(timeout=hang.HANG_S)
