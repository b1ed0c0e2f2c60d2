"""Decoding engines for rollout's `generate(contexts) -> new ids` seam, chosen by train.py/evaluate.py `--generator`.

Both are Hugging Face's `model.generate` with one GenerationConfig that keeps rollout.py's departures 6-8 (ids beyond
the tokenizer never sampled, a turn stops at its first </search> or </answer>, sampling by temperature and top_p only).
`hf` (`hf_generator`) re-prefills each row's whole context (prompt + all earlier actions and observations) in a fresh
`model.generate` call every turn. `hf-kv` (`kv_generator`) keeps each call's KV cache (transformers' DynamicCache) of
gen_batch_size rows from one turn to the next: the next turn feeds only what the row does not have cached (the last
sampled token, the observation or invalid-action message), so the prefill of turn t costs the new tokens only, not the
whole context. Re-prefilling was the largest cost measured on our CPU (1.5-1.7x fewer useful tokens/s with 3 turns);
the gain of keeping the cache is in docs/scaling.md ("Keeping the KV cache across turns").

How a cached row is extended (shapes: n rows of a call, W cached positions, P the longest new piece):
  * after a call, the cache holds W = sequences.shape[1] - 1 positions per row (the last sampled token has no KV yet);
    `tokens [n, W]` and `mask [n, W]` (0 = left padding or a dropped position) say what each position holds;
  * the next context of a row must start with the row's cached real tokens (mask 1) up to some position p: rollout
    appends to what it kept, and `cut_turn` drops the tail of a turn after its stop string or EOS. Positions from p on
    (the dropped tail, the padding HF wrote after the row stopped) are masked to 0 and stay in the cache as holes;
  * the rest of the context (the new piece) is left-padded to P and fed after position W, so a row's last real token
    is always the last column, as in a left-padded batch. Position ids are HF's own, the mask's cumsum: a row's real
    tokens get the same positions as in today's re-prefilled, left-padded context, and attend to the same tokens.
So the logits are those of the re-prefilled path up to float rounding (the softmax runs over a wider, masked row):
greedy ids match exactly in tests/test_engine.py; sampled ids match too while the turn's rows fit one call, since the
calls then hold the same rows in the same order as hf's and draw the same random numbers (a rounding difference at a
top-p boundary can move one sample; it is not a different distribution).

Departures of hf-kv from hf (the ids kept and the sampling are the same: departures 6-8 hold):
  1. Rows keep the call they started in: a call's rows that stopped leave it (their cache rows are dropped,
     DynamicCache.batch_select_indices), and calls are never merged or refilled, so with more rows than gen_batch_size
     the calls hold different rows than hf's re-chunked calls (the ids differ from hf's under sampling; same
     distribution).
  2. Memory: every call's cache is kept until the rollout ends (the next first-turn call drops them), so the KV cache
     of all rows of a turn is held at once, not one call's. The memory plan (memory.memory_plan) sizes one call; with
     more rows than one call this path needs up to rows / gen_batch_size times that call's KV cache (but no
     re-prefill peak). Holes (dropped tails) are not reclaimed: a row's cache is as wide as its call's widest row.
  3. Contexts are matched to cached rows in order (rollout keeps its rows' order and only drops finished ones); a
     context that extends no cached row starts a fresh set of calls (a new rollout), as hf would.

Run `python engine.py` for a demo: greedy turns of a tiny random model, both engines, the same ids (seconds).
"""

import contextlib

import torch
from transformers import GenerationConfig

from rollout import STOP_STRINGS


