"""Load the policy: a causal LM and its tokenizer, from a hub id, a local folder or a .gguf file, or one clear error.

transformers loads what it is given with little checking: a folder without tokenizer files gives an empty tokenizer
(generation then fails at step 1 with an IndexError), a truncated model.safetensors fails deep in safetensors' Rust
code, and an unreachable hub costs ~50 s of retries and an 80-line traceback. load_policy checks a local folder before
loading it, tries the local hub cache before the network, and raises one line that names the flag, the file and the
fix.

    python policy.py MODEL        # check and load MODEL, print what it is
"""

import json
import sys
from pathlib import Path

import torch

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
