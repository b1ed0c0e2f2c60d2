"""Tests for evaluate.py: the metrics (EM / F1 / sub-EM / retrieval recall) on hand-made cases, the per-source table
and its Gen / MH / Avg columns, the paper's stored numbers, the benchmark loader, the plot command and bad input.
CPU only, no network, a few seconds (one short subprocess)."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import evaluate as E  # noqa: E402
from machinery import paper  # noqa: E402
from machinery.data import DEMO_CORPUS, load_questions  # noqa: E402
from machinery.engine import hf_generator  # noqa: E402
from retriever import BM25Retriever  # noqa: E402
from rollout import STOP_STRINGS, em_check, rollout  # noqa: E402
from conftest import ScriptedPolicy, hit  # noqa: E402
from tiny import build_model, build_tokenizer, save_tiny  # noqa: E402

# ----------------------------------------------------------------------------------------------------------------------
# Metrics


def test_f1_hand_cases():
    # "the Eiffel tower" -> [eiffel, tower]; "Eiffel Tower in Paris" -> [eiffel, tower, in, paris]:
    # 2 common, P = 2/2, R = 2/4, F1 = 2 * 1 * 0.5 / 1.5 = 2/3
    assert E.f1_score("the Eiffel tower", ["Eiffel Tower in Paris"]) == pytest.approx(2 / 3)
    # max over golds: vs "Lyon" 0; vs "Paris": P = 1/2, R = 1, F1 = 2/3
    assert E.f1_score("Paris France", ["Lyon", "Paris"]) == pytest.approx(2 / 3)
    # multiset overlap: [new, new, york] vs [new, york]: common = 1 new + 1 york = 2, P = 2/3, R = 1, F1 = 0.8
    assert E.f1_score("new new york", "New York") == pytest.approx(0.8)
    assert E.f1_score("Yes.", ["yes"]) == pytest.approx(1.0)
    assert E.f1_score("yes it is", ["yes"]) == pytest.approx(0.0)  # FlashRAG / HotpotQA: yes/no only counts when exact
    assert E.f1_score("no", ["no way out"]) == pytest.approx(0.0)
    assert E.f1_score("Lyon", ["Paris"]) == pytest.approx(0.0) and E.f1_score("", ["Paris"]) == pytest.approx(0.0)


def test_sub_em_hand_cases():
    assert E.sub_em("It is in Paris, France.", ["Lyon", "paris"]) == 1.0
    assert E.sub_em("Lyon", ["Paris"]) == 0.0
    assert E.sub_em("comparison", ["Paris"]) == 1.0  # a character substring, as FlashRAG (not whole words)
    assert E.sub_em("anything at all", ["The"]) == 0.0  # P20: a gold that normalises to "" never counts
    assert E.sub_em("Eiffel Tower", ["the Eiffel Tower in Paris"]) == 0.0  # the gold must sit in the answer


def test_no_answer_scores_zero_and_em_is_the_training_reward():
    for metric in (em_check, E.f1_score, E.sub_em):
        assert metric(None, ["Paris"]) == pytest.approx(0.0)
    assert em_check("the Eiffel Tower", ["Eiffel Tower"]) == 1.0
    # a longer answer: EM 0, sub-EM 1, F1 = 2 * (2/3) * 1 / (2/3 + 1) = 0.8
    assert em_check("Eiffel Tower Paris", ["Eiffel Tower"]) == 0.0
    assert E.sub_em("Eiffel Tower Paris", ["Eiffel Tower"]) == 1.0
    assert E.f1_score("Eiffel Tower Paris", "Eiffel Tower") == pytest.approx(0.8)


def test_retrieved_titles_and_recall_on_hand_made_observations():
    obs = [[hit('"Eve Beglarian"\nEve Beglarian is a composer (born 1958).'),  # one list of hits per search
            hit('"Ew! (song)"\nA song (2014) by Jimmy Fallon.')],
           [hit("Zach Bogosian\nAn ice hockey player."), hit('""Weird Al" Yankovic"\nA musician.')]]
    titles = E.retrieved_titles(obs)
    assert titles == ["Eve Beglarian", "Ew! (song)", "Zach Bogosian", '"Weird Al" Yankovic']
    assert E.recall(["Eve Beglarian", "Jimmy Fallon"], titles) == pytest.approx(0.5)  # 1 of 2 gold paragraphs retrieved
    assert E.recall(["eve  beglarian", "Zach Bogosian", '"Weird Al" Yankovic'], titles) == pytest.approx(1.0)
    assert E.recall([], titles) is None and E.recall(None, titles) is None  # nothing to recall: not scored
    assert E.recall(["Jimmy Fallon"], []) == pytest.approx(0.0)
    # a passage's text is never read for titles (parsing the formatted text found one in this passage's 2nd line)
    assert E.retrieved_titles([[hit('"Jimmy Fallon"\nHe wrote\nDoc 2(Title: x) inline')]]) == ["Jimmy Fallon"]


def test_rollout_records_what_the_retriever_returned():
    """Episode.retrieved holds each search's hits (retriever.search), not the model's own words."""
    tok = build_tokenizer()
    corpus = [{"id": "0", "contents": '"Eve Beglarian"\nEve Beglarian is an American composer.'},
              {"id": "1", "contents": '"Zach Bogosian"\nZach Bogosian is an ice hockey player.'}] + DEMO_CORPUS
    q = "Are Eve Beglarian and Zach Bogosian both of Armenian descent"
    def enc(s):
        return tok.encode(s, add_special_tokens=False)
    script = {q: [enc("<search> Eve Beglarian composer </search>"), enc("Doc 9(Title: Fake) <answer> yes </answer>")]}
    generate = hf_generator(build_model(tok, seed=0), tok, stop_strings=STOP_STRINGS, max_new_tokens=40,
                            logits_processor=[ScriptedPolicy(tok, script)])
    bm25 = BM25Retriever(corpus)
    ep, = rollout(generate, tok, [{"question": q, "golden_answers": ["yes"]}], bm25.search, group_size=1, max_turns=2,
                  topk=1)
    assert ep.num_searches == 1 and ep.retrieved == [bm25.search(["Eve Beglarian composer"], 1)[0]] and ep.reward == 1.0
    assert E.retrieved_titles(ep.retrieved) == ["Eve Beglarian"]  # the model's "Doc 9(Title: Fake)" is not counted
    assert E.recall(["Eve Beglarian", "Zach Bogosian"], E.retrieved_titles(ep.retrieved)) == pytest.approx(0.5)


# ----------------------------------------------------------------------------------------------------------------------
# Table and averages


def test_column_names_follow_the_paper():
    assert [E.column(s) for s in ("nq", "2wiki", "2WikiMultihopQA", "trivia_qa", "Bamboogle", "toy")] == \
        ["NQ", "2Wiki", "2Wiki", "TQA", "Bamb.", "toy"]


def test_score_table_averages_with_missing_sources():
    recs = [{"data_source": "nq", "em": 1.0, "f1": 1.0, "sub_em": 1.0, "searches": 1, "recall": None},
            {"data_source": "nq", "em": 0.0, "f1": 0.5, "sub_em": 1.0, "searches": 2, "recall": None},
            {"data_source": "triviaqa", "em": 0.0, "f1": 0.0, "sub_em": 0.0, "searches": 0, "recall": None},
            {"data_source": "hotpotqa", "em": 1.0, "f1": 1.0, "sub_em": 1.0, "searches": 2, "recall": 0.5},
            {"data_source": "2wiki", "em": 0.0, "f1": 0.0, "sub_em": 0.0, "searches": 1, "recall": 1.0},
            {"data_source": "2wikimultihopqa", "em": 1.0, "f1": 1.0, "sub_em": 1.0, "searches": 3, "recall": 0.0},
            {"data_source": "toy", "em": 1.0, "f1": 1.0, "sub_em": 1.0, "searches": 0, "recall": None}]
    t = E.score_table(recs)
    assert list(t) == ["NQ", "TQA", "HotpotQA", "2Wiki", "toy", "Gen-Avg", "MH-Avg", "average"]  # paper order first
    assert t["NQ"] == pytest.approx({"n": 2, "em": 0.5, "f1": 0.75, "sub_em": 1.0, "searches": 1.5})  # no gold titles
    assert t["2Wiki"]["n"] == 2 and t["2Wiki"]["recall"] == pytest.approx(0.5)  # both spellings are one source
    # Gen-Avg = mean(NQ 0.5, TQA 0.0) = 0.25; MH-Avg = mean(HotpotQA 1.0, 2Wiki 0.5) = 0.75;
    # Avg = mean over the 5 sources (0.5 + 0 + 1 + 0.5 + 1) / 5 = 0.6, unweighted (7 questions would give 4/7)
    assert t["Gen-Avg"]["em"] == pytest.approx(0.25) and t["Gen-Avg"]["sources"] == ["NQ", "TQA"]
    assert t["Gen-Avg"]["n"] == 3
    assert t["MH-Avg"]["em"] == pytest.approx(0.75)
    assert t["MH-Avg"]["recall"] == pytest.approx(0.5)  # mean(HotpotQA 0.5, 2Wiki 0.5)
    assert t["average"]["em"] == pytest.approx(0.6) and t["average"]["n"] == 7
    text = "\n".join(E.table_lines(t))
    assert "not run: PopQA" in text and "not run: Musique, Bamb." in text
    assert re.search(r"^NQ\s+2\s+0\.500\s+0\.750\s+1\.000\s+1\.500\s+–$", text, re.M), text


def test_score_table_only_em_keeps_the_old_shape():
    t = E.score_table([{"data_source": "a", "em": 1.0}, {"data_source": "a", "em": 0.0},
                       {"data_source": "b", "em": 1.0}])
    want = {"a": {"n": 2, "em": 0.5}, "b": {"n": 1, "em": 1.0}, "average": {"n": 3, "em": 0.75}}
    assert t.keys() == want.keys() and all(t[k] == pytest.approx(v) for k, v in want.items())  # approx: not nested


# ----------------------------------------------------------------------------------------------------------------------
# The paper's numbers


def test_compare_lines_puts_our_row_under_the_papers():
    row = paper.paper_row("3B-Ins +LLDS")
    full = E.score_table([{"data_source": c, "em": v} for c, v in zip(E.COLUMNS, row) if c not in ("Gen", "MH", "Avg")])
    lines = E.compare_lines(full, "3B-Ins +LLDS")
    assert lines[0].split()[1:] == list(E.COLUMNS) and lines[1].startswith("3B-Ins +LLDS ")
    ours = lines[-1].split()[1:]
    assert lines[-1].startswith("ours") and ours == lines[1].split()[-10:]  # same numbers, nothing partial
    part = E.compare_lines(E.score_table([{"data_source": "hotpotqa", "em": 0.5}, {"data_source": "nq", "em": 0.25}]))
    assert len(part) == 2 + len(paper.PAPER) + 1
    assert part[-2].split()[1:] == ["0.250", "–", "–", "0.250*", "0.500", "–", "–", "–", "0.500*", "0.375*"]
    assert part[-1].startswith("*")


# ----------------------------------------------------------------------------------------------------------------------
# Data: benchmarks and bad input


def test_benchmarks_load_test_else_dev(monkeypatch):
    calls = []
    monkeypatch.setattr(E, "load_questions", lambda src, split: calls.append((src, split)) or [])
    for name in E.benchmark_names("all"):
        E.load_benchmark(name)
    assert calls == [("RUC-NLPIR/FlashRAG_datasets:nq", "test"), ("RUC-NLPIR/FlashRAG_datasets:triviaqa", "test"),
                     ("RUC-NLPIR/FlashRAG_datasets:popqa", "test"), ("RUC-NLPIR/FlashRAG_datasets:hotpotqa", "dev"),
                     ("RUC-NLPIR/FlashRAG_datasets:2wikimultihopqa", "dev"),
                     ("RUC-NLPIR/FlashRAG_datasets:musique", "dev"), ("RUC-NLPIR/FlashRAG_datasets:bamboogle", "test")]
    assert E.benchmark_names(" nq, musique ") == ["nq", "musique"]
    with pytest.raises(ValueError, match="unknown.*2wiki.*choose"):
        E.benchmark_names("nq,2wiki")

    def offline(src, split):
        raise ConnectionError("Couldn't reach 'RUC-NLPIR/FlashRAG_datasets' on the Hub")

    monkeypatch.setattr(E, "load_questions", offline)
    with pytest.raises(ConnectionError, match=r"musique.*'dev'.*pass it with --data"):
        E.load_benchmark("musique")


def test_rows_keep_id_and_metadata(tmp_path):
    f = tmp_path / "hotpotqa_test.jsonl"
    row = {"id": "5ab9", "question": "q?", "golden_answers": ["yes"], "data_source": "hotpotqa",
           "metadata": {"type": "comparison", "supporting_titles": ["Eve Beglarian", "Zach Bogosian"]}}
    f.write_text(json.dumps(row) + "\n" + json.dumps({"question": "r?", "golden_answers": ["no"]}) + "\n")
    first, second = load_questions(str(f))
    assert first == row and second == {"question": "r?", "golden_answers": ["no"], "data_source": "hotpotqa"}


@pytest.mark.parametrize("text, message", [
    ('{"question": "q?", "golden_answers": ["a"]}\n{"question": "no gold"}\n', ":2: missing field 'golden_answers'"),
    ('{"question": "q?", "golden_answers": ["a"]}\n\n{"golden_answers": ["a"]}\n',
     ":3: missing or empty field 'question'"),  # line numbers count blank lines
    ("", "no questions"),
])
def test_bad_question_file_is_one_clear_error(tmp_path, text, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(SystemExit, match=re.escape(f"error: {f}") + ".*" + re.escape(message)):
        E.main(["--model", "never/loaded", "--data", str(f)])


def test_eval_needs_data_and_names_bad_benchmarks():
    with pytest.raises(SystemExit, match="--data and/or --benchmarks"):
        E.main(["--model", "never/loaded"])
    with pytest.raises(SystemExit, match="unknown.*'wikiqa'"):
        E.main(["--model", "never/loaded", "--benchmarks", "nq,wikiqa"])


def test_eval_end_to_end_on_the_tiny_model(tmp_path, capsys):
    model = save_tiny(tmp_path / "model")
    rows = [{"id": "h1", "question": "Where is the Eiffel Tower", "golden_answers": ["Paris"],
             "data_source": "hotpotqa", "metadata": {"supporting_titles": ["Eiffel Tower"]}},
            {"question": "What is the capital of Germany", "golden_answers": ["Berlin"], "data_source": "nq"}]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "0", "contents": '"Eiffel Tower"\nIt is in Paris.'}) + "\n")
    out = tmp_path / "eval.json"
    E.main(["--model", model, "--data", str(tmp_path / "q.jsonl"), "--corpus", str(tmp_path / "c.jsonl"),
            "--max-turns", "1", "--max-new-tokens", "6", "--batch-size", "1", "--out", str(out), "--compare-paper",
            "7B-Base"])
    printed = capsys.readouterr().out
    assert "MH-Avg" in printed and "7B-Base +LLDS" in printed and "3B-Base" not in printed
    res = json.loads(out.read_text())
    by_id = {r["id"]: r for r in res["records"]}
    assert set(by_id) == {"h1", None} and by_id["h1"]["recall"] is not None and by_id[None]["recall"] is None
    for r in res["records"]:
        assert {"em", "f1", "sub_em", "recall", "searches", "retrieved_titles", "answer", "text"} <= set(r)
    assert res["scores"]["HotpotQA"]["n"] == 1 and res["scores"]["average"]["n"] == 2


def test_unwritable_out_fails_before_the_model_loads(tmp_path):
    """Today's main found out after the whole evaluation and lost every record. (As root every folder is writable,
    so the parent of --out is a regular file here.)"""
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "q?", "golden_answers": ["a"]}) + "\n")
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match=re.escape(f"error: --out {tmp_path}/file/eval.json: cannot write there")):
        E.main(["--model", "never/loaded", "--data", str(tmp_path / "q.jsonl"), "--out",
                str(tmp_path / "file" / "eval.json")])


def test_records_are_written_as_they_are_produced(tmp_path, monkeypatch):
    """A crash in the second batch keeps the first batch's records in eval.jsonl.partial (eval.json and eval.jsonl
    appear only once the evaluation is complete)."""
    model = save_tiny(tmp_path / "model")
    rows = [{"question": f"Where is thing {i}", "golden_answers": ["Paris"]} for i in range(3)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in DEMO_CORPUS))
    calls, real = [0], E.rollout

    def crash_second(*a, **kw):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("killed in batch 2")
        return real(*a, **kw)

    monkeypatch.setattr(E, "rollout", crash_second)
    out = tmp_path / "eval.json"
    with pytest.raises(RuntimeError, match="killed in batch 2"):
        E.main(["--model", model, "--data", str(tmp_path / "q.jsonl"), "--corpus", str(tmp_path / "c.jsonl"),
                "--max-turns", "0", "--max-new-tokens", "4", "--batch-size", "2", "--out", str(out)])
    kept = [json.loads(line) for line in (tmp_path / "eval.jsonl.partial").read_text().splitlines()]
    assert [r["question"] for r in kept] == ["Where is thing 0", "Where is thing 1"]
    assert not out.exists() and not (tmp_path / "eval.jsonl").exists()


def tiny_eval_files(tmp_path, n=3):
    """(tiny model folder, questions file, corpus file) for a fast evaluate.main."""
    model = save_tiny(tmp_path / "model")
    rows = [{"question": f"Where is thing {i}", "golden_answers": ["Paris"]} for i in range(n)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in DEMO_CORPUS))
    return model, str(tmp_path / "q.jsonl"), str(tmp_path / "c.jsonl")


TINY_EVAL = ["--max-turns", "0", "--max-new-tokens", "4", "--batch-size", "2"]


def test_out_is_never_an_input(tmp_path):
    """`--data t.jsonl --out t.json` wrote the records over the question file t.jsonl (opened before the model loaded);
    --out equal to --data, --corpus or a file of the model's folder was not refused either. Each is one line now,
    before anything is read or written, and every input keeps its bytes."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    q, corpus = tmp_path / "t.jsonl", tmp_path / "c.jsonl"
    q.write_text(json.dumps({"question": "q?", "golden_answers": ["a"]}) + "\n")
    corpus.write_text(json.dumps(DEMO_CORPUS[0]) + "\n")
    before = {f: f.read_bytes() for f in (q, corpus, model / "config.json")}
    for out, message in (
            (tmp_path / "t.json", f"--out {tmp_path}/t.json: its records file {q} is the --data file {q}: evaluate.py "
                                  "never writes over its inputs"),
            (q, f"--out {q} is the --data file {q}"),
            (corpus, f"--out {corpus} is the --corpus file {corpus}"),
            (model / "config.json", f"--out {model}/config.json is the --model file {model}/config.json")):
        with pytest.raises(SystemExit, match=re.escape(f"error: {message}")):
            E.main(["--model", str(model), "--data", str(q), "--corpus", str(corpus), "--out", str(out),
                    "--overwrite"])
    assert {f: f.read_bytes() for f in before} == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "c.jsonl", "model", "t.jsonl"]
    (tmp_path / "notes.json").write_text("my notes")  # no input, but no evaluation either: never replaced
    with pytest.raises(SystemExit, match=f"--out {tmp_path}/notes.json exists and is no evaluation evaluate.py wrote"):
        E.main(["--model", str(model), "--data", str(q), "--out", str(tmp_path / "notes.json"), "--overwrite"])
    assert (tmp_path / "notes.json").read_text() == "my notes"


