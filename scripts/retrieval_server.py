"""Serve a passage corpus over HTTP with Search-R1's /retrieve API, for train.py and evaluate.py --retriever-url.

One index (retriever.BM25Retriever, built once) answers every run that points at it: several training runs share it,
and retriever.RemoteRetriever talks to this server as to Search-R1's own retrieval_server.py, which Search-R1 keeps
apart from its trainer too. The API: POST /retrieve {"queries": [str], "topk": int, "return_scores": bool} ->
{"result": [[{"document": {"id", "contents"}, "score": float}, ...] per query]}, or [[document, ...] per query] with
return_scores false (`make_server`). Standard library only: a ThreadingHTTPServer, one thread per connection.

Departures from Search-R1's server: those of retriever.py (docs/departures.md, P23, P36-P38; P23: return_scores false
answers the documents, where Search-R1's server crashes). A request that is malformed, stalls or trickles past its
deadline gets 400 or 408 instead of holding a thread. The search is ready (numba's compile, where it is used) before the
server says `serving`.

    python scripts/retrieval_server.py --corpus data/hotpotqa/corpus.jsonl --port 8000 [--bm25 okapi]
    python train.py --retriever-url http://127.0.0.1:8000/retrieve ...
"""

import argparse
import io
import json
import re
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machinery.bm25 import BM25_VARIANTS  # noqa: E402
from retriever import BM25Retriever  # noqa: E402

# The listen() backlog, i.e. connections the kernel queues until a server thread accepts them. Python's socketserver
# default of 5 overflows under a burst (1,000 concurrent requests: 65-90% of them reset or dropped; docs/retrieval.md);
# 1,024 gave no error. Linux silently caps it at net.core.somaxconn (4,096 since kernel 5.4).
LISTEN_BACKLOG = 1024
SERVER_TIMEOUT = 30.0  # seconds a connection may stall (no byte sent or taken) before its thread drops it
REQUEST_DEADLINE = 60.0  # seconds a client has to send its whole request (headers and body), however it trickles
MAX_REQUEST_BYTES = 64 << 20  # largest request body (Content-Length) accepted


class DeadlineReader(io.RawIOBase):
    """A connection's reading side with a deadline for the whole request: before each recv the socket's timeout is
    set to what is left of it (at most `stall` seconds), so a client that trickles a byte now and then can no longer
    hold a server thread past `deadline` (time.monotonic()); reads then raise TimeoutError, as a stall does."""

    def __init__(self, sock: socket.socket, deadline: float, stall: float):
        super().__init__()
        self.sock, self.deadline, self.stall = sock, deadline, stall

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline has passed")
        self.sock.settimeout(min(left, self.stall))
        return self.sock.recv_into(buffer)


def make_server(retriever, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
                backlog: int = LISTEN_BACKLOG, timeout: float = SERVER_TIMEOUT,
                deadline: float = REQUEST_DEADLINE) -> ThreadingHTTPServer:
    """An HTTP server (not yet started: call .serve_forever()) answering Search-R1's POST /retrieve with `retriever`.

    Request {"queries": [str], "topk": int (missing, null or 0: default_topk, as Search-R1), "return_scores": bool
    (default false)} -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...] per query]}, or
    [[document, ...] per query] with return_scores false. A malformed request, or a Content-Length that is missing, not
    a decimal integer or over MAX_REQUEST_BYTES, gets 400 {"error": ...}; another path 404. port 0 picks a free port
    (server.server_address[1]). Each connection runs in its own thread, one request per connection (HTTP/1.0).
    backlog: connections the kernel queues before they are accepted (`LISTEN_BACKLOG`). timeout: seconds a connection
    may stall (no byte arrives or leaves) before its thread drops it; a body shorter than its Content-Length then gets
    408. deadline: seconds from the connection's accept to the request's last byte (`DeadlineReader`), however slowly
    it arrives; past it, 408 too (a request line or headers still unfinished: the connection is dropped). The answer
    then has `timeout` seconds to leave. Raises ValueError if backlog < 1 or timeout or deadline <= 0, OSError if the
    port is taken.
    """
    if backlog < 1:
        raise ValueError(f"backlog must be >= 1 (queued connections), got {backlog}")
    if not timeout > 0 or not deadline > 0:
        raise ValueError(f"timeout and deadline must be > 0 seconds, got {timeout} and {deadline}")

    stall_s = timeout  # (a class body cannot read an enclosing name it also assigns)

    class Handler(BaseHTTPRequestHandler):
        # setup() puts this timeout on the socket: a client that sends nothing, or less than its Content-Length, can
        # no longer hold a thread forever (BaseHTTPRequestHandler then drops the connection, or we answer 408 below).
        timeout = stall_s

        def setup(self):
            super().setup()  # then the whole request must arrive by the deadline, however it trickles
            self.rfile.close()  # (the socket stays open: its file is replaced)
            self.rfile = io.BufferedReader(DeadlineReader(self.connection, time.monotonic() + deadline, stall_s))

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
                    late = time.monotonic() >= self.rfile.raw.deadline
                    why = f"was not complete {deadline:g} s after the connection" if late else \
                        f"stalled for {timeout:g} s"
                    return self.reply(408, {"error": f"request body {why} (Content-Length {size.strip()} bytes)"})
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
            # NOTE(P23): return_scores=false gives the documents; Search-R1's server crashes on it
            docs = [[h["document"] for h in q] for q in hits]
            self.reply(200, {"result": hits if req.get("return_scores") else docs})

        def reply(self, code: int, obj: dict):
            body = json.dumps(obj).encode()
            self.connection.settimeout(stall_s)  # the answer's own time to leave (sendall: the whole of it)
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


def main(argv: list[str] | None = None):
    """python scripts/retrieval_server.py --corpus C [--port 8000] [--host 127.0.0.1]: build the index, then serve
    until ^C."""
    ap = argparse.ArgumentParser(description="Serve Search-R1's POST /retrieve over a jsonl corpus (BM25), for "
                                 "train.py / evaluate.py --retriever-url.")
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
    retriever.prepare()  # the compiled search (numba) before the first request, not during it: one line on stderr
    print(f"serving {retriever} at http://{args.host}:{server.server_address[1]}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
