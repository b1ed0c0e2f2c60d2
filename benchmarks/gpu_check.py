"""The GPU check: one prepared script that tells, in about 8 minutes on one GPU and without the hub, whether the
GPU path works and what a step costs there. NOT RUN ON A GPU YET: every figure in docs/ so far is from --tiny on a CPU.

1. Models: Qwen2.5-0.5B and Qwen2.5-3B with random weights, their shapes from benchmarks/memory_plan.py's CONFIGS
   (each model's config.json), and the tests' tokenizer (tests/tiny.py), saved to a temporary folder. Random weights
   rarely write a valid <search> or <answer>: the figures are of generation, retrieval and training, not learning.
2. Tests: the test files whose code takes the CUDA path on a GPU machine (train.py and evaluate.py with --device auto:
   CUDA autocast, the memory plan from cuda free memory, CUDA RNG state in checkpoints), with pytest in a
   subprocess. With --tiny they are skipped (CI runs the whole suite on CPU anyway) unless --tests names some.
3. Training: 2 steps of the real train.py (train.main, as scripts/spiral.py calls it) per model, without and with
   --fsdp on one rank (torchrun --nproc_per_node 1), on a search world built by scripts/search_world.py: 64
   questions x 5 answers, 1 search turn + the answer turn of 128 new tokens, 2 optimizer steps per step,
   --gen-batch-size auto. The run's checkpoint is not saved (train.save_checkpoint is replaced by a no-op: a 3B
   checkpoint with its AdamW state is ~37 GB of disk and minutes of writing). One table row per (model, --fsdp):
   step 2's time split from metrics.jsonl (generation = perf/rollout_s minus the searches' time, retrieval, log-prob
   passes = perf/logp_s, update = perf/update_s), generated tokens/s, peak memory (torch.cuda.max_memory_allocated;
   ru_maxrss on a CPU), and MFU of the update = 6 x params x trained tokens (the batch's real tokens) / update time /
   peak bf16 FLOP/s; perf/update_s also holds the after-update log-prob pass (2 x params x tokens more, not
   counted), so this is a lower bound. A run that fails (out of memory, a bug) keeps its error in the JSON and the
   table, and the check goes on; the whole check stops starting runs after BUDGET_S (8 minutes).

    python benchmarks/gpu_check.py                          # on a GPU machine; writes runs/gpu_check.json
    python benchmarks/gpu_check.py --tiny --out /tmp/x.json # on a CPU in ~15 s: the tests' tiny model (CI)
"""

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts"), str(ROOT / "benchmarks")]

from checkpoint import atomic_write  # noqa: E402
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
BUDGET_S = 480  # 8 minutes: the tests get TEST_TIMEOUT_S, each training run what is left (a run left none: not run)
TEST_TIMEOUT_S = 120
STEPS = 2
TRAIN = {  # train.py flags: --tiny's, and the realistic batch's on a GPU
    "tiny": ["--prompts-per-step", "2", "--group-size", "2", "--max-turns", "1", "--max-new-tokens", "16",
             "--max-obs-tokens", "48", "--mini-batch-size", "2", "--micro-batch-size", "2"],
    "gpu": ["--prompts-per-step", "64", "--group-size", "5", "--max-turns", "1", "--max-new-tokens", "128",
            "--max-obs-tokens", "256", "--mini-batch-size", "160", "--micro-batch-size", "8"],
}
COMMON = ["--steps", str(STEPS), "--gen-batch-size", "auto", "--warmup-ratio", "0", "--lr", "1e-6"]


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
    torch.cuda.empty_cache() if device == "cuda" else None
    return n


