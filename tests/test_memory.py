"""The memory plan (memory.py): KV bytes per token, the static memory, --gen-batch-size auto and the update's
activations with --micro-batch-size and --grad-ckpt chosen when unset, checked against hand arithmetic with fake
free-memory figures for the three model sizes on the meta device; the flags' parsing (train.py)."""

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "gpu"))

import hang  # noqa: E402
from machinery.memory import GiB, context_tokens, free_memory, gen_batch_size_auto, kv_bytes_per_token, memory_plan  # noqa: E402
from machinery.memory import layer_activation_bytes, row_bytes, static_memory, update_activation_bytes, update_plan  # noqa: E402
from memory_plan import meta_model  # noqa: E402
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
    n, _, _, plan = memory_plan(model, 80e9, "auto", rows=2560, turns=(3, 500, 500), bf16=True, ref=ref)
    assert n == 41
    assert "3,086M params, static 57.5 GiB" in plan
    assert "41 rows per call x 3756 tokens x (KV 36,864 + prefill 69,804 bytes/token)" in plan
    assert plan.splitlines()[1].endswith("fits")
    n, _, _, plan = memory_plan(model, 80e9, "512", rows=2560, turns=(3, 500, 500), bf16=True, ref=ref)  # as given
    assert n == 512 and "does NOT fit: lower --gen-batch-size" in plan
    with pytest.raises(ValueError, match="--gen-batch-size auto: one generate row needs"):
        memory_plan(model, 50e9, "auto", rows=2560, turns=(3, 500, 500), bf16=True, ref=ref)  # static > 50 GB


