"""Train a search agent with GRPO + LLDS, in the paper's order: rollout -> reward -> group advantages -> log-probs ->
loss = L_GRPO + lambda * L_LLDS (Eq. 6) -> diagnostics -> save, as the official LLDS code (a veRL 0.1 fork of
Search-R1, dp_actor.py) runs it. Each step's trajectories feed several optimizer mini-batches: from the second on, the
policy is no longer the one that sampled, which is where LLDS acts (with one update per batch the Delta of v2 Sec.
5.5 is ~0; the authors' script makes 512 x 5 / 256 = 10 updates per rollout batch). fsdp.py runs it on N ranks.

    python train.py --model Qwen/Qwen2.5-3B --llds 0.2                # the paper's setting (a big GPU, the hub)
    python train.py --model Qwen/Qwen2.5-0.5B-Instruct --llds 0.1 --prompts-per-step 16       # one smaller GPU
    torchrun --nproc_per_node 8 train.py --model Qwen/Qwen2.5-7B-Instruct --llds 0.3 --fsdp --grad-ckpt  # 8 GPUs

--out-dir gets metrics.jsonl, rollouts_step{N}.jsonl and checkpoints/ (--resume <out-dir> continues it); see --help.
"""

import argparse
import contextlib
import dataclasses
import inspect
import json
import math
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR
from tqdm import tqdm

import checkpoint
from checkpoint import restore, save_checkpoint
from data import load_questions, missing_input, next_prompts
from engine import GENERATORS, diverged_sampling
from fsdp import all_finite, all_reduce, full_weights, gather_rows, print0, setup_dist, shard
from grpo import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, group_advantages, grpo_loss
from grpo import REDUCE as GRPO_REDUCE, calibadv_episodes
from llds import GATES, MA_SCHEDULES, NORMS, lld_alarm, llds_loss, ma_weight
from llds import likelihood_diagnostics, official_metrics
from llds import REDUCE as LLDS_REDUCE
from memory import free_memory, memory_plan
from probe import FixedProbe
from policy import (autocast, batch_logp, busy_cpu_note, collate, enable_grad_ckpt, load_policy,
                    load_reference, reference_dtype, response_logp, save_reference)
from retriever import BM25_VARIANTS, make_retriever
from tracking import TRACKERS, missing_tracker, numbers, tracker
from rollout import check_obs_budget, episode_stats, longest_prompt, rollout, rollout_metrics
from rollout import f1_score