def child(model: str, out_dir: str, flags: list[str]):
    """In the subprocess (python, or torchrun for --fsdp): train.main with timed searches, counted tokens and no
    checkpoint; writes OUT_DIR/gpu_check_row.json (rank 0): per step the metrics' timings, the searches' seconds,
    the tokens the model processed (real tokens of the collated batch) and the peak memory."""
    import torch

    import train
    from bench_step import time_retrieval

    timing, steps = time_retrieval(train), []
    collate = train.collate

    def counted_collate(episodes, pad_id):  # called once per step, right after the rollout
        batch = collate(episodes, pad_id)
        steps.append({"retrieval_s": timing["retrieval_s"] - sum(s["retrieval_s"] for s in steps),
                      "tokens": int(batch["attention_mask"].sum())})
        return batch

    train.collate = counted_collate
    train.save_checkpoint = lambda *a, **kw: None  # no 37 GB checkpoint of random weights (the docstring)
    args = train.parse_args(["--model", model, "--out-dir", out_dir, *flags])
    train.main(args)
    if int(os.environ.get("RANK", 0)) != 0:
        return
    cuda = torch.cuda.is_available() and args.device != "cpu"
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    metrics = [json.loads(s) for s in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    for s, m in zip(steps, metrics, strict=True):
        s.update({k: m[k] for k in ("perf/step_s", "perf/rollout_s", "perf/logp_s", "perf/update_s",
                                    "rollout/response_tokens", "rollout/reward")})
    atomic_write(Path(out_dir) / "gpu_check_row.json", json.dumps({"steps": steps, "peak_bytes": peak}))


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


def run_tests(tests: list[str], timeout: float) -> dict:
    """pytest -q TESTS in a subprocess: its summary line, return code and the failed tests (none run: skipped)."""
    if not tests:
        return {"skipped": "skipped (--tiny: CI runs the whole suite on CPU)"}
    t = time.time()
    rc, out, _ = run([sys.executable, "-m", "pytest", "-q", "-rfE", *tests], timeout)
    lines = out.strip().splitlines() + ([] if rc is not None else [f"timed out after {timeout:.0f} s"])
    return {"command": " ".join(["pytest", "-q", "-rfE", *tests]), "rc": rc, "seconds": round(time.time() - t, 1),
            "summary": lines[-1] if lines else "", "failed": [s for s in lines if s.startswith(("FAILED", "ERROR"))]}


def train_row(name: str, params: int, model: Path, fsdp: bool, flags: list[str], tmp: Path, peak_flops,
              timeout: float, env: dict) -> dict:
    """One (model, --fsdp) run in a fresh process (its own peak memory); the row's figures are step 2's."""
    row = {"model": name, "fsdp": fsdp, "params": params}
    if timeout < 30:
        return {**row, "error": f"not run: the {BUDGET_S} s budget was spent"}
    out = tmp / f"run_{name}_{'fsdp' if fsdp else 'plain'}"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"] if fsdp \
        else [sys.executable]
    t = time.time()
    rc, stdout, stderr = run([*launch, __file__, "--child", str(model), str(out), *flags, *(["--fsdp"] if fsdp else [])],
                             timeout, env)
    row["wall_s"] = round(time.time() - t, 1)
    if rc != 0 or not (out / "gpu_check_row.json").is_file():
        err = (stderr.strip() or stdout.strip() or "no output").splitlines()
        return {**row, "error": f"timed out after {timeout:.0f} s" if rc is None else f"exit {rc}: {err[-1]}",
                "stderr_tail": "\n".join(err[-30:])}
    got = json.loads((out / "gpu_check_row.json").read_text())
    trajectories = int(flags[flags.index("--prompts-per-step") + 1]) * int(flags[flags.index("--group-size") + 1])
    s = got["steps"][-1]  # step 2: step 1 also pays for warm-up (CUDA kernels, the allocator, the BM25 index)
    gen_s = s["perf/rollout_s"] - s["retrieval_s"]
    flops = 6 * params * s["tokens"]  # forward + backward of the update (attention's FLOPs left out)
    return {**row, "step_s": s["perf/step_s"], "gen_s": gen_s, "retrieval_s": s["retrieval_s"],
            "logp_s": s["perf/logp_s"], "update_s": s["perf/update_s"],
            "gen_tok_s": s["rollout/response_tokens"] * trajectories / gen_s, "trained_tokens": s["tokens"],
            "peak_gib": got["peak_bytes"] / 2**30,
            "mfu": flops / s["perf/update_s"] / peak_flops if peak_flops else None, "steps": got["steps"]}


def table(rows: list[dict]) -> str:
    head = (f"{'model':<14}{'fsdp':<6}{'step s':>8}{'gen s':>8}{'retr s':>8}{'logp s':>8}{'update s':>9}"
            f"{'gen tok/s':>11}{'peak GiB':>9}{'MFU':>7}")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:<14}{'on' if r['fsdp'] else 'off':<6}  failed: {r['error']}")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        lines.append(f"{r['model']:<14}{'on' if r['fsdp'] else 'off':<6}{r['step_s']:>8.2f}{r['gen_s']:>8.2f}"
                     f"{r['retrieval_s']:>8.3f}{r['logp_s']:>8.2f}{r['update_s']:>9.2f}{r['gen_tok_s']:>11.1f}"
                     f"{r['peak_gib']:>9.2f}{mfu:>7}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU, the tests' tiny model and a tiny batch (CI, ~15 s)")
    ap.add_argument("--models", nargs="+", choices=MODELS, help=f"the models to train (default: {' '.join(MODELS)})")
    ap.add_argument("--tests", nargs="*", help="pytest paths for part 2 (default: the CUDA tests; none with --tiny)")
    ap.add_argument("--out", default="runs/gpu_check.json", help="the JSON of every figure (written atomically)")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], a.child[2:])
    if a.tiny and a.models:
        ap.error("--tiny trains the tests' tiny model only: leave out --models")
    import torch

    if not a.tiny and not torch.cuda.is_available():
        ap.error("no CUDA device: run with --tiny on a CPU")
    device = "cpu" if a.tiny else "cuda"
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    peak_flops = next((f for key, f in PEAK_FLOPS.items() if key in name), None) if device == "cuda" else None
    models = ["tiny"] if a.tiny else a.models or list(MODELS)
    env = {"OMP_NUM_THREADS": "1"} if a.tiny else {}  # the tiny model: 1 thread is far faster on a busy CPU (tests)
    flags = [*TRAIN["tiny" if a.tiny else "gpu"], *COMMON, *(["--device", "cpu"] if a.tiny else [])]  # GPU: auto
    print(f"{name} | torch {torch.__version__} | peak bf16 {peak_flops / 1e12:.0f} TFLOP/s" if peak_flops else
          f"{name} | torch {torch.__version__} | MFU: no peak figure for this device")
    report = {"device": name, "torch": torch.__version__, "peak_flops": peak_flops, "train_flags": flags, "rows": []}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        import search_world  # the data: a generated search world (corpus + questions), no hub, in a second

        search_world.main(["--out", str(tmp / "world"), "--sft-steps", "0"])
        flags += ["--train-data", str(tmp / "world" / "world_train.jsonl"), "--corpus", str(tmp / "world" / "corpus.jsonl")]
        params = {}
        for m in models:
            t = time.time()
            params[m] = build(m, tmp / m, device)
            print(f"built {m}: {params[m] / 1e6:,.1f}M parameters, random weights, in {time.time() - t:.0f} s", flush=True)
        report["tests"] = run_tests(a.tests if a.tests is not None else [] if a.tiny else CUDA_TESTS, TEST_TIMEOUT_S)
        print(f"tests: {report['tests'].get('summary') or report['tests'].get('skipped')}", flush=True)
        for failed in report["tests"].get("failed", []):
            print(f"  {failed}")
        for m in models:
            for fsdp in (False, True):
                report["rows"].append(train_row(m, params[m], tmp / m, fsdp, flags, tmp, peak_flops,
                                                timeout=BUDGET_S - (time.time() - t0), env=env))
                r = report["rows"][-1]
                print(f"trained {m}, fsdp {'on' if fsdp else 'off'}: " + (r["error"] if "error" in r else
                                                                          f"{r['wall_s']:.0f} s"), flush=True)
    report["seconds"] = round(time.time() - t0, 1)
    print(f"\n{STEPS} steps of {' '.join(TRAIN['tiny' if a.tiny else 'gpu'])}; figures of step {STEPS}\n"
          f"{table(report['rows'])}\n{report['seconds']:.0f} s in all")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(Path(a.out), json.dumps(report, indent=1))
    print(f"wrote {a.out}")
    if any("error" in r for r in report["rows"]):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
