"""Decoding engines for rollout's `generate(contexts) -> new ids` seam, chosen by
train.py/evaluate.py `--generator`.

Each samples a turn y ~ pi_theta(. | context) token by token from softmax(logits / temperature), cut
to the top_p nucleus, until the first EOS, </search> or </answer>; all three keep P16, P17 and P30
(docs/departures.md: ids beyond the tokenizer never sampled, a turn stops at its first tag, sampling
by temperature and top_p only).
  `hf` (`hf_generator`): Hugging Face's `model.generate` with one GenerationConfig; it
    re-prefills each row's whole context (prompt + all earlier actions and observations) every
    turn, and a call decodes until its longest row stops: stopped rows keep their slot as padding.
  `hf-kv` (`kv_generator`): the same calls, each call's KV cache (transformers' DynamicCache) of
    gen_batch_size rows kept from one turn to the next, so a turn feeds only what the row does not
    have cached.
  `cb` (`CBGenerator`, the default): our own decode loop over at most gen_batch_size slots
    (continuous batching): a row that stops leaves its slot at once and the next waiting row is
    prefilled into it; KV is kept across turns.
hf-kv and cb sample from hf's distribution and keep a turn's ids as hf does; where they depart from
it (which rows share a forward pass, what memory they hold): docs/departures.md, P34-P35. Figures:
docs/scaling.md ("Generation engines"). Run `python -m machinery.engine` for a demo: greedy turns of
a tiny random model, the three engines, the same ids.
"""

import collections
import contextlib

import torch
from transformers import GenerationConfig

from machinery.kv_layout import DynamicLayout, StaticLayout, forward, left_pad, make_cache


def hf_generator(model, tokenizer, *, stop_strings: tuple[str, ...], max_new_tokens: int = 500,
                 temperature: float = 1.0, top_p: float = 0.95, do_sample: bool = True,
                 batch_size: int = 64,
                 logits_processor=None):
    """The Hugging Face engine for `rollout`: batched, KV-cached `model.generate` over left-padded
    contexts.

    stop_strings: a turn ends at the first of them, kept in the turn (rollout.STOP_STRINGS,
    P30). max_new_tokens: per generation turn (500 in the paper). temperature/top_p:
    sampling (paper code 1.0 / 0.95), and nothing else (P17); do_sample=False is greedy
    (evaluation). batch_size: rows per generate call (memory). logits_processor: extra processors
    (tests script the policy with one). Stops at the first EOS (the model's generation_config EOS
    ids and the tokenizer's) or stop string (P30); ids beyond the tokenizer are never
    sampled (P16).

    Returns generate(contexts: [N] lists of token ids) -> [N] lists of new ids, with
    generate.eos_ids (a frozenset). A row that stopped early is padded to the longest row of its
    call; `cut_turn` drops the padding.
    """
    eos_ids = model.generation_config.eos_token_id
    eos_ids = set(
        eos_ids if isinstance(eos_ids, list) else [eos_ids] if eos_ids is not None else []
    )
    eos_ids.add(tokenizer.eos_token_id)
    pad, vocab = tokenizer.pad_token_id, model.get_output_embeddings().weight.shape[0]
    gen_cfg = GenerationConfig(  # NOTE(P17): temperature and top_p only
        max_new_tokens=max_new_tokens, do_sample=do_sample,
        temperature=temperature if do_sample else None,
        top_p=top_p if do_sample else None, top_k=0 if do_sample else None, repetition_penalty=1.0,
        # NOTE(P30)
        eos_token_id=sorted(eos_ids), pad_token_id=pad, stop_strings=list(stop_strings),
        suppress_tokens=list(range(len(tokenizer), vocab)) or None,  # NOTE(P16)
    )

    def generate(contexts: list[list[int]]) -> list[list[int]]:
        device = next(model.parameters()).device
        out = []
        for i in range(0, len(contexts), batch_size):
            batch = contexts[i:i + batch_size]
            width = max(len(c) for c in batch)
            # [n, L] left-padded
            input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in batch])
            # NOTE(P9): mask by position, not `ids != pad`, which erases real EOS when pad
            # == eos (P9)
            # [n, L]
            attention_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in batch])
            with torch.no_grad(), decode_attention(device):
                ids = model.generate(input_ids=input_ids.to(device),
                                     attention_mask=attention_mask.to(device),
                                     generation_config=gen_cfg, tokenizer=tokenizer,
                                     logits_processor=logits_processor)
            out += ids[:, width:].tolist()  # [n, new]
        return out

    generate.eos_ids, generate.gen_cfg = frozenset(eos_ids), gen_cfg  # gen_cfg: kv_generator's too
    return generate


