"""Evaluate a search agent on the paper's seven QA benchmarks: exact match per data_source, as the
paper reports it.

Source: Search-R1 `ray_trainer._validate` as the LLDS paper (arXiv 2512.04220, Tables 1-4) reports
it: greedy decoding, the training rollout with max_turns = 4 (every logged eval config; training
uses 3), top-3 passages, score = EM (rollout.em_check, the training reward) per data_source. Test
sets: FlashRAG's nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle (split test,
else dev). Gen-Avg / MH-Avg / Avg: unweighted means over sources. Extra columns: token F1 and sub-EM
(FlashRAG's metrics), searches per question, recall of the gold paragraphs. --limit scores a fixed,
seeded subset (P24).

    python evaluate.py --model runs/default --data data/hotpotqa/hotpotqa_validation.jsonl \\
        --corpus data/hotpotqa/corpus.jsonl --limit 20
    python evaluate.py --model Qwen/Qwen2.5-3B --benchmarks all --corpus wiki-18.jsonl \
        --compare-paper 3B-Base

Prints the table and writes the scores and records to --out (JSON, records in the .jsonl beside it),
checked before anything runs (machinery/eval_files.py).
"""

import argparse
import json
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from retriever import BM25_VARIANTS, make_retriever
from rollout import STOP_STRINGS, check_obs_budget, em_check, f1_score, normalize_answer, rollout
from machinery.checkpoint import atomic_write
from machinery.data import load_questions, passage_title
from machinery.engine import DECODE_LAYOUTS, GENERATORS, decode_option
from machinery.eval_files import default_out, output_problem, writing_to
from machinery.paper import COLUMNS, GEN, MH, compare_lines, recipe_row, table_lines
from machinery.policy import busy_cpu_note, load_policy

FLASHRAG = "RUC-NLPIR/FlashRAG_datasets"
EVAL_MAX_TURNS = 4  # the search budget of every logged evaluation config (training uses 3)
BENCHMARKS = {"nq": "test", "triviaqa": "test", "popqa": "test", "hotpotqa": "dev",
              "2wikimultihopqa": "dev",
              # config -> split: test, else dev (the dataset card's splits)
              "musique": "dev", "bamboogle": "test"}
ALIASES = {"nq": "NQ", "nqopen": "NQ", "triviaqa": "TQA", "tqa": "TQA", "popqa": "PopQA",
           "hotpotqa": "HotpotQA",
           "hotpot": "HotpotQA", "2wikimultihopqa": "2Wiki", "2wiki": "2Wiki", "2wikimqa": "2Wiki",
           # data_source (lower, [a-z0-9]) -> column
           "musique": "Musique", "bamboogle": "Bamb.", "bamb": "Bamb."}
METRICS = ("em", "f1", "sub_em", "searches", "recall")


# --------------------------------------------------------------------------------------------------
# Data


def select(rows: list[dict], limit: int, seed: int) -> list[dict]:
    """A fixed subset of `limit` rows (all if limit <= 0), the same for every call with the same
    seed (P24)."""
    if limit <= 0 or limit >= len(rows):
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows)), limit))
    return [rows[i] for i in keep]


def benchmark_names(spec: str) -> list[str]:
    """"all" or a comma list of FlashRAG config names -> the names (ValueError on an unknown
    one)."""
    names = (
        list(BENCHMARKS)
        if spec.strip() == "all"
        else [s.strip() for s in spec.split(",") if s.strip()]
    )
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown or not names:
        raise ValueError(f"--benchmarks: unknown {unknown or spec!r}; choose 'all' or from "
                         f"{', '.join(BENCHMARKS)}")
    return names


def load_benchmark(name: str) -> list[dict]:
    """One benchmark's test rows from the hub: FLASHRAG config `name`, split test, else dev
    (BENCHMARKS)."""
    try:
        return load_questions(f"{FLASHRAG}:{name}", BENCHMARKS[name])
    except ConnectionError as err:  # what `datasets` raises offline
        split = BENCHMARKS[name]
        raise ConnectionError(f"cannot load {FLASHRAG} config {name!r} split {split!r} ({err}); "
                              f"offline, download "
                              f"{name}/{split}.jsonl from the hub and pass it with "
                              f"--data") from None


# --------------------------------------------------------------------------------------------------
# Metrics (one question; a prediction of None = no <answer>, scores 0 on all)


