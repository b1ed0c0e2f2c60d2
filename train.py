"""Train a search agent with GRPO + LLDS: rollout -> reward -> group advantages -> mini-batch updates -> log.

Wires retriever.py (BM25), rollout.py (Search-R1 multi-turn loop, EM reward), grpo.py (clipped surrogate, k3 KL,
entropy bonus) and llds.py (likelihood-preserving regulariser), as the official LLDS code (a veRL 0.1 fork of Search-R1)
runs them: each rollout batch of prompts x G trajectories is split into several optimizer mini-batches, so that from
the second mini-batch on the policy differs from the one that sampled (SPEC P1: with one update per batch LLDS is ~0).

    python train.py --model Qwen/Qwen2.5-3B --llds 0.2                       # the paper's setting (needs a big GPU)
    python train.py --model Qwen/Qwen2.5-0.5B-Instruct --llds 0.1 --prompts-per-step 16 --group-size 5
    python train.py --model <folder> --llds 0.1 --steps 3 --prompts-per-step 2 --group-size 4 --max-turns 2 \\
        --max-new-tokens 64 --max-obs-tokens 160 --mini-batch-size 4 --micro-batch-size 4 --grad-ckpt --ref-offload \
        --amp bf16 --lr 1e-5                                                     # CPU steps (README: quick start)
    torchrun --nproc_per_node 8 train.py --model Qwen/Qwen2.5-7B-Instruct --llds 0.3 --fsdp --grad-ckpt  # 8 GPUs

With --fsdp (under torchrun; gloo on CPU, nccl on GPU) every rank rolls out its own prompts (whole groups) with the
full weights gathered, and each optimizer mini-batch is the union of every rank's share; token counts and metrics are
reduced over ranks, so the loss is the same as one process's (tests/test_fsdp.py). The algorithm never looks at the
world size: only seeding (seed + rank), printing and saving (rank 0) do.

Outputs in --out-dir: metrics.jsonl (one JSON object per step), rollouts_step{N}.jsonl (full trajectories as text),
checkpoints/step_N/ (save_pretrained + trainer_state.pt, every --save-every steps, at the end and on Ctrl-C/SIGTERM;
checkpoint.py: a kill or a full disk never leaves less than one complete checkpoint). Rerun the same command with
`--resume <out-dir>` to continue exactly from the newest complete one. An out-dir that holds a run is not reused
without --resume or --overwrite. `python train.py --help` lists every option.
"""

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as activation_checkpoint  # recompute in backward
from tqdm import tqdm

import checkpoint
from checkpoint import atomic_write
from grpo import POLICY_LOSSES, group_advantages, grpo_loss, logp_and_entropy_from_logits, logp_from_logits
from llds import MA_SCHEDULES, likelihood_diagnostics, lld_alarm, llds_loss, ma_answer_weight, ma_beta, official_metrics
from policy import load_policy
from retriever import BM25_VARIANTS, make_retriever
from rollout import check_obs_budget, hf_generator, load_questions, rollout


# normalised by the mini-batch's totals (its tokens, or its A >= 0 responses): micro-batch values add up
LOSS_TERMS = ("grpo/pg_loss", "grpo/kl", "llds/penalty", "llds/active_per_response")