def test_a_checkpoints_evaluation_goes_to_its_run_folder(tmp_path):
    """`--model RUN/checkpoints/step_N` wrote eval.json inside the checkpoint folder, which the run's next save deletes.
    The default is RUN/eval_step_N.json now, and an --out inside a checkpoint folder is refused."""
    model, q, corpus = tiny_eval_files(tmp_path)
    ckpt = tmp_path / "run" / "checkpoints" / "step_000003"
    ckpt.parent.mkdir(parents=True)
    Path(model).rename(ckpt)
    inside = sorted(p.name for p in ckpt.iterdir())
    with pytest.raises(SystemExit, match=re.escape(f"error: --out {ckpt}/eval.json lies inside the checkpoint folder "
                                                   f"{ckpt}, which its run's next save may delete; write it to the run "
                                                   f"folder (the default: {tmp_path}/run/eval_step_3.json)")):
        E.main(["--model", str(ckpt), "--data", q, "--corpus", corpus, *TINY_EVAL, "--out", str(ckpt / "eval.json")])
    E.main(["--model", str(ckpt), "--data", q, "--corpus", corpus, *TINY_EVAL])
    assert sorted(p.name for p in ckpt.iterdir()) == inside
    assert len(json.loads((tmp_path / "run" / "eval_step_3.json").read_text())["records"]) == 3
    assert len((tmp_path / "run" / "eval_step_3.jsonl").read_text().splitlines()) == 3
    assert E.default_out(str(tmp_path / "run")) == tmp_path / "run" / "eval.json"  # a run folder: as before
    assert E.default_out("Qwen/Qwen2.5-3B") == Path("eval.json")