@dataclass
class Args:
    # --- model
    model: str = "Qwen/Qwen2.5-0.5B-Instruct"  # hub id, model folder, checkpoint or run folder, or .gguf file
    dtype: str = "auto"  # weights: float32 | bfloat16 | auto (float32; bf16 compute comes from --amp or FSDP)
    amp: str = "auto"  # bf16 autocast over fp32 weights: auto (one GPU) | bf16 (CPUs with AVX512-BF16/AMX too) | off
    device: str = "auto"  # cpu | cuda | auto
    seed: int = 0  # seeds python, numpy and torch (sampling and data order)
    # --- data and retrieval
    train_data: str = "data/hotpotqa/hotpotqa_train.jsonl"  # FlashRAG .jsonl/.parquet or hub id[:config]
    corpus: str = "data/hotpotqa/corpus.jsonl"  # passages, jsonl {"id", "contents": '"Title"\\ntext'}
    retriever_url: str = ""  # a Search-R1 /retrieve server (scripts/retrieval_server.py); "" = in-process BM25
    retriever_timeout: float = 30.0  # seconds per --retriever-url request (3 tries, a warning after each failure)
    bm25: str = "lucene"  # lucene (pyserini's BM25 + English analyzer) | okapi (rank-bm25); in-process only
    # --- rollout
    prompts_per_step: int = 512  # questions per rollout batch (paper: 512)
    group_size: int = 5  # G, trajectories per question (paper: 5)
    max_turns: int = 3  # search-enabled generations before the answer-only one (LLDS: 3; Search-R1: 4)
    max_new_tokens: int = 500  # tokens per generation turn (paper: 500)
    max_obs_tokens: int = 500  # tokens per <information> block (paper: 500)
    topk: int = 3  # passages per search
    temperature: float = 1.0  # sampling temperature; log-probs use the same one (P17)
    top_p: float = 0.95  # nucleus sampling (the code's yaml default; the paper says 1.0)
    gen_batch_size: str = "auto"  # rows per generate call: a count, or auto: as many as the free memory holds
    generator: str = "cb"  # decoding: cb (continuous batching, KV kept across turns) | hf | hf-kv (engine.py)
    # --- GRPO loss
    policy_loss: str = "ppo-clip"  # ppo-clip (token ratio) | gspo (sequence ratio; USE_GSPO)
    clip_eps: float = 0.2  # PPO ratio clip epsilon
    clip_eps_high: float = None  # upper clip 1 + clip_eps_high (DAPO clip-higher: 0.28); unset = --clip-eps
    kl_coef: float = 0.001  # weight of the KL to the frozen initial policy (0: no reference model)
    kl_type: str = "k3"  # k1 | k2 | k3 (= low_var_kl, the code's)
    entropy_coef: float = 0.001  # entropy bonus (in the code, not in the paper)
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean (Eq. 1) | seq-mean-token-sum-norm
    calib_adv: float = 0.0  # CalibAdv's calibrated advantages (grpo.calibadv_advantages) at this target ratio; 0 = off
    # --- LLDS
    llds: float = 0.2  # lambda (paper: 0.2; 0.3 for 7B-Instruct); 0 = plain GRPO (LLDS metrics still logged)
    llds_gate: str = "action"  # action (LLDS-A, the paper's) | response | token (no gate)
    llds_norm: str = "code"  # code (all response tokens; published numbers) | paper (Eq. 4; Eqs. 9/10)
    llds_ma: str = "off"  # answer-span weight (Eq. 5): off | code | fixed | paper (docs/training.md)
    llds_ma_weight: float = 0.2  # w, the code's MASK_WEIGHT, for --llds-ma code and fixed
    # --- optimisation
    steps: int = 1005  # rollout steps (paper: 1005)
    lr: float = 1e-6  # AdamW learning rate (paper: 1e-6)
    warmup_ratio: float = 0.285  # linear warmup from 0 over this fraction of the steps, then constant
    weight_decay: float = 0.01  # AdamW weight decay (veRL default)
    grad_clip: float = 1.0  # global grad-norm clip
    mini_batch_size: int = 256  # trajectories per optimizer step (paper: 256: 10 updates per rollout step)
    micro_batch_size: int = None  # trajectories per forward/backward (P14); unset: the memory plan picks 8, 4, 2 or 1
    max_bad_steps: int = 5  # stop after this many consecutive non-finite (skipped) optimizer steps
    # --- memory and ranks
    fsdp: bool = False  # shard the policy and reference over the torchrun ranks (fsdp.py)
    grad_ckpt: bool = None  # recompute each layer in backward (~1.3x compute); unset: on if the memory plan needs it
    ref_dtype: str = "auto"  # reference weights: auto (bfloat16 on a GPU or a CPU with bf16 units) | bfloat16 | float32
    ref_offload: bool = False  # reference on disk (OUT_DIR/.ref), loaded for its pass only
    # --- logging and checkpoints
    out_dir: str = "runs/default"  # metrics.jsonl, rollouts_step{N}.jsonl and checkpoints/ go here
    log_rollouts_every: int = 10  # write a few full trajectories every N steps (and at step 1)
    num_log_rollouts: int = 4  # trajectories per rollouts file
    save_every: int = 10  # checkpoint every N steps (also at the last step, on Ctrl-C and on SIGTERM)
    keep_checkpoints: int = 1  # complete checkpoints to keep (an old one goes only once a newer one is complete)
    alarm_k: int = 3  # LLD alarm after this many steps of non-rising correct-response likelihood
    probe_questions: int = 8  # LLD probe: questions whose step-0 trajectories are re-scored (probe.py); 0 = off
    probe_every: int = 1  # re-score the probe trajectories every N steps (the probe/* keys)
    report_to: str = "off"  # also send each step's metrics to: off | tensorboard | wandb | trackio (pip install it)
    resume: str = ""  # run folder (its newest complete checkpoint) or checkpoints/step_N folder to continue exactly
    overwrite: bool = False  # start afresh in an --out-dir that holds a run (deletes its metrics and checkpoints)


NON_NEGATIVE = ("seed", "max_turns", "num_log_rollouts", "weight_decay", "kl_coef", "entropy_coef",
                "llds", "llds_ma_weight", "probe_questions", "calib_adv")
COUNTS = ("prompts_per_step", "group_size", "max_new_tokens", "max_obs_tokens", "topk", "steps",
          "alarm_k", "mini_batch_size", "micro_batch_size", "max_bad_steps", "log_rollouts_every",
          "save_every", "keep_checkpoints", "probe_every")
