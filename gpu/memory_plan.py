"""The memory plan (memory.memory_plan) for the paper's three model sizes, from their configs: no weights, no hub.

Each model is built on the meta device (no memory), so the parameter counts are exact. Per size it prints the static
memory per rank (fp32 policy, gradients and AdamW moments, bf16 reference, the rollout's bf16 weight copy), the KV
cache per token, the longest context of a generate call, and the rows per generate call that --gen-batch-size auto
picks on an 80 GB card and on a 141 GB one (H200), with the paper's rollout settings by default, and the update
(--micro-batch-size, --grad-ckpt) the plan chooses where they are unset, as for `python train.py --model
Qwen/Qwen2.5-3B --llds 0.1`.

--measure checks the update's estimate (memory.update_activation_bytes) on this CPU: one update micro-batch
(policy.response_logp with the entropy, backward) of the tests' tiny model and of Qwen2.5-0.5B cut to 2 layers, with
and without gradient checkpointing, in bf16 autocast and in fp32, each in a fresh process: the rise of its peak
resident memory (ru_maxrss over the resident set before the forward; gradients allocated before), and the bytes
torch saves for backward (saved_tensors_hooks, each storage once, parameters left out), beside the estimate.

    python gpu/memory_plan.py                      # one GPU, bf16 autocast over fp32 weights, as train.py
    python gpu/memory_plan.py --gpus 8 --fsdp      # FSDP over 8 GPUs
    python gpu/memory_plan.py --measure            # estimate vs measured, on this CPU (~1 minute)
    python gpu/memory_plan.py --step-time          # a paper step's expected time split, 1, 4 and 8 GPUs

--step-time is arithmetic from per-token costs at assumed rates (RATES; results/scaling/paper_runs.md):
per rank, the training passes take FLOPs / (MFU x peak); a Hugging Face generate call decodes until its longest row
stops, each decode step reading the bf16 weights and its rows' KV cache at a fraction of the memory bandwidth plus a
fixed overhead, and re-prefills each turn's whole context; a vLLM engine in the same generate(contexts) seam batches
continuously (every sequence only for its own tokens), keeps each row's KV cache across turns (prefix caching: only
the observation is prefilled) and is bandwidth- or compute-bound, whichever is slower.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from machinery.memory import GiB, kv_bytes_per_token, memory_plan, update_activation_bytes  # noqa: E402
from machinery.policy import autocast, enable_grad_ckpt, response_logp  # noqa: E402

# From each model's config.json on the hub (Qwen/Qwen2.5-{0.5B,3B,7B}); the -Instruct models have the same shapes.
CONFIGS = {
    "Qwen2.5-0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768),
    "Qwen2.5-3B": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                       intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=32768),
    "Qwen2.5-7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
                       max_position_embeddings=131072),
}
CARDS = {"80 GB": 80e9, "H200 141 GB": 141e9}  # decimal gigabytes, as the cards are sold (80 GB = 74.5 GiB)
RATES = {  # the assumed rates of --step-time; the sources are in docs/scaling.md
    "peak_flops": 989e12,  # dense bf16 FLOP/s of an H100 or H200 (NVIDIA's datasheets)
    "hbm": {"80 GB": 3.35e12, "H200 141 GB": 4.8e12},  # bytes/s: H100 SXM 80 GB, H200 (datasheets)
    "mfu": 0.4,  # of peak, in the training passes and in prefill (assumed; gpu_check.py measures the update's)
    "hf_bw": 0.3, "hf_step_s": 0.015,  # HF generate: share of the bandwidth, fixed seconds per decode step (assumed)
    "vllm_bw": 0.7,  # vLLM: share of the bandwidth (assumed; CUDA graphs, paged attention)
    "gen_per_turn": 300, "gen_turns": 3, "obs": 500, "searches": 2,  # an average trajectory (assumed)
}


def meta_model(name: str, dtype=torch.float32):
    """The model `name` on the meta device: shapes and dtypes, no memory."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(Qwen2Config(**CONFIGS[name])).to(dtype)


MEASURED = {  # name -> (Qwen2Config fields over tests/tiny.py's, rows, tokens per row, of which response tokens)
    "tiny": ({}, 4, 512, 384),
    "0.5B, 2 layers": ({**CONFIGS["Qwen2.5-0.5B"], "num_hidden_layers": 2}, 2, 512, 384),
}


