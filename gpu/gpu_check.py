"""The GPU check: one prepared script that tells, in about 7 minutes on one GPU and without the hub, whether the
GPU path works and what a step costs there. Every part runs in its own process with a time limit; the JSON is
rewritten after each part, so a run cut short keeps what it measured.

1. Models: Qwen2.5-0.5B and Qwen2.5-3B with random weights, their shapes from gpu/memory_plan.py's CONFIGS
   (each model's config.json), and the tests' tokenizer (tests/tiny.py), saved to a temporary folder. Random weights
   rarely write a valid <search> or <answer>: the figures are of generation, retrieval and training, not learning.
2. Tests: the test files whose code takes the CUDA path on a GPU machine (train.py and evaluate.py with --device auto:
   CUDA autocast, the memory plan from cuda free memory, CUDA RNG state in checkpoints), with pytest in a
   subprocess, in the background while part 3 runs (its rows say which overlapped them). With --tiny they are
   skipped (CI runs the whole suite on CPU anyway) unless --tests names some.
3. Training: 2 steps of the real train.py (train.main, as lab/spiral.py calls it) per model, without and with
   --fsdp on one rank (torchrun --nproc_per_node 1), on a search world built by lab/search_world.py: 64
   questions x 5 answers, 1 search turn + the answer turn of 128 new tokens, 2 optimizer steps per step,
   --gen-batch-size auto. The run's checkpoint is not saved (train.save_checkpoint is replaced by a no-op: a 3B
   checkpoint with its AdamW state is ~37 GB of disk and minutes of writing). One table row per (model, --fsdp):
   step 2's time split from metrics.jsonl (generation = perf/rollout_s minus the searches' time, retrieval, log-prob
   passes = perf/logp_s, update = train.update alone, timed with the GPU synchronised), generated tokens/s, peak
   memory (torch.cuda.max_memory_allocated, also per phase; ru_maxrss on a CPU) beside the memory plan's figures,
   and MFU of the update = 6 x params x trained tokens (the batch's real tokens) / update time / peak bf16 FLOP/s
   (attention's FLOPs left out: a lower bound).
4. Generation: --generator cb against hf on Qwen2.5-0.5B, greedy, 64 rows of two turns (the second after an
   observation) of 64 new tokens, in fp32 (the exactness check: the same ids row by row, or where they part) and
   under bf16 autocast (training's rollout): useful tokens (up to each row's first EOS) per second for each.
5. The main command's settings (python train.py --model Qwen/Qwen2.5-3B --llds 0.1: 3 search turns of 500 new and
   500 retrieved tokens, group 5, --micro-batch-size and --gen-batch-size from the plan) for one step on 3B with
   MAIN_PROMPTS prompts, if MAIN_MIN_S of the budget is left, and that step's time extrapolated to 512 prompts
   (the arithmetic is printed).
6. The decode step: one new token for 20, 178 and 320 rows over a 1,536-token KV cache, per model, under bf16
   autocast: eager on a DynamicCache, on the cb engine's static layout, and that captured as a CUDA graph; its ms
   beside the memory-bandwidth floor (the bf16 weights and the KV cache read once; BANDWIDTH).
The whole check stops starting parts after BUDGET_S.

    python gpu/gpu_check.py                          # on a GPU machine; writes runs/gpu_check.json
    python gpu/gpu_check.py --tiny --out /tmp/x.json # on a CPU in ~30 s: the tests' tiny model (CI)
    python gpu/gpu_check.py --models Qwen2.5-3B --parts main --main-prompts 4 --tests   # one part, no tests
"""

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "lab"), str(ROOT / "benchmarks"), str(ROOT / "gpu")]

from machinery.checkpoint import atomic_write  # noqa: E402
from memory_plan import CONFIGS  # noqa: E402

# NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): BF16 Tensor Core 1,979 TFLOPS "with sparsity"; dense
# is half of that. MFU is left out ('-') on any other device.
PEAK_FLOPS = {"H200": 989e12}
MODELS = ("Qwen2.5-0.5B", "Qwen2.5-3B")
# The tests whose train.py / evaluate.py runs take --device auto, so on a GPU machine they run the CUDA path (CUDA
# autocast, the plan from cuda free memory, CUDA RNG state in checkpoints); 2 of their ~4 CPU minutes are left out:
# the retrieval server's run (a CPU HTTP path) and the concept files' demos (CPU by design)
CUDA_TESTS = ["tests/test_train.py", "tests/test_checkpoint.py",
              "tests/test_evaluate.py::test_eval_end_to_end_on_the_tiny_model", "-k", "not served and not runs_alone"]