def hf_generator(model, tokenizer, *, max_new_tokens: int = 500, temperature: float = 1.0, top_p: float = 0.95,
                 do_sample: bool = True, batch_size: int = 64, logits_processor=None):
    """The Hugging Face engine for `rollout`: batched, KV-cached `model.generate` over left-padded contexts.

    max_new_tokens: per generation turn (500 in the paper). temperature/top_p: sampling (paper code 1.0 / 0.95), and
    nothing else (departure 8, P17); do_sample=False is greedy (evaluation). batch_size: rows per generate call
    (memory). logits_processor: extra processors (tests script the policy with one). Stops at the first EOS (the
    model's generation_config EOS ids and the tokenizer's) or stop string (departure 7); ids beyond the tokenizer are
    never sampled (departure 6, P16).

    Returns generate(contexts: [N] lists of token ids) -> [N] lists of new ids, with generate.eos_ids (a frozenset).
    A row that stopped early is padded to the longest row of its call; `cut_turn` drops the padding.
    """
    eos_ids = model.generation_config.eos_token_id
    eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids] if eos_ids is not None else [])
    eos_ids.add(tokenizer.eos_token_id)
    pad, vocab = tokenizer.pad_token_id, model.get_output_embeddings().weight.shape[0]
    gen_cfg = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature if do_sample else None,
        top_p=top_p if do_sample else None, top_k=0 if do_sample else None, repetition_penalty=1.0,
        eos_token_id=sorted(eos_ids), pad_token_id=pad, stop_strings=list(STOP_STRINGS),
        suppress_tokens=list(range(len(tokenizer), vocab)) or None,  # departure 6 (P16)
    )

    def generate(contexts: list[list[int]]) -> list[list[int]]:
        device = next(model.parameters()).device
        out = []
        for i in range(0, len(contexts), batch_size):
            batch = contexts[i:i + batch_size]
            width = max(len(c) for c in batch)
            input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in batch])  # [n, L] left-padded
            # NOTE(departure): mask by position, not `ids != pad`, which erases real EOS when pad == eos (P9)
            attention_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in batch])  # [n, L]
            with torch.no_grad():
                ids = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                     generation_config=gen_cfg, tokenizer=tokenizer, logits_processor=logits_processor)
            out += ids[:, width:].tolist()  # [n, new]
        return out

    generate.eos_ids, generate.gen_cfg = frozenset(eos_ids), gen_cfg  # gen_cfg: kv_generator's too
    return generate


def _kept_prefix(tokens: list[int], mask: list[int], context: list[int]) -> tuple[int, int]:
    """How much of one cached row a new context reuses. tokens/mask: [W] a row's cached positions; context: the new
    context's ids. Returns (p, k): positions < p are kept (they hold context[:k], in order, with the padding between
    them), positions >= p get mask 0. At least one token is left to feed (k < len(context)), since generate needs a
    last position to predict from; p = -1 when the row's real tokens are not a prefix of the context at all."""
    p = k = 0
    for p, (t, m) in enumerate(zip(tokens, mask)):
        if m:
            if k == len(context) - 1 or t != context[k]:
                break
            k += 1
    else:
        p = len(tokens)
    return p, k


def _extends(context: list[int], prev: list[int]) -> bool:
    """Whether `context` is a later turn of the row last given `prev`: rollout only appends (kept ids, then an
    observation or the invalid-action message), so a later context is strictly longer."""
    return len(context) > len(prev) and context[:len(prev)] == prev


