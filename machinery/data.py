"""The files a run reads: passage corpora, question sets, the order questions come in.

A corpus is a jsonl file of passages in the wiki-18 format that Search-R1 and FlashRAG read, one row
a line: {"id": "0", "contents": "\\"Title\\"\\ntext"} (`load_corpus`; `passage_title` reads the
title back out of a hit). A question set is a FlashRAG jsonl or parquet file, or a hub dataset, one
row a question: {"question", "golden_answers", "data_source"}, plus the optional "id" and "metadata"
(`load_questions`). Training takes its questions in epochs of a seeded permutation (`next_prompts`).
Every jsonl file is read by `read_jsonl`: UTF-8, errors named by file and line.

Shapes: D = passages in the corpus.

Run `python -m machinery.data` for a demo: the built-in 5-passage corpus (DEMO_CORPUS) written and
read back, and an epoch order.
"""

import codecs
import json
from pathlib import Path

import numpy as np

# A 5-passage corpus for the demos (`python retriever.py`, `python rollout.py`) and the tests.
DEMO_CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital of France.'},
    {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "2", "contents": '"Eiffel Tower"\nThe Eiffel Tower is in Paris, France.'},
    {"id": "3", "contents": '"Rhine"\nThe Rhine flows through Germany and the Netherlands.'},
    {"id": "4", "contents": '"Apple"\nAn apple is a fruit.'},
]


def read_jsonl(path, name=None):
    """Yield (line number, JSON value) for each non-blank line of a UTF-8 jsonl file; `name`
    (default: path) labels errors. Lines end at "\n" only (a U+2028 inside a JSON string is text,
    not a line break).

    A UTF-8 byte-order mark at the very start of the file is skipped (utf-8-sig: Windows editors
    write one); at the start of any other line it is an error naming the line (Python's json rejects
    it too; there it usually means files were concatenated). Raises ValueError "<name>:<lineno>: not
    UTF-8 (byte 0xff at column 12)" (column: 1-based character position), "<name>:<lineno>: a UTF-8
    byte-order mark (BOM) starts this line ..." or "<name>:<lineno>: not valid JSON: ...". The file
    is read line by line (wiki-18's 14 GB never sit in memory as text).
    """
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            elif raw.startswith(codecs.BOM_UTF8):
                raise ValueError(f"{name or path}:{lineno}: a UTF-8 byte-order mark (BOM) starts "
                                 f"this line; only the "
                                 "file's first line may have one (were files concatenated?)")
            try:
                line = raw.decode("utf-8")
            # everything before e.start decoded, so the column is exact
            except UnicodeDecodeError as e:
                column = len(raw[:e.start].decode("utf-8")) + 1
                raise ValueError(f"{name or path}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} "
                                 f"at column {column})"
                                 ) from None
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{name or path}:{lineno}: not valid JSON: {e}") from None
            yield lineno, value


