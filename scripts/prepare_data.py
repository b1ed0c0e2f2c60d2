"""Build a Search-R1 / FlashRAG-format corpus and question files from HotpotQA's distractor setting.

Every context paragraph of every question (10 per question: the 2 gold paragraphs and 8 distractors) becomes one
passage {"id": "<n>", "contents": '"Title"\\ntext'} (wiki-18 format; ids "0", "1", ... in build order), de-duplicated on
(title, text), whitespace normalised. Each question becomes a FlashRAG row
{"id", "question", "golden_answers": [answer], "data_source": "hotpotqa", "metadata": {"type", "level",
"supporting_titles"}}, the format data.load_questions reads.

    python scripts/prepare_data.py --out-dir data/hotpotqa                     # hub hotpotqa/hotpot_qa (internet)
    python scripts/prepare_data.py --out-dir data/hotpotqa --limit 2000        # first 2000 questions per split
    python scripts/prepare_data.py --out-dir data/hotpotqa \\
        --input train=hotpot_train_v1.1.json validation=hotpot_dev_distractor_v1.json   # offline, local files

Local files (.json list, .jsonl or .parquet) may hold the hub's rows (id, context {"title": [...], "sentences":
[[...], ...]}, supporting_facts {"title": [...], "sent_id": [...]}) or the original release's (_id, context [[title,
[sentence, ...]], ...], supporting_facts [[title, sent_id], ...]); the same code reads both.
Writes <out-dir>/corpus.jsonl and <out-dir>/hotpotqa_<split>.jsonl (the hub's "validation" split is HotpotQA's dev
set, the one papers report as test). Then: python scripts/retrieval_server.py --corpus <out-dir>/corpus.jsonl
--port 8000
"""

import argparse
import json
import os
from pathlib import Path


def paragraphs(row: dict) -> list[tuple[str, str]]:
    """[(title, text)] of a question's context paragraphs, in either format; sentences are joined as given (HotpotQA
    sentences carry their own leading spaces), then whitespace is collapsed."""
    ctx = row["context"]
    pairs = zip(ctx["title"], ctx["sentences"]) if isinstance(ctx, dict) else ctx  # hub columns | original [t, s]
    return [(" ".join(title.split()), " ".join("".join(sents).split())) for title, sents in pairs]


def question_row(row: dict) -> dict:
    """A HotpotQA row -> the FlashRAG question row (gold titles from supporting_facts, first-seen order)."""
    facts = row.get("supporting_facts") or []
    titles = facts["title"] if isinstance(facts, dict) else [title for title, _ in facts]
    return {"id": str(row.get("id", row.get("_id"))), "question": row["question"], "golden_answers": [row["answer"]],
            "data_source": "hotpotqa", "metadata": {"type": row.get("type"), "level": row.get("level"),
                                                    "supporting_titles": list(dict.fromkeys(titles))}}


def build(splits: dict, limit: int = 0) -> tuple[list[dict], dict]:
    """{split: iterable of HotpotQA rows} -> (corpus rows, {split: question rows}); limit > 0 keeps that many
    questions per split. Raises ValueError naming the split and row of a row without question/answer/context."""
    corpus, seen, questions = [], set(), {}
    for split, rows in splits.items():
        questions[split] = []
        for i, row in enumerate(rows):
            if limit and i >= limit:
                break
            try:
                q, paras = question_row(row), paragraphs(row)
            except (AttributeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{split} row {i}: not a HotpotQA distractor row ({type(err).__name__}: {err})")
            questions[split].append(q)
            for title, text in paras:
                if text and (title, text) not in seen:  # empty paragraphs have nothing to retrieve
                    seen.add((title, text))
                    corpus.append({"id": str(len(corpus)), "contents": f'"{title}"\n{text}'})
    return corpus, questions


def read_local(path: Path):
    """Rows of a local .json (a list), .jsonl or .parquet file; ValueError with the line number on bad JSON."""
    if path.suffix == ".parquet":
        import datasets

        return datasets.Dataset.from_parquet(str(path))
    with open(path, encoding="utf-8") as f:
        if path.suffix == ".json":
            try:
                return json.load(f)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: not valid JSON: {err}") from None
        rows = []
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{lineno}: not valid JSON: {err}") from None
        return rows


def write_jsonl(path: Path, rows: list[dict]):
    """One JSON object per line, written to a temp file and renamed: an interrupted run leaves no half file. Raises
    OSError (a full or read-only disk) after removing the temp file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", required=True, help="folder for corpus.jsonl and hotpotqa_<split>.jsonl")
    ap.add_argument("--input", nargs="+", metavar="SPLIT=FILE", help="local files instead of the hub (offline)")
    ap.add_argument("--dataset", default="hotpotqa/hotpot_qa", help="hub dataset id")
    ap.add_argument("--config", default="distractor", help="hub config")
    ap.add_argument("--splits", nargs="+", default=["train", "validation"], help="hub splits")
    ap.add_argument("--limit", type=int, default=0, help="questions per split (0: all)")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    if file := next((p for p in (out, *out.parents) if p.is_file()), None):  # before anything is read or downloaded
        ap.error(f"--out-dir {out}: {file} is a file, not a folder")

    try:
        if args.input:
            if not all("=" in spec for spec in args.input):
                ap.error("--input takes SPLIT=FILE pairs, e.g. validation=hotpot_dev_distractor_v1.json")
            files = {split: Path(file) for split, file in (spec.split("=", 1) for spec in args.input)}
            written = [out / "corpus.jsonl", *(out / f"hotpotqa_{split}.jsonl" for split in files)]
            if same := next((f for f in files.values() if f.resolve() in {w.resolve() for w in written}), None):
                ap.error(f"--input {same} is a file this command writes (--out-dir {out}); choose another --out-dir")
            splits = {split: read_local(file) for split, file in files.items()}
        else:
            import datasets

            splits = {s: datasets.load_dataset(args.dataset, args.config, split=s) for s in args.splits}
        corpus, questions = build(splits, args.limit)
    except (OSError, ValueError) as err:  # a missing file, bad JSON, a row of another format: one line
        raise SystemExit(f"error: {err}") from None

    try:
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(out / "corpus.jsonl", corpus)
        for split, rows in questions.items():
            write_jsonl(out / f"hotpotqa_{split}.jsonl", rows)
    except OSError as err:  # a full or read-only disk: one line
        raise SystemExit(f"error: --out-dir {out}: cannot write {err.filename or ''} ({err.strerror or err})") from None
    counts = ", ".join(f"{len(rows)} {split}" for split, rows in questions.items())
    print(f"wrote {out}/corpus.jsonl ({len(corpus)} passages) and questions: {counts}")


if __name__ == "__main__":
    main()