RANGES = {  # Args field -> (valid?, the valid range in words); every value is checked before the run starts
    **dict.fromkeys(NON_NEGATIVE, (lambda v: v >= 0, ">= 0")),
    **dict.fromkeys(COUNTS, (lambda v: v is None or v >= 1, ">= 1")),  # None: unset
    **dict.fromkeys(("temperature", "lr", "grad_clip"), (lambda v: v > 0, "> 0")),
    "retriever_timeout": (lambda v: v > 0, "> 0 seconds"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "clip_eps": (lambda v: 0 < v < 1, "in (0, 1)"),
    "clip_eps_high": (lambda v: v > 0, "> 0"),
    "warmup_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "gen_batch_size": (lambda v: v == "auto" or (v.isdecimal() and int(v) >= 1),
                       "an integer >= 1 or auto"),
    "device": (lambda v: v in ("auto", "cpu") or v.startswith("cuda"), "cpu, cuda, cuda:N or auto"),
}
CHOICES = {  # Args field -> its valid values, taken from the table that implements them (one edit adds a variant)
    "policy_loss": tuple(POLICY_LOSSES),
    "kl_type": tuple(KL_ESTIMATORS),
    "loss_agg": tuple(AGGREGATIONS),
    "llds_gate": tuple(GATES),
    "llds_norm": tuple(NORMS),
    "llds_ma": ("off", *MA_SCHEDULES),
    "bm25": BM25_VARIANTS,
    "ref_dtype": ("auto", "bfloat16", "float32"),
    "amp": ("auto", "bf16", "off"),
    "dtype": ("auto", "float32", "bfloat16"),
    "generator": tuple(GENERATORS),
    "report_to": ("off", *TRACKERS),
}


def parse_args(argv=None) -> Args:
    """argparse over the Args fields: --field-name VALUE for each, help from the field's comment, grouped by the
    `# --- section` comments. Bad values exit with one line naming the flag and the valid range (RANGES, CHOICES)."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.print_usage = lambda file=None: None  # a bad value is one line (its error), not 40 lines of usage first
    group, groups, docs = None, {}, {}
    for line in inspect.getsource(Args).splitlines():
        if m := re.fullmatch(r"    # --- (.+)", line):
            group = ap.add_argument_group(m[1])
        elif m := re.fullmatch(r"    (\w+): .*?  # (.+)", line):
            groups[m[1]], docs[m[1]] = group, m[2]
    for f in dataclasses.fields(Args):
        kw = {"action": argparse.BooleanOptionalAction} if f.type is bool else {"type": f.type}  # str, int or float
        default = "unset" if f.default in (None, "") else f.default
        groups[f.name].add_argument("--" + f.name.replace("_", "-"), **kw, default=f.default,
                                    help=f"{docs[f.name]} (default: {default})")
    args = Args(**vars(ap.parse_args(argv)))
    args.clip_eps_high = args.clip_eps if args.clip_eps_high is None else args.clip_eps_high  # unset: symmetric
    for name, ok in CHOICES.items():
        if getattr(args, name) not in ok:
            ap.error(f"--{name.replace('_', '-')} must be one of {ok}, got {getattr(args, name)!r}")
    for name, (ok, valid) in RANGES.items():  # every number is checked here, not at step 1 deep inside a library
        value = getattr(args, name)
        if (isinstance(value, float) and not math.isfinite(value)) or not ok(value):
            ap.error(f"--{name.replace('_', '-')} must be {valid}, got {value}")
    if args.report_to != "off" and (problem := missing_tracker(args.report_to)):
        ap.error(f"--report-to {args.report_to}: {problem}")
    per_step = args.prompts_per_step * args.group_size  # trajectories a step
    if args.llds > 0 and per_step <= args.mini_batch_size:  # the LLDS arm of a comparison would equal plain GRPO
        print(f"warning: --llds {args.llds:g} with one update a step: LLDS is inert "
              f"(its Delta is 0 at an on-policy update); give --mini-batch-size < {per_step} "
              "(the trajectories a step) for several updates a step (the paper: 10)",
              file=sys.stderr)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this torch sees no CUDA device "
                 "(torch.cuda.is_available() is False); "
                 "use --device cpu, or install a CUDA build of torch")
    return args


REDUCE = {**GRPO_REDUCE, **LLDS_REDUCE}  # metric -> how micro-batch values combine: "sum", "max" or ("mean", weight)


def add_metrics(acc: dict, metrics: dict):
    """Fold a micro-batch's loss metrics into its mini-batch's `acc` as REDUCE says: "sum" adds, "max" keeps the
    largest, ("mean", w) adds value * metrics[w] (a weighted sum; `mean_metrics` divides by the summed weight). Raises
    KeyError for a metric REDUCE does not list."""
    for k, v in metrics.items():
        if k not in REDUCE:
            raise KeyError(f"metric {k!r} has no reduction: add it to grpo.REDUCE or llds.REDUCE "
                           "('sum', 'max' or ('mean', weight key))")
        how = REDUCE[k]
        if isinstance(how, tuple) and how[1] not in metrics:
            raise KeyError(f"metric {k!r} is a mean weighted by {how[1]!r}, "
                           "which the same metrics lack: return both")
        if how == "max":
            acc[k] = max(acc.get(k, v), v)
        else:
            acc[k] = acc.get(k, 0.0) + (v if how == "sum" else v * metrics[how[1]])


def mean_metrics(acc: dict) -> dict:
    """The mini-batch's metrics from add_metrics' sums (after they are summed over ranks): each ("mean", w) metric
    divided by its summed weight w (0.0 where w is 0: nothing to average), so it is the exact mean over the
    mini-batch's units however the mini-batch was split into micro-batches."""
    out = dict(acc)
    for k, how in REDUCE.items():
        if k in acc and isinstance(how, tuple):
            out[k] = acc[k] / acc[how[1]] if acc[how[1]] else 0.0
    return out


