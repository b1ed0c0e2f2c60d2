"""BM25's exact top-k search, compiled: SparseBM25.top_many (bm25.py) hands a batch of queries to
`top_many`, which runs `search_queries`, numba-compiled, one call per thread (SparseBM25.prepare has
it compiled first: `prepare`). The scores and ties are top_k(get_scores)'s, bit for bit; for lucene
from bm25.PRUNE_FROM passages it also prunes by MaxScore bounds (`search_queries` says how).

Shapes: D = passages, V = distinct words, nnz = postings; Q queries, k hits each.
"""

import functools
import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# The bounds keep a relative margin of 8 float32 ulps (PRUNE_SLACK); the search checks the bound
# when the lists left hold PRUNE_COST postings per passage met, and, pruned, looks the candidates up
# in a list that holds LOOKUP_COST postings per candidate (else reads the list).
PRUNE_SLACK, PRUNE_COST, LOOKUP_COST = 2.0 ** -20, 1, 32


LOCK = threading.RLock()  # compiled() and SparseBM25.prepare: one at a time in a process


def compiled():
    """(`search_queries` compiled by numba, nogil, cached in __pycache__; a thread pool of one
    thread per usable core; their number). Safe from several threads at once: the first call does
    the work under a lock, the others wait and get the same objects (functools.cache alone let two
    threads wrap the helpers twice, and numba raised "A jit decorator was called on an already
    jitted function"). Raises what `import numba` raises (ImportError, ...)."""
    with LOCK:
        return _compiled()


@functools.cache
def _compiled():
    """`compiled`, run once (under its lock)."""
    import numba

    # compiled
    global _query_terms, _add_list, _add_row, _candidates, _add_to_candidates, _kth_best
    global _term_score
    jit = numba.njit(cache=True, nogil=True)  # (numba calls them)
    _query_terms, _add_list, _add_row, _candidates, _add_to_candidates, _kth_best, _term_score = (
        map(
            jit,
            (
                _query_terms,
                _add_list,
                _add_row,
                _candidates,
                _add_to_candidates,
                _kth_best,
                _term_score,
            ),
        )
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os,
                                                    "sched_getaffinity") else os.cpu_count() or 1
    return jit(search_queries), ThreadPoolExecutor(cores), cores


def prepare(index, say) -> tuple:
    """SparseBM25.prepare's work (under its lock): `compiled()`, then one single-word search on
    bm25.SparseBM25 `index`, where numba compiles the loop for the index's types (or loads it from
    its cache); says, in one line to `say`, which and what it cost (nothing if those types were
    ready). Returns compiled()'s tuple; raises what numba raises."""
    t0 = time.perf_counter()
    ready = compiled()
    before = len(getattr(ready[0], "signatures", ())), _cache_hits(ready[0])
    # numba compiles at a signature's first call
    top_many(index, [[next(iter(index.vocab), "")]], 1, *ready)
    if len(getattr(ready[0], "signatures", ())) > before[0]:
        how = "loaded from numba's cache" if _cache_hits(ready[0]) > before[1] else \
            "compiled by numba (kept in its cache for the next run)"
        say(f"BM25 search {how} in {time.perf_counter() - t0:.1f} s")
    return ready


def _cache_hits(search) -> int:
    """Signatures numba has loaded from its on-disk cache for dispatcher `search` (0 for a plain
    function)."""
    return sum(search.stats.cache_hits.values()) if hasattr(search, "stats") else 0