def kv_generator(model, tokenizer, *, max_new_tokens: int = 500, temperature: float = 1.0, top_p: float = 0.95,
                 do_sample: bool = True, batch_size: int = 64, logits_processor=None):
    """The `hf-kv` engine: hf_generator's `model.generate`, with each call's KV cache kept across turns.

    Arguments as hf_generator (same GenerationConfig: stop strings, EOS ids, suppressed ids, sampling).
    Returns generate(contexts: [N] lists of token ids) -> [N] lists of new ids (a row that stopped early is padded to
    its call's longest row: `cut_turn` drops it), with generate.eos_ids (a frozenset), and generate.reset() to drop the
    kept caches (rollout need not call it: a context that extends no kept row starts afresh).
    """
    base = hf_generator(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        do_sample=do_sample, batch_size=batch_size, logits_processor=logits_processor)
    gen_cfg, pad = base.gen_cfg, tokenizer.pad_token_id
    calls = []  # per call: {"cache", "tokens": [n, W] list rows, "mask": [n, W] list rows, "contexts": [n] lists}

    def fresh(contexts):
        calls.clear()
        out = []
        for i in range(0, len(contexts), batch_size):
            batch = contexts[i:i + batch_size]
            width = max(len(c) for c in batch)
            tokens = [[pad] * (width - len(c)) + c for c in batch]  # [n, L] left-padded
            mask = [[0] * (width - len(c)) + [1] * len(c) for c in batch]  # [n, L]
            calls.append({"tokens": tokens, "mask": mask, "cache": None, "contexts": batch})
            out += run(calls[-1], tokens, mask)
        return out

    def run(call, tokens, mask):
        from transformers import DynamicCache

        device = next(model.parameters()).device
        cache = call["cache"] if call["cache"] is not None else DynamicCache(config=model.config)
        with torch.no_grad():
            ids = model.generate(input_ids=torch.tensor(tokens, device=device),
                                 attention_mask=torch.tensor(mask, device=device), cache=cache,
                                 generation_config=gen_cfg, tokenizer=tokenizer, logits_processor=logits_processor)
        width = len(tokens[0])
        seq = ids.tolist()  # [n, width + new]
        call["cache"] = cache  # holds width + new - 1 positions: the last sampled token has no KV yet
        call["tokens"] = [row[:-1] for row in seq]
        call["mask"] = [m + [1] * (len(seq[0]) - 1 - width) for m in mask]
        return [row[width:] for row in seq]

    def match(contexts):
        """(call, row) of each context, in order, or None if one extends no kept row (a new rollout starts)."""
        plan, ci, ri = [], 0, 0
        for c in contexts:
            while ci < len(calls) and (ri == len(calls[ci]["contexts"]) or not _extends(c, calls[ci]["contexts"][ri])):
                ci, ri = (ci + 1, 0) if ri == len(calls[ci]["contexts"]) else (ci, ri + 1)  # rows that finished
            if ci == len(calls):
                return None
            plan.append((ci, ri))
            ri += 1
        return plan

    def generate(contexts: list[list[int]]) -> list[list[int]]:
        plan = match(contexts)
        if plan is None:
            return fresh(contexts)
        out, device = [None] * len(contexts), next(model.parameters()).device
        for ci, call in enumerate(calls):
            rows = [(j, r) for j, (cj, r) in enumerate(plan) if cj == ci]
            if not rows:  # every row of this call finished: free its cache
                call["cache"] = None
                continue
            if len(rows) < len(call["tokens"]):  # NOTE: rows that finished leave; the call is never refilled
                call["cache"].batch_select_indices(torch.tensor([r for _, r in rows], device=device))
            tokens, mask, tails = [], [], []
            for j, r in rows:
                p, k = _kept_prefix(call["tokens"][r], call["mask"][r], contexts[j])
                tokens.append(call["tokens"][r])
                mask.append(call["mask"][r][:p] + [0] * (len(call["mask"][r]) - p))  # dropped tail: a masked hole
                tails.append(contexts[j][k:])
            width = max(len(x) for x in tails)
            tokens = [t + [pad] * (width - len(x)) + x for t, x in zip(tokens, tails)]  # [n, W + P]
            mask = [m + [0] * (width - len(x)) + [1] * len(x) for m, x in zip(mask, tails)]  # [n, W + P]
            call["contexts"] = [contexts[j] for j, _ in rows]
            for (j, _), new in zip(rows, run(call, tokens, mask), strict=True):
                out[j] = new
        calls[:] = [c for c in calls if c["cache"] is not None]
        return out

    generate.eos_ids = base.eos_ids
    generate.reset = calls.clear
    return generate


GENERATORS = {"hf": hf_generator, "hf-kv": kv_generator}  # --generator's choices (train.py, evaluate.py)


@contextlib.contextmanager
def diverged_sampling(step: int):
    """Around a rollout: sampling from a policy whose logits overflowed fails inside torch.multinomial with a
    RuntimeError; say what it means instead (SystemExit, one line naming the training step)."""
    try:
        yield
    except RuntimeError as err:
        if "probability tensor contains" in str(err):
            raise SystemExit(f"error: step {step}: sampling met NaN/inf probabilities: the policy diverged (lower "
                             "--lr)") from None
        raise


# ----------------------------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
    from tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(tok, seed=0)

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    contexts = [enc("Question: where is the tower?"), enc("Hi")]  # two rows of different lengths: left padding
    for name, make in GENERATORS.items():
        generate = make(model, tok, max_new_tokens=6, do_sample=False)
        first = generate(contexts)
        second = generate([c + new + enc(" more text") for c, new in zip(contexts, first)])  # turn 2: an observation
        print(name, first[0], second[0])  # both lines: [799, 276, 605, 727, 141, 589] [421, 509, 75, 351, 263, 738]