def llds_ma_weight(episodes, answer_mask: torch.Tensor,
                   args: Args) -> tuple[torch.Tensor | None, dict]:
    """LLDS-MA (v2 Eq. 5): llds.ma_weight [B, T] and its metrics, V = the mean of Episode.num_valid_searches over
    every rank's trajectories (dp_actor.py:275-277); (None, {}) with --llds-ma off."""
    if args.llds_ma == "off":
        return None, {}
    n, total = all_reduce([len(episodes), sum(e.num_valid_searches for e in episodes)])
    return ma_weight(total / n, answer_mask, args.llds_ma,
                     lam=args.llds, mask_weight=args.llds_ma_weight)


def update(model, optimizer, batch, old_logp, ref_logp, adv, weight, args: Args, vocab_size: int,
           mini_batch_size: int, amp=contextlib.nullcontext(), pg_adv=None):
    """The optimizer steps of one rollout step (Eq. 6): one per mini-batch, gradients accumulated over micro-batches.

    batch: collate() of this rank's B trajectories; old_logp, ref_logp (or None), weight (LLDS-MA, or None) [B, T];
    adv [B]; pg_adv [B, T] the policy gradient's (--calib-adv; None: adv). old_logp's first mini-batch rows: filled
    here by the update's own forward (the rollout policy's, tests/test_train.py). mini_batch_size: this rank's share
    of a mini-batch, whose token and sequence counts are summed over ranks (P14), so the loss is the one a single
    process would get. amp: around each micro-batch's forward and loss.
    Returns (metrics per mini-batch, reduced over ranks; pre-clip grad norms; per mini-batch True if the optimizer
    stepped, False if a non-finite loss or grad norm skipped it).
    """
    device, a_t = next(model.parameters()).device, adv if pg_adv is None else pg_adv  # A_i,t of the policy gradient
    loss_mask = batch["loss_mask"]
    B = loss_mask.shape[0]
    per_mini, grad_norms, stepped = [], [], []
    for m0 in range(0, B, mini_batch_size):
        mini = slice(m0, min(m0 + mini_batch_size, B))
        pre = (adv[mini] >= 0) & (loss_mask[mini].sum(-1) > 0)  # [b] Y_pre responses with a model token
        counts = [loss_mask[mini].sum(), pre.sum(), mini.stop - mini.start]
        num_tokens, num_pre, num_seqs = all_reduce(counts)  # over ranks
        num_tokens, num_pre = max(num_tokens, 1.0), max(int(num_pre), 1)
        pre_tokens = (loss_mask[mini] * (adv[mini] >= 0)[:, None]).sum()  # Eqs. 9, 10
        num_pre_tokens = max(all_reduce([pre_tokens])[0], 1.0)
        mb, loss_sum = {}, 0.0  # this mini-batch's metrics and loss (this rank's part)
        for u0 in range(mini.start, mini.stop, args.micro_batch_size):
            rows = slice(u0, min(u0 + args.micro_batch_size, mini.stop))

            def dev(x, rows=rows):  # this micro-batch's rows of a [B, ...] tensor (or None), on the model's device
                return None if x is None else x[rows].to(device)
            with amp:
                logp, entropy = response_logp(model, batch, rows, args.temperature, vocab_size,
                                              with_entropy=True)
                if m0 == 0 and old_logp[rows].isnan().all():  # left by batch_logp's start: the rollout policy's
                    old_logp[rows] = logp.detach().to(old_logp.device, old_logp.dtype)
                pg, m_pg = grpo_loss(logp, dev(old_logp), dev(ref_logp), dev(a_t), dev(loss_mask),
                                     entropy=entropy, entropy_coef=args.entropy_coef,
                                     policy_loss=args.policy_loss, agg=args.loss_agg,
                                     clip_eps=args.clip_eps, clip_eps_high=args.clip_eps_high,
                                     kl_coef=args.kl_coef, kl_type=args.kl_type,
                                     num_tokens=num_tokens, num_seqs=int(num_seqs))
                reg, m_llds = llds_loss(logp, dev(old_logp), dev(adv), dev(loss_mask),
                                        gate=args.llds_gate, norm=args.llds_norm,
                                        weight=dev(weight),
                                        num_tokens=num_tokens, num_pre=num_pre,
                                        num_pre_tokens=num_pre_tokens)
                loss = pg + args.llds * reg  # Eq. 6
            loss.backward()
            loss_sum += loss.item()
            add_metrics(mb, {**m_pg, **m_llds})
        keys = sorted(mb)  # the same keys on every rank: sum the partial sums and weighted sums, max the maxima
        sums, maxes = all_reduce([mb[k] for k in keys]), all_reduce([mb[k] for k in keys], "max")
        reduced = {k: mx if REDUCE[k] == "max" else sm for k, sm, mx in zip(keys, sums, maxes)}
        per_mini.append(mean_metrics(reduced))
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        grad_norms.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item())
        loss_sum = all_reduce([loss_sum])[0]  # every rank takes the same decision
        stepped.append(bool(np.isfinite(loss_sum) and np.isfinite(grad_norms[-1])))
        if stepped[-1]:
            optimizer.step()
        else:  # a NaN/inf guard: skip the update rather than write NaN into the weights and Adam moments
            print0(f"non-finite loss {loss_sum} or grad norm {grad_norms[-1]}: update skipped")
        optimizer.zero_grad(set_to_none=True)
    return per_mini, grad_norms, stepped


