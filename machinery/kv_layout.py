"""Where the cb engine (machinery/engine.py, CBGenerator) keeps its running rows' KV while it
decodes, and the decode step over it. Two layouts, one interface (admit, kept, leave, decode,
close), so the engine's loop is the same over both:

  DynamicLayout (eager, any device; the default off CUDA): one transformers DynamicCache
    [n, H, W, Dh] per layer, each row compact and right-aligned (its left padding masked), as wide
    as its widest row; a row that leaves takes its columns with it, so shapes change every step.
  StaticLayout (the default on CUDA): fixed slots of a fixed width C, a row's KV in its
    slot's first columns, a position per row and a length mask, so that a decode step has the same
    shapes every time: it is captured once per slot count (a power of two) as a CUDA graph and
    replayed (`graphs=True`), or run eagerly (the CPU, where the tests check it against hf).

Both give the decode step's logits of hf's cache up to float rounding (the static step attends over
masked columns too). Shapes: n running rows, H KV heads, W/C cache columns, Dh head size, V vocab.
"""

import contextlib

import torch


def left_pad(tensors: list, width: int, dim: int, value=0):
    """Pad each tensor on the left of `dim` to `width` with `value` and concatenate them along dim
    0."""
    return torch.cat([torch.cat([t.new_full((*t.shape[:dim], width - t.shape[dim],
                                             *t.shape[dim + 1:]), value), t], dim)
                      for t in tensors])


def roomy_layer(room: int):
    """A KV cache layer for `cb`: transformers' DynamicLayer, whose keys and values [n, H, W, Dh]
    are the first W columns of a buffer with `room` more: update() writes a step's column in place
    where DynamicLayer copies the whole cache (torch.cat) at every step; full, it moves to a new
    buffer. cb never batch-selects or crops a cache. cb's room, the steps its rows can still take,
    keeps a buffer within the widest context + max_new_tokens."""
    from transformers.cache_utils import DynamicLayer

    class RoomyLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            w, p = self.get_seq_length(), key_states.shape[-2]
            # a new buffer: the cached columns, the new, `room`
            if w == 0 or w + p > self.room_keys.shape[-2]:
                self.room_keys, self.room_values = (
                    x.new_empty(*x.shape[:2], w + p + room, x.shape[-1])
                    for x in (key_states, value_states)
                )
                if w:
                    self.room_keys[:, :, :w], self.room_values[:, :, :w] = self.keys, self.values
            self.room_keys[:, :, w:w + p] = key_states
            self.room_values[:, :, w:w + p] = value_states
            self.keys, self.values = self.room_keys[:, :, :w + p], self.room_values[:, :, :w + p]
            return self.keys, self.values

    return RoomyLayer()


def make_cache(config, kv, room=0):
    """A DynamicCache of kv ((K, V) [n, H, W, Dh] per layer; [] if empty), with `room`
    (`roomy_layer`). Raises ValueError (one line) for a model with sliding-window layers."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):  # NOTE(P35)
        raise ValueError("--generator cb needs full-attention layers (no sliding window): use "
                         "--generator hf")
    cache.layers = [roomy_layer(room) for _ in cache.layers]
    for layer, (keys, values) in zip(cache.layers, kv or []):
        layer.update(keys, values)
    return cache


def forward(model, ids, mask, pos, cache):
    """The new ids [n, P] after the cache's W positions (mask [n, W + P], or a ready 4D mask;
    position ids [n, P]) -> the last position's float32 logits [n, V], as hf's."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache,
                use_cache=True, logits_to_keep=1)
    return out.logits[:, -1].to(copy=True, dtype=torch.float32)


class DynamicLayout:
    """The running rows' KV as one left-padded DynamicCache (module docstring)."""

    def __init__(self, model, max_new_tokens: int):
        self.model, self.max_new_tokens, self.cache = model, max_new_tokens, None

    def _room(self, rows) -> int:
        """The most decode steps the rows can still take: the columns their cache can gain."""
        return max(self.max_new_tokens - len(r.new) for r in rows)

    def admit(self, run: list, new: list, kv: list):
        """Join the new rows' prefilled KV ([m, H, W', Dh] per layer, real ids right-aligned) to
        the running rows' cache, widened on the left (masked) only if a new row is longer."""
        if run:
            old = [(x.keys, x.values) for x in self.cache.layers]
            width = max(old[0][0].shape[2], kv[0][0].shape[2])
            kv = [(left_pad([k0, k1], width, 2), left_pad([v0, v1], width, 2))
                  for (k0, v0), (k1, v1) in zip(old, kv)]
        self.cache = make_cache(self.model.config, kv, self._room(run + new))

    def kept(self, i: int, n: int) -> list:
        """Running row i's last n cached columns, cloned: [(K, V) [1, H, n, Dh]] per layer."""
        return [(x.keys[i:i + 1, :, -n:].clone(), x.values[i:i + 1, :, -n:].clone())
                for x in self.cache.layers]

    def leave(self, run: list, keep: list) -> list:
        """Only the rows at `keep` go on (in that order), and the columns only the others used
        go too. Returns the new order: `keep`."""
        rows = [run[i] for i in keep]
        if not rows:
            self.cache = None
            return keep
        index = torch.tensor(keep, device=self.cache.layers[0].keys.device, dtype=torch.long)
        width = max(r.cached() for r in rows)
        self.cache = make_cache(self.model.config,
                                [(x.keys[index, :, -width:], x.values[index, :, -width:])
                                 for x in self.cache.layers], self._room(rows))
        return keep

    def decode(self, last: torch.Tensor, run: list) -> torch.Tensor:
        """One decode step: each row's last id [n] at position = its count of cached ids, over the
        left-padded cache (mask [n, W + 1]) -> logits [n, V]."""
        n = torch.tensor([r.cached() for r in run], device=last.device)  # [n]
        width = self.cache.get_seq_length()
        mask = (torch.arange(width + 1, device=last.device) >= width - n[:, None]).long()
        return forward(self.model, last[:, None], mask, n[:, None], self.cache)

    def close(self):
        self.cache = None