def top_many(index, queries: list[list[str]], k: int, search, pool, cores: int) -> list[tuple]:
    """bm25.SparseBM25.top_many by the compiled loop: (passages [<=k] int64, scores [<=k] float64)
    of each of the Q queries (lists of words), the queries shared out over min(Q, cores) threads
    (index._shares), this one included, each thread one call of `search` (compiled `search_queries`)
    with its own scratch rows."""
    # qptr: query q's words are qwords[qptr[q]:qptr[q+1]]
    Q, threads = len(queries), min(len(queries), cores)
    # [Q + 1]
    qptr = np.fromiter(itertools.accumulate(map(len, queries), initial=0), np.int64, Q + 1)
    qwords = np.fromiter(
        map(index.vocab.get, itertools.chain.from_iterable(queries), itertools.repeat(-1)),
        # [words] term ids, -1: not indexed (_query_terms: counts)
        np.int64,
        qptr[-1],
    )
    # (each row written)
    docs, scores, found = np.empty((Q, k), np.int64), np.empty((Q, k)), np.empty(Q, np.int64)
    args = (*(index._arrays or index._search_arrays()), qptr, qwords, index.variant == "lucene",
            docs, scores, found)
    # one search at a time on the scratch rows (a threaded server may call in parallel)
    with index._lock:
        # per thread: score sums [D], passages touched [D], bits
        D, scratch = index.num_docs, index._scratch
        scratch += [(np.zeros(D), np.zeros(D, np.int32), np.zeros(D // 8 + 1, np.uint8))
                    for _ in range(threads - len(scratch))]  # (search_queries' acc, touched, marks)
        mine = index._shares(qptr, qwords, threads)  # thread t's queries (this thread: t = 0)
        others = [pool.submit(search, *args, *scratch[t], mine[t]) for t in range(1, threads)]
        search(*args, *scratch[0], mine[0])  # the compiled loop runs without the GIL
        for other in others:
            other.result()
    found = found.tolist()
    return [(docs[q, :found[q]], scores[q, :found[q]]) for q in range(Q)]


def search_queries(indptr, docs, values, count1, idf, maxv, prune, row_of, rows, qptr, qwords,
                   lucene, out_docs,
                   out_scores, out_found, acc, touched, marks, mine):
    """SparseBM25.top_many's compiled loop: the queries q in mine [<= Q] (this thread's share),
    query q being the words qwords[qptr[q]:qptr[q+1]] (term ids, -1 for a word not in the index; its
    terms and counts: `_query_terms`), into rows q of out_docs [Q, k] and out_scores [Q, k] (written
    whole: -1 and 0.0 past the hits), hits out_found[q]; scratch (zeros, left so): acc [D] float64,
    touched [D] int32, marks [D / 8 + 1] uint8 (a bit per passage). Sums and ties as get_scores and
    top_k: okapi adds its float64 values word after word from 0.0; lucene adds its float32 term
    scores w - w / (1 + value), w = count * idf (count1 [nnz]: those at count 1), in float64 (exact,
    so in any order), rounded to float32 once; the <= k best scores > 0, ties by passage order. A
    passage is met once its sum is not 0.0.

    prune (lucene, from PRUNE_FROM passages; `_search_arrays`): MaxScore (Turtle & Flood 1995;
    Lucene prunes its top-k search by such bounds). The words are added shortest posting list first.
    Before a long list, if the words left could add at most rest (the sum of their largest term
    scores; maxv [V]: each list's largest value) and rest is below theta, the k-th best sum so far,
    then a passage none of the added words holds scores at most rest < theta: no hit. The passages
    met whose sum + rest can still reach theta become the candidates (`_candidates`), a bit each in
    marks, small enough to stay in the CPU's cache where acc would not; the lists left add to them
    only (`_add_to_candidates`). The bounds keep a relative margin (PRUNE_SLACK) over float
    rounding. Without prune the words are added in query order, every list walked (okapi's sums must
    be made in that order).

    rows [R, D] float64 (`_search_arrays`): count1 of each word in more than half the passages
    (row_of [V]: its row, -1 for the others), 0.0 where it is absent. A dense pass adds such a word
    at count 1 as acc += its row, passage after passage, where its list would scatter into acc;
    adding 0.0 leaves a sum as it was, so the floats are the list's. okapi keeps its stop words,
    whose lists are most of its postings (the, of, and: in 84-95% of the passages of our QA bundle);
    measured 1.5-2x faster on them."""
    k, D, one, lo_slack, hi_slack = (
        out_docs.shape[1],
        len(acc),
        np.float32(1),
        1 - PRUNE_SLACK,
        1 + PRUNE_SLACK,
    )
    for q in mine:
        qterms, qcounts = _query_terms(qwords, qptr[q], qptr[q + 1], lucene)  # [n] each
        n = len(qterms)
        lens = np.empty(n, np.int64)  # [n] posting list lengths
        for j in range(n):
            lens[j] = indptr[qterms[j] + 1] - indptr[qterms[j]]
        # [n] words, shortest first
        order = np.argsort(lens, kind="mergesort") if prune else np.arange(n)
        # bound and postings of the words order[i:]
        rest, rest_len = np.zeros(n + 1), np.zeros(n + 1, np.int64)
        for i in range(n - 1, -1, -1):
            t = qterms[order[i]]
            if prune:
                w = np.float32(qcounts[order[i]]) * idf[t]
                # the largest term score
                rest[i] = rest[i + 1] + np.float64(w - w / (one + maxv[t]))
            rest_len[i] = rest_len[i + 1] + indptr[t + 1] - indptr[t]
        # touched[:m]: the passages met (all D if dense); words order[cut:]
        m, dense, cut, theta = 0, False, n, 0.0
        for i in range(n):  # not swept; theta: a k-th best sum so far (<= the k-th best score)
            # a check pays
            if cut == n and prune and i > 0 and rest_len[i] > PRUNE_COST * (D if dense else m):
                theta = _kth_best(acc, touched, D if dense else m, dense, k)
                if rest[i] * hi_slack < theta * lo_slack:
                    cut, m = i, _candidates(acc, touched, marks, D if dense else m, dense, rest[i],
                                            theta)
            j = order[i]
            # BM25Scorer.weight
            w = np.float32(qcounts[j]) * idf[qterms[j]] if lucene else np.float32(0)
            # count1[p] is the term score (okapi: values itself)
            once = not lucene or qcounts[j] == 1
            if cut < n:
                m, theta = _add_to_candidates(indptr, docs, values, count1, idf, qterms, qcounts, j,
                                              once, w, acc,
                                              touched, marks, m, k, theta, rest[i + 1])
                continue
            # then a pass over all D beats a list
            dense = dense or (rest_len[0] - rest_len[i + 1]) * 8 > D
            if dense and once and row_of[qterms[j]] >= 0:
                _add_row(acc, rows[row_of[qterms[j]]])
                continue
            if dense and once:
                _add_list(acc, docs, count1, indptr[qterms[j]], indptr[qterms[j] + 1])
                continue
            for p in range(indptr[qterms[j]], indptr[qterms[j] + 1]):
                d = docs[p]
                if not dense and acc[d] == 0.0:
                    touched[m], m = d, m + 1
                # Lucene's float32 term
                acc[d] += count1[p] if once else np.float64(w - w / (one + values[p]))
        # [k] best first (out_docs[q] at the end: the
        top_docs, top_scores = np.full(k, -1, np.int64), np.zeros(k)
        # the k-th best so far (0.0 until k are found: scores must be > 0)
        filled, worst, worst_doc = 0, 0.0, 0
        sweep = dense and cut == n  # all D passages in order; else touched[:m]
        for jj in range(D if sweep else m):
            d = jj if sweep else touched[jj]
            a = acc[d]
            if sweep:
                acc[d] = 0.0  # left as found, for the next query
                if a <= worst:
                    # then s <= worst: no hit (a dense pass meets passages in order: a tie comes too
                    # late)
                    continue
            else:
                acc[d], marks[d >> 3] = 0.0, 0  # (a passage met again: now 0.0)
            if a * hi_slack < theta * lo_slack:
                continue  # below a k-th best sum
            s = np.float64(np.float32(a)) if lucene else a  # lucene: the sum rounded once
            if s < worst or (s == worst and (filled < k or d > worst_doc)):
                continue  # not among the k best (ties by passage order; 0.0 and below never are)
            # insert (s, d) into the best-first slots, shifting the worse ones down
            i = min(filled, k - 1)
            while i > 0 and (
                top_scores[i - 1] < s or (top_scores[i - 1] == s and top_docs[i - 1] > d)
            ):
                top_docs[i], top_scores[i] = top_docs[i - 1], top_scores[i - 1]
                i -= 1
            top_docs[i], top_scores[i] = d, s
            filled = min(filled + 1, k)
            if filled == k:
                worst, worst_doc = top_scores[k - 1], top_docs[k - 1]
        # threads' rows share cache lines)
        out_docs[q], out_scores[q], out_found[q] = top_docs, top_scores, filled
        if dense and not sweep:
            acc[:] = 0.0


# `search_queries`' steps, compiled apart: in its loop over a posting list they would slow that loop
# down.
def _query_terms(qwords, lo, hi, lucene):
    """(term ids [n], counts [n]) of the query qwords[lo:hi] as the scores add them up, as
    SparseBM25._query_terms: okapi every known word (>= 0) again in query order, counts 1; lucene
    each distinct one once, in first-occurrence order, with its count."""
    terms, counts, n = np.empty(hi - lo, np.int64), np.ones(hi - lo, np.int64), 0
    for i in range(lo, hi):
        t, x = qwords[i], 0
        if t < 0:
            continue  # not in the index: adds 0
        while lucene and x < n and terms[x] != t:
            x += 1
        if lucene and x < n:
            counts[x] += 1  # a repeated word: one term, counted again
        else:
            terms[n], n = t, n + 1
    return terms[:n], counts[:n]


def _add_list(acc, docs, count1, lo, hi):
    """acc[docs[p]] += count1[p] for the postings p in [lo, hi) (a dense pass's word at count 1: the
    loop without the branches search_queries' own loop needs elsewhere)."""
    for p in range(lo, hi):
        acc[docs[p]] += count1[p]


def _add_row(acc, row):
    """acc += row, passage by passage ([D] each; a loop the compiler vectorizes)."""
    for d in range(len(acc)):
        acc[d] += row[d]


def _candidates(acc, touched, marks, m, dense, rest, theta):
    """The pruning step: of the passages met, touched[:m] (0..m-1 if dense), those whose sum + rest
    can reach theta become the candidates: marked and moved to touched[:s]; the others' sums are
    zeroed (if dense: all, at the end). Returns s."""
    s = 0
    for jj in range(m):
        d = jj if dense else touched[jj]
        if acc[d] > 0.0 and (acc[d] + rest) * (1 + PRUNE_SLACK) >= theta * (1 - PRUNE_SLACK):
            marks[d >> 3] |= 1 << (d & 7)
            touched[s], s = d, s + 1  # s <= jj: in place
        elif not dense:
            acc[d] = 0.0
    return s


def _add_to_candidates(indptr, docs, values, count1, idf, qterms, qcounts, j, once, w, acc, touched,
                       marks, m, k,
                       theta, rest):
    """After pruning: query word j's term scores are added to the candidates touched[:m] only, each
    looking its posting up (`_term_score`) when they are few (LOOKUP_COST), else by reading the
    word's list for the marked ones; then those whose sum + rest (the bound of the words after j)
    can no longer reach the k-th best sum are dropped. Returns (m, theta) after."""
    lo, hi = indptr[qterms[j]], indptr[qterms[j] + 1]
    if m * LOOKUP_COST < hi - lo:
        for jj in range(m):
            acc[touched[jj]] += _term_score(indptr, docs, values, idf, qterms, qcounts, j,
                                            touched[jj])
    else:
        for p in range(lo, hi):
            d = docs[p]
            if marks[d >> 3] & (1 << (d & 7)):
                acc[d] += count1[p] if once else np.float64(w - w / (np.float32(1) + values[p]))
    theta, s = max(theta, _kth_best(acc, touched, m, False, k)), 0
    for jj in range(m):
        d = touched[jj]
        if (acc[d] + rest) * (1 + PRUNE_SLACK) >= theta * (1 - PRUNE_SLACK):
            touched[s], s = d, s + 1
        else:
            marks[d >> 3] &= 255 ^ (1 << (d & 7))
            acc[d] = 0.0
    return s, theta


def _kth_best(acc, touched, m, dense, k):
    """The k-th largest sum of acc[touched[:m]] (acc[:m] if dense), 0.0 if fewer: theta."""
    best = np.zeros(k)  # [k] best first
    for jj in range(m):
        a = acc[jj if dense else touched[jj]]
        if a > best[k - 1]:
            x = k - 1
            while x > 0 and best[x - 1] < a:
                best[x] = best[x - 1]
                x -= 1
            best[x] = a
    return best[k - 1]


def _term_score(indptr, docs, values, idf, qterms, qcounts, j, d):
    """lucene query word j's term score in passage d (0.0 if d does not hold the word), its posting
    found by binary search in the word's ascending list."""
    lo, hi = indptr[qterms[j]], indptr[qterms[j] + 1]
    while lo < hi:
        mid = (lo + hi) >> 1
        if docs[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    if lo == indptr[qterms[j] + 1] or docs[lo] != d:
        return 0.0
    w = np.float32(qcounts[j]) * idf[qterms[j]]
    return np.float64(w - w / (np.float32(1) + values[lo]))
