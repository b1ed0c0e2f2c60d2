"""policy.py: load_policy gives one clear line naming --model and the file for every broken model folder, an
unreachable hub and a mismatched tokenizer (today's main: an empty tokenizer and an IndexError at step 1, safetensors'
Rust error, transformers' OSError, ~50 s of retries and an 80-line traceback); the log-probs are the sampler's
(temperature on the logits, dropout off, masks by position, padding cut per micro-batch, the memory-lean pass equal
to the plain one, gradient checkpointing that changes nothing)."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hang  # noqa: E402
from machinery import policy  # noqa: E402
from machinery.data import DEMO_CORPUS  # noqa: E402
from machinery.engine import hf_generator  # noqa: E402
from machinery.policy import batch_logp, collate, enable_grad_ckpt, load_policy, response_logp, safetensors_problem  # noqa: E402
from retriever import BM25Retriever  # noqa: E402
from rollout import STOP_STRINGS, rollout  # noqa: E402
from conftest import QUESTIONS  # noqa: E402
from tiny import build_model, build_tokenizer, save_tiny  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Path(save_tiny(tmp_path_factory.mktemp("policy") / "model"))


def broken(tiny, tmp_path, change) -> str:
    folder = tmp_path / "broken"
    shutil.copytree(tiny, folder)
    change(folder)
    return str(folder)


def truncate(name, keep=0.5):
    def change(folder):
        os.truncate(folder / name, int((folder / name).stat().st_size * keep))
    return change


def remove(*names):
    def change(folder):
        for name in names:
            (folder / name).unlink()
    return change


@pytest.mark.parametrize("change, message", [
    (remove("tokenizer.json", "tokenizer_config.json"), "no tokenizer files (tokenizer.json, tokenizer.model"),
    (remove("model.safetensors"), "no weights (model.safetensors or pytorch_model.bin)"),
    (truncate("model.safetensors"), "model.safetensors is truncated: 358876 bytes, its header describes 717752"),
    (truncate("model.safetensors", 0.001), "model.safetensors is truncated: 717 bytes, its header alone needs"),
    (lambda f: (f / "config.json").write_text('{"model_type": "qwen2", '), "config.json is not valid JSON (Expecting"),
    (remove("config.json"), "no config.json"),
])
def test_broken_model_folder_is_one_clear_line(tiny, tmp_path, change, message):
    folder = broken(tiny, tmp_path, change)
    with pytest.raises(ValueError) as err:
        load_policy(folder, "float32", "cpu")
    assert str(err.value).startswith(f"--model {folder}: ") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_safetensors_check_accepts_whole_files(tiny):
    assert safetensors_problem(tiny / "model.safetensors") is None
    load_policy(str(tiny), "float32", "cpu")  # and the folder loads


def test_tokenizer_larger_than_the_model_vocabulary(tmp_path):
    """A tokenizer from another model: ids past the embedding would fail inside the forward pass at step 1."""
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    model.resize_token_embeddings(len(tok) - 100)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"the tokenizer has {len(tok)} tokens but the model's embedding only "
                                         f"{len(tok) - 100} rows"):
        load_policy(str(tmp_path), "float32", "cpu")


def test_unreachable_hub_is_one_line(tmp_path):
    """A hub id not in the local cache, with the hub unreachable (HF_ENDPOINT on a closed loopback port, so the test
    behaves the same with or without internet): train.py stops with one line saying how to pass a local folder
    (today's main: ~50 s of retries, then an 80-line traceback). No duration is asserted: on a busy machine the right
    line came after 103 s."""
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in DEMO_CORPUS))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    env.pop("HF_HUB_OFFLINE", None)
    r = hang.run([sys.executable, "train.py", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--train-data",
                  str(tmp_path / "q.jsonl"), "--corpus", str(tmp_path / "c.jsonl"), "--prompts-per-step", "2",
                  "--out-dir", str(tmp_path / "run")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("error: --model Qwen/Qwen2.5-0.5B-Instruct: not in the local cache and the Hugging Face "
                            "hub cannot be reached") and "hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir" in error


def test_missing_path_and_a_non_gguf_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="--model /nope/model: no such folder or file"):
        load_policy("/nope/model")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="a file, but not a .gguf one"):
        load_policy(str(tmp_path / "weights.bin"))


def test_a_run_folder_loads_its_newest_checkpoint(tiny, tmp_path):
    from machinery import checkpoint

    for step in (1, 2):
        checkpoint.save(tmp_path, step, lambda folder: shutil.copytree(tiny, folder, dirs_exist_ok=True))
    model, tok, _ = load_policy(str(tmp_path), "float32", "cpu")
    assert len(tok) > 100 and torch.equal(model.lm_head.weight,  # exact: the same file's bytes, loaded twice
                                          load_policy(str(tiny), "float32", "cpu")[0].lm_head.weight)
    shutil.rmtree(tmp_path / "checkpoints")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ValueError, match="a run folder without a complete checkpoint"):
        load_policy(str(tmp_path))


# ----------------------------------------------------------------------------------------------------------------------
# Log-probs under temperature


def test_p17_logp_from_logits_divides_logits_by_temperature():
    from machinery.policy import logp_from_logits
    from torch.testing import assert_close

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 11, generator=g) * 3
    targets = torch.randint(0, 11, (2, 4), generator=g)
    T = 0.7
    lp = logp_from_logits(logits, targets, temperature=T)
    want = torch.log_softmax(logits / T, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    assert_close(lp, want)
    # dividing the log-probs instead (the P17 bug) is a different quantity
    wrong = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1) / T
    assert (lp - wrong).abs().max().item() > 0.1
    # T = 1 is plain log_softmax; and the same call twice gives ratio exactly 1 (on-policy)
    plain = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    assert_close(logp_from_logits(logits, targets), plain)
    assert ((lp - logp_from_logits(logits, targets, temperature=T)).exp() == 1).all()  # exact: the same call twice
    # bf16 logits are computed in float32
    assert logp_from_logits(logits.bfloat16(), targets, T).dtype == torch.float32


def test_logp_and_entropy_from_one_log_softmax():
    from machinery.policy import logp_and_entropy_from_logits, logp_from_logits

    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    logp, ent = logp_and_entropy_from_logits(logits, targets, 0.7)
    torch.testing.assert_close(logp, logp_from_logits(logits, targets, 0.7))
    p = torch.softmax(logits / 0.7, -1)  # entropy written out by hand: -sum p log p of the T-scaled distribution
    torch.testing.assert_close(ent, -(p * p.log()).sum(-1))


def test_response_logp_agrees_with_the_plain_computation():
    """The memory-lean response_logp (all-padding columns cut, only the response positions' logits, chunked
    log-softmax, checkpointed entropy) gives the same logp [b, T] as response_logp_plain (the full forward, one
    log-softmax), for a micro-batch of mixed prompt and response lengths, at temperature 0.7, and its gradient too."""
    from machinery.policy import collate, response_logp, response_logp_plain
    from rollout import Episode

    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    g = torch.Generator().manual_seed(0)
    eps = []
    for i, (lp, lr) in enumerate([(5, 9), (12, 3), (7, 70), (3, 1)]):  # 70 > one 64-token chunk
        ids = torch.randint(3, len(tok), (lp + lr,), generator=g).tolist()
        mask = [1 if k % 5 else 0 for k in range(lr)]  # some observation tokens (0) inside the response
        eps.append(Episode("q", ["a"], "t", group_id=i, prompt_ids=ids[:lp], response_ids=ids[lp:], loss_mask=mask,
                           answer_mask=[0] * lr))
    batch = collate(eps, tok.pad_token_id)
    for rows in (slice(0, 4), slice(1, 3)):
        lean, ent = response_logp(model, batch, rows, 0.7, len(tok), with_entropy=True)
        plain = response_logp_plain(model, batch, rows, 0.7, len(tok))
        real = batch["attention_mask"][rows, -lean.shape[1]:] > 0  # [b, T] the response tokens that exist
        assert lean.shape == plain.shape == batch["loss_mask"][rows].shape and real.sum() >= 73
        torch.testing.assert_close(lean[real], plain[real], atol=1e-5, rtol=1e-5)
        assert ent.shape == lean.shape and (ent[real] > 0).all()
    w = batch["loss_mask"]  # 0 on padding too
    lean_grad = torch.autograd.grad((response_logp(model, batch, slice(0, 4), 0.7, len(tok))[0] * w).sum(),
                                    model.lm_head.weight)[0]
    plain_grad = torch.autograd.grad((response_logp_plain(model, batch, slice(0, 4), 0.7, len(tok)) * w).sum(),
                                     model.lm_head.weight)[0]
    torch.testing.assert_close(lean_grad, plain_grad, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------------
# Log-probs exactly as the sampler computed them: temperature, dropout off, masks by position, padding cut per
# micro-batch, gradient checkpointing


@pytest.mark.parametrize("temperature, amp", [(0.7, False), (1.3, False), (0.7, True)])
def test_p17_p18_ratio_is_exactly_one_with_lr_zero(temperature, amp):
    """Dropout in the config and T != 1: the rollout policy's log-probs recomputed for the update give ratio == 1;
    also under bf16 autocast (--amp bf16), where old and current log-probs run the same bf16 passes."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(tok, seed=0, dropout=0.3)
    model.eval()  # as load_policy leaves it (test_p18_load_policy_turns_dropout_off checks that)
    with torch.autocast("cpu", torch.bfloat16, enabled=amp):
        _ratio_is_one(model, tok, temperature)


def _ratio_is_one(model, tok, temperature):
    generate = hf_generator(model, tok, stop_strings=STOP_STRINGS, max_new_tokens=12, temperature=temperature, top_p=1.0)
    eps = rollout(generate, tok, QUESTIONS[:2], BM25Retriever(DEMO_CORPUS).search, group_size=2, max_turns=1,
                  max_obs_tokens=40)
    batch = collate(eps, tok.pad_token_id)
    old = batch_logp(model, batch, 2, temperature, len(tok))
    for i in range(0, len(eps), 2):
        logp, _ = response_logp(model, batch, slice(i, i + 2), temperature, len(tok), with_entropy=True)
        ratio = torch.exp(logp.detach() - old[i:i + 2]) * batch["loss_mask"][i:i + 2]
        assert torch.equal(ratio, batch["loss_mask"][i:i + 2])  # exact: the same forward of the same rows, twice
    # and the log-probs are those of the temperature-scaled policy: at T=1 they differ
    other = batch_logp(model, batch, 2, 1.0, len(tok))
    assert not torch.allclose(other * batch["loss_mask"], old * batch["loss_mask"])


def test_the_log_prob_passes_use_the_updates_micro_batches(monkeypatch):
    """batch_logp batched rows from row 0 of the whole batch while train.update restarts its micro-batches at each
    mini-batch: with --mini-batch-size 6 and --micro-batch-size 4 the passes padded rows 4-7 together where the update
    pads 4-5 and 6-7 apart, so the same weights gave other floats (4.8e-7 in a log-prob: the first mini-batch was not
    exactly on-policy). Now every pass makes the update's micro-batches, and gives its floats."""
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    generate = hf_generator(model, tok, stop_strings=STOP_STRINGS, max_new_tokens=12, temperature=1.0, top_p=1.0)
    eps = rollout(generate, tok, QUESTIONS[:2], BM25Retriever(DEMO_CORPUS).search, group_size=4, max_turns=1,
                  max_obs_tokens=40)
    batch, made, real = collate(eps, tok.pad_token_id), [], policy.response_logp
    monkeypatch.setattr(policy, "response_logp", lambda m, b, rows, *a, **kw: made.append(rows) or real(m, b, rows,
                                                                                                         *a, **kw))
    logp = batch_logp(model, batch, 4, 1.0, len(tok), mini_batch_size=6)
    assert [(r.start, r.stop) for r in made] == [(0, 4), (4, 6), (6, 8)]  # train.update's, for 8 rows
    update_own = torch.cat([real(model, batch, slice(a, b), 1.0, len(tok))[0] for a, b in ((0, 4), (4, 6), (6, 8))])
    assert torch.equal(logp, update_own)  # exact: the same rows padded together, the same forward
    made.clear()
    skipped = batch_logp(model, batch, 4, 1.0, len(tok), start=6, mini_batch_size=6)  # train.py's old pass
    assert [(r.start, r.stop) for r in made] == [(6, 8)] and skipped.shape[0] == 2
    assert torch.equal(skipped, logp[6:])  # exact: the same forward


def test_p18_load_policy_turns_dropout_off(tmp_path):
    """A checkpoint with dropout in its config: load_policy returns it in eval mode, so the log-prob pass is exact."""
    tok = build_tokenizer()
    build_model(tok, seed=0, dropout=0.5).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, tok2, _ = load_policy(str(tmp_path), "float32", "cpu")
    assert model.config.attention_dropout == 0.5 and not model.training  # exact: a setting, saved and loaded
    assert not any(m.training for m in model.modules())

    class E:
        prompt_ids, response_ids = tok2.encode("Where is Paris?"), tok2.encode(" In France, on the Seine.")
        loss_mask = answer_mask = [1] * len(response_ids)

    batch = collate([E(), E()], tok2.pad_token_id)

    def lp():
        return response_logp(model, batch, slice(0, 2), 1.0, len(tok2))[0].detach()

    a = lp()
    assert torch.equal(a, lp())  # exact: the same pass twice in one process: ratio exactly 1 on-policy
    model.train()  # control: with dropout active the same pass is not reproducible (the test has teeth)
    torch.manual_seed(0)
    assert not torch.equal(a, lp())  # exact: any difference at all shows dropout acting
    model.eval()


def test_p9_p10_collate_masks_by_position_not_by_pad_value():
    """P9/P10: a response whose last token is the pad id (pad == eos) keeps it in the loss and attention masks."""
    tok = build_tokenizer()

    class E:  # the fields collate reads
        def __init__(self, p, r, m):
            self.prompt_ids, self.response_ids, self.loss_mask, self.answer_mask = p, r, m, [0] * len(r)

    pad = tok.pad_token_id
    b = collate([E([5, 6, 7], [8, pad], [1, 1]), E([5], [8, 9, 10, 11], [1, 0, 0, 1])], pad)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, pad, pad, pad], [pad, pad, 5, 8, 9, 10, 11]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4, 4], [0, 0, 0, 1, 2, 3, 4]]
    assert b["loss_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 1]]


def test_p10_loss_mask_ends_at_first_eos_or_true_length():
    """Mixed lengths, one row without EOS (truncated), tokens after the first EOS: the trained positions are exactly
    the kept tokens, the first EOS included, and nothing after it or in the padding (veRL's all-ones mask: verl
    #3805)."""
    from rollout import cut_turn

    tok = build_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    words = tok.encode(" the quick brown fox", add_special_tokens=False)
    raw = [words[:2] + [eos] + words[2:] + [eos, pad],  # EOS at 2, junk after it
           words,  # max_new_tokens hit: no EOS, the true length is kept
           [eos, pad, pad]]  # EOS first
    kept = [cut_turn(r, tok, {eos}) for r in raw]
    assert kept == [(words[:2] + [eos], True), (words, False), ([eos], True)]

    class E:
        def __init__(self, ids):
            self.prompt_ids, self.response_ids = [7, 8], ids
            self.loss_mask = self.answer_mask = [1] * len(ids)

    b = collate([E(ids) for ids, _ in kept], pad)
    n = len(words)
    assert b["loss_mask"].tolist() == [[1.0] * 3 + [0.0] * (n - 3), [1.0] * n, [1.0] + [0.0] * (n - 1)]  # exact: 0/1
    assert b["attention_mask"][:, 2:].tolist() == b["loss_mask"].tolist()  # exact: 0/1 masks; no pad, no post-EOS


def test_padding_is_cut_per_micro_batch_and_changes_nothing(monkeypatch):
    """A row's logp/entropy in a batch padded for much longer rows equal the row collated alone; the model sees only
    the micro-batch's own columns (the cut), and the padded positions come back as zeros."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(tok, seed=0)

    class E:  # the fields collate reads
        def __init__(self, p, r):
            self.prompt_ids, self.response_ids = p, r
            self.loss_mask, self.answer_mask = [1] * len(r), [0] * len(r)

    short, long_ = E([5, 6], [7, 8, 9]), E(list(range(10, 40)), list(range(40, 80)))
    batch, alone = collate([short, long_], tok.pad_token_id), collate([short], tok.pad_token_id)
    seen = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda **kw: seen.append(kw["input_ids"].shape) or forward(**kw))
    logp, ent = response_logp(model, batch, slice(0, 1), 1.0, len(tok), with_entropy=True)
    ref_logp, ref_ent = response_logp(model, alone, slice(0, 1), 1.0, len(tok), with_entropy=True)
    assert seen[0] == (1, 5) and logp.shape == (1, 40)  # 2 prompt + 3 response columns of the 70 in the batch
    torch.testing.assert_close(logp[:, :3], ref_logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent[:, :3], ref_ent, atol=1e-6, rtol=0)
    assert logp[:, 3:].eq(0).all() and ent[:, 3:].eq(0).all()
    both = batch_logp(model, batch, 2, 1.0, len(tok))  # and the long row is unchanged by sharing a micro-batch
    torch.testing.assert_close(both[1:], batch_logp(model, batch, 1, 1.0, len(tok))[1:], atol=1e-5, rtol=0)


def test_grad_ckpt_same_gradient_and_really_recomputes():
    """--grad-ckpt leaves the gradient unchanged (1e-5) in eval mode, and the decoder layers really run again in
    backward (HF's gradient_checkpointing_enable() would do nothing in eval mode)."""
    tok = build_tokenizer()

    class E:
        prompt_ids, response_ids = tok.encode("Where is Paris?"), tok.encode(" In France, on the Seine.")
        loss_mask = answer_mask = [1] * len(response_ids)

    batch = collate([E(), E()], tok.pad_token_id)
    grads, attn_calls = [], []
    for ckpt in (False, True):
        model = build_model(tok, seed=0)
        if ckpt:
            enable_grad_ckpt(model)
        n = [0]
        model.model.layers[0].self_attn.register_forward_hook(lambda *_: n.__setitem__(0, n[0] + 1))
        logp, ent = response_logp(model, batch, slice(0, 2), 1.0, len(tok), with_entropy=True)
        (logp.sum() + ent.sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        attn_calls.append(n[0])
        with torch.no_grad():  # generation / old log-probs: no recompute, no checkpoint overhead
            response_logp(model, batch, slice(0, 2), 1.0, len(tok))
        attn_calls[-1] = (attn_calls[-1], n[0])
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)
    assert attn_calls == [(1, 2), (2, 3)]  # with checkpointing the layer ran again in backward


def test_policy_py_runs_alone(tiny):
    """`python -m machinery.policy MODEL`: checks and loads the folder and says what it is; a broken folder is one line."""
    r = hang.run([sys.executable, "-m", "machinery.policy", str(tiny)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1].startswith("Qwen2ForCausalLM: 0.2M parameters, 816 embedding rows, "
                                                        "tokenizer 800 tokens")
    r = hang.run([sys.executable, "-m", "machinery.policy", str(tiny / "nope")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"error: --model {tiny / 'nope'}: no such folder or file (pass a hub id, a model "
                                "folder or a .gguf)")


def test_a_busy_cpu_gets_one_line_about_threads(monkeypatch):
    from machinery.policy import BUSY_NOTED, busy_cpu_note

    monkeypatch.delenv(BUSY_NOTED, raising=False)
    assert busy_cpu_note(load=0.3, cores=2, threads=2) is None  # idle: torch's default is right
    assert busy_cpu_note(load=5.2, cores=2, threads=1) is None  # one thread already (spiral.py's runs, the benchmarks)
    note = busy_cpu_note(load=5.2, cores=2, threads=2)
    assert note.startswith("note: this machine is busy (load 5.2 on 2 cores) and torch runs 2 threads")
    assert "OMP_NUM_THREADS" in note and "\n" not in note
    assert busy_cpu_note(load=5.2, cores=2, threads=2) is None  # said once a command: its child processes inherit
    r = hang.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); from machinery.policy import "
                  "busy_cpu_note; print(busy_cpu_note(load=5.2, cores=2, threads=2))"], cwd=ROOT,
                 capture_output=True, text=True)
    assert r.stdout.strip() == "None", r.stderr[-2000:]