class SlotCache:
    """What the model's attention layers see in a static decode step (their one call:
    `update(key_states, value_states, layer_idx, ...)`): update writes the step's new K/V
    [b, H, 1, Dh] of the first b slots at column lens[s] of each slot (one index_put per layer, no
    shape that changes) and returns those slots' whole buffers [b, H, C, Dh]; the step's mask hides
    every column past lens."""

    def __init__(self, keys: list, values: list, lens: torch.Tensor):
        self.keys, self.values, self.lens = keys, values, lens
        self.rows = torch.arange(len(lens), device=lens.device)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        b = key_states.shape[0]
        keys, values = self.keys[layer_idx][:b], self.values[layer_idx][:b]
        rows, at = self.rows[:b], self.lens[:b]
        keys[rows, :, at] = key_states[:, :, 0]
        values[rows, :, at] = value_states[:, :, 0]
        return keys, values


def bucket(n: int, slots: int) -> int:
    """The slot count a step of n rows runs at: the next power of two, at most `slots`."""
    return min(slots, 1 << max(0, n - 1).bit_length())


class StaticLayout:
    """Fixed slots of a fixed width (module docstring): slot s holds running row s (the rows stay
    compact: a row that leaves is replaced by the last one), its cached ids in columns
    [0, lens[s]). The buffers are allocated at the first admit (the prefill's dtype), grown (and the
    graphs recaptured) when a row needs more columns, and freed by close().

    graphs: capture each slot count's decode step as a CUDA graph on first use and replay it; a
    capture that fails prints one line (`warn`) and the layout decodes eagerly from then on. Not
    for FSDP-sharded models, whose weights move between forwards."""

    def __init__(self, model, slots: int, max_new_tokens: int, graphs: bool = False, warn=print):
        self.model, self.slots, self.max_new_tokens = model, slots, max_new_tokens
        self.graphs, self.warn = graphs, warn
        self.keys, self.capacity, self.graph, self.pool = None, 0, {}, None

    def _allocate(self, kv: list, capacity: int):
        """Buffers of `capacity` columns shaped and typed like the prefill's kv, the old columns
        copied over; the graphs, which read the old buffers, are dropped."""
        device = kv[0][0].device
        keys = [k.new_zeros(self.slots, k.shape[1], capacity, k.shape[3]) for k, _ in kv]
        values = [v.new_zeros(self.slots, v.shape[1], capacity, v.shape[3]) for _, v in kv]
        if self.keys is None:
            self.lens = torch.zeros(self.slots, dtype=torch.long, device=device)  # [slots]
            self.active = torch.zeros(self.slots, dtype=torch.long, device=device)  # 1: a row
            self.ids = torch.zeros(self.slots, 1, dtype=torch.long, device=device)  # [slots, 1]
            self.logits = None  # [slots, V] float32, at the first step
        else:
            for new, old in zip(keys + values, self.keys + self.values):
                new[:, :, :self.capacity] = old
        self.keys, self.values, self.capacity = keys, values, capacity
        self.cols = torch.arange(capacity, device=device)  # [C]
        self.cache = SlotCache(keys, values, self.lens)
        self.graph.clear()

    def admit(self, run: list, new: list, kv: list):
        """Copy each new row's prefilled KV (row i of kv, [m, H, W', Dh] per layer, its real ids
        the last len(context) columns) into the first free slots' first columns."""
        need = max(len(r.context) for r in new) + self.max_new_tokens
        if self.keys is None or need > self.capacity:
            self._allocate(kv, -(-max(need, self.capacity) // 256) * 256)
        width = kv[0][0].shape[2]
        for i, r in enumerate(new):
            s, n = len(run) + i, len(r.context)
            for layer, (k, v) in enumerate(kv):
                self.keys[layer][s, :, :n] = k[i, :, width - n:]
                self.values[layer][s, :, :n] = v[i, :, width - n:]
            self.lens[s], self.active[s] = n, 1

    def kept(self, i: int, n: int) -> list:
        """Slot i's first n columns, cloned: [(K, V) [1, H, n, Dh]] per layer."""
        return [(k[i:i + 1, :, :n].clone(), v[i:i + 1, :, :n].clone())
                for k, v in zip(self.keys, self.values)]

    def leave(self, run: list, keep: list) -> list:
        """Only the rows at `keep` go on: each slot of a row that left, below the new row count,
        takes the last rows that go on (their first cached columns copied). Returns the new order:
        the old index of the row each slot 0, 1, ... now holds."""
        n, kept = len(keep), set(keep)
        # NOTE(P35): the last rows fill the holes, so the rows' order changes
        holes = [s for s in range(n) if s not in kept]
        movers = [s for s in keep if s >= n]
        for dst, src in zip(holes, movers):
            width = run[src].cached()
            for k, v in zip(self.keys, self.values):
                k[dst, :, :width], v[dst, :, :width] = k[src, :, :width], v[src, :, :width]
            self.lens[dst] = self.lens[src]
        self.lens[n:len(run)], self.active[n:len(run)] = 0, 0
        order = dict(zip(holes, movers))
        return [order.get(s, s) for s in range(n)]

    def _step(self, b: int):
        """The decode step of slots [0, b): write each one's new K/V at column lens, attend to its
        columns [0, lens], logits into self.logits, lens + 1 where a row runs. Fixed shapes and
        addresses: what a CUDA graph captures."""
        lens = self.lens[:b]
        mask = (self.cols[None, :] <= lens[:, None])[:, None, None, :]  # [b, 1, 1, C], True: seen
        if self.model.config._attn_implementation == "eager":  # an additive mask there
            dtype = self.keys[0].dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(dtype).min)
        out = self.model(input_ids=self.ids[:b], attention_mask=mask, position_ids=lens[:, None],
                         cache=self.cache, use_cache=True, logits_to_keep=1)
        self.logits[:b] = out.logits[:, -1]
        self.lens[:b] += self.active[:b]

    def _capture(self, b: int):
        """Record slot count b's step as a CUDA graph (two eager warm-ups on a side stream first, as
        torch.cuda.graphs asks); the warm-ups' writes land in columns the next step writes again,
        and lens is restored. Autocast runs without its weight cache, which a graph cannot hold."""
        lens = self.lens.clone()
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        amp = (torch.autocast("cuda", dtype=dtype, cache_enabled=False) if dtype
               else contextlib.nullcontext())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), amp:
            for _ in range(2):
                self._step(b)
                self.lens.copy_(lens)
        torch.cuda.current_stream().wait_stream(stream)
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), amp:
            self._step(b)
        self.lens.copy_(lens)
        return graph

    def _checked(self, b: int, graph):
        """`graph` if one replay gives the eager step's logits (within 1e-2: the same kernels give
        the same floats), else RuntimeError: a graph that read a stale buffer would decode garbage
        silently. Both write the same K/V at column lens, which the step then writes again; lens is
        restored."""
        lens = self.lens.clone()
        self._step(b)
        eager = self.logits[:b].clone()
        self.lens.copy_(lens)
        graph.replay()
        self.lens.copy_(lens)
        if not torch.allclose(self.logits[:b], eager, rtol=1e-2, atol=1e-2):
            worst = (self.logits[:b] - eager).abs().max().item()
            raise RuntimeError(f"its replay's logits differ from the eager step's by up to "
                               f"{worst:.3g}")
        return graph

    def decode(self, last: torch.Tensor, run: list) -> torch.Tensor:
        """One decode step of the rows in slots [0, n): their last ids [n] -> logits [n, V]."""
        n = len(run)
        b = bucket(n, self.slots)
        self.ids[:n, 0] = last
        if self.logits is None:
            self.logits = torch.zeros(self.slots, self.model.config.vocab_size,
                                      device=last.device, dtype=torch.float32)
        if self.graphs and b not in self.graph:
            try:
                self.graph[b] = self._checked(b, self._capture(b))
            except Exception as err:  # noqa: BLE001: any capture failure falls back, said once
                self.graphs = False
                self.warn(f"note: CUDA graph capture of the decode step failed "
                          f"({type(err).__name__}: {str(err)[:200]}); decoding eagerly over the "
                          "static layout")
        if self.graphs:
            self.graph[b].replay()
        else:
            self._step(b)
        return self.logits[:n].clone()

    def close(self):
        """Free the buffers and the graphs (the update after a rollout needs the memory)."""
        self.keys = self.values = self.cache = self.logits = None
        self.capacity, self.pool = 0, None
        self.graph.clear()