def sub_em(prediction: str | None, golden_answers) -> float:
    """1.0 if a normalised gold is a substring of the normalised prediction (FlashRAG
    Sub_ExactMatch), else 0.0."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    golds = [
        normalize_answer(g)
        for g in ([golden_answers] if isinstance(golden_answers, str) else golden_answers)
    ]
    # NOTE(P20): a gold normalising to "" never counts
    return float(any(g and g in pred for g in golds))


def retrieved_titles(retrieved: list[list[dict]]) -> list[str]:
    """Titles of all passages a trajectory's searches returned (Episode.retrieved: one list of hits
    per search), in order, outer quotes removed (data.passage_title)."""
    return [passage_title(hit) for hits in retrieved for hit in hits]


def recall(supporting_titles, titles: list[str]) -> float | None:
    """Fraction of the gold paragraphs' titles among the retrieved titles (case-insensitive); None
    if no gold titles."""
    gold = {" ".join(t.split()).casefold() for t in supporting_titles or []}
    return (
        len(gold & {" ".join(t.split()).casefold() for t in titles}) / len(gold) if gold else None
    )


def _order(src: str):
    # the paper's order, then the others
    return (COLUMNS.index(src) if src in COLUMNS else len(COLUMNS), src)


def column(data_source: str) -> str:
    """A data_source spelling -> the paper's column name ("2wiki", "2WikiMultihopQA" -> "2Wiki");
    others unchanged."""
    return ALIASES.get(re.sub(r"[^a-z0-9]", "", str(data_source).lower()), data_source)


def score_table(records: list[dict]) -> dict:
    """{source: {"n", metric: mean}} for each metric in METRICS the records carry (None = not
    applicable), keyed by the paper's column name; then "Gen-Avg" / "MH-Avg" (with the "sources"
    they cover) and "average" (the paper's Avg): unweighted means over the sources present, with "n"
    the questions they hold."""
    by_src = {}
    for r in records:
        by_src.setdefault(column(r["data_source"]), []).append(r)
    table = {}
    for src, rs in sorted(by_src.items(), key=lambda kv: _order(kv[0])):
        table[src] = {"n": len(rs)}
        for m in METRICS:
            vals = [r[m] for r in rs if r.get(m) is not None]
            if vals:
                table[src][m] = sum(vals) / len(vals)
    sources = list(table)
    for name, group in (("Gen-Avg", GEN), ("MH-Avg", MH), ("average", None)):
        # "average": every source, as the paper's Avg
        srcs = [s for s in sources if group is None or s in group]
        if srcs:
            avg = {"n": sum(table[s]["n"] for s in srcs)} | ({"sources": srcs} if group else {})
            for m in METRICS:
                vals = [table[s][m] for s in srcs if m in table[s]]
                if vals:
                    avg[m] = sum(vals) / len(vals)
            table[name] = avg
    return table


# --------------------------------------------------------------------------------------------------
# Evaluation


def evaluate_rows(rows, args, model, tokenizer, retriever, records: list, records_out, bar):
    """Greedy rollouts of `rows` in batches of --batch-size; each question's record is appended to
    `records` and written to `records_out` (a .jsonl file, flushed per batch) as soon as it is
    scored."""
    generate = GENERATORS[args.generator](model, tokenizer, stop_strings=STOP_STRINGS,
                                          do_sample=False, max_new_tokens=args.max_new_tokens,
                                          batch_size=args.batch_size,
                                          **decode_option(args.generator, args.decode))
    for i in range(0, len(rows), args.batch_size):
        batch = rows[i:i + args.batch_size]
        with torch.no_grad():  # greedy, one trajectory per question: episodes[j] answers batch[j]
            episodes = rollout(generate, tokenizer, batch, retriever.search, group_size=1,
                               max_turns=args.max_turns,
                               max_obs_tokens=args.max_obs_tokens, topk=args.topk)
        for row, e in zip(batch, episodes):
            titles = retrieved_titles(e.retrieved)
            records.append(
                {
                    "id": row.get("id"),
                    "question": e.question,
                    "golden_answers": e.golden_answers,
                    "data_source": e.data_source,
                    "answer": e.answer,
                    # = e.reward, the training reward
                    "em": em_check(e.answer, e.golden_answers),
                    "f1": f1_score(e.answer, e.golden_answers),
                    "sub_em": sub_em(e.answer, e.golden_answers),
                    "recall": recall((row.get("metadata") or {}).get("supporting_titles"), titles),
                    "searches": e.num_searches,
                    "retrieved_titles": titles,
                    "text": e.text,
                }
            )
            records_out.write(json.dumps(records[-1]) + "\n")
        records_out.flush()  # what is scored so far survives a crash or a kill
        bar.update(len(batch))


def main(argv=None):
    """Score --model on the questions (module docstring): one greedy rollout each, the table, the
    paper's rows beside it with --compare-paper, then the JSON and the records at --out, each
    written whole."""
    args = parse_args(argv)
    run = load_evaluation(args)
    t0, records = time.time(), []
    bar = tqdm(total=len(run.rows), desc="evaluating", unit="q", dynamic_ncols=True)
    try:
        evaluate_rows(run.rows, args, run.model, run.tokenizer, run.retriever, records,
                      run.records_out, bar)
    except OSError as err:  # e.g. the retrieval server stopped answering: what was scored is kept
        bar.close()  # the line below starts a line of its own
        raise SystemExit(f"error: {err}. The {len(records)} questions scored so far are in "
                         f"{run.writing}") from None
    bar.close()
    run.records_out.close()
    table = score_table(records)
    print("\n" + "\n".join(table_lines(table, args.topk)))
    print(f"({len(records)} questions, greedy, max_turns {args.max_turns}, "
          f"{time.time() - t0:.0f}s)")
    if args.compare_paper is not None:
        print_paper_rows(table, args)
    save_evaluation(table, records, args, run)


def parse_args(argv=None) -> argparse.Namespace:
    """evaluate.py's flags; a bad value exits with one line naming the flag and the valid range."""
    class Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        # the docstring's layout, and every default there is (not "None", "")
        def _get_help_string(self, action):
            unset = action.required or action.default in (None, "", [])
            return action.help if unset else super()._get_help_string(action)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Help)
    ap.add_argument("--model", required=True, help="checkpoint folder, hub id or .gguf file")
    ap.add_argument("--data", nargs="*", default=[],
                    help="question files (.jsonl/.parquet) or hub ids[:config]")
    ap.add_argument("--benchmarks", default="",
                    help=f"'all' or a comma list of {', '.join(BENCHMARKS)} ({FLASHRAG})")
    ap.add_argument("--split", default="test", help="split for hub ids given with --data")
    ap.add_argument("--compare-paper", nargs="?", const="", default=None, metavar="ROWS",
                    help="print the paper's EM rows beside ours: those whose label contains ROWS "
                    "(e.g. 3B-Ins); "
                    "without ROWS, the row whose recipe the checkpoint's run used (its args.json), "
                    "else all")
    ap.add_argument("--corpus", default="data/hotpotqa/corpus.jsonl",
                    help="retrieval corpus (wiki-18 jsonl format; default: "
                    "scripts/prepare_data.py's output)")
    ap.add_argument("--retriever-url", default="",
                    help="Search-R1 /retrieve server instead of in-process BM25")
    ap.add_argument("--retriever-timeout", type=float, default=30.0,
                    help="seconds per --retriever-url request")
    ap.add_argument("--bm25", default=BM25_VARIANTS[0], choices=BM25_VARIANTS,
                    help="in-process BM25 scoring: lucene "
                    "(Lucene's BM25 and English analyzer, as pyserini) or okapi (rank-bm25, \\w+ "
                    "words); a "
                    "--retriever-url server scores as started (scripts/retrieval_server.py --bm25)")
    ap.add_argument("--limit", type=int, default=0,
                    help="questions per file/benchmark, a fixed seeded subset (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --limit subset")
    ap.add_argument("--max-turns", type=int, default=EVAL_MAX_TURNS,
                    help="search budget (the paper evaluates with 4)")
    ap.add_argument("--max-new-tokens", type=int, default=500, help="tokens per generation turn")
    ap.add_argument("--max-obs-tokens", type=int, default=500,
                    help="tokens per <information> block")
    ap.add_argument("--topk", type=int, default=3, help="passages per search")
    ap.add_argument("--batch-size", type=int, default=32, help="questions per rollout batch")
    ap.add_argument("--generator", default="cb", choices=tuple(GENERATORS),
                    help="decoding: cb (continuous batching, KV kept across turns) | hf (HF "
                    "generate, re-prefill every "
                    "turn) | hf-kv (HF generate, KV kept across turns); machinery/engine.py; "
                    "greedy ids are the same")
    ap.add_argument("--decode", default="auto", choices=DECODE_LAYOUTS,
                    help="cb's KV layout: graph on CUDA (static, each step a CUDA graph), dynamic "
                    "elsewhere; the same ids (machinery/kv_layout.py)")
    ap.add_argument("--dtype", default="auto", help="float32 | bfloat16 | auto")
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto")
    ap.add_argument("--out",
                    help="JSON output path; if unset, <model folder>/eval.json, "
                    "RUN/eval_step_N.json for a "
                    "RUN/checkpoints/step_N folder, or ./eval.json for a hub id")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an earlier evaluation at --out (the old files stay until the new "
                    "one is complete)")
    args = ap.parse_args(argv)
    for flag, low in (("limit", 0), ("max_turns", 0), ("max_new_tokens", 1), ("max_obs_tokens", 1),
                      ("topk", 1),
                      ("batch_size", 1)):
        if getattr(args, flag) < low:
            ap.error(f"--{flag.replace('_', '-')} must be >= {low}, got {getattr(args, flag)}")
    if not args.retriever_timeout > 0:
        ap.error(f"--retriever-timeout must be > 0 seconds, got {args.retriever_timeout}")
    if args.dtype not in ("auto", "float32", "bfloat16"):
        ap.error(f"--dtype must be auto, float32 or bfloat16, got {args.dtype!r}")
    if args.decode != "auto" and args.generator != "cb":
        ap.error(f"--decode {args.decode} is the cb engine's; --generator {args.generator} "
                 "has none")
    if args.decode == "graph" and (args.device == "cpu" or not torch.cuda.is_available()):
        ap.error("--decode graph needs a CUDA device (--decode static is the same layout, eager)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this torch sees no CUDA device; use --device cpu")
    return args


