"""Puts tests/ on the path (tiny.py); `--exercise NAME`: run only the tests tagged @pytest.mark.exercise(NAME), the
course's graded tests (tests/test_exercises.py, course/grade.py, docs/course.md); the `one_thread` fixture.

Convention (issue 22, enforced by tests/test_float_compare.py): a computed float is compared with a tolerance chosen
from its dtype (float32: rel 1e-5, abs 1e-6; Python floats: pytest.approx's defaults; a 0 by construction: abs 1e-12),
never with ==, torch.equal or the like, since another CPU rounds vectorised sums differently; a deliberate exact
comparison (the same computation twice on this machine, a bit-for-bit claim, a setting) ends its line `# exact: <why>`."""

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
# One torch thread in the tests' own processes and the commands they start, unless the caller chose: README's
# `pytest -n 2` runs two test processes on two cores, and torch's default (a thread per core) then makes the tiny
# models' many small operations wait on each other's cores (machinery.policy.busy_cpu_note: 5-70x slower).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser):
    parser.addoption("--exercise", action="append", default=[], metavar="NAME",
                     help="run only the tests of this course exercise (repeatable; docs/course.md)")


# The suite's longest tests (`pytest -n 2 --durations=15`, 2026-12-06: 92 s down to 18 s), run first: under README's
# `pytest -n 2` the two workers then end on short tests together, not one of them on a long test alone. Only the order
# changes; a test missing from the list runs in its place as before.
SLOW_FIRST = ("test_learn.py::", "test_gpu_check.py::test_tiny_run", "test_fsdp.py::test_fsdp_train_runs",
              "test_grader.py::test_attacks_score_0", "test_gpu_check.py::test_real_model_tiny",
              "test_course.py::test_the_grader_gives_full", "test_checkpoint.py::test_kill_at_every_point",
              "test_train.py::test_train_same_rewards", "test_course.py::test_a_file_that_does_not_parse",
              "test_gpu_check.py::test_fsdp_on_and_the_decode", "test_grader.py::test_a_top_level_import",
              "test_retriever.py::test_bm25_flag_in_every", "test_course.py::test_student_copy_scores",
              "test_probe.py::test_the_command_prints")


def pytest_collection_modifyitems(config, items):
    rank = {it: next((i for i, name in enumerate(SLOW_FIRST) if name in it.nodeid), len(SLOW_FIRST)) for it in items}
    items.sort(key=rank.__getitem__)  # stable: the rest keep their order
    names = config.getoption("--exercise")
    if not names:
        return
    chosen = [it for it in items if (m := it.get_closest_marker("exercise")) and m.args and m.args[0] in names]
    config.hook.pytest_deselected(items=[it for it in items if it not in chosen])
    items[:] = chosen


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): the tiny models are far
    faster so, with no contention with other CPU jobs; the thread count is restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok():
    """The tests' tokenizer (tiny.py); a module may define its own `tok`, which then takes precedence."""
    from tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    """A tiny random Qwen2 for `tok`, seed 0 (tiny.py)."""
    from tiny import build_model

    return build_model(tok, seed=0)


# --------------------------------------------------------------------------------------------------
# Shared helpers. The test files import these (`from conftest import ...`); no test file imports
# another. Imports of the repository's modules stay inside the helpers that use them.

import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
from collections import Counter  # noqa: E402

import torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollout import make_prompt as _MAKE_PROMPT  # noqa: E402

# The rooms beside the top-level files: what each holds, and the rooms whose files its own files import (a room's file
# puts those folders on sys.path; tests: its helpers, tiny.py and hang.py, not the test files, which nothing imports).
# Each file of a tool room is run by its path (`python lab/spiral.py`); machinery is a package, imported as one.
# tests/test_structure.py checks them; tests/test_docs.py names the rooms.
ROOMS = {
    "machinery": ("what the concepts run on: data, BM25, decoding engines, the policy's passes, checkpoints, FSDP, "
                  "the memory plan, tracking (engine.py's demo: the tests' tiny model)", {"tests"}),
    "scripts": ("the commands around train.py: make the data, serve retrieval, plot a run", set()),
    "lab": ("the search world, its warm starts (world0_policy/: the committed one) and the spiral grid", {"scripts"}),
    "course": ("the course kit: a student copy, its grader and the grader's plugin", {"tests"}),
    "benchmarks": ("bench_*.py: what a part costs, ours against its peers", {"scripts", "lab", "tests"}),
    "gpu": ("what a GPU user runs first: the memory plan and the GPU check", {"benchmarks", "lab", "tests"}),
    "tests": ("the suite, its fixtures, the course's planted mistakes and the helpers (tiny.py, hang.py)", set()),
}


