"""Benchmark: `python scripts/retrieval_server.py` under concurrent load on loopback, with and without the
listen-backlog fix.

For each corpus (data.DEMO_CORPUS's 5 passages written to a temp file, plus --corpus PATH if given) and each listen
backlog (--backlog: by default 5, Python's socketserver default that the server had before issue 11, and
retrieval_server.LISTEN_BACKLOG), it starts `python scripts/retrieval_server.py --port 0 --backlog N` in a subprocess,
reads the URL from its first stdout line, and sends one-query POST /retrieve requests from 1, 16 and 1,000 concurrent
clients (--clients). The queries are passage titles of the corpus, so each one has hits. Every client sends a fixed
number of requests (max(1, --requests / clients)), one after another, each with a --timeout from connect to last byte,
so a level lasts at most (requests per client) x timeout; the total time is printed. Per level it prints the answered
requests per second, p50/p99 latency of the answered requests and the errors by kind: connection reset, refused, timed
out, answered but not 200, other. The clients are one asyncio loop in this process and share the CPUs with the server
(and anything else running): compare the figures of one run with each other.
Not a test: nothing is asserted on time.

    python benchmarks/bench_server.py                                     # toy corpus, backlog 5 and 1024: ~30 s
    python benchmarks/bench_server.py --corpus path/to/corpus.jsonl       # ... and a real corpus too
    python benchmarks/bench_server.py --corpus path/to/corpus.jsonl --engine rank_bm25 --timeout 60
"""

import argparse
import asyncio
import json
import math
import os
import select
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from machinery.data import DEMO_CORPUS, load_corpus  # noqa: E402
from retrieval_server import LISTEN_BACKLOG  # noqa: E402

ERRORS = ("reset", "refused", "timeout", "non-200", "other")


def titles(corpus_path: Path, n: int = 1000) -> list[str]:
    """Up to n passage titles (first line of "contents", quotes stripped), spread evenly over the corpus."""
    corpus = load_corpus(corpus_path)
    step = max(1, len(corpus) // n)
    return [row["contents"].split("\n")[0].strip('"') or "the" for row in corpus[::step][:n]]


NUMPY = ("-c", "import runpy, bm25; bm25.NUMBA = False; runpy.run_path('scripts/retrieval_server.py', "
                "run_name='__main__')")  # the server with numba hidden: the numpy search


def start_server(corpus: Path, backlog: int, engine: str, log, startup_s: float = 3600.0, numpy: bool = False):
    """scripts/retrieval_server.py on a free port (numpy: with numba hidden): (process, host, port) once it prints its
    URL, or SystemExit with its log."""
    cmd = [sys.executable, *(NUMPY if numpy else [str(ROOT / "scripts" / "retrieval_server.py")]), "--corpus",
           str(corpus), "--port", "0", "--backlog", str(backlog), "--engine", engine]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)  # stderr to a file: a pipe could fill
    ready, _, _ = select.select([proc.stdout], [], [], startup_s)  # the index is built before the line is printed
    line = proc.stdout.readline() if ready else ""
    if "http://" not in line:
        proc.kill()
        proc.wait(timeout=10)
        log.seek(0)
        raise SystemExit(f"error: the server did not start within {startup_s:.0f} s: {line}{log.read()[-2000:]}")
    url = urllib.parse.urlsplit(line.split()[-1])  # "serving 5 passages (BM25, rank_bm25) at http://127.0.0.1:PORT/..."
    return proc, url.hostname, url.port, line.strip()


async def one_request(host: str, port: int, request: bytes, timeout: float):
    """One HTTP/1.0 exchange within `timeout` s (connect, send, read to EOF): (seconds, None) if answered 200, else
    (None, error kind)."""
    async def exchange():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(request)
            await writer.drain()
            return await reader.read()  # HTTP/1.0: the server closes after its answer
        finally:
            writer.close()

    t0 = time.perf_counter()
    try:
        answer = await asyncio.wait_for(exchange(), timeout)
    except asyncio.TimeoutError:
        return None, "timeout"
    except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
        return None, "reset"
    except ConnectionRefusedError:
        return None, "refused"
    except OSError:  # e.g. out of file descriptors or ephemeral ports
        return None, "other"
    if not answer.startswith(b"HTTP/1.0 200 "):
        return None, "non-200"  # an empty answer too: the server hung up without answering
    return time.perf_counter() - t0, None


