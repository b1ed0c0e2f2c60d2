"""A real pretrained model on one GPU: plain GRPO against GRPO + LLDS, ready for a machine that cannot download.

`run` warm-starts a real instruct model on the Search-R1 protocol (lab/warm_start_qa.py), then trains it twice side
by side on the one GPU, lambda 0 and lambda --llds (train.py, unchanged), at a batch a GPU makes cheap (64 questions
x 5 answers a step), until --budget seconds are spent; each run's metrics.jsonl (the fixed probe's `probe/*` keys
included) and args.json, the warm start's log and a summary land in --out. The CPU runs of the same model (results/
real_model/) take ~10 CPU minutes a step at 32 answers; here a step of 320 takes seconds.

`pack` is for a GPU machine with no hub that takes at most --part-mib a transfer (ours: 64 MiB with the working
tree): it splits the model file (a .gguf, or a model folder as a tar) into parts, copies the question and passage
files (and, with --wheels, the wheels of the packages that machine lacks) into --carry, writes their SHA-256 to
manifest.json and prints one call per part; the last call runs `run`, which joins and checks the parts first.

    python gpu/real_model_run.py pack --model SmolLM2-135M-Instruct.Q4_1.gguf --train-data train.jsonl \\
        --test-data test.jsonl --corpus corpus.jsonl --wheels            # here: writes .carry/, prints the calls
    python gpu/real_model_run.py run --budget 480 --out $OUT                 # there, after the parts arrived
    python gpu/real_model_run.py run --model HuggingFaceTB/SmolLM2-135M-Instruct --train-data ... --corpus ...
    python gpu/real_model_run.py pack --tiny && python gpu/real_model_run.py run --tiny --out /tmp/rm  # on a CPU
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".carry" / "real_model"  # git ignores .carry/
WHEELS = ["transformers==5.24.0", "gguf==0.19.0", "rank-bm25==0.2.2", "nltk==3.10.4"]  # what the GPU image lacks
# The CPU runs' turn settings (results/real_model/PROTOCOL.md), so the GPU's curves read beside them
TURNS = ["--max-turns", "2", "--max-new-tokens", "48", "--max-obs-tokens", "100"]
WARM = ["--sft-steps", "150", *TURNS]  # the CPU grid's warm start: amendment 1's recipe (topk 3 there)
RL = {  # train.py flags beside TURNS; --lr and --llds come from run's flags
    "gpu": ["--prompts-per-step", "64", "--group-size", "5", "--mini-batch-size", "160", "--topk", "2",
            "--warmup-ratio", "0", "--probe-questions", "8", "--probe-every", "1", "--save-every", "100000",
            "--steps", "100000", "--amp", "bf16"],
    "tiny": ["--prompts-per-step", "2", "--group-size", "2", "--mini-batch-size", "2", "--topk", "2",
             "--warmup-ratio", "0", "--probe-questions", "2", "--probe-every", "1", "--save-every", "100000",
             "--steps", "2", "--device", "cpu", "--max-new-tokens", "8", "--max-obs-tokens", "24"],
}
FIXTURE = ROOT / "tests" / "fixtures" / "qa_sample"  # --tiny's questions and passages


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split(path: Path, out: Path, part_bytes: int) -> list[dict]:
    """Write `path` as consecutive byte ranges out/part0, part1, ... of at most part_bytes each; returns their names,
    sizes and SHA-256."""
    parts = []
    with open(path, "rb") as f:
        while chunk := f.read(part_bytes):
            p = out / f"part{len(parts)}"
            p.write_bytes(chunk)
            parts.append({"name": p.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    return parts


def join(carry: Path, manifest: dict, out: Path) -> Path:
    """The model file from its parts, each part's and the whole file's SHA-256 checked. Raises SystemExit with one
    line naming the first missing or damaged part (a transfer that did not arrive, or a machine that went back)."""
    with open(out, "wb") as f:
        for p in manifest["parts"]:
            path = carry / p["name"]
            if not path.is_file():
                raise SystemExit(f"{path}: missing: part {p['name']} of {len(manifest['parts'])} did not arrive "
                                 f"(send the calls `pack` printed, back to back, while the machine is warm)")
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != p["sha256"]:
                raise SystemExit(f"{path}: SHA-256 differs from manifest.json's: a damaged transfer, send it again")
            f.write(data)
    if sha256(out) != manifest["sha256"]:
        raise SystemExit(f"{out}: the joined file's SHA-256 differs from manifest.json's")
    return out


def pack(a) -> None:
    carry = Path(a.carry)
    if carry.exists():
        shutil.rmtree(carry)
    (carry / "data").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(a.model) if a.model else None
        if a.tiny:  # the tests' tiny model, as a folder
            sys.path.insert(0, str(ROOT / "tests"))
            import tiny

            model = Path(tiny.save_tiny(Path(tmp) / "tiny-model"))
        if model is None or not model.exists():
            raise SystemExit(f"--model: {a.model} does not exist (a .gguf file or a model folder)")
        if model.is_dir():  # a folder travels as one tar
            with tarfile.open(Path(tmp) / "model.tar", "w") as t:
                t.add(model, arcname="model")
            model = Path(tmp) / "model.tar"
        parts = split(model, carry, int(a.part_mib * 2**20))
        files = {}
        for key, src in (("train", a.train_data), ("test", a.test_data), ("corpus", a.corpus)):
            if src is None:
                continue
            srcs = [Path(s) for s in src] if isinstance(src, list) else [Path(src)]
            for s in srcs:
                if not s.is_file():
                    raise SystemExit(f"--{'corpus' if key == 'corpus' else key + '-data'}: {s} is not a file")
            name = f"{key}.jsonl"
            with open(carry / "data" / name, "wb") as f:
                for s in srcs:
                    f.write(s.read_bytes())
            files[key] = f"data/{name}"
        manifest = {"model_name": model.name if model.suffix == ".gguf" else "model.tar", "sha256": sha256(model),
                    "bytes": model.stat().st_size, "parts": parts, "files": files}
    if a.wheels:
        (carry / "whl").mkdir()
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                        "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                        "--platform", "any", "-d", str(carry / "whl"), *WHEELS], check=True)
    (carry / "manifest.json").write_text(json.dumps(manifest, indent=1))
    rel = carry.relative_to(ROOT) if carry.is_relative_to(ROOT) else carry
    install = (f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "
               f"/tmp/site {rel}/whl/*.whl && export PYTHONPATH=/tmp/site || exit; ") if a.wheels else ""
    print(f"packed {manifest['bytes'] / 2**20:.1f} MiB in {len(parts)} parts under {rel}; the device calls, back to "
          f"back (carried files stay on the warm machine):")
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        carried = [f"{rel}/{p['name']}"] + ([f"{rel}/data", f"{rel}/manifest.json"] if i == 0 else []) + \
            ([f"{rel}/whl"] if last and a.wheels else [])
        command = (f"{install}PYTHONUNBUFFERED=1 python3 gpu/real_model_run.py run --carry {rel} --budget 480 "
                   f"--out $OUT" if last else f"ls -l {rel}")
        print(f"  call {i + 1}: carry={json.dumps(carried)} command={command!r}")


def launch(model: str, files: dict, out: Path, lam: float, flags: list[str], log) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "train.py"), "--model", model, "--train-data", files["train"],
           "--corpus", files["corpus"], "--llds", str(lam), "--out-dir", str(out), *flags]
    print(" ".join(cmd), file=log, flush=True)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run(a) -> None:
    t0 = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or tempfile.mkdtemp(prefix="real_model_"))
    kind = "tiny" if a.tiny else "gpu"
    if a.model:  # a hub id or a local model: no parts
        model, files = a.model, {"train": a.train_data, "test": a.test_data, "corpus": a.corpus}
        if not (files["train"] and files["corpus"]):
            raise SystemExit("--model without `pack`'s parts needs --train-data and --corpus")
    else:
        carry = Path(a.carry)
        if not (carry / "manifest.json").is_file():
            raise SystemExit(f"{carry}/manifest.json: not found: run `pack` here first and send its calls, or pass "
                             f"--model with --train-data and --corpus")
        manifest = json.loads((carry / "manifest.json").read_text())
        joined = join(carry, manifest, work / manifest["model_name"])
        if manifest["model_name"] == "model.tar":
            with tarfile.open(joined) as t:
                t.extractall(work, filter="data")
            joined = work / "model"
        model = str(joined)
        files = {k: str(carry / v) for k, v in manifest["files"].items()}
        files.setdefault("test", None)
    print(f"model {model} ready in {time.time() - t0:.0f} s", flush=True)
    warm = work / "warm"
    warm_cmd = [sys.executable, str(ROOT / "lab" / "warm_start_qa.py"), "--model", model, "--train-data",
                files["train"], "--corpus", files["corpus"], "--out", str(warm), "--overwrite", *WARM,
                *(["--test-data", files["test"]] if files.get("test") else []),
                *(["--sft-steps", "2", "--eval-questions", "2", "--max-new-tokens", "8", "--max-obs-tokens", "24"]
                  if a.tiny else ["--amp", "bf16", "--eval-questions", "64", "--eval-group-size", "5"])]
    with open(out / "warm_start.log", "w") as log:
        print(" ".join(warm_cmd), file=log, flush=True)
        done = subprocess.run(warm_cmd, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"the warm start failed (exit {done.returncode}): {out / 'warm_start.log'}")
    print(f"warm start done at {time.time() - t0:.0f} s", flush=True)
    flags = [*TURNS, *RL[kind], "--lr", str(a.lr), "--seed", str(a.seed)]
    runs = {f"lambda{lam:g}": lam for lam in (0.0, a.llds)}
    with open(out / "train.log", "w") as log:
        procs = {name: launch(str(warm), files, work / name, lam, flags, log) for name, lam in runs.items()}
        deadline = t0 + a.budget
        while any(p.poll() is None for p in procs.values()) and time.time() < deadline:
            time.sleep(1)
        for p in procs.values():  # train.py finishes its step, saves and stops on SIGTERM
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=a.grace)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    summary = {"model": model, "flags": flags, "seconds": round(time.time() - t0, 1), "runs": {}}
    for name in runs:
        (out / name).mkdir(exist_ok=True)
        for f in ("metrics.jsonl", "args.json"):
            if (work / name / f).is_file():
                shutil.copy(work / name / f, out / name / f)
        rows = [json.loads(s) for s in (out / name / "metrics.jsonl").read_text().splitlines()] \
            if (out / name / "metrics.jsonl").is_file() else []
        summary["runs"][name] = {"steps": len(rows), "reward": [r.get("rollout/reward") for r in rows],
                                 "probe_dlogp_correct": [r.get("probe/dlogp_correct") for r in rows],
                                 "step_s": [r.get("perf/step_s") for r in rows]}
        print(f"{name}: {len(rows)} steps; reward {' '.join(f'{x:.2f}' for x in summary['runs'][name]['reward'])}",
              flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    if not all(s["steps"] for s in summary["runs"].values()):
        raise SystemExit(f"a run logged no step: {out / 'train.log'}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("pack", help="here: the model in parts, the data and the wheels under --carry")
    p.add_argument("--model", help="a .gguf file or a model folder")
    p.add_argument("--train-data", nargs="+", help="training question files (joined into one)")
    p.add_argument("--test-data", nargs="+", help="held-out question files for the warm start's EM (optional)")
    p.add_argument("--corpus", help="passages, jsonl")
    p.add_argument("--part-mib", type=float, default=40, help="MiB per part at most (default 40)")
    p.add_argument("--wheels", action="store_true", help=f"download the wheels the GPU image lacks: {' '.join(WHEELS)}")
    r = sub.add_parser("run", help="there: join, warm-start, train lambda 0 and --llds side by side, write --out")
    r.add_argument("--model", help="a hub id or model path instead of `pack`'s parts (then --train-data, --corpus)")
    r.add_argument("--train-data")
    r.add_argument("--test-data")
    r.add_argument("--corpus")
    r.add_argument("--out", default="runs/real_model_gpu", help="metrics, logs and summary.json")
    r.add_argument("--work", help="weights and checkpoints (default: a temporary folder, removed at the end)")
    r.add_argument("--budget", type=float, default=480, help="seconds from start after which the runs are stopped")
    r.add_argument("--grace", type=float, default=60, help="seconds a stopped run has to finish its step and save")
    r.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate of both runs (default: the CPU grid's)")
    r.add_argument("--llds", type=float, default=0.2, help="lambda of the second run (the first is 0)")
    r.add_argument("--seed", type=int, default=0)
    for q in (p, r):
        q.add_argument("--carry", default=str(CARRY), help="the folder of the parts, data and wheels")
        q.add_argument("--tiny", action="store_true", help="the tests' tiny model and QA sample, on the CPU")
    a = ap.parse_args(argv)
    if a.stage == "pack":
        if a.tiny:
            a.train_data = [str(FIXTURE / "hotpotqa_train.jsonl"), str(FIXTURE / "musique_train.jsonl")]
            a.test_data = [str(FIXTURE / "hotpotqa_test.jsonl")]
            a.corpus = str(FIXTURE / "corpus.jsonl")
        elif not (a.model and a.train_data and a.corpus):
            ap.error("pack needs --model, --train-data and --corpus (or --tiny)")
        if a.part_mib <= 0:
            ap.error(f"--part-mib must be > 0, got {a.part_mib}")
        return pack(a)
    if a.budget <= 0:
        ap.error(f"--budget must be > 0 seconds, got {a.budget}")
    if not a.tiny and not a.model:
        import torch

        if not torch.cuda.is_available():
            ap.error("no CUDA device: `run` trains on a GPU (--tiny runs the path on a CPU)")
    return run(a)


if __name__ == "__main__":
    main()