BUDGET_S = 420  # 7 minutes: no part starts after it; each part's limit is what is left of it
TEST_TIMEOUT_S = 240  # the tests, in the background beside the training runs
TEST_WORKERS = "4"  # pytest-xdist processes for the tests (-n); each starts train.py subprocesses of its own
STEPS = 2
TRAIN = {  # train.py flags: --tiny's, and the realistic batch's on a GPU
    "tiny": ["--prompts-per-step", "2", "--group-size", "2", "--max-turns", "1", "--max-new-tokens", "16",
             "--max-obs-tokens", "48", "--mini-batch-size", "2", "--micro-batch-size", "2"],
    "gpu": ["--prompts-per-step", "64", "--group-size", "5", "--max-turns", "1", "--max-new-tokens", "128",
            "--max-obs-tokens", "256", "--mini-batch-size", "160", "--micro-batch-size", "8"],
}
COMMON = ["--steps", str(STEPS), "--gen-batch-size", "auto", "--warmup-ratio", "0", "--lr", "1e-6"]
PAPER_PROMPTS, MAIN_PROMPTS, MAIN_MIN_S = 512, 8, 120  # part 5: one step of MAIN_PROMPTS, if MAIN_MIN_S are left
MAIN = {  # part 5's flags over train.py's defaults (the main command's: group 5, 3 turns of 500 + 500 tokens)
    "tiny": ["--prompts-per-step", "2", "--group-size", "2", "--max-turns", "1", "--max-new-tokens", "16",
             "--max-obs-tokens", "48", "--mini-batch-size", "4"],
    "gpu": ["--prompts-per-step", str(MAIN_PROMPTS), "--mini-batch-size", str(MAIN_PROMPTS * 5)],
}
GEN = {"tiny": (8, 16), "gpu": (64, 64)}  # part 4: rows, new tokens per turn
# part 6: rows decoded together (the main command's generate calls on one H200 hold 178, the plan's 320 at 4 GPUs;
# 20: a turn's stragglers), over a KV cache of this many tokens (about the main command's mean context)
DECODE = {"tiny": ((2, 4), 64), "gpu": ((20, 178, 320), 1536)}
# memory bandwidth, bytes/s (NVIDIA's datasheets: H200 4.8 TB/s, H100 SXM 3.35 TB/s): the decode step's floor
BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12}


