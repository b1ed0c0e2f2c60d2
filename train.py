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
checkpoint/ (save_pretrained + trainer_state.pt, written to a temp folder and renamed). Rerun the same command with
`--resume <out-dir>` to continue exactly where that checkpoint left off. `python train.py --help` lists every option.
"""

import contextlib
import dataclasses
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm

from grpo import group_advantages, grpo_loss, logp_and_entropy_from_logits, logp_from_logits
from llds import likelihood_diagnostics, lld_alarm, llds_loss, ma_beta
from retriever import make_retriever
from rollout import load_questions, rollout


LOSS_TERMS = ("grpo/pg_loss", "grpo/kl", "llds/penalty")  # normalised by the mini-batch: micro-batch values add up


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
    """code (mean over all unmasked tokens; published numbers) | paper (Eq. 4 per-response mean over Y_pre)"""
    llds_ma: str = "off"
    """LLDS-MA answer-span weight schedule: off | code (clip(V-1,0,1)) | paper (min(V/2,1))"""
    # --- logging
    out_dir: str = "runs/default"
    """metrics.jsonl, rollouts_step*.jsonl and checkpoint/ go here"""
    log_rollouts_every: int = 10
    """write a few full trajectories every N steps (and at step 1)"""
    num_log_rollouts: int = 4
    """trajectories per rollouts file"""
    save_every: int = 0
    """also save a checkpoint every N steps (0: only at the end)"""
    alarm_k: int = 3
    """LLD alarm: warn when the correct responses' likelihood change is <= 0 for this many steps (llds.lld_alarm)"""
    resume: str = ""
    """run dir to continue exactly from its checkpoint/ (weights, optimizer, scheduler, RNG, data order, step)"""


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
    choices = {"llds_gate": ("action", "response", "token"), "llds_norm": ("code", "paper"),
               "llds_ma": ("off", "code", "paper"), "ref_dtype": ("bfloat16", "float32"),
               "amp": ("auto", "bf16", "off"),
               "kl_type": ("k1", "k2", "k3", "low_var_kl"),
               "loss_agg": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")}
    for name, ok in choices.items():
        if getattr(args, name) not in ok:
            ap.error(f"--{name.replace('_', '-')} must be one of {ok}, got {getattr(args, name)!r}")
    if args.mini_batch_size < 1 or args.micro_batch_size < 1 or args.prompts_per_step < 1 or args.group_size < 1:
        ap.error("batch sizes and --group-size must be >= 1")
    return args


# ----------------------------------------------------------------------------------------------------------------------
# Model loading (shared with evaluate.py)


def load_policy(name: str, dtype: str = "auto", device: str = "auto"):
    """(model, tokenizer, device) from a hub id, a local folder or a .gguf file (transformers' gguf_file=, de-quantised).

    The model is put in eval mode and stays there: dropout is off in every log-prob pass (P18); gradients still flow.
    Raises SystemExit with a clear message for a local path that does not exist.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    torch_dtype = {"auto": torch.bfloat16 if device.startswith("cuda") else torch.float32,
                   "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    path = Path(name).expanduser()
    looks_local = path.exists() or name.startswith((".", "/", "~")) or name.endswith(".gguf") or name.count("/") > 1
    if looks_local and not path.exists():
        raise SystemExit(f"error: --model {name}: no such folder or file (pass a hub id, a model folder or a .gguf)")
    kw = {}
    if path.is_file() and path.suffix == ".gguf":
        name, kw = str(path.parent), {"gguf_file": path.name}
    elif path.exists():
        name = str(path)
    tokenizer = AutoTokenizer.from_pretrained(name, **kw)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype, **kw)  # GGUF: de-quantised, trainable
    if kw:  # de-quantised weights are plain floats: let save_pretrained write them (it refuses "gguf-quantised")
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer, device


def enable_grad_ckpt(model):
    """Checkpoint each decoder layer with torch's non-reentrant checkpoint, whenever gradients are on.

    NOTE(departure): not model.gradient_checkpointing_enable(): HF checkpoints only in train mode, and the policy
    stays in eval mode (P18), where that call silently does nothing.
    """
    for layer in model.model.layers:
        def forward(*a, _f=layer.forward, **kw):
            return checkpoint(_f, *a, use_reentrant=False, **kw) if torch.is_grad_enabled() else _f(*a, **kw)
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
        parts = [checkpoint(logp_and_entropy_from_logits, lg, tg, temperature, use_reentrant=False)
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


def atomic_write(path: Path, text: str):
    """Write text to path via a temp file + rename, so a crash never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(model, tokenizer, out_dir: Path, name: str = "checkpoint", state: dict | None = None):
    """save_pretrained (and `state`, for --resume, as trainer_state.pt) into <name>.tmp, then swap it in: a kill while
    saving leaves the previous checkpoint intact. evaluate.py reads the folder as a plain model. Under FSDP every rank
    joins the gather of the full state dict and rank 0 writes; `state` must then hold full (gathered) states."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    final, tmp, old = out_dir / name, out_dir / f"{name}.tmp", out_dir / f"{name}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=weights)
    tokenizer.save_pretrained(tmp)
    if state is not None:
        torch.save(state, tmp / "trainer_state.pt")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


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
        mb, loss_sum = {}, 0.0  # this mini-batch's metrics and loss (this rank's part)
        for u0 in range(mini.start, mini.stop, args.micro_batch_size):
            rows = slice(u0, min(u0 + args.micro_batch_size, mini.stop))
            dev = lambda x: None if x is None else x[rows].to(device)  # noqa: E731
            with amp:
                logp, entropy = response_logp(model, batch, rows, args.temperature, vocab_size, with_entropy=True)
                pg, m_pg = grpo_loss(logp, dev(old_logp), dev(ref_logp), dev(adv), dev(loss_mask), entropy=entropy,
                                     clip_eps=args.clip_eps, kl_coef=args.kl_coef, kl_type=args.kl_type,
                                     entropy_coef=args.entropy_coef, agg=args.loss_agg, num_tokens=num_tokens,
                                     num_seqs=int(num_seqs))
                reg, m_llds = llds_loss(logp, dev(old_logp), dev(adv), dev(loss_mask), gate=args.llds_gate,
                                        norm=args.llds_norm, weight=dev(weight), num_tokens=num_tokens, num_pre=num_pre)
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


# ----------------------------------------------------------------------------------------------------------------------


def main(args: Args):
    rank, world, device = setup_dist(args.fsdp, args.device)
    random.seed(args.seed + rank), np.random.seed(args.seed + rank), torch.manual_seed(args.seed + rank)
    if args.prompts_per_step % world or args.mini_batch_size % world:
        raise SystemExit(f"error: --prompts-per-step {args.prompts_per_step} and --mini-batch-size "
                         f"{args.mini_batch_size} must be multiples of the {world} ranks")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        atomic_write(out_dir / "args.json", json.dumps(dataclasses.asdict(args), indent=2))
    try:  # bad input: one clear line naming the file/line/field, never a traceback from deep inside a library
        ckpt = Path(args.resume) / "checkpoint"
        state = torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False) if args.resume else None
        rows = load_questions(args.train_data)
        retriever = make_retriever(args.corpus, args.retriever_url)
        # "auto": fp32 master weights; on GPU the passes run in bf16 (autocast, or FSDP's mixed precision)
        dtype = "float32" if args.dtype == "auto" else args.dtype
        model, tokenizer, device = load_policy(str(ckpt) if state else args.model, dtype, device)

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
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        raise SystemExit(f"error: {err}") from None
    if state and len(state["rng"]) != world:
        raise SystemExit(f"error: {ckpt} was saved by {len(state['rng'])} ranks; resume with the same number")
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
    for step in tqdm(range(start, args.steps + 1), desc="steps", dynamic_ncols=True, disable=rank != 0):
        t0 = time.time()
        if len(order) < args.prompts_per_step:
            order += np.random.default_rng(args.seed + step).permutation(len(rows)).tolist()
        batch_rows, order = [rows[i] for i in order[: args.prompts_per_step]], order[args.prompts_per_step:]
        share = args.prompts_per_step // world  # this rank's prompts: whole groups stay on one rank
        batch_rows = batch_rows[rank * share:(rank + 1) * share]

        # --- rollout and reward
        with full_weights(model), amp():
            episodes = rollout(model, tokenizer, batch_rows, retriever, group_size=args.group_size,
                               max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                               max_obs_tokens=args.max_obs_tokens, topk=args.topk, temperature=args.temperature,
                               top_p=args.top_p, gen_batch_size=args.gen_batch_size)
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
        weight = None
        if args.llds_ma != "off":  # LLDS-MA: beta on the final answer span, 1 elsewhere
            searches = all_reduce([sum(e.num_searches for e in episodes), len(episodes)])
            weight = 1.0 + (ma_beta(searches[0] / searches[1], args.llds_ma) - 1.0) * batch["answer_mask"]
        t_update = time.time()

        # --- updates
        per_mini, grad_norms, stepped = update(model, optimizer, batch, old_logp, ref_logp, adv, weight, args,
                                               vocab_size, args.mini_batch_size // world, amp(cache=False))
        with amp():
            new_logp = batch_logp(model, batch, args.micro_batch_size, args.temperature, vocab_size)  # after
        for ok in stepped:  # consecutive skipped optimizer steps, across rollout steps
            bad = 0 if ok else bad + 1
        lr = optimizer.param_groups[0]["lr"]  # the lr this step used
        scheduler.step()

        # --- log: every rank's trajectories, gathered
        loss_mask = gather_rows(batch["loss_mask"])
        stats = gather_rows(torch.tensor([[e.reward, e.num_searches, e.num_turns, e.num_valid_actions] for e in episodes]))
        rewards = stats[:, 0]
        metrics = {k: float(np.mean([m[k] for m in per_mini])) for k in per_mini[0]}  # mean over the mini-batches
        metrics.update({
            "step": step,
            "rollout/reward": rewards.mean().item(),
            "rollout/searches_per_traj": stats[:, 1].mean().item(),
            "rollout/valid_action_ratio": stats[:, 3].sum().item() / max(stats[:, 2].sum().item(), 1),
            "rollout/response_tokens": loss_mask.sum(-1).mean().item(),
            "rollout/frac_zero_std_groups": float(np.mean([len(set(g.tolist())) == 1
                                                           for g in rewards.split(args.group_size)])),
            "grpo/grad_norm": float(np.mean(grad_norms)),
            "grpo/skipped_steps": stepped.count(False),
            "grpo/lr": lr,
        })
        metrics.update(likelihood_diagnostics(gather_rows(old_logp), gather_rows(new_logp), loss_mask, rewards))
        history.append(metrics)
        new_phase = lld_alarm([m.get("diag/delta_correct") for m in history],
                              [m["grpo/grad_norm"] for m in history], k=args.alarm_k)
        metrics["alarm/phase"] = new_phase
        if new_phase and new_phase != phase:
            print0(f"LLD alarm at step {step}: {new_phase} (the likelihood of correct responses fell or stalled for "
                   f"{args.alarm_k} steps; reward lags it, v2 Sec. 5.1)")
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
            recs = [{"question": e.question, "golden_answers": e.golden_answers, "answer": e.answer, "reward": e.reward,
                     "adv": adv[i].item(), "searches": e.num_searches, "text": e.text}
                    for i, e in enumerate(episodes[: args.num_log_rollouts])]
            atomic_write(out_dir / f"rollouts_step{step}.jsonl", "".join(json.dumps(r) + "\n" for r in recs))
        if bad >= args.max_bad_steps:
            raise SystemExit(f"error: {bad} consecutive optimizer steps had a non-finite loss or grad norm and were "
                             f"skipped (step {step}): the policy collapsed or diverged, see {out_dir}/metrics.jsonl")
        if (args.save_every and step % args.save_every == 0) or step == args.steps:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                   torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
            rngs = [rng] * world  # every rank's RNG: each samples its own rollouts
            if dist.is_initialized():
                dist.all_gather_object(rngs, rng)
            optim = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            save_checkpoint(model, tokenizer, out_dir, state={
                "step": step, "optimizer": optim, "scheduler": scheduler.state_dict(), "rng": rngs,
                "order": order, "bad": bad, "history": history})
    print0(f"saved {out_dir / 'checkpoint'}")
    if rank == 0:
        shutil.rmtree(ref_path, ignore_errors=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_args())
