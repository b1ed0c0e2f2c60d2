"""Tests for engine.py. hf_generator (--generator hf): the ids that end a turn, ids beyond the tokenizer never
sampled (P16), the checkpoint's generation_config ignored (P17). kv_generator (--generator hf-kv) and CBGenerator
(--generator cb, the default) against it: the same Episodes under greedy decoding (tests' tiny model: every turn is an
invalid action, so 4 turns with the invalid-action message appended; an EOS bias and forced tags make rows stop at
different steps, on EOS, on a stop string or at max_new_tokens, so dropped tails and padding leave holes in hf-kv's
kept cache, and cb's slots are refilled with 3 slots for 6 rows); the same sampled ids under one seed while the rows
fit one call (hf-kv; the search world's warm-start policy, which searches); cb's sampled ids are the ones it fed back
to the model, inside the top-p nucleus, with the policy's expected log-likelihood (P7); a later turn of cb prefills
only what a row lacks, and a tail cut off the last turn is dropped; the flag's bad values are one line."""

import copy
import functools
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "lab")]

import evaluate  # noqa: E402
from machinery.engine import GENERATORS, _processors, CBGenerator, hf_generator, kv_generator  # noqa: E402
from rollout import STOP_STRINGS, make_prompt, rollout  # noqa: E402
from conftest import Q1, Q2, FakeRetriever, enc  # noqa: E402
from conftest import scripted_rollout as run  # noqa: E402
from tiny import build_model, build_tokenizer  # noqa: E402
from train import parse_args  # noqa: E402

WARM_START = ROOT / "lab" / "world0_policy"
# cb over its static KV layout (fixed slots, a length mask: what a CUDA graph captures), eager here
ENGINES = {**GENERATORS, "cb-static": functools.partial(CBGenerator, decode="static")}
QUESTIONS = [{"question": q, "golden_answers": ["x"]} for q in ("Where was Alda born", "Who is Bo", "What is it")]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return build_model(tok, seed=0), tok


def no_search(queries, topk):
    raise AssertionError("the tiny model never writes a valid <search>")


def fields(e):
    return (e.response_ids, e.loss_mask, e.answer_mask, e.num_turns, e.ended_on_eos, e.num_valid_actions)


def eos_bias(tok, bias, tags=0.0):
    """A logits processor that reads the scores and the last two ids only (hf-kv's input_ids hold its kept cache's
    holes further back): EOS gets `bias`; with tags > 0, '<' gets `tags` and, once written, is forced on to '</',
    then 'search' or 'answer' (the model's choice), then '>': a stop string."""
    lt, sl, gt, search, answer = (tok.convert_tokens_to_ids(t) for t in ("<", "/", ">", "search", "answer"))

    def add(input_ids, scores):
        last, prev = input_ids[:, -1], input_ids[:, -2]
        scores[:, tok.eos_token_id] += bias
        if tags:
            scores[:, lt] += tags
            scores[last == lt, sl] += 100.0
            scores[((last == sl) & (prev == lt)).nonzero()[:, 0, None], torch.tensor([search, answer])] += 100.0
            scores[((last == search) | (last == answer)) & (prev == sl), gt] += 100.0
        return scores
    return [add]


@pytest.mark.parametrize("batch_size", [64, 3])
@pytest.mark.parametrize("bias, tags", [(0.0, 0.0), (0.3, 0.0), (0.1, 0.15)])  # bias > 0: rows end at different steps
def test_greedy_episodes_are_the_same(tiny, batch_size, bias, tags):
    model, tok = tiny
    eps = {}
    for name, make in ENGINES.items():
        generate = make(model, tok, stop_strings=STOP_STRINGS, max_new_tokens=24, do_sample=False,
                        batch_size=batch_size, logits_processor=eos_bias(tok, bias, tags))
        eps[name] = rollout(generate, tok, QUESTIONS, no_search, group_size=2, max_turns=3, max_obs_tokens=64)
    for name in ENGINES:
        assert [fields(e) for e in eps[name]] == [fields(e) for e in eps["hf"]], name
    lengths = {len(e.response_ids) for e in eps["hf"]}
    assert max(e.num_turns for e in eps["hf"]) == 4 and (bias == 0 or len(lengths) > 1)  # holes when bias > 0
    if tags:  # turns ended on each of the three: a stop string, EOS, max_new_tokens
        actions = [tok.decode(a) for e in eps["hf"] for a in actions_of(e)]
        assert any(a.endswith(("</search>", "</answer>")) for a in actions) and any(e.ended_on_eos for e in eps["hf"])
        assert any(len(a) == 24 for e in eps["hf"] for a in actions_of(e))


