"""Tests for data.py: corpus and question files (good rows, every kind of bad line named by file, line and column,
byte-order marks, parquet), passage titles, the epoch order, the demo. CPU only, no network."""

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import hang  # noqa: E402
from machinery.data import load_corpus, load_questions, next_prompts, passage_title  # noqa: E402


def test_passage_title_is_the_first_line_without_its_quotes():
    def doc(contents):
        return {"document": {"id": "0", "contents": contents}, "score": 1.0}

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


# ----------------------------------------------------------------------------------------------------------------------
# load_questions



def test_load_questions_good_jsonl(tmp_path):
    f = write_lines(tmp_path / "nq_train.jsonl", [
        json.dumps({"question": "who wrote hamlet", "golden_answers": ["Shakespeare", "William Shakespeare"]}),
        "",
        json.dumps({"question": "capital of france", "golden_answers": "Paris", "data_source": "hotpotqa", "x": 1}),
    ])
    rows = load_questions(f)
    assert rows == [
        {"question": "who wrote hamlet", "golden_answers": ["Shakespeare", "William Shakespeare"], "data_source": "nq"},
        {"question": "capital of france", "golden_answers": ["Paris"], "data_source": "hotpotqa"},
    ]


def test_load_questions_errors(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_questions(str(missing))
    good = json.dumps({"question": "q", "golden_answers": ["a"]})
    f = write_lines(tmp_path / "bad.jsonl", [good, "{not json"])
    with pytest.raises(ValueError, match=re.escape(f"{f}:2")):
        load_questions(f)
    f = write_lines(tmp_path / "nogold.jsonl", [good, good, json.dumps({"question": "q"})])
    with pytest.raises(ValueError, match=re.escape(f"{f}:3") + ".*golden_answers"):
        load_questions(f)
    f = write_lines(tmp_path / "noq.jsonl", [json.dumps({"golden_answers": ["a"]})])
    with pytest.raises(ValueError, match=re.escape(f"{f}:1") + ".*question"):
        load_questions(f)
    f = write_lines(tmp_path / "emptygold.jsonl", [json.dumps({"question": "q", "golden_answers": []})])
    with pytest.raises(ValueError, match="golden_answers"):
        load_questions(f)
    f = write_lines(tmp_path / "list.jsonl", ["[1, 2]"])
    with pytest.raises(ValueError, match=re.escape(f"{f}:1")):
        load_questions(f)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="no questions"):
        load_questions(str(empty))
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="no questions"):
        load_questions(str(blank))


def test_load_questions_encoding_errors_name_line_and_column(tmp_path):
    good = json.dumps({"question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}).encode()
    f = tmp_path / "q.jsonl"
    f.write_bytes(b"\n".join([good] * 6 + [b'{"question": "caf\xe9?", "golden_answers": ["x"]}']) + b"\n")  # latin-1
    with pytest.raises(ValueError, match=re.escape(f"{f}:7: not UTF-8 (byte 0xe9 at column 18)")):
        load_questions(str(f))
    f.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join([good] * 2) + b"\r\n")  # a Windows editor's utf-8-sig and CRLF: fine
    assert [r["question"] for r in load_questions(str(f))] == ["who wrote hamlet"] * 2
    f.write_bytes(b"\n".join([good, b"\xef\xbb\xbf" + good]) + b"\n")  # a BOM inside: two files concatenated
    with pytest.raises(ValueError, match=re.escape(f"{f}:2: a UTF-8 byte-order mark (BOM) starts this line")):
        load_questions(str(f))
    f.write_bytes(json.dumps({"question": "a\u2028b", "golden_answers": ["x"]}, ensure_ascii=False).encode() + b"\n")
    assert load_questions(str(f))[0]["question"] == "a\u2028b"  # U+2028 is text, not a line break (str.splitlines)


def test_load_questions_parquet_round_trip(tmp_path, monkeypatch):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rows = [
        {"question": "who wrote hamlet", "golden_answers": ["Shakespeare", "William Shakespeare"],
         "data_source": "nq"},
        {"question": "capital of france", "golden_answers": ["Paris"], "data_source": "hotpotqa"},
    ]
    f = tmp_path / "mixed_train.parquet"
    pd.DataFrame(rows).to_parquet(f)
    assert load_questions(str(f)) == rows
    # Search-R1's verl rows: the golds live in reward_model.ground_truth.target.
    verl = [{"question": "who wrote hamlet", "data_source": "nq",
             "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}}}]
    g = tmp_path / "verl.parquet"
    pd.DataFrame(verl).to_parquet(g)
    assert load_questions(str(g)) == [{"question": "who wrote hamlet", "golden_answers": ["Shakespeare"],
                                       "data_source": "nq"}]



# ----------------------------------------------------------------------------------------------------------------------
# next_prompts: the epoch order


def test_next_prompts_takes_every_question_once_per_epoch():
    rows = [{"question": f"q{i}"} for i in range(5)]
    seen, order = [], []
    for step in range(4):  # 4 steps x 3 questions = 12: epochs 1 and 2 whole, 2 of epoch 3
        batch, order = next_prompts(rows, order, 3, seed=step)
        seen += [r["question"] for r in batch]
    assert sorted(seen[:5]) == sorted(seen[5:10]) == [r["question"] for r in rows]  # exact: each once per epoch
    assert len(order) == 3  # what a checkpoint saves: the rest of epoch 3
    again, _ = next_prompts(rows, [], 3, seed=0)
    assert [r["question"] for r in again] == seen[:3]  # exact: seeded, so a resumed run takes the same questions


def test_demo_runs():
    out = hang.run([sys.executable, "-m", "machinery.data"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "5 ['Paris', 'Berlin', 'Eiffel Tower']"