def _kept_prefix(tokens: list[int], mask: list[int], context: list[int]) -> tuple[int, int]:
    """How much of one cached row a new context reuses. tokens/mask: [W] a row's cached positions;
    context: the new context's ids. Returns (p, k): positions < p are kept (they hold context[:k],
    in order, with the padding between them), positions >= p get mask 0. At least one token is left
    to feed (k < len(context)), since generate needs a last position to predict from; p = -1 when
    the row's real tokens are not a prefix of the context at all."""
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
    """Whether `context` is a later turn of the row last given `prev`: rollout only appends (kept
    ids, then an observation or the invalid-action message), so a later context is strictly
    longer."""
    return len(context) > len(prev) and context[:len(prev)] == prev


def kv_generator(model, tokenizer, *, stop_strings: tuple[str, ...], max_new_tokens: int = 500,
                 temperature: float = 1.0, top_p: float = 0.95, do_sample: bool = True,
                 batch_size: int = 64,
                 logits_processor=None):
    """The `hf-kv` engine: hf_generator's `model.generate`, with each call's KV cache kept across
    turns. Arguments as hf_generator (same GenerationConfig: stop strings, EOS ids, suppressed ids,
    sampling). Returns generate(contexts: [N] lists of token ids) -> [N] lists of new ids (a row
    that stopped early is padded to its call's longest row: `cut_turn` drops it), with
    generate.eos_ids (a frozenset), and generate.reset() to drop the kept caches (rollout need not
    call it: a context that extends no kept row starts afresh).

    How a cached row is extended (n rows of a call, W cached positions, P the longest new piece):
    the cache holds W = sequences.shape[1] - 1 positions a row (the last sampled token has no KV
    yet), `tokens`, `mask` [n, W] say what. The row's cached real tokens that prefix its next
    context are kept; later positions (a tail `cut_turn` dropped, HF's padding after the row
    stopped) are masked to 0 and stay as holes; the rest of the context is left-padded to P and fed
    after position W. Position ids are HF's (the mask's cumsum), so the logits are the re-prefilled
    path's up to float rounding: greedy ids match exactly (tests/test_engine.py); sampled ids too
    while a turn's rows fit one call (a rounding difference at a top-p boundary can move one sample,
    not the distribution).
    """
    base = hf_generator(model, tokenizer, stop_strings=stop_strings, max_new_tokens=max_new_tokens,
                        temperature=temperature, top_p=top_p, do_sample=do_sample,
                        batch_size=batch_size,
                        logits_processor=logits_processor)
    gen_cfg, pad = base.gen_cfg, tokenizer.pad_token_id
    # per call: {"cache", "tokens": [n, W] list rows, "mask": [n, W] list rows, "contexts": [n]
    # lists}
    calls = []

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
        with torch.no_grad(), decode_attention(device):
            ids = model.generate(input_ids=torch.tensor(tokens, device=device),
                                 attention_mask=torch.tensor(mask, device=device), cache=cache,
                                 generation_config=gen_cfg, tokenizer=tokenizer,
                                 logits_processor=logits_processor)
        width = len(tokens[0])
        seq = ids.tolist()  # [n, width + new]
        # holds width + new - 1 positions: the last sampled token has no KV yet
        call["cache"] = cache
        call["tokens"] = [row[:-1] for row in seq]
        call["mask"] = [m + [1] * (len(seq[0]) - 1 - width) for m in mask]
        return [row[width:] for row in seq]

    def match(contexts):
        """(call, row) of each context, in order, or None if one extends no kept row (a new rollout
        starts)."""
        plan, ci, ri = [], 0, 0
        for c in contexts:
            while ci < len(calls) and (
                ri == len(calls[ci]["contexts"]) or not _extends(c, calls[ci]["contexts"][ri])
            ):
                # rows that finished
                ci, ri = (ci + 1, 0) if ri == len(calls[ci]["contexts"]) else (ci, ri + 1)
            if ci == len(calls):
                return None
            plan.append((ci, ri))
            ri += 1
        return plan

    def generate(contexts: list[list[int]]) -> list[list[int]]:
        plan = match(contexts)
        if plan is None:  # NOTE(P34): a context that extends no kept row
            return fresh(contexts)
        out, device = [None] * len(contexts), next(model.parameters()).device
        for ci, call in enumerate(calls):
            rows = [(j, r) for j, (cj, r) in enumerate(plan) if cj == ci]
            if not rows:  # every row of this call finished: free its cache
                call["cache"] = None
                continue
            # NOTE(P34): finished rows leave; never refilled
            if len(rows) < len(call["tokens"]):
                call["cache"].batch_select_indices(
                    torch.tensor([r for _, r in rows], device=device)
                )
            tokens, mask, tails = [], [], []
            for j, r in rows:
                p, k = _kept_prefix(call["tokens"][r], call["mask"][r], contexts[j])
                tokens.append(call["tokens"][r])
                # dropped tail: a masked hole
                mask.append(call["mask"][r][:p] + [0] * (len(call["mask"][r]) - p))
                tails.append(contexts[j][k:])
            width = max(len(x) for x in tails)
            tokens = [t + [pad] * (width - len(x)) + x for t, x in zip(tokens, tails)]  # [n, W + P]
            # [n, W + P]
            mask = [m + [0] * (width - len(x)) + [1] * len(x) for m, x in zip(mask, tails)]
            call["contexts"] = [contexts[j] for j, _ in rows]
            for (j, _), new in zip(rows, run(call, tokens, mask), strict=True):
                out[j] = new
        # NOTE(P34): the others stay
        calls[:] = [c for c in calls if c["cache"] is not None]
        return out

    generate.eos_ids = base.eos_ids
    generate.reset = calls.clear
    return generate


