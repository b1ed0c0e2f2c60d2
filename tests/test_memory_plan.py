"""The memory plan (policy.py): KV bytes per token, the static memory and --gen-batch-size auto, checked against hand
arithmetic with fake free-memory figures; the flag's parsing (train.py)."""

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policy import GiB, context_tokens, free_memory, gen_batch_size_auto, kv_bytes_per_token, memory_plan  # noqa: E402
from policy import row_bytes, static_memory  # noqa: E402
from train import parse_args  # noqa: E402

QWEN_3B = dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True)  # Qwen/Qwen2.5-3B config.json
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=816)  # tests/tiny.py's shapes


def test_kv_bytes_per_token_by_hand():
    # layers x KV heads x head dim x 2 (K, V) x bytes
    assert kv_bytes_per_token(Qwen2Config(**TINY), 4) == 2 * 2 * (64 // 4) * 2 * 4 == 512
    assert kv_bytes_per_token(Qwen2Config(**QWEN_3B), 2) == 36 * 2 * (2048 // 16) * 2 * 2 == 36_864
    assert kv_bytes_per_token(Qwen2Config(**TINY, head_dim=32), 2) == 2 * 2 * 32 * 2 * 2  # an explicit head_dim wins


def test_context_is_the_last_turns():
    assert context_tokens(3, 500, 500) == 256 + 3 * (500 + 500) + 500 == 3756  # the paper's settings
    assert context_tokens(0, 16, 48, prompt_tokens=100) == 116  # answer-only: the prompt and one turn


def test_row_bytes_by_hand():
    # context x (KV + 3 x intermediate x bytes (the prefill's MLP) + context (its row of the bool mask))
    assert row_bytes(Qwen2Config(**QWEN_3B), 3756, 2) == 3756 * (36_864 + 3 * 11008 * 2 + 3756) == 400_645_008
    assert row_bytes(Qwen2Config(**TINY), 400, 4) == 400 * (512 + 3 * 128 * 4 + 400) == 979_200


def test_gen_batch_size_auto_with_a_fake_free_memory():
    row = 36_864 * 3756  # 138,461,184 bytes: Qwen2.5-3B's KV cache in bf16 at the paper's context
    # 0.9 x 10 GiB = 9,663,676,416 bytes / 138,461,184 = 69.8 -> 69 rows
    assert gen_batch_size_auto(10 * GiB, row) == 69
    assert gen_batch_size_auto(10 * GiB, row, cap=40) == 40  # no more rows than a turn has
    assert gen_batch_size_auto(10 * GiB, row, reserve_frac=0.0) == 77  # 10,737,418,240 / 138,461,184 = 77.5
    for free in (0.1 * GiB, -5 * GiB):  # less than a row; the static memory alone too much
        with pytest.raises(ValueError) as err:
            gen_batch_size_auto(free, row)
        msg = str(err.value)
        assert len(msg.splitlines()) == 1
        for flag in ("--gen-batch-size", "--max-new-tokens", "--max-turns", "--max-obs-tokens"):
            assert flag in msg, flag


def test_static_memory_of_3b_by_hand():
    n = 3_085_938_688  # Qwen2.5-3B's parameters (the model on the meta device counts the same, below)
    got = static_memory(n, weights_bytes=4, ref_bytes=2, rollout_bytes=2)
    assert got == pytest.approx({"policy": 4 * n / GiB, "gradients": 4 * n / GiB, "AdamW m, v": 8 * n / GiB,
                                 "reference": 2 * n / GiB, "rollout weights": 2 * n / GiB})
    assert got["policy"] == pytest.approx(11.496, abs=1e-3) and sum(got.values()) == pytest.approx(57.48, abs=1e-2)
    sharded = static_memory(n, weights_bytes=4, ref_bytes=2, rollout_bytes=2, world=4)  # FSDP: all but the gathered
    assert sharded["AdamW m, v"] == pytest.approx(got["AdamW m, v"] / 4) and sharded["rollout weights"] == got[
        "rollout weights"]


def test_memory_plan_for_3b_on_an_80_gb_card():
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN_3B))
        ref = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN_3B)).to(torch.bfloat16)  # the bf16 reference
    assert sum(p.numel() for p in model.parameters()) == 3_085_938_688  # 3.09B, as published
    # static: n x (4 + 4 + 8 + 2 ref + 2 rollout bf16 copy) = 20 x 3,085,938,688 = 61,718,773,760 bytes;
    # left for generating: 80e9 - that = 18,281,226,240; x 0.9 / 400,645,008 bytes per row = 41.07 -> 41
    n, plan = memory_plan(model, 80e9, "auto", rows=2560, turns=(3, 500, 500), bf16=True, ref=ref)
    assert n == 41
    assert "3,086M params, static 57.5 GiB" in plan
    assert "41 rows per call x 3756 tokens x (KV 36,864 + prefill 69,804 bytes/token)" in plan
    assert plan.endswith("fits")
    n, plan = memory_plan(model, 80e9, "512", rows=2560, turns=(3, 500, 500), bf16=True, ref=ref)  # kept as given
    assert n == 512 and "does NOT fit: lower --gen-batch-size" in plan
    with pytest.raises(ValueError, match="--gen-batch-size auto: one generate row needs"):
        memory_plan(model, 50e9, "auto", rows=2560, turns=(3, 500, 500), bf16=True, ref=ref)  # static > 50 GB


def test_free_memory_on_cpu_is_a_positive_byte_count():
    assert free_memory("cpu") > 2**20


@pytest.mark.parametrize("value", ["0", "-3", "foo", "1.5", ""])
def test_gen_batch_size_must_be_a_count_or_auto(capsys, value):
    with pytest.raises(SystemExit) as stop:
        parse_args([f"--gen-batch-size={value}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"error: --gen-batch-size must be an integer >= 1 or auto, got {value}".rstrip()), err


def test_gen_batch_size_default_and_auto_parse():
    assert parse_args([]).gen_batch_size == "64" and parse_args(["--gen-batch-size", "8"]).gen_batch_size == "8"
    assert parse_args(["--gen-batch-size", "auto"]).gen_batch_size == "auto"
