"""Benchmark (issue 40): what the first BM25 search costs, with numba's compile cold and warm and without numba.

For each mode it runs fresh processes over --corpus (the index itself is read from a warm on-disk index cache, built
once before the timings, so that only the search's own start is timed):
  numba cold   numba's cache empty (NUMBA_CACHE_DIR, a new folder): the compile of a fresh install;
  numba warm   the same folder again: what every later start pays (loading the compiled code);
  numpy        numba hidden (bm25.NUMBA = False): the exact numpy search.
In process (what train.py and evaluate.py do, through retriever.make_retriever): the seconds of BM25Retriever.prepare
(numba's import and compile or cache load, before the first step), then the first query, the second, and a batch of
the --questions real questions (the training batches' shape); the analyzer has met every word before the timings
(its stemmer's import and memory are the same work in every mode). Server (scripts/retrieval_server.py): seconds from the
start to its `serving` line (index load and prepare), then the first and second request. The 1-minute load average is
printed beside each row (os.getloadavg(), as `uptime`): on a shared machine the figures move with it.
Not a test: nothing is asserted on time.

    python benchmarks/bench_first_search.py --corpus data/hotpotqa/corpus.jsonl --questions data/hotpotqa/*.jsonl
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IN_PROCESS = """if True:
    import json, sys, time
    t0 = time.perf_counter()
    from machinery import bm25
    bm25.NUMBA = bm25.NUMBA and sys.argv[3] != "numpy"
    from retriever import BM25Retriever
    retriever = BM25Retriever.from_jsonl(sys.argv[1])
    questions = json.loads(sys.argv[2])
    [retriever.analyze(q) for q in questions + ["eiffel tower paris", "who founded the company"]]  # (words cached)
    t1 = time.perf_counter()
    retriever.prepare(say=lambda line: None)
    t2 = time.perf_counter()
    retriever.search(["eiffel tower paris"], 3)
    t3 = time.perf_counter()
    retriever.search(["who founded the company"], 3)
    t4 = time.perf_counter()
    retriever.search(questions, 3)
    t5 = time.perf_counter()
    print(json.dumps({"load": t1 - t0, "prepare": t2 - t1, "first": t3 - t2, "second": t4 - t3, "batch": t5 - t4}))
"""

SERVER = """if True:
    import runpy, sys
    from machinery import bm25
    bm25.NUMBA = bm25.NUMBA and sys.argv.pop() != "numpy"
    runpy.run_path("scripts/retrieval_server.py", run_name="__main__")
"""


def questions(files: list[str], n: int) -> list[str]:
    """The first n questions of the files, alternately."""
    lists = [[json.loads(line)["question"] for line in open(f, encoding="utf-8")] for f in files]
    return [q for group in zip(*lists) for q in group][:n]


def in_process(corpus: str, qs: list[str], mode: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, corpus, json.dumps(qs), mode], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"error: the in-process run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def ask(url: str, query: str) -> float:
    """Seconds for one /retrieve request."""
    body = json.dumps({"queries": [query], "topk": 3, "return_scores": True}).encode()
    t0 = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=3600) as r:
        r.read()
    return time.perf_counter() - t0


def server(corpus: str, mode: str, env: dict) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, "--corpus", corpus, "--port", "0", mode], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        ready = time.perf_counter() - t0
        if "http://" not in line:
            raise SystemExit(f"error: the server did not start: {line}{proc.stderr.read()[-2000:]}")
        url = line.split(" at ")[-1].strip()
        return {"serving": ready, "first": ask(url, "eiffel tower paris"), "second": ask(url, "who founded it")}
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="a jsonl corpus (our figures: the 13,823-passage bundle)")
    ap.add_argument("--questions", nargs="+", required=True, help="question .jsonl files for the batch")
    ap.add_argument("--batch", type=int, default=193, help="questions in the in-process batch")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of the three modes")
    args = ap.parse_args()
    for path in (args.corpus, *args.questions):
        if not Path(path).is_file():
            ap.error(f"no such file: {path}")
    if args.batch < 1 or args.repeats < 1:
        ap.error(f"--batch and --repeats must be >= 1, got {args.batch} and {args.repeats}")
    qs = questions(args.questions, args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        base = {**os.environ, "XDG_CACHE_HOME": f"{tmp}/xdg"}
        in_process(args.corpus, qs[:1], "numpy", base)  # builds the index cache once: not timed
        print(f"corpus {args.corpus}, {len(qs)} questions in the batch, cpus {os.cpu_count()}")
        print(f"{'mode':<11} | {'where':<10} | {'load1':>5} | {'start s':>8} | {'prepare s':>9} | {'1st ms':>9} | "
              f"{'2nd ms':>7} | {'batch ms':>8}")
        for r in range(args.repeats):
            for mode in ("numba cold", "numba warm", "numpy"):
                for where in ("in process", "server"):  # cold: a new numba cache folder; warm: the same again
                    env = {**base, "NUMBA_CACHE_DIR": f"{tmp}/numba{r}-{where[:2]}"}
                    load = os.getloadavg()[0]
                    if where == "in process":
                        t = in_process(args.corpus, qs, mode.split()[0], env)
                        cells = (t["load"], t["prepare"], 1e3 * t["first"], 1e3 * t["second"], 1e3 * t["batch"])
                    else:
                        t = server(args.corpus, mode.split()[0], env)
                        cells = (t["serving"], float("nan"), 1e3 * t["first"], 1e3 * t["second"], float("nan"))
                    print(f"{mode:<11} | {where:<10} | {load:>5.1f} | {cells[0]:>8.1f} | {cells[1]:>9.1f} | "
                          f"{cells[2]:>9.1f} | {cells[3]:>7.1f} | {cells[4]:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