def logp_pass(model, batch, args: Args, vocab_size: int, world: int,
              skip_first: bool = False) -> torch.Tensor:
    """policy.batch_logp [B, T] in the update's own micro-batches, which restart at each of this rank's mini-batches
    (the same rows padded together: the same floats); skip_first: the first mini-batch's rows NaN (`update` fills)."""
    mini = args.mini_batch_size // world
    skip = mini if skip_first else 0  # rows left NaN, for `update` to fill
    return batch_logp(model, batch, args.micro_batch_size, args.temperature, vocab_size, skip, mini)


def load_run(args: Args, rank: int, world: int, device: str):
    """What a run starts from, all checked before step 1: the checkpoint to resume and its state (or None), the
    questions, the retriever, the policy, its tokenizer and the reference. Bad input exits with one line."""
    out_dir = Path(args.out_dir)
    try:
        ckpt, state, clear = checkpoint.open_run(out_dir, args.resume, args.overwrite, warn=print0)
        if rank == 0 and (problem := checkpoint.write_problem(out_dir)):  # a file, read-only, a full disk
            raise ValueError(f"--out-dir {args.out_dir}: cannot write there ({problem})")
        corpus = "" if args.retriever_url else args.corpus  # "": a --retriever-url server needs no corpus file
        for flag, path in (("--train-data", args.train_data), ("--corpus", corpus)):
            default = getattr(Args, flag[2:].replace("-", "_"))
            if problem := missing_input(flag, path, default=default):
                raise FileNotFoundError(problem)
        rows = load_questions(args.train_data)
        retriever = make_retriever(args.corpus, args.retriever_url,
                                   timeout=args.retriever_timeout, bm25=args.bm25)
        if args.prompts_per_step > len(rows):
            raise ValueError(f"--prompts-per-step {args.prompts_per_step} is more than the "
                             f"{len(rows)} questions in {args.train_data}: "
                             "each step takes that many distinct questions")
        dtype = "float32" if args.dtype == "auto" else args.dtype  # fp32 master weights; bf16 passes: --amp or FSDP
        model, tokenizer, device = load_policy(str(ckpt) if ckpt else args.model, dtype, device)
        args.ref_dtype = reference_dtype(args.ref_dtype, device)  # before the run's config is written
        check_obs_budget(tokenizer, args.max_obs_tokens)
        max_positions = getattr(model.config, "max_position_embeddings", None) or 1e9
        prompt_tokens = longest_prompt(tokenizer, rows, max_positions)
        if rank == 0:
            checkpoint.prepare_out_dir(out_dir, clear, dataclasses.asdict(args))
            if args.ref_offload and args.kl_coef != 0.0:  # the reference, written once in --ref-dtype
                save_reference(args.model, args.ref_dtype, tokenizer, out_dir / ".ref")

        def reference(offload_dir=None):  # the frozen initial policy (--model, also when resuming) for the KL term
            ref = load_reference(args.model, args.ref_dtype, device, offload_dir)
            return shard(ref) if args.fsdp else ref
        kept = reference() if args.kl_coef != 0.0 and not args.ref_offload else None  # else read back for each pass

        def ref_model():  # the reference for one pass: the kept one, or read back from --ref-offload's folder
            return kept if kept is not None else reference(out_dir / ".ref")
        amp = autocast(args.amp, device, args.dtype)  # one process's passes (FSDP's bf16 is its own)
        bf16 = (args.fsdp and "cuda" in device) or isinstance(amp(), torch.autocast)
        least_free = -all_reduce([-free_memory(device)], "max")[0]  # every rank plans for the least free memory
        rank_rows = math.ceil(args.prompts_per_step / world) * args.group_size  # trajectories per rank and step
        args.gen_batch_size, args.micro_batch_size, args.grad_ckpt, plan = memory_plan(  # the plan's choices
            model, least_free, args.gen_batch_size, bf16=bf16, ref=kept, world=world,
            rows=rank_rows, prompt_tokens=prompt_tokens,
            update=(args.micro_batch_size, args.grad_ckpt),
            turns=(args.max_turns, args.max_new_tokens, args.max_obs_tokens))
        probe = FixedProbe.start_run(args, model, tokenizer, rows, retriever, device, rank, world,
                                     bool(ckpt), print0)
    except (OSError, ValueError) as err:  # OSError: missing files, an unreachable server or hub, a read-only disk
        raise SystemExit(f"error: {err}") from None
    if dist.is_initialized():
        dist.barrier()  # rank 0 has cleared an --overwrite out-dir and written the offloaded reference
    per_step = args.prompts_per_step * args.group_size  # trajectories a step
    updates = math.ceil(per_step / args.mini_batch_size)  # optimizer steps per rollout step
    print0(f"{len(rows)} questions | {retriever} | {world} x {device}, reference {args.ref_dtype} "
           f"| {args.prompts_per_step}x{args.group_size} trajectories/step, {updates} updates/step "
           f"| out {args.out_dir}")
    print0(plan)  # the parameters, whether the run fits, rows per generate call
    if device == "cpu" and (note := busy_cpu_note()):
        print0(note)
    ref = ref_model if args.kl_coef else None  # no KL term: no reference passes
    return ckpt, state, rows, retriever, model, tokenizer, device, ref, probe