def measure_one(name: str, grad_ckpt: bool, amp: str) -> dict:
    """In this process (a fresh one): one update micro-batch of MEASURED[name]; its peak memory rise, the bytes saved
    for backward and the estimate, in bytes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny import build_model, build_tokenizer

    torch.set_num_threads(1)
    shape, micro, tokens, response = MEASURED[name]
    model = build_model(build_tokenizer(), **shape)
    model = enable_grad_ckpt(model) if grad_ckpt else model
    for p in model.parameters():  # as from the second micro-batch on: the gradients are there
        p.grad = torch.zeros_like(p)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    attn = torch.ones(micro, tokens, dtype=torch.long)
    attn[1:, :16] = 0  # left-padded prompts, so sdpa gets a mask as in training
    batch = {"input_ids": torch.randint(0, V, (micro, tokens), generator=g), "attention_mask": attn,
             "position_ids": (attn.cumsum(-1) - 1).clamp(min=0), "loss_mask": torch.ones(micro, response)}
    params, saved = {p.untyped_storage().data_ptr() for p in model.parameters()}, {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params:
            saved[key] = t.untyped_storage().nbytes()
        return t
    rss = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(amp, "cpu")(cache=False):
        logp, entropy = response_logp(model, batch, slice(0, micro), 1.0, V, with_entropy=True)
        loss = -(logp.sum() + 1e-3 * entropy.sum()) / (micro * response)
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    est_saved, est_moment = update_activation_bytes(model, micro, tokens, response, grad_ckpt=grad_ckpt,
                                                    bf16_autocast=amp == "bf16", compute_bytes=4, split=True)
    return {"rise": peak - rss, "saved": sum(saved.values()), "estimate": est_saved + est_moment,
            "estimate_saved": est_saved}


def measure():
    """Print estimate vs measured for each MEASURED model, --grad-ckpt off/on, bf16 autocast and fp32."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "1048576"}  # freed memory goes back
    print("one update micro-batch on this CPU (fresh process each); MiB: the peak's rise and the bytes saved for "
          "backward, estimated and measured\n"
          f"{'model':<16}{'rows x tokens':>14}{'amp':>6}{'grad-ckpt':>10}{'peak est':>10}{'measured':>10}"
          f"{'ratio':>7}{'saved est':>11}{'measured':>10}")
    for name, (_, micro, tokens, _) in MEASURED.items():
        for amp in ("bf16", "off"):
            for ckpt in (False, True):
                out = subprocess.run([sys.executable, __file__, "--measure-one", json.dumps([name, ckpt, amp])],
                                     capture_output=True, text=True, env=env, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{name:<16}{f'{micro} x {tokens}':>14}{amp:>6}{'on' if ckpt else 'off':>10}"
                      f"{r['estimate'] / 2**20:>10.1f}{r['rise'] / 2**20:>10.1f}{r['estimate'] / r['rise']:>7.2f}"
                      f"{r['estimate_saved'] / 2**20:>11.1f}{r['saved'] / 2**20:>10.1f}")


