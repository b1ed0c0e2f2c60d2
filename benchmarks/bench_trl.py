"""Benchmark: one GRPO step of train.py and of TRL's GRPOTrainer side by side, on the same model and prompts.

Both take the same 2 questions (tests/fixtures/qa_sample, in Search-R1's prompt), 4 answers each (8 rows), one
answer turn of --new-tokens tokens (train.py --max-turns 0: no search, as TRL's single turn), temperature 1, KL 0.001
to the model as reference, one optimizer step of the 8 rows (train.py --mini-batch-size 8; TRL's batch), AdamW at lr
1e-6, fp32, on the CPU, each in a fresh process on one thread (OMP_NUM_THREADS=1). Each process times its phases in
CPU seconds (time.process_time: all threads) and wall seconds: generation, the log-prob passes before the update (old
and reference), the update; train.py from its perf/* keys (its update also holds the after-update pass of the
diagnostics, timed apart here from the update's own), TRL by wrapping GRPOTrainer._generate, the
_get_per_token_logps_and_entropies calls made while scoring, and training_step. It prints per phase the CPU seconds,
the tokens, the ratio TRL / train.py, and the fraction of this machine's fp32 matmul peak (a 1-thread torch.mm of
1024^3, measured here) that the phase's FLOPs reach: 2 N per generated or scored token, 6 N per trained token (N: the
model's parameters; attention left out), and each process's peak RSS. The samples differ (each framework draws its
own), so the tokens are printed beside the seconds. Nothing is asserted. --defaults runs each tool at its own defaults
instead of fp32 for both: train.py's --amp auto (bf16 autocast on a CPU with bf16 units, fp32 elsewhere) and its fixed
probe (--probe-every auto; its responses are sampled before step 1, outside the timed step), TRL's GRPOConfig bf16
(True by default); the batch, tokens and optimizer stay the same.

    pip install trl==1.16.0                                    # TRL is not a requirement of this project
    python benchmarks/bench_trl.py --model ~/.cache/offline-models/smollm2 --new-tokens 128 [--defaults]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
QUESTIONS = ROOT / "tests" / "fixtures" / "qa_sample" / "hotpotqa_train.jsonl"
CORPUS = ROOT / "tests" / "fixtures" / "qa_sample" / "corpus.jsonl"


def matmul_peak(n: int = 1024, reps: int = 5) -> float:
    """fp32 FLOP per CPU-second of one thread's torch.mm of n x n x n, the best of `reps` after a warm-up."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = 0.0
    for _ in range(reps):
        t = time.process_time()
        torch.mm(a, b)
        best = max(best, 2 * n ** 3 / max(time.process_time() - t, 1e-9))
    return best


def run_ours(model: str, new_tokens: int, out: Path, defaults: bool = False) -> dict:
    """train.py, one step, in this process (train.py of this checkout, or of --before's), its phases timed by
    wrapping train.rollout, train.batch_logp (before the update: old and reference passes; after: the after-update
    pass) and train.update; the step from the rollout's start to the step's log line."""
    import dataclasses

    import train

    phases = {k: [0.0, 0.0] for k in ("generation", "logp", "update", "after-update pass")}
    marks, tokens = {}, {}

    def wrap(name, phase):
        real = getattr(train, name)

        def timed(*a, **kw):
            if name == "rollout":
                marks["start"] = (time.process_time(), time.time())
            w, c = time.time(), time.process_time()
            try:
                return real(*a, **kw)
            finally:
                key = phase if name != "batch_logp" or "update" not in marks else "after-update pass"
                phases[key][0] += time.process_time() - c
                phases[key][1] += time.time() - w
                if name == "update":
                    marks["update"] = True
        setattr(train, name, timed)
    for name, phase in (("rollout", "generation"), ("batch_logp", "logp"), ("update", "update")):
        wrap(name, phase)
    collate, log_step = train.collate, train.log_step

    def counted(episodes, pad_id):
        batch = collate(episodes, pad_id)
        tokens["trained"] = int(batch["attention_mask"].sum())
        tokens["generated"] = int(batch["loss_mask"].sum())
        return batch

    def logged(*a, **kw):
        marks["end"] = (time.process_time(), time.time())
        return log_step(*a, **kw)
    train.collate, train.log_step = counted, logged
    train.save_checkpoint = lambda *a, **kw: None
    current = "probe_questions" in {f.name for f in dataclasses.fields(train.Args)}  # this checkout, not --before's
    probe = ["--probe-questions", "0"] if current else []
    precision = ["--amp", "off"]
    if defaults:
        probe = precision = []
    args = train.parse_args(["--model", model, "--train-data", str(QUESTIONS), "--corpus", str(CORPUS),
                             "--out-dir", str(out), "--steps", "1", "--prompts-per-step", "2", "--group-size", "4",
                             "--max-turns", "0", "--max-new-tokens", str(new_tokens), "--mini-batch-size", "8",
                             "--micro-batch-size", "8", "--kl-coef", "0.001", "--lr", "1e-6", "--warmup-ratio", "0",
                             "--device", "cpu", "--overwrite", *precision, *probe])
    train.main(args)
    step = tuple(e - s for e, s in zip(marks["end"], marks["start"]))
    from machinery.policy import autocast

    bf16 = isinstance(autocast(args.amp, "cpu", args.dtype)(), __import__("torch").autocast)
    return {**{k: tuple(v) for k, v in phases.items()}, "step": step, "tokens": tokens, "ref_dtype": args.ref_dtype,
            # logp_passes: this checkout the reference only (one mini-batch); before: old too
            "logp_passes": 1 if current else 2, "precision": "bf16 autocast" if bf16 else "fp32"}


