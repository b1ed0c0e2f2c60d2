"""How many rollout rows and update micro-batches fit in the accelerator's memory: the memory plan.

train.py calls memory_plan once, before step 1, with the policy (only its config, parameter count
and dtype are read: a model built on the meta device will do) and the bytes this process can use
(free_memory), and prints the plan. The plan adds up what a rank holds whatever the batch
(static_memory: the weights, their gradients, AdamW's moments, the reference, the rollout's weight
copy), then sizes the two peaks that grow with the batch, every row at the longest context a turn
can reach (context_tokens):
  - the rollout: rows per generate call (gen_batch_size_auto, --gen-batch-size auto), each row its
    KV cache and the prefill's transients (kv_bytes_per_token, row_bytes);
  - the update: the micro-batch size and gradient checkpointing (update_plan, where
    --micro-batch-size and --grad-ckpt are unset), from what a decoder layer saves for backward
    (layer_activation_bytes, measured) and the logits (update_activation_bytes).
A run that cannot fit stops before step 1 with one line (ValueError) that gives the figures and
names the flags to change. The arithmetic, with Qwen2.5-3B's numbers:
results/scaling/memory_plan.md; gpu/memory_plan.py prints the plan for the paper's three models and
checks the update's estimate against measured peaks.

    python -m machinery.memory   # the plan for Qwen2.5-3B's shapes (meta device) on an 80 GB card
"""

import os
from pathlib import Path

import torch

GiB = 2**30
# default prompt budget: the Search-R1 instruction (~170 tokens) and a question (train.py: its own)
PROMPT_TOKENS = 256