@dataclass
class Args:
    # --- model
    model: str = "Qwen/Qwen2.5-0.5B-Instruct"
    """hub id, local folder (e.g. a checkpoint/), or a .gguf file"""
    dtype: str = "auto"
    """weights: float32 | bfloat16 | auto (float32 master weights; bf16 compute comes from --amp or FSDP)"""
    amp: str = "auto"
    """bf16 autocast over fp32 master weights: auto (on one GPU; FSDP has its own mixed precision) | bf16 (also on a
    CPU with bf16 units, AVX512-BF16/AMX: ~1.7x faster forward+backward, ~2x generation; without them it is slower) |
    off"""
    device: str = "auto"
    """cpu | cuda | auto"""
    seed: int = 0
    """seeds python, numpy and torch (sampling and data order)"""
    # --- data
    train_data: str = "../shared/data/hotpotqa_train.jsonl"
    """.jsonl/.parquet file in FlashRAG format, or a hub dataset id[:config] (e.g. PeterJinGo/nq_hotpotqa_train)"""
    corpus: str = "../shared/data/corpus.jsonl"
    """retrieval corpus, jsonl rows {"id", "contents": '"Title"\\ntext'} (wiki-18 format)"""
    retriever_url: str = ""
    """Search-R1 /retrieve server (e.g. http://127.0.0.1:8000/retrieve, `python retriever.py serve`); "" = in-process"""
    retriever_timeout: float = 30.0
    """seconds to wait for each --retriever-url request (it is tried 3 times, with a warning line after each failure)"""
    bm25: str = "lucene"
    """in-process BM25 scoring: lucene (Lucene's BM25 and English analyzer, as pyserini) | okapi (rank-bm25, \\w+
    words); a --retriever-url server scores as it was started (retriever.py serve --bm25)"""
    # --- rollout
    prompts_per_step: int = 512
    """questions per rollout batch (paper: 512)"""
    group_size: int = 5
    """G, trajectories per question (paper: n_agent = 5)"""
    max_turns: int = 3
    """search-enabled generations before the answer-only one (LLDS: 3; Search-R1: 4)"""
    max_new_tokens: int = 500
    """tokens per generation turn (paper: 500)"""
    max_obs_tokens: int = 500
    """tokens per <information> block (paper: 500)"""
    topk: int = 3
    """passages per search"""
    temperature: float = 1.0
    """sampling temperature; log-probs use the same one (P17)"""
    top_p: float = 0.95
    """nucleus sampling (the code's yaml default; the paper says 1.0)"""
    gen_batch_size: int = 64
    """rows per generate call"""
    # --- grpo
    steps: int = 1005
    """rollout steps (paper: 1005)"""
    lr: float = 1e-6
    """AdamW learning rate (paper: 1e-6)"""
    warmup_ratio: float = 0.285
    """linear warmup over this fraction of steps, from 0, then constant (the code's schedule)"""
    weight_decay: float = 0.01
    """AdamW weight decay (veRL default)"""
    grad_clip: float = 1.0
    """global grad-norm clip"""
    mini_batch_size: int = 256
    """trajectories per optimizer step (paper: 256, so 512 x 5 trajectories give 10 updates per rollout step)"""
    micro_batch_size: int = 8
    """trajectories per forward/backward (gradient accumulation; does not change the gradient, P14)"""
    grad_ckpt: bool = False
    """recompute each decoder layer's activations in backward (gradient checkpointing: less memory, ~1.3x compute)"""
    max_bad_steps: int = 5
    """stop after this many consecutive optimizer steps skipped for a non-finite loss or grad norm"""
    policy_loss: str = "ppo-clip"
    """ppo-clip (per-token ratio; the code's default) | gspo (per-response ratio; the code's USE_GSPO=true)"""
    clip_eps_high: float = None  # None (unset) becomes --clip-eps in parse_args
    """ratio clip [1 - clip_eps, 1 + clip_eps_high] for both losses (DAPO clip-higher: 0.28); unset = --clip-eps"""
    # --- fsdp
    fsdp: bool = False
    """shard policy and reference with FSDP2 over the torchrun ranks (bf16 compute, fp32 grads/reduction on GPU)"""
    clip_eps: float = 0.2
    """PPO ratio clip epsilon"""
    kl_coef: float = 0.001
    """coefficient of the KL to the frozen initial model (0 drops the reference model)"""
    ref_dtype: str = "bfloat16"
    """reference model weights: bfloat16 (as veRL's ref worker computes; half the memory, ~2x faster on CPUs with bf16
    units; log-prob error ~1e-2 nats, only in the KL term) | float32"""
    ref_offload: bool = False
    """keep the reference on disk (OUT_DIR/.ref, written once in --ref-dtype, removed at the end): load it for each
    step's reference pass, free it before the update (a 0.6B model: -1.2 GB at the memory peak, +~2 s per step)"""
    kl_type: str = "k3"
    """k1 | k2 | k3 (low_var_kl, the code's)"""
    entropy_coef: float = 0.001
    """entropy bonus (in the code, not in the paper)"""
    loss_agg: str = "token-mean"
    """token-mean (code) | seq-mean-token-mean (paper Eq. 1) | seq-mean-token-sum-norm (Dr. GRPO)"""
    # --- llds
    llds: float = 0.2
    """lambda, the LLDS weight (paper: 0.2; 0.3 for 7B-Instruct); 0 turns the term off (its metrics are still logged)"""
    llds_gate: str = "action"
    """action (LLDS-A, default) | response (v1) | token (no gate)"""
    llds_norm: str = "code"
    """code (mean over all unmasked tokens; published numbers) | paper (action: Eq. 4 per response; else Eqs. 9/10)"""
    llds_ma: str = "off"
    """LLDS-MA answer coeff.: off | code min(w*max(V-1,0),lambda) | fixed min(w,lambda) | paper lambda*min(V/2,1)"""
    llds_ma_weight: float = 0.2
    """w, the official MASK_WEIGHT: the answer span's coefficient for --llds-ma code and fixed (capped at --llds)"""
    # --- logging
    out_dir: str = "runs/default"
    """metrics.jsonl, rollouts_step*.jsonl and checkpoint/ go here"""
    log_rollouts_every: int = 10
    """write a few full trajectories every N steps (and at step 1)"""
    num_log_rollouts: int = 4
    """trajectories per rollouts file"""
    save_every: int = 10
    """save a checkpoint every N steps (also at the last step, and at the end of the step in progress on Ctrl-C or
    SIGTERM)"""
    keep_checkpoints: int = 1
    """complete checkpoints to keep (the newest; an older one is deleted only once a newer one is complete)"""
    alarm_k: int = 3
    """LLD alarm: warn when the correct responses' likelihood change is <= 0 for this many steps (llds.lld_alarm)"""
    resume: str = ""
    """run dir to continue exactly from its newest complete checkpoint (weights, optimizer, scheduler, RNG, data order,
    step), or one checkpoints/step_N folder"""
    overwrite: bool = False
    """start afresh in an --out-dir that holds a run: delete its metrics, rollouts and checkpoints first"""


_at_least = lambda n: (lambda v: v >= n, f">= {n}")  # noqa: E731
RANGES = {  # Args field -> (valid?, the valid range in words)
    "seed": _at_least(0), "prompts_per_step": _at_least(1), "group_size": _at_least(1), "max_turns": _at_least(0),
    "max_new_tokens": _at_least(1), "max_obs_tokens": _at_least(1), "topk": _at_least(1),
    "gen_batch_size": _at_least(1), "steps": _at_least(1), "mini_batch_size": _at_least(1),
    "micro_batch_size": _at_least(1), "max_bad_steps": _at_least(1), "log_rollouts_every": _at_least(1),
    "num_log_rollouts": _at_least(0), "save_every": _at_least(1), "keep_checkpoints": _at_least(1),
    "alarm_k": _at_least(1), "weight_decay": _at_least(0), "kl_coef": _at_least(0), "entropy_coef": _at_least(0),
    "llds": _at_least(0), "llds_ma_weight": _at_least(0),
    "temperature": (lambda v: v > 0, "> 0"), "lr": (lambda v: v > 0, "> 0"), "grad_clip": (lambda v: v > 0, "> 0"),
    "retriever_timeout": (lambda v: v > 0, "> 0 seconds"), "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "clip_eps": (lambda v: 0 < v < 1, "in (0, 1)"), "warmup_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "clip_eps_high": (lambda v: v > 0, "> 0"),
}


