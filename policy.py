"""The policy pi_theta: log-probs of the response tokens, exactly as they were sampled.

A trajectory's loss (grpo.py, llds.py) needs logp [B, T], the log-probability of each response token under the policy
that is being trained, and the same quantity under the policy that sampled it (old_logp) and under the frozen
reference (ref_logp). They are comparable only if all three are computed as the sampler computed them: the same
temperature on the logits (P17), the same ids the sampler could emit (P16), the same positions for left-padded
prompts, dropout off (P18). This file loads the model (load_policy, load_reference), batches trajectories (collate)
and computes those log-probs: response_logp is the memory-lean version train.py uses (only the response positions'
logits, chunked log-softmax, recomputed in backward), response_logp_plain the obvious one it must agree with
(tests/test_policy.py). The memory plan (memory_plan) is here too, from the model's config: the static memory, the
rows per generate call, the update's micro-batch size and checkpointing (docs/scaling.md#the-memory-plan).

Loading: transformers loads what it is given with little checking: a folder without tokenizer files gives an empty
tokenizer (generation then fails at step 1 with an IndexError), a truncated model.safetensors fails deep in
safetensors' Rust code, and an unreachable hub costs ~50 s of retries and an 80-line traceback. load_policy checks a
local folder before loading it, tries the local hub cache before the network, and raises one line that names the
flag, the file and the fix.

    python policy.py MODEL        # check and load MODEL, print what it is
"""

import contextlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as activation_checkpoint  # recompute in backward

import checkpoint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")  # any one of them holds a vocab


