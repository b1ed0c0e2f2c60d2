"""The policy pi_theta: log-probs of the response tokens, exactly as they were sampled.

A trajectory's loss (grpo.py, llds.py) needs logp [B, T], the log-probability of each response token
under the policy that is being trained, and the same quantity under the policy that sampled it
(old_logp) and under the frozen reference (ref_logp). They are comparable only if all three are
computed as the sampler computed them: the same temperature on the logits (P17), the same ids the
sampler could emit (P16), the same positions for left-padded prompts, dropout off (P18). This file
loads the model (load_policy, load_reference), batches trajectories (collate) and computes those
log-probs: response_logp is the memory-lean version train.py uses (only the response positions'
logits, chunked log-softmax, recomputed in backward), response_logp_plain the obvious one it must
agree with (tests/test_policy.py). How many rows fit in memory is memory.py's.

Loading: transformers loads what it is given with little checking: a folder without tokenizer files
gives an empty tokenizer (generation then fails at step 1 with an IndexError), a truncated
model.safetensors fails deep in safetensors' Rust code, and an unreachable hub costs ~50 s of
retries and an 80-line traceback. load_policy checks a local folder before loading it, tries the
local hub cache before the network, and raises one line that names the flag, the file and the fix.

    python -m machinery.policy MODEL        # check and load MODEL, print what it is
"""

import contextlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as activation_checkpoint  # recompute in backward

from machinery import checkpoint