@dataclass
class Evaluation:
    """What an evaluation starts from, all checked before the first question (load_evaluation)."""
    rows: list  # the questions
    retriever: object
    model: torch.nn.Module
    tokenizer: object
    out: Path  # the scores' JSON
    records_file: Path  # the records, one JSON line per question
    partial: Path  # the records while they are written
    writing: Path  # where they go now: partial, or beside a stopped evaluation's
    records_out: object  # the open file at `writing`


def load_evaluation(args) -> Evaluation:
    """The questions, the retriever, the policy and the output files, each checked before anything
    is scored: bad input exits with one line naming the file, line, field or flag."""
    out = Path(args.out) if args.out else default_out(args.model)
    records_file = (
        out.with_suffix(".jsonl") if out.suffix != ".jsonl" else out.with_suffix(".records.jsonl")
    )
    # the records while they are produced
    partial = records_file.with_name(records_file.name + ".partial")
    # before anything is read or written
    if problem := output_problem(out, records_file, partial, args):
        raise SystemExit(f"error: {problem}")
    # partial, unless a stopped evaluation's records are there: then beside them
    writing = writing_to(partial)
    try:
        if not args.data and not args.benchmarks:
            raise ValueError("give question files with --data and/or --benchmarks (e.g. "
                             "--benchmarks all)")
        sets = [load_questions(d, args.split) for d in args.data]
        sets += [
            load_benchmark(b) for b in (benchmark_names(args.benchmarks) if args.benchmarks else [])
        ]
        rows = [r for s in sets for r in select(s, args.limit, args.seed)]
        retriever = make_retriever(args.corpus, args.retriever_url, timeout=args.retriever_timeout,
                                   bm25=args.bm25)
        model, tokenizer, device = load_policy(args.model, args.dtype, args.device)
        check_obs_budget(tokenizer, args.max_obs_tokens)
        if device == "cpu" and (note := busy_cpu_note()):
            print(note)
        try:  # the inputs are checked: the first write, before any question is scored
            out.parent.mkdir(parents=True, exist_ok=True)
            records_out = open(writing, "x", encoding="utf-8")
        except OSError as err:
            why = (
                f"{err.filename} is not a folder"
                if isinstance(err, (FileExistsError, NotADirectoryError))
                else f"{err.strerror}: {err.filename}"
            )
            raise ValueError(f"--out {out}: cannot write there ({why})") from None
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    return Evaluation(rows, retriever, model, tokenizer, out, records_file, partial, writing,
                      records_out)


