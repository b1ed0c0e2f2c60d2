"""Warm-start a real pretrained instruct model on the Search-R1 protocol, with real questions and real BM25 passages,
so that GRPO's first groups hold searches, answers and a few rewards. Out of the box an instruct model does not use
the tags (SmolLM2-135M-Instruct wrote no <search> or <answer> in 32 samples of the Search-R1 prompt); a policy that
never answers gets exact-match reward 0 in every group, and GRPO has nothing to learn from.

The demonstrations are lab/warm_start.py's, built on FlashRAG question rows with metadata.supporting_titles
(HotpotQA and MuSiQue, as scripts/prepare_data.py writes them). For each question, warm_start.demonstration builds
the Episode that rollout.rollout would give for a perfect policy (model turns loss_mask 1, observations 0):

    <think> I need to find Johnny Angel. </think>\\n<search> Johnny Angel </search>
    \\n\\n<information>Doc 1(Title: "Johnny Angel") ... Doc 3(...) ...</information>\\n\\n     (BM25's top 3)
    <think> I need to find George Raft. </think>\\n<search> George Raft </search>
    \\n\\n<information>...</information>\\n\\n
    <think> I found the answer. </think>\\n<answer> George Raft </answer>                 (the first gold answer)

The query is the supporting title itself. Its own passage usually comes back in the top 3 (the script prints how
often). What the policy learns is the protocol, not the reasoning: it searches a title even when the question does
not name it (a bridge entity), and MuSiQue's titles come in the dataset's order, not in the order of the chain.
A demonstration searches at most --max-turns titles (the first ones), as many as the rollout allows.

The supervised pass is warm_start.sft: next-token loss on the loss_mask tokens, AdamW, a cosine schedule, bf16
autocast over fp32 weights (--amp, as in train.py). Before and after it, warm_start.sampled_em samples
--eval-group-size rollouts of --eval-questions training questions and of as many held-out ones (from --test-data;
without it, training questions kept out of the demonstrations). It reports sampled EM, the share of trajectories
that answer, and searches per trajectory. The result is a save_pretrained folder that train.py --model loads
unchanged. It is written beside --out and then renamed, so an interrupted save leaves --out as it was.

    python scripts/prepare_data.py --out-dir data/hotpotqa        # HotpotQA questions and passages (internet)
    python lab/warm_start_qa.py --model HuggingFaceTB/SmolLM2-135M-Instruct \\
        --train-data data/hotpotqa/hotpotqa_train.jsonl --test-data data/hotpotqa/hotpotqa_validation.jsonl \\
        --corpus data/hotpotqa/corpus.jsonl --max-turns 2 --max-obs-tokens 200 --amp bf16 --out runs/smollm2_warm
    python train.py --model runs/smollm2_warm --train-data data/hotpotqa/hotpotqa_train.jsonl \\
        --corpus data/hotpotqa/corpus.jsonl --max-turns 2 --max-obs-tokens 200 --amp bf16 ...

Pass train.py the same --max-turns and --max-obs-tokens: the demonstrations teach the turns the rollout will give.
`--measure-only --model runs/smollm2_warm` (and the run's other flags) measures a warm start made before on the
questions its "after" lines measured, without training or writing anything.
MuSiQue rows in the same format (metadata.supporting_titles) go into --train-data beside HotpotQA's.

Measured, a cost pilot: SmolLM2-135M-Instruct (de-quantised from a 4-bit GGUF), 614 training questions (HotpotQA 440,
MuSiQue 174), held-out HotpotQA + MuSiQue test questions, 13,823 passages, --max-turns 2 --max-obs-tokens 200
--max-new-tokens 64 --amp bf16 --sft-steps 30 --sft-batch-size 4 --sft-lr 1e-4, on one thread (OMP_NUM_THREADS=1) of
an Intel Xeon with AMX shared with other jobs. The demonstrations took 3 s: 1,225 searches, the title's own passage
in the top 3 for 96% of them, 397-694 tokens each, model turns <= 52 tokens. SFT: 20 s per step, the loss 1.00 in
the first tenth of the run and 0.27-0.38 in the last ones. One sampled-EM pass (16 questions x 2) took ~130 s. In all
19 min, peak memory 11 GB. Sampled EM before -> after, 16 questions x 2 each:

                                training questions    held-out questions
    sampled EM                  0.000 -> 0.125        0.000 -> 0.062
    trajectories that answer    3% -> 97%             9% -> 97%
    searches per trajectory     0.00 -> 2.00          0.00 -> 1.97
    groups of mixed rewards     0% -> 25%             0% -> 12%

One train.py GRPO step on the result (4 prompts x 4, --max-turns 2, --max-new-tokens 64, --max-obs-tokens 200, two
updates of 8 in micro-batches of 4, bf16): 222 s (rollout 70 s, log-probs 39 s, update and diagnostics 113 s),
peak memory 7.8 GB, every turn a valid action. Only the format was measured to take hold in 30 steps; the defaults
(--sft-steps 150: about one pass over 614 questions at batch 4) are not measured.
"""

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # repo, lab/

