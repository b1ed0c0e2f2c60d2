"""Quick checks of the tiny offline tokenizer/model fixture in tests/tiny.py."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny
from tiny import PROMPT_TEMPLATE, build_model, build_tokenizer, save_tiny

TAGS = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>"]
SAMPLE = (
    "<think> Who wrote Hamlet – the play? Café, résumé. </think>\n<search> Hamlet author </search>\n\n"
    "<information>Doc 1(Title: Hamlet) Hamlet is a tragedy by William Shakespeare, 1599–1601.</information>\n\n"
    "<answer> William Shakespeare </answer>"
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.mark.parametrize("text", [SAMPLE, "plain ascii: 12345 + x = y!", "é – ü 你好 🙂", "a  b\t\tc\n\n\nd", ""])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok(text, add_special_tokens=True)["input_ids"] == ids  # no BOS/EOS added, as in Qwen2.5


def test_special_tokens(tok):
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.bos_token is None
    assert set(tok.all_special_tokens) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]:
        assert len(tok.encode(t)) == 1
    assert 600 <= len(tok) <= 1000


def test_tags_are_ordinary_text(tok):
    special = set(tok.all_special_ids)
    for tag in TAGS:
        ids = tok.encode(tag)
        assert len(ids) > 1, tag
        assert not special.intersection(ids)
        assert tag not in tok.get_vocab()
    # skip_special_tokens must keep the tags
    assert tok.decode(tok.encode(SAMPLE) + [tok.eos_token_id], skip_special_tokens=True) == SAMPLE


def test_chat_template(tok):
    msgs = [{"role": "user", "content": "hi"}]
    out = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(msgs, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    prompt = PROMPT_TEMPLATE.format(question="Who wrote Hamlet?")
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("Question: Who wrote Hamlet?\n<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(tok.encode(text)) == text


def test_deterministic_and_fresh():
    a, b = build_tokenizer(), build_tokenizer()
    assert a is not b and a.get_vocab() == b.get_vocab()
    a.padding_side = "left"
    assert b.padding_side == "right"
    trained = tiny._trained_vocab_merges.cache_info().misses
    build_model(a)
    build_model(build_tokenizer())  # the BPE is trained once per process (a duration is no result: none is asserted)
    assert tiny._trained_vocab_merges.cache_info().misses == trained


def test_model_vocab_larger_than_tokenizer(tok):
    model = build_model(tok)
    assert len(tok) < model.config.vocab_size == model.lm_head.out_features == len(tok) + 16
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert model.dtype == torch.float32


def test_seed_controls_weights(tok):
    m0, m0b, m1 = build_model(tok, seed=0), build_model(tok, seed=0), build_model(tok, seed=1)

    def w(m):
        return m.model.layers[0].self_attn.q_proj.weight

    torch.testing.assert_close(w(m0), w(m0b), rtol=0, atol=0)  # exact: one seed, the same init code, one process
    assert not torch.equal(w(m0), w(m1))  # exact: another seed gives other weights


def test_generate_left_padded_sampling():
    tok = build_tokenizer()
    tok.padding_side = "left"
    model = build_model(tok)
    texts = [
        tok.apply_chat_template([{"role": "user", "content": PROMPT_TEMPLATE.format(question=q)}],
                                tokenize=False, add_generation_prompt=True)
        for q in ["Who wrote Hamlet?", "What?"]
    ]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert batch["attention_mask"][1, 0] == 0  # the shorter row is left-padded
    torch.manual_seed(0)
    out = model.generate(**batch, do_sample=True, top_p=0.95, temperature=1.0, max_new_tokens=20,
                         suppress_tokens=list(range(len(tok), model.config.vocab_size)))
    assert out.shape[0] == 2 and out.shape[1] <= batch["input_ids"].shape[1] + 20
    assert int(out.max()) < len(tok)


def test_save_reload_identical(tmp_path, tok):
    path = save_tiny(tmp_path / "tiny", seed=3)
    assert path == str(tmp_path / "tiny")
    tok2 = AutoTokenizer.from_pretrained(path)
    model2 = AutoModelForCausalLM.from_pretrained(path)
    model = build_model(tok, seed=3)
    assert tok2.encode(SAMPLE) == tok.encode(SAMPLE)
    assert tok2.get_vocab() == tok.get_vocab()
    assert (tok2.eos_token, tok2.pad_token) == (tok.eos_token, tok.pad_token)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok2.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert model2.config.vocab_size == model.config.vocab_size
    assert model2.generation_config.eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok.encode(SAMPLE)])
    with torch.no_grad():
        torch.testing.assert_close(model2(ids).logits, model(ids).logits)


def test_command_line_saves_the_same_folder(tmp_path, tok):
    """`python tests/tiny.py OUT` (the README's quick start) saves save_tiny's folder and prints its path."""
    out = tmp_path / "tiny-model"
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("tiny.py")), str(out)], capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == str(out)
    assert AutoTokenizer.from_pretrained(out).get_vocab() == tok.get_vocab()
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([tok.encode(SAMPLE)])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, build_model(tok, seed=0)(ids).logits)