def actions_of(e):
    """The model's actions of an Episode: its runs of loss_mask 1, as lists of ids."""
    out = [[]]
    for t, m in zip(e.response_ids, e.loss_mask):
        if m:
            out[-1].append(t)
        elif out[-1]:
            out.append([])
    return [a for a in out if a]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The search world's warm-start policy (it searches: observations of different lengths per row), its BM25
    search and 6 test questions: (model, tok, rows, search)."""
    import search_world
    from retriever import BM25Retriever
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = search_world.write_world(search_world.make_world(seed=0), tmp_path_factory.mktemp("world"))
    search = BM25Retriever.from_jsonl(str(paths["corpus"])).search
    rows = evaluate.load_questions(str(paths["test"]))[:6]
    tok = AutoTokenizer.from_pretrained(WARM_START)
    return AutoModelForCausalLM.from_pretrained(WARM_START).eval(), tok, rows, search


def test_sampled_ids_are_the_same_under_one_seed_in_one_call(world):
    """hf-kv: sampling at temperature 1, the rows in one call: the same random numbers, the same ids as hf."""
    model, tok, rows, search = world
    eps = {}
    for name in ("hf", "hf-kv"):
        torch.manual_seed(0)
        generate = GENERATORS[name](model, tok, stop_strings=STOP_STRINGS, max_new_tokens=48, top_p=0.95)
        eps[name] = rollout(generate, tok, rows, search, group_size=3, max_turns=3, max_obs_tokens=96)
    assert [fields(e) + (e.num_searches,) for e in eps["hf"]] == [fields(e) + (e.num_searches,) for e in eps["hf-kv"]]
    assert sum(e.num_searches for e in eps["hf"]) >= 3  # later turns did run on the kept caches


def test_cb_greedy_searches_are_hfs_with_refilled_slots(world):
    """cb, greedy, 4 slots for 12 rows of a policy that searches (its ' know', of '<think> I know the answer.', is
    barred, so it takes its search branch) and answers after 1-3 turns: hf's Episodes."""
    model, tok, rows, search = world
    know = tok.encode(" know", add_special_tokens=False)

    def search_first(input_ids, scores):
        scores[:, know] -= 100.0
        return scores

    eps = {name: rollout(ENGINES[name](model, tok, stop_strings=STOP_STRINGS, max_new_tokens=48, do_sample=False,
                                       batch_size=4, logits_processor=[search_first]), tok, rows, search, group_size=2,
                         max_turns=3, max_obs_tokens=96) for name in ("hf", "cb", "cb-static")}
    for name in ("cb", "cb-static"):
        assert [fields(e) + (e.num_searches,) for e in eps["hf"]] == [fields(e) + (e.num_searches,) for e in eps[name]]
    assert sum(e.num_searches for e in eps["hf"]) >= 6 and len({e.num_turns for e in eps["hf"]}) > 1