from machinery.policy import autocast, load_policy  # noqa: E402
from machinery.data import load_questions, passage_title  # noqa: E402
from retriever import make_retriever  # noqa: E402
from rollout import Episode, check_obs_budget  # noqa: E402
from warm_start import demonstration, loss_curve, model_turns, sampled_em, sft  # noqa: E402


def has_titles(row: dict) -> bool:
    """True if the row's metadata.supporting_titles is a non-empty list of non-blank strings."""
    meta = row.get("metadata")
    titles = meta.get("supporting_titles") if isinstance(meta, dict) else None
    return isinstance(titles, list) and bool(titles) and all(isinstance(t, str) and t.strip() for t in titles)


def load_rows(files: list[str], titles: bool) -> list[dict]:
    """The question rows of `files`, in order (data.load_questions; FileNotFoundError / ValueError name the file
    and line). titles: every row must have metadata.supporting_titles (has_titles), else ValueError naming the first
    row without them."""
    rows = []
    for file in files:
        got = load_questions(file)
        bad = [i for i, r in enumerate(got) if not has_titles(r)] if titles else []
        if bad:
            raise ValueError(f"--train-data {file}: {len(bad)} of {len(got)} questions have no "
                             f"metadata.supporting_titles (the first: question {bad[0] + 1}, id "
                             f"{got[bad[0]].get('id')}); the demonstrations search those titles, which HotpotQA and "
                             "MuSiQue rows carry (scripts/prepare_data.py)")
        rows += got
    return rows


def qa_demonstrations(rows: list[dict], tokenizer, search, *, max_turns: int, max_obs_tokens: int) -> list[Episode]:
    """One warm_start.demonstration per row: a search of each of its first max_turns supporting titles (query = the
    title), each followed by the BM25 top-3 observation, then the answer turn with its first gold answer."""
    return [demonstration(r, tokenizer, search, max_obs_tokens=max_obs_tokens, max_searches=max_turns)
            for r in tqdm(rows, desc="demonstrations", unit="q", leave=False)]


def save(model, tokenizer, out: Path):
    """save_pretrained into a temporary folder beside `out`, then rename it to `out`. An earlier `out` (--overwrite)
    is renamed away just before and deleted after, so a kill or a full disk never leaves a half-written folder at
    `out` for train.py --model to load."""
    tmp, old = (out.with_name(f".{out.name}.{os.getpid()}.{kind}") for kind in ("tmp", "old"))
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def measure(when: str, model, tokenizer, evals: dict, search, amp, args):
    """One line per split of `evals` ({name: rows}): warm_start.sampled_em of the policy, under `amp`."""
    for split, rows in evals.items():
        t0 = time.time()
        with amp():
            m = sampled_em(model, tokenizer, rows, search, group_size=args.eval_group_size, max_turns=args.max_turns,
                           max_new_tokens=args.max_new_tokens, max_obs_tokens=args.max_obs_tokens, seed=args.seed)
        sources = ", ".join(f"{s} {m[s]:.3f}" for s in sorted({r["data_source"] for r in rows}))
        print(f"{when}: sampled EM on {len(rows)} {split} questions x {args.eval_group_size}: {m['em']:.3f} "
              f"({sources}) | answered {m['answers']:.2f} | searches/traj {m['searches']:.2f} | mixed-reward groups "
              f"{m['mixed']:.2f} | {time.time() - t0:.0f}s")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="hub id, model folder or .gguf file (as train.py --model)")
    ap.add_argument("--train-data", nargs="+", required=True,
                    help="FlashRAG question files (.jsonl/.parquet) whose rows have metadata.supporting_titles")
    ap.add_argument("--test-data", nargs="+", default=[],
                    help="held-out question files for the EM before and after (default: --eval-questions training "
                         "questions, kept out of the demonstrations)")
    ap.add_argument("--corpus", required=True, help="passages, jsonl {\"id\", \"contents\": '\"Title\"\\ntext'}")
    ap.add_argument("--out", help="folder for the warm-started model and tokenizer (save_pretrained); required "
                    "unless --measure-only")
    ap.add_argument("--measure-only", action="store_true",
                    help="no demonstrations, no training, no save: the sampled EM of --model on the questions "
                    "the warm start measures (the same --seed, --eval-questions and --test-data pick the same ones)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --out (once the new one is saved)")
    ap.add_argument("--sft-steps", type=int, default=150, help="optimizer steps (150 x 4: ~a pass over 614 questions)")
    ap.add_argument("--sft-batch-size", type=int, default=4, help="demonstrations per step")
    ap.add_argument("--sft-lr", type=float, default=1e-4, help="AdamW peak learning rate")
    ap.add_argument("--amp", choices=("auto", "bf16", "off"), default="auto",
                    help="bf16 autocast over fp32 weights: auto (on one GPU) | bf16 (also CPUs with AMX) | off")
    ap.add_argument("--max-turns", type=int, default=3, help="searches per demonstration at most; as train.py's")
    ap.add_argument("--max-obs-tokens", type=int, default=500, help="tokens per <information> block; as train.py's")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens per generation turn of the EM rollouts")
    ap.add_argument("--eval-questions", type=int, default=16, help="training and held-out questions measured (0: none)")
    ap.add_argument("--eval-group-size", type=int, default=2, help="sampled rollouts per measured question")
    ap.add_argument("--seed", type=int, default=0, help="seeds the held-out split, the batches and the sampling")
    args = ap.parse_args(argv)
    if not args.out and not args.measure_only:
        raise SystemExit("error: --out: required (the folder of the warm-started model), unless --measure-only")
    if args.measure_only and args.eval_questions == 0:
        raise SystemExit("error: --measure-only with --eval-questions 0: nothing to measure")
    for flag, ok, valid in (("--sft-steps", args.sft_steps >= 1, ">= 1"),
                            ("--sft-batch-size", args.sft_batch_size >= 1, ">= 1"),
                            ("--sft-lr", args.sft_lr > 0, "> 0"),
                            ("--max-turns", args.max_turns >= 0, ">= 0"),
                            ("--max-obs-tokens", args.max_obs_tokens >= 1, ">= 1"),
                            ("--max-new-tokens", args.max_new_tokens >= 1, ">= 1"),
                            ("--eval-questions", args.eval_questions >= 0, ">= 0"),
                            ("--eval-group-size", args.eval_group_size >= 1, ">= 1")):
        if not ok:
            raise SystemExit(f"error: {flag} {getattr(args, flag[2:].replace('-', '_'))}: must be {valid}")
    return args