def step_metrics(episodes, batch, adv, old_logp, new_logp, ref_logp, per_mini, grad_norms, stepped,
                 lr, args: Args):
    """The step's metrics over every rank's trajectories: the rollout's, the mini-batches' mean loss metrics, and the
    paper's likelihood diagnostics (v2 Sec. 4-5) with the official code's monitoring keys (llds.official_metrics)."""
    mask, old, new = gather_rows(batch["loss_mask"]), gather_rows(old_logp), gather_rows(new_logp)
    stats = gather_rows(episode_stats(episodes))  # [B over all ranks, 5]
    metrics = {k: float(np.mean([m[k] for m in per_mini])) for k in per_mini[0]}  # mean over the mini-batches
    metrics["grpo/grad_norm"] = float(np.mean(grad_norms))
    metrics["grpo/skipped_steps"] = stepped.count(False)
    metrics["grpo/lr"] = lr
    metrics.update(rollout_metrics(stats, mask, args.group_size))
    metrics.update(likelihood_diagnostics(old, new, mask, stats[:, 0]))
    adv_all = gather_rows(adv[:, None])[:, 0]
    answer_mask = gather_rows(batch["answer_mask"])
    ref = gather_rows(ref_logp) if ref_logp is not None else None
    metrics.update(official_metrics(old, new, adv_all, mask, answer_mask, ref))
    return metrics