@pytest.mark.parametrize("engine", [kv_generator, CBGenerator, ENGINES["cb-static"]])
def test_kept_caches_are_freed_when_the_rollout_ends(tiny, engine):
    model, tok = tiny
    generate = engine(model, tok, stop_strings=STOP_STRINGS, max_new_tokens=8, do_sample=False)
    first = generate([tok.encode("Hi there", add_special_tokens=False)])
    assert generate([tok.encode("Hi there", add_special_tokens=False) + first[0] + [5]])  # a later turn: kept
    rollout(generate, tok, QUESTIONS[:1], no_search, group_size=1, max_turns=1, max_obs_tokens=64)
    again = generate([tok.encode("Hi there", add_special_tokens=False)])  # same context again: a fresh call, same ids
    assert again == first


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_cb_later_turns_prefill_only_new_ids_and_drop_a_cut_tail(tiny, decode):
    """Turn 2 keeps 2, 5 and all 8 of turn 1's ids before an observation: cb feeds only the uncached ids (the cut
    tail's KV is dropped) and its greedy ids and every step's logits equal hf's, which re-prefills every context
    (logits up to float32 rounding: ids alone can miss a kept KV off by one position)."""
    model, tok = tiny
    fed, seen = [], {"hf": {}, "cb": {}}

    def recorder(name):  # logits processor: each row's scores [V] by its ids (left padding stripped)
        def record(input_ids, scores):
            for ids, row in zip(input_ids.tolist(), scores):
                while ids and ids[0] == tok.pad_token_id:
                    ids.pop(0)
                seen[name][tuple(ids)] = row.clone()
            return scores
        return record

    forward = model.forward
    model.forward = lambda *a, **kw: fed.append(kw["input_ids"].shape[1]) or forward(*a, **kw)
    try:
        cb = CBGenerator(model, tok, stop_strings=STOP_STRINGS, max_new_tokens=8, do_sample=False, batch_size=3,
                         logits_processor=[recorder("cb")], decode=decode)
        first = [enc(tok, q) for q in ("Where was Alda born?", "Who is Bo?", "What is it?")]
        new = cb(first)
        assert [len(n) for n in new] == [8, 8, 8]
        second = [c + n[:k] + enc(tok, " obs") for c, n, k in zip(first, new, (2, 5, 8))]
        fed.clear()
        seen["cb"].clear()
        hf = hf_generator(model, tok, stop_strings=STOP_STRINGS, max_new_tokens=8, do_sample=False,
                          logits_processor=[recorder("hf")])
        assert cb(second) == hf(second)
    finally:
        model.forward = forward
    assert seen["cb"].keys() == seen["hf"].keys()
    torch.testing.assert_close(torch.stack([seen["cb"][k] for k in seen["hf"]]), torch.stack(list(seen["hf"].values())),
                               rtol=1e-4, atol=1e-4)  # float32 logits of a 64-wide model: rounding is ~1e-6
    assert len(fed) > 1 and fed[0] <= 1 + len(enc(tok, " obs"))  # the prefill: at most the last id and " obs" a row


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_p7_cb_sampled_ids_are_the_ids_it_fed_back_and_follow_the_policy(tiny, decode):
    """Sampling (T 0.7, top-p 0.5) with 3 slots for 8 rows: every returned id was appended to its row's ids as the
    logits processors saw them, lies inside the top-p nucleus of the policy's recomputed logits (a slack of 1e-3 on
    p, for float rounding) and, summed over the ids, log p(id) matches its expectation -H within 4 standard
    deviations (a wrong cache, position or temperature would move it)."""
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # peaked, context-dependent distributions: a wrong context is seen
    seen = set()

    def record(input_ids, scores):
        seen.update(tuple(row) for row in input_ids.tolist())
        return scores

    torch.manual_seed(0)
    cb = CBGenerator(model, tok, stop_strings=STOP_STRINGS, max_new_tokens=24, temperature=0.7, top_p=0.5,
                     batch_size=3, logits_processor=[record], decode=decode)
    contexts = [enc(tok, q) for q in ("Where was Alda born?", "Who is Bo?", "What is it?", "Hi")] * 2
    new = cb(contexts)
    from transformers import GenerationConfig

    check = _processors(GenerationConfig(do_sample=True, temperature=0.7, top_p=0.501,
                                         suppress_tokens=list(range(len(tok), len(tok) + 16))), None, "cpu")
    total = mean = var = 0.0
    for c, n in zip(contexts, new):
        row = c + n
        assert any(s[-len(row) + 1:] == tuple(row[:-1]) for s in seen if len(s) >= len(row) - 1)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([row])).logits[0, len(c) - 1:-1].float()  # [24, V]
        logp = torch.log_softmax(check(torch.tensor([row] * len(n)), logits), dim=-1)  # [24, V]
        p = logp.exp()
        sampled = logp[torch.arange(len(n)), torch.tensor(n)]  # [24]
        assert torch.isfinite(sampled).all()  # inside the nucleus
        ent = -(p * logp.nan_to_num(neginf=0.0)).sum(-1)  # [24]
        total += sampled.sum().item()
        mean -= ent.sum().item()
        var += ((p * logp.nan_to_num(neginf=0.0) ** 2).sum(-1) - ent ** 2).sum().item()
    assert abs(total - mean) < 4 * var ** 0.5, (total, mean, var ** 0.5)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])  # a boolean mask there, an additive one here
