"""Evaluate a search agent: greedy Search-R1 rollouts, exact match per data_source and the average.

Source: Search-R1 `ray_trainer._validate` as the LLDS paper (arXiv 2512.04220, Tables 1-4) reports it: greedy decoding,
the training loop's rollout with a search budget of max_turns = 4 (every logged eval config; LLDS trains with 3),
top-3 passages, reward = EM (rollout.em_check) averaged per data_source. Departure: a fixed, seeded
subset with --limit (PITFALLS P24), so every evaluation of a run scores the same questions.

    python evaluate.py --model runs/default/checkpoint --data ../shared/data/hotpotqa_test.jsonl \\
        ../shared/data/musique_test.jsonl --corpus ../shared/data/corpus.jsonl --limit 20
    python evaluate.py --model Qwen/Qwen2.5-3B --data RUC-NLPIR/FlashRAG_datasets:nq --split test --corpus wiki18.jsonl

Prints a table (one row per data_source, then the average over sources) and writes the per-question records and
scores as JSON (--out, default <model folder>/eval.json or eval.json).
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from retriever import make_retriever
from rollout import load_questions, rollout
from train import atomic_write, load_policy


def select(rows: list[dict], limit: int, seed: int) -> list[dict]:
    """A fixed subset of `limit` rows (all if limit <= 0), the same for every call with the same seed (P24)."""
    if limit <= 0 or limit >= len(rows):
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows)), limit))
    return [rows[i] for i in keep]


def score_table(records: list[dict]) -> dict:
    """{data_source: {"em": mean EM, "n": count}} plus "average": the unweighted mean over sources (as the paper's Avg)."""
    by_src = {}
    for r in records:
        by_src.setdefault(r["data_source"], []).append(r["em"])
    table = {s: {"em": sum(v) / len(v), "n": len(v)} for s, v in sorted(by_src.items())}
    if table:
        table["average"] = {"em": sum(t["em"] for t in table.values()) / len(table), "n": len(records)}
    return table


def main():
    class Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass  # keep the docstring's layout and show every default

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Help)
    ap.add_argument("--model", required=True, help="checkpoint folder, hub id or .gguf file")
    ap.add_argument("--data", nargs="+", required=True, help="question files (.jsonl/.parquet) or hub ids[:config]")
    ap.add_argument("--split", default="test", help="split for hub datasets")
    ap.add_argument("--corpus", default="../shared/data/corpus.jsonl", help="retrieval corpus (wiki-18 jsonl format)")
    ap.add_argument("--retriever-url", default="", help="Search-R1 /retrieve server instead of in-process BM25")
    ap.add_argument("--limit", type=int, default=0, help="questions per file, a fixed seeded subset (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --limit subset")
    ap.add_argument("--max-turns", type=int, default=4, help="search budget (the paper evaluates with 4)")
    ap.add_argument("--max-new-tokens", type=int, default=500, help="tokens per generation turn")
    ap.add_argument("--max-obs-tokens", type=int, default=500, help="tokens per <information> block")
    ap.add_argument("--topk", type=int, default=3, help="passages per search")
    ap.add_argument("--batch-size", type=int, default=32, help="questions per rollout batch")
    ap.add_argument("--dtype", default="auto", help="float32 | bfloat16 | auto")
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto")
    ap.add_argument("--out", help="JSON output path; if unset, <model folder>/eval.json (or ./eval.json for a hub id)")
    args = ap.parse_args()

    try:  # bad input: one clear line naming the file/line/field
        rows = [r for d in args.data for r in select(load_questions(d, args.split), args.limit, args.seed)]
        retriever = make_retriever(args.corpus, args.retriever_url)
        model, tokenizer, device = load_policy(args.model, args.dtype, args.device)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        raise SystemExit(f"error: {err}") from None

    t0, records = time.time(), []
    for i in tqdm(range(0, len(rows), args.batch_size), desc="evaluating", unit="batch", dynamic_ncols=True):
        with torch.no_grad():
            episodes = rollout(model, tokenizer, rows[i:i + args.batch_size], retriever, group_size=1,
                               max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                               max_obs_tokens=args.max_obs_tokens, topk=args.topk, do_sample=False,
                               gen_batch_size=args.batch_size)
        records += [{"question": e.question, "golden_answers": e.golden_answers, "data_source": e.data_source,
                     "answer": e.answer, "em": e.reward, "searches": e.num_searches, "text": e.text} for e in episodes]

    table = score_table(records)
    print(f"\n{'data_source':<14}{'n':>6}{'EM':>8}")
    for src, t in table.items():
        print(f"{src:<14}{t['n']:>6}{t['em']:>8.3f}")
    searches = sum(r["searches"] for r in records) / max(len(records), 1)
    print(f"({len(records)} questions, {searches:.2f} searches/question, {time.time() - t0:.0f}s)")

    model_dir = Path(args.model)
    out = Path(args.out) if args.out else (model_dir / "eval.json" if model_dir.is_dir() else Path("eval.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps({"model": args.model, "data": args.data, "limit": args.limit, "seed": args.seed,
                                  "scores": table, "records": records}, indent=1))  # never half a JSON file
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