def parse_args(argv=None) -> Args:
    """argparse over the dataclass fields: --field-name VALUE for each, help from the field docstring."""
    import argparse
    import inspect

    src = inspect.getsource(Args)
    docs = {}
    lines = src.splitlines()
    for i, line in enumerate(lines[:-1]):
        if ":" in line and "=" in line and lines[i + 1].strip().startswith('"""'):
            j = i + 1  # the docstring may run over several lines: up to the one that closes it
            while not (lines[j].strip().endswith('"""') and (j > i + 1 or lines[j].strip().count('"""') == 2)):
                j += 1
            docs[line.split(":")[0].strip()] = " ".join(x.strip() for x in lines[i + 1:j + 1]).strip('"')
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Args):
        kw = {"action": argparse.BooleanOptionalAction} if f.type is bool else \
            {"type": f.type if f.type in (int, float) else str}
        ap.add_argument("--" + f.name.replace("_", "-"), **kw, default=f.default,
                        help=f"{docs.get(f.name, '')} (default: {f.default})")
    args = Args(**vars(ap.parse_args(argv)))
    if args.clip_eps_high is None:  # (computed at runtime) the code's symmetric clip unless asked otherwise
        args.clip_eps_high = args.clip_eps
    choices = {"llds_gate": ("action", "response", "token"), "llds_norm": ("code", "paper"),
               "llds_ma": ("off", *MA_SCHEDULES), "ref_dtype": ("bfloat16", "float32"),
               "bm25": BM25_VARIANTS, "amp": ("auto", "bf16", "off"), "dtype": ("auto", "float32", "bfloat16"),
               "kl_type": ("k1", "k2", "k3", "low_var_kl"), "policy_loss": tuple(POLICY_LOSSES),
               "loss_agg": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")}
    for name, ok in choices.items():
        if getattr(args, name) not in ok:
            ap.error(f"--{name.replace('_', '-')} must be one of {ok}, got {getattr(args, name)!r}")
    for name, (ok, valid) in RANGES.items():  # every number is checked here, not at step 1 deep inside a library
        value = getattr(args, name)
        if (isinstance(value, float) and not math.isfinite(value)) or not ok(value):
            ap.error(f"--{name.replace('_', '-')} must be {valid}, got {value}")
    if args.device not in ("auto", "cpu") and not args.device.startswith("cuda"):
        ap.error(f"--device must be cpu, cuda, cuda:N or auto, got {args.device!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this torch sees no CUDA device (torch.cuda.is_available() is False); "
                 "use --device cpu, or install a CUDA build of torch")
    return args




# ----------------------------------------------------------------------------------------------------------------------
# Gradient checkpointing


def enable_grad_ckpt(model):
    """Checkpoint each decoder layer with torch's non-reentrant checkpoint, whenever gradients are on.

    NOTE(departure): not model.gradient_checkpointing_enable(): HF checkpoints only in train mode, and the policy
    stays in eval mode (P18), where that call silently does nothing.
    """
    for layer in model.model.layers:
        def forward(*a, _f=layer.forward, **kw):
            return activation_checkpoint(_f, *a, use_reentrant=False, **kw) if torch.is_grad_enabled() else _f(*a, **kw)
        layer.forward = forward


# ----------------------------------------------------------------------------------------------------------------------
# FSDP2 (one code path: without torchrun the world is one rank and every helper below is the identity)


def setup_dist(fsdp: bool, device: str) -> tuple[int, int, str]:
    """(rank, world_size, device) from torchrun's RANK / WORLD_SIZE / LOCAL_RANK (nanoGPT); (0, 1, device) without.

    --fsdp starts a process group: nccl on GPU (device cuda:LOCAL_RANK), gloo on CPU. Raises SystemExit when
    torchrun starts several ranks without --fsdp (they would train unsynchronised copies).
    """
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not fsdp:
        raise SystemExit("error: torchrun started several ranks; add --fsdp")
    if fsdp:
        cuda = device != "cpu" and torch.cuda.is_available()
        if cuda:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
            torch.cuda.set_device(device)
        import atexit

        # Before the group exists: fsdp imports torch.distributed.nn.functional, whose 10 functions have the default
        # argument group=group.WORLD, evaluated at import; imported after, they would hold the group to the end.
        import torch.distributed.fsdp as _fsdp  # noqa: F401  (as: `import torch...` here would make torch a local)

        dist.init_process_group("nccl" if cuda else "gloo")
        atexit.register(_release_process_group)
    return rank, world, device


_MESHES = []  # the device meshes shard() made; each holds the process group (DeviceMesh._pg_registry)


def _release_process_group():
    """At exit (atexit, registered by setup_dist; before interpreter finalisation starts), after the program's
    destroy_process_group(): drop the group's last references, so that it is really destroyed and its threads joined.

    destroy_process_group() does not stop a group that something still references, and FSDP2's meshes do (DTensor's
    sharding caches keep them): gloo's worker threads (pt_gloo_runloop) then live on into finalisation. Such a thread
    releases a finished collective's tensors after the rank went on, which takes the GIL; once finalisation has begun,
    Python ends the thread there, inside a noexcept destructor: std::terminate ("terminate called without an active
    exception"), SIGABRT. Destroying the group joins them first (without holding the GIL). While the group is still
    initialised (the program ended by an exception) nothing is done: that path is as it was."""
    if dist.is_initialized():
        return
    import gc

    for mesh in _MESHES:
        getattr(mesh, "_pg_registry", {}).clear()  # (a mesh without one holds no group)
    _MESHES.clear()
    gc.collect()  # the sharded modules the program dropped are cycles, and their FSDP state holds the group too


def shard(model):
    """FSDP2: fully_shard each decoder layer, then the root (pytorch/examples FSDP2). On GPU parameters stay fp32
    shards and compute in bf16 with fp32 gradient reduction. Gradients are *summed* over ranks (divide factor 1):
    our losses are already normalised by the global token count, so averaging would divide by the world size twice."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    on_gpu = next(model.parameters()).is_cuda
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if on_gpu else MixedPrecisionPolicy()
    mesh = init_device_mesh("cuda" if on_gpu else "cpu", (dist.get_world_size(),))  # FSDP2's default; released at exit
    _MESHES.append(mesh)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


@contextlib.contextmanager
def full_weights(model):
    """Gather the full weights on every rank for the rollout, reshard after. Ranks generate different numbers of
    tokens, and a sharded forward all-gathers each layer, which would need every rank in lock-step. No-op unsharded."""
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in mods:
        m.unshard()
        m.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for m in mods:
            m.set_reshard_after_forward(True)
            m.reshard()


def all_reduce(values, op: str = "sum") -> list[float]:
    """Sum (or "max") of each value over ranks; the values themselves in a single process."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if dist.is_initialized():
        t = t.to("cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.cpu().tolist()


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """[b, T] on each rank -> [world * b, T'] in rank order (T' = largest T, zero right-padded); x in one process."""
    if not dist.is_initialized():
        return x
    T = int(all_reduce([x.shape[1]], "max")[0])
    x = torch.nn.functional.pad(x.float(), (0, T - x.shape[1]))
    x = x.to("cuda") if dist.get_backend() == "nccl" else x
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return torch.cat(out).cpu()


# ----------------------------------------------------------------------------------------------------------------------
# Batching trajectories and computing log-probs


def collate(episodes, pad_id: int) -> dict:
    """Left-pad prompts to P, right-pad responses to T: input_ids [B, P+T]; masks built by position, never by pad value.

    Returns input_ids, attention_mask, position_ids [B, P+T] and loss_mask, answer_mask [B, T] (float).
    """
    P = max(len(e.prompt_ids) for e in episodes)
    T = max(max(len(e.response_ids) for e in episodes), 1)
    ids, attn, loss_mask, ans = [], [], [], []
    for e in episodes:
        lp, lr = len(e.prompt_ids), len(e.response_ids)
        ids.append([pad_id] * (P - lp) + e.prompt_ids + e.response_ids + [pad_id] * (T - lr))
        # NOTE(departure): masks by position (lengths), never `ids != pad`, which erases EOS when pad == eos (P9)
        attn.append([0] * (P - lp) + [1] * (lp + lr) + [0] * (T - lr))
        loss_mask.append(e.loss_mask + [0] * (T - lr))
        ans.append(e.answer_mask + [0] * (T - lr))
    attention_mask = torch.tensor(attn)  # [B, P+T]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P+T] as generate() numbered left-padded rows
    return {"input_ids": torch.tensor(ids), "attention_mask": attention_mask, "position_ids": position_ids,
            "loss_mask": torch.tensor(loss_mask, dtype=torch.float32), "answer_mask": torch.tensor(ans, dtype=torch.float32)}


def response_logp(model, batch, rows, temperature, vocab_size, with_entropy=False):
    """logp [b, T] (and entropy [b, T]) of the response tokens for batch rows `rows`, under the sampling temperature.

    The columns that are padding in every one of these rows are cut first (a micro-batch of short trajectories does not
    pay for the batch's longest; positions come from position_ids, so nothing moves), and the result is zero-padded back
    to [b, T]. Only the logits of positions that predict response tokens are materialised (logits_to_keep). Logits of
    ids the tokenizer does not have are dropped, as the sampler suppressed them (P16), so old, ref and current
    log-probs are of the sampling policy.
    """
    dev = next(model.parameters()).device
    L, T = batch["input_ids"].shape[1], batch["loss_mask"].shape[1]
    used = batch["attention_mask"][rows].any(0)  # [L] columns that are a real token in some row
    left = int(used[: L - T].int().argmax())  # first prompt column some row uses (prompts are left-padded)
    t = int(used[L - T:].nonzero().max()) + 1 if used[L - T:].any() else 1  # last response column in use, plus one
    cols = slice(left, L - T + t)  # drop all-padding prompt columns on the left, response columns on the right
    cut = lambda k: batch[k][rows, cols].to(dev)  # noqa: E731
    P = L - T - left  # prompt columns kept
    out = model(input_ids=cut("input_ids"), attention_mask=cut("attention_mask"), position_ids=cut("position_ids"),
                logits_to_keep=torch.arange(P - 1, P + t - 1), use_cache=False)
    logits = out.logits[..., :vocab_size]  # [b, t, V] position j predicts response token j
    targets = cut("input_ids")[:, P:]  # [b, t]
    chunks = list(zip(logits.split(64, 1), targets.split(64, 1)))  # no [b, t, V] fp32 log-softmax held whole
    if with_entropy:  # each chunk recomputed in backward; split: one gradient buffer, not one per slice
        parts = [activation_checkpoint(logp_and_entropy_from_logits, lg, tg, temperature, use_reentrant=False)
                 for lg, tg in chunks]
        logp, entropy = torch.cat([lp for lp, _ in parts], 1), torch.cat([h for _, h in parts], 1)
        return F.pad(logp, (0, T - t)), F.pad(entropy, (0, T - t))  # [b, T], [b, T]
    logp = torch.cat([logp_from_logits(lg, tg, temperature) for lg, tg in chunks], 1)  # [b, t]
    return F.pad(logp, (0, T - t)), None


@torch.no_grad()
def batch_logp(model, batch, micro_batch_size, temperature, vocab_size) -> torch.Tensor:
    """No-grad logp [B, T] over the whole rollout batch, in the same micro-batches the update will use."""
    B = batch["input_ids"].shape[0]
    return torch.cat([response_logp(model, batch, slice(i, i + micro_batch_size), temperature, vocab_size)[0].cpu()
                      for i in range(0, B, micro_batch_size)])


def save_checkpoint(model, tokenizer, optimizer, out_dir: Path, step: int, state: dict, keep: int) -> Path | None:
    """Save checkpoint `step` as OUT_DIR/checkpoints/step_N (checkpoint.save: a kill or a full disk at any point leaves
    the previous one complete): the model as save_pretrained writes it (evaluate.py and --model read the folder as it
    is), and trainer_state.pt = `state` + the optimizer state + every rank's RNG state, for an exact --resume.
    Under FSDP every rank joins the gathers (full state dicts) and rank 0 writes. Returns the folder (None on the other
    ranks). Raises OSError when the disk is full or not writable, the earlier checkpoints untouched."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=full)
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
           torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    rngs = [rng] * (dist.get_world_size() if dist.is_initialized() else 1)  # every rank samples its own rollouts
    if dist.is_initialized():
        dist.all_gather_object(rngs, rng)
    state = {**state, "step": step, "optimizer": get_optimizer_state_dict(model, optimizer, options=full), "rng": rngs}
    if dist.is_initialized() and dist.get_rank() != 0:
        return None

    def write(folder: Path):
        model.save_pretrained(folder, state_dict=weights)
        tokenizer.save_pretrained(folder)
        torch.save(state, folder / "trainer_state.pt")

    return checkpoint.save(out_dir, step, write, keep)


def load_trainer_state(ckpt: Path) -> dict:
    """trainer_state.pt of a checkpoint folder (see save_checkpoint). Raises ValueError naming the file if it cannot be
    read (a damaged file that kept its size; checkpoint.verify already caught truncation)."""
    try:
        return torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"{ckpt / 'trainer_state.pt'}: missing (a model folder, not a training checkpoint)")
    except Exception as err:  # what unpickling a damaged file raises: EOFError, UnpicklingError, RuntimeError, ...
        raise ValueError(f"{ckpt / 'trainer_state.pt'}: unreadable ({type(err).__name__}: {err}); resume from an "
                         "earlier checkpoints/step_N folder") from None


def finite(model, logp: torch.Tensor, loss_mask: torch.Tensor) -> bool:
    """True if every weight (this rank's shards) and every response-token log-prob `logp` [B, T] is finite, on every
    rank. An update can leave finite but huge weights whose forward pass overflows: the log-probs catch that."""
    bad = sum(int(not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()) for p in model.parameters())
    bad += int(not torch.isfinite(logp[loss_mask > 0]).all())
    return all_reduce([bad])[0] == 0


def llds_ma_weight(episodes, answer_mask: torch.Tensor, args: Args) -> tuple[torch.Tensor | None, dict]:
    """LLDS-MA (v2 Eq. 5): the per-token weight [B, T] (beta on the final answer span, 1 elsewhere) and its metrics;
    (None, {}) with --llds-ma off. V is the batch mean, over every rank, of Episode.num_valid_searches: the official
    code's count (meta_info valid_search_stats, averaged in dp_actor.py:275-277), in which a <search> of the final
    answer-only turn counts though it is not executed. beta = llds.ma_beta(V, --llds-ma, lambda, --llds-ma-weight)."""
    if args.llds_ma == "off":
        return None, {}
    n, total = all_reduce([len(episodes), sum(e.num_valid_searches for e in episodes)])
    kw = {"lam": args.llds, "mask_weight": args.llds_ma_weight}
    beta = ma_beta(total / n, args.llds_ma, **kw)
    return 1.0 + (beta - 1.0) * answer_mask, {"llds/ma_beta": beta,
                                              "llds/answer_weight": ma_answer_weight(total / n, args.llds_ma, **kw)}


def update(model, optimizer, batch, old_logp, ref_logp, adv, weight, args: Args, vocab_size: int, mini_batch_size: int,
           amp=contextlib.nullcontext()):
    """The optimizer steps of one rollout step: sequential mini-batches, gradient accumulation over micro-batches.

    batch: collate() of this rank's B trajectories; old_logp, ref_logp (or None), weight (LLDS-MA, or None) [B, T];
    adv [B]. mini_batch_size: this rank's share of a mini-batch (args.mini_batch_size / world size); the mini-batch is
    the union of every rank's share, so its token and sequence counts are summed over ranks (P14: the mini-batch's
    count, not the micro-batch's) and the loss is the same as one process computing it all.
    vocab_size: the tokenizer's (logits beyond it are dropped, P16). amp: a context entered around each micro-batch's
    forward and loss (bf16 autocast without its weight cache, which would hold stale weights after an optimizer step
    and a bf16 copy of them at the memory peak); backward and the optimizer step run outside it.
    Returns (metrics per mini-batch, reduced over ranks; pre-clip grad norms; per mini-batch True if the optimizer
    stepped, False if a non-finite loss or grad norm skipped it).
    """
    device = next(model.parameters()).device
    loss_mask = batch["loss_mask"]
    B, per_mini, grad_norms, stepped = loss_mask.shape[0], [], [], []
    for m0 in range(0, B, mini_batch_size):
        mini = slice(m0, min(m0 + mini_batch_size, B))
        num_tokens, num_pre, num_seqs = all_reduce([loss_mask[mini].sum(), ((adv[mini] >= 0) & (loss_mask[mini].sum(-1) > 0)).sum(),
                                                    mini.stop - mini.start])
        num_tokens, num_pre = max(num_tokens, 1.0), max(int(num_pre), 1)
        # LLDS "paper" normalisation of the response / token gates (Eqs. 9, 10): the model tokens of A >= 0 responses
        num_pre_tokens = max(all_reduce([(loss_mask[mini] * (adv[mini] >= 0)[:, None]).sum()])[0], 1.0)
        mb, loss_sum = {}, 0.0  # this mini-batch's metrics and loss (this rank's part)
        for u0 in range(mini.start, mini.stop, args.micro_batch_size):
            rows = slice(u0, min(u0 + args.micro_batch_size, mini.stop))
            dev = lambda x: None if x is None else x[rows].to(device)  # noqa: E731
            with amp:
                logp, entropy = response_logp(model, batch, rows, args.temperature, vocab_size, with_entropy=True)
                pg, m_pg = grpo_loss(logp, dev(old_logp), dev(ref_logp), dev(adv), dev(loss_mask), entropy=entropy,
                                     policy_loss=args.policy_loss, clip_eps=args.clip_eps,
                                     clip_eps_high=args.clip_eps_high, kl_coef=args.kl_coef, kl_type=args.kl_type,
                                     entropy_coef=args.entropy_coef, agg=args.loss_agg, num_tokens=num_tokens,
                                     num_seqs=int(num_seqs))
                reg, m_llds = llds_loss(logp, dev(old_logp), dev(adv), dev(loss_mask), gate=args.llds_gate,
                                        norm=args.llds_norm, weight=dev(weight), num_tokens=num_tokens, num_pre=num_pre,
                                        num_pre_tokens=num_pre_tokens)
                loss = pg + args.llds * reg  # Eq. 6
            loss.backward()
            loss_sum += loss.item()
            share = loss_mask[rows].sum().item() / num_tokens  # this micro-batch's share of the mini-batch tokens
            for k, v in {**m_pg, **m_llds}.items():  # loss terms are already partial sums; means get weighted
                mb[k] = max(mb.get(k, v), v) if k.endswith("_max") else \
                    mb.get(k, 0.0) + (v if k in LOSS_TERMS else v * share)
        keys = sorted(mb)  # the same keys on every rank: sum the partial sums, max the maxima
        sums, maxes = all_reduce([mb[k] for k in keys]), all_reduce([mb[k] for k in keys], "max")
        per_mini.append({k: mx if k.endswith("_max") else sm for k, sm, mx in zip(keys, sums, maxes)})
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


def print0(*a):
    """Print on rank 0 only (through tqdm, so the progress bar stays intact)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        tqdm.write(" ".join(str(x) for x in a))


@contextlib.contextmanager
def io_errors_stop_the_run(out_dir: Path):
    """An OSError during the run (disk full or read-only, a retrieval server that stopped answering) ends it with one
    line saying what failed and where --resume continues from, not a traceback. Nothing already saved is touched."""
    try:
        yield
    except OSError as err:
        raise SystemExit(f"error: {err}. {checkpoint.resume_note(out_dir)}") from None


@contextlib.contextmanager
def diverged_sampling(step: int):
    """Sampling from a policy whose logits overflowed fails inside torch.multinomial; say what it means instead."""
    try:
        yield
    except RuntimeError as err:
        if "probability tensor contains" not in str(err):
            raise
        raise SystemExit(f"error: step {step}: sampling met NaN/inf probabilities: the policy diverged (lower --lr)") \
            from None


# ----------------------------------------------------------------------------------------------------------------------


def main(args: Args):
    rank, world, device = setup_dist(args.fsdp, args.device)
    random.seed(args.seed + rank), np.random.seed(args.seed + rank), torch.manual_seed(args.seed + rank)
    if args.prompts_per_step % world or args.mini_batch_size % world:
        raise SystemExit(f"error: --prompts-per-step {args.prompts_per_step} and --mini-batch-size "
                         f"{args.mini_batch_size} must be multiples of the {world} ranks")
    out_dir = Path(args.out_dir)
    try:  # bad input: one clear line naming the file/line/field, never a traceback from deep inside a library
        ckpt = checkpoint.resolve(args.resume, warn=print0) if args.resume else None
        state = load_trainer_state(ckpt) if ckpt else None
        clear = checkpoint.check_out_dir(out_dir, args.resume, ckpt, state["step"] if state else 0, args.overwrite)
        rows = load_questions(args.train_data)
        retriever = make_retriever(args.corpus, args.retriever_url, timeout=args.retriever_timeout, bm25=args.bm25)
        if args.prompts_per_step > len(rows):
            raise ValueError(f"--prompts-per-step {args.prompts_per_step} is more than the {len(rows)} questions in "
                             f"{args.train_data}: each step takes that many distinct questions")
        # "auto": fp32 master weights; on GPU the passes run in bf16 (autocast, or FSDP's mixed precision)
        dtype = "float32" if args.dtype == "auto" else args.dtype
        model, tokenizer, device = load_policy(str(ckpt) if ckpt else args.model, dtype, device)
        check_obs_budget(tokenizer, args.max_obs_tokens)
        if rank == 0:
            checkpoint.prepare_out_dir(out_dir, clear, dataclasses.asdict(args))

        ref_path = out_dir / ".ref"  # --ref-offload: the reference, written once in --ref-dtype
        if args.ref_offload and args.kl_coef != 0.0:  # reading it back is a plain memory map; reading --model each
            if rank == 0:  # step would convert from its dtype and map the whole file too (+3.6 GiB for 0.6B)
                shutil.rmtree(ref_path, ignore_errors=True)
                load_policy(args.model, args.ref_dtype, "cpu")[0].save_pretrained(ref_path)
                tokenizer.save_pretrained(ref_path)
            if dist.is_initialized():
                dist.barrier()
            __import__("transformers").utils.logging.disable_progress_bar()  # loaded every step

        def reference():  # the frozen initial policy (--model, also when resuming)
            ref = load_policy(str(ref_path) if args.ref_offload else args.model, args.ref_dtype, device)[0]
            return shard(ref.requires_grad_(False)) if args.fsdp else ref.requires_grad_(False)

        ref_model = reference() if args.kl_coef != 0.0 and not args.ref_offload else None
    except (OSError, ValueError) as err:  # OSError: missing files, an unreachable server or hub, a read-only disk
        raise SystemExit(f"error: {err}") from None
    if state and len(state["rng"]) != world:
        raise SystemExit(f"error: {ckpt} was saved by {len(state['rng'])} ranks; resume with the same number")
    if dist.is_initialized():
        dist.barrier()  # rank 0 has cleared an --overwrite out-dir
    if args.grad_ckpt:
        enable_grad_ckpt(model)
    if args.fsdp:
        model = shard(model)
    vocab_size = len(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=args.weight_decay,
                                  fused=True)  # one in-place kernel per tensor: no temporaries at the memory peak
    warmup = int(args.warmup_ratio * args.steps)  # stepped once per rollout step, from lr 0 (veRL constant+warmup)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, s / warmup) if warmup > 0 else 1.0)
    order = np.random.default_rng(args.seed).permutation(len(rows)).tolist()  # data order: seeded epochs, no repeats
    on_one_gpu = device.startswith("cuda") and args.dtype == "auto" and not args.fsdp
    use_amp = args.amp == "bf16" or (args.amp == "auto" and on_one_gpu)

    def amp(cache: bool = True):  # bf16 autocast, entered afresh for each pass: its cache of bf16 weight copies is only
        # dropped on exit, so one context around an optimizer step would keep computing with the old weights
        return torch.autocast(device.split(":")[0], torch.bfloat16, cache_enabled=cache) if use_amp \
            else contextlib.nullcontext()
    print0(f"{len(rows)} questions | {retriever} | {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
           f"params on {world} x {device} | {args.prompts_per_step}x{args.group_size} trajectories/step, "
           f"{-(-args.prompts_per_step * args.group_size // args.mini_batch_size)} updates/step | out {out_dir}")
    history, start, bad, phase = [], 1, 0, ""  # bad: consecutive skipped optimizer steps
    if state:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
        scheduler.load_state_dict(state["scheduler"])
        rng = state["rng"][rank]
        random.setstate(rng[0]), np.random.set_state(rng[1]), torch.set_rng_state(rng[2])
        if torch.cuda.is_available() and rng[3]:
            torch.cuda.set_rng_state_all(rng[3])
        history, order, bad, start = state["history"], state["order"], state["bad"], state["step"] + 1
        print0(f"resumed {ckpt} at step {state['step']}")
    if start > args.steps:
        print0(f"nothing to do: {ckpt} is at step {start - 1} and --steps is {args.steps}")
    # Ctrl-C / SIGTERM: finish the step, save, stop; a full disk or a dead retrieval server: one line, not a traceback
    with checkpoint.stop_requests(print0, dist.is_initialized()) as stop, io_errors_stop_the_run(out_dir):
        for step in tqdm(range(start, args.steps + 1), desc="steps", dynamic_ncols=True, disable=rank != 0):
            t0 = time.time()
            if len(order) < args.prompts_per_step:
                order += np.random.default_rng(args.seed + step).permutation(len(rows)).tolist()
            batch_rows, order = [rows[i] for i in order[: args.prompts_per_step]], order[args.prompts_per_step:]
            share = args.prompts_per_step // world  # this rank's prompts: whole groups stay on one rank
            batch_rows = batch_rows[rank * share:(rank + 1) * share]

            # --- rollout and reward
            with full_weights(model), amp(), diverged_sampling(step):
                generate = hf_generator(model, tokenizer, max_new_tokens=args.max_new_tokens,
                                        temperature=args.temperature, top_p=args.top_p, batch_size=args.gen_batch_size)
                episodes = rollout(generate, tokenizer, batch_rows, retriever.search, group_size=args.group_size,
                                   max_turns=args.max_turns, max_obs_tokens=args.max_obs_tokens, topk=args.topk)
            t_rollout = time.time() - t0
            rewards = torch.tensor([e.reward for e in episodes])  # [B]
            # NOTE(departure): groups keyed by per-batch prompt id, not Search-R1's uid = dataset index (P4)
            adv = group_advantages(rewards, [e.group_id for e in episodes])  # [B]
            batch = collate(episodes, tokenizer.pad_token_id)
            with amp():
                old_logp = batch_logp(model, batch, args.micro_batch_size, args.temperature, vocab_size)  # [B, T]
                ref = reference() if args.kl_coef != 0.0 and args.ref_offload else ref_model
                ref_logp = batch_logp(ref, batch, args.micro_batch_size, args.temperature, vocab_size) \
                    if ref is not None else None
                del ref  # with --ref-offload its memory is free again before the update
            weight, ma_metrics = llds_ma_weight(episodes, batch["answer_mask"], args)  # LLDS-MA (Eq. 5), or None
            t_update = time.time()

            # --- updates
            per_mini, grad_norms, stepped = update(model, optimizer, batch, old_logp, ref_logp, adv, weight, args,
                                                   vocab_size, args.mini_batch_size // world, amp(cache=False))
            with amp():
                new_logp = batch_logp(model, batch, args.micro_batch_size, args.temperature, vocab_size)  # after
            healthy = finite(model, new_logp, batch["loss_mask"])
            for ok in stepped:  # consecutive skipped optimizer steps, across rollout steps
                bad = 0 if ok else bad + 1
            lr = optimizer.param_groups[0]["lr"]  # the lr this step used
            scheduler.step()

            # --- log: every rank's trajectories, gathered
            loss_mask = gather_rows(batch["loss_mask"])
            stats = gather_rows(torch.tensor([[e.reward, e.num_searches, e.num_turns, e.num_valid_actions,
                                               e.num_valid_searches] for e in episodes]))
            rewards = stats[:, 0]
            metrics = {k: float(np.mean([m[k] for m in per_mini])) for k in per_mini[0]}  # mean over the mini-batches
            metrics.update({
                "step": step,
                "rollout/reward": rewards.mean().item(),
                "rollout/searches_per_traj": stats[:, 1].mean().item(),
                "rollout/valid_searches_per_traj": stats[:, 4].mean().item(),  # LLDS-MA's V (final-turn <search> too)
                "rollout/valid_action_ratio": stats[:, 3].sum().item() / max(stats[:, 2].sum().item(), 1),
                "rollout/response_tokens": loss_mask.sum(-1).mean().item(),
                "rollout/frac_zero_std_groups": float(np.mean([len(set(g.tolist())) == 1
                                                               for g in rewards.split(args.group_size)])),
                "grpo/grad_norm": float(np.mean(grad_norms)),
                "grpo/skipped_steps": stepped.count(False),
                "grpo/lr": lr,
            })
            old_all, new_all = gather_rows(old_logp), gather_rows(new_logp)
            metrics.update(likelihood_diagnostics(old_all, new_all, loss_mask, rewards))
            metrics.update(official_metrics(old_all, new_all, gather_rows(adv[:, None])[:, 0], loss_mask,
                                            gather_rows(batch["answer_mask"]),
                                            gather_rows(ref_logp) if ref_logp is not None else None))
            metrics.update(ma_metrics)
            history.append(metrics)
            new_phase = lld_alarm([m.get("diag/delta_correct") for m in history],
                                  [m["grpo/grad_norm"] for m in history], k=args.alarm_k)
            metrics["alarm/phase"] = new_phase
            if new_phase and new_phase != phase:
                print0(f"LLD alarm at step {step}: {new_phase} (the likelihood of correct responses fell or stalled "
                       f"for {args.alarm_k} steps; reward lags it, v2 Sec. 5.1)")
            phase = new_phase
            metrics.update({"perf/rollout_s": t_rollout, "perf/logp_s": t_update - t0 - t_rollout,
                            "perf/update_s": time.time() - t_update, "perf/step_s": time.time() - t0})
            if rank == 0:
                atomic_write(out_dir / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in history))
            print0(f"step {step} | reward {metrics['rollout/reward']:.3f} | pg {metrics['grpo/pg_loss']:.4f} | "
                   f"kl {metrics.get('grpo/kl', 0.0):.5f} | llds {metrics['llds/penalty']:.5f} | "
                   f"gate {metrics['llds/gate_rate']:.2f} | clip {metrics['grpo/clip_frac']:.3f} | "
                   f"gnorm {metrics['grpo/grad_norm']:.3f} | search/ep {metrics['rollout/searches_per_traj']:.2f} | "
                   f"{metrics['perf/step_s']:.0f}s")
            if rank == 0 and (step == 1 or step % args.log_rollouts_every == 0):
                recs = [{"question": e.question, "golden_answers": e.golden_answers, "answer": e.answer,
                         "reward": e.reward, "adv": adv[i].item(), "searches": e.num_searches, "text": e.text}
                        for i, e in enumerate(episodes[: args.num_log_rollouts])]
                atomic_write(out_dir / f"rollouts_step{step}.jsonl", "".join(json.dumps(r) + "\n" for r in recs))
            if bad >= args.max_bad_steps:
                raise SystemExit(f"error: {bad} consecutive optimizer steps had a non-finite loss or grad norm and "
                                 f"were skipped (step {step}): the policy collapsed or diverged, see "
                                 f"{out_dir}/metrics.jsonl")
            if not healthy:  # never a checkpoint of a diverged policy; the sampling of the next step would crash
                raise SystemExit(f"error: step {step}: the update left non-finite weights or log-probs (the policy "
                                 f"diverged; --lr {args.lr:g}?); not saved. {checkpoint.resume_note(out_dir)}")
            stopping = all_reduce([len(stop)], "max")[0] > 0  # every rank saves and stops together
            if step % args.save_every == 0 or step == args.steps or stopping:
                saved = save_checkpoint(model, tokenizer, optimizer, out_dir, step, {
                    "scheduler": scheduler.state_dict(), "order": order, "bad": bad, "history": history},
                    args.keep_checkpoints)
                if saved:
                    print0(f"saved {saved}")
            if stopping:
                print0(f"stopped after step {step}; continue with the same command and --resume {out_dir}")
                raise SystemExit(128 + (stop[0] if stop else signal.SIGTERM))
    if rank == 0:
        shutil.rmtree(ref_path, ignore_errors=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    args = parse_args()
    try:
        main(args)
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once, without saving the step in progress
        raise SystemExit(f"interrupted. {checkpoint.resume_note(Path(args.out_dir))}") from None