def load_corpus(path) -> list[dict]:
    """Read a jsonl corpus into [D] rows {"id": str, "contents": str}; other keys are dropped, blank
    lines skipped.

    Format as Search-R1's `load_corpus` reads it (wiki-18 / FlashRAG style), UTF-8 with an optional
    BOM at the start (`read_jsonl`). Raises FileNotFoundError if `path` does not exist, and
    ValueError "<path>:<lineno>: ..." for a line that is not UTF-8 or not a JSON object or lacks a
    string 'contents' or an 'id', and for a file with no passages.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    rows = []
    for lineno, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        if not isinstance(row.get("contents"), str):
            raise ValueError(f"{path}:{lineno}: missing field 'contents' (a string)")
        if row.get("id") is None:
            raise ValueError(f"{path}:{lineno}: missing field 'id'")
        rows.append({"id": str(row["id"]), "contents": row["contents"]})
    if not rows:
        raise ValueError(f"{path}: no passages (empty corpus)")
    return rows


def passage_title(hit: dict) -> str:
    """A hit's title: the first line of its contents, as rollout.format_passages shows it, without
    its outer quotes."""
    title = hit["document"]["contents"].split("\n", 1)[0]
    return title[1:-1] if len(title) >= 2 and title[0] == title[-1] == '"' else title


# --------------------------------------------------------------------------------------------------
# Questions (FlashRAG format: question, golden_answers, data_source)


def _check_row(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    golds = row.get("golden_answers")
    if golds is None and isinstance(row.get("reward_model"), dict):  # Search-R1's verl parquet rows
        golds = row["reward_model"].get("ground_truth", {}).get("target")
    if not isinstance(row.get("question"), str) or not row["question"].strip():
        raise ValueError(f"{where}: missing or empty field 'question'")
    if isinstance(golds, str):
        golds = [golds]
    if golds is None:
        raise ValueError(f"{where}: missing field 'golden_answers'")
    if len(golds) == 0 or not all(isinstance(g, str) for g in golds):
        raise ValueError(f"{where}: field 'golden_answers' must be a non-empty list of strings, "
                         f"got {golds!r}")
    out = {"question": row["question"], "golden_answers": list(golds),
           "data_source": row.get("data_source")}
    # FlashRAG's optional fields travel for evaluation (metadata.supporting_titles -> retrieval
    # recall); never prompted
    return out | {k: row[k] for k in ("id", "metadata") if row.get(k) is not None}


def load_questions(source: str, split: str = "train") -> list[dict]:
    """Question rows {"question", "golden_answers", "data_source"} (plus "id" and "metadata" when
    the row has them) from a local .jsonl / .parquet file or the hub.

    source: a file path, or a hub dataset id with an optional config after a colon (e.g.
    "RUC-NLPIR/FlashRAG_datasets:hotpotqa", "PeterJinGo/nq_hotpotqa_train"), loaded with `datasets`
    (users with internet). A missing data_source defaults to the file stem / config name. A .jsonl
    file is read as `read_jsonl` reads a corpus: UTF-8, a byte-order mark accepted at the very start
    only. Raises FileNotFoundError for a missing file and ValueError naming the file, line and field
    (or byte and column) for a bad row or line, and for an empty file.
    """
    path = Path(source).expanduser()
    if path.suffix in (".jsonl", ".json", ".parquet") or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"question file not found: {source}")
        if path.suffix == ".parquet":
            import datasets

            table = datasets.load_dataset("parquet", data_files=str(path), split="train")
            raw = [(f"{source}: row {i}", r) for i, r in enumerate(table)]
        # UTF-8, a BOM allowed at the start only; bad bytes or JSON name the line (read_jsonl)
        else:
            raw = [(f"{source}:{n}", row) for n, row in read_jsonl(path, name=source)]
        default_source = path.stem.split("_")[0]
    else:
        import datasets

        name, _, config = source.partition(":")
        table = datasets.load_dataset(name, config or None, split=split)
        raw = [(f"{source} [{split}] row {i}", r) for i, r in enumerate(table)]
        default_source = config or name.split("/")[-1]
    rows = [_check_row(r, where) for where, r in raw]
    if not rows:
        raise ValueError(f"{source}: no questions (empty file or split)")
    for r in rows:
        r["data_source"] = r["data_source"] or default_source
    return rows


MAKE_DATA = ("make it with `python scripts/prepare_data.py --out-dir data/hotpotqa` (HotpotQA, "
             "from the hub), pass "
             "--train-data FILE|HUB_ID and --corpus FILE, or try `python lab/spiral.py` (offline, "
             "a search world)")


def missing_input(flag: str, path: str, default: str = "") -> str | None:
    """One line naming `flag` if `path` (a --corpus file, or a --train-data file: a hub id, which
    load_questions takes for any path without a .jsonl/.json/.parquet suffix that does not exist, is
    not checked) is not a file; how to make the data (MAKE_DATA) when it is the `default`. None if
    it is there, or empty ("": not used)."""
    local = flag == "--corpus" or Path(path).suffix in (".jsonl", ".json",
                                                        ".parquet") or Path(path).exists()
    if not path or not local or Path(path).is_file():
        return None
    return f"{flag} {path}: not found" + f"; {MAKE_DATA}" * (path == default)


def next_prompts(rows: list[dict], order: list[int], n: int,
                 seed: int) -> tuple[list[dict], list[int]]:
    """The next n questions of `rows` and the order left after them. `order` holds the indices still
    to come in this epoch; when fewer than n remain, a new epoch's seeded permutation is appended
    (numpy default_rng(seed)), so every question comes once per epoch, and the order (saved in
    checkpoints) makes a resumed run take the same questions."""
    if len(order) < n:
        order = order + np.random.default_rng(seed).permutation(len(rows)).tolist()
    return [rows[i] for i in order[:n]], order[n:]


# --------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in DEMO_CORPUS), encoding="utf-8")
        corpus = load_corpus(path)
    print(len(corpus), [passage_title({"document": row}) for row in corpus[:3]])
    # 5 ['Paris', 'Berlin', 'Eiffel Tower']   (the titles without their quotes)
    rows = [{"question": f"q{i}"} for i in range(4)]
    batch, order = next_prompts(rows, [], 3, seed=0)
    # ['q2', 'q0', 'q1'] [3]   epoch 1's permutation, 1 question left
    print([r["question"] for r in batch], order)
    batch, order = next_prompts(rows, order, 3, seed=1)
    # ['q3', 'q0', 'q1'] [2, 3]   its last one, then epoch 2's first two
    print([r["question"] for r in batch], order)
