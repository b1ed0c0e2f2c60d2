"""Tests for engine.py. hf_generator (--generator hf): the ids that end a turn, ids beyond the tokenizer never
sampled (P16), the checkpoint's generation_config ignored (P17). kv_generator (--generator hf-kv) against it: the same
Episodes under greedy decoding (tests' tiny model: every turn is an invalid action, so 4 turns with the invalid-action
message appended; an EOS bias makes rows stop at different steps, so dropped tails and padding leave holes in the kept
cache), in one generate call and in calls of 3 rows; the same sampled ids under one seed while the rows fit one call
(the search world's warm-start policy, which searches); the flag's bad values are one line."""

import copy
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]

import evaluate  # noqa: E402
from engine import GENERATORS, hf_generator, kv_generator  # noqa: E402
from rollout import make_prompt, rollout  # noqa: E402
from test_rollout import Q1, Q2, FakeRetriever, enc, run  # noqa: E402
from tiny import build_model, build_tokenizer  # noqa: E402
from train import parse_args  # noqa: E402

WARM_START = ROOT / "tests" / "fixtures" / "world_guess_policy"
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


def eos_bias(tok, bias):
    """A logits processor that reads the scores only (never input_ids, which hold the kept cache's holes in hf-kv)."""
    def add(input_ids, scores):
        scores[:, tok.eos_token_id] += bias
        return scores
    return [add]


@pytest.mark.parametrize("batch_size", [64, 3])
@pytest.mark.parametrize("bias", [0.0, 0.1, 0.3])  # 0.1, 0.3: rows end at different steps
def test_greedy_episodes_are_the_same(tiny, batch_size, bias):
    model, tok = tiny
    eps = {}
    for name, make in GENERATORS.items():
        generate = make(model, tok, max_new_tokens=24, do_sample=False, batch_size=batch_size,
                        logits_processor=eos_bias(tok, bias))
        eps[name] = rollout(generate, tok, QUESTIONS, no_search, group_size=2, max_turns=3, max_obs_tokens=64)
    assert [fields(e) for e in eps["hf"]] == [fields(e) for e in eps["hf-kv"]]
    lengths = {len(e.response_ids) for e in eps["hf"]}
    assert max(e.num_turns for e in eps["hf"]) == 4 and (bias == 0 or len(lengths) > 1)  # holes when bias > 0


def test_sampled_ids_are_the_same_under_one_seed_in_one_call(tmp_path):
    """The warm-start policy searches: observations of different lengths per row; sampling at temperature 1."""
    import search_world
    from retriever import BM25Retriever
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = search_world.write_world(search_world.make_world(seed=0), tmp_path)
    search = BM25Retriever.from_jsonl(str(paths["corpus"])).search
    rows = evaluate.load_questions(str(paths["test"]))[:6]
    tok = AutoTokenizer.from_pretrained(WARM_START)
    model = AutoModelForCausalLM.from_pretrained(WARM_START).eval()
    eps = {}
    for name, make in GENERATORS.items():
        torch.manual_seed(0)
        eps[name] = rollout(make(model, tok, max_new_tokens=48, top_p=0.95), tok, rows, search, group_size=3,
                            max_turns=3, max_obs_tokens=96)
    assert [fields(e) + (e.num_searches,) for e in eps["hf"]] == [fields(e) + (e.num_searches,) for e in eps["hf-kv"]]
    assert sum(e.num_searches for e in eps["hf"]) >= 3  # later turns did run on the kept caches


def test_kept_caches_are_freed_when_the_rollout_ends(tiny):
    model, tok = tiny
    generate = kv_generator(model, tok, max_new_tokens=8, do_sample=False)
    first = generate([tok.encode("Hi there", add_special_tokens=False)])
    assert generate([tok.encode("Hi there", add_special_tokens=False) + first[0] + [5]])  # a later turn: kept
    rollout(generate, tok, QUESTIONS[:1], no_search, group_size=1, max_turns=1, max_obs_tokens=64)
    again = generate([tok.encode("Hi there", add_special_tokens=False)])  # same context again: a fresh call, same ids
    assert again == first


def test_bad_generator_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--generator", "vllm"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("error: --generator must be one of ('hf', 'hf-kv'), got 'vllm'"), err
    with pytest.raises(SystemExit):
        evaluate.main(["--model", "x", "--data", "x.jsonl", "--generator", "vllm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "invalid choice: 'vllm'" in err[-1] and "--generator" in err[-1], err
    assert parse_args(["--generator", "hf-kv"]).generator == "hf-kv"


# ----------------------------------------------------------------------------------------------------------------------
# hf_generator: one GenerationConfig keeps rollout.py's departures 6-8 (the tests' scripted policy: test_rollout.py)


def test_hf_generator_stops_on_the_models_and_the_tokenizers_eos(tok, model):
    m = copy.deepcopy(model)
    m.generation_config.eos_token_id = [7, 9]  # e.g. Qwen2.5-Instruct: <|im_end|> and <|endoftext|>
    assert hf_generator(m, tok).eos_ids == {7, 9, tok.eos_token_id}
    m.generation_config.eos_token_id = None
    assert hf_generator(m, tok).eos_ids == {tok.eos_token_id}



# ----------------------------------------------------------------------------------------------------------------------
# P16: ids the tokenizer does not have are never sampled


def test_p16_no_out_of_tokenizer_ids(tok, model):
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
    eps = rollout(hf_generator(model, tok, max_new_tokens=48, temperature=1.0, top_p=1.0), tok, rows,
                  FakeRetriever(), group_size=8, max_turns=1)
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