def _processors(gen_cfg, extra, device):
    """hf's logits processors for gen_cfg, in generate's order
    (GenerationMixin._get_logits_processor, transformers 5.24): ids beyond the tokenizer suppressed
    (P16), the caller's `extra`, then, when sampling, temperature (if != 1) and top_p (if <
    1) (P17). Returns a LogitsProcessorList: (ids [n, S], scores [n, V]) -> [n, V]."""
    from transformers import (LogitsProcessorList, SuppressTokensLogitsProcessor,
                              TemperatureLogitsWarper,
                              TopPLogitsWarper)

    procs = LogitsProcessorList()
    if gen_cfg.suppress_tokens:
        procs.append(SuppressTokensLogitsProcessor(gen_cfg.suppress_tokens, device=device))
    procs += extra or []
    if gen_cfg.do_sample and gen_cfg.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(gen_cfg.temperature))
    if gen_cfg.do_sample and gen_cfg.top_p < 1.0:
        procs.append(TopPLogitsWarper(gen_cfg.top_p))
    return procs


class _Row:
    """One context of a `cb` call: `context` [L] ids, `new` the ids sampled so far, `past` the kept
    KV of its first `k` ids ([(K, V)] per layer, each [1, H, k, Dh]; None when nothing is kept),
    `out` its index in the call."""

    def __init__(self, out: int, context: list[int]):
        self.out, self.context, self.new, self.past, self.k = out, context, [], None, 0

    def cached(self) -> int:  # ids whose KV the slot holds: all but the last sampled one
        return len(self.context) + len(self.new) - 1