def safetensors_problem(path: Path) -> str | None:
    """None if the .safetensors file is whole, else what is wrong with it. The format is an 8-byte little-endian
    header length n, n bytes of JSON giving each tensor's data_offsets, then the data: the file must be exactly
    8 + n + the largest end offset bytes long."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"truncated: {size} bytes, shorter than a safetensors header"
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return f"truncated: {size} bytes, its header alone needs {8 + n}"
        try:
            meta = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "damaged: its header is not a safetensors header"
    if size != 8 + n + end:
        return f"truncated: {size} bytes, its header describes {8 + n + end}"
    return None


def check_model_folder(folder: Path):
    """Raise ValueError (one line, naming the file) if the local model folder cannot give a working policy:
    config.json missing or not JSON, no weights, a missing shard, a truncated .safetensors file, or no tokenizer
    files (transformers would build an empty tokenizer without a word)."""
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"--model {folder}: no config.json (pass the folder that save_pretrained wrote)")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"--model {folder}: config.json is not valid JSON ({err})") from None
    shards = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"--model {folder}: {index.name} is not a weight index ({err})") from None
        missing = sorted(n for n in names if not (folder / n).is_file())
        if missing:
            raise ValueError(f"--model {folder}: weight shards missing: {', '.join(missing)}")
    if not shards and not list(folder.glob("pytorch_model*.bin")):
        raise ValueError(f"--model {folder}: no weights (model.safetensors or pytorch_model.bin)")
    for shard in shards:
        problem = safetensors_problem(shard)
        if problem:
            raise ValueError(f"--model {folder}: {shard.name} is {problem} (copy or save it again)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"--model {folder}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the base model's "
                         "tokenizer into it (AutoTokenizer.from_pretrained(BASE).save_pretrained(FOLDER))")


def check_hub(name: str):
    """Raise ConnectionError / ValueError (one line) when the hub cannot give `name`: unreachable (offline, DNS,
    proxy, HF_HUB_OFFLINE), or no such (or no accessible) model. One request with a 10 s timeout, not the ~50 s of
    retries transformers spends before its traceback."""
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        huggingface_hub.model_info(name, timeout=10)
    except GatedRepoError:
        raise ValueError(f"--model {name}: a gated model on the Hugging Face hub; accept its licence on the hub and "
                         "log in (`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise ValueError(f"--model {name}: no such model on the Hugging Face hub (or a private one: `hf auth login`); "
                         "a local path must exist") from None
    except Exception as err:  # connection refused, DNS, timeout, offline mode: whatever the HTTP stack raises
        raise ConnectionError(f"--model {name}: not in the local cache and the Hugging Face hub cannot be reached "
                              f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). Where there "
                              f"is internet run `hf download {name} --local-dir DIR`, then pass --model DIR") from None


def load_policy(name: str, dtype: str = "auto", device: str = "auto"):
    """(model, tokenizer, device) from a hub id, a local folder (a model folder, a checkpoint, or a train.py --out-dir:
    its newest complete checkpoint) or a .gguf file (transformers' gguf_file=, de-quantised to plain trainable floats).

    dtype: float32 | bfloat16 | auto (bf16 on CUDA, else fp32). The model is put in eval mode and stays there: dropout
    is off in every log-prob pass, so recomputed log-probs equal the sampling ones (P18); gradients still
    flow. A hub id is read from the local cache first (no network needed once downloaded), else fetched.
    Raises FileNotFoundError for a local path that does not exist, ValueError for a broken folder (check_model_folder),
    a tokenizer with more tokens than the model's embedding rows, or a load that fails, and ConnectionError when the
    hub is needed and cannot be reached; each message is one line that names --model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    torch_dtype = {"auto": torch.bfloat16 if device.startswith("cuda") else torch.float32,
                   "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    path = Path(name).expanduser()
    looks_local = path.exists() or name.startswith((".", "/", "~")) or name.endswith(".gguf") or name.count("/") > 1
    if looks_local and not path.exists():
        raise FileNotFoundError(f"--model {name}: no such folder or file (pass a hub id, a model folder or a .gguf)")
    kw = {}
    if path.is_file() and path.suffix == ".gguf":
        name, kw = str(path.parent), {"gguf_file": path.name}
    elif path.is_dir():
        if not (path / "config.json").exists() and (path / "checkpoints").is_dir():  # a train.py --out-dir
            found = checkpoint.latest(path, warn=lambda _: None)
            if found is None:
                raise ValueError(f"--model {name}: a run folder without a complete checkpoint")
            path = found
        check_model_folder(path)
        name = str(path)
    elif looks_local:
        raise ValueError(f"--model {name}: a file, but not a .gguf one (pass the model folder)")

    def load(**extra):
        tokenizer = AutoTokenizer.from_pretrained(name, **kw, **extra)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype, **kw, **extra)  # GGUF: de-quantised
        return model, tokenizer

    try:
        if looks_local:
            model, tokenizer = load()
        else:  # a hub id: the cache first, so a downloaded model needs no network
            try:
                model, tokenizer = load(local_files_only=True)
            except OSError:  # not (wholly) in the cache
                check_hub(name)
                model, tokenizer = load()
    except (ValueError, ConnectionError):
        raise
    except Exception as err:  # what transformers, safetensors or gguf raise on a file they cannot read
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"--model {name}: cannot load it ({type(err).__name__}: {first})") from None
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(f"--model {name}: the tokenizer has {len(tokenizer)} tokens but the model's embedding only "
                         f"{rows} rows: the tokenizer files belong to another model")
    if kw:  # de-quantised weights are plain floats: let save_pretrained write them (it refuses "gguf-quantised")
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer, device


# ----------------------------------------------------------------------------------------------------------------------
# Log-probs and entropy from logits (used by train.py for the old, ref and current policy alike)