def decode_child(model: str, out: str, rows: str, context: int, reps: int = 10):
    """In the subprocess: one decode step (one new token for each of R rows over a KV cache of `context` tokens), the
    median of `reps` wall times after a warm-up, GPU synchronised, under bf16 autocast on a GPU (fp32 on a CPU), three
    ways: `eager`, the model's forward on a DynamicCache (the dynamic layout's step); `static`, the cb engine's
    StaticLayout step (fixed slots, a length mask), eager; `graph`, the same captured as a CUDA graph and replayed
    (CUDA only: None on a CPU; a failed capture is reported). Beside them the step's memory floor on a GPU: the bf16
    weights (2 bytes a parameter) and the rows' KV cache read once at the datasheet's bandwidth (BANDWIDTH). Writes
    OUT (JSON) with a row per R: ms of each, floor ms, eager / floor."""
    import statistics
    from types import SimpleNamespace

    import torch
    from transformers import DynamicCache

    from machinery.engine import decode_attention
    from machinery.kv_layout import StaticLayout
    from machinery.memory import kv_bytes_per_token
    from machinery.policy import autocast, load_policy

    cuda = torch.cuda.is_available()
    policy, _, device = load_policy(model, "float32", "cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    bandwidth = next((b for key, b in BANDWIDTH.items() if key in name), None)
    n = sum(p.numel() for p in policy.parameters())
    amp, report = autocast("bf16" if cuda else "off", device), {"context": context, "device": name, "rows": []}

    def timed(step) -> float:  # the median of reps calls after a warm-up, synchronised
        times = []
        for i in range(reps + 1):
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            step(i)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return statistics.median(times[1:])

    for r in (int(x) for x in rows.split(",")):
        ids = torch.randint(0, policy.config.vocab_size, (r, context + reps + 1), device=device)
        row = {"rows": r, "graph_ms": None, "graph_error": None}
        with torch.no_grad(), amp(), decode_attention(device):
            cache = DynamicCache(config=policy.config)
            policy(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)
            kv = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
            row["eager_ms"] = 1e3 * timed(lambda i: policy(input_ids=ids[:, context + i:context + i + 1],
                                                            past_key_values=cache, use_cache=True))
            del cache
            for mode in ("static", "graph") if cuda else ("static",):
                notes = []
                layout = StaticLayout(policy, r, reps + 2, graphs=mode == "graph", warn=notes.append)
                run_rows = [SimpleNamespace(context=[0] * context) for _ in range(r)]
                layout.admit([], run_rows, kv)
                row[f"{mode}_ms"] = 1e3 * timed(lambda i: layout.decode(ids[:, context + i], run_rows))
                if notes:
                    row["graph_ms"], row["graph_error"] = None, notes[0]
                layout.close()
        read = 2 * n + r * context * kv_bytes_per_token(policy.config, 2)
        floor = read / bandwidth if bandwidth else None
        row.update(floor_ms=floor * 1e3 if floor else None, x_floor=row["eager_ms"] / 1e3 / floor if floor else None)
        report["rows"].append(row)
    atomic_write(Path(out), json.dumps(report))


def decode_row(model: Path, tmp: Path, rows: tuple, context: int, timeout: float, env: dict) -> dict:
    """Part 6 in a fresh process (decode_child)."""
    row = {"rows": list(rows), "context": context}
    if timeout < 30:
        return {**row, "error": "not run: the budget (--budget) was spent"}
    out = tmp / f"decode_{model.name}.json"
    rc, stdout, stderr = run([sys.executable, __file__, "--decode-child", str(model), str(out),
                              ",".join(map(str, rows)), str(context)], timeout, env)
    if rc != 0 or not out.is_file():
        return failed(row, rc, stdout, stderr, timeout)
    return json.loads(out.read_text())


def decode_table(name: str, d: dict) -> str:
    if "error" in d:
        return f"decode step, {name}: failed: {d['error']}"
    lines = [f"decode step, {name}, KV cache {d['context']} tokens (eager: DynamicCache; static: cb's StaticLayout, "
             "eager; graph: the same as a CUDA graph):"]
    for r in d["rows"]:
        floor = f"floor {r['floor_ms']:.2f} ms, eager {r['x_floor']:.1f}x" if r["floor_ms"] else "no bandwidth figure"
        graph = (f"graph {r['graph_ms']:.2f} ms" if r.get("graph_ms") is not None
                 else f"graph: {r['graph_error']}" if r.get("graph_error") else "graph: CUDA only")
        lines.append(f"  {r['rows']:>4} rows: eager {r['eager_ms']:.2f} ms, static {r['static_ms']:.2f} ms, {graph} "
                     f"({floor})")
    return "\n".join(lines)


def build(name: str, folder: Path, device: str) -> int:
    """Save `name` (a CONFIGS key, or "tiny": the tests' model) with random weights and the tests' tokenizer into
    `folder` (bf16 for the real sizes: half the bytes to write and read; train.py loads fp32 master weights from
    them); returns its parameter count."""
    import torch
    from tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    with torch.device(device):  # random init where the model will run: seconds on a GPU for 3B
        model = build_model(tokenizer, **({} if name == "tiny" else CONFIGS[name]))
    n = sum(p.numel() for p in model.parameters())
    (model if name == "tiny" else model.to(torch.bfloat16)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return n


def plan_figures(text: str) -> dict:
    """The memory plan's printed figures (memory.memory_plan's lines) as numbers: static, generate and update GiB,
    rows per generate call, micro-batch size and --grad-ckpt; the predicted peak is static + the larger of the two."""
    static = float(re.search(r"static ([\d.]+) GiB", text)[1])
    gen = re.search(r"generate: (\d+) rows per call .*?= ([\d.]+) GiB", text)
    upd = re.search(r"update: --micro-batch-size (\d+) .*?--grad-ckpt (on|off) .*?= ([\d.]+) GiB", text)
    return {"static_gib": static, "gen_rows": int(gen[1]), "gen_gib": float(gen[2]), "micro": int(upd[1]),
            "grad_ckpt": upd[2] == "on", "update_gib": float(upd[3]),
            "peak_gib": static + max(float(gen[2]), float(upd[3]))}


def child(model: str, out_dir: str, flags: list[str]):
    """In the subprocess (python, or torchrun for --fsdp): train.main with timed searches, counted tokens, the memory
    plan kept, the rollout, log-prob passes and update timed with the GPU synchronised (each phase's peak memory
    too), and no checkpoint; writes OUT_DIR/gpu_check_row.json (rank 0): per step the metrics' timings, the
    searches' seconds, the tokens the model processed (real tokens of the collated batch) and each phase's time and
    peak, and the whole run's peak memory."""
    import torch

    import train
    from bench_step import time_retrieval

    args = train.parse_args(["--model", model, "--out-dir", out_dir, *flags])
    cuda = torch.cuda.is_available() and args.device != "cpu"
    timing, steps, phases, plans, between = time_retrieval(train), [], {}, [], [0]

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def watched(fn, name):  # fn timed and its peak memory read (the peak counter is reset at its start)
        def wrapped(*a, **kw):
            sync()
            if cuda:
                between[0] = max(between[0], torch.cuda.max_memory_allocated())  # load, collate, metrics
                torch.cuda.reset_peak_memory_stats()
            t = time.time()
            out = fn(*a, **kw)
            sync()
            phase = phases.setdefault(name, {"s": 0.0, "calls": 0, "peak_bytes": 0})
            phase["s"] += time.time() - t
            phase["calls"] += 1
            if cuda:
                phase["peak_bytes"] = max(phase["peak_bytes"], torch.cuda.max_memory_allocated())
            return out
        return wrapped

    for name in ("rollout", "batch_logp", "update"):
        setattr(train, name, watched(getattr(train, name), name))
    collate, log_step, memory_plan = train.collate, train.log_step, train.memory_plan
    tokens = []

    def counted_collate(episodes, pad_id):  # called once per step, right after the rollout
        batch = collate(episodes, pad_id)
        tokens.append(int(batch["attention_mask"].sum()))
        return batch

    def logged_step(step, m, *a, **kw):  # the end of a step: its phases, searches and tokens
        log_step(step, m, *a, **kw)
        steps.append({"retrieval_s": timing["retrieval_s"] - sum(s["retrieval_s"] for s in steps),
                      "tokens": tokens[-1], "phases": {k: dict(v) for k, v in phases.items()}})
        phases.clear()

    def kept_plan(*a, **kw):  # and the plan at the paper's 512 prompts, for part 5's rows per generate call
        out = memory_plan(*a, **kw)
        plans.extend([out[-1], memory_plan(*a, **{**kw, "rows": PAPER_PROMPTS * args.group_size})[-1]])
        return out

    def traced(make):  # each generate call's rows, longest output and seconds on stderr: a step cut short says where
        def made(*a, **kw):
            generate = make(*a, **kw)

            def call(contexts):
                t = time.time()
                outs = generate(contexts)
                sync()
                print(f"generate: {len(contexts)} rows, contexts up to {max(map(len, contexts))} tokens, "
                      f"{max(map(len, outs))} new at most, {time.time() - t:.1f} s", file=sys.stderr, flush=True)
                return outs
            call.eos_ids, call.reset = generate.eos_ids, getattr(generate, "reset", lambda: None)
            return call
        return made

    train.GENERATORS = {k: traced(v) for k, v in train.GENERATORS.items()}
    train.collate, train.log_step, train.memory_plan = counted_collate, logged_step, kept_plan
    train.save_checkpoint = lambda *a, **kw: None  # no 37 GB checkpoint of random weights (the docstring)
    train.main(args)
    if int(os.environ.get("RANK", 0)) != 0:
        return
    peaks = [between[0], torch.cuda.max_memory_allocated()] if cuda else []
    peak = max(peaks + [p["peak_bytes"] for s in steps for p in s["phases"].values()]) if cuda \
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    metrics = [json.loads(s) for s in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    for s, m in zip(steps, metrics, strict=True):
        s.update({k: m[k] for k in ("perf/step_s", "perf/rollout_s", "perf/logp_s", "perf/update_s",
                                    "rollout/response_tokens", "rollout/reward")})
    atomic_write(Path(out_dir) / "gpu_check_row.json", json.dumps({
        "steps": steps, "peak_bytes": peak, "cuda": cuda, "plan": plans[0], "plan_paper": plans[1],
        "max_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None}))


def gen_child(model: str, questions: str, out: str, rows: int, new_tokens: int):
    """In the subprocess: cb and hf, greedy, on `rows` questions of two turns (the second after an observation) of
    `new_tokens` each, all rows in one call; in fp32 and (on a GPU) under bf16 autocast. Writes OUT (JSON): per mode
    and engine the seconds (GPU synchronised, after a warm-up call), the useful tokens (rollout.cut_turn's: up to the
    first EOS or stop string) and tokens/s; per mode how many rows' ids are the same and where the others part."""
    import torch

    from machinery.data import load_questions
    from machinery.engine import GENERATORS
    from machinery.policy import autocast, load_policy
    from rollout import STOP_STRINGS, cut_turn

    cuda = torch.cuda.is_available()
    policy, tok, device = load_policy(model, "float32", "cuda" if cuda else "cpu")

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    qs = [r["question"] for r in load_questions(questions)[:rows]]
    contexts = [enc(" ".join([q] * (1 + i % 3))) for i, q in enumerate(qs)]  # of several lengths: left padding
    obs = [enc(f"\n<information>Doc {i}: " + "the town lies by the river. " * (1 + i % 4) + "</information>\n")
           for i in range(len(qs))]
    report = {"rows": len(contexts), "new_tokens": new_tokens, "modes": {}}
    for mode in ("fp32", "bf16") if cuda else ("fp32",):
        amp, got = autocast("bf16" if mode == "bf16" else "off", device), {}
        for name in ("hf", "cb"):
            generate = GENERATORS[name](policy, tok, stop_strings=STOP_STRINGS, max_new_tokens=new_tokens,
                                        do_sample=False, batch_size=rows)

            def turns(ctx):
                with amp():
                    first = [cut_turn(x, tok, generate.eos_ids)[0] for x in generate(ctx)]
                    second = [cut_turn(x, tok, generate.eos_ids)[0]
                              for x in generate([c + f + o for c, f, o in zip(ctx, first, obs)])]
                getattr(generate, "reset", lambda: None)()
                return first, second

            turns(contexts[:2])  # warm-up: kernels, the allocator
            if cuda:
                torch.cuda.synchronize()
            t = time.time()
            ids = turns(contexts)
            if cuda:
                torch.cuda.synchronize()
            seconds, useful = time.time() - t, sum(len(x) for turn in ids for x in turn)
            got[name] = {"ids": ids, "s": round(seconds, 3), "tokens": useful, "tok_s": useful / seconds}
        parts = [next((k for k, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
                 for turn in range(2) for x, y in zip(got["hf"]["ids"][turn], got["cb"]["ids"][turn]) if x != y]
        report["modes"][mode] = {
            **{name: {k: v for k, v in g.items() if k != "ids"} for name, g in got.items()},
            "rows_same": sum(x == y for turn in range(2) for x, y in zip(got["hf"]["ids"][turn], got["cb"]["ids"][turn])),
            "rows_compared": 2 * len(contexts), "parted_at": parts}
    if cuda:  # where a sampling decode step's time goes: one cb call as in training (top-p, bf16 autocast)
        from torch.profiler import ProfilerActivity, profile

        generate = GENERATORS["cb"](policy, tok, stop_strings=STOP_STRINGS, max_new_tokens=16, batch_size=rows)
        with autocast("bf16", device)(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.time()
            generate(contexts)
            torch.cuda.synchronize()
        report["profile"] = {"rows": len(contexts), "new_tokens": 16, "s": round(time.time() - t, 3), "table":
                             prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=50),
                             "cpu_table": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50)}
    atomic_write(Path(out), json.dumps(report))


def run(cmd: list[str], timeout: float, env: dict | None = None):
    """subprocess.run(cmd) in its own process group, all of which is killed at the timeout (pytest's and torchrun's
    children too: none may keep GPU memory into the next run). Returns (rc or None on timeout, stdout, stderr)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})
    try:
        out, err = proc.communicate(timeout=max(timeout, 1))
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


class Tests:
    """pytest -q TESTS in a background subprocess (started at once); .result() waits for it (at most until `timeout`
    seconds after the start) and returns its summary line, return code, the failed tests, and its start and end
    (seconds since the check began). No tests: skipped."""

    def __init__(self, tests: list[str], timeout: float, t0: float, workers: str | None):
        self.tests, self.timeout, self.t0, self.t = tests, timeout, t0, time.time()
        self.cmd = ["pytest", "-q", "-rfE", *(["-n", workers] if workers else []), *tests]
        self.proc = subprocess.Popen([sys.executable, "-m", *self.cmd], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True) if tests else None

    def result(self) -> dict:
        if self.proc is None:
            return {"skipped": "skipped (--tiny: CI runs the whole suite on CPU)"}
        try:
            out, _ = self.proc.communicate(timeout=max(self.timeout - (time.time() - self.t), 1))
            rc = self.proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, rc = self.proc.communicate()[0], None
        lines = out.strip().splitlines() + ([] if rc is not None else [f"timed out after {self.timeout:.0f} s"])
        return {"command": " ".join(self.cmd), "rc": rc, "started_s": round(self.t - self.t0, 1),
                "ended_s": round(time.time() - self.t0, 1), "summary": lines[-1] if lines else "",
                "failed": [s for s in lines if s.startswith(("FAILED", "ERROR"))], "tail": "\n".join(lines[-40:])}


def failed(row: dict, rc, stdout: str, stderr: str, timeout: float) -> dict:
    err = (stderr.strip() or stdout.strip() or "no output").splitlines()
    return {**row, "error": f"timed out after {timeout:.0f} s" if rc is None else f"exit {rc}: {err[-1]}",
            "stderr_tail": "\n".join(err[-30:])}


def train_row(name: str, params: int, model: Path, fsdp: bool, flags: list[str], tmp: Path, peak_flops,
              timeout: float, env: dict, t0: float, tag: str = "") -> dict:
    """One (model, --fsdp) run in a fresh process (its own peak memory); the row's figures are its last step's."""
    row = {"model": name, "fsdp": fsdp, "params": params, "started_s": round(time.time() - t0, 1), "tag": tag}
    if timeout < 30:
        return {**row, "error": "not run: the budget (--budget) was spent"}
    out = tmp / f"run_{name}_{'fsdp' if fsdp else 'plain'}{tag}"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"] if fsdp \
        else [sys.executable]
    t = time.time()
    rc, stdout, stderr = run([*launch, __file__, "--child", str(model), str(out), *flags, *(["--fsdp"] if fsdp else [])],
                             timeout, env)
    row["wall_s"] = round(time.time() - t, 1)
    if rc != 0 or not (out / "gpu_check_row.json").is_file():
        return failed(row, rc, stdout, stderr, timeout)
    got = json.loads((out / "gpu_check_row.json").read_text())
    trajectories = int(flags[flags.index("--prompts-per-step") + 1]) * int(flags[flags.index("--group-size") + 1]) \
        if "--group-size" in flags else int(flags[flags.index("--prompts-per-step") + 1]) * 5
    s = got["steps"][-1]  # the last step: step 1 also pays for warm-up (CUDA kernels, the allocator, the BM25 index)
    gen_s = s["perf/rollout_s"] - s["retrieval_s"]
    update_s = s["phases"]["update"]["s"]
    flops = 6 * params * s["tokens"]  # forward + backward of the update (attention's FLOPs left out)
    peaks = {k: v["peak_bytes"] / 2**30 for k, v in s["phases"].items()} if got["cuda"] else {}
    return {**row, "step_s": s["perf/step_s"], "gen_s": gen_s, "retrieval_s": s["retrieval_s"],
            "logp_s": s["perf/logp_s"], "update_s": update_s, "after_update_s": s["perf/update_s"] - update_s,
            "gen_tok_s": s["rollout/response_tokens"] * trajectories / gen_s, "trained_tokens": s["tokens"],
            "trajectories": trajectories, "peak_gib": got["peak_bytes"] / 2**30, "phase_peak_gib": peaks,
            "reserved_gib": got["max_reserved_bytes"] / 2**30 if got["max_reserved_bytes"] else None,
            "plan": plan_figures(got["plan"]), "plan_text": got["plan"], "plan_paper": plan_figures(got["plan_paper"]),
            "mfu": flops / update_s / peak_flops if peak_flops else None,
            "generate_calls": re.findall(r"generate: [^\n\r]*", stderr),  # a progress bar's \r may lead the line
            "logp_mfu": 2 * 2 * params * s["tokens"] / s["perf/logp_s"] / peak_flops if peak_flops else None,
            "steps": got["steps"]}


def gen_row(model: Path, questions: Path, tmp: Path, rows: int, new_tokens: int, timeout: float, env: dict) -> dict:
    """Part 4 in a fresh process (gen_child)."""
    row = {"rows": rows, "new_tokens": new_tokens}
    if timeout < 30:
        return {**row, "error": "not run: the budget (--budget) was spent"}
    out = tmp / "gen.json"
    rc, stdout, stderr = run([sys.executable, __file__, "--gen-child", str(model), str(questions), str(out), str(rows),
                              str(new_tokens)], timeout, env)
    if rc != 0 or not out.is_file():
        return failed(row, rc, stdout, stderr, timeout)
    return json.loads(out.read_text())


def extrapolate(r: dict, prompts: int, group_size: int = 5) -> dict:
    """The main command's step at `prompts` prompts from part 5's step of r["trajectories"] rows: the log-prob
    passes, update and searches scale with the rows (tokens per row unchanged); generation by rounds of the plan's
    rows per generate call (slots), between two bounds: a round of full slots as fast as the measured one (each
    decode step reads the weights once, whatever the rows: memory-bound, the low end), and time proportional to the
    rows (each row's attention and logits add: the high end)."""
    rows, measured = prompts * group_size, r["trajectories"]
    scale, slots = rows / measured, r["plan_paper"]["gen_rows"]  # the plan's rows per call at `prompts`
    rounds = -(-rows // slots)
    rest = (r["logp_s"] + r["update_s"] + r["after_update_s"] + r["retrieval_s"]) * scale
    low, high = r["gen_s"] * rounds + rest, r["gen_s"] * scale + rest
    return {"prompts": prompts, "rows": rows, "scale": scale, "slots": slots, "rounds": rounds, "rest_s": rest,
            "low_s": low, "high_s": high,
            "arithmetic": f"{rows} rows = {scale:.0f} x the {measured} measured; log-prob passes + update + "
                          f"after-update pass + searches: ({r['logp_s']:.1f} + {r['update_s']:.1f} + "
                          f"{r['after_update_s']:.1f} + {r['retrieval_s']:.2f}) s x {scale:.0f} = {rest:.0f} s; "
                          f"generation: {rounds} rounds of {slots} slots x {r['gen_s']:.1f} s = "
                          f"{r['gen_s'] * rounds:.0f} s (memory-bound) to {scale:.0f} x {r['gen_s']:.1f} s = "
                          f"{r['gen_s'] * scale:.0f} s (row-bound); a step: {low:.0f}-{high:.0f} s "
                          f"({low / 3600:.2f}-{high / 3600:.2f} h)"}


def table(rows: list[dict]) -> str:
    head = (f"{'model':<14}{'fsdp':<6}{'step s':>8}{'gen s':>8}{'retr s':>8}{'logp s':>8}{'update s':>9}"
            f"{'gen tok/s':>11}{'peak GiB':>9}{'plan GiB':>9}{'MFU':>7}")
    lines = [head]
    for r in rows:
        name = r["model"] + r.get("tag", "")
        if "error" in r:
            lines.append(f"{name:<14}{'on' if r['fsdp'] else 'off':<6}  failed: {r['error']}")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        lines.append(f"{name:<14}{'on' if r['fsdp'] else 'off':<6}{r['step_s']:>8.2f}{r['gen_s']:>8.2f}"
                     f"{r['retrieval_s']:>8.3f}{r['logp_s']:>8.2f}{r['update_s']:>9.2f}{r['gen_tok_s']:>11.1f}"
                     f"{r['peak_gib']:>9.2f}{r['plan']['peak_gib']:>9.1f}{mfu:>7}")
    return "\n".join(lines)


def gen_table(g: dict) -> str:
    if "error" in g:
        return f"generation: failed: {g['error']}"
    lines = [f"generation, greedy, {g['rows']} rows x 2 turns x {g['new_tokens']} new tokens, one call a turn:"]
    for mode, m in g["modes"].items():
        lines.append(f"  {mode}: hf {m['hf']['tok_s']:.0f} tok/s ({m['hf']['s']:.1f} s), cb {m['cb']['tok_s']:.0f} "
                     f"tok/s ({m['cb']['s']:.1f} s), cb/hf {m['cb']['tok_s'] / m['hf']['tok_s']:.2f}x; same ids in "
                     f"{m['rows_same']} of {m['rows_compared']} rows" +
                     (f" (the others part at token {sorted(m['parted_at'])})" if m["parted_at"] else ""))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU, the tests' tiny model and a tiny batch (CI, ~30 s)")
    ap.add_argument("--models", nargs="+", choices=MODELS, help=f"the models to train (default: {' '.join(MODELS)})")
    ap.add_argument("--gen-model", choices=MODELS, help="part 4's model (default: the first of --models)")
    ap.add_argument("--tests", nargs="*", help="pytest paths for part 2 (default: the CUDA tests; none with --tiny or a bare --tests)")
    ap.add_argument("--main-prompts", type=int, default=None,
                    help=f"part 5's prompts per step (default {MAIN_PROMPTS}; 0 leaves part 5 out)")
    ap.add_argument("--parts", nargs="+", choices=("gen", "train", "main", "decode"),
                    default=["gen", "train", "main", "decode"],
                    help="parts 4, 3, 5 and 6 to run (default all; part 2, the tests, is --tests)")
    ap.add_argument("--fsdp", choices=("both", "off", "on"), default="both",
                    help="part 3's runs: without and with --fsdp (default), or one of them")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds after which no part starts (default {BUDGET_S})")
    ap.add_argument("--out", default="runs/gpu_check.json", help="the JSON of every figure (rewritten after each part)")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ap.add_argument("--gen-child", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--decode-child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.decode_child:
        return decode_child(*a.decode_child[:3], int(a.decode_child[3]))
    if a.child:
        return child(a.child[0], a.child[1], a.child[2:])
    if a.gen_child:
        return gen_child(*a.gen_child[:3], int(a.gen_child[3]), int(a.gen_child[4]))
    if a.tiny and a.models:
        ap.error("--tiny trains the tests' tiny model only: leave out --models")
    if a.main_prompts is not None and a.main_prompts < 0:
        ap.error(f"--main-prompts must be >= 0, got {a.main_prompts}")
    import torch

    if not a.tiny and not torch.cuda.is_available():
        ap.error("no CUDA device: run with --tiny on a CPU")
    kind = "tiny" if a.tiny else "gpu"
    device = "cpu" if a.tiny else "cuda"
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    peak_flops = next((f for key, f in PEAK_FLOPS.items() if key in name), None) if device == "cuda" else None
    models = ["tiny"] if a.tiny else a.models or list(MODELS)
    env = {"OMP_NUM_THREADS": "1"} if a.tiny else {}  # the tiny model: 1 thread is far faster on a busy CPU (tests)
    flags = [*TRAIN[kind], *COMMON, *(["--device", "cpu"] if a.tiny else [])]  # GPU: auto
    print(f"{name} | torch {torch.__version__} | peak bf16 {peak_flops / 1e12:.0f} TFLOP/s" if peak_flops else
          f"{name} | torch {torch.__version__} | MFU: no peak figure for this device", flush=True)
    report = {"device": name, "torch": torch.__version__, "peak_flops": peak_flops, "train_flags": flags, "rows": []}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():  # after each part: a check cut short keeps what it measured
        atomic_write(out, json.dumps(report, indent=1))

    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        import search_world  # the data: a generated search world (corpus + questions), no hub, in a second

        search_world.main(["--out", str(tmp / "world"), "--sft-steps", "0"])
        data = ["--train-data", str(tmp / "world" / "world_train.jsonl"), "--corpus", str(tmp / "world" / "corpus.jsonl")]
        tests = Tests(a.tests if a.tests is not None else [] if a.tiny else CUDA_TESTS, TEST_TIMEOUT_S, t0,
                      None if a.tiny else TEST_WORKERS)
        params = {}
        gen_model = "tiny" if a.tiny else a.gen_model or models[0]
        built = [gen_model] * ("gen" in a.parts) + models * bool({"train", "main", "decode"} & set(a.parts))
        for m in dict.fromkeys(built):
            t = time.time()
            params[m] = build(m, tmp / m, device)
            print(f"built {m}: {params[m] / 1e6:,.1f}M parameters, random weights, in {time.time() - t:.0f} s", flush=True)
        report["generation"] = gen_row(tmp / gen_model, tmp / "world" / "world_train.jsonl", tmp, *GEN[kind],
                                       a.budget - (time.time() - t0), env) if "gen" in a.parts else \
            {"error": "left out (--parts)"}
        print(gen_table(report["generation"]), flush=True)
        save()
        for m in models * ("train" in a.parts):
            for fsdp in {"both": (False, True), "off": (False,), "on": (True,)}[a.fsdp]:
                report["rows"].append(train_row(m, params[m], tmp / m, fsdp, flags + data, tmp, peak_flops,
                                                a.budget - (time.time() - t0), env, t0))
                r = report["rows"][-1]
                print(f"trained {m}, fsdp {'on' if fsdp else 'off'}: " + (r["error"] if "error" in r else
                      f"{r['wall_s']:.0f} s, step {r['step_s']:.1f} s, peak {r['peak_gib']:.1f} GiB"), flush=True)
                save()
        prompts = MAIN_PROMPTS if a.main_prompts is None else a.main_prompts
        left = a.budget - (time.time() - t0)
        if "main" in a.parts and prompts and (a.tiny or left >= MAIN_MIN_S):
            main_flags = [*MAIN[kind], "--steps", "1", "--warmup-ratio", "0", "--llds", "0.1", *data,
                          *(["--device", "cpu"] if a.tiny else [])]
            if not a.tiny:
                main_flags[main_flags.index("--prompts-per-step") + 1] = str(prompts)
                main_flags[main_flags.index("--mini-batch-size") + 1] = str(prompts * 5)
            big = models[-1]
            r = train_row(big, params[big], tmp / big, False, main_flags, tmp, peak_flops, left, env, t0, " main")
            if "error" not in r:
                r["extrapolated"] = extrapolate(r, PAPER_PROMPTS, int(main_flags[main_flags.index("--group-size") + 1])
                                                if "--group-size" in main_flags else 5)
            report["main"] = {**r, "flags": main_flags}
            print(f"main command's settings, {big}, {r.get('trajectories', '?')} rows: " +
                  (r["error"] if "error" in r else f"step {r['step_s']:.1f} s; at {PAPER_PROMPTS} prompts: "
                   f"{r['extrapolated']['arithmetic']}"), flush=True)
        else:
            report["main"] = {"error": "left out (--main-prompts 0)" if not prompts or "main" not in a.parts else
                              f"not run: {left:.0f} s of the budget left, under {MAIN_MIN_S} s"}
        save()
        report["decode"] = {}
        for m in models * ("decode" in a.parts):  # part 6: the decode step against its floor
            report["decode"][m] = decode_row(tmp / m, tmp, *DECODE[kind], a.budget - (time.time() - t0), env)
            print(decode_table(m, report["decode"][m]), flush=True)
            save()
        report["tests"] = tests.result()
        print(f"tests: {report['tests'].get('summary') or report['tests'].get('skipped')}", flush=True)
        for line in report["tests"].get("failed", []):
            print(f"  {line}")
    report["seconds"] = round(time.time() - t0, 1)
    rows = report["rows"] + ([report["main"]] if "model" in report["main"] else [])
    print(f"\n{STEPS} steps of {' '.join(TRAIN[kind])}; figures of the last step\n{table(rows)}\n"
          f"{report['seconds']:.0f} s in all")
    save()
    print(f"wrote {a.out}")
    if any("error" in r for r in rows) or report["generation"].get("error", "left out").split()[:2] != ["left", "out"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