class CBGenerator:
    """The `cb` engine: our own decode loop over at most `batch_size` slots; a row that stops leaves
    its slot at once and the next waiting row takes it (continuous batching); a row's KV is kept
    across turns while no waiting row needs its slot (P35), so a later turn prefills only
    its new tokens.

    Arguments as hf_generator; the logits processing is hf's (`_processors`), and a row stops where
    hf's would (its EosTokenCriteria and StopStringCriteria, or max_new_tokens), so greedy ids equal
    hf's (up to float rounding: tests/test_engine.py). An instance is the engine's generate:
    `engine(contexts: [N] lists of token ids)` -> [N] lists of new ids, each ending at its stop (no
    padding); `engine.eos_ids` (a frozenset); `engine.reset()` drops the kept KV (rollout calls it
    at the end). Raises ValueError (one line) for a model with sliding-window layers.

    decode: where the running rows' KV lives while they decode (machinery/kv_layout.py): "dynamic"
    (a left-padded DynamicCache, eager), "static" (fixed slots and a length mask, eager), "graph"
    (static, each slot count's step a CUDA graph; CUDA only), "auto" (the default: "graph" on
    CUDA, "dynamic" elsewhere; "static" for a model sharded by FSDP). Every layout gives the same
    ids up to float rounding (tests/test_engine.py). Raises ValueError for another value, or
    "graph" off CUDA.

    How a turn runs (shapes: n running rows <= batch_size, S ids, V vocab):
      * each running row's ids (context + sampled so far) are the last ones of `seq` [n, S], its
        KV in the layout;
      * a step: scores = hf's logits processors on (seq, logits [n, V]); sample (softmax +
        multinomial) or argmax (`_sample`); a row stops on hf's own criteria (EosTokenCriteria,
        StopStringCriteria) or max_new_tokens and leaves at once (`layout.leave`); the others
        decode one token at position = their count of cached ids (`layout.decode`);
      * free slots take the next waiting rows: one prefill of their uncached ids on their kept KV
        (`_prefill`), each row compacted (torch.gather), then joined to the layout
        (`layout.admit`).
    """

    def __init__(self, model, tokenizer, *, stop_strings: tuple[str, ...],
                 max_new_tokens: int = 500, temperature: float = 1.0, top_p: float = 0.95,
                 do_sample: bool = True, batch_size: int = 64, logits_processor=None,
                 decode: str = "auto"):
        from transformers import EosTokenCriteria, StopStringCriteria, StoppingCriteriaList

        base = hf_generator(model, tokenizer, stop_strings=stop_strings,
                            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            do_sample=do_sample, batch_size=batch_size,
                            logits_processor=logits_processor)
        self.model, self.max_new_tokens, self.do_sample = model, max_new_tokens, do_sample
        self.batch_size, self.logits_processor = batch_size, logits_processor
        self.gen_cfg, self.pad, self.eos_ids = base.gen_cfg, tokenizer.pad_token_id, base.eos_ids
        self.stops = StoppingCriteriaList([
            EosTokenCriteria(self.gen_cfg.eos_token_id),
            StopStringCriteria(tokenizer, self.gen_cfg.stop_strings)])
        # the last call's rows that kept their KV, in order: (context + first new id, ids whose KV
        # is held, KV)
        self.kept = []
        self.decode, self.layout = decode_layout(decode, model), None

    def _layout(self):
        """This call's KV layout: a fresh DynamicLayout, or the StaticLayout kept until reset()."""
        if self.decode == "dynamic":
            return DynamicLayout(self.model, self.max_new_tokens)
        if self.layout is None:
            self.layout = StaticLayout(self.model, self.batch_size, self.max_new_tokens,
                                       graphs=self.decode == "graph")
        return self.layout

    def reset(self):
        """Drop the KV kept for a later turn and the static layout's buffers and graphs (rollout
        calls it when its rollout ends: the update needs the memory)."""
        self.kept.clear()
        if self.layout is not None:
            self.layout.close()
            self.layout = None

    def _prefill(self, rows, device):
        """The rows' uncached ids on top of their kept KV (left-padded to Wp), themselves
        left-padded to P; then each row compacted so that its real positions are its last ones.
        Returns (logits [m, V], KV [m, H, W, Dh])."""
        tails = [r.context[r.k:] for r in rows]
        wp, p = max(r.k for r in rows), max(len(t) for t in tails)
        ref = next((r.past for r in rows if r.past), [])
        # a row with nothing kept: [1, H, 0, Dh]
        none = [(k[:, :, :0], v[:, :, :0]) for k, v in ref]
        cache = make_cache(
            self.model.config,
            [
                tuple(left_pad([(r.past or none)[i][j] for r in rows], wp, 2) for j in (0, 1))
                for i in range(len(ref))
            ]
        )  # [m, H, Wp, Dh] per layer
        ids = torch.tensor([[self.pad] * (p - len(t)) + t for t in tails], device=device)  # [m, P]
        mask = torch.tensor([[0] * (wp - r.k) + [1] * r.k + [0] * (p - len(t)) + [1] * len(t)
                             for r, t in zip(rows, tails)], device=device)  # [m, Wp + P]
        # [m, P]  HF's position ids: the mask's cumsum
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, wp:]
        logits = forward(self.model, ids, mask, pos, cache)
        width = max(len(r.context) for r in rows)
        idx = torch.tensor([[wp - r.k] * (width - len(r.context)) + list(range(wp - r.k, wp))
                            + list(range(wp + p - len(t), wp + p)) for r, t in zip(rows, tails)],
                           device=device)
        for r in rows:
            r.past = None  # the slot holds it now
        layer = cache.layers[0].keys
        idx = idx[:, None, :, None].expand(-1, layer.shape[1], -1, layer.shape[3])  # [m, H, W, Dh]
        return logits, [(x.keys.gather(2, idx), x.values.gather(2, idx)) for x in cache.layers]

    def _reuse(self, rows):
        """Give each context the kept KV of the row whose turn it extends (matched in order, as
        rollout keeps its rows, on the context and the first id sampled after it), cut to their
        longest common prefix, so that a tail cut_turn dropped is dropped here too. The rest of
        `kept` is freed."""
        prev, i = list(self.kept), 0
        self.kept.clear()
        for r in rows:
            j = next((j for j in range(i, len(prev)) if r.context[:len(prev[j][0])] == prev[j][0]),
                     None)
            if j is None:
                continue
            start, tokens, kv = prev[j]
            i, k = j + 1, len(start) - 1
            while k < min(len(tokens), len(r.context) - 1) and tokens[k] == r.context[k]:
                k += 1
            r.past, r.k = [(key[:, :, :k], value[:, :, :k]) for key, value in kv], k

    def _sample(self, procs, seq, logits):
        """The next id of each running row [n] from hf's processed scores [n, V] (sampled or
        argmax); returns (seq with it [n, S + 1], ids [n], stops [n] bool by hf's criteria)."""
        scores = procs(seq, logits)  # [n, V]; NOTE(P35): seq left-padded
        if self.do_sample:
            nxt = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)  # [n]
        else:
            nxt = torch.argmax(scores, dim=-1)  # [n]
        seq = torch.cat([seq, nxt[:, None]], dim=1)  # [n, S + 1]
        return seq, nxt, self.stops(seq, scores)

    def __call__(self, contexts: list[list[int]]) -> list[list[int]]:
        device = next(self.model.parameters()).device
        procs = _processors(self.gen_cfg, self.logits_processor, device)
        rows = [_Row(j, list(c)) for j, c in enumerate(contexts)]
        self._reuse(rows)
        # NOTE(P35): rows holding KV go first, so that no more than batch_size rows hold KV
        waiting = collections.deque(sorted(rows, key=lambda r: r.past is None))
        # running rows, their ids [n, S] and logits [n, V]; the KV kept for the next turn
        run, seq, logits, store, layout = [], None, None, {}, self._layout()
        with torch.no_grad(), decode_attention(device):
            while run or waiting:
                if waiting and len(run) < self.batch_size:  # free slots take the next rows
                    new = [waiting.popleft()
                           for _ in range(min(self.batch_size - len(run), len(waiting)))]
                    new_logits, kv = self._prefill(new, device)
                    layout.admit(run, new, kv)
                    seq = left_pad(([seq] if run else [])
                                   + [torch.tensor([r.context], device=device) for r in new],
                                   max(len(r.context) + len(r.new) for r in run + new), 1,
                                   self.pad)  # [n, S]
                    logits = torch.cat(([logits] if run else []) + [new_logits])  # [n, V]
                    run += new
                seq, nxt, stop = self._sample(procs, seq, logits)
                keep = []
                for i, (r, t, s) in enumerate(zip(run, nxt.tolist(), stop.tolist())):
                    r.new.append(t)
                    if not (s or len(r.new) == self.max_new_tokens):
                        keep.append(i)
                    elif not waiting:  # NOTE(P35): no row needs the slot, so its KV is kept
                        store[r.out] = (r.context + r.new[:1], r.context + r.new[:-1],
                                        layout.kept(i, r.cached()))  # [1, H, n, Dh] per layer
                if len(keep) < len(run):  # NOTE(P35): stopped rows leave at once
                    order = layout.leave(run, keep)
                    run = [run[i] for i in order]
                    width = max((r.cached() for r in run), default=0)
                    seq = seq[torch.tensor(order, device=device, dtype=torch.long),
                              -(width + 1):] if run else None
                if run:  # one decode step for the rows that go on
                    logits = layout.decode(seq[:, -1], run)
        # in the call's order, for `_reuse`
        self.kept[:] = [store[r.out] for r in rows if r.out in store]
        return [r.new for r in rows]


