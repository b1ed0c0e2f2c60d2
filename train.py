"""Train a search agent with GRPO + LLDS, in the paper's order: rollout -> reward -> group
advantages -> log-probs -> loss = L_GRPO + lambda * L_LLDS (Eq. 6) -> diagnostics -> save, as the
official LLDS code (a veRL 0.1 fork of Search-R1, dp_actor.py) runs it. Each step's trajectories
feed several optimizer mini-batches: from the second on, the policy is no longer the one that
sampled, which is where LLDS acts (with one update per batch the Delta of v2 Sec. 5.5 is ~0; the
authors' script makes 512 x 5 / 256 = 10 updates per rollout batch). Below: Args, `main` (the loop),
`update` (Eq. 6), then what a run starts from and the command line; the bookkeeping is
machinery/run.py's.

    python train.py --model Qwen/Qwen2.5-3B --llds 0.2     # the paper's setting: a big GPU, the hub
    python train.py --model Qwen/Qwen2.5-0.5B-Instruct --llds 0.1 --prompts-per-step 16    # one GPU
    torchrun --nproc_per_node 8 train.py --model Qwen/Qwen2.5-7B-Instruct --llds 0.3 --fsdp \
        --grad-ckpt                                                                         # 8 GPUs

--out-dir gets metrics.jsonl, rollouts_step{N}.jsonl and checkpoints/ (--resume <out-dir> continues
it); see --help.
"""

import contextlib
import dataclasses
import math
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from grpo import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, group_advantages, grpo_loss
from grpo import REDUCE as GRPO_REDUCE, calibadv_advantages
from llds import GATES, MA_SCHEDULES, NORMS, lld_alarm, llds_loss, ma_weight
from llds import REDUCE as LLDS_REDUCE, likelihood_diagnostics, official_metrics
from probe import FixedProbe
from retriever import BM25_VARIANTS, make_retriever
from rollout import STOP_STRINGS, check_obs_budget, episode_stats, f1_score, longest_prompt
from rollout import rollout, rollout_metrics
from machinery import calibadv, checkpoint
from machinery.checkpoint import restore, save_checkpoint
from machinery.data import load_questions, missing_input, next_prompts
from machinery.engine import DECODE_LAYOUTS, GENERATORS, decode_option, diverged_sampling
from machinery.fsdp import all_reduce, full_weights, gather_rows, print0, setup_dist, shard
from machinery.memory import free_memory, memory_plan
from machinery.policy import (autocast, batch_logp, busy_cpu_note, collate, enable_grad_ckpt,
                              load_policy, load_reference, reference_dtype, response_logp,
                              save_reference)
from machinery.run import (Run, add_metrics, check_health, clock, log_step, make_optimizer,
                           mean_metrics, parse_dataclass, perf)
from machinery.tracking import TRACKERS, missing_tracker, numbers, tracker