# --- the tiny model's runs of train.py (tests/test_train.py, test_checkpoint.py, test_probe.py, test_fsdp.py)

QUESTIONS = [
    {"question": "Where is the Eiffel Tower", "golden_answers": ["Paris"], "data_source": "toy"},
    {"question": "What is the capital of Germany", "golden_answers": ["Berlin"], "data_source": "toy"},
    {"question": "Which river flows through the Netherlands", "golden_answers": ["Rhine"], "data_source": "toy"},
]

# --amp off: the tests' tolerances are fp32's, and --amp auto would take bf16 on a CPU with bf16 units (a test
# that wants autocast says --amp bf16 or auto after these)
SMALL = ["--prompts-per-step", "2", "--group-size", "4", "--max-turns", "2", "--max-new-tokens", "16",
         "--max-obs-tokens", "48", "--mini-batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-3",
         "--amp", "off"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A folder with the tiny model (tiny.save_tiny), QUESTIONS as q.jsonl and the demo corpus, per test module."""
    from machinery.data import DEMO_CORPUS
    from tiny import save_tiny

    d = tmp_path_factory.mktemp("run")
    (d / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (d / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in DEMO_CORPUS))
    return {"dir": d, "model": save_tiny(d / "model"), "q": str(d / "q.jsonl"), "corpus": str(d / "corpus.jsonl")}


def train_in_process(files, out, *extra):
    """train.main in this process on `files`, one thread, with SMALL and `extra` flags; the metrics it wrote."""
    import train

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # far faster for the tiny model on a busy CPU
    try:
        train.main(train.parse_args(["--model", files["model"], "--train-data", files["q"], "--corpus", files["corpus"],
                               "--out-dir", str(out), "--kl-coef", "0.01", "--llds", "0.1", *SMALL, *extra]))
    finally:
        torch.set_num_threads(n)
    return [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]


def same_value(a, b, tol=1e-6) -> bool:
    """Metric values equal: floats to `tol` (pytest.approx), anything else (None, str, int, bool) exactly. pytest >= 9.2
    raises TypeError for pytest.approx of a string, so strings never go through it."""
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return a == pytest.approx(b, abs=tol, rel=0)
    return type(a) is type(b) and a == b


# --- a scripted policy's rollouts (tests/test_rollout.py, test_engine.py, test_evaluate.py)

Q1, Q2 = "What is the capital of France", "Where is the Eiffel Tower"


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


class ScriptedPolicy:
    """Force row r's next token to scripts[question][turn][k], k = tokens this row already generated in this turn.
    A logits processor, (input_ids [n, S], scores [n, V]) -> [n, V], as transformers' LogitsProcessorList calls one
    (any such callable; not a subclass, so that the processes that load this file, the grader's among them, do not
    import transformers for it).

    scripts: {question: [turn-0 ids, turn-1 ids, ...]}. Past the end of a script the pad id is forced (rows that
    finished are overwritten with pad by `generate` anyway; an unfinished row would show the pads and fail the test).
    Records, at the first step of every generate call, each row's context (left padding stripped) in `contexts` as
    (question, turn, ids), and the number of generate calls in `calls`.
    """

    def __init__(self, tokenizer, scripts):
        make_prompt = _MAKE_PROMPT  # rollout's own, as imported: a test may monkeypatch rollout.make_prompt
        self.tok = tokenizer
        self.scripts = scripts
        self.pad = tokenizer.pad_token_id
        self.prompts = {q: enc(tokenizer, make_prompt(q, tokenizer)) for q in scripts}
        self.prev = None
        self.start = None
        self.rows = []
        self.contexts = []
        self.calls = 0

    def _identify(self, row_ids):
        i = 0
        while i < len(row_ids) and row_ids[i] == self.pad:  # left padding (the prompt never starts with pad)
            i += 1
        ctx = row_ids[i:]
        hits = [q for q, p in self.prompts.items() if ctx[: len(p)] == p]
        assert len(hits) == 1, f"context matches {len(hits)} scripted prompts"
        q = hits[0]
        text = self.tok.decode(ctx[len(self.prompts[q]):])
        turn = text.count("<information>") + text.count("My previous action is invalid")
        assert turn < len(self.scripts[q]), f"no script for turn {turn} of {q!r}"
        self.contexts.append((q, turn, ctx))
        return q, turn

    def __call__(self, input_ids, scores):
        n, width = input_ids.shape
        same_call = (self.prev is not None and self.prev.shape == (n, width - 1)
                     and torch.equal(self.prev, input_ids[:, :-1]))  # exact: token ids
        if not same_call:  # first step of a new generate call: every row starts a turn here
            self.calls += 1
            self.start = width
            self.rows = [self._identify(r) for r in input_ids.tolist()]
        self.prev = input_ids.clone()
        k = width - self.start
        forced = torch.full_like(scores, float("-inf"))
        for r, (q, turn) in enumerate(self.rows):
            script = self.scripts[q][turn]
            forced[r, script[k] if k < len(script) else self.pad] = 0.0
        return forced


def hit(contents, id="0"):
    """One search hit, as retriever.BM25Retriever.search returns it."""
    return {"document": {"id": id, "contents": contents}, "score": 1.0}


class FakeRetriever:
    """A search callable: (queries, topk) -> one list of hits per query, fn(query); records every call. The default
    hit's passage reads "Doc 1(Title: {q}) Some text about {q}.\\n" to the model (`text`)."""

    def __init__(self, fn=lambda q: [hit(f"{q}\nSome text about {q}.")]):
        self.fn = fn
        self.calls = []

    def __call__(self, queries, topk):
        self.calls.append((list(queries), topk))
        return [self.fn(q) for q in queries]

    def text(self, query):
        """The passages the model sees for `query` (format_passages of its hits)."""
        from rollout import format_passages

        return format_passages(self.fn(query))


GEN_KW = ("max_new_tokens", "temperature", "top_p", "do_sample", "batch_size")  # hf_generator's, the rest rollout's


def scripted_rollout(model, tok, scripts, golds, retriever=None, **kw):
    """Roll out the scripted policy on one row per entry of `scripts` (golds: {question: [gold, ...]}): hf_generator
    with the policy as its logits processor. kw: GEN_KW go to hf_generator, the others to rollout."""
    from machinery.engine import hf_generator
    from rollout import STOP_STRINGS, rollout

    policy = ScriptedPolicy(tok, scripts)
    rows = [{"question": q, "golden_answers": golds[q]} for q in scripts]
    gen = {k: kw.pop(k) for k in GEN_KW if k in kw}
    gen.setdefault("max_new_tokens", 40)
    kw.setdefault("group_size", 1)
    generate = hf_generator(model, tok, stop_strings=STOP_STRINGS, logits_processor=[policy], **gen)
    eps = rollout(generate, tok, rows, retriever or FakeRetriever(), **kw)
    return eps, policy


# --- BM25 against hand-written references (tests/test_bm25.py, test_retriever.py, test_retrieval_server.py)

QA_SAMPLE = ROOT / "tests" / "fixtures" / "qa_sample"  # real passages and questions, a sample (its README.md)

TOY = [
    {"id": "a", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "b", "contents": '"Lyon"\nLyon is a city in France, on the Rhone.'},
    {"id": "c", "contents": '"Berlin"\nBerlin is the capital of Germany. Berlin is large.'},
    {"id": "d", "contents": '"Rhone"\nThe Rhone flows from Switzerland through France.'},
    {"id": "e", "contents": '"Apple"\nAn apple is a fruit.'},
    {"id": "f", "contents": '"Paris (mythology)"\nParis of Troy took Helen to Troy.'},
    {"id": "g", "contents": '"Lyon"\nLyon is a city in France, on the Rhone.'},  # duplicate of "b": tie on every query
]

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


def brute_force_stats(corpus, epsilon=0.25):
    """Per-passage term counts, lengths, avgdl and idf, computed with plain loops (independent of bm25.py):
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


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def compiled_sized_corpus(tmp_path) -> pathlib.Path:
    """The real sample's 600 passages four times over (2,400: above bm25.NUMBA_FROM, so the compiled search is used
    where numba is installed), as a jsonl file."""
    from machinery.data import load_corpus

    rows = load_corpus(QA_SAMPLE / "corpus.jsonl")
    return write_lines(tmp_path / "big.jsonl", [json.dumps({"id": f"{r}-{row['id']}", "contents": row["contents"]})
                                                for r in range(4) for row in rows])