def step_time(model, plan: tuple, world: int, card: str, trajectories: int, r=RATES) -> dict:
    """Expected seconds per paper step on one rank (all ranks alike), by part, from the plan (rows per generate call,
    --grad-ckpt) and RATES. N parameters, kv bytes per token, c = the average context while decoding (the prompt's
    256 tokens, then each turn's generated and retrieved tokens: the mean over the turns of their middle)."""
    n_params, kv = sum(p.numel() for p in model.parameters()), kv_bytes_per_token(model.config, 2)
    rows, _, ckpt, _ = plan
    per_rank = -(-trajectories // world)
    turn = r["gen_per_turn"] + r["obs"]  # tokens a search turn adds to the context
    starts = [256 + k * turn for k in range(r["gen_turns"])]  # context at the start of each generate call
    c = sum(starts) / len(starts) + r["gen_per_turn"] / 2
    tokens = per_rank * (256 + r["gen_turns"] * r["gen_per_turn"] + r["searches"] * r["obs"])  # per step per rank
    flops = r["mfu"] * r["peak_flops"]
    train = (6 + (2 if ckpt else 0)) * n_params * tokens / flops  # forward + backward (+ the recomputed forward)
    logp = 3 * 2 * n_params * tokens / flops  # old, ref and the after-update pass, no grad
    hbm = r["hbm"][card]
    hf_steps = r["gen_turns"] * -(-per_rank // rows) * 500  # each call runs until its longest row: --max-new-tokens
    hf_decode = hf_steps * (r["hf_step_s"] + (2 * n_params + rows * c * kv) / (r["hf_bw"] * hbm))
    hf_prefill = per_rank * sum(starts) * 2 * n_params / flops  # every turn prefills its whole context again
    concurrent = min(per_rank, rows * 3)  # vLLM's pages: no prefill peak, no padding (~3x the rows of a call)
    v_steps = r["gen_turns"] * -(-per_rank // concurrent) * r["gen_per_turn"]
    v_step = max((2 * n_params + concurrent * c * kv) / (r["vllm_bw"] * hbm), 2 * n_params * concurrent / flops)
    v_prefill = per_rank * (256 + r["searches"] * r["obs"]) * 2 * n_params / flops  # prompt and observations only
    return {"rows": rows, "ckpt": ckpt, "train": train, "logp": logp, "hf": hf_decode + hf_prefill,
            "hf_prefill": hf_prefill, "vllm": v_steps * v_step + v_prefill, "tokens": tokens}


def step_times(a):
    """Print step_time for each model, GPU count (1 without FSDP, 4 and 8 with) and card."""
    print(f"expected seconds per step of {a.prompts_per_step} x {a.group_size} trajectories (per rank; ranks in "
          f"parallel), an average trajectory of {RATES['gen_turns']} generate calls x {RATES['gen_per_turn']} tokens "
          f"+ {RATES['searches']} x {RATES['obs']} retrieved; retrieval not counted\n"
          f"{'model':<14}{'GPUs':>5}  {'card':<12}{'gen rows':>9}{'ckpt':>5}{'update':>8}{'logp':>7}{'HF gen':>8}"
          f"{'(prefill)':>10}{'vLLM gen':>9}{'step HF':>9}{'step vLLM':>10}")
    for name in CONFIGS:
        model, ref = meta_model(name), meta_model(name, torch.bfloat16)
        for world in (1, 4, 8):
            for card, free in CARDS.items():
                try:
                    plan = memory_plan(model, free, "auto", rows=-(-a.prompts_per_step // world) * a.group_size,
                                       bf16=True, ref=ref, world=world, turns=(3, 500, 500))
                except ValueError:
                    print(f"{name:<14}{world:>5}  {card:<12}  does not fit (the static memory)")
                    continue
                t = step_time(model, plan, world, card, a.prompts_per_step * a.group_size)
                print(f"{name:<14}{world:>5}  {card:<12}{t['rows']:>9}{'on' if t['ckpt'] else 'off':>5}"
                      f"{t['train']:>8.0f}{t['logp']:>7.0f}{t['hf']:>8.0f}{t['hf_prefill']:>10.0f}{t['vllm']:>9.0f}"
                      f"{t['train'] + t['logp'] + t['hf']:>9.0f}{t['train'] + t['logp'] + t['vllm']:>10.0f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=1, help="ranks (with --fsdp the static memory is sharded)")
    ap.add_argument("--fsdp", action="store_true", help="shard over --gpus ranks (bf16 compute)")
    ap.add_argument("--free-gib", type=float, default=None, help="one card of this many GiB instead of the two")
    ap.add_argument("--prompts-per-step", type=int, default=512)
    ap.add_argument("--group-size", type=int, default=5)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=500)
    ap.add_argument("--max-obs-tokens", type=int, default=500)
    ap.add_argument("--kl-coef", type=float, default=0.001, help="0: no reference model")
    ap.add_argument("--micro-batch-size", type=int, default=None, help="unset: the plan chooses (train.py's default)")
    ap.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=None, help="unset: the plan chooses")
    ap.add_argument("--measure", action="store_true", help="estimate vs measured update memory on this CPU")
    ap.add_argument("--step-time", action="store_true", help="a paper step's expected time split (RATES)")
    ap.add_argument("--measure-one", help=argparse.SUPPRESS)  # a child of --measure: [name, grad_ckpt, amp]
    a = ap.parse_args()
    if a.measure_one:
        return print(json.dumps(measure_one(*json.loads(a.measure_one))))
    if a.measure:
        return measure()
    if a.step_time:
        return step_times(a)
    world = a.gpus if a.fsdp else 1
    cards = {f"{a.free_gib:g} GiB": a.free_gib * GiB} if a.free_gib else CARDS
    rows = -(-a.prompts_per_step // world) * a.group_size
    print(f"{a.prompts_per_step} x {a.group_size} trajectories/step on {world} rank(s), {a.max_turns} turns of "
          f"{a.max_new_tokens} new + {a.max_obs_tokens} retrieved tokens; fp32 policy, bf16 compute and reference")
    for name in CONFIGS:
        model, ref = meta_model(name), meta_model(name, torch.bfloat16) if a.kl_coef else None
        print(f"\n{name}")
        for card, free in cards.items():
            try:
                n, _, _, plan = memory_plan(model, free, "auto", rows=rows, bf16=True, ref=ref, world=world,
                                            turns=(a.max_turns, a.max_new_tokens, a.max_obs_tokens),
                                            update=(a.micro_batch_size, a.grad_ckpt))
                lines = "\n".join("    " + line for line in plan.splitlines())
                print(f"  {card}: --gen-batch-size auto = {n}\n{lines}")
            except ValueError as err:
                print(f"  {card}: does not fit: {err}")


if __name__ == "__main__":
    main()