def logp_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log pi(target) under the sampling temperature.

    logits: [B, T, V] (the logits that predict `targets`), targets: [B, T] long -> [B, T] float32, in nats.
    The *logits* are divided by the temperature before log_softmax, exactly as the sampler did (P17);
    dividing log-probs instead gives a ratio != 1 on-policy. Computed in float32 even for bf16 logits.
    """
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]


def logp_and_entropy_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0):
    """(logp [B, T], entropy [B, T]) from one log_softmax, for the update pass that needs both.

    Entropy of the temperature-scaled next-token distribution, H = -sum_v p_v log p_v, in nats. Sharing the
    log_softmax saves a [B, T, V] copy, the memory peak of the update.
    """
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return logp, -(logp_all.exp() * logp_all).sum(-1)  # [B, T], [B, T]


def autocast(amp: str, device: str, dtype: str = "auto", fsdp: bool = False):
    """A function returning a fresh bf16 autocast context for one pass, or a null context (train.py --amp).

    amp: "bf16" (on; also on a CPU with bf16 units, AVX512-BF16 or AMX: ~1.7x faster forward+backward, ~2x generation;
    slower without them) | "auto" (on for one GPU with fp32 weights, dtype "auto"; FSDP has its own mixed precision) |
    "off". Enter it afresh for each pass: autocast's cache of bf16 weight copies is only dropped on exit, so one
    context around an optimizer step would keep computing with the old weights (the update asks for cache=False)."""
    on = amp == "bf16" or (amp == "auto" and device.startswith("cuda") and dtype == "auto" and not fsdp)
    return lambda cache=True: torch.autocast(device.split(":")[0], torch.bfloat16, cache_enabled=cache) if on \
        else contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------------------------------
# Gradient checkpointing


def enable_grad_ckpt(model):
    """Checkpoint each decoder layer with torch's non-reentrant checkpoint, whenever gradients are on.

    NOTE(departure): not model.gradient_checkpointing_enable(): HF checkpoints only in train mode, and the policy
    stays in eval mode (P18), where that call silently does nothing. Returns `model` (changed in place).
    """
    for layer in model.model.layers:
        def forward(*a, _f=layer.forward, **kw):
            return activation_checkpoint(_f, *a, use_reentrant=False, **kw) if torch.is_grad_enabled() else _f(*a, **kw)
        layer.forward = forward
    return model


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


def response_logp_plain(model, batch, rows, temperature, vocab_size) -> torch.Tensor:
    """logp [b, T] as response_logp computes it, the obvious way: the full forward's logits at every position, one
    log-softmax, the response columns picked out. Equal to response_logp on every real response token (padding
    columns hold arbitrary values in either; the losses mask them). For tests and for reading: response_logp is what
    training runs (it materialises only the response positions' logits, in chunks)."""
    dev = next(model.parameters()).device
    b = {k: v[rows].to(dev) for k, v in batch.items()}
    T = b["loss_mask"].shape[1]
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
                   use_cache=False).logits[..., :vocab_size]  # [b, P+T, V]
    return logp_from_logits(logits[:, -T - 1:-1], b["input_ids"][:, -T:], temperature)  # [b, T] position j-1 -> j


@torch.no_grad()
def batch_logp(model, batch, micro_batch_size, temperature, vocab_size) -> torch.Tensor:
    """No-grad logp [B, T] over the whole rollout batch, in the same micro-batches the update will use."""
    B = batch["input_ids"].shape[0]
    return torch.cat([response_logp(model, batch, slice(i, i + micro_batch_size), temperature, vocab_size)[0].cpu()
                      for i in range(0, B, micro_batch_size)])


def load_reference(model_name: str, dtype: str, device: str, offload_dir: Path | None = None):
    """The frozen reference policy pi_ref (the initial --model, also when resuming) for the KL term, no gradients.

    offload_dir: keep it on disk instead (written once in `dtype` by save_reference) and read it back for each step's
    reference pass; the caller drops it before the update, so its memory is free at the update's peak."""
    ref = load_policy(str(offload_dir) if offload_dir else model_name, dtype, device)[0]
    return ref.requires_grad_(False)


def save_reference(model_name: str, dtype: str, tokenizer, offload_dir: Path):
    """Write the reference once to offload_dir in `dtype`: reading it back each step is a plain memory map, while
    reading --model each step would convert it from its dtype and map the whole file too (+3.6 GiB for 0.6B)."""
    import shutil

    shutil.rmtree(offload_dir, ignore_errors=True)
    load_policy(model_name, dtype, "cpu")[0].save_pretrained(offload_dir)
    tokenizer.save_pretrained(offload_dir)