@dataclass
class Args:
    # --- model
    # hub id, model folder, checkpoint or run folder, or .gguf file
    model: str = "Qwen/Qwen2.5-0.5B-Instruct"
    # weights: float32 | bfloat16 | auto (float32; bf16 compute comes from --amp or FSDP)
    dtype: str = "auto"
    # bf16 autocast over fp32: auto (a GPU, or a CPU with AVX512-BF16/AMX; not FSDP) | bf16 | off
    amp: str = "auto"
    device: str = "auto"  # cpu | cuda | auto
    seed: int = 0  # seeds python, numpy and torch (sampling and data order)
    # --- data and retrieval
    # FlashRAG .jsonl/.parquet or hub id[:config]
    train_data: str = "data/hotpotqa/hotpotqa_train.jsonl"
    # passages, jsonl {"id", "contents": '"Title"\\ntext'}
    corpus: str = "data/hotpotqa/corpus.jsonl"
    # a Search-R1 /retrieve server (scripts/retrieval_server.py); "" = in-process BM25
    retriever_url: str = ""
    # seconds per --retriever-url request (3 tries, a warning after each failure)
    retriever_timeout: float = 30.0
    # lucene (pyserini's BM25 + English analyzer) | okapi (rank-bm25); in-process only
    bm25: str = "lucene"
    # --- rollout
    prompts_per_step: int = 512  # questions per rollout batch (paper: 512)
    group_size: int = 5  # G, trajectories per question (paper: 5)
    # search-enabled generations before the answer-only one (LLDS: 3; Search-R1: 4)
    max_turns: int = 3
    max_new_tokens: int = 500  # tokens per generation turn (paper: 500)
    max_obs_tokens: int = 500  # tokens per <information> block (paper: 500)
    topk: int = 3  # passages per search
    temperature: float = 1.0  # sampling temperature; log-probs use the same one (P17)
    top_p: float = 0.95  # nucleus sampling (the code's yaml default; the paper says 1.0)
    # rows per generate call: a count, or auto: as many as the free memory holds
    gen_batch_size: str = "auto"
    # decoding: cb (continuous batching, KV kept across turns) | hf | hf-kv (machinery/engine.py)
    generator: str = "cb"
    # cb's KV layout: auto (graph on CUDA, dynamic elsewhere) | dynamic | static | graph (static,
    # each step a CUDA graph); the same ids (machinery/kv_layout.py)
    decode: str = "auto"
    # --- GRPO loss
    policy_loss: str = "ppo-clip"  # ppo-clip (token ratio) | gspo (sequence ratio; USE_GSPO)
    clip_eps: float = 0.2  # PPO ratio clip epsilon
    # upper clip 1 + clip_eps_high (DAPO clip-higher: 0.28); unset = --clip-eps
    clip_eps_high: float = None
    kl_coef: float = 0.001  # weight of the KL to the frozen initial policy (0: no reference model)
    kl_type: str = "k3"  # k1 | k2 | k3 (= low_var_kl, the code's)
    entropy_coef: float = 0.001  # entropy bonus (in the code, not in the paper)
    # token-mean | seq-mean-token-mean (Eq. 1) | seq-mean-token-sum-norm
    loss_agg: str = "token-mean"
    # CalibAdv's calibrated advantages (grpo.calibadv_advantages) at this target ratio; 0 = off
    calib_adv: float = 0.0
    # --- LLDS
    # lambda (paper: 0.2; 0.3 for 7B-Instruct); 0 = plain GRPO (LLDS metrics still logged)
    llds: float = 0.2
    llds_gate: str = "action"  # action (LLDS-A, the paper's) | response | token (no gate)
    # code (all response tokens; published numbers) | paper (Eq. 4; Eqs. 9/10)
    llds_norm: str = "code"
    # answer-span weight (Eq. 5): off | code | fixed | paper (docs/training.md)
    llds_ma: str = "off"
    llds_ma_weight: float = 0.2  # w, the code's MASK_WEIGHT, for --llds-ma code and fixed
    # --- optimisation
    steps: int = 1005  # rollout steps (paper: 1005)
    lr: float = 1e-6  # AdamW learning rate (paper: 1e-6)
    # linear warmup from 0 over this fraction of the steps, then constant
    warmup_ratio: float = 0.285
    weight_decay: float = 0.01  # AdamW weight decay (veRL default)
    grad_clip: float = 1.0  # global grad-norm clip
    # trajectories per optimizer step (paper: 256: 10 updates per rollout step)
    mini_batch_size: int = 256
    # trajectories per forward/backward (P14); unset: the memory plan picks 8, 4, 2 or 1
    micro_batch_size: int = None
    max_bad_steps: int = 5  # stop after this many consecutive non-finite (skipped) optimizer steps
    # --- memory and ranks
    fsdp: bool = False  # shard the policy and reference over the torchrun ranks (machinery/fsdp.py)
    # recompute each layer in backward (~1.3x compute); unset: on if the memory plan needs it
    grad_ckpt: bool = None
    # reference weights: auto (bfloat16 on a GPU or a CPU with bf16 units) | bfloat16 | float32
    ref_dtype: str = "auto"
    ref_offload: bool = False  # reference on disk (OUT_DIR/.ref), loaded for its pass only
    # --- logging and checkpoints
    out_dir: str = "runs/default"  # metrics.jsonl, rollouts_step{N}.jsonl and checkpoints/ go here
    log_rollouts_every: int = 10  # write a few full trajectories every N steps (and at step 1)
    num_log_rollouts: int = 4  # trajectories per rollouts file
    # checkpoint every N steps (also at the last step, on Ctrl-C and on SIGTERM)
    save_every: int = 10
    # complete checkpoints to keep (an old one goes only once a newer one is complete)
    keep_checkpoints: int = 1
    alarm_k: int = 3  # LLD alarm after this many steps of non-rising correct-response likelihood
    # LLD probe: questions whose step-0 trajectories are re-scored (probe.py); 0 = off
    probe_questions: int = 8
    # re-score the probe trajectories every N steps (probe/* keys), or auto: every
    # ceil(1.25 x probe_questions / prompts_per_step) steps, under a tenth of a step's time (a pass
    # over probe_questions x group_size responses: 0.22 of a SmolLM2 4 x 4 step, made every step)
    probe_every: str = "auto"
    # also send each step's metrics to: off | tensorboard | wandb | trackio (pip install it)
    report_to: str = "off"
    # run folder (its newest complete checkpoint) or checkpoints/step_N folder to continue exactly
    resume: str = ""
    # start afresh in an --out-dir that holds a run (deletes its metrics and checkpoints)
    overwrite: bool = False