def log_step(step: int, m: dict, history: list, episodes, adv, args: Args, rank: int):
    """The LLD alarm (llds.lld_alarm), metrics.jsonl (the whole history, rewritten atomically), one console line, and
    at step 1 and every --log-rollouts-every steps a few full trajectories as text (rollouts_step{N}.jsonl)."""
    out_dir = Path(args.out_dir)
    before = history[-2]["alarm/phase"] if len(history) > 1 else ""  # the previous step's phase
    m["alarm/phase"] = lld_alarm([h.get("diag/delta_correct") for h in history],
                                 [h["grpo/grad_norm"] for h in history], k=args.alarm_k)
    if m["alarm/phase"] and m["alarm/phase"] != before:
        print0(f"LLD alarm at step {step}: {m['alarm/phase']} (the likelihood of correct responses "
               f"fell or stalled for {args.alarm_k} steps; reward lags it, v2 Sec. 5.1)")
    if rank == 0:
        text = "".join(json.dumps(h) + "\n" for h in history)
        checkpoint.atomic_write(out_dir / "metrics.jsonl", text)
    print0(f"step {step} | reward {m['rollout/reward']:.3f} | pg {m['grpo/pg_loss']:.4f} | "
           f"kl {m.get('grpo/kl', 0):.5f} | llds {m['llds/penalty']:.5f} | "
           f"gate {m['llds/gate_rate']:.2f} | clip {m['grpo/clip_frac']:.3f} | "
           f"gnorm {m['grpo/grad_norm']:.3f} | search/ep {m['rollout/searches_per_traj']:.2f} | "
           f"{m['perf/step_s']:.0f}s")
    if rank == 0 and (step == 1 or step % args.log_rollouts_every == 0):
        recs = [{"question": e.question, "golden_answers": e.golden_answers, "answer": e.answer,
                 "reward": e.reward, "adv": adv[i].item(),
                 "searches": e.num_searches, "text": e.text}
                for i, e in enumerate(episodes[:args.num_log_rollouts])]
        text = "".join(json.dumps(r) + "\n" for r in recs)
        checkpoint.atomic_write(out_dir / f"rollouts_step{step}.jsonl", text)


def check_health(model, new_logp, loss_mask, bad: int, stepped: list, step: int, args: Args,
                 rerun: str = "") -> int:
    """Consecutive skipped optimizer steps after this step's `stepped`. Stops (one line) at --max-bad-steps, or when
    the update left non-finite weights or log-probs: never a checkpoint of a diverged policy. rerun: as main's."""
    for ok in stepped:
        bad = 0 if ok else bad + 1
    if bad >= args.max_bad_steps:
        raise SystemExit(f"error: {bad} consecutive optimizer steps had a non-finite loss or "
                         f"grad norm and were skipped (step {step}): the policy collapsed or "
                         f"diverged, see {args.out_dir}/metrics.jsonl")
    if not all_finite(model, new_logp, loss_mask):
        note = checkpoint.resume_note(Path(args.out_dir), rerun)
        raise SystemExit(f"error: step {step}: the update left non-finite weights or log-probs "
                         f"(the policy diverged; --lr {args.lr:g}?); not saved. {note}")
    return bad