def print_paper_rows(table: dict, args):
    """--compare-paper: the paper's rows whose label contains its value beside ours; without one,
    the row this checkpoint's run reproduces (its args.json), else all rows."""
    which = args.compare_paper
    if not which:  # the row this checkpoint's run reproduces, from its args.json
        row, file = recipe_row(args.model)
        if row:
            print(f"\npaper row of {file}: {row}")
        else:
            print(f"\n{file or args.model}: no recipe row matches; all rows")
        which = row or ""
    print("\n" + "\n".join(compare_lines(table, which)))


def save_evaluation(table: dict, records: list, args, run: Evaluation):
    """The JSON, then the records: an earlier evaluation's files are replaced only now, each by one
    rename."""
    try:
        atomic_write(
            run.out,
            json.dumps(
                {
                    "model": args.model,
                    "data": args.data,
                    "benchmarks": args.benchmarks,
                    "limit": args.limit,
                    "seed": args.seed,
                    "max_turns": args.max_turns,
                    # never half a file
                    "scores": table,
                    "records": records,
                },
                indent=1,
            ),
        )
        os.replace(run.writing, run.records_file)
        run.partial.unlink(missing_ok=True)  # a stopped evaluation's records, kept until now
    except OSError as err:
        raise SystemExit(f"error: cannot write {run.out} and {run.records_file} "
                         f"({err.strerror or err}); the "
                         f"records are in {run.writing}") from None
    print(f"wrote {run.out} (records also in {run.records_file})")

if __name__ == "__main__":
    main()
