"""gpu/gpu_check.py --tiny on the CPU, as CI runs it, so that the GPU check does not rot before a GPU runs it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hang

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "gpu/gpu_check.py"]
FIGURES = ("step_s", "gen_s", "logp_s", "update_s", "gen_tok_s", "trained_tokens", "peak_gib", "params")


def test_tiny_run_writes_every_row_with_positive_figures(tmp_path):
    """Both rows (--fsdp off and on one torchrun rank), each with positive timings, tokens/s and peak memory, step 2's
    figures taken from the run's own metrics; the tests part runs one named test through pytest."""
    out = tmp_path / "x.json"
    r = hang.run([*SCRIPT, "--tiny", "--out", str(out), "--tests",
                  "tests/test_memory.py::test_kv_bytes_per_token_by_hand"],
                 cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [(row["model"], row["fsdp"]) for row in report["rows"]] == [("tiny", False), ("tiny", True)]
    for row in report["rows"]:
        assert "error" not in row, row
        assert all(row[k] > 0 for k in FIGURES), row
        assert row["retrieval_s"] >= 0 and row["mfu"] is None  # no peak FLOP/s figure for a CPU
        assert len(row["steps"]) == 2 and row["update_s"] == row["steps"][1]["phases"]["update"]["s"]  # exact: a copy
        assert 0 < row["update_s"] < row["steps"][1]["perf/update_s"]  # perf/update_s adds the after-update pass
        assert row["plan"]["static_gib"] >= 0 and row["plan"]["gen_rows"] >= 1 and row["plan"]["micro"] == 2
        assert row["gen_s"] + row["retrieval_s"] == pytest.approx(row["steps"][1]["perf/rollout_s"])
    assert report["tests"]["rc"] == 0 and "1 passed" in report["tests"]["summary"], report["tests"]
    gen = report["generation"]["modes"]["fp32"]  # cb and hf, greedy: the same ids (the tiny model on a CPU)
    assert gen["rows_same"] == gen["rows_compared"] == 16 and gen["cb"]["tokens"] > 0 and gen["hf"]["tok_s"] > 0
    main = report["main"]  # the main command's step, and its extrapolation to 512 prompts
    assert "error" not in main and main["trajectories"] == 4 and main["extrapolated"]["rows"] == 512 * 2
    assert main["extrapolated"]["low_s"] <= main["extrapolated"]["high_s"]
    table = r.stdout[r.stdout.index("model "):]
    assert table.count("\ntiny ") == 3 and "failed" not in table and str(out) in r.stdout


def test_bad_input_is_one_clear_line():
    r = subprocess.run([*SCRIPT, "--tiny", "--models", "Qwen2.5-3B"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("--tiny trains the tests' tiny model "
                                                                            "only: leave out --models"), r.stderr
    if not torch.cuda.is_available():
        r = subprocess.run(SCRIPT, cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
            "error: no CUDA device: run with --tiny on a CPU"), r.stderr


REAL = [sys.executable, "gpu/real_model_run.py"]


def test_real_model_tiny_pack_and_run(tmp_path):
    """gpu/real_model_run.py, the whole path on the CPU: the model folder packed in parts, joined and checked,
    warm-started and trained under lambda 0 and 0.2 side by side; each run's metrics come back with the probe's keys.
    A part that did not arrive, or arrived damaged, is one line naming it, before anything trains."""
    carry, out = tmp_path / "carry", tmp_path / "out"
    r = hang.run([*REAL, "pack", "--tiny", "--part-mib", "0.3", "--carry", str(carry)], cwd=ROOT,
                 capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    manifest = json.loads((carry / "manifest.json").read_text())
    assert len(manifest["parts"]) >= 2 and all(p["bytes"] <= 0.3 * 2**20 for p in manifest["parts"])
    assert sum(p["bytes"] for p in manifest["parts"]) == manifest["bytes"]
    assert r.stdout.count("  call ") == len(manifest["parts"]) and "real_model_run.py run" in r.stdout
    r = hang.run([*REAL, "run", "--tiny", "--carry", str(carry), "--out", str(out)], cwd=ROOT,
                 capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"lambda0", "lambda0.2"}
    for name in summary["runs"]:
        rows = [json.loads(s) for s in (out / name / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in rows] == [1, 2] and all("probe/n_incorrect" in row for row in rows)
        assert json.loads((out / name / "args.json").read_text())["llds"] == pytest.approx(float(name[len("lambda"):]))
    part = carry / manifest["parts"][1]["name"]
    data = part.read_bytes()
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # one bit pattern flipped
    r = subprocess.run([*REAL, "run", "--tiny", "--carry", str(carry), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].endswith(
        "SHA-256 differs from manifest.json's: a damaged transfer, send it again"), r.stderr
    part.unlink()
    r = subprocess.run([*REAL, "run", "--tiny", "--carry", str(carry), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "part1: missing" in r.stderr.strip().splitlines()[-1], r.stderr


def test_fsdp_on_and_the_decode_part_alone(tmp_path):
    """--fsdp on --parts train decode: part 3 runs the one-rank torchrun row alone (a lease spends its minutes on what
    is left), and part 6 (issue 51) a decode step per row count, in its own process, on a DynamicCache (eager) and on
    the cb engine's static layout (static); on a CPU no graph column (CUDA only) and no bandwidth figure, so no floor
    (a GPU row has floor_ms and x_floor)."""
    out = tmp_path / "x.json"
    r = hang.run([*SCRIPT, "--tiny", "--fsdp", "on", "--parts", "train", "decode", "--main-prompts", "0", "--out",
                  str(out)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [(row["model"], row["fsdp"]) for row in report["rows"]] == [("tiny", True)]
    assert "error" not in report["rows"][0] and report["main"]["error"] == "left out (--main-prompts 0)"
    assert report["generation"] == {"error": "left out (--parts)"}
    decode = report["decode"]["tiny"]
    assert decode["context"] == 64 and [row["rows"] for row in decode["rows"]] == [2, 4]
    assert all(row["eager_ms"] > 0 and row["static_ms"] > 0 and row["floor_ms"] is None and row["graph_ms"] is None
               and row["graph_error"] is None for row in decode["rows"])
    assert "graph: CUDA only" in r.stdout
    assert "decode step, tiny, KV cache 64 tokens (eager: DynamicCache" in r.stdout