def test_the_demo_prints_the_3b_plan_of_its_comments():
    out = hang.run([sys.executable, "-m", "machinery.memory"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "context 3756 | KV bytes/token 36864 | row bytes 400645008"
    assert "static 57.5 GiB" in lines[1] and "41 rows per call" in lines[2]
    assert "--micro-batch-size 4 (chosen by the plan), --grad-ckpt on" in lines[3] and "= 19.1 GiB" in lines[3]
    assert "--micro-batch-size 8 (chosen by the plan), --grad-ckpt on" in lines[4] and "= 37.5 GiB" in lines[4]


def test_free_memory_on_cpu_is_a_positive_byte_count():
    assert free_memory("cpu") > 2**20


@pytest.mark.parametrize("value", ["0", "-3", "foo", "1.5", "", "²"])  # "²".isdigit(), but int("²") fails
def test_gen_batch_size_must_be_a_count_or_auto(capsys, value):
    with pytest.raises(SystemExit) as stop:
        parse_args([f"--gen-batch-size={value}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"error: --gen-batch-size must be an integer >= 1 or auto, got {value}".rstrip()), err


def test_gen_batch_size_default_and_auto_parse():
    assert parse_args([]).gen_batch_size == "auto" and parse_args(["--gen-batch-size", "8"]).gen_batch_size == "8"
    assert parse_args(["--gen-batch-size", "auto"]).gen_batch_size == "auto"


# The update: activations per micro-batch, and --micro-batch-size / --grad-ckpt chosen where unset


def test_layer_activation_bytes_by_hand():
    # bf16 autocast: 36h + 8i + 4 heads + 8; fp32: 44h + 16i + 4 heads + 8
    assert layer_activation_bytes(Qwen2Config(**QWEN_3B), True) == 36 * 2048 + 8 * 11008 + 4 * 16 + 8 == 161_864
    assert layer_activation_bytes(Qwen2Config(**TINY), False) == 44 * 64 + 16 * 128 + 4 * 4 + 8 == 4_888
    assert layer_activation_bytes(Qwen2Config(**TINY), False, 2) == (44 * 64 + 16 * 128) // 2 + 24  # bf16 weights


def test_update_activation_bytes_of_3b_by_hand():
    model = meta_model("Qwen2.5-3B")
    h, V, L, w = 2048, 151936, 36, 77_076_992  # w: one decoder layer's parameters
    n, resp = 4 * 3756, 4 * 3500  # tokens, response tokens of 4 rows
    logits = resp * V * 2  # bf16
    shared = 4 * 3756 * 3756 * 2 + 8 * 128 * n  # the mask, rotary cos and sin
    moment = max(2 * logits, 6 * V * h - logits)  # the logits' gradient twice > the head's bf16 + fp32 gradient
    ckpt = n * (L * 4 * h + 161_864) + 2 * w + logits + 2 * V * h + shared
    assert update_activation_bytes(model, 4, 3756, 3500, grad_ckpt=True, bf16_autocast=True, split=True) == (
        ckpt, moment)
    full = n * L * 161_864 + L * 2 * w + logits + 2 * V * h + shared
    assert update_activation_bytes(model, 4, 3756, 3500, grad_ckpt=False, bf16_autocast=True) == full + moment
    assert (full + moment) / GiB == pytest.approx(99.3, abs=0.05)  # without --grad-ckpt
    assert (ckpt + moment) / GiB == pytest.approx(19.1, abs=0.05)  # with


@pytest.mark.parametrize("name, card, want", [
    ("Qwen2.5-0.5B", 80e9, (371, 4, False)), ("Qwen2.5-0.5B", 141e9, (694, 8, False)),
    ("Qwen2.5-3B", 80e9, (41, 4, True)), ("Qwen2.5-3B", 141e9, (178, 2, False)),
])
def test_the_plan_chooses_the_update_for_the_main_command(name, card, want):
    """`python train.py --model Qwen/Qwen2.5-3B --llds 0.1` (and 0.5B) as typed: micro-batch size and checkpointing
    unset, chosen in the order 8, 4, 2, 1 without --grad-ckpt, then with it. 3B on 80 GB: the update has 80e9 - 18 x
    3,085,938,688 (policy, gradients, AdamW, bf16 reference) = 24.45e9 bytes; x 0.9 = 22.0e9; without checkpointing
    even 1 row needs 31.3e9, with it 8 rows 40.3e9, 4 rows 20.5e9: 4 rows with --grad-ckpt."""
    model, ref = meta_model(name), meta_model(name, torch.bfloat16)
    n, micro, ckpt, plan = memory_plan(model, card, "auto", rows=2560, turns=(3, 500, 500), bf16=True, ref=ref)
    assert (n, micro, ckpt) == want
    on = "on" if ckpt else "off"
    assert f"+ update: --micro-batch-size {micro} (chosen by the plan), --grad-ckpt {on} (chosen by the plan)" in plan


@pytest.mark.parametrize("left, want", [(40, (8, True)), (78.7, (8, True)), (200, (32, True)), (400, (8, False)),
                                        (1000, (32, False))])
def test_on_a_gpu_the_update_is_sized_for_throughput(left, want):
    """throughput_rows (train.py passes a rank's mini-batch rows on CUDA): the largest power-of-two micro-batch that
    fits, up to those rows, and --grad-ckpt when without it fewer than 8 rows fit and with it at least twice as many.
    3B at the main command's 3,756 tokens: without checkpointing 1 row needs 28.9 GiB (2 fit in 78.7 GiB: 8 with
    it), 8 rows fit in 400 GiB (then no checkpointing); the CPU's order (8, 4, 2, 1; without first) is kept off CUDA;
    a user's flags are kept; 2 rows cap the sizes at 2."""
    model = meta_model("Qwen2.5-3B")
    kw = dict(tokens=3756, response_tokens=3256, bf16_autocast=True, compute_bytes=2)
    assert update_plan(model, left * GiB, None, None, throughput_rows=256, **kw)[:2] == want
    assert update_plan(model, 78.7 * GiB, None, None, **kw)[:2] == (2, False)  # off CUDA
    assert update_plan(model, 78.7 * GiB, 4, None, throughput_rows=256, **kw)[:2] == (4, True)  # as given
    assert update_plan(model, 1000 * GiB, None, None, throughput_rows=2, **kw)[:2] == (2, False)


def test_the_flags_a_user_sets_are_kept_or_the_plan_stops_naming_them():
    model, ref = meta_model("Qwen2.5-3B"), meta_model("Qwen2.5-3B", torch.bfloat16)
    kw = dict(rows=2560, turns=(3, 500, 500), bf16=True, ref=ref)
    _, micro, ckpt, plan = memory_plan(model, 80e9, "auto", update=(2, None), **kw)  # a micro-batch size given
    assert (micro, ckpt) == (2, True) and "--micro-batch-size 2 (as given), --grad-ckpt on (chosen by the plan)" in plan
    _, micro, ckpt, _ = memory_plan(model, 80e9, "auto", update=(None, True), **kw)
    assert (micro, ckpt) == (4, True)
    with pytest.raises(ValueError) as err:  # --no-grad-ckpt: not even 1 row fits on 80 GB
        memory_plan(model, 80e9, "auto", update=(None, False), **kw)
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("the update does not fit: 1 row(s) per micro-batch x 3756 "
                                                         "tokens without --grad-ckpt need 29.1 GiB"), msg
    for flag in ("--grad-ckpt", "--ref-offload", "--fsdp", "--max-new-tokens"):
        assert flag in msg, flag
    with pytest.raises(ValueError, match="use --micro-batch-size 1, --ref-offload"):  # 8 rows with checkpointing
        update_plan(model, 22.8 * GiB, 8, True, tokens=3756, response_tokens=3500, bf16_autocast=True)


def test_7b_fits_one_h200_only_without_the_reference():
    """7B on one card: the static memory (20 bytes per parameter) alone is more than 141 GB; with --kl-coef 0 (or
    --ref-offload) 5 rows per generate call and 2-row micro-batches with --grad-ckpt fit."""
    model = meta_model("Qwen2.5-7B")
    with pytest.raises(ValueError, match="--gen-batch-size auto"):
        memory_plan(model, 141e9, "auto", rows=2560, turns=(3, 500, 500), bf16=True, ref=meta_model(
            "Qwen2.5-7B", torch.bfloat16))
    assert memory_plan(model, 141e9, "auto", rows=2560, turns=(3, 500, 500), bf16=True)[:3] == (5, 2, True)


def test_grad_ckpt_and_micro_batch_size_unset_by_default():
    args = parse_args([])
    assert args.micro_batch_size is None and args.grad_ckpt is None
    args = parse_args(["--micro-batch-size", "2", "--no-grad-ckpt"])
    assert args.micro_batch_size == 2 and args.grad_ckpt is False
    assert parse_args(["--grad-ckpt"]).grad_ckpt is True