def main(args: Args, rerun: str = ""):
    """The training loop (module docstring). rerun: how to continue after Ctrl-C or an error if not
    --resume OUT_DIR."""
    split = {"--prompts-per-step": args.prompts_per_step, "--mini-batch-size": args.mini_batch_size}
    rank, world, device = setup_dist(args.fsdp, args.device, args.seed, split)
    run = load_run(args, rank, world, device)
    tokenizer, device, out_dir = run.tokenizer, run.device, Path(args.out_dir)
    vocab_size = len(tokenizer)
    model = enable_grad_ckpt(run.model) if args.grad_ckpt else run.model
    model = shard(model) if args.fsdp else model
    optimizer, scheduler = make_optimizer(model, args)
    history, order, start, bad = [], [], 1, 0  # order: questions left; bad: skipped steps
    if run.state:
        restore(model, optimizer, scheduler, run.state)
        history, order, bad = run.state["history"], run.state["order"], run.state["bad"]
        start = run.state["step"] + 1
        done = f"; nothing to do: --steps {args.steps}" if start > args.steps else ""
        print0(f"resumed {run.ckpt} at step {start - 1}{done}")
    amp = autocast(args.amp, device, args.dtype, args.fsdp)
    generate = GENERATORS[args.generator](  # sampling
        model, tokenizer, stop_strings=STOP_STRINGS, batch_size=args.gen_batch_size,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        **decode_option(args.generator, args.decode))
    # Ctrl-C / SIGTERM: finish the step, save, stop; a full disk, a dead server: one line
    with (checkpoint.stop_requests(print0, dist.is_initialized()) as stop,
          checkpoint.io_errors_stop_the_run(out_dir, rerun), tracker(args, rank) as report):
        steps = range(start, args.steps + 1)
        for step in tqdm(steps, desc="steps", dynamic_ncols=True, disable=rank != 0):
            t0 = clock(device)
            seed = args.seed + step - 1  # the data order's
            prompts, order = next_prompts(run.rows, order, args.prompts_per_step, seed)
            prompts = prompts[rank::world]  # this rank's prompts: whole groups stay on one rank
            # 1. rollout: G trajectories a prompt (Search-R1's loop), reward = EM of the answer
            with full_weights(model), amp(), diverged_sampling(step):
                episodes = rollout(generate, tokenizer, prompts, run.retriever.search,
                                   group_size=args.group_size, max_turns=args.max_turns,
                                   max_obs_tokens=args.max_obs_tokens, topk=args.topk)
            t_rollout = clock(device)
            # 2. group-relative advantages (Eq. 1), groups keyed by the rollout's prompt id (P4)
            rewards = torch.tensor([e.reward for e in episodes])
            adv = group_advantages(rewards, [e.group_id for e in episodes])  # [B]
            # 3. log-probs of the sampling policy and the reference, in the update's micro-batches
            batch = collate(episodes, tokenizer.pad_token_id)
            with amp():  # [B - b, T] (update gives the first mini-batch's b rows) and [B, T]
                later_old_logp = logp_pass(model, batch, args, vocab_size, world, skip_first=True)
                ref_logp = logp_pass(run.ref(), batch, args, vocab_size, world) if run.ref else None
            weight, ma_metrics = llds_ma_weight(episodes, batch["answer_mask"], args)  # Eq. 5/None
            pg_adv = calibadv_advantages(  # CalibAdv's token advantages [B, T]; off: None
                adv, batch["loss_mask"], [e.group_id for e in episodes],
                calibadv.episode_turn_scores(episodes, tokenizer, f1_score),
                args.calib_adv) if args.calib_adv else None
            t_update = clock(device)
            # 4. loss = L_GRPO + lambda * L_LLDS (Eq. 6), one optimizer step per mini-batch
            per_mini, grad_norms, stepped, old_logp = update(  # mini-batch: this rank's share
                model, optimizer, batch, later_old_logp, ref_logp, adv, weight, args, vocab_size,
                args.mini_batch_size // world, amp(cache=False), pg_adv)
            lr = optimizer.param_groups[0]["lr"]  # the lr this step used
            scheduler.step()
            # 5. diagnostics: how correct and incorrect responses' likelihood moved (Sec. 4-5)
            with amp():
                new_logp = logp_pass(model, batch, args, vocab_size, world)
            diagnostics = step_metrics(episodes, batch, adv, old_logp, new_logp, ref_logp, per_mini,
                                       grad_norms, stepped, lr, args)
            metrics = {"step": step, **diagnostics, **ma_metrics, **run.probe(step)}
            alarm_before = history[-1]["alarm/phase"] if history else ""
            history.append(metrics)
            metrics.update(perf(t0, t_rollout, t_update, clock(device)))
            correct = [h.get("diag/delta_correct") for h in history]
            metrics["alarm/phase"] = lld_alarm(correct, [h["grpo/grad_norm"] for h in history],
                                               k=args.alarm_k)
            # 6. log and save
            log_step(step, metrics, history, episodes, adv, args, rank, alarm_before)
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


def update(model, optimizer, batch, old_logp, ref_logp, adv, weight, args: Args, vocab_size: int,
           mini_batch_size: int, amp=contextlib.nullcontext(), pg_adv=None):
    """The optimizer steps of one rollout step (Eq. 6): one per mini-batch, gradients accumulated
    over micro-batches.

    batch: collate() of this rank's B trajectories; ref_logp (or None), weight (LLDS-MA, or None)
    [B, T]; adv [B]; pg_adv [B, T] the policy gradient's (--calib-adv; None: adv). old_logp: the
    sampling policy's log-probs, [B, T], or [B - b, T] without the first mini-batch's b rows, which
    are then the update's own first forward, detached: taken before any optimizer step, it is the
    sampling policy's (the same floats: tests/test_train.py). mini_batch_size: this rank's share of
    a mini-batch, whose token and sequence counts are summed over ranks (P14), so the loss is the
    one a single process would get. amp: around each micro-batch's forward and loss. Returns
    (metrics per mini-batch, reduced over ranks; pre-clip grad norms; per mini-batch True if the
    optimizer stepped, False if a non-finite loss or grad norm skipped it; old_logp [B, T], every
    row).
    """
    # A_i,t of the policy gradient
    device, a_t = next(model.parameters()).device, adv if pg_adv is None else pg_adv
    loss_mask = batch["loss_mask"]
    B = loss_mask.shape[0]
    # rows of the first mini-batch whose old log-probs come from its own forward
    own = B - old_logp.shape[0]
    per_mini, grad_norms, stepped, first_old = [], [], [], []
    for m0 in range(0, B, mini_batch_size):
        mini = slice(m0, min(m0 + mini_batch_size, B))
        # [b] Y_pre responses with a model token
        pre = (adv[mini] >= 0) & (loss_mask[mini].sum(-1) > 0)
        counts = [loss_mask[mini].sum(), pre.sum(), mini.stop - mini.start]
        num_tokens, num_pre, num_seqs = all_reduce(counts)  # over ranks
        num_tokens, num_pre = max(num_tokens, 1.0), max(int(num_pre), 1)
        pre_tokens = (loss_mask[mini] * (adv[mini] >= 0)[:, None]).sum()  # Eqs. 9, 10
        num_pre_tokens = max(all_reduce([pre_tokens])[0], 1.0)
        mb, loss_sum = {}, 0.0  # this mini-batch's metrics and loss (this rank's part)
        for u0 in range(mini.start, mini.stop, args.micro_batch_size):
            rows = slice(u0, min(u0 + args.micro_batch_size, mini.stop))

            # this micro-batch's rows of a [B, ...] tensor (or None), on the model's device
            def dev(x, rows=rows):
                return None if x is None else x[rows].to(device)
            with amp:
                logp, entropy = response_logp(model, batch, rows, args.temperature, vocab_size,
                                              with_entropy=True)
                # the first mini-batch, before any optimizer step: the rollout policy's
                if rows.start < own:
                    first_old.append(logp.detach())
                    old = first_old[-1]
                else:
                    old = old_logp[rows.start - own:rows.stop - own].to(device)
                pg, m_pg = grpo_loss(logp, old, dev(ref_logp), dev(a_t), dev(loss_mask),
                                     entropy=entropy, entropy_coef=args.entropy_coef,
                                     policy_loss=args.policy_loss, agg=args.loss_agg,
                                     clip_eps=args.clip_eps, clip_eps_high=args.clip_eps_high,
                                     kl_coef=args.kl_coef, kl_type=args.kl_type,
                                     num_tokens=num_tokens, num_seqs=int(num_seqs))
                reg, m_llds = llds_loss(logp, old, dev(adv), dev(loss_mask),
                                        gate=args.llds_gate, norm=args.llds_norm,
                                        weight=dev(weight),
                                        num_tokens=num_tokens, num_pre=num_pre,
                                        num_pre_tokens=num_pre_tokens)
                loss = pg + args.llds * reg  # Eq. 6
            loss.backward()
            loss_sum += loss.item()
            add_metrics(mb, {**m_pg, **m_llds}, REDUCE)
        # the same keys on every rank: sum the partial sums and weighted sums, max the maxima
        keys = sorted(mb)
        sums, maxes = all_reduce([mb[k] for k in keys]), all_reduce([mb[k] for k in keys], "max")
        reduced = {k: mx if REDUCE[k] == "max" else sm for k, sm, mx in zip(keys, sums, maxes)}
        per_mini.append(mean_metrics(reduced, REDUCE))
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        grad_norms.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item())
        loss_sum = all_reduce([loss_sum])[0]  # every rank takes the same decision
        stepped.append(bool(np.isfinite(loss_sum) and np.isfinite(grad_norms[-1])))
        if stepped[-1]:
            optimizer.step()
        # a NaN/inf guard: skip the update rather than write NaN into the weights and Adam moments
        else:
            print0(f"non-finite loss {loss_sum} or grad norm {grad_norms[-1]}: update skipped")
        optimizer.zero_grad(set_to_none=True)
    first_old = [x.to(old_logp.device, old_logp.dtype) for x in first_old]
    return per_mini, grad_norms, stepped, torch.cat([*first_old, old_logp])