def test_an_earlier_evaluation_needs_overwrite_and_stays_until_the_new_one_is_complete(tmp_path, monkeypatch):
    """An --out that holds an evaluation was replaced without a word, and a run that failed left the old eval.json
    beside a new, partial eval.jsonl. Now it is refused without --overwrite; with it, a failing run leaves both old
    files as they were (the new records in eval.jsonl.partial), and a complete one replaces both."""
    model, q, corpus = tiny_eval_files(tmp_path)
    out, records = tmp_path / "eval.json", tmp_path / "eval.jsonl"
    argv = ["--model", model, "--data", q, "--corpus", corpus, *TINY_EVAL, "--out", str(out)]
    E.main(argv)
    old = {f: f.read_bytes() for f in (out, records)}
    with pytest.raises(SystemExit, match=re.escape(f"error: --out {out}: an earlier evaluation is there ({out}, "
                                                   f"{records}): pass --overwrite")):
        E.main(argv)
    assert {f: f.read_bytes() for f in old} == old

    calls, real = [0], E.rollout

    def fail_second(*a, **kw):  # the retrieval server stops answering in batch 2
        calls[0] += 1
        if calls[0] == 2:
            raise ConnectionError("retriever at http://x/retrieve failed after 3 tries")
        return real(*a, **kw)

    monkeypatch.setattr(E, "rollout", fail_second)
    with pytest.raises(SystemExit, match=re.escape(f"The 2 questions scored so far are in {records}.partial")):
        E.main([*argv, "--overwrite"])
    monkeypatch.undo()
    assert {f: f.read_bytes() for f in old} == old and len(Path(f"{records}.partial").read_text().splitlines()) == 2
    with pytest.raises(SystemExit, match=re.escape(f"({out}, {records}, {records}.partial): pass --overwrite")):
        E.main(argv)
    E.main(argv[:-2] + ["--limit", "2", "--out", str(out), "--overwrite"])  # complete: both files replaced at once
    assert json.loads(out.read_text())["limit"] == 2 and len(records.read_text().splitlines()) == 2
    assert not Path(f"{records}.partial").exists()


