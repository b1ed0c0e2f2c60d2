"""Search-R1's HTTP retrieval API, the client: RemoteRetriever answers retriever.BM25Retriever's
`search` from any /retrieve server (train.py / evaluate.py --retriever-url; ours is
scripts/retrieval_server.py), and the checks of a request and of an answer that both sides share."""

import http.client
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

# RemoteRetriever: seconds a server may stay silent before a try counts as failed
CLIENT_TIMEOUT = 30.0


class BadAnswer(ValueError, OSError):
    """A /retrieve server's answer that is none: a rejected request (4xx) or a body of another
    shape. A ValueError by meaning, and an OSError too, so that train.py and evaluate.py stop on it
    with one line at any step, as on a server that stopped answering
    (checkpoint.io_errors_stop_the_run, evaluate.py's loop)."""


def check_hits(result: list, url: str):
    """Raise BadAnswer (one line, showing the first bad item) unless `result` holds, per query, a
    list of hits {"document": {"contents": str, ...}, ...}: what rollout.format_passages and
    data.passage_title read."""
    for hits in result:
        bad = hits if not isinstance(hits, list) else next(
            (h for h in hits if not (isinstance(h, dict) and isinstance(h.get("document"), dict)
                                     and isinstance(h["document"].get("contents"), str))), None)
        if bad is not None:
            shown = json.dumps(bad, ensure_ascii=False)
            raise BadAnswer(f"retriever at {url} answered hits of another shape: "
                            f"{shown if len(shown) <= 120 else shown[:117] + '...'}; a /retrieve "
                            f"server answers, per "
                            'query, a list of {"document": {"id", "contents"}, "score"} '
                            '(Search-R1\'s, with '
                            '"return_scores": true)')


def check_request(queries, topk):
    """The argument checks shared by the local and the remote retriever."""
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, got one str; pass [query]")
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")


class RemoteRetriever:
    """The retriever interface (search) over HTTP, against any Search-R1 /retrieve server: ours
    (scripts/retrieval_server.py), or Search-R1's own retrieval_server.py (e5 + faiss, or pyserini
    BM25) for paper-scale corpora."""

    def __init__(self, url: str, timeout: float = CLIENT_TIMEOUT, retries: int = 2,
                 backoff: float = 1.0):
        """url: e.g. http://127.0.0.1:8000/retrieve (a bare http://host:port gets /retrieve).
        timeout: seconds the server may stay silent (connecting, or before its answer) before a try
        fails (train.py / evaluate.py --retriever-timeout). retries: further tries after a failed
        connection, a timeout or a 5xx answer, waiting backoff * 2^i seconds; a server that never
        answers costs (retries + 1) * timeout + backoff * (2^retries - 1) seconds (defaults: 93 s)
        before the ConnectionError. Raises ValueError if timeout <= 0, retries < 0 or backoff <
        0."""
        if not timeout > 0:
            raise ValueError(f"retriever timeout must be > 0 seconds (--retriever-timeout), got "
                             f"{timeout}")
        if retries < 0 or backoff < 0:
            raise ValueError(f"retries and backoff must be >= 0, got {retries} and {backoff}")
        self.url = (
            url
            if urllib.parse.urlsplit(url).path not in ("", "/")
            else url.rstrip("/") + "/retrieve"
        )
        self.timeout, self.retries, self.backoff = timeout, retries, backoff

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        """As BM25Retriever.search, answered by the server (POST {"queries", "topk",
        "return_scores": true}).

        Each failed try that is retried prints one warning line to stderr ("retriever at URL: no
        answer in 30 s (try 1 of 3); retrying in 1 s"). Raises ConnectionError (one line: what
        failed, after how long, how to start a server, which flag sets the timeout) when every try
        failed, ValueError when the server rejects the request (4xx) or answers with something that
        is not a /retrieve response (BadAnswer, also an OSError: it stops a run with one line at any
        step)."""
        check_request(queries, topk)
        if not queries:
            return []
        body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": True}).encode()
        request = urllib.request.Request(self.url, data=body,
                                         headers={"Content-Type": "application/json"})
        tries, t0 = self.retries + 1, time.monotonic()
        for attempt in range(tries):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    answer = json.load(response)
                break
            # the server answered: a 4xx is our fault, never worth retrying
            except urllib.error.HTTPError as err:
                if err.code < 500:
                    raise BadAnswer(f"retriever at {self.url} rejected the request: {err.code} "
                                    f"{err.read()[:300]!r}")
                why = f"HTTP {err.code} {err.reason}"
            # refused, reset,
            except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:
                # timed out, cut short (IncompleteRead), garbled (JSONDecodeError)
                why = self._describe(err)
            if attempt + 1 == tries:
                port = urllib.parse.urlsplit(self.url).port or 80
                raise ConnectionError(
                    f"retriever at {self.url} failed after {tries} tries in "
                    f"{time.monotonic() - t0:.1f} s (last: "
                    f"{why}). Is the server up? Start one with: python scripts/retrieval_server.py "
                    f"--corpus CORPUS "
                    f"--port {port}; a slow server needs more than {self.timeout:g} s per request: "
                    "--retriever-timeout SECONDS"
                ) from None
            wait = self.backoff * 2**attempt
            print(f"warning: retriever at {self.url}: {why} (try {attempt + 1} of {tries}); "
                  f"retrying in {wait:g} s",
                  file=sys.stderr, flush=True)
            time.sleep(wait)
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise BadAnswer(f"retriever at {self.url} answered no 'result' list of {len(queries)} "
                            f"hit lists")
        check_hits(result, self.url)
        return result

    def _describe(self, err: Exception) -> str:
        """A failed try in a few words: "no answer in 30 s", "connection refused", ..."""
        # URLError wraps connect() errors
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(reason, TimeoutError):  # socket.timeout is TimeoutError since Python 3.10
            return f"no answer in {self.timeout:g} s"
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, ConnectionResetError):  # http.client.RemoteDisconnected included
            return "connection reset"
        if isinstance(reason, ValueError):
            return f"unreadable answer ({type(reason).__name__}: {reason})"
        return reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"

    def __str__(self):
        return f"retriever at {self.url}"
