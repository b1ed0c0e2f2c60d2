"""probe.py: the fixed probe responses (probe/* keys of every train.py run) and the Delta(x) probe, against hand
computations on tiny tensors and the tests' tiny model."""

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "lab")]

import hang  # noqa: E402
from grpo import grpo_loss  # noqa: E402
from machinery.policy import batch_logp  # noqa: E402
from probe import _batch, delta_probe, group_delta, probe_stats, wilson  # noqa: E402
from conftest import same_value, train_in_process  # noqa: E402  (and the `files` fixture)
from tiny import build_model, build_tokenizer  # noqa: E402

# 3 responses of 7 tokens: [action 1 (3 tokens), observation (2), action 2 (2)]; response 2 is a one-action response
LOGP = torch.tensor([[-1.0, -2.0, -3.0, -9.0, -9.0, -0.5, -0.5],
                     [-0.1, -0.2, -9.0, -9.0, -9.0, -9.0, -9.0],
                     [-2.0, -2.0, -2.0, -9.0, -9.0, -1.0, -3.0]])
MASK = torch.tensor([[1, 1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 1, 1]], dtype=torch.float32)
ANSWER = torch.tensor([[0, 0, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1]], dtype=torch.float32)
REWARD = torch.tensor([1.0, 0.0, 1.0])


def test_probe_stats_by_hand():
    s = probe_stats(LOGP, MASK, ANSWER, REWARD)
    # correct: rows 0 and 2; their model tokens: -1 -2 -3 -0.5 -0.5 | -2 -2 -2 -1 -3 (10 tokens, sum -17)
    assert s["probe/n_correct"] == 2 and s["probe/n_incorrect"] == 1
    assert s["probe/logp_correct"] == pytest.approx(-17 / 10)
    assert s["probe/seqlogp_correct"] == pytest.approx((-7 + -10) / 2)  # sequence sums -7 and -10
    assert s["probe/logp_correct_first"] == pytest.approx((-6 - 6) / 6)  # first actions: 3 tokens each
    assert s["probe/logp_correct_later"] == pytest.approx((-1 - 4) / 4)  # second actions: 2 tokens each
    assert s["probe/logp_correct_answer"] == pytest.approx((-0.5 - 0.5 - 3) / 3)
    assert s["probe/logp_incorrect"] == pytest.approx(-0.3 / 2) and s["probe/seqlogp_incorrect"] == pytest.approx(-0.3)
    assert s["probe/logp_incorrect_later"] is None and s["probe/logp_incorrect_answer"] == pytest.approx(-0.2)
    assert "probe/delta_correct" not in s  # no start given
    later = probe_stats(LOGP - MASK * 0.25, MASK, ANSWER, REWARD, start=s)  # every model token 0.25 nats less likely
    assert later["probe/delta_correct"] == pytest.approx(-0.25 * 5)  # 5 model tokens a correct response
    assert later["probe/delta_incorrect"] == pytest.approx(-0.25 * 2)
    assert later["probe/dlogp_correct"] == pytest.approx(-0.25) == later["probe/dlogp_incorrect"]
    none = probe_stats(LOGP, MASK, ANSWER, torch.zeros(3))  # no correct response: None, not 0
    assert none["probe/n_correct"] == 0 and none["probe/logp_correct"] is None and none["probe/seqlogp_correct"] is None


def metrics(history):
    return [{k: v for k, v in m.items() if not k.startswith(("probe/", "perf/"))} for m in history]