def test_static_layout_keeps_rows_compact_and_grows_its_columns(tiny, attention):
    """StaticLayout (--decode static; what --decode graph captures): rows that leave are replaced by the last rows that
    go on, their cached columns copied with them; a later call whose contexts need more columns than the slots hold
    grows them (the old columns kept); every step's logits are the dynamic layout's up to float32 rounding; close()
    (reset, at a rollout's end) frees the buffers."""
    from machinery.kv_layout import StaticLayout, bucket

    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    model.set_attn_implementation(attention)
    assert model.config._attn_implementation == attention
    assert [bucket(n, 6) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 4, 6, 6]  # power-of-two slot counts, <= slots
    logits = {}

    def recorder(name):
        def record(input_ids, scores):
            for ids, row in zip(input_ids.tolist(), scores):
                logits.setdefault(name, {})[tuple(i for i in ids if i != tok.pad_token_id)] = row.clone()
            return scores
        return record

    short = [enc(tok, q) for q in ("Where was Alda born?", "Who is Bo?", "What is it?", "Hi", "Tell me", "a b")]
    long = [c + enc(tok, " word") * 150 for c in short[:3]]  # > 256 ids: more columns than the first call's
    out = {}
    for decode in ("dynamic", "static"):
        cb = CBGenerator(model, tok, stop_strings=STOP_STRINGS, max_new_tokens=10, do_sample=False, batch_size=4,
                         logits_processor=eos_bias(tok, 0.2) + [recorder(decode)], decode=decode)
        out[decode] = cb(short), cb(long)
        if decode == "static":
            layout = cb.layout
            assert isinstance(layout, StaticLayout) and layout.capacity >= max(map(len, long)) + 10 > 256
            cb.reset()
            assert cb.layout is None and layout.keys is None
    assert out["static"] == out["dynamic"]
    assert len({len(n) for n in out["static"][0]}) > 1  # rows left at different steps: slots were refilled
    assert logits["static"].keys() == logits["dynamic"].keys()
    torch.testing.assert_close(torch.stack(list(logits["static"].values())),
                               torch.stack([logits["dynamic"][k] for k in logits["static"]]), rtol=1e-4, atol=1e-4)


def test_static_layout_leave_fills_each_hole_with_a_row_that_goes_on():
    from machinery.kv_layout import StaticLayout

    class Row:
        def __init__(self, n):
            self.n = n

        def cached(self):
            return self.n

    layout = StaticLayout(model=None, slots=6, max_new_tokens=4)
    layout.keys = [torch.arange(6.0)[:, None, None, None].expand(6, 1, 8, 2).clone()]  # slot s: all s
    layout.values = [k.clone() for k in layout.keys]
    layout.lens, layout.active = torch.tensor([3, 4, 5, 6, 7, 8]), torch.ones(6, dtype=torch.long)
    run = [Row(n) for n in (3, 4, 5, 6, 7, 8)]
    order = layout.leave(run, keep=[0, 2, 4, 5])  # rows 1 and 3 stop: slots 1, 3 take rows 4, 5
    assert order == [0, 4, 2, 5]
    assert layout.lens.tolist() == [3, 7, 5, 8, 0, 0] and layout.active.tolist() == [1, 1, 1, 1, 0, 0]
    k = layout.keys[0][:, 0, :, 0]  # [slots, C]
    assert k[1, :7].eq(4).all() and k[1, 7:].eq(1).all()  # row 4's 7 cached columns; beyond them, never read
    assert k[3, :8].eq(5).all() and k[0].eq(0).all() and k[2].eq(2).all()