async def load_level(host: str, port: int, requests: list[bytes], clients: int, per_client: int, timeout: float):
    """`clients` concurrent clients, each sending `per_client` requests in turn: (latencies of the answered, error
    counts, wall seconds)."""
    latencies, errors = [], Counter()

    async def client(c: int):
        for k in range(per_client):
            seconds, error = await one_request(host, port, requests[(c * per_client + k) % len(requests)], timeout)
            if error:
                errors[error] += 1
            else:
                latencies.append(seconds)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))  # all connect at once: the burst the backlog must hold
    return latencies, errors, time.perf_counter() - t0


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted list (nan if empty)."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)] if sorted_values else float("nan")


def http_request(query: str, topk: int) -> bytes:
    body = json.dumps({"queries": [query], "topk": topk, "return_scores": True}).encode()
    return (f"POST /retrieve HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="a jsonl corpus to load-test besides the built-in 5-passage one")
    ap.add_argument("--backlog", type=int, nargs="+", default=[5, LISTEN_BACKLOG],
                    help=f"listen backlogs to compare (default: 5, the old default, and {LISTEN_BACKLOG})")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 16, 1000], help="concurrent clients per level")
    ap.add_argument("--requests", type=int, default=500, help="requests per level; each client sends max(1, R/clients)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per request (connect to last byte)")
    ap.add_argument("--topk", type=int, default=3, help="passages per query")
    ap.add_argument("--engine", default="sparse", choices=["auto", "rank_bm25", "sparse"],
                    help="the server's engine (the server's default: sparse)")
    ap.add_argument("--numpy", action="store_true", help="hide numba from the server: its numpy search")
    args = ap.parse_args()
    for name in ("backlog", "clients"):
        if min(getattr(args, name)) < 1:
            ap.error(f"--{name} values must be >= 1, got {getattr(args, name)}")
    if args.requests < 1 or not args.timeout > 0:
        ap.error(f"--requests must be >= 1 and --timeout > 0, got {args.requests} and {args.timeout}")

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        toy = Path(tmp) / "toy_corpus.jsonl"
        toy.write_text("".join(json.dumps(row) + "\n" for row in DEMO_CORPUS), encoding="utf-8")
        corpora = [("toy (5 passages)", toy)] + ([(args.corpus, Path(args.corpus))] if args.corpus else [])
        try:  # every corpus is read before any server starts: a bad path fails at once
            queries = {path: [http_request(q, args.topk) for q in titles(path)] for _, path in corpora}
        except (FileNotFoundError, ValueError) as err:
            raise SystemExit(f"error: {err}") from None
        for label, path in corpora:
            requests = queries[path]
            print(f"\ncorpus: {label}, {len(requests)} distinct queries (passage titles), timeout {args.timeout:g} s")
            print(f"{'backlog':>7} | {'clients':>7} | {'requests':>8} | {'ok req/s':>8} | {'p50 ms':>8} | "
                  f"{'p99 ms':>8} | errors: " + " ".join(f"{e:>7}" for e in ERRORS))
            for backlog in args.backlog:
                with open(Path(tmp) / f"server-{backlog}.log", "w+") as log:
                    t0 = time.perf_counter()
                    proc, host, port, banner = start_server(path, backlog, args.engine, log, numpy=args.numpy)
                    log.seek(0)
                    print(f"(fresh server, backlog {backlog}: 'serving' after {time.perf_counter() - t0:.1f} s; "
                          f"load {os.getloadavg()[0]:.1f}; {log.read().strip() or 'no compile line'})", flush=True)
                    try:
                        for clients in args.clients:
                            per_client = max(1, args.requests // clients)
                            lat, errors, wall = asyncio.run(
                                load_level(host, port, requests, clients, per_client, args.timeout))
                            lat.sort()
                            print(f"{backlog:>7} | {clients:>7,} | {clients * per_client:>8,} | "
                                  f"{len(lat) / wall:>8.0f} | {1000 * percentile(lat, 0.5):>8.1f} | "
                                  f"{1000 * percentile(lat, 0.99):>8.1f} | {'':>7} "
                                  + " ".join(f"{errors[e]:>7}" for e in ERRORS), flush=True)
                            time.sleep(0.5)  # let the server's threads finish before the next burst
                    finally:
                        proc.terminate()
                        proc.wait(timeout=10)
            print(f"(server: {banner.split(' at ')[0]})")
    print(f"\ntotal time: {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