def test_the_probe_changes_nothing_else_and_is_logged_every_k_steps(files):
    """The probe samples in a random stream of its own, before step 1: the run's every other metric is the same
    without it (training is untouched); with --probe-every 2 the probe/* keys are on steps 2 and 4 only. Its file
    holds the frozen responses and their step-0 figures, from which probe/delta_* count."""
    flags = ["--steps", "4", "--seed", "1"]
    on = train_in_process(files, files["dir"] / "probe_on", *flags, "--probe-questions", "3", "--probe-every", "2")
    off = train_in_process(files, files["dir"] / "probe_off", *flags, "--probe-questions", "0")
    for a, b in zip(metrics(on), metrics(off), strict=True):
        assert a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a), a["step"]
    assert [("probe/logp_incorrect" in m) for m in on] == [False, True, False, True]
    assert not any(k.startswith("probe/") for m in off for k in m)
    saved = json.loads((files["dir"] / "probe_on" / "probe_rank0.json").read_text())
    assert len(saved["frozen"]["response_ids"]) == 3 * 4  # 3 questions x --group-size 4, ids as sampled
    m = on[1]
    assert m["probe/n_incorrect"] + m["probe/n_correct"] == 12 and m["perf/probe_s"] >= 0
    assert m["probe/delta_incorrect"] == pytest.approx(m["probe/seqlogp_incorrect"]
                                                       - saved["start"]["probe/seqlogp_incorrect"])
    assert m["probe/delta_incorrect"] != 0  # lr 1e-3 moves the likelihood of the frozen responses