@pytest.mark.parametrize("capture", ["faithful", "stale", "fails"])
def test_graph_replays_are_checked_against_the_eager_step(tiny, monkeypatch, capture):
    """--decode graph's bookkeeping without a GPU: StaticLayout._capture replaced by a stand-in whose replay runs the
    step (faithful), writes wrong logits (stale: a graph that read an old buffer) or that raises. A faithful graph is
    kept and replayed; a stale one fails its check against the eager step, and a failed capture falls back: one note
    each, then the eager step; the ids stay the dynamic layout's in all three."""
    from machinery.kv_layout import StaticLayout

    class Replay:
        def __init__(self, layout, b):
            self.layout, self.b = layout, b

        def replay(self):
            if capture == "stale":
                self.layout.logits[:self.b] = 0.0
            else:
                self.layout._step(self.b)

    def fake_capture(layout, b):
        if capture == "fails":
            raise RuntimeError("operation not permitted when stream is capturing")
        return Replay(layout, b)

    monkeypatch.setattr(StaticLayout, "_capture", fake_capture)
    model, tok = tiny
    kw = dict(stop_strings=STOP_STRINGS, max_new_tokens=10, do_sample=False, batch_size=4,
              logits_processor=eos_bias(tok, 0.2))
    contexts = [enc(tok, q) for q in ("Where was Alda born?", "Who is Bo?", "What is it?", "Hi", "Tell me")]
    want = CBGenerator(model, tok, decode="dynamic", **kw)(contexts)
    cb, notes = CBGenerator(model, tok, decode="static", **kw), []
    cb.layout = StaticLayout(model, 4, 10, graphs=True, warn=notes.append)
    assert cb(contexts) == want
    if capture == "faithful":
        assert not notes and cb.layout.graphs and 4 in set(cb.layout.graph) <= {1, 2, 4}  # a graph per slot count
    else:
        assert len(notes) == 1 and notes[0].endswith("decoding eagerly over the static layout"), notes
        assert not cb.layout.graphs and ("differ from the eager step's" in notes[0]) == (capture == "stale")


def test_decode_choices_are_checked(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="--decode must be one of auto, dynamic, static, graph, got 'fast'"):
        CBGenerator(model, tok, stop_strings=STOP_STRINGS, decode="fast")
    with pytest.raises(ValueError, match="--decode graph needs a CUDA device"):
        CBGenerator(model, tok, stop_strings=STOP_STRINGS, decode="graph")
    assert CBGenerator(model, tok, stop_strings=STOP_STRINGS).decode == "dynamic"  # auto, off CUDA


@pytest.mark.parametrize("do_sample", [True, False])
def test_cb_processes_logits_as_hf_generate(tok, model, do_sample):
    """cb's processors (engine._processors) give hf generate's scores, bit for bit, for a checkpoint whose
    generation_config asks for more (Qwen's top_k=20, repetition_penalty=1.05: ignored by both, P17)."""
    m = copy.deepcopy(model)
    m.generation_config.top_k, m.generation_config.repetition_penalty = 20, 1.05
    extra = eos_bias(tok, 0.5)
    gen_cfg = hf_generator(m, tok, stop_strings=STOP_STRINGS, temperature=0.7, top_p=0.9, do_sample=do_sample).gen_cfg
    hf = m._get_logits_processor(m._prepare_generation_config(gen_cfg)[0], input_ids_seq_length=5,
                                 logits_processor=extra, device="cpu")
    g = torch.Generator().manual_seed(0)
    ids, scores = torch.randint(0, len(tok), (3, 5), generator=g), torch.randn(3, len(tok) + 16, generator=g)
    ours = _processors(gen_cfg, extra, "cpu")(ids, scores.clone())
    assert torch.equal(ours, hf(ids, scores.clone()))  # exact: the same processors on the same scores


