"""train.py and evaluate.py end to end on the tiny model, plus the log-prob pass they share (P14, P17, P18)."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hang  # noqa: E402
from tiny import build_model, build_tokenizer, save_tiny  # noqa: E402
from machinery import memory  # noqa: E402
from machinery import policy  # noqa: E402
from machinery.policy import batch_logp, collate, load_policy  # noqa: E402
from rollout import longest_prompt  # noqa: E402
from train import parse_args  # noqa: E402
from conftest import QUESTIONS, SMALL, same_value, train_in_process  # noqa: E402, F401



def run(*cmd, cwd=ROOT):
    return hang.run([sys.executable, *cmd], cwd=cwd, capture_output=True, text=True)


def train_error(*argv) -> str:
    """The error train.py stops with for argv, in this process: SystemExit's message, the one line `python train.py`
    prints with exit status 1 (any other exception fails the test, as a traceback would)."""
    import train

    with pytest.raises(SystemExit) as stop:
        train.main(train.parse_args(list(argv)))
    assert isinstance(stop.value.code, str), stop.value.code
    return stop.value.code






@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_train_runs_two_steps_and_writes_metrics_and_checkpoint(files, amp):
    """The whole loop and evaluate.py on its checkpoint; the loop also under --amp bf16 (CPU autocast)."""
    out = files["dir"] / f"out_{amp}"
    r = run("train.py", "--model", files["model"], "--train-data", files["q"], "--corpus", files["corpus"],
            "--steps", "2", "--llds", "0.1", "--out-dir", str(out), "--amp", amp, *SMALL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 1 |" in r.stdout + r.stderr and "step 2 |" in r.stdout + r.stderr
    lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for key in ("rollout/reward", "grpo/pg_loss", "grpo/kl", "grpo/entropy", "grpo/grad_norm", "grpo/clip_frac",
                "llds/penalty", "llds/gate_rate", "rollout/searches_per_traj", "diag/logp_incorrect",
                "diag/logp_incorrect_after", "diag/seqlogp_correct", "diag/delta_correct", "diag/logp_first_action",
                "alarm/phase", "perf/update_s", "perf/rollout_cpu_s", "perf/logp_cpu_s", "perf/update_cpu_s",
                "perf/step_cpu_s"):
        assert key in lines[0], key
    for m in lines:  # the split adds up, in wall and in CPU seconds
        for unit in ("", "_cpu"):
            parts = sum(m[f"perf/{p}{unit}_s"] for p in ("rollout", "logp", "update"))
            assert m[f"perf/step{unit}_s"] == pytest.approx(parts, rel=1e-9, abs=1e-9) and parts > 0
    # the diagnostics are of this step's update: lr 1e-3 moves the likelihood of the sampled responses
    assert lines[0]["diag/delta_incorrect"] != 0
    assert lines[0]["diag/logp_incorrect_after"] != lines[0]["diag/logp_incorrect"]
    # 8 trajectories in mini-batches of 4: the second mini-batch is off-policy, so LLDS sees a non-zero Delta
    assert any(m["llds/gate_rate"] > 0 for m in lines)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000002"]  # the last step; none left over
    assert (out / "checkpoints" / "step_000002" / "config.json").exists()
    assert (out / "rollouts_step1.jsonl").exists()
    if amp == "bf16":
        return
    ev = run("evaluate.py", "--model", str(out), "--data", files["q"], "--corpus", files["corpus"],
             "--max-new-tokens", "8", "--max-turns", "1", "--out", str(files["dir"] / "eval.json"))
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "average" in ev.stdout and "toy" in ev.stdout
    res = json.loads((files["dir"] / "eval.json").read_text())
    assert res["scores"]["toy"]["n"] == 3 and len(res["records"]) == 3


@pytest.mark.parametrize("bad, message", [
    ('{"question": "q?", "golden_answers": ["a"]}\n{"question": "no gold"}\n', ":2: missing field 'golden_answers'"),
    ('{"question": "q?", "golden_answers": ["a"]}\nnot json\n', ":2: not valid JSON"),
    ("", "no questions"),
])
def test_train_bad_question_file_is_one_clear_line(files, bad, message):
    f = files["dir"] / "bad.jsonl"
    f.write_text(bad)
    assert message in train_error("--model", files["model"], "--train-data", str(f), "--corpus", files["corpus"],
                                  "--steps", "1", "--out-dir", str(files["dir"] / "bad_run"))


def test_bad_out_dir_and_missing_inputs_are_one_line_naming_the_flag_before_the_model_loads(files, tmp_path):
    """`--out-dir FILE` was `error: [Errno 17] File exists: '...'` after the model had loaded (372 s for a real one),
    and a missing --train-data or --corpus named no flag. Each is one line naming its flag now, before the model
    loads (the --model here does not exist: its error would come first otherwise)."""
    (tmp_path / "file").write_text("")
    for flags, line in (
            (["--out-dir", str(tmp_path / "file")], f"error: --out-dir {tmp_path}/file: cannot write there "
                                                    f"({tmp_path}/file is a file, not a folder)"),
            (["--out-dir", str(tmp_path / "file" / "run")], f"error: --out-dir {tmp_path}/file/run: cannot write "
                                                            f"there ({tmp_path}/file is a file, not a folder)"),
            (["--train-data", str(tmp_path / "q.jsonl")], f"error: --train-data {tmp_path}/q.jsonl: not found"),
            (["--corpus", str(tmp_path)], f"error: --corpus {tmp_path}: not found")):
        argv = {"--train-data": files["q"], "--corpus": files["corpus"], "--out-dir": str(tmp_path / "run")}
        argv.update(zip(flags[::2], flags[1::2]))
        assert train_error("--model", "/nope/model", *[x for kv in argv.items() for x in kv], *SMALL) == line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no folder left behind by the checks


def test_a_prompt_longer_than_the_models_context_is_one_line(files, tmp_path):
    """A prompt longer than the model's context trained without a word (positions the model never saw)."""
    long = " ".join(["thing"] * 2500)
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"question": q, "golden_answers": ["a"]}) + "\n"
                                              for q in ("Where is Paris", long)))
    r = run("train.py", "--model", files["model"], "--train-data", str(tmp_path / "q.jsonl"), "--corpus",
            files["corpus"], "--out-dir", str(tmp_path / "run"), *SMALL)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert re.fullmatch(r"error: --train-data: a prompt of \d+ tokens is longer than the model's context of 2048 "
                        r"\('thing thing .*\.\.\.'\); drop such questions or use a model with a longer context",
                        r.stderr.strip().splitlines()[-1]), r.stderr[-2000:]