# metric -> how micro-batch values combine: "sum", "max" or ("mean", weight)
REDUCE = {**GRPO_REDUCE, **LLDS_REDUCE}


def logp_pass(model, batch, args: Args, vocab_size: int, world: int, skip_first: bool = False):
    """policy.batch_logp [B, T] in the update's own micro-batches, which restart at each of this
    rank's mini-batches (the same rows padded together: the same floats); skip_first: [B - b, T],
    without the first mini-batch's b rows (`update`'s own first forward gives them: with one
    mini-batch a step, no pass at all)."""
    mini = args.mini_batch_size // world
    skip = mini if skip_first else 0  # rows the update gives itself
    return batch_logp(model, batch, args.micro_batch_size, args.temperature, vocab_size, skip, mini)


def llds_ma_weight(episodes, answer_mask: torch.Tensor,
                   args: Args) -> tuple[torch.Tensor | None, dict]:
    """LLDS-MA (v2 Eq. 5): llds.ma_weight [B, T] and its metrics, V = the mean of
    Episode.num_valid_searches over every rank's trajectories (dp_actor.py:275-277); (None, {}) with
    --llds-ma off."""
    if args.llds_ma == "off":
        return None, {}
    n, total = all_reduce([len(episodes), sum(e.num_valid_searches for e in episodes)])
    return ma_weight(total / n, answer_mask, args.llds_ma,
                     lam=args.llds, mask_weight=args.llds_ma_weight)