def test_bad_generator_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--generator", "vllm"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("error: --generator must be one of ('hf', 'hf-kv', 'cb'), got 'vllm'"), err
    with pytest.raises(SystemExit):
        evaluate.main(["--model", "x", "--data", "x.jsonl", "--generator", "vllm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "invalid choice: 'vllm'" in err[-1] and "--generator" in err[-1], err
    assert parse_args(["--generator", "hf-kv"]).generator == "hf-kv"


# ----------------------------------------------------------------------------------------------------------------------
# hf_generator: one GenerationConfig keeps P16, P17 and P30 (the tests' scripted policy: test_rollout.py)


def test_hf_generator_stops_on_the_models_and_the_tokenizers_eos(tok, model):
    m = copy.deepcopy(model)
    m.generation_config.eos_token_id = [7, 9]  # e.g. Qwen2.5-Instruct: <|im_end|> and <|endoftext|>
    assert hf_generator(m, tok, stop_strings=STOP_STRINGS).eos_ids == {7, 9, tok.eos_token_id}
    m.generation_config.eos_token_id = None
    assert hf_generator(m, tok, stop_strings=STOP_STRINGS).eos_ids == {tok.eos_token_id}



# ----------------------------------------------------------------------------------------------------------------------
# P16: ids the tokenizer does not have are never sampled


@pytest.mark.parametrize("engine", [hf_generator, CBGenerator, ENGINES["cb-static"]])
def test_p16_no_out_of_tokenizer_ids(tok, model, engine):
    n_tok = len(tok)
    vocab = model.get_output_embeddings().weight.shape[0]
    assert vocab == n_tok + 16
    # Control: the same unscripted model, sampling without the mask, does emit ids >= len(tok) (so the test has teeth).
    torch.manual_seed(0)
    prompt = torch.tensor([enc(tok, make_prompt(Q1, tok))] * 8)
    raw = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0,
                         top_p=1.0, top_k=0, max_new_tokens=48, eos_token_id=None, pad_token_id=tok.pad_token_id)
    assert (raw[:, prompt.shape[1]:] >= n_tok).any()

    torch.manual_seed(0)
    rows = [{"question": q, "golden_answers": ["Paris"]} for q in (Q1, Q2)]
    eps = rollout(engine(model, tok, stop_strings=STOP_STRINGS, max_new_tokens=48, temperature=1.0, top_p=1.0), tok,
                  rows, FakeRetriever(), group_size=8, max_turns=1)
    sampled = [t for e in eps for t, m in zip(e.response_ids, e.loss_mask) if m == 1]
    assert len(sampled) > 500
    assert max(sampled) < n_tok
    assert all(len(e.answer_mask) == len(e.loss_mask) == len(e.response_ids) for e in eps)



# ----------------------------------------------------------------------------------------------------------------------
# P17: the checkpoint's generation_config does not change sampling


def test_p17_checkpoint_generation_config_ignored(tok, model):
    m = copy.deepcopy(model)
    gc = m.generation_config
    gc.top_k, gc.repetition_penalty, gc.temperature, gc.top_p, gc.do_sample = 20, 1.05, 0.7, 0.8, True  # Qwen's
    captured = []
    generate = m.generate

    def spy_generate(*args, **kw):
        captured.append(m._prepare_generation_config(kw["generation_config"])[0])
        return generate(*args, **kw)

    m.generate = spy_generate
    a = enc(tok, "<answer> Paris </answer>")
    run(m, tok, {Q1: [a]}, {Q1: ["Paris"]}, max_turns=0, temperature=1.0, top_p=0.95)
    (cfg,) = captured
    assert cfg.do_sample and cfg.temperature == 1.0 and cfg.top_p == 0.95  # exact: settings passed on
    assert cfg.top_k in (0, None) and cfg.repetition_penalty in (1.0, None)  # exact: settings


def test_decoding_on_cuda_leaves_out_cudnn_attention_and_restores_it():
    """The GPU check found cuDNN's sdpa at 55% of a decode step's CPU time (a graph per cache width): the engines
    decode on CUDA with sdpa's other backends; the flags come back on exit, and a CPU context changes nothing."""
    from machinery.engine import decode_attention

    flags = (torch.backends.cuda.cudnn_sdp_enabled, torch.backends.cuda.flash_sdp_enabled,
             torch.backends.cuda.mem_efficient_sdp_enabled, torch.backends.cuda.math_sdp_enabled)
    before = [f() for f in flags]
    with decode_attention("cuda:0"):
        assert [f() for f in flags] == [False, True, True, True]
    assert [f() for f in flags] == before
    with decode_attention(torch.device("cpu")):
        assert [f() for f in flags] == before