def test_overwrite_keeps_a_stopped_evaluations_records_until_the_new_one_is_complete(tmp_path, monkeypatch):
    """--overwrite emptied a killed evaluation's eval.jsonl.partial at the start (8 scored records -> 0 bytes before
    the new run had scored anything), where its refusal line and --help promise the old files stay until the new one is
    complete. Now the new records go beside them (.partial.new); a second stopped run is one line, not a loss."""
    model, q, corpus = tiny_eval_files(tmp_path)
    out, records = tmp_path / "eval.json", tmp_path / "eval.jsonl"
    partial, new = Path(f"{records}.partial"), Path(f"{records}.partial.new")
    argv = ["--model", model, "--data", q, "--corpus", corpus, *TINY_EVAL, "--out", str(out)]
    calls, real = [0], E.rollout

    def fail_at(n):
        def rollout(*a, **kw):  # the retrieval server stops answering in batch n
            calls[0] += 1
            if calls[0] == n:
                raise ConnectionError("retriever at http://x/retrieve failed after 3 tries")
            return real(*a, **kw)
        calls[0] = 0
        monkeypatch.setattr(E, "rollout", rollout)

    fail_at(2)
    with pytest.raises(SystemExit, match=re.escape(f"The 2 questions scored so far are in {partial}")):
        E.main(argv)
    kept = partial.read_bytes()
    fail_at(1)  # the new run stops before it has scored anything
    with pytest.raises(SystemExit, match=re.escape(f"The 0 questions scored so far are in {new}")):
        E.main([*argv, "--overwrite"])
    assert partial.read_bytes() == kept and len(kept.splitlines()) == 2  # exact: the same bytes
    with pytest.raises(SystemExit, match=re.escape(f"error: --out {out}: two stopped evaluations left their records "
                                                   f"({partial}, {new}); keep the one you need as {partial}")):
        E.main([*argv, "--overwrite"])
    assert partial.read_bytes() == kept  # exact: untouched
    new.unlink()
    monkeypatch.undo()
    E.main([*argv, "--overwrite"])  # complete: the records in place, the stopped run's gone only now
    assert len(records.read_text().splitlines()) == 3 and not partial.exists() and not new.exists()


def test_help_shows_only_defaults_there_are(capsys):
    """--help said "(default: None)" on the required --model and "(default: )" on --benchmarks and --retriever-url."""
    with pytest.raises(SystemExit):
        E.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: )" not in text and "(default: [])" not in text
    assert "questions per rollout batch (default: 32)" in text  # the others keep theirs