def step_metrics(episodes, batch, adv, old_logp, new_logp, ref_logp, per_mini, grad_norms, stepped,
                 lr, args: Args):
    """The step's metrics over every rank's trajectories: the rollout's, the mini-batches' mean loss
    metrics, and the paper's likelihood diagnostics (v2 Sec. 4-5) with the official code's
    monitoring keys (llds.official_metrics)."""
    mask, old, new = gather_rows(batch["loss_mask"]), gather_rows(old_logp), gather_rows(new_logp)
    stats = gather_rows(episode_stats(episodes))  # [B over all ranks, 5]
    # mean over the mini-batches
    metrics = {k: float(np.mean([m[k] for m in per_mini])) for k in per_mini[0]}
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


def load_run(args: Args, rank: int, world: int, device: str) -> Run:
    """What a run starts from (machinery.run.Run), all checked before step 1: the checkpoint to
    resume and its state (or None), the questions, the retriever, the policy, its tokenizer, the
    reference and the fixed probe (sampled now, by the starting policy). Bad input exits with one
    line."""
    out_dir = Path(args.out_dir)
    try:
        ckpt, state, clear = checkpoint.open_run(out_dir, args.resume, args.overwrite, warn=print0)
        # a file, read-only, a full disk
        if rank == 0 and (problem := checkpoint.write_problem(out_dir)):
            raise ValueError(f"--out-dir {args.out_dir}: cannot write there ({problem})")
        # "": a --retriever-url server needs no corpus file
        corpus = "" if args.retriever_url else args.corpus
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
        # fp32 master weights; bf16 passes: --amp or FSDP
        dtype = "float32" if args.dtype == "auto" else args.dtype
        model, tokenizer, device = load_policy(str(ckpt) if ckpt else args.model, dtype, device)
        # before the run's config is written
        args.ref_dtype = reference_dtype(args.ref_dtype, device)
        check_obs_budget(tokenizer, args.max_obs_tokens)
        max_positions = getattr(model.config, "max_position_embeddings", None) or 1e9
        prompt_tokens = longest_prompt(tokenizer, rows, max_positions)
        if rank == 0:
            checkpoint.prepare_out_dir(out_dir, clear, dataclasses.asdict(args))
            # the reference, written once in --ref-dtype
            if args.ref_offload and args.kl_coef != 0.0:
                save_reference(args.model, args.ref_dtype, tokenizer, out_dir / ".ref")

        # the frozen initial policy (--model, also when resuming) for the KL term
        def reference(offload_dir=None):
            ref = load_reference(args.model, args.ref_dtype, device, offload_dir)
            return shard(ref) if args.fsdp else ref
        # else read back for each pass
        kept = reference() if args.kl_coef != 0.0 and not args.ref_offload else None

        # the reference for one pass: the kept one, or read back from --ref-offload's folder
        def ref_model():
            return kept if kept is not None else reference(out_dir / ".ref")
        # one process's passes (FSDP's bf16 is its own)
        amp = autocast(args.amp, device, args.dtype)
        bf16 = (args.fsdp and "cuda" in device) or isinstance(amp(), torch.autocast)
        # every rank plans for the least free memory
        least_free = -all_reduce([-free_memory(device)], "max")[0]
        # trajectories per rank and step
        rank_rows = math.ceil(args.prompts_per_step / world) * args.group_size
        # the plan's choices
        args.gen_batch_size, args.micro_batch_size, args.grad_ckpt, plan = memory_plan(
            model, least_free, args.gen_batch_size, bf16=bf16, ref=kept, world=world,
            rows=rank_rows, prompt_tokens=prompt_tokens,
            update=(args.micro_batch_size, args.grad_ckpt),
            turns=(args.max_turns, args.max_new_tokens, args.max_obs_tokens),
            throughput_rows=args.mini_batch_size // world if "cuda" in device else 0)
        # probe responses a rank
        rows_each = min(args.probe_questions, len(rows)) // world * args.group_size
        sample = GENERATORS[args.generator](
            model, tokenizer, stop_strings=STOP_STRINGS, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_p=args.top_p,
            batch_size=max(1, min(int(args.gen_batch_size), rows_each)),
            **decode_option(args.generator, args.decode))
        amp0 = autocast("bf16" if args.fsdp and "cuda" in device else args.amp, device, args.dtype)
        probe = FixedProbe.start_run(  # step 0's pass before sharding: amp0 (FSDP's bf16 on a GPU)
            model, tokenizer, rows, sample, retriever.search,
            path=out_dir / f"probe_rank{rank}.json", questions=args.probe_questions,
            every=args.probe_every, micro=args.micro_batch_size, temperature=args.temperature,
            amp=autocast(args.amp, device, args.dtype, args.fsdp), amp0=amp0, rank=rank,
            world=world, resumed=bool(ckpt), warn=print0, group_size=args.group_size,
            max_turns=args.max_turns, max_obs_tokens=args.max_obs_tokens, topk=args.topk)
    # OSError: missing files, an unreachable server or hub, a read-only disk
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    if dist.is_initialized():
        # rank 0 has cleared an --overwrite out-dir and written the offloaded reference
        dist.barrier()
    per_step = args.prompts_per_step * args.group_size  # trajectories a step
    updates = math.ceil(per_step / args.mini_batch_size)  # optimizer steps per rollout step
    compute = "bf16 autocast" if bf16 else "fp32"  # --amp auto: bf16 on a GPU or a bf16 CPU
    print0(f"{len(rows)} questions | {retriever} | {world} x {device}, {compute} "
           f"(--amp {args.amp}), reference {args.ref_dtype} "
           f"| {args.prompts_per_step}x{args.group_size} trajectories/step, {updates} updates/step "
           f"| out {args.out_dir}")
    print0(plan)  # the parameters, whether the run fits, rows per generate call
    if device == "cpu" and (note := busy_cpu_note()):
        print0(note)
    ref = ref_model if args.kl_coef else None  # no KL term: no reference passes
    return Run(ckpt, state, rows, retriever, model, tokenizer, device, ref, probe)


# --------------------------------------------------------------------------------------------------
# The command line: Args' valid values, checked before the run starts

NON_NEGATIVE = ("seed", "max_turns", "num_log_rollouts", "weight_decay", "kl_coef", "entropy_coef",
                "llds", "llds_ma_weight", "probe_questions", "calib_adv")
COUNTS = ("prompts_per_step", "group_size", "max_new_tokens", "max_obs_tokens", "topk", "steps",
          "alarm_k", "mini_batch_size", "micro_batch_size", "max_bad_steps", "log_rollouts_every",
          "save_every", "keep_checkpoints")
# Args field -> (valid?, the valid range in words); every value is checked before the run starts
RANGES = {
    **dict.fromkeys(NON_NEGATIVE, (lambda v: v >= 0, ">= 0")),
    **dict.fromkeys(COUNTS, (lambda v: v is None or v >= 1, ">= 1")),  # None: unset
    **dict.fromkeys(("temperature", "lr", "grad_clip"), (lambda v: v > 0, "> 0")),
    "retriever_timeout": (lambda v: v > 0, "> 0 seconds"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "clip_eps": (lambda v: 0 < v < 1, "in (0, 1)"),
    "clip_eps_high": (lambda v: v is None or v > 0, "> 0"),  # None: unset (--clip-eps)
    "warmup_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "gen_batch_size": (lambda v: v == "auto" or (v.isdecimal() and int(v) >= 1),
                       "an integer >= 1 or auto"),
    "probe_every": (lambda v: v == "auto" or (v.isdecimal() and int(v) >= 1),
                    "an integer >= 1 or auto"),
    "device": (lambda v: v in ("auto", "cpu") or v.startswith("cuda"), "cpu, cuda, cuda:N or auto"),
}
# Args field -> its valid values, taken from the table that implements them (one edit adds a
# variant)
CHOICES = {
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
    "decode": DECODE_LAYOUTS,
    "report_to": ("off", *TRACKERS),
}


def parse_args(argv=None) -> Args:
    """argparse over the Args fields: --field-name VALUE for each, help from the field's comment,
    grouped by the `# --- section` comments. Bad values exit with one line naming the flag and the
    valid range (RANGES, CHOICES)."""
    args, error = parse_dataclass(Args, __doc__, RANGES, CHOICES, argv)
    # unset: symmetric
    args.clip_eps_high = args.clip_eps if args.clip_eps_high is None else args.clip_eps_high
    auto = math.ceil(1.25 * args.probe_questions / args.prompts_per_step)  # probe: <~10% of a step
    args.probe_every = max(1, auto) if args.probe_every == "auto" else int(args.probe_every)
    if args.report_to != "off" and (problem := missing_tracker(args.report_to)):
        error(f"--report-to {args.report_to}: {problem}")
    per_step = args.prompts_per_step * args.group_size  # trajectories a step
    # the LLDS arm of a comparison would equal plain GRPO
    if args.llds > 0 and per_step <= args.mini_batch_size:
        print(f"warning: --llds {args.llds:g} with one update a step: LLDS is inert "
              f"(its Delta is 0 at an on-policy update); give --mini-batch-size < {per_step} "
              "(the trajectories a step) for several updates a step (the paper: 10)",
              file=sys.stderr)
    if args.decode != "auto" and args.generator != "cb":
        error(f"--decode {args.decode} is the cb engine's; --generator {args.generator} has none")
    if args.decode == "graph" and (args.device == "cpu" or not torch.cuda.is_available()):
        error("--decode graph needs a CUDA device (--decode static is the same layout, eager)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        error(f"--device {args.device}: this torch sees no CUDA device "
              "(torch.cuda.is_available() is False); "
              "use --device cpu, or install a CUDA build of torch")
    return args


if __name__ == "__main__":
    args = parse_args()
    try:
        main(args)
    # a second Ctrl-C: stopped at once, without saving the step in progress
    except KeyboardInterrupt:
        raise SystemExit(f"interrupted. {checkpoint.resume_note(Path(args.out_dir))}") from None