def free_memory(device: str) -> int:
    """Bytes this process can use on `device`: what is free now plus what it holds already (the plan
    counts the policy and reference itself, so the figure is the same before and after they are
    loaded). CUDA: torch.cuda.mem_get_info's free + the caching allocator's reserved bytes; CPU:
    available physical pages + this process's resident set (/proc/self/statm), no psutil."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
    page = os.sysconf("SC_PAGE_SIZE")
    return (
        os.sysconf("SC_AVPHYS_PAGES") * page
        + int(Path("/proc/self/statm").read_text().split()[1]) * page
    )


def kv_bytes_per_token(config, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token of context holds during generate: layers x KV heads x head dim x
    2 (K and V) x dtype_bytes (2 in bf16). head_dim is config.head_dim when the config sets it, else
    hidden_size // num_attention_heads. Qwen2.5-3B in bf16: 36 x 2 x 128 x 2 x 2 = 36,864 bytes per
    token."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return config.num_hidden_layers * kv_heads * head_dim * 2 * dtype_bytes


def context_tokens(max_turns: int, max_new_tokens: int, max_obs_tokens: int,
                   prompt_tokens: int = PROMPT_TOKENS) -> int:
    """The longest context a generate call caches: the last (answer-only) turn, after max_turns
    search turns of max_new_tokens generated and max_obs_tokens retrieved each, generating its own
    max_new_tokens: prompt_tokens + max_turns x (max_new_tokens + max_obs_tokens) + max_new_tokens.
    3 turns of 500 + 500: 3756."""
    return prompt_tokens + max_turns * (max_new_tokens + max_obs_tokens) + max_new_tokens


def row_bytes(config, context: int, dtype_bytes: int = 2) -> int:
    """Peak bytes one generate row adds at `context` tokens: its KV cache (kv_bytes_per_token x
    context), the prefill's largest transient, one layer's MLP (act(gate), up and their product: 3
    [context, intermediate_size] tensors in the compute dtype), and its row of the boolean [context,
    context] attention mask that sdpa gets for left-padded rows: context x (kv_bytes_per_token + 3 x
    intermediate_size x dtype_bytes + context). Qwen2.5-3B in bf16 at 3756 tokens: 3756 x (36,864 +
    66,048 + 3756) = 400,645,008 bytes, 2.9x its KV cache alone."""
    return context * (
        kv_bytes_per_token(config, dtype_bytes)
        + 3 * config.intermediate_size * dtype_bytes
        + context
    )


def static_memory(n_params: int, *, weights_bytes: int = 4, ref_bytes: int = 2,
                  rollout_bytes: int = 0,
                  world: int = 1) -> dict:
    """GiB per rank the run holds apart from the KV cache, by part: the policy's weights
    (weights_bytes per parameter: 4 in fp32, train.py's default), its gradients (the same dtype),
    AdamW's m and v (2 x weights_bytes: torch keeps them in the parameters' dtype), the frozen
    reference (ref_bytes: 2 in bf16, 0 with --kl-coef 0 or --ref-offload, which loads it for its own
    pass only), and during the rollout a copy of the weights in the compute dtype (rollout_bytes: 2
    for bf16 autocast's cache of cast weights, or FSDP's gathered bf16 weights; 0 when the weights
    are used as they are). FSDP (world ranks) shards all but the gathered copy."""
    parts = {"policy": weights_bytes / world, "gradients": weights_bytes / world,
             "AdamW m, v": 2 * weights_bytes / world, "reference": ref_bytes / world,
             "rollout weights": rollout_bytes}
    return {k: n_params * b / GiB for k, b in parts.items()}


def gen_batch_size_auto(free_bytes: float, row: int, reserve_frac: float = 0.1,
                        cap: int | None = None) -> int:
    """Rows per generate call (>= 1, at most `cap`, the rows a turn has) that fit in (1 -
    reserve_frac) of free_bytes (the bytes left after the static memory; the reserve covers the
    logits, sampling and fragmentation), a row taking `row` bytes (row_bytes): floor((1 -
    reserve_frac) x free_bytes / row). Raises ValueError, one line naming the flags to change, when
    not even one row fits."""
    rows = int((1 - reserve_frac) * free_bytes // row)
    if rows < 1:
        left = f"{free_bytes / GiB:.2f} GiB is left" if free_bytes > 0 else \
            f"the static memory alone is {-free_bytes / GiB:.1f} GiB more than the usable memory"
        raise ValueError(f"--gen-batch-size auto: one generate row needs {row / GiB:.2f} GiB (KV "
                         f"cache and prefill at "
                         f"the longest context) but {left}; lower --max-new-tokens, --max-turns or "
                         f"--max-obs-tokens, "
                         "shrink the static memory (--fsdp, --ref-offload, --kl-coef 0), or set "
                         "--gen-batch-size N")
    return min(rows, cap) if cap else rows


def layer_activation_bytes(config, bf16_autocast: bool, dtype_bytes: int = 4) -> int:
    """Bytes per token that one decoder layer saves for its backward in the update, measured tensor
    by tensor with torch.autograd.graph.saved_tensors_hooks on transformers 5's Qwen2 under torch
    2.13 (gpu/memory_plan.py prints the check). With h = hidden_size, i = intermediate_size, n =
    num_attention_heads: bf16 autocast over fp32 weights (the one-GPU path): 36h + 8i + 4n + 8 = two
    RMSNorms x (fp32 input and output 8h + rsqrt 4), the bf16 casts of the normed input for q, k, v
    and for gate, up (5 x 2h), sdpa's q, k, v (k, v repeated to all n heads) and output (4 x 2h)
    with its fp32 logsumexp (4n), o_proj's input (2h), gate, up, silu(gate) and their product (4 x
    2i); the layer's bf16 weight copies come on top (update_activation_bytes). No autocast, weights
    and compute in dtype_bytes: (44h + 16i) x dtype_bytes / 4 + 4n + 8: the fp32 pattern (measured:
    no casts, 4-byte tensors, 8h more of rotary temporaries), scaled to the dtype (FSDP's bf16
    compute: an assumption, not measured). Qwen2.5-3B under autocast: 36 x 2048 + 8 x 11008 + 4 x 16
    + 8 = 161,864 bytes per token per layer."""
    h, i, n = config.hidden_size, config.intermediate_size, config.num_attention_heads
    if bf16_autocast:
        return 36 * h + 8 * i + 4 * n + 8
    return (44 * h + 16 * i) * dtype_bytes // 4 + 4 * n + 8


def update_activation_bytes(model, micro: int, tokens: int, response_tokens: int, *,
                            grad_ckpt: bool,
                            bf16_autocast: bool, compute_bytes: int = 4, split: bool = False):
    """Peak bytes one update micro-batch adds to the static memory (train.update: forward, loss,
    backward), for `micro` rows padded to `tokens` (prompt + response) of which `response_tokens`
    get logits. bf16_autocast: bf16 autocast over fp32 weights (one GPU), else compute_bytes per
    element (2: FSDP's bf16; 4: fp32). With L layers, a = layer_activation_bytes, w = one layer's
    parameters, c = compute bytes (2 under autocast), n = micro x tokens, the bytes saved for
    backward are
    - layers: no --grad-ckpt: n x L x a, plus under autocast the bf16 copies of every layer's
      weights that each Linear saves (2 x L x w); --grad-ckpt: each layer keeps its fp32 input (n x
      L x 4h) and one layer at a time is recomputed in backward (n x a, + 2w);
    - logits: response_logp keeps the [micro, response_tokens, V] logits (c bytes each) for its
      chunked log-softmax (not a whole fp32 [micro, T, V]: 64 positions at a time, recomputed in
      backward), and under autocast the head's bf16 weight copy (2Vh);
    - the shared attention inputs: sdpa's [micro, 1, tokens, tokens] mask (c bytes), rotary cos, sin
      (8 x head_dim per token).
    On top of them, the larger of two backward moments (from the measured peaks, gpu/memory_plan.py
    --measure): the logits' gradient twice (the 64-position chunks' gradients and their
    concatenation), or, once the logits are freed, the head's weight gradient in c bytes and its
    fp32 copy under autocast ((c + 4) x V x h; the .grad it is added to is in the static memory).
    Qwen2.5-3B, 4 rows of 3756 tokens (3500 of them response), --grad-ckpt, autocast: 20.5 GB, of
    which the logits and their gradient 12.8 GB. An estimate of the worst case (every row at the
    longest context); real micro-batches are cut to their longest row (response_logp). Returns the
    bytes (int), or with split=True (saved for backward, the backward moment on top)."""
    cfg, L = model.config, model.config.num_hidden_layers
    h, V = cfg.hidden_size, model.get_output_embeddings().weight.shape[0]
    head_dim = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    c = 2 if bf16_autocast else compute_bytes
    a, w = layer_activation_bytes(cfg, bf16_autocast,
                                  c), sum(p.numel() for p in model.model.layers[0].parameters())
    copies = 2 * w if bf16_autocast else 0  # bytes of one layer's bf16 weight copies
    n = micro * tokens
    layers = n * (L * 4 * h + a) + copies if grad_ckpt else n * L * a + L * copies
    logits = micro * response_tokens * V * c
    saved = (
        layers
        + logits
        + (2 * V * h if bf16_autocast else 0)
        + micro * tokens * tokens * c
        + 8 * head_dim * n
    )
    moment = max(2 * logits, (c + (4 if bf16_autocast else 0)) * V * h - logits)
    return (saved, moment) if split else saved + moment


def update_plan(model, left_bytes: float, micro_batch_size: int | None, grad_ckpt: bool | None, *,
                tokens: int, response_tokens: int, bf16_autocast: bool, compute_bytes: int = 4,
                reserve_frac: float = 0.1, throughput_rows: int = 0) -> tuple[int, bool, int]:
    """(micro-batch size, gradient checkpointing, its bytes: update_activation_bytes) for the
    update, with left_bytes free beside the update's static memory. A flag the user set
    (micro_batch_size a count, grad_ckpt True or False) is kept; an unset one (None) is chosen, by
    the first that fits in (1 - reserve_frac) x left_bytes of: without gradient checkpointing
    micro-batches of 8, 4, 2, 1, then with it the same. Smaller micro-batches do not change the
    gradient (P14) and cost little at thousands of tokens per row, checkpointing ~1/3 more update
    compute: so fewer rows first. throughput_rows > 0 (a GPU, where a matmul's efficiency grows
    with its rows: the update ran at 7.5% MFU in micro-batches of 2 rows, 28.8% in 8,
    results/scaling/gpu_check.md): the micro-batch is as large as fits, in powers of two up to
    throughput_rows (a rank's mini-batch), and gradient checkpointing is taken when without it
    fewer than 8 rows fit and with it at least twice as many. Raises ValueError, one line with the
    figures and the flags to change, when none fits."""
    if throughput_rows and not micro_batch_size:
        micros = [2**k for k in range(throughput_rows.bit_length() - 1, -1, -1)]
    else:
        micros = [micro_batch_size] if micro_batch_size else [8, 4, 2, 1]
    ckpts = [grad_ckpt] if grad_ckpt is not None else [False, True]
    tried = [(m, ck, update_activation_bytes(model, m, tokens, response_tokens, grad_ckpt=ck,
                                             bf16_autocast=bf16_autocast,
                                             compute_bytes=compute_bytes))
             for ck in ckpts for m in micros]
    fits = [t for t in tried if t[2] <= (1 - reserve_frac) * left_bytes]
    if fits and throughput_rows:
        off = next((t for t in fits if not t[1]), None)
        on = next((t for t in fits if t[1]), None)
        return off if off and (off[0] >= 8 or not on or on[0] < 2 * off[0]) else on
    if fits:
        return fits[0]
    m, ck, need = tried[-1]  # the smallest of them

    def size(b):
        return f"{b / GiB:.1f} GiB" if b >= GiB / 10 else f"{b / 2**20:.1f} MiB"

    raise ValueError(
        f"the update does not fit: {m} row(s) per micro-batch x {tokens} tokens"
        f"{' with' if ck else ' without'} --grad-ckpt need {size(need)} of "
        f"activations and "
        f"logits, but {size(max(left_bytes, 0))} is left beside the static memory; "
        f"use "
        f"{'--micro-batch-size 1, ' if m > 1 else ''}{'' if ck else '--grad-ckpt, '}"
        "--ref-offload, --fsdp "
        "or lower --max-new-tokens, --max-turns or --max-obs-tokens"
    )


def memory_plan(model, free_bytes: float, gen_batch_size: str = "auto", *, rows: int,
                turns: tuple[int, int, int],
                bf16: bool, ref=None, world: int = 1,
                update: tuple[int | None, bool | None] = (None, None),
                prompt_tokens: int = PROMPT_TOKENS, throughput_rows: int = 0):
    """(rows per generate call, micro-batch size, gradient checkpointing, the plan as printable
    lines) for `model` (loaded, or built on the meta device: only its config, parameter count and
    dtype are read) on a rank with free_bytes (free_memory). gen_batch_size: "auto"
    (gen_batch_size_auto) or a count, kept as given. rows: the contexts a turn generates for on this
    rank (the cap); turns: (max_turns, max_new_tokens, max_obs_tokens); bf16: the passes compute in
    bf16 (autocast or FSDP on GPU; then the KV cache is bf16 and the rollout holds a bf16 copy of
    fp32 weights); ref: the reference model kept in memory (its dtype is read), or None (no KL term,
    or --ref-offload). update: (--micro-batch-size, --grad-ckpt) as given, None where unset:
    update_plan chooses those, for micro-batches of the longest context (context_tokens; its
    response part gets logits) beside the static memory less the rollout's weight copy.
    prompt_tokens: the longest prompt the run will see (rollout.longest_prompt; default
    PROMPT_TOKENS). throughput_rows: on a GPU, a rank's mini-batch rows (update_plan sizes the
    micro-batch for throughput); 0 elsewhere. The plan says when the longest context outgrows the
    model's (max_position_embeddings). Raises ValueError (gen_batch_size_auto, update_plan) when no
    choice fits; a --gen-batch-size count that does not fit is reported in the plan, not raised (the
    figure is an estimate)."""
    n_params, weights_bytes = (
        sum(p.numel() for p in model.parameters()),
        next(model.parameters()).element_size(),
    )
    compute_bytes = 2 if bf16 else weights_bytes
    ref_bytes = next(ref.parameters()).element_size() if ref is not None else 0
    static = static_memory(
        n_params,
        weights_bytes=weights_bytes,
        ref_bytes=ref_bytes,
        world=world,
        rollout_bytes=compute_bytes if compute_bytes != weights_bytes or world > 1 else 0,
    )
    context = context_tokens(*turns, prompt_tokens)
    kv, row = kv_bytes_per_token(model.config,
                                 compute_bytes), row_bytes(model.config, context, compute_bytes)
    left = free_bytes - sum(static.values()) * GiB  # bytes for the generate calls
    n = gen_batch_size_auto(left, row,
                            cap=rows) if gen_batch_size == "auto" else int(gen_batch_size)
    need = n * row  # bytes of n rows at the longest context
    fits = "fits" if need <= 0.9 * left else "does NOT fit: " + (
        "lower --gen-batch-size (or auto)" if left > 0 else "the static memory alone is too much "
        "(--fsdp, "
        "--ref-offload, --kl-coef 0)")
    # one GPU: bf16 autocast over fp32 weights
    autocast_on = bf16 and weights_bytes != 2 and world == 1
    # the rollout's weight copy is gone by the update
    left_update = left + static["rollout weights"] * GiB
    micro, ckpt, act = update_plan(model, left_update, *update, tokens=context,
                                   response_tokens=context - prompt_tokens,
                                   bf16_autocast=autocast_on, compute_bytes=compute_bytes,
                                   throughput_rows=throughput_rows)
    most = getattr(model.config, "max_position_embeddings", None) or context
    over = (f"\n  the longest trajectory ({prompt_tokens}-token prompt + turns) can reach "
            f"{context} tokens, past the "
            f"model's context of {most}: lower --max-turns, --max-new-tokens or "
            f"--max-obs-tokens") * (context > most)

    def chosen(given):
        return "as given" if given is not None else "chosen by the plan"

    parts = ", ".join(f"{k} {v:.1f}" for k, v in static.items() if v)
    return n, micro, ckpt, (
        f"memory plan per rank: {n_params / 1e6:,.0f}M params, static {sum(static.values()):.1f} "
        f"GiB ({parts})\n"
        f"  + generate: {n} rows per call x {context} tokens x (KV {kv:,} + prefill "
        f"{row // context - kv:,} "
        f"bytes/token) = {need / GiB:.1f} GiB | {free_bytes / GiB:.1f} GiB usable: {fits}\n"
        f"  + update: --micro-batch-size {micro} ({chosen(update[0])}), --grad-ckpt "
        f"{'on' if ckpt else 'off'} "
        f"({chosen(update[1])}): {micro} x {context} tokens of activations and logits = "
        f"{act / GiB:.1f} GiB | "
        f"{left_update / GiB:.1f} GiB left beside the static memory: fits{over}")


if __name__ == "__main__":
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                         num_key_value_heads=2,
                         # Qwen2.5-3B's shapes
                         intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True)
    with torch.device("meta"):  # shapes and dtypes only: no memory, no weights
        model = AutoModelForCausalLM.from_config(config)  # the fp32 policy
        ref = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)  # the bf16 reference
    context = context_tokens(3, 500, 500)  # the paper's 3 turns of 500 new + 500 retrieved tokens
    print("context", context, "| KV bytes/token", kv_bytes_per_token(config), "| row bytes",
          row_bytes(config, context))
    # context 3756 | KV bytes/token 36864 | row bytes 400645008
    plan = memory_plan(model, 80e9, rows=512 * 5, turns=(3, 500, 500), bf16=True, ref=ref)[-1]
    # static 57.5 GiB; 41 rows per generate call; micro-batches of 4 with --grad-ckpt: 19.1 GiB
    print(plan)
    # on a GPU (train.py passes a rank's mini-batch rows: 256): sized for throughput
    print(memory_plan(model, 140e9, rows=512 * 5, turns=(3, 500, 500), bf16=True, ref=ref,
                      throughput_rows=256)[-1].splitlines()[-1])
    # an H200's 140 GB: micro-batches of 8 with --grad-ckpt, 37.5 GiB (the CPU's rule: 2 without)
