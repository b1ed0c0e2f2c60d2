"""Benchmark: today's decoding (--generator hf: re-prefill every turn) against hf-kv (each call's KV cache kept
across turns, engine.py), side by side in one run on this CPU.

Two workloads, each engine timed on the same batch, alternating, --repeats times after one warm-up (median shown):
1. world: a real rollout (rollout.rollout, BM25 search) of the search world's warm-start policy
   (tests/fixtures/world_guess_policy, 0.65M parameters: what `scripts/search_world.py --guess-frac 0.4` trains), 8
   questions x 4, 3 search turns + the answer turn, 64 new tokens a turn, temperature 1 / top-p 0.95 as in training.
2. qwen0.5b-2L: Qwen2.5-0.5B's config cut to 2 layers (its 151,936-token head), random weights, the tests' tokenizer;
   8 rows driven turn by turn at the paper's proportions scaled down: a 256-token prompt, 3 turns of 64 new tokens,
   each followed by a 300-token observation (random weights never write a valid <search>, so rollout would append
   only the invalid-action message). Greedy, so the two engines' ids must be equal (checked, printed).
Useful tokens are the kept model tokens (Episode.loss_mask, or the ids `cut_turn` keeps); tokens/s = useful tokens /
wall time of the batch. Nothing is asserted.

    python benchmarks/bench_decode.py                   # both workloads, ~6 minutes on 2 busy cores at 1 thread
    python benchmarks/bench_decode.py --parts world --repeats 5
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts"), str(ROOT / "benchmarks")]

from data import load_questions  # noqa: E402
from engine import GENERATORS  # noqa: E402
from rollout import cut_turn, rollout  # noqa: E402


def world_batch(tmp: Path):
    """() -> (useful tokens, ids) for one rollout batch of the warm-start policy, per engine name."""
    import search_world
    from retriever import BM25Retriever
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = search_world.write_world(search_world.make_world(seed=0), tmp)
    search = BM25Retriever.from_jsonl(str(paths["corpus"])).search
    rows = load_questions(str(paths["test"]))[:8]
    policy = ROOT / "tests" / "fixtures" / "world_guess_policy"
    tok, model = AutoTokenizer.from_pretrained(policy), AutoModelForCausalLM.from_pretrained(policy).eval()

    def run(name):
        torch.manual_seed(0)
        generate = GENERATORS[name](model, tok, max_new_tokens=64, temperature=1.0, top_p=0.95)
        eps = rollout(generate, tok, rows, search, group_size=4, max_turns=3, max_obs_tokens=200)
        return sum(sum(e.loss_mask) for e in eps), [e.response_ids for e in eps]
    return run


def qwen_batch(rows=8, prompt=256, turns=3, new=64, obs=300):
    """Qwen2.5-0.5B's config with 2 layers, random weights; turns driven as rollout drives them (cut, append)."""
    from memory_plan import CONFIGS
    from tiny import build_tokenizer
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    tok = build_tokenizer()
    model = AutoModelForCausalLM.from_config(Qwen2Config(**{**CONFIGS["Qwen2.5-0.5B"], "num_hidden_layers": 2})).eval()
    g = torch.Generator().manual_seed(0)

    def ids(n):
        return torch.randint(3, len(tok), (n,), generator=g).tolist()

    prompts, observations = [ids(prompt) for _ in range(rows)], [[ids(obs) for _ in range(rows)] for _ in range(turns)]

    def run(name):
        generate = GENERATORS[name](model, tok, max_new_tokens=new, do_sample=False)
        contexts, useful, kept_all = [list(p) for p in prompts], 0, []
        for t in range(turns):
            outs = generate(contexts)
            kept = [cut_turn(o, tok, generate.eos_ids)[0] for o in outs]
            useful += sum(len(k) for k in kept)
            kept_all.append(kept)
            contexts = [c + k + o for c, k, o in zip(contexts, kept, observations[t])]
        generate.reset() if hasattr(generate, "reset") else None
        return useful, kept_all
    return run


def bench(label: str, run, repeats: int):
    times, out = {n: [] for n in GENERATORS}, {}
    for n in GENERATORS:
        run(n)  # warm-up: allocator, first-call costs
    for _ in range(repeats):
        for n in GENERATORS:
            t0 = time.perf_counter()
            out[n] = run(n)
            times[n].append(time.perf_counter() - t0)
    wall = {n: statistics.median(t) for n, t in times.items()}
    rate = {n: out[n][0] / wall[n] for n in GENERATORS}
    same = "same ids" if out["hf"][1] == out["hf-kv"][1] else "ids differ"
    print(f"{label:<13} {wall['hf']:>9.2f} {wall['hf-kv']:>9.2f} {out['hf'][0]:>7d} {out['hf-kv'][0]:>7d} "
          f"{rate['hf']:>9.1f} {rate['hf-kv']:>9.1f} {rate['hf-kv'] / rate['hf']:>6.2f}  {same}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", default=["world", "qwen0.5b-2L"], choices=["world", "qwen0.5b-2L"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.threads} thread(s), median of {args.repeats} after a warm-up; s = wall time per rollout batch, "
          "tok = useful (kept) model tokens")
    print(f"{'workload':<13} {'hf s':>9} {'hf-kv s':>9} {'hf tok':>7} {'kv tok':>7} {'hf tok/s':>9} {'kv tok/s':>9} "
          f"{'ratio':>6}")
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            bench(part, world_batch(Path(tmp)) if part == "world" else qwen_batch(), args.repeats)


if __name__ == "__main__":
    main()