# ----------------------------------------------------------------------------------------------------------------------
# The memory plan: what the run holds before step 1, and how many rows one generate call can take (train.py prints it
# at start-up and sizes --gen-batch-size auto with it; benchmarks/memory_plan.py prints it for the paper's models).

GiB = 2**30
PROMPT_TOKENS = 256  # the plan's prompt budget: the Search-R1 instruction (~170 tokens) and a question


def free_memory(device: str) -> int:
    """Bytes this process can use on `device`: what is free now plus what it holds already (the plan counts the
    policy and reference itself, so the figure is the same before and after they are loaded). CUDA:
    torch.cuda.mem_get_info's free + the caching allocator's reserved bytes; CPU: available physical pages + this
    process's resident set (/proc/self/statm), no psutil."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page + int(Path("/proc/self/statm").read_text().split()[1]) * page


def kv_bytes_per_token(config, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token of context holds during generate: layers x KV heads x head dim x 2 (K and V) x
    dtype_bytes (2 in bf16). head_dim is config.head_dim when the config sets it, else hidden_size //
    num_attention_heads. Qwen2.5-3B in bf16: 36 x 2 x 128 x 2 x 2 = 36,864 bytes per token."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return config.num_hidden_layers * kv_heads * head_dim * 2 * dtype_bytes


def context_tokens(max_turns: int, max_new_tokens: int, max_obs_tokens: int, prompt_tokens: int = PROMPT_TOKENS) -> int:
    """The longest context a generate call caches: the last (answer-only) turn, after max_turns search turns of
    max_new_tokens generated and max_obs_tokens retrieved each, generating its own max_new_tokens:
    prompt_tokens + max_turns x (max_new_tokens + max_obs_tokens) + max_new_tokens. 3 turns of 500 + 500: 3756."""
    return prompt_tokens + max_turns * (max_new_tokens + max_obs_tokens) + max_new_tokens


def row_bytes(config, context: int, dtype_bytes: int = 2) -> int:
    """Peak bytes one generate row adds at `context` tokens: its KV cache (kv_bytes_per_token x context), the
    prefill's largest transient, one layer's MLP (act(gate), up and their product: 3 [context, intermediate_size]
    tensors in the compute dtype), and its row of the boolean [context, context] attention mask that sdpa gets for
    left-padded rows: context x (kv_bytes_per_token + 3 x intermediate_size x dtype_bytes + context). Qwen2.5-3B in
    bf16 at 3756 tokens: 3756 x (36,864 + 66,048 + 3756) = 400,645,008 bytes, 2.9x its KV cache alone."""
    return context * (kv_bytes_per_token(config, dtype_bytes) + 3 * config.intermediate_size * dtype_bytes + context)


def static_memory(n_params: int, *, weights_bytes: int = 4, ref_bytes: int = 2, rollout_bytes: int = 0,
                  world: int = 1) -> dict:
    """GiB per rank the run holds apart from the KV cache, by part: the policy's weights (weights_bytes per parameter:
    4 in fp32, train.py's default), its gradients (the same dtype), AdamW's m and v (2 x weights_bytes: torch keeps
    them in the parameters' dtype), the frozen reference (ref_bytes: 2 in bf16, 0 with --kl-coef 0 or --ref-offload,
    which loads it for its own pass only), and during the rollout a copy of the weights in the compute dtype
    (rollout_bytes: 2 for bf16 autocast's cache of cast weights, or FSDP's gathered bf16 weights; 0 when the
    weights are used as they are). FSDP (world ranks) shards all but the gathered copy."""
    parts = {"policy": weights_bytes / world, "gradients": weights_bytes / world,
             "AdamW m, v": 2 * weights_bytes / world, "reference": ref_bytes / world, "rollout weights": rollout_bytes}
    return {k: n_params * b / GiB for k, b in parts.items()}


def gen_batch_size_auto(free_bytes: float, row: int, reserve_frac: float = 0.1, cap: int | None = None) -> int:
    """Rows per generate call (>= 1, at most `cap`, the rows a turn has) that fit in (1 - reserve_frac) of free_bytes
    (the bytes left after the static memory; the reserve covers the logits, sampling and fragmentation), a row taking
    `row` bytes (row_bytes): floor((1 - reserve_frac) x free_bytes / row). Raises ValueError, one line naming the
    flags to change, when not even one row fits."""
    rows = int((1 - reserve_frac) * free_bytes // row)
    if rows < 1:
        left = f"{free_bytes / GiB:.2f} GiB is left" if free_bytes > 0 else \
            f"the static memory alone is {-free_bytes / GiB:.1f} GiB more than the usable memory"
        raise ValueError(f"--gen-batch-size auto: one generate row needs {row / GiB:.2f} GiB (KV cache and prefill at "
                         f"the longest context) but {left}; lower --max-new-tokens, --max-turns or --max-obs-tokens, "
                         "shrink the static memory (--fsdp, --ref-offload, --kl-coef 0), or set --gen-batch-size N")
    return min(rows, cap) if cap else rows


def layer_activation_bytes(config, bf16_autocast: bool, dtype_bytes: int = 4) -> int:
    """Bytes per token that one decoder layer saves for its backward in the update, measured tensor by tensor with
    torch.autograd.graph.saved_tensors_hooks on transformers 5's Qwen2 under torch 2.13 (benchmarks/memory_plan.py
    prints the check). With h = hidden_size, i = intermediate_size, n = num_attention_heads:
    bf16 autocast over fp32 weights (the one-GPU path): 36h + 8i + 4n + 8 = two RMSNorms x (fp32 input and output
    8h + rsqrt 4), the bf16 casts of the normed input for q, k, v and for gate, up (5 x 2h), sdpa's q, k, v (k, v
    repeated to all n heads) and output (4 x 2h) with its fp32 logsumexp (4n), o_proj's input (2h), gate, up,
    silu(gate) and their product (4 x 2i); the layer's bf16 weight copies come on top (update_activation_bytes).
    No autocast, weights and compute in dtype_bytes: (44h + 16i) x dtype_bytes / 4 + 4n + 8: the fp32 pattern
    (measured: no casts, 4-byte tensors, 8h more of rotary temporaries), scaled to the dtype (FSDP's bf16 compute:
    an assumption, not measured).
    Qwen2.5-3B under autocast: 36 x 2048 + 8 x 11008 + 4 x 16 + 8 = 161,864 bytes per token per layer."""
    h, i, n = config.hidden_size, config.intermediate_size, config.num_attention_heads
    if bf16_autocast:
        return 36 * h + 8 * i + 4 * n + 8
    return (44 * h + 16 * i) * dtype_bytes // 4 + 4 * n + 8


def update_activation_bytes(model, micro: int, tokens: int, response_tokens: int, *, grad_ckpt: bool,
                            bf16_autocast: bool, compute_bytes: int = 4, split: bool = False):
    """Peak bytes one update micro-batch adds to the static memory (train.update: forward, loss, backward), for
    `micro` rows padded to `tokens` (prompt + response) of which `response_tokens` get logits. bf16_autocast: bf16
    autocast over fp32 weights (one GPU), else compute_bytes per element (2: FSDP's bf16; 4: fp32). With L layers,
    a = layer_activation_bytes, w = one layer's parameters, c = compute bytes (2 under autocast), n = micro x tokens,
    the bytes saved for backward are
    - layers: no --grad-ckpt: n x L x a, plus under autocast the bf16 copies of every layer's weights that each Linear
      saves (2 x L x w); --grad-ckpt: each layer keeps its fp32 input (n x L x 4h) and one layer at a time is
      recomputed in backward (n x a, + 2w);
    - logits: response_logp keeps the [micro, response_tokens, V] logits (c bytes each) for its chunked log-softmax
      (not a whole fp32 [micro, T, V]: 64 positions at a time, recomputed in backward), and under autocast the head's
      bf16 weight copy (2Vh);
    - the shared attention inputs: sdpa's [micro, 1, tokens, tokens] mask (c bytes), rotary cos, sin (8 x head_dim
      per token).
    On top of them, the larger of two backward moments (from the measured peaks, benchmarks/memory_plan.py
    --measure): the logits' gradient twice (the 64-position chunks' gradients and their concatenation), or, once the
    logits are freed, the head's weight gradient in c bytes and its fp32 copy under autocast ((c + 4) x V x h; the
    .grad it is added to is in the static memory). Qwen2.5-3B, 4 rows of 3756 tokens (3500 of them response),
    --grad-ckpt, autocast: 20.5 GB, of which the logits and their gradient 12.8 GB. An estimate of the worst case
    (every row at the longest context); real micro-batches are cut to their longest row (response_logp). Returns
    the bytes (int), or with split=True (saved for backward, the backward moment on top)."""
    cfg, L = model.config, model.config.num_hidden_layers
    h, V = cfg.hidden_size, model.get_output_embeddings().weight.shape[0]
    head_dim = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    c = 2 if bf16_autocast else compute_bytes
    a, w = layer_activation_bytes(cfg, bf16_autocast, c), sum(p.numel() for p in model.model.layers[0].parameters())
    copies = 2 * w if bf16_autocast else 0  # bytes of one layer's bf16 weight copies
    n = micro * tokens
    layers = n * (L * 4 * h + a) + copies if grad_ckpt else n * L * a + L * copies
    logits = micro * response_tokens * V * c
    saved = layers + logits + (2 * V * h if bf16_autocast else 0) + micro * tokens * tokens * c + 8 * head_dim * n
    moment = max(2 * logits, (c + (4 if bf16_autocast else 0)) * V * h - logits)
    return (saved, moment) if split else saved + moment


def update_plan(model, left_bytes: float, micro_batch_size: int | None, grad_ckpt: bool | None, *, tokens: int,
                response_tokens: int, bf16_autocast: bool, compute_bytes: int = 4,
                reserve_frac: float = 0.1) -> tuple[int, bool, int]:
    """(micro-batch size, gradient checkpointing, its bytes: update_activation_bytes) for the update, with left_bytes
    free beside the update's static memory. A flag the user set (micro_batch_size a count, grad_ckpt True or False)
    is kept; an unset one (None) is chosen, by the first that fits in (1 - reserve_frac) x left_bytes of: without
    gradient checkpointing micro-batches of 8, 4, 2, 1, then with it the same. Smaller micro-batches do not change
    the gradient (P14) and cost little at thousands of tokens per row, checkpointing ~1/3 more update compute: so
    fewer rows first. Raises ValueError, one line with the figures and the flags to change, when none fits."""
    micros = [micro_batch_size] if micro_batch_size else [8, 4, 2, 1]
    ckpts = [grad_ckpt] if grad_ckpt is not None else [False, True]
    tried = [(m, ck, update_activation_bytes(model, m, tokens, response_tokens, grad_ckpt=ck,
                                             bf16_autocast=bf16_autocast, compute_bytes=compute_bytes))
             for ck in ckpts for m in micros]
    for m, ck, need in tried:
        if need <= (1 - reserve_frac) * left_bytes:
            return m, ck, need
    m, ck, need = tried[-1]  # the smallest of them
    size = lambda b: f"{b / GiB:.1f} GiB" if b >= GiB / 10 else f"{b / 2**20:.1f} MiB"  # noqa: E731
    raise ValueError(f"the update does not fit: {m} row(s) per micro-batch x {tokens} tokens"
                     f"{' with' if ck else ' without'} --grad-ckpt need {size(need)} of activations and "
                     f"logits, but {size(max(left_bytes, 0))} is left beside the static memory; use "
                     f"{'--micro-batch-size 1, ' if m > 1 else ''}{'' if ck else '--grad-ckpt, '}--ref-offload, --fsdp "
                     "or lower --max-new-tokens, --max-turns or --max-obs-tokens")


def memory_plan(model, free_bytes: float, gen_batch_size: str = "auto", *, rows: int, turns: tuple[int, int, int],
                bf16: bool, ref=None, world: int = 1, update: tuple[int | None, bool | None] = (None, None)):
    """(rows per generate call, micro-batch size, gradient checkpointing, the plan as printable lines) for `model`
    (loaded, or built on the meta device: only its config, parameter count and dtype are read) on a rank with
    free_bytes (free_memory). gen_batch_size: "auto" (gen_batch_size_auto) or a count, kept as given. rows: the
    contexts a turn generates for on this rank (the cap); turns: (max_turns, max_new_tokens, max_obs_tokens); bf16:
    the passes compute in bf16 (autocast or FSDP on GPU; then the KV cache is bf16 and the rollout holds a bf16 copy
    of fp32 weights); ref: the reference model kept in memory (its dtype is read), or None (no KL term, or
    --ref-offload). update: (--micro-batch-size, --grad-ckpt) as given, None where unset: update_plan chooses those,
    for micro-batches of the longest context (context_tokens; its response part gets logits) beside the static memory
    less the rollout's weight copy. Raises ValueError (gen_batch_size_auto, update_plan) when no choice fits; a
    --gen-batch-size count that does not fit is reported in the plan, not raised (the figure is an estimate)."""
    n_params, weights_bytes = sum(p.numel() for p in model.parameters()), next(model.parameters()).element_size()
    compute_bytes = 2 if bf16 else weights_bytes
    ref_bytes = next(ref.parameters()).element_size() if ref is not None else 0
    static = static_memory(n_params, weights_bytes=weights_bytes, ref_bytes=ref_bytes, world=world,
                           rollout_bytes=compute_bytes if compute_bytes != weights_bytes or world > 1 else 0)
    context = context_tokens(*turns)
    kv, row = kv_bytes_per_token(model.config, compute_bytes), row_bytes(model.config, context, compute_bytes)
    left = free_bytes - sum(static.values()) * GiB  # bytes for the generate calls
    n = gen_batch_size_auto(left, row, cap=rows) if gen_batch_size == "auto" else int(gen_batch_size)
    need = n * row  # bytes of n rows at the longest context
    fits = "fits" if need <= 0.9 * left else "does NOT fit: " + (
        "lower --gen-batch-size (or auto)" if left > 0 else "the static memory alone is too much (--fsdp, "
        "--ref-offload, --kl-coef 0)")
    autocast_on = bf16 and weights_bytes != 2 and world == 1  # one GPU: bf16 autocast over fp32 weights
    left_update = left + static["rollout weights"] * GiB  # the rollout's weight copy is gone by the update
    micro, ckpt, act = update_plan(model, left_update, *update, tokens=context, response_tokens=context - PROMPT_TOKENS,
                                   bf16_autocast=autocast_on, compute_bytes=compute_bytes)
    chosen = lambda given: "as given" if given is not None else "chosen by the plan"  # noqa: E731
    parts = ", ".join(f"{k} {v:.1f}" for k, v in static.items() if v)
    return n, micro, ckpt, (
        f"memory plan per rank: {n_params / 1e6:,.0f}M params, static {sum(static.values()):.1f} GiB ({parts})\n"
        f"  + generate: {n} rows per call x {context} tokens x (KV {kv:,} + prefill {row // context - kv:,} "
        f"bytes/token) = {need / GiB:.1f} GiB | {free_bytes / GiB:.1f} GiB usable: {fits}\n"
        f"  + update: --micro-batch-size {micro} ({chosen(update[0])}), --grad-ckpt {'on' if ckpt else 'off'} "
        f"({chosen(update[1])}): {micro} x {context} tokens of activations and logits = {act / GiB:.1f} GiB | "
        f"{left_update / GiB:.1f} GiB left beside the static memory: fits")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    try:
        model, tokenizer, device = load_policy(sys.argv[1], "float32", "cpu")
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        raise SystemExit(f"error: {err}") from None
    print(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{model.get_input_embeddings().num_embeddings} embedding rows, tokenizer {len(tokenizer)} tokens, "
          f"eos {tokenizer.eos_token!r}, pad {tokenizer.pad_token!r}")