def group(tok, seed=0):
    """A frozen group of 4 responses to one prompt: two actions around an observation, rewards 1, 0, 1, 0."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, len(tok), (6,), generator=g).tolist()
    rows = {"prompt_ids": [], "response_ids": [], "loss_mask": [], "answer_mask": [], "reward": [1.0, 0.0, 1.0, 0.0],
            "group_id": [0] * 4}
    for n in (5, 7, 4, 6):
        rows["prompt_ids"].append(prompt)
        rows["response_ids"].append(torch.randint(3, len(tok), (n,), generator=g).tolist())
        rows["loss_mask"].append([1, 1, 0, 0] + [1] * (n - 4) if n > 4 else [1] * n)
        rows["answer_mask"].append([0] * (n - 1) + [1])
    return rows


def test_group_delta_is_one_sgd_step_by_hand_and_llds_is_inert_on_it():
    """k = 1, SGD: Delta = sum over model tokens of log pi_theta'(y) - log pi_theta(y), theta' = theta - lr x the
    gradient of the GRPO loss with the group's own advantages (A = (r - mean) / (std + 1e-6), std unbiased): done
    here by hand on a copy of the model. LLDS adds nothing on a first update (no token has lost likelihood yet), and
    the model's weights are restored afterwards."""
    tok = build_tokenizer()
    model = build_model(tok, seed=1)
    before = copy.deepcopy(model.state_dict())
    batch, reward = _batch(group(tok), tok.pad_token_id)
    vocab, lr = len(tok), 0.5
    delta, per_token = group_delta(model, batch, reward, k=1, llds=0.0, lr=lr, optimizer="sgd", vocab_size=vocab)

    by_hand = copy.deepcopy(model)
    mask = batch["loss_mask"]
    old = batch_logp(by_hand, batch, 4, 1.0, vocab)
    adv = (reward - reward.mean()) / (reward.std() + 1e-6)  # [1, -1, 1, -1] x 0.866
    from machinery.policy import response_logp
    logp, _ = response_logp(by_hand, batch, slice(None), 1.0, vocab)
    loss, _ = grpo_loss(logp, old, None, adv, mask, kl_coef=0.0, entropy_coef=0.0)
    loss.backward()
    with torch.no_grad():
        for p in by_hand.parameters():
            p -= lr * p.grad
    after = batch_logp(by_hand, batch, 4, 1.0, vocab)
    torch.testing.assert_close(delta, ((after - old) * mask).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(per_token, (after - old) * mask, rtol=1e-5, atol=1e-5)
    assert (delta[reward == 1] > 0).all()  # a plain gradient step raises what it rewards, here
    with_llds, _ = group_delta(model, batch, reward, k=1, llds=0.2, lr=lr, optimizer="sgd", vocab_size=vocab)
    torch.testing.assert_close(with_llds, delta, rtol=0, atol=0)  # exact: 0.2 x a zero loss adds zeros, bit for bit
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # exact: restored from a copy
    two, _ = group_delta(model, batch, reward, k=2, llds=0.0, lr=lr, optimizer="sgd", vocab_size=vocab)
    assert not torch.equal(two, delta)  # exact: any difference shows that the second update moved it


@pytest.mark.parametrize("llds", [0.0, 0.2])
def test_one_chain_of_updates_gives_what_separate_runs_give(llds):
    """group_delta_after(ks=(1, 2, 3)): measured after the 1st, 2nd and 3rd update of one chain (AdamW), the same
    changes as three separate runs of k = 1, 2, 3 (the probe's k values share their first updates)."""
    from probe import group_delta_after

    tok = build_tokenizer()
    model = build_model(tok, seed=1)
    batch, reward = _batch(group(tok), tok.pad_token_id)
    kw = dict(llds=llds, lr=0.05, vocab_size=len(tok))
    chain = group_delta_after(model, batch, reward, ks=(1, 2, 3), **kw)
    for k, (delta, tok_change) in zip((1, 2, 3), chain):
        alone, alone_tok = group_delta(model, batch, reward, k=k, **kw)
        torch.testing.assert_close(delta, alone, rtol=1e-6, atol=1e-6)  # the same ops in the same order
        torch.testing.assert_close(tok_change, alone_tok, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(chain[0][0], chain[2][0])  # the later updates moved it


def test_wilson_interval_by_hand():
    lo, hi = wilson(5, 10)  # p = 0.5, z = 1.96: centre 0.5, half-width 1.96 x sqrt(0.025 + 0.0096) / 1.384
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert wilson(0, 8)[1] == pytest.approx(0.3244, abs=1e-4) and wilson(0, 0) == (0, 1)  # exact: n = 0's constants
    assert wilson(0, 8)[0] == 0.0  # exact: clamped at 0 by max()


def test_delta_probe_keeps_mixed_groups_and_counts_negative_deltas(monkeypatch):
    """Groups whose answers are all right or all wrong give GRPO nothing and are left out; Delta(x) of a group is the
    mean over its correct responses; the fraction below 0 and the per-set means are over the mixed groups."""
    import probe

    tok = build_tokenizer()
    groups = [group(tok, s) for s in range(4)]
    groups[3]["reward"] = [0.0] * 4  # not mixed
    fake = [torch.tensor([-1.0, 5.0, 3.0, 0.0]), torch.tensor([2.0, 0.0, 1.0, 0.0]),
            torch.tensor([-4.0, 1.0, 0.0, 1.0])]
    calls = iter(fake)

    def fake_delta(model, batch, reward, **kw):
        d = next(calls)
        return [(d, torch.zeros_like(batch["loss_mask"]))]
    monkeypatch.setattr(probe, "group_delta_after", fake_delta)
    (row,) = delta_probe(None, tok, groups, ks=(1,), lambdas=(0.0,), lr=1e-3)
    # correct responses are 0 and 2: Delta(x) = (-1 + 3) / 2 = 1, (2 + 1) / 2 = 1.5, (-4 + 0) / 2 = -2
    assert row["groups"] == 4 and row["mixed"] == 3 and row["frac_neg"] == pytest.approx(1 / 3)
    assert row["delta_correct"] == pytest.approx((1 + 1.5 - 2) / 3)
    assert row["delta_incorrect"] == pytest.approx(((5 + 0) / 2 + 0 + (1 + 1) / 2) / 3)
    assert row["ci95"] == list(wilson(1, 3))


def test_the_command_prints_the_table_and_bad_input_is_one_line(tmp_path):
    """python probe.py on the committed world policy (it answers some questions right: mixed groups) over a generated
    search world, 4 questions x 4, k 1 and 2, lambda 0 and 0.2."""
    import search_world

    search_world.main(["--out", str(tmp_path / "w"), "--sft-steps", "0"])
    out = tmp_path / "delta.json"
    cmd = [sys.executable, "probe.py", "--model", "lab/world0_policy", "--train-data",
           str(tmp_path / "w" / "world_train.jsonl"), "--corpus", str(tmp_path / "w" / "corpus.jsonl")]
    r = hang.run([*cmd, "--questions", "8", "--group-size", "4", "--k", "1", "2", "--llds", "0", "0.2",
                  "--max-turns", "2", "--max-new-tokens", "48", "--max-obs-tokens", "120", "--lr", "1e-3",
                  "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                 env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(x["k"], x["llds"]) for x in rows] == [(1, 0.0), (1, 0.2), (2, 0.0), (2, 0.2)]  # exact: the flags' values
    assert rows[0]["mixed"] >= 1 and "Delta<0" in r.stdout
    for key in ("delta_correct", "delta_incorrect", "delta_correct_first", "delta_incorrect_answer"):
        assert rows[0][key] == pytest.approx(rows[1][key], abs=1e-6)  # k = 1: LLDS is inert
    bad = hang.run([*cmd, "--questions", "0"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("--questions must be >= 1 "
                                                                                "(--max-turns >= 0), got 0")


def interrupted_on_call(n: int, real, calls: list, record=lambda *args: 1):
    """A stand-in for `real` that appends record(*args) to `calls` and raises KeyboardInterrupt (a Ctrl-C) on call n."""
    def stand_in(*args, **kw):
        calls.append(record(*args))
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kw)
    return stand_in


def test_a_stopped_probe_resumes_where_it_stopped(tmp_path, monkeypatch):
    """Killed after its first mixed group, the same command reads back the rollouts and that group's result and does
    only the rest; the table equals an unbroken run's; other flags on a stopped --out are refused in one line."""
    import probe
    import search_world

    search_world.main(["--out", str(tmp_path / "w"), "--sft-steps", "0"])
    cmd = ["--model", "lab/world0_policy", "--train-data", str(tmp_path / "w" / "world_train.jsonl"), "--corpus",
           str(tmp_path / "w" / "corpus.jsonl"), "--questions", "8", "--group-size", "4", "--k", "2", "--llds", "0",
           "0.2", "--max-turns", "2", "--max-new-tokens", "48", "--max-obs-tokens", "120", "--lr", "1e-3"]
    monkeypatch.chdir(ROOT)
    probe.main([*cmd, "--out", str(tmp_path / "whole.json")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w", "whole.json"]  # nothing left beside the table
    real, calls = probe.group_deltas, []
    monkeypatch.setattr(probe, "group_deltas", interrupted_on_call(2, real, calls))
    out = tmp_path / "stopped.json"
    with pytest.raises(KeyboardInterrupt):
        probe.main([*cmd, "--out", str(out)])
    assert not out.exists() and len(Path(f"{out}.partial.jsonl").read_text().splitlines()) == 1
    with pytest.raises(SystemExit, match=r"a stopped probe with other flags \(lr\)"):
        probe.main([*cmd[:-1], "1e-4", "--out", str(out)])
    calls.clear()
    monkeypatch.setattr(probe, "group_deltas", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    probe.main([*cmd, "--out", str(out)])
    whole, resumed = (json.loads((tmp_path / n).read_text())["rows"] for n in ("whole.json", "stopped.json"))
    assert len(calls) == whole[0]["mixed"] - 1 >= 1
    for a, b in zip(whole, resumed):
        assert a.keys() == b.keys() and a["mixed"] == b["mixed"] and a["frac_neg"] == pytest.approx(b["frac_neg"])
        for key in (k for k in a if k.startswith("delta_")):
            assert a[key] == pytest.approx(b[key], abs=1e-5)
    assert not Path(f"{out}.partial.jsonl").exists() and not Path(f"{out}.groups.json").exists()


def test_a_probe_stopped_while_sampling_resumes_its_sampling(tmp_path, monkeypatch):
    """Killed after its first chunk of rollouts, the same command samples only the rest, from the saved random
    stream: the same groups as an unbroken probe's (ids and rewards), and the same table."""
    import probe
    import rollout
    import search_world

    search_world.main(["--out", str(tmp_path / "w"), "--sft-steps", "0"])
    cmd = ["--model", "lab/world0_policy", "--train-data", str(tmp_path / "w" / "world_train.jsonl"), "--corpus",
           str(tmp_path / "w" / "corpus.jsonl"), "--questions", "6", "--group-size", "4", "--k", "1", "--llds", "0",
           "--max-turns", "1", "--max-new-tokens", "32", "--max-obs-tokens", "60", "--lr", "1e-3"]
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(probe, "SAMPLE_CHUNK", 4)  # 6 questions: chunks of 4 and 2
    kept = {}
    real_write = probe.atomic_write

    def keep_groups(path, text):  # the last groups file of each run, before the table removes it
        if str(path).endswith(".groups.json"):
            kept[Path(path).name] = json.loads(text)
        return real_write(path, text)
    monkeypatch.setattr(probe, "atomic_write", keep_groups)
    probe.main([*cmd, "--out", str(tmp_path / "whole.json")])
    real, calls = rollout.rollout, []
    monkeypatch.setattr(rollout, "rollout", interrupted_on_call(2, real, calls, lambda *args: len(args[2])))
    out = tmp_path / "stopped.json"
    with pytest.raises(KeyboardInterrupt):
        probe.main([*cmd, "--out", str(out)])
    assert len(json.loads(Path(f"{out}.groups.json").read_text())["groups"]) == 4
    calls.clear()
    monkeypatch.setattr(rollout, "rollout", lambda *args, **kw: calls.append(len(args[2])) or real(*args, **kw))
    torch.manual_seed(12345)  # as a fresh process's stream would be: the saved one must replace it
    probe.main([*cmd, "--out", str(out)])
    assert calls == [2]  # only the questions not yet sampled
    whole, resumed = kept["whole.json.groups.json"]["groups"], kept["stopped.json.groups.json"]["groups"]
    assert [g["response_ids"] for g in whole] == [g["response_ids"] for g in resumed]  # exact: token ids
    assert [g["reward"] for g in whole] == [g["reward"] for g in resumed]  # exact: 0/1 rewards of the same ids
    a, b = (json.loads((tmp_path / n).read_text())["rows"][0] for n in ("whole.json", "stopped.json"))
    assert a["mixed"] == b["mixed"] and (a["frac_neg"] is None) == (b["frac_neg"] is None)


def test_damaged_saved_files_and_a_folder_as_out_are_one_line(tmp_path, capsys):
    """Issue 50: a damaged OUT.groups.json and an --out that names a folder gave a traceback (the folder only after
    the work); a foreign or non-UTF-8 line in OUT.partial.jsonl did too. Now: one line before any work, and the
    finished groups up to the first line that is not one are kept."""
    import probe

    base = ["--model", str(tmp_path / "no-model"), "--train-data", "q.jsonl", "--corpus", "c.jsonl"]
    with pytest.raises(SystemExit, match="is a folder: name the JSON file to write"):
        probe.main([*base, "--out", str(tmp_path)])
    out = tmp_path / "delta.json"
    for text in ('{"args": ', "[1, 2]", "\xff\xfe"):
        Path(f"{out}.groups.json").write_bytes(text.encode("latin-1"))
        with pytest.raises(SystemExit, match=r"delta.json.groups.json: not a stopped probe's saved groups"):
            probe.main([*base, "--out", str(out)])
    cell = {"correct": -0.5, "incorrect": -1.0}
    good = {"1,0": cell, "1,0.2": cell}
    partial = tmp_path / "p.partial.jsonl"
    partial.write_bytes(b"".join([json.dumps(good).encode() + b"\n"] * 2 + [b'{"other": 1}\n', b"\xff\xfe\n",
                                                                            json.dumps(good).encode() + b"\n"]))
    done = probe.read_finished(partial, [1], [0.0, 0.2])
    assert done == [good, good] and partial.read_text().count("\n") == 2  # exact: JSON read back
    assert "3 line(s) from line 3 on are not a finished group" in capsys.readouterr().out
