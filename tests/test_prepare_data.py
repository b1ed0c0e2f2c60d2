"""Tests for scripts/prepare_data.py on small HotpotQA-format fixtures (tests/fixtures, hand-written, not real rows):
the hub's row format, the original release's, and a parquet written by `datasets` (the arrow layout the hub loads).
CPU only, no network."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import hang  # noqa: E402
from prepare_data import build, main  # noqa: E402
from machinery.data import load_corpus, load_questions  # noqa: E402
from retriever import BM25Retriever  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
HUB, ORIGINAL = FIXTURES / "hotpot_distractor_hub.jsonl", FIXTURES / "hotpot_distractor_original.json"


def test_prepare_data_on_fixtures(tmp_path):
    main(["--out-dir", str(tmp_path), "--input", f"train={HUB}", f"validation={ORIGINAL}"])
    corpus = load_corpus(tmp_path / "corpus.jsonl")  # the retriever reads it as is
    # 3 + 4 + 1 paragraphs in train, 2 in validation: "Ed Wood" and "Apple" repeat (one of them with other
    # whitespace), "Empty page" has no text -> 7 passages, ids in build order
    assert [r["id"] for r in corpus] == [str(i) for i in range(7)]
    assert corpus[0] == {"id": "0", "contents": '"Ed Wood"\nEdward Davis Wood Jr. was an American filmmaker, actor and '
                                                'author.'}  # sentences joined, whitespace collapsed
    assert corpus[3]["contents"] == ('"Rhine"\nThe Rhine is a river in Europe. It flows into the North Sea in the '
                                     'Netherlands.')
    assert [r["contents"].split("\n")[0] for r in corpus].count('"Apple"') == 1

    assert len(load_questions(str(tmp_path / "hotpotqa_train.jsonl"))) == 3  # rollout.py / train.py read them
    def read(name):
        return [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
    train, dev = read("hotpotqa_train.jsonl"), read("hotpotqa_validation.jsonl")
    assert [q["id"] for q in train] == ["fx1", "fx2", "fx3"] and [q["id"] for q in dev] == ["fx4"]
    assert train[1] == {"id": "fx2", "question": "Which city is the capital of the country where the Rhine ends?",
                        "golden_answers": ["Amsterdam"], "data_source": "hotpotqa",
                        "metadata": {"type": "bridge", "level": "medium",
                                     "supporting_titles": ["Rhine", "Netherlands"]}}  # de-duplicated, in order
    assert dev[0]["metadata"]["supporting_titles"] == ["Eiffel Tower"] and dev[0]["golden_answers"] == ["France"]

    hits = BM25Retriever(corpus).search(["capital of the Netherlands"], topk=1)[0]  # searchable end to end
    assert hits[0]["document"]["contents"].startswith('"Netherlands"')


def test_prepare_data_reads_a_datasets_parquet_and_limits(tmp_path):
    """The hub route gets rows from `datasets` (context as {"title": [...], "sentences": [[...]]}); a parquet written
    by `datasets` goes through the same arrow layout offline."""
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in HUB.read_text().splitlines()]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    main(["--out-dir", str(tmp_path / "a"), "--input", f"train={HUB}"])
    main(["--out-dir", str(tmp_path / "b"), "--input", f"train={tmp_path / 'train.parquet'}"])
    for name in ("corpus.jsonl", "hotpotqa_train.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    corpus, questions = build({"train": rows}, limit=1)
    assert len(questions["train"]) == 1 and len(corpus) == 3


def test_prepare_data_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(HUB.read_text().splitlines()[0] + "\n{oops\n")
    cmd = [sys.executable, "scripts/prepare_data.py", "--out-dir", str(tmp_path / "out"), "--input"]
    for spec, message in [(f"train={bad}", "bad.jsonl:2: not valid JSON"), ("train=/nope.json", "/nope.json"),
                          (f"train={FIXTURES / '..' / 'test_prepare_data.py'}", "not valid JSON")]:
        r = hang.run(cmd + [spec], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    with pytest.raises(ValueError, match="train row 0: not a HotpotQA distractor row"):
        build({"train": [{"question": "q?", "answer": "a"}]})
    assert not (tmp_path / "out" / "corpus.jsonl").exists()


def test_out_dir_that_is_a_file_or_an_input_is_one_line(tmp_path):
    """--out-dir FILE was a FileExistsError traceback (after the data was read or downloaded), and an --input that is
    one of the files this command writes would have been replaced. Both are one line now, and nothing is written."""
    (tmp_path / "file").write_text("keep")
    cmd = [sys.executable, "scripts/prepare_data.py", "--input", f"train={HUB}", "--out-dir"]
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        r = hang.run(cmd + [str(out)], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1] == (f"prepare_data.py: error: --out-dir {out}: {tmp_path}/file is a "
                                                     "file, not a folder")
    assert (tmp_path / "file").read_text() == "keep"
    raw = tmp_path / "data" / "hotpotqa_train.jsonl"
    raw.parent.mkdir()
    raw.write_text(HUB.read_text())
    r = hang.run([sys.executable, "scripts/prepare_data.py", "--input", f"train={raw}", "--out-dir",
                  str(raw.parent)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
        f"error: --input {raw} is a file this command writes (--out-dir {raw.parent}); choose another --out-dir")
    assert raw.read_text() == HUB.read_text() and sorted(p.name for p in raw.parent.iterdir()) == [raw.name]