def test_train_missing_files_are_one_clear_line(files):
    assert "/nope/corpus.jsonl" in train_error("--model", files["model"], "--train-data", files["q"], "--corpus",
                                               "/nope/corpus.jsonl", *SMALL)
    assert "/nope/model" in train_error("--model", "/nope/model", "--train-data", files["q"], "--corpus",
                                        files["corpus"], *SMALL)
    assert "--resume /nope/run: no such run folder" in train_error("--model", files["model"], "--train-data",
                                                                   files["q"], "--resume", "/nope/run", *SMALL)


def test_parse_args_rejects_unknown_choices():
    assert parse_args(["--llds", "0.1", "--llds-gate", "response"]).llds_gate == "response"
    with pytest.raises(SystemExit):
        parse_args(["--llds-gate", "sentence"])


INT_FLAGS = ("--max-new-tokens", "--steps", "--save-every")


@pytest.mark.parametrize("flag, value, valid", [
    ("--lr", "0", "> 0"), ("--lr", "-1e-6", "> 0"), ("--lr", "nan", "> 0"), ("--temperature", "0", "> 0"),
    ("--max-new-tokens", "0", ">= 1"), ("--llds", "-0.1", ">= 0"), ("--clip-eps", "0", "in (0, 1)"),
    ("--grad-clip", "0", "> 0"), ("--steps", "0", ">= 1"), ("--top-p", "1.5", "in (0, 1]"),
    ("--save-every", "0", ">= 1"), ("--warmup-ratio", "2", "in [0, 1]"), ("--retriever-timeout", "0", "> 0 seconds"),
])
def test_parse_args_names_the_flag_and_its_valid_range(capsys, flag, value, valid):
    """Checked at parse time with the valid range (today's main: a crash at step 1 deep inside torch, a silent
    no-op run, or for --steps 0 a "saved" line though nothing was saved)."""
    with pytest.raises(SystemExit) as stop:
        parse_args([f"{flag}={value}"])  # "=": argparse reads "-1e-6" alone as an option
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines  # one line, not argparse's usage block first
    assert lines[0].endswith(f"error: {flag} must be {valid}, got {value if flag in INT_FLAGS else float(value)}")
    parse_args([])  # the defaults are valid


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_a_parse_error(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--device", "cuda"])
    assert "--device cuda: this torch sees no CUDA device" in capsys.readouterr().err


def test_llds_with_one_update_a_step_is_said_to_be_inert(capsys):
    """A step of 16 trajectories in one optimizer step (--mini-batch-size 256, the default) makes every update
    on-policy: Delta is 0, the gate never opens, and a --llds run equals plain GRPO (a real-model pair ran 10 identical
    steps so). train.py says so at start-up; with two updates a step it says nothing."""
    parse_args(["--llds", "0.2", "--prompts-per-step", "4", "--group-size", "4"])
    assert "--llds 0.2 with one update a step: LLDS is inert" in capsys.readouterr().err
    parse_args(["--llds", "0.2", "--prompts-per-step", "4", "--group-size", "4", "--mini-batch-size", "8"])
    parse_args(["--llds", "0", "--prompts-per-step", "4", "--group-size", "4"])
    assert capsys.readouterr().err == ""


def test_prompts_per_step_above_the_question_count_is_an_error(files):
    """Today's main ran 6, 3 and 3 rows of a 3-question file while the log said 8 per step."""
    with pytest.raises(SystemExit, match="--prompts-per-step 8 is more than the 3 questions in"):
        train_in_process(files, files["dir"] / "too_many", "--steps", "1", "--prompts-per-step", "8")


@pytest.mark.parametrize("script", ["retriever.py", "rollout.py", "grpo.py", "llds.py", "-m machinery.fsdp"])
def test_concept_file_runs_alone(script):
    r = run(*script.split())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip()


def test_p24_eval_subset_is_fixed_and_seeded():
    from evaluate import score_table, select

    rows = [{"question": f"q{i}", "golden_answers": ["a"], "data_source": "x"} for i in range(50)]
    assert select(rows, 5, seed=0) == select(rows, 5, seed=0)  # the same questions at every evaluation
    assert select(rows, 5, seed=0) != select(rows, 5, seed=1)
    assert select(rows, 0, seed=0) == rows and select(rows, 500, seed=0) == rows
    table = score_table([{"data_source": "a", "em": 1.0}, {"data_source": "a", "em": 0.0},
                         {"data_source": "b", "em": 1.0}])
    assert table["a"] == pytest.approx({"em": 0.5, "n": 2}) and table["b"] == pytest.approx({"em": 1.0, "n": 1})
    assert table["average"] == pytest.approx({"em": 0.75, "n": 3})  # unweighted mean over sources, as the paper's Avg


def teach_to_search(path, questions, steps=60):
    """save_tiny's model after `steps` Adam steps of teacher forcing on "<search> {question} </search>" after each
    question's prompt, so that its sampled rollouts do search (the random model almost never emits a valid action)."""
    from rollout import make_prompt

    save_tiny(path)
    tok = build_tokenizer()
    model = build_model(tok, seed=0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # far faster for this tiny model on a busy CPU
    for _ in range(steps):
        loss = 0.0
        for q in questions:
            prompt = tok.encode(make_prompt(q["question"], tok), add_special_tokens=False)
            target = tok.encode(f"<search> {q['question']} </search>", add_special_tokens=False)
            labels = torch.tensor([[-100] * len(prompt) + target])
            loss = loss + model(input_ids=torch.tensor([prompt + target]), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.set_num_threads(n)
    model.eval().save_pretrained(path)
    return str(path)


def test_train_same_rewards_in_process_and_served(files):
    """Issue 4 acceptance: one seeded short CPU job, run with the in-process retriever and against `python
    scripts/retrieval_server.py` on localhost, gives the same rewards, the same metrics and the same trajectories
    (retrieved passages included), and evaluate.py runs against the server too; the model is taught to search first,
    so the retriever really is exercised. Both runs use --amp bf16 (CPU autocast), so that path runs end to end as
    well."""
    model = teach_to_search(files["dir"] / "searcher", QUESTIONS)
    server = subprocess.Popen([sys.executable, "scripts/retrieval_server.py", "--corpus", files["corpus"],
                               "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()  # "serving 5 passages (BM25, rank_bm25) at http://127.0.0.1:PORT/retrieve"
        url = line.split(" at ")[-1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/retrieve"), line + server.stderr.read()
        runs = {}
        for name, extra in (("in_process", []), ("served", ["--retriever-url", url])):
            out = files["dir"] / f"same_{name}"
            r = run("train.py", "--model", model, "--train-data", files["q"], "--corpus", files["corpus"], "--steps",
                    "2", "--seed", "1", "--out-dir", str(out), "--amp", "bf16", *SMALL, *extra)  # bf16 end to end too
            assert r.returncode == 0, r.stderr[-3000:]
            metrics = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
            runs[name] = ([{k: v for k, v in m.items() if not k.startswith("perf/")} for m in metrics],
                          (out / "rollouts_step1.jsonl").read_text())
        assert "retriever at " + url in r.stdout  # the second run did use the server
        out = files["dir"] / "same_served" / "eval.json"  # evaluate.py against the server too
        r = run("evaluate.py", "--model", model, "--data", files["q"], "--max-turns", "1", "--max-new-tokens", "16",
                "--out", str(out), "--retriever-url", url, "--corpus", "/nowhere.jsonl")  # the corpus is not read
        assert r.returncode == 0, r.stderr[-3000:]
        records = json.loads(out.read_text())["records"]
    finally:
        server.terminate()
        server.wait(timeout=hang.HANG_S)
    (local_metrics, local_rollouts), (served_metrics, served_rollouts) = runs["in_process"], runs["served"]
    rewards = [[m["rollout/reward"] for m in ms] for ms in (local_metrics, served_metrics)]
    assert rewards[0] == rewards[1]  # exact: one seeded run twice on this machine, the same code on the same passages
    assert local_metrics == served_metrics and local_rollouts == served_rollouts  # exact: the same run, twice
    assert any(m["rollout/searches_per_traj"] > 0 for m in local_metrics)  # the retriever was used ...
    assert "<information>Doc 1(Title:" in local_rollouts  # ... and found passages
    assert any(rec["searches"] and "<information>Doc 1(Title:" in rec["text"] for rec in records)


# ----------------------------------------------------------------------------------------------------------------------
# Issue 5: NaN/inf guard, exact resume (main() run in-process on the tiny model)




# step 1 skips the optimizer step, then the lr schedule moves on (a skipped step still counts): torch warns of that
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
def test_nan_guard_skips_the_update_and_stops_after_k_bad_steps(files, monkeypatch, capsys):
    """A non-finite loss skips the optimizer step (weights and Adam moments untouched), is counted in
    grpo/skipped_steps, and K consecutive skips stop the run with a clear message."""
    import train

    calls, steps_taken, real_loss, real_step = [0], [0], train.grpo_loss, torch.optim.AdamW.step
    nan_calls = set()

    def nan_loss(*a, **kw):  # 8 trajectories, micro-batches of 2: calls 1-4 are step 1, 5-8 step 2, ...
        calls[0] += 1
        pg, m = real_loss(*a, **kw)
        return (pg * float("nan"), m) if calls[0] in nan_calls else (pg, m)

    def counting_step(self, *a, **kw):
        steps_taken[0] += 1
        return real_step(self, *a, **kw)

    monkeypatch.setattr(train, "grpo_loss", nan_loss)
    monkeypatch.setattr(torch.optim.AdamW, "step", counting_step)
    nan_calls.update({1, 2, 3, 4})  # step 1's two mini-batches: 2 skips < K = 3, then the run recovers
    m = train_in_process(files, files["dir"] / "nan1", "--steps", "2", "--max-bad-steps", "3")
    assert [x["grpo/skipped_steps"] for x in m] == [2, 0] and steps_taken[0] == 2
    assert "update skipped" in capsys.readouterr().out

    calls[0], steps_taken[0] = 0, 0
    nan_calls.update(range(100))  # every update is NaN: stop at the end of step 2 (4 consecutive skips >= 3)
    with pytest.raises(SystemExit, match="4 consecutive optimizer steps had a non-finite loss"):
        train_in_process(files, files["dir"] / "nan2", "--steps", "5", "--max-bad-steps", "3")
    m = [json.loads(s) for s in (files["dir"] / "nan2" / "metrics.jsonl").read_text().splitlines()]
    assert [x["grpo/skipped_steps"] for x in m] == [2, 2] and steps_taken[0] == 0




def test_resume_is_exact(files, monkeypatch):
    """Killed right after the step-2 checkpoint and resumed: step 3 has the same metrics (1e-6) and the same final
    weights as an uninterrupted 3-step run; metrics.jsonl continues. Sampling (torch RNG), data order, optimizer and
    scheduler state all matter here: warmup makes the lr step-dependent, and 3 steps x 2 prompts wrap the 3-question
    epoch."""
    import train
    from safetensors.torch import load_file

    flags = ["--steps", "3", "--seed", "3", "--warmup-ratio", "0.5", "--save-every", "2"]
    full = train_in_process(files, files["dir"] / "full", *flags)

    real_save = train.save_checkpoint

    def save_then_die(*a, **kw):
        real_save(*a, **kw)
        raise KeyboardInterrupt  # killed right after the step-2 save

    monkeypatch.setattr(train, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train_in_process(files, files["dir"] / "cut", *flags)
    monkeypatch.setattr(train, "save_checkpoint", real_save)
    torch.manual_seed(123)  # the resumed run must restore the RNG, not inherit it
    resumed = train_in_process(files, files["dir"] / "cut", *flags, "--resume", str(files["dir"] / "cut"))

    assert [m["step"] for m in resumed] == [1, 2, 3]
    for a, b in zip(full, resumed):
        keys = [k for k in a if not k.startswith("perf/")]
        assert keys == [k for k in b if not k.startswith("perf/")]
        for k in keys:  # numbers to 1e-6; None and strings (alarm/phase) exactly
            assert same_value(a[k], b[k]), (a["step"], k, a[k], b[k])
    w_full = load_file(files["dir"] / "full" / "checkpoints" / "step_000003" / "model.safetensors")
    w_res = load_file(files["dir"] / "cut" / "checkpoints" / "step_000003" / "model.safetensors")
    assert all(torch.equal(w_full[k], w_res[k]) for k in w_full)  # exact: a resume reruns the same code, bit for bit
    assert full[2]["grpo/lr"] != full[0]["grpo/lr"]  # the schedule was live


def test_amp_every_log_prob_pass_uses_the_current_weights(files, monkeypatch):
    """--amp bf16: autocast caches the bf16 copy of each Linear weight until its context exits, so one context around
    the optimizer steps makes the second mini-batch and the after-update pass compute with the old Linear weights
    (while embeddings and norms move on). Every log-prob forward of a run (old, ref, both mini-batches, after) must
    give the logits that a fresh model holding the weights of that moment gives."""
    import copy

    import train

    passes, hooks = [], []
    real_load = train.load_policy

    def load_and_watch(*a, **kw):
        model, tok, device = real_load(*a, **kw)

        def before(mod, args, kwargs):
            if kwargs.get("use_cache") is False:  # the log-prob passes (generate uses the KV cache)
                passes.append({"model": mod, "state": copy.deepcopy(mod.state_dict()), "kwargs": kwargs})

        def after(mod, args, kwargs, out):
            if kwargs.get("use_cache") is False:
                passes[-1]["logits"] = out.logits.detach().clone()
        hooks.append(model.register_forward_pre_hook(before, with_kwargs=True))
        hooks.append(model.register_forward_hook(after, with_kwargs=True))
        return model, tok, device

    monkeypatch.setattr(train, "load_policy", load_and_watch)
    monkeypatch.setattr("machinery.policy.load_policy", load_and_watch)  # the reference is loaded through it
    train_in_process(files, files["dir"] / "amp_fresh", "--steps", "1", "--amp", "bf16", "--lr", "1e-2",
                     "--probe-questions", "0")  # the probe's passes: tests/test_probe.py
    # 8 trajectories in micro-batches of 2: old (the second mini-batch only: the first's are the update's own
    # forward), ref, update (2 mini-batches), after
    assert len(passes) == 2 + 4 + 4 + 4
    for h in hooks:
        h.remove()
    for i, p in enumerate(passes):
        fresh = copy.deepcopy(p["model"])  # the policy, or the (bf16) reference
        fresh.load_state_dict(p["state"])
        with torch.no_grad(), torch.autocast(p["logits"].device.type, torch.bfloat16):  # cpu, or cuda on a GPU
            logits = fresh(**p["kwargs"]).logits
        torch.testing.assert_close(logits, p["logits"], atol=1e-3, rtol=0, msg=f"forward {i}")
    policy = [p for p in passes if p["model"] is passes[0]["model"]]
    moved = [p for p in policy  # exact: any change of the weights counts as moved
             if not torch.equal(p["state"]["lm_head.weight"], policy[0]["state"]["lm_head.weight"])]
    assert len(moved) == 2 + 4  # the second mini-batch and the after pass saw updated weights


def test_ref_offload_gives_the_same_run(files, monkeypatch):
    """--ref-offload (write the reference once in --ref-dtype to OUT_DIR/.ref, reload it for each step's pass, free it
    before the update) changes memory, not numbers: the same metrics as keeping the reference resident, in either
    dtype; the copy is removed at the end."""
    import train

    kept = train_in_process(files, files["dir"] / "ref_kept", "--steps", "2", "--ref-dtype", "float32")
    loads = []
    real_load = train.load_policy

    def watch(name, *a):
        loads.append((Path(name).name, *a))
        return real_load(name, *a)

    monkeypatch.setattr(train, "load_policy", watch)
    monkeypatch.setattr(policy, "load_policy", watch)  # the reference is loaded (and offloaded) through it
    offloaded = train_in_process(files, files["dir"] / "ref_off", "--steps", "2", "--ref-offload",
                                 "--ref-dtype", "float32")
    monkeypatch.undo()
    assert [n for n, *_ in loads] == ["model", "model", ".ref", ".ref"]  # policy, the copy's source, one per step
    assert not (files["dir"] / "ref_off" / ".ref").exists()
    for a, b in zip(kept, offloaded, strict=True):
        for k in a:
            if not k.startswith("perf/"):
                assert a[k] == b[k] or a[k] == pytest.approx(b[k], abs=1e-7), k
    assert kept[1]["grpo/kl"] > 0
    bf16 = train_in_process(files, files["dir"] / "ref_kept16", "--steps", "2")  # the default --ref-dtype bfloat16
    bf16_off = train_in_process(files, files["dir"] / "ref_off16", "--steps", "2", "--ref-offload")
    assert [m["grpo/kl"] for m in bf16] == pytest.approx([m["grpo/kl"] for m in bf16_off], abs=1e-7)


def test_max_obs_tokens_too_small_for_the_tags_is_a_start_up_error(files):
    """Today's main failed at the first search of a run (ValueError deep in the rollout)."""
    with pytest.raises(SystemExit, match="--max-obs-tokens 3 is too small: max_obs_tokens=3 cannot hold the "
                                         "<information> tags"):
        train_in_process(files, files["dir"] / "obs_small", "--steps", "1", "--max-obs-tokens", "3")


def test_bm25_and_retriever_timeout_flags_reach_the_retriever(files, monkeypatch):
    import train

    seen = {}

    def fake(corpus, url="", **kw):
        seen.update(kw, corpus=corpus, url=url)
        raise ValueError("stop here")

    monkeypatch.setattr(train, "make_retriever", fake)
    with pytest.raises(SystemExit, match="stop here"):
        train_in_process(files, files["dir"] / "bm25_flag", "--bm25", "okapi", "--retriever-timeout", "7")
    assert seen["bm25"] == "okapi" and seen["timeout"] == 7.0 and seen["corpus"] == files["corpus"]  # exact: settings


# Issue 16: the memory plan at start-up, --gen-batch-size auto from a fake free-memory figure


def test_gen_batch_size_auto_prints_the_plan_and_sizes_the_generate_calls(files, monkeypatch, capsys):
    from machinery import engine
    import train

    sizes = []
    real = engine.GENERATORS[train.Args.generator]  # the default engine
    monkeypatch.setitem(engine.GENERATORS, train.Args.generator,
                        lambda *a, **kw: sizes.append(kw["batch_size"]) or real(*a, **kw))
    # the tiny model (fp32 on CPU, --amp auto: no autocast): 2 layers x 2 KV heads x 16 x 2 x 4 bytes = 512 bytes
    # per token of KV cache, + 3 x 128 x 4 of prefill MLP + the context's mask; context: the longest prompt of the
    # questions (the plan sizes rows from the prompts the run will see; it assumed 256 tokens) + 2 x (16 + 48) + 16
    # (memory.row_bytes). Free: the static memory plus just enough for the update's 1-row micro-batches with
    # --grad-ckpt (memory.update_activation_bytes); the generate calls get 0.9 x that / the row's bytes
    model, tokenizer, _ = load_policy(files["model"], "float32", "cpu")
    prompt = longest_prompt(tokenizer, QUESTIONS, 2048)
    context, n = prompt + 2 * (16 + 48) + 16, sum(p.numel() for p in model.parameters())
    assert prompt > 100 and memory.row_bytes(model.config, context, 4) == context * (512 + 1536 + context)  # exact
    static = n * (4 + 4 + 8 + 4)  # fp32 policy, gradients, AdamW m and v, reference (--ref-dtype float32)
    left = memory.update_activation_bytes(model, 1, context, context - prompt, grad_ckpt=True,
                                          bf16_autocast=False) / 0.9 + 1e3
    rows = int(0.9 * left // (context * (512 + 1536 + context)))
    assert 1 < rows < 8  # a turn has 2 x 4 rows: the memory, not the cap, decides
    monkeypatch.setattr(train, "free_memory", lambda device: static + left)
    train_in_process(files, files["dir"] / "auto", "--steps", "1", "--gen-batch-size", "auto", "--ref-dtype", "float32",
                     "--device", "cpu", "--micro-batch-size", "1", "--grad-ckpt")  # CPU figures (GPU: bf16)
    out = capsys.readouterr().out
    assert "memory plan per rank:" in out and \
        f"{rows} rows per call x {context} tokens x (KV 512 + prefill {1536 + context:,}" in out, out
    assert f"+ update: --micro-batch-size 1 (as given), --grad-ckpt on (as given): 1 x {context} tokens" in out
    assert sizes == [rows, rows] and "step 1 |" in out  # the probe's step-0 rollout (probe.py), then step 1's
    monkeypatch.setattr(train, "free_memory", lambda device: 2**20)  # 1 MiB: not even the static memory
    with pytest.raises(SystemExit, match="error: --gen-batch-size auto: one generate row needs .* lower "
                                         "--max-new-tokens, --max-turns or --max-obs-tokens"):
        train_in_process(files, files["dir"] / "auto_small", "--steps", "1", "--gen-batch-size", "auto")


def test_the_plan_turns_on_grad_ckpt_when_the_update_needs_it_or_stops_naming_the_flags(files, monkeypatch, capsys):
    """--grad-ckpt unset: on when the update fits only with it (the decoder layers are really wrapped); a micro-batch
    size and --no-grad-ckpt given that do not fit stop before step 1 with one line naming the flags."""
    import train

    wrapped = []
    monkeypatch.setattr(train, "enable_grad_ckpt", lambda m: wrapped.append(m) or policy.enable_grad_ckpt(m))
    model, tokenizer, _ = load_policy(files["model"], "float32", "cpu")
    static = sum(p.numel() for p in model.parameters()) * (4 + 4 + 8 + 4)
    context = longest_prompt(tokenizer, QUESTIONS, 2048) + 144  # the longest prompt + 2 x (16 + 48) + 16
    need = {ck: memory.update_activation_bytes(model, 2, context, 144, grad_ckpt=ck, bf16_autocast=False)
            for ck in (0, 1)}
    assert need[1] < need[0]
    monkeypatch.setattr(train, "free_memory", lambda device: static + need[1] / 0.9 + 1e3)  # room with checkpointing
    metrics = train_in_process(files, files["dir"] / "ckpt_auto", "--steps", "1", "--ref-dtype", "float32",
                               "--device", "cpu")
    out = capsys.readouterr().out
    assert "--micro-batch-size 2 (as given), --grad-ckpt on (chosen by the plan)" in out, out
    assert len(wrapped) == 1 and metrics[0]["step"] == 1
    with pytest.raises(SystemExit) as stop:
        train_in_process(files, files["dir"] / "ckpt_off", "--steps", "1", "--ref-dtype", "float32", "--device", "cpu",
                         "--no-grad-ckpt")
    msg = str(stop.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("error: the update does not fit: 2 row(s) per micro-batch x "
                                                         f"{context} tokens without --grad-ckpt need"), msg
    assert "use --micro-batch-size 1, --grad-ckpt, --ref-offload, --fsdp" in msg
    assert "step 1 |" not in capsys.readouterr().out

# Issue 22: every logged loss metric is the exact mean over the mini-batch, however it is split into micro-batches


@pytest.mark.parametrize("gate", ["action", "response", "token"])
def test_update_metrics_are_the_same_for_micro_batches_of_1_3_and_7_rows(gate):
    """One 7-row mini-batch split into micro-batches of 1, 3 and 7 rows logs the same value for every metric key; the
    unit-counting LLDS means (gate_rate, delta_mean, frac_tokens) equal llds_loss on the whole batch at once."""
    from grpo import group_advantages
    from llds import llds_loss
    from train import update

    tok = build_tokenizer()
    g = torch.Generator().manual_seed(0)

    class E:  # the fields collate reads: ragged rows, observation gaps (several actions per row), an answer span
        def __init__(self, n_prompt, n_resp):
            self.prompt_ids = torch.randint(5, len(tok), (n_prompt,), generator=g).tolist()
            self.response_ids = torch.randint(5, len(tok), (n_resp,), generator=g).tolist()
            self.loss_mask = [0 if 3 <= t < 6 or 9 <= t < 11 else 1 for t in range(n_resp)]  # two observations
            self.answer_mask = [1 if t >= n_resp - 2 else 0 for t in range(n_resp)]

    batch = collate([E(p, r) for p, r in [(4, 14), (6, 5), (3, 12), (5, 16), (2, 7), (7, 13), (4, 3)]],
                    tok.pad_token_id)
    with torch.no_grad():
        logp0 = batch_logp(build_model(tok, seed=0), batch, 7, 1.0, len(tok))  # [7, T]
    # the rollout policy's log-probs 0.4 nats away in either direction: every Delta is far from 0, so no gate or
    # threshold can flip on the last bit of a forward pass whose padding differs with the split
    old_logp = logp0 + 0.4 * torch.randn(logp0.shape, generator=g).sign()
    ref_logp = logp0 + 0.1 * torch.randn(logp0.shape, generator=g)
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]), [0, 0, 0, 1, 1, 1, 2])  # A < 0, > 0, 0
    logged = {}
    for micro in (1, 3, 7):
        model = build_model(tok, seed=0)
        args = parse_args(["--micro-batch-size", str(micro), "--mini-batch-size", "7", "--llds", "0.1",
                           "--llds-gate", gate, "--kl-coef", "0.01", "--device", "cpu"])
        per_mini, *_ = update(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, old_logp, ref_logp,
                              adv, None, args, len(tok), mini_batch_size=7)
        logged[micro] = per_mini[0]
    assert set(logged[1]) == set(logged[3]) == set(logged[7])
    for key in logged[7]:  # float32 forward passes of differently padded micro-batches agree to ~1e-6
        assert logged[1][key] == pytest.approx(logged[7][key], rel=1e-4, abs=1e-6), (key, logged)
        assert logged[3][key] == pytest.approx(logged[7][key], rel=1e-4, abs=1e-6), (key, logged)
    _, whole = llds_loss(logp0, old_logp, adv, batch["loss_mask"], gate=gate)  # the model has not moved yet
    for key in ("llds/gate_rate", "llds/delta_mean", "llds/frac_tokens", "llds/units", "llds/kept_tokens"):
        assert logged[1][key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key


# Issue 24: --report-to sends every step's metrics to a tracker (watched live), imported only when asked for


def test_report_to_sends_each_steps_metrics_and_a_resumed_run_continues_the_same_run(files, monkeypatch):
    """A stand-in for the wandb module (the package is no requirement of ours) records what train.py sends: one init
    per process with the same run id for a run and its resume, each step's numeric metrics at its step, a finish."""
    import importlib.machinery
    import types

    calls = []
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init = lambda **kw: calls.append(("init", kw))
    fake.log = lambda metrics, step: calls.append(("log", step, metrics))
    fake.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    out = files["dir"] / "tracked"
    train_in_process(files, out, "--steps", "2", "--report-to", "wandb", "--save-every", "1")
    history = train_in_process(files, out, "--steps", "3", "--report-to", "wandb", "--resume", str(out))
    inits = [c[1] for c in calls if c[0] == "init"]
    assert len(inits) == 2 and inits[0]["id"] == inits[1]["id"] and inits[0]["resume"] == "allow"
    assert inits[0]["project"] == "llds-grpo" and inits[0]["config"]["report_to"] == "wandb"
    logs = [c for c in calls if c[0] == "log"]
    assert [c[1] for c in logs] == [1, 2, 3] and [c[0] for c in calls].count("finish") == 2
    for (_, step, sent), h in zip(logs, history):
        assert sent["rollout/reward"] == pytest.approx(h["rollout/reward"]) and "alarm/phase" not in sent


def test_a_tracker_that_fails_mid_run_warns_once_and_the_run_goes_on(files, monkeypatch, capsys):
    """A wandb whose log() raised ConnectionError at step 2 ended the run; metrics.jsonl is the record and the tracker
    only for watching, so now it is one warning line, the tracker is left alone, and every step is trained and
    written."""
    import importlib.machinery
    import types

    calls = []

    def log(metrics, step):
        calls.append(step)
        if step >= 2:
            raise ConnectionError("api.wandb.ai: connection reset")
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init, fake.log, fake.finish = (lambda **kw: None), log, (lambda: calls.append("finish"))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    out = files["dir"] / "tracker_fails"
    history = train_in_process(files, out, "--steps", "3", "--report-to", "wandb")
    assert [h["step"] for h in history] == [1, 2, 3] and calls == [1, 2, "finish"]
    warnings = [line[line.index("warning:"):] for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert warnings == [f"warning: --report-to wandb: sending step 2's metrics failed (ConnectionError: api.wandb.ai: "
                        f"connection reset); the run goes on without the tracker (every step is in "
                        f"{out.resolve() / 'metrics.jsonl'})"]


def test_report_to_a_tracker_that_is_not_installed_is_one_line():
    out = hang.run([sys.executable, "train.py", "--report-to", "trackio"], cwd=ROOT, capture_output=True,
                   text=True)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].endswith(
        "error: --report-to trackio: the trackio package is not installed (pip install trackio), or leave --report-to "
        "off")


def test_the_skipped_old_pass_gives_the_same_run(files, monkeypatch):
    """The old log-prob pass skips the first mini-batch: `update` takes its rows from its own forward, detached,
    before the first optimizer step (the rollout's policy). Against the same run whose pass covers every row (update
    then reads them all): every metric (fp32: 1e-6) and the final weights are the same, with 2 mini-batches a step
    (the second's old log-probs still from the pass) and with 1 (no pass at all)."""
    import train
    from safetensors.torch import load_file

    real, shapes = train.logp_pass, []
    for mini in ("4", "8"):  # 8 trajectories a step: 2 mini-batches, then 1
        flags = ["--steps", "2", "--seed", "5", "--mini-batch-size", mini, "--probe-questions", "0"]
        skipped = train_in_process(files, files["dir"] / f"skip{mini}", *flags)

        def every_row(*a, skip_first=False, **kw):  # the pass over every row, as the official code makes it
            logp = real(*a, **kw)
            shapes.append((skip_first, logp.shape[0]))
            return logp

        monkeypatch.setattr(train, "logp_pass", every_row)
        full = train_in_process(files, files["dir"] / f"pass{mini}", *flags)
        monkeypatch.setattr(train, "logp_pass", real)
        assert (True, 8) in shapes  # the skip was asked for, and overridden: update got all 8 rows
        for a, b in zip(skipped, full, strict=True):
            keys = [k for k in a if not k.startswith("perf/")]
            assert keys == [k for k in b if not k.startswith("perf/")]
            differ = [(k, a[k], b[k]) for k in keys if not same_value(a[k], b[k])]
            assert not differ, differ
        w = [load_file(files["dir"] / f"{run}{mini}" / "checkpoints" / "step_000002" / "model.safetensors")
             for run in ("skip", "pass")]
        for k in w[0]:
            torch.testing.assert_close(w[0][k], w[1][k], rtol=1e-5, atol=1e-6)  # fp32


def test_reference_dtype_auto_is_bf16_only_where_bf16_is_fast(monkeypatch, files, capsys):
    from machinery import policy

    assert isinstance(policy.cpu_has_bf16(), bool)  # this machine's answer (torch.cpu's helpers), whichever it is
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: False)  # an AVX2 CPU: bf16 is emulated, ~8x slower
    assert policy.reference_dtype("auto", "cpu") == "float32" and policy.reference_dtype("auto", "cuda:0") == "bfloat16"
    assert policy.reference_dtype("bfloat16", "cpu") == "bfloat16"  # as given
    train_in_process(files, files["dir"] / "ref_auto", "--steps", "1", "--device", "cpu", "--amp", "auto")
    assert "1 x cpu, fp32 (--amp auto), reference float32 |" in capsys.readouterr().out  # the line says
    saved = json.loads((files["dir"] / "ref_auto" / "args.json").read_text())
    assert saved["ref_dtype"] == "float32"  # exact: a dtype's name, a string
    assert not isinstance(policy.autocast("auto", "cpu")(), torch.autocast)  # issue 51: fp32 where bf16 is slow
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: True)  # AVX512-BF16 or AMX
    assert policy.reference_dtype("auto", "cpu") == "bfloat16"
    assert isinstance(policy.autocast("auto", "cpu")(), torch.autocast)  # and bf16 autocast where it is fast
    assert not isinstance(policy.autocast("auto", "cpu", fsdp=True)(), torch.autocast)  # FSDP's own precision
    assert not isinstance(policy.autocast("auto", "cpu", dtype="bfloat16")(), torch.autocast)  # bf16 weights
    assert not isinstance(policy.autocast("off", "cpu")(), torch.autocast)


def test_calib_adv_gives_the_policy_gradient_calibadvs_token_advantages(files, monkeypatch):
    """--calib-adv (issue 49): each step's episodes' turn scores (machinery.calibadv) go through grpo.calibadv_advantages,
    whose [B, T] advantages reach the policy-gradient term (LLDS keeps the response advantages); off (0, the default)
    it is not called."""

    import train

    seen, real = [], train.calibadv_advantages

    def watch(adv, loss_mask, group_ids, turn_scores, target_ratio):
        out = real(adv, loss_mask, group_ids, turn_scores, target_ratio)
        seen.append((target_ratio, tuple(out.shape), tuple(loss_mask.shape), len(turn_scores)))
        return out

    monkeypatch.setattr(train, "calibadv_advantages", watch)
    rows = train_in_process(files, files["dir"] / "calib", "--steps", "2", "--calib-adv", "1.0")
    assert len(rows) == 2 and all(math.isfinite(m["grpo/pg_loss"]) for m in rows)
    calls = [(r, out == mask, n == mask[0]) for r, out, mask, n in seen]  # one score list a trajectory
    assert calls == [(1.0, True, True)] * 2  # exact: the flag, passed on
    seen.clear()
    train_in_process(files, files["dir"] / "calib_off", "--steps", "1")
    assert seen == []  # off by default: never called


def test_the_probe_costs_a_tenth_of_a_step_by_default():
    """--probe-every auto (issue 51): the fixed probe, one pass over probe_questions x group_size responses, made
    every step cost 0.22 of a SmolLM2 step at 4 prompts x 4 (results/real_model's lr-3e-5 pilot: 67 of 302 s); auto
    probes every ceil(1.25 x probe_questions / prompts_per_step) steps: every 3rd there, every step at the main
    command's 512 prompts; a number is kept, anything else is one line."""
    assert parse_args([]).probe_every == 1  # 512 prompts: the probe is ~0.2% of a step
    assert [parse_args(["--prompts-per-step", str(p)]).probe_every for p in (4, 8, 16)] == [3, 2, 1]
    assert parse_args(["--prompts-per-step", "4", "--probe-questions", "0"]).probe_every == 1  # off anyway
    assert parse_args(["--probe-every", "5"]).probe_every == 5
    r = run("train.py", "--probe-every", "0")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == \
        "train.py: error: --probe-every must be an integer >= 1 or auto, got 0"