def clock(device: str) -> tuple[float, float]:
    """(wall s, CPU s of all threads) once the kernels queued on `device` have run (perf/*)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()  # CUDA runs kernels asynchronously
    return time.time(), time.process_time()


def perf(t0, t_rollout, t_update, t_end) -> dict:
    """perf/{rollout,logp,update,step}_s (wall) and _cpu_s (CPU) from four clock() readings."""
    spans = {"rollout": (t0, t_rollout), "logp": (t_rollout, t_update), "update": (t_update, t_end),
             "step": (t0, t_end)}
    out = {}
    for name, (a, b) in spans.items():
        out[f"perf/{name}_s"] = b[0] - a[0]  # wall
        out[f"perf/{name}_cpu_s"] = b[1] - a[1]  # CPU, all threads
    return out


def make_optimizer(model, args: Args):
    """AdamW, and the official code's lr schedule: linear from 0 over --warmup-ratio of the steps,
    then constant (one scheduler step per rollout step)."""
    # fused: one in-place kernel per tensor, no temporaries at the peak
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999),
                                  weight_decay=args.weight_decay, fused=True)
    warmup = int(args.warmup_ratio * args.steps)
    scheduler = LambdaLR(optimizer, lambda s: min(1.0, s / warmup) if warmup else 1.0)
    return optimizer, scheduler


def main(args: Args, rerun: str = ""):
    """The training loop (module docstring). rerun: how to continue after Ctrl-C or an error if not
    --resume OUT_DIR."""
    split = {"--prompts-per-step": args.prompts_per_step, "--mini-batch-size": args.mini_batch_size}
    rank, world, device = setup_dist(args.fsdp, args.device, args.seed, split)
    run = load_run(args, rank, world, device)
    ckpt, state, rows, retriever, model, tokenizer, device, ref_model, probe = run
    out_dir, vocab_size = Path(args.out_dir), len(tokenizer)
    model = enable_grad_ckpt(model) if args.grad_ckpt else model
    model = shard(model) if args.fsdp else model
    optimizer, scheduler = make_optimizer(model, args)
    history, order, start, bad = [], [], 1, 0  # order: this epoch's questions to come; bad: skipped optimizer steps
    if state:
        restore(model, optimizer, scheduler, state)
        history, order, bad = state["history"], state["order"], state["bad"]
        start = state["step"] + 1
        done = f"; nothing to do: --steps {args.steps}" if start > args.steps else ""
        print0(f"resumed {ckpt} at step {start - 1}{done}")
    amp = autocast(args.amp, device, args.dtype, args.fsdp)
    generate = GENERATORS[args.generator](model, tokenizer, batch_size=args.gen_batch_size,  # sampling
                                          max_new_tokens=args.max_new_tokens,
                                          temperature=args.temperature, top_p=args.top_p)
    # Ctrl-C / SIGTERM: finish the step, save, stop; a full disk or a dead retrieval server: one line, not a traceback
    with (checkpoint.stop_requests(print0, dist.is_initialized()) as stop,
          checkpoint.io_errors_stop_the_run(out_dir, rerun), tracker(args, rank) as report):
        steps = range(start, args.steps + 1)
        for step in tqdm(steps, desc="steps", dynamic_ncols=True, disable=rank != 0):
            t0 = clock(device)
            prompts, order = next_prompts(rows, order, args.prompts_per_step, args.seed + step - 1)
            prompts = prompts[rank::world]  # this rank's prompts: whole groups stay on one rank
            # 1. rollout: G trajectories per prompt (Search-R1's loop), reward = exact match of the final <answer>
            with full_weights(model), amp(), diverged_sampling(step):
                episodes = rollout(generate, tokenizer, prompts, retriever.search,
                                   group_size=args.group_size, max_turns=args.max_turns,
                                   max_obs_tokens=args.max_obs_tokens, topk=args.topk)
            t_rollout = clock(device)
            # 2. group-relative advantages (Eq. 1); groups keyed by the rollout's prompt id, not a dataset index (P4)
            rewards = torch.tensor([e.reward for e in episodes])
            adv = group_advantages(rewards, [e.group_id for e in episodes])  # [B]
            # 3. log-probs of the sampling policy and of the reference, in the update's micro-batches
            batch = collate(episodes, tokenizer.pad_token_id)
            with amp():
                old_logp = logp_pass(model, batch, args, vocab_size, world, skip_first=True)  # [B, T] (1st: update's)
                ref_logp = None
                if ref_model:
                    ref_logp = logp_pass(ref_model(), batch, args, vocab_size, world)  # [B, T]
            weight, ma_metrics = llds_ma_weight(episodes, batch["answer_mask"], args)  # LLDS-MA (Eq. 5), or None
            pg_adv = calibadv_episodes(episodes, adv, batch, tokenizer, args.calib_adv, f1_score)  # or None
            t_update = clock(device)
            # 4. loss = L_GRPO + lambda * L_LLDS (Eq. 6), one optimizer step per mini-batch
            per_mini, grad_norms, stepped = update(
                model, optimizer, batch, old_logp, ref_logp, adv, weight, args, vocab_size,
                args.mini_batch_size // world, amp(cache=False), pg_adv)  # mini-batch: this rank's share
            lr = optimizer.param_groups[0]["lr"]  # the lr this step used
            scheduler.step()
            # 5. diagnostics: how the likelihood of correct and incorrect responses moved (v2 Sec. 4-5), the LLD alarm
            with amp():
                new_logp = logp_pass(model, batch, args, vocab_size, world)
            diagnostics = step_metrics(episodes, batch, adv, old_logp, new_logp, ref_logp, per_mini,
                                       grad_norms, stepped, lr, args)
            metrics = {"step": step, **diagnostics, **ma_metrics, **probe(step)}
            history.append(metrics)
            metrics.update(perf(t0, t_rollout, t_update, clock(device)))
            # 6. log and save
            log_step(step, metrics, history, episodes, adv, args, rank)
            report(numbers(metrics), step)
            bad = check_health(model, new_logp, batch["loss_mask"], bad, stepped, step, args, rerun)
            stopping = all_reduce([len(stop)], "max")[0] > 0  # every rank saves and stops together
            if step % args.save_every == 0 or step == args.steps or stopping:
                saved_state = {"order": order, "bad": bad, "history": history,
                               "scheduler": scheduler.state_dict()}
                saved = save_checkpoint(model, tokenizer, optimizer, out_dir, step, saved_state,
                                        args.keep_checkpoints)
                if saved:  # None on the ranks other than 0
                    print0(f"saved {saved}")
            if stopping:
                print0(f"stopped after step {step}. {checkpoint.resume_note(out_dir, rerun)}")
                raise SystemExit(128 + (stop[0] if stop else signal.SIGTERM))
    if rank == 0:
        shutil.rmtree(out_dir / ".ref", ignore_errors=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    args = parse_args()
    try:
        main(args)
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once, without saving the step in progress
        raise SystemExit(f"interrupted. {checkpoint.resume_note(Path(args.out_dir))}") from None