def run_trl(model: str, new_tokens: int, out: Path, defaults: bool = False) -> dict:
    """TRL's GRPOTrainer, one step, in this process, its phases timed by wrapping its methods."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from machinery.data import load_questions
    from rollout import em_check, extract_answer, make_prompt

    tok = AutoTokenizer.from_pretrained(model)
    rows = load_questions(str(QUESTIONS))[:2]
    golden = {make_prompt(r["question"], tok): r["golden_answers"] for r in rows}
    data = Dataset.from_list([{"prompt": p} for p in golden])

    def reward(prompts, completions, **kw):  # Search-R1's exact match of the final <answer>, as train.py's reward
        return [float(em_check(extract_answer(c) or "", golden[p])) for p, c in zip(prompts, completions)]

    cfg = GRPOConfig(output_dir=str(out), num_generations=4, per_device_train_batch_size=8, max_steps=1,
                     max_completion_length=new_tokens, beta=0.001, temperature=1.0, top_p=0.95, learning_rate=1e-6,
                     use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_dropout=True,
                     loss_type="grpo", **({} if defaults else {"bf16": False}))
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), args=cfg,
                          reward_funcs=reward, train_dataset=data, processing_class=tok)
    phases = {k: [0.0, 0.0] for k in ("generation", "logp", "update")}
    scoring, tokens = [False], {}

    def wrap(obj, name, phase, when=lambda: True):
        real = getattr(obj, name)

        def timed(*a, **kw):
            if not when():
                return real(*a, **kw)
            w, c = time.time(), time.process_time()
            try:
                return real(*a, **kw)
            finally:
                phases[phase][0] += time.process_time() - c
                phases[phase][1] += time.time() - w
        setattr(obj, name, timed)

    score = trainer._generate_and_score_completions

    def scored(*a, **kw):
        scoring[0] = True
        try:
            out = score(*a, **kw)
        finally:
            scoring[0] = False
        tokens["generated"] = int(out["completion_mask"].sum())
        tokens["trained"] = tokens["generated"] + int(out["prompt_mask"].sum())
        return out
    trainer._generate_and_score_completions = scored
    wrap(trainer, "_generate", "generation")
    wrap(trainer, "_get_per_token_logps_and_entropies", "logp", when=lambda: scoring[0])
    step_w, step_c = time.time(), time.process_time()
    train_step = trainer.training_step

    def update(*a, **kw):  # training_step = scoring (generation + logp, timed inside) + the loss, backward, step
        w, c = time.time(), time.process_time()
        out = train_step(*a, **kw)
        phases["update"][0] += time.process_time() - c - phases["generation"][0] - phases["logp"][0]
        phases["update"][1] += time.time() - w - phases["generation"][1] - phases["logp"][1]
        return out
    trainer.training_step = update
    trainer.train()
    step = (time.process_time() - step_c, time.time() - step_w)
    return {**{k: tuple(v) for k, v in phases.items()}, "step": step, "tokens": tokens,
            "logp_passes": 1 if trainer.ref_model is not None or cfg.beta else 0,
            "precision": "bf16" if cfg.bf16 else "fp32"}


def child(which: str, model: str, new_tokens: int, out: str, root: str, defaults: str = "0"):
    import torch

    sys.path.insert(0, root)  # "before": train.py of another checkout (git worktree of --before)
    torch.manual_seed(0)
    run = run_trl if which == "trl" else run_ours
    got = run(model, new_tokens, Path(out) / which, **({"defaults": True} if defaults == "1" else {}))
    got["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    got["params"] = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(
        model).parameters())
    (Path(out) / f"{which}.json").write_text(json.dumps(got))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a local model folder (e.g. SmolLM2-135M-Instruct)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens of the answer turn (default 128)")
    ap.add_argument("--before", help="also run train.py as of this git revision (a temporary worktree): before/after")
    ap.add_argument("--defaults", action="store_true",
                    help="each tool at its own defaults (precision, train.py's probe), not fp32 for both")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], int(a.child[2]), a.child[3], a.child[4], a.child[5])
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise SystemExit("error: TRL is not installed: pip install trl==1.16.0 (a benchmark-only package)")
    if not a.model or not Path(a.model).expanduser().is_dir():
        raise SystemExit(f"error: --model {a.model}: not a folder")
    import torch

    torch.set_num_threads(1)
    peak = matmul_peak()
    print(f"CPU {torch.backends.cpu.get_cpu_capability()} | fp32 matmul peak, one thread: {peak / 1e9:.1f} GFLOP/s | "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"ours": ROOT, "trl": ROOT}
        if a.before:
            roots = {"before": Path(tmp) / "before", **roots}
            subprocess.run(["git", "worktree", "add", "--detach", str(roots["before"]), a.before], cwd=ROOT, check=True,
                           capture_output=True)
        try:
            for which, root in roots.items():
                r = subprocess.run([sys.executable, __file__, "--child", which, str(Path(a.model).expanduser()),
                                    str(a.new_tokens), tmp, str(root), "1" if a.defaults else "0"], cwd=root,
                                   capture_output=True, text=True,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
                if r.returncode:
                    raise SystemExit(f"error: the {which} step failed:\n{r.stderr[-3000:]}")
                got[which] = json.loads((Path(tmp) / f"{which}.json").read_text())
        finally:
            if a.before:
                subprocess.run(["git", "worktree", "remove", "--force", str(roots["before"])], cwd=ROOT)
    n = got["ours"]["params"]
    print("precision: " + ", ".join(f"{c} {got[c].get('precision', '?')}" for c in got)
          + (" (each tool's defaults)" if a.defaults else " (fp32 for both)"))
    print(f"{n / 1e6:.0f}M parameters; train.py's reference: {got['ours']['ref_dtype']}; tokens generated (scored / "
          f"trained): train.py {got['ours']['tokens']['generated']} ({got['ours']['tokens']['trained']}), TRL "
          f"{got['trl']['tokens']['generated']} ({got['trl']['tokens']['trained']})")
    cols = list(got)  # [before,] ours, trl
    print("CPU seconds per phase (% of the fp32 matmul peak its FLOPs reach); TRL / train.py now")
    print(f"{'phase':<18}" + "".join(f"{c:>20}" for c in cols) + f"{'TRL / ours':>11}")

    def frac(r, phase):
        t, passes = r["tokens"], r.get("logp_passes", 1)
        flops = {"generation": 2 * n * t["generated"], "logp": 2 * n * t["trained"] * passes,
                 "update": 6 * n * t["trained"], "after-update pass": 2 * n * t["trained"]}.get(phase)
        return f" ({flops / r[phase][0] / peak:.0%})" if flops and r[phase][0] > 0 else ""
    for phase in ("generation", "logp", "update", "after-update pass", "step"):
        cells = [f"{got[c][phase][0]:.1f}{frac(got[c], phase)}" if phase in got[c] else "-" for c in cols]
        ratio = got["trl"][phase][0] / got["ours"][phase][0] if phase in got["trl"] and got["ours"][phase][0] else None
        print(f"{phase:<18}" + "".join(f"{x:>20}" for x in cells) + (f"{ratio:>11.2f}" if ratio else f"{'-':>11}"))
    print(f"{'peak RSS GiB':<18}" + "".join(f"{got[c]['peak_rss_gib']:>20.2f}" for c in cols)
          + f"{got['trl']['peak_rss_gib'] / got['ours']['peak_rss_gib']:>11.2f}")


if __name__ == "__main__":
    main()