def main(argv=None):
    args = parse_args(argv)
    t0, out = time.time(), Path(args.out or ".")
    if not args.measure_only and out.exists() and not (args.overwrite and out.is_dir()):
        raise SystemExit(f"error: --out {out}: " + ("a file, not a folder" if not out.is_dir() else
                                                     "exists; pass --overwrite to replace it"))
    try:
        rows = load_rows(args.train_data, titles=True)
        test = load_rows(args.test_data, titles=False)
        retriever = make_retriever(args.corpus)  # train.py's retriever: in-process BM25 (lucene)
        model, tokenizer, device = load_policy(args.model, "float32")
        check_obs_budget(tokenizer, args.max_obs_tokens)
    except (OSError, ValueError) as err:  # a missing or bad file, an unreachable hub: one line
        raise SystemExit(f"error: {err}") from None
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    n = args.eval_questions
    shuffled = random.Random(args.seed).sample(rows, len(rows))  # every file's questions among the measured ones
    if test:
        train, held = shuffled, random.Random(args.seed).sample(test, min(n, len(test)))
    else:  # the first n shuffled training questions are held out of the demonstrations
        train, held = shuffled[n:], shuffled[:n]
    evals = {"train": train[:n], "held-out": held} if n else {}
    if not train:
        raise SystemExit(f"error: no training question left after holding out --eval-questions {n}")
    amp = autocast(args.amp, device)
    print(f"{len(train)} training questions | {retriever} | {args.model}: "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters on {device}, amp {args.amp} | "
          f"{time.time() - t0:.0f}s")
    if args.measure_only:  # the model as it is, on the questions a warm start's "after" line measures
        measure("measured", model, tokenizer, evals, retriever.search, amp, args)
        return
    measure("before", model, tokenizer, evals, retriever.search, amp, args)

    t1 = time.time()
    demos = qa_demonstrations(train, tokenizer, retriever.search, max_turns=args.max_turns,
                              max_obs_tokens=args.max_obs_tokens)
    found = [any(passage_title(h) == title for h in hits)
             for r, d in zip(train, demos) for title, hits in zip(r["metadata"]["supporting_titles"], d.retrieved)]
    lengths = [len(d.prompt_ids) + len(d.response_ids) for d in demos]
    print(f"{len(demos)} demonstrations, {sum(d.num_searches for d in demos)} searches (the title's own passage in "
          f"the top 3: {sum(found) / max(1, len(found)):.0%}), {min(lengths)}-{max(lengths)} tokens, model turns <= "
          f"{max(len(t) for d in demos for t in model_turns(d))} tokens | {time.time() - t1:.0f}s")

    t2 = time.time()
    losses = sft(model, demos, tokenizer.pad_token_id, args.sft_steps, batch_size=args.sft_batch_size,
                 lr=args.sft_lr, seed=args.seed, amp=amp)
    took = time.time() - t2
    print(f"warm start: {args.sft_steps} steps x {args.sft_batch_size} demonstrations in {took:.0f}s "
          f"({took / args.sft_steps:.1f} s/step) | loss per tenth of the run: {loss_curve(losses)}")
    try:
        save(model, tokenizer, out)
        del model
        policy, tokenizer, _ = load_policy(str(out), "float32", device)  # what train.py --model will load
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: could not save or reload --out {out}: {str(err).splitlines()[0]}") from None
    print(f"saved {out}")
    measure("after", policy, tokenizer, evals, retriever.search, amp, args)
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