# any one of them holds a vocab
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def safetensors_problem(path: Path) -> str | None:
    """None if the .safetensors file is whole, else what is wrong with it. The format is an 8-byte
    little-endian header length n, n bytes of JSON giving each tensor's data_offsets, then the data:
    the file must be exactly 8 + n + the largest end offset bytes long."""
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
            end = max((v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__"),
                      default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "damaged: its header is not a safetensors header"
    if size != 8 + n + end:
        return f"truncated: {size} bytes, its header describes {8 + n + end}"
    return None


def check_model_folder(folder: Path):
    """Raise ValueError (one line, naming the file) if the local model folder cannot give a working
    policy: config.json missing or not JSON, no weights, a missing shard, a truncated .safetensors
    file, or no tokenizer files (transformers would build an empty tokenizer without a word)."""
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"--model {folder}: no config.json (pass the folder that save_pretrained "
                         f"wrote)")
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
            raise ValueError(f"--model {folder}: {index.name} is not a weight index "
                             f"({err})") from None
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
        raise ValueError(f"--model {folder}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
                         f"save the base model's "
                         "tokenizer into it "
                         "(AutoTokenizer.from_pretrained(BASE).save_pretrained(FOLDER))")


def check_hub(name: str):
    """Raise ConnectionError / ValueError (one line) when the hub cannot give `name`: unreachable
    (offline, DNS, proxy, HF_HUB_OFFLINE), or no such (or no accessible) model. One request with a
    10 s timeout, not the ~50 s of retries transformers spends before its traceback."""
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        huggingface_hub.model_info(name, timeout=10)
    except GatedRepoError:
        raise ValueError(f"--model {name}: a gated model on the Hugging Face hub; accept its "
                         f"licence on the hub and "
                         "log in (`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise ValueError(f"--model {name}: no such model on the Hugging Face hub (or a private "
                         f"one: `hf auth login`); "
                         "a local path must exist") from None
    # connection refused, DNS, timeout, offline mode: whatever the HTTP stack raises
    except Exception as err:
        raise ConnectionError(f"--model {name}: not in the local cache and the Hugging Face hub "
                              f"cannot be reached "
                              f"({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}). Where there "
                              f"is internet run `hf download {name} --local-dir DIR`, then pass "
                              f"--model DIR") from None


def load_policy(name: str, dtype: str = "auto", device: str = "auto"):
    """(model, tokenizer, device) from a hub id, a local folder (a model folder, a checkpoint, or a
    train.py --out-dir: its newest complete checkpoint) or a .gguf file (transformers' gguf_file=,
    de-quantised to plain trainable floats).

    dtype: float32 | bfloat16 | auto (bf16 on CUDA, else fp32). The model is put in eval mode and
    stays there: dropout is off in every log-prob pass, so recomputed log-probs equal the sampling
    ones (P18); gradients still flow. A hub id is read from the local cache first (no network needed
    once downloaded), else fetched. Raises FileNotFoundError for a local path that does not exist,
    ValueError for a broken folder (check_model_folder), a tokenizer with more tokens than the
    model's embedding rows, or a load that fails, and ConnectionError when the hub is needed and
    cannot be reached; each message is one line that names --model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    torch_dtype = {"auto": torch.bfloat16 if device.startswith("cuda") else torch.float32,
                   "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    path = Path(name).expanduser()
    looks_local = (
        path.exists()
        or name.startswith((".", "/", "~"))
        or name.endswith(".gguf")
        or name.count("/") > 1
    )
    if looks_local and not path.exists():
        raise FileNotFoundError(f"--model {name}: no such folder or file (pass a hub id, a model "
                                f"folder or a .gguf)")
    kw = {}
    if path.is_file() and path.suffix == ".gguf":
        name, kw = str(path.parent), {"gguf_file": path.name}
    elif path.is_dir():
        # a train.py --out-dir
        if not (path / "config.json").exists() and (path / "checkpoints").is_dir():
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
        # GGUF: de-quantised
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype, **kw, **extra)
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
    # what transformers, safetensors or gguf raise on a file they cannot read
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"--model {name}: cannot load it ({type(err).__name__}: "
                         f"{first})") from None
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(f"--model {name}: the tokenizer has {len(tokenizer)} tokens but the "
                         f"model's embedding only "
                         f"{rows} rows: the tokenizer files belong to another model")
    # de-quantised weights are plain floats: let save_pretrained write them (it refuses
    # "gguf-quantised")
    if kw:
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer, device


# --------------------------------------------------------------------------------------------------
# Log-probs and entropy from logits (used by train.py for the old, ref and current policy alike)


def logp_from_logits(logits: torch.Tensor, targets: torch.Tensor,
                     temperature: float = 1.0) -> torch.Tensor:
    """Per-token log pi(target) under the sampling temperature.

    logits: [B, T, V] (the logits that predict `targets`), targets: [B, T] long -> [B, T] float32,
    in nats. The *logits* are divided by the temperature before log_softmax, exactly as the sampler
    did (P17); dividing log-probs instead gives a ratio != 1 on-policy. Computed in float32 even for
    bf16 logits.
    """
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]


def logp_and_entropy_from_logits(logits: torch.Tensor, targets: torch.Tensor,
                                 temperature: float = 1.0):
    """(logp [B, T], entropy [B, T]) from one log_softmax, for the update pass that needs both.

    Entropy of the temperature-scaled next-token distribution, H = -sum_v p_v log p_v, in nats.
    Sharing the log_softmax saves a [B, T, V] copy, the memory peak of the update.
    """
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return logp, -(logp_all.exp() * logp_all).sum(-1)  # [B, T], [B, T]


BUSY_NOTED = "LLDS_GRPO_BUSY_NOTED"  # set once the busy-machine note was said in this command


def busy_cpu_note(load: float | None = None, cores: int | None = None,
                  threads: int | None = None) -> str | None:
    """One line when other processes already keep every core of this machine busy and torch runs
    more than one thread (its default: one per core); None otherwise. Then each of torch's threads
    waits on the others' cores: on a shared 2-core machine we saw CPU runs 5-70x slower than with
    one thread. load: the 1-minute load average (os.getloadavg), cores: os.cpu_count(), threads:
    torch.get_num_threads(); each read from the machine when not given. Said once per command: the
    processes it starts (lab/spiral.py's runs) inherit BUSY_NOTED and stay quiet."""
    if os.environ.get(BUSY_NOTED):
        return None
    try:
        load = os.getloadavg()[0] if load is None else load
    except (AttributeError, OSError):  # no load average (Windows)
        return None
    cores = cores or os.cpu_count() or 1
    threads = threads or torch.get_num_threads()
    if threads <= 1 or load < cores:
        return None
    os.environ[BUSY_NOTED] = "1"
    return (f"note: this machine is busy (load {load:.1f} on {cores} cores) and torch runs "
            f"{threads} threads, which "
            f"then wait on each other; if steps are slow, set OMP_NUM_THREADS to the idle cores "
            f"(e.g. 1) or use an "
            f"idle machine")


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX512-BF16 or AMX): elsewhere a bf16 Linear runs
    ~8x slower than fp32 (measured on an AVX2 CPU: 9 against 71 GFLOP per CPU-second)."""
    import torch.cpu as cpu  # private helpers of torch.cpu; a torch without them: False

    return any(
        getattr(cpu, f, lambda: False)()
        for f in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )


def reference_dtype(ref_dtype: str, device: str) -> str:
    """train.py --ref-dtype: "auto" -> "bfloat16" on a GPU or a CPU with bf16 units (half the
    memory, as veRL; only the KL term sees it), else "float32"; any other value is kept."""
    if ref_dtype != "auto":
        return ref_dtype
    return "bfloat16" if device.startswith("cuda") or cpu_has_bf16() else "float32"


def autocast(amp: str, device: str, dtype: str = "auto", fsdp: bool = False):
    """A function returning a fresh bf16 autocast context for one pass, or a null context (train.py
    --amp).

    amp: "bf16" (on, wherever asked) | "auto" (on with fp32 weights, dtype "auto", for one GPU and
    for a CPU with bf16 units, AVX512-BF16 or AMX: there bf16 matmuls ran ~2.4x the fp32 FLOP rate
    and a SmolLM2 step ~1.55x faster; off on a CPU without them, where bf16 is emulated and ~8x
    slower, and under FSDP, which has its own mixed precision) | "off". Enter it afresh for each
    pass: autocast's cache of bf16 weight copies is only dropped on exit, so one context around an
    optimizer step would keep computing with the old weights (the update asks for cache=False)."""
    fast = device.startswith("cuda") or (device == "cpu" and cpu_has_bf16())
    on = amp == "bf16" or (amp == "auto" and fast and dtype == "auto" and not fsdp)
    return lambda cache=True: torch.autocast(device.split(":")[0], torch.bfloat16,
                                             cache_enabled=cache) if on \
        else contextlib.nullcontext()


# --------------------------------------------------------------------------------------------------
# Gradient checkpointing


def enable_grad_ckpt(model):
    """Checkpoint each decoder layer with torch's non-reentrant checkpoint, whenever gradients are
    on.

    NOTE: not model.gradient_checkpointing_enable(): HF checkpoints only in train mode, and the
    policy stays in eval mode (P18), where that call silently does nothing. Returns `model` (changed
    in place).
    """
    for layer in model.model.layers:
        def forward(*a, _f=layer.forward, **kw):
            return activation_checkpoint(_f, *a, use_reentrant=False,
                                         **kw) if torch.is_grad_enabled() else _f(*a, **kw)
        layer.forward = forward
    return model


# --------------------------------------------------------------------------------------------------
# Batching trajectories and computing log-probs


def collate(episodes, pad_id: int) -> dict:
    """Left-pad prompts to P, right-pad responses to T: input_ids [B, P+T]; masks built by position,
    never by pad value.

    Returns input_ids, attention_mask, position_ids [B, P+T] and loss_mask, answer_mask [B, T]
    (float).
    """
    P = max(len(e.prompt_ids) for e in episodes)
    T = max(max(len(e.response_ids) for e in episodes), 1)
    ids, attn, loss_mask, ans = [], [], [], []
    for e in episodes:
        lp, lr = len(e.prompt_ids), len(e.response_ids)
        ids.append([pad_id] * (P - lp) + e.prompt_ids + e.response_ids + [pad_id] * (T - lr))
        # NOTE(P9): masks by position (lengths), never `ids != pad`, which erases EOS when
        # pad == eos (P9)
        attn.append([0] * (P - lp) + [1] * (lp + lr) + [0] * (T - lr))
        loss_mask.append(e.loss_mask + [0] * (T - lr))
        ans.append(e.answer_mask + [0] * (T - lr))
    attention_mask = torch.tensor(attn)  # [B, P+T]
    # [B, P+T] as generate() numbered left-padded rows
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": torch.tensor(ids), "attention_mask": attention_mask,
            "position_ids": position_ids,
            "loss_mask": torch.tensor(loss_mask, dtype=torch.float32),
            "answer_mask": torch.tensor(ans, dtype=torch.float32)}


def response_logp(model, batch, rows, temperature, vocab_size, with_entropy=False):
    """logp [b, T] (and entropy [b, T]) of the response tokens for batch rows `rows`, under the
    sampling temperature.

    The columns that are padding in every one of these rows are cut first (a micro-batch of short
    trajectories does not pay for the batch's longest; positions come from position_ids, so nothing
    moves), and the result is zero-padded back to [b, T]. Only the logits of positions that predict
    response tokens are materialised (logits_to_keep). Logits of ids the tokenizer does not have are
    dropped, as the sampler suppressed them (P16), so old, ref and current log-probs are of the
    sampling policy.
    """
    dev = next(model.parameters()).device
    L, T = batch["input_ids"].shape[1], batch["loss_mask"].shape[1]
    used = batch["attention_mask"][rows].any(0)  # [L] columns that are a real token in some row
    # first prompt column some row uses (prompts are left-padded)
    left = int(used[: L - T].int().argmax())
    # last response column in use, plus one
    t = int(used[L - T:].nonzero().max()) + 1 if used[L - T:].any() else 1
    # drop all-padding prompt columns on the left, response columns on the right
    cols = slice(left, L - T + t)

    def cut(k):
        return batch[k][rows, cols].to(dev)

    P = L - T - left  # prompt columns kept
    out = model(input_ids=cut("input_ids"), attention_mask=cut("attention_mask"),
                position_ids=cut("position_ids"),
                logits_to_keep=torch.arange(P - 1, P + t - 1), use_cache=False)
    # [b, t, V] j predicts token j; NOTE(P16): tokenizer ids only
    logits = out.logits[..., :vocab_size]
    targets = cut("input_ids")[:, P:]  # [b, t]
    # no [b, t, V] fp32 log-softmax held whole
    chunks = list(zip(logits.split(64, 1), targets.split(64, 1)))
    # each chunk recomputed in backward; split: one gradient buffer, not one per slice
    if with_entropy:
        parts = [
            activation_checkpoint(
                logp_and_entropy_from_logits, lg, tg, temperature, use_reentrant=False
            )
            for lg, tg in chunks
        ]
        logp, entropy = torch.cat([lp for lp, _ in parts], 1), torch.cat([h for _, h in parts], 1)
        return F.pad(logp, (0, T - t)), F.pad(entropy, (0, T - t))  # [b, T], [b, T]
    logp = torch.cat([logp_from_logits(lg, tg, temperature) for lg, tg in chunks], 1)  # [b, t]
    return F.pad(logp, (0, T - t)), None


def response_logp_plain(model, batch, rows, temperature, vocab_size) -> torch.Tensor:
    """logp [b, T] as response_logp computes it, the obvious way: the full forward's logits at every
    position, one log-softmax, the response columns picked out. Equal to response_logp on every real
    response token (padding columns hold arbitrary values in either; the losses mask them). For
    tests and for reading: response_logp is what training runs (it materialises only the response
    positions' logits, in chunks)."""
    dev = next(model.parameters()).device
    b = {k: v[rows].to(dev) for k, v in batch.items()}
    T = b["loss_mask"].shape[1]
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                   position_ids=b["position_ids"],
                   use_cache=False).logits[..., :vocab_size]  # [b, P+T, V]
    # [b, T] position j-1 -> j
    return logp_from_logits(logits[:, -T - 1:-1], b["input_ids"][:, -T:], temperature)


@torch.no_grad()
def batch_logp(model, batch, micro_batch_size, temperature, vocab_size, start: int = 0,
               mini_batch_size: int | None = None) -> torch.Tensor:
    """No-grad logp [B - start, T] of rows start.. of the rollout batch, in the micro-batches the
    update will use: of micro_batch_size rows, restarting at each mini-batch of mini_batch_size rows
    (None: one mini-batch), as train.update makes them (rows padded together as there give the same
    floats), on the CPU. start: train.py's old pass skips the first mini-batch, whose log-probs the
    update's own forward gives."""
    B, T = batch["loss_mask"].shape
    start, mini = min(start, B), mini_batch_size or max(B, 1)
    rows = [slice(i, min(i + micro_batch_size, m0 + mini, B))
            for m0 in range(0, B, mini) for i in range(max(m0, start), min(m0 + mini, B),
                                                       micro_batch_size)]
    parts = [response_logp(model, batch, r, temperature, vocab_size)[0].cpu() for r in rows]
    return torch.cat(parts) if parts else torch.zeros(0, T)


def load_reference(model_name: str, dtype: str, device: str, offload_dir: Path | None = None):
    """The frozen reference policy pi_ref (the initial --model, also when resuming) for the KL term,
    no gradients.

    offload_dir: keep it on disk instead (written once in `dtype` by save_reference) and read it
    back for each step's reference pass; the caller drops it before the update, so its memory is
    free at the update's peak."""
    ref = load_policy(str(offload_dir) if offload_dir else model_name, dtype, device)[0]
    return ref.requires_grad_(False)


def save_reference(model_name: str, dtype: str, tokenizer, offload_dir: Path):
    """Write the reference once to offload_dir in `dtype`: reading it back each step is a plain
    memory map, while reading --model each step would convert it from its dtype and map the whole
    file too (+3.6 GiB for 0.6B)."""
    import shutil

    shutil.rmtree(offload_dir, ignore_errors=True)
    load_policy(model_name, dtype, "cpu")[0].save_pretrained(offload_dir)
    tokenizer.save_pretrained(offload_dir)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    try:
        model, tokenizer, device = load_policy(sys.argv[1], "float32", "cpu")
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        raise SystemExit(f"error: {err}") from None
    print(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
          f"parameters, "
          f"{model.get_input_embeddings().num_embeddings} embedding rows, tokenizer "
          f"{len(tokenizer)} tokens, "
          f"eos {tokenizer.eos_token!r}, pad {tokenizer.pad_token!r}")
