"""The memory plan (policy.memory_plan) for the paper's three model sizes, from their configs: no weights, no hub.

Each model is built on the meta device (no memory), so the parameter counts are exact. Per size it prints the static
memory per rank (fp32 policy, gradients and AdamW moments, bf16 reference, the rollout's bf16 weight copy), the KV
cache per token, the longest context of a generate call, and the rows per generate call that --gen-batch-size auto
picks on an 80 GB card and on a 141 GB one (H200), with the paper's rollout settings by default.

    python benchmarks/memory_plan.py                      # one GPU, bf16 autocast over fp32 weights, as train.py
    python benchmarks/memory_plan.py --gpus 8 --fsdp      # FSDP over 8 GPUs
"""

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from policy import GiB, memory_plan  # noqa: E402

# From each model's config.json on the hub (Qwen/Qwen2.5-{0.5B,3B,7B}); the -Instruct models have the same shapes.
CONFIGS = {
    "Qwen2.5-0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-3B": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                       intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}
CARDS = {"80 GB": 80e9, "H200 141 GB": 141e9}  # decimal gigabytes, as the cards are sold (80 GB = 74.5 GiB)


def meta_model(name: str, dtype=torch.float32):
    """The model `name` on the meta device: shapes and dtypes, no memory."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(Qwen2Config(**CONFIGS[name])).to(dtype)


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
    a = ap.parse_args()
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
                n, plan = memory_plan(model, free, "auto", rows=rows, bf16=True, ref=ref, world=world,
                                      turns=(a.max_turns, a.max_new_tokens, a.max_obs_tokens))
                lines = "\n".join("    " + line for line in plan.splitlines())
                print(f"  {card}: --gen-batch-size auto = {n}\n{lines}")
            except ValueError as err:
                print(f"  {card}: does not fit: {err}")


if __name__ == "__main__":
    main()