DECODE_LAYOUTS = ("auto", "dynamic", "static", "graph")  # train.py / evaluate.py --decode


def decode_option(generator: str, decode: str) -> dict:
    """The keyword --decode adds to GENERATORS[generator](...): cb's only."""
    return {"decode": decode} if generator == "cb" else {}


def decode_layout(decode: str, model) -> str:
    """CBGenerator's `decode` resolved for `model`'s device ("auto": "graph" on CUDA, "static" for
    an FSDP-sharded model there, "dynamic" elsewhere); ValueError (one line) for a bad value or
    "graph" off CUDA."""
    if decode not in DECODE_LAYOUTS:
        raise ValueError(f"--decode must be one of {', '.join(DECODE_LAYOUTS)}, got {decode!r}")
    cuda = next(model.parameters()).device.type == "cuda"
    sharded = any(type(m).__name__.startswith("FSDP") for m in model.modules())
    if decode == "graph" and not cuda:
        raise ValueError("--decode graph needs a CUDA device (static is the same layout, eager)")
    if decode == "auto":
        return ("static" if sharded else "graph") if cuda else "dynamic"
    return decode


# --generator's choices
GENERATORS = {"hf": hf_generator, "hf-kv": kv_generator, "cb": CBGenerator}


def decode_attention(device):
    """The engines' context around decoding: on CUDA, sdpa without its cuDNN backend, whose CPU cost
    per call (a cuDNN graph for each new cache width) was 55% of a decode step's CPU time on an H200
    (results/scaling/gpu_check.md); flash, memory-efficient or math instead, as sdpa picks. A null
    context elsewhere."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return (
        sdpa_kernel(backends) if torch.device(device).type == "cuda" else contextlib.nullcontext()
    )


@contextlib.contextmanager
def diverged_sampling(step: int):
    """Around a rollout: sampling from a policy whose logits overflowed fails inside
    torch.multinomial with a RuntimeError; say what it means instead (SystemExit, one line naming
    the training step)."""
    try:
        yield
    except RuntimeError as err:
        if "probability tensor contains" in str(err):
            raise SystemExit(f"error: step {step}: sampling met NaN/inf probabilities: the policy "
                             f"diverged (lower "
                             "--lr)") from None
        raise


# --------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(tok, seed=0)

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    # two rows of different lengths: left padding
    contexts = [enc("Question: where is the tower?"), enc("Hi")]
    for name, make in GENERATORS.items():  # greedy: the same ids from the three engines
        generate = make(model, tok, stop_strings=("</search>", "</answer>"), max_new_tokens=6,
                        do_sample=False)
        first = generate(contexts)
        # turn 2: an observation
        second = generate([c + new + enc(" more text") for c, new in zip(contexts, first)])
        # all lines: [799, 276, 605, 727, 141, 589] [421, 509, 75, 351, 263, 738]
        print(name, first[0], second[0])
