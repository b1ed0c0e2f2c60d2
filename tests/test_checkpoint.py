"""Checkpoints that can always be resumed (checkpoint.py, train.py): a kill at every point inside a save, a full disk,
Ctrl-C / SIGTERM, a finished out-dir, a diverging run. Each case resumes to the uninterrupted run's metrics."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machinery import checkpoint  # noqa: E402
import hang  # noqa: E402
from conftest import same_value  # noqa: E402  (and the `files` fixture: the tiny model, questions, corpus)

# a step costs ~0.3 s on the tiny model: 2 questions x 2 trajectories, one turn of 8 tokens, 2 optimizer steps
TINY = ["--prompts-per-step", "2", "--group-size", "2", "--max-turns", "1", "--max-new-tokens", "8",
        "--max-obs-tokens", "32", "--mini-batch-size", "2", "--micro-batch-size", "2", "--lr", "1e-3",
        "--kl-coef", "0.01", "--llds", "0.1", "--seed", "5", "--warmup-ratio", "0.5", "--amp", "off"]


def train_args(files, out, *extra):
    return ["--model", files["model"], "--train-data", files["q"], "--corpus", files["corpus"], "--out-dir", str(out),
            *TINY, *extra]


def train(files, out, *extra) -> list[dict]:
    """train.main in this process (1 thread: far faster for the tiny model); returns metrics.jsonl."""
    import train as train_py

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_py.main(train_py.parse_args(train_args(files, out, *extra)))
    finally:
        torch.set_num_threads(n)
    return metrics(out)


def metrics(out) -> list[dict]:
    return [json.loads(s) for s in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(a: list[dict], b: list[dict]):
    """The same steps with the same metrics (perf/ timings aside): floats to 1e-6, the rest exactly."""
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for ma, mb in zip(a, b):
        keys = [k for k in ma if not k.startswith("perf/")]
        assert keys == [k for k in mb if not k.startswith("perf/")]
        for k in keys:
            assert same_value(ma[k], mb[k]), (ma["step"], k, ma[k], mb[k])


def final_weights(out) -> dict:
    from safetensors.torch import load_file

    return load_file(checkpoint.latest(out) / "model.safetensors")


@pytest.fixture(scope="module")
def reference(files):
    """The uninterrupted run: 3 steps, a checkpoint after each."""
    out = files["dir"] / "ckpt_reference"
    return train(files, out, "--steps", "3", "--save-every", "1"), final_weights(out)


# ----------------------------------------------------------------------------------------------------------------------
# checkpoint.py on its own


def write_files(contents: dict):
    def write(folder):
        for name, text in contents.items():
            (folder / name).write_text(text)
    return write


def test_save_publishes_whole_folders_and_keeps_the_newest(tmp_path):
    for step in (1, 2, 3):
        folder = checkpoint.save(tmp_path, step, write_files({"w.txt": f"weights {step}", "s.txt": "state"}), keep=2)
        assert folder == tmp_path / "checkpoints" / f"step_{step:06d}" and checkpoint.verify(folder) is None
    assert [s for s, _ in checkpoint.checkpoints(tmp_path)] == [2, 3]  # keep=2: the two newest
    assert checkpoint.latest(tmp_path).name == "step_000003"
    marker = json.loads((tmp_path / "checkpoints" / "step_000003" / "COMPLETE").read_text())
    assert marker == {"step": 3, "files": {"s.txt": 5, "w.txt": 9}}
    checkpoint.save(tmp_path, 4, write_files({"w.txt": "4"}), keep=1)
    assert [s for s, _ in checkpoint.checkpoints(tmp_path)] == [4]


def test_verify_catches_truncation_and_latest_falls_back(tmp_path):
    checkpoint.save(tmp_path, 1, write_files({"w.txt": "one"}), keep=3)
    newest = checkpoint.save(tmp_path, 2, write_files({"w.txt": "two two"}), keep=3)
    os.truncate(newest / "w.txt", 3)  # e.g. a partial copy of the run folder
    warnings = []
    assert checkpoint.verify(newest) == "w.txt has 3 bytes, 7 were written (truncated or a partial copy)"
    assert checkpoint.latest(tmp_path, warn=warnings.append).name == "step_000001"
    assert warnings == [f"warning: skipping {newest}: w.txt has 3 bytes, 7 were written (truncated or a partial copy)"]
    (newest / "COMPLETE").unlink()
    assert checkpoint.verify(newest).startswith("no COMPLETE marker")
    with pytest.raises(ValueError, match="not a complete checkpoint: no COMPLETE marker"):
        checkpoint.resolve(newest)
    assert checkpoint.resolve(tmp_path, warn=lambda _: None).name == "step_000001"
    with pytest.raises(FileNotFoundError, match="no such run folder"):
        checkpoint.resolve(tmp_path / "nope")
    # a damaged folder of the step being saved is replaced, the older complete one kept until the new one is whole
    assert checkpoint.save(tmp_path, 2, write_files({"w.txt": "again"}), keep=1).name == "step_000002"
    assert [s for s, _ in checkpoint.checkpoints(tmp_path)] == [2] and checkpoint.verify(newest) is None


def test_leftovers_of_interrupted_saves_never_block_a_save(tmp_path):
    """Today's main: a kill while `checkpoint.old` was being removed left it non-empty, and every later save failed with
    "Directory not empty". Leftover .tmp and .trash folders (complete-looking or not) are never read and are removed."""
    checkpoint.save(tmp_path, 1, write_files({"w.txt": "one"}))
    root = tmp_path / "checkpoints"
    for name in ("step_000002.tmp", "step_000000.123.trash", "step_000001.456.trash"):
        (root / name).mkdir()
        (root / name / "w.txt").write_text("half")
    (root / "step_000002.tmp" / "COMPLETE").write_text('{"step": 2, "files": {"w.txt": 4}}')  # never published
    assert checkpoint.latest(tmp_path).name == "step_000001"
    checkpoint.save(tmp_path, 2, write_files({"w.txt": "two"}))
    assert sorted(p.name for p in root.iterdir()) == ["step_000002"]


def test_failed_write_removes_the_partial_folder(tmp_path):
    checkpoint.save(tmp_path, 1, write_files({"w.txt": "one"}))

    def fails(folder):
        (folder / "w.txt").write_text("par")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")  # torch.save on a full disk

    with pytest.raises(OSError, match="could not save checkpoint .*step_000002 .*RuntimeError.*MiB free there"):
        checkpoint.save(tmp_path, 2, fails)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]


# ----------------------------------------------------------------------------------------------------------------------
# A kill at every point of a save, in a real run


class Killed(BaseException):
    """What SIGKILL does to the save: nothing in it catches this, so no cleanup code runs."""


class KillDuringSave:
    """Counts the filesystem operations of the checkpoint save of `step` (mkdir, the files save_pretrained and
    torch.save write, fsync, rename, rmtree; an rmtree twice: before it and after its first file) and raises Killed
    just before operation `kill_at` (0: never; .count says how many there were)."""

    def __init__(self, monkeypatch, step: int, kill_at: int = 0):
        import transformers

        self.step, self.kill_at, self.count, self.active = step, kill_at, 0, False
        real_save = checkpoint.save

        def save(out_dir, step, write, keep=1):
            self.active = step == self.step
            try:
                return real_save(out_dir, step, write, keep)
            finally:
                self.active = False

        def rmtree(path, *a, **kw):  # a kill half-way through a deletion too
            self.point()
            files = [p for p in Path(path).rglob("*") if p.is_file()]
            if files:
                files[0].unlink()
                self.point()
            return real_rmtree(path, *a, **kw)

        real_rmtree = shutil.rmtree
        monkeypatch.setattr(checkpoint, "save", save)
        monkeypatch.setattr(shutil, "rmtree", rmtree)
        for owner, name in ((os, "mkdir"), (os, "replace"), (os, "fsync"), (torch, "save"),
                            (transformers.PreTrainedModel, "save_pretrained"),
                            (transformers.PreTrainedTokenizerBase, "save_pretrained")):
            monkeypatch.setattr(owner, name, self.wrap(getattr(owner, name)))

    def point(self):
        if self.active:
            self.count += 1
            if self.count == self.kill_at:
                raise Killed(f"killed before operation {self.count} of the save of step {self.step}")

    def wrap(self, fn):
        def wrapped(*a, **kw):
            self.point()
            return fn(*a, **kw)
        return wrapped


def test_kill_at_every_point_of_a_save_resumes_to_the_same_run(files, reference, monkeypatch):
    """Killed before each filesystem operation of the step-2 save (a step-1 checkpoint exists, keep=1 deletes it at
    the end), then resumed with --resume OUT_DIR: always a complete checkpoint to continue from (step 1 or 2), and the
    resumed run's metrics and final weights equal the uninterrupted run's; its later saves work."""
    ref_metrics, ref_weights = reference
    with monkeypatch.context() as m:  # count the operations of an uninterrupted save
        probe = KillDuringSave(m, step=2)
        train(files, files["dir"] / "ckpt_probe", "--steps", "2", "--save-every", "1")
    assert probe.count >= 15, probe.count  # mkdir, 3 writers, ~8 fsyncs, marker, renames, the prune's rmtree
    resumed_from = set()
    for k in range(1, probe.count + 1):
        out = files["dir"] / f"ckpt_kill{k}"
        with monkeypatch.context() as m:
            KillDuringSave(m, step=2, kill_at=k)
            with pytest.raises(Killed):
                train(files, out, "--steps", "3", "--save-every", "1")
        found = checkpoint.latest(out, warn=lambda _: None)
        assert found is not None, f"kill {k}: no complete checkpoint left"
        resumed_from.add(found.name)
        resumed = train(files, out, "--steps", "3", "--save-every", "1", "--resume", str(out))
        assert_same_run(ref_metrics, resumed)
        weights = final_weights(out)
        assert all(torch.equal(ref_weights[key], weights[key])  # exact: a resume on this machine, the same code
                   for key in ref_weights), f"kill {k}"
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000003"], f"kill {k}"
    assert resumed_from == {"step_000001", "step_000002"}  # kills before and after the new one was published


# ----------------------------------------------------------------------------------------------------------------------
# Full disk, signals, a finished out-dir, divergence


def can_mount_tmpfs() -> bool:
    try:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /mnt && umount /mnt"], capture_output=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root and mount namespaces (unshare) for a small tmpfs")
def test_full_disk_mid_save_stops_cleanly_and_resumes(files, reference, tmp_path):
    """On a 3.5 MB tmpfs (a tiny checkpoint is 2.2 MB) the step-1 save fits and the step-2 save runs out of space
    inside torch.save: one clear line, the partial folder removed, the step-1 checkpoint intact. With more space,
    --resume continues to the uninterrupted run's metrics. (Today's main: the partial checkpoint.tmp/ stayed.)"""
    disk = tmp_path / "disk"
    disk.mkdir()
    cmd = [sys.executable, "train.py", *train_args(files, disk / "run", "--steps", "3", "--save-every", "1")]
    script = (f"mount -t tmpfs -o size=3500k tmpfs {disk} && {{ {' '.join(map(str, cmd))} > {tmp_path}/full.log 2>&1;"
              f" echo $? > {tmp_path}/full.rc; ls {disk}/run/checkpoints > {tmp_path}/full.ls; "
              f"mount -o remount,size=64m {disk} && {' '.join(map(str, cmd))} --resume {disk}/run "
              f"> {tmp_path}/resume.log 2>&1; echo $? > {tmp_path}/resume.rc; cp -r {disk}/run {tmp_path}/run; }}")
    hang.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=ROOT,
             env={**os.environ, "OMP_NUM_THREADS": "1"})
    log = (tmp_path / "full.log").read_text()
    assert (tmp_path / "full.rc").read_text().strip() == "1", log[-2000:]
    error = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "could not save checkpoint" in error[0] and "step_000002" in error[0], log[-2000:]
    assert "continues from" in error[0] and "step_000001" in error[0] and "Traceback" not in log
    assert (tmp_path / "full.ls").read_text().split() == ["step_000001"]  # no partial folder left
    assert (tmp_path / "resume.rc").read_text().strip() == "0", (tmp_path / "resume.log").read_text()[-2000:]
    assert_same_run(reference[0], metrics(tmp_path / "run"))


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root and mount namespaces (unshare) for a small tmpfs")
def test_a_full_or_read_only_out_dir_is_one_line_before_the_model_loads(files, tmp_path):
    """--out-dir on a full disk or a read-only file system was `error: [Errno 28]` / `[Errno 30]` after the model had
    loaded, naming no flag. Both are one line naming --out-dir now, before the model loads (--model does not exist
    here: its error would come first otherwise)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    cmd = " ".join(map(str, [sys.executable, "train.py", *train_args(files, disk / "run"), "--model", "/nope/model"]))
    script = (f"mount -t tmpfs -o size=256k tmpfs {disk} && {{ cat /dev/zero > {disk}/fill 2>/dev/null; {cmd} "
              f"> {tmp_path}/full.log 2>&1; rm {disk}/fill; mount -o remount,ro {disk} && {cmd} > {tmp_path}/ro.log "
              f"2>&1; ls -A {disk} > {tmp_path}/ls; }}")
    hang.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=ROOT)
    for log, why in (("full.log", "No space left on device"), ("ro.log", f"{disk} is not writable")):
        lines = (tmp_path / log).read_text().strip().splitlines()
        assert lines[-1] == f"error: --out-dir {disk}/run: cannot write there ({why})", lines
    assert (tmp_path / "ls").read_text().split() == []  # the checks left nothing behind


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_saves_at_the_end_of_the_step(files, reference, monkeypatch, signum):
    """A signal during step 2 with the default --save-every (10, more than the run's steps): the run finishes step 2,
    saves it and stops (exit 128 + signal); --resume then gives the uninterrupted run. (Today's main: KeyboardInterrupt
    with no checkpoint at all, or SIGTERM killing the process.)"""
    import train as train_py

    calls, real_rollout = [0], train_py.rollout

    def rollout(*a, **kw):
        calls[0] += 1
        if calls[0] == 2:  # in step 2's rollout, as a user's Ctrl-C would arrive
            os.kill(os.getpid(), signum)
        return real_rollout(*a, **kw)

    out = files["dir"] / f"ckpt_signal{signum}"
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(train_py, "rollout", rollout)
    with pytest.raises(SystemExit) as stop:
        train(files, out, "--steps", "3")
    monkeypatch.undo()
    assert stop.value.code == 128 + signum
    assert checkpoint.latest(out).name == "step_000002" and [m["step"] for m in metrics(out)] == [1, 2]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # restored
    assert_same_run(reference[0], train(files, out, "--steps", "3", "--save-every", "1", "--resume", str(out)))


def test_a_run_folder_is_not_reused_without_resume_or_overwrite(files, reference, capsys):
    """Rerunning a finished --out-dir without --resume is refused (today's main silently overwrote its metrics and
    checkpoint); --resume of a finished run has nothing to do; --overwrite starts afresh."""
    out = files["dir"] / "ckpt_reference"
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit, match=f"--out-dir {re.escape(str(out))} holds a run .*--overwrite"):
        train(files, out, "--steps", "3")
    assert (out / "metrics.jsonl").read_text() == before
    train(files, out, "--steps", "3", "--resume", str(out))
    assert "nothing to do" in capsys.readouterr().out and (out / "metrics.jsonl").read_text() == before
    again = files["dir"] / "ckpt_overwrite"
    shutil.copytree(out, again)
    assert_same_run(reference[0], train(files, again, "--steps", "3", "--save-every", "1", "--overwrite"))


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_over(files, reference, monkeypatch):
    """Killed inside the first save: no checkpoint, but metrics.jsonl exists. --resume starts at step 1 (with a warning)
    rather than refusing, so a job script that always passes --resume works."""
    out = files["dir"] / "ckpt_first"
    with monkeypatch.context() as m:
        KillDuringSave(m, step=1, kill_at=5)
        with pytest.raises(Killed):
            train(files, out, "--steps", "3", "--save-every", "1")
    assert checkpoint.latest(out, warn=lambda _: None) is None and (out / "metrics.jsonl").exists()
    assert_same_run(reference[0], train(files, out, "--steps", "3", "--save-every", "1", "--resume", str(out)))


def test_a_diverging_update_stops_before_saving_non_finite_weights(files, monkeypatch):
    """--lr 1e10: the first update leaves weights whose forward pass overflows. The run stops after that step with one
    line, and no checkpoint holds those weights (today's main saved them with --save-every 1, and crashed inside
    torch.multinomial at the next step's sampling, which now also ends in one line)."""
    import train as train_py

    out = files["dir"] / "ckpt_diverge"  # warmup: step 1 runs at lr 0 and is saved; step 2 at 1e10 diverges
    with pytest.raises(SystemExit, match=r"step 2: the update left non-finite weights or log-probs \(the policy "
                                         r"diverged; --lr 1e\+10\?\); not saved. --resume .* continues from "
                                         r".*step_000001\.$"):
        train(files, out, "--steps", "3", "--save-every", "1", "--lr", "1e10")
    assert checkpoint.latest(out).name == "step_000001" and [m["step"] for m in metrics(out)] == [1, 2]
    model, _, _ = train_py.load_policy(str(out), "float32", "cpu")  # the run folder: its newest checkpoint
    assert all(torch.isfinite(p).all() for p in model.parameters())

    def overflowed(*a, **kw):  # what HF sampling raises on NaN/inf logits
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")

    monkeypatch.setattr(train_py, "rollout", overflowed)
    with pytest.raises(SystemExit, match="step 1: sampling met NaN/inf probabilities: the policy diverged"):
        train(files, files["dir"] / "ckpt_diverge2", "--steps", "1")


def test_truncated_or_damaged_trainer_state_is_one_clear_line(files, reference):
    """A truncated trainer_state.pt (a partial copy) or one damaged at its full size: --resume says which file and what
    is wrong, in one line, and deletes nothing (today's main: a traceback from torch.load's unpickler)."""
    out = files["dir"] / "ckpt_damaged"
    shutil.copytree(files["dir"] / "ckpt_reference", out)
    state = out / "checkpoints" / "step_000003" / "trainer_state.pt"
    size = state.stat().st_size
    os.truncate(state, size // 2)
    with pytest.raises(SystemExit, match=f"--resume {re.escape(str(out))}: no complete checkpoint; the newest, "
                                         f"step_000003: trainer_state.pt has {size // 2} bytes, {size} were written"):
        train(files, out, "--steps", "4", "--resume", str(out))
    state.write_bytes(b"\0" * size)  # the size the marker recorded, but not a torch file
    with pytest.raises(SystemExit, match=re.escape(f"{state}: unreadable (")):
        train(files, out, "--steps", "4", "--resume", str(out))
    assert state.exists() and len(metrics(out)) == 3


def test_checkpoint_py_lists_a_runs_checkpoints(tmp_path):
    """`python -m machinery.checkpoint RUN` (the file run alone): each checkpoint, whether it is complete, and the one --resume
    would take; a damaged newest one is named and skipped."""
    for step in (1, 2):
        checkpoint.save(tmp_path, step, lambda folder: (folder / "weights.bin").write_bytes(b"x" * 100), keep=2)
    with open(checkpoint.step_dir(tmp_path, 2) / "weights.bin", "r+b") as f:
        f.truncate(10)
    r = hang.run([sys.executable, "-m", "machinery.checkpoint", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("step      1 ") and lines[0].endswith("complete")
    assert lines[1].startswith("step      2 ") and "weights.bin" in lines[1] and not lines[1].endswith("complete")
    assert lines[2] == f"--resume {tmp_path} continues from: {checkpoint.step_dir(tmp_path, 1)}"


def test_checkpoint_py_names_a_missing_run_folder(tmp_path):
    """`python -m machinery.checkpoint no/such/dir` said "continues from: nothing" and exited 0, as for a run that saved
    nothing yet: a typo looked like an empty run. It fails with one line naming the folder."""
    (tmp_path / "file").write_text("")
    for missing, why in ((tmp_path / "no" / "such" / "dir", "no such run folder"),
                         (tmp_path / "file", "no such run folder (a file)")):
        r = hang.run([sys.executable, "-m", "machinery.checkpoint", str(missing)], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 1 and r.stdout == "" and r.stderr == f"error: {missing}: {why}\n", r


def test_ctrl_c_advice_fits_the_command_that_runs_train(files, monkeypatch, capsys):
    """train.main(args, rerun=...) (lab/spiral.py) says how *that* command continues: spiral.py resumes its runs
    itself, and "--resume RUN" was advice for train.py only. Without rerun the advice is train.py's, as before."""
    import train as train_py

    real_rollout = train_py.rollout

    def rollout(*a, **kw):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in step 1
        return real_rollout(*a, **kw)

    monkeypatch.setattr(train_py, "rollout", rollout)
    out = files["dir"] / "ckpt_rerun"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(SystemExit):
            train_py.main(train_py.parse_args(train_args(files, out, "--steps", "3")), rerun="the same spiral.py command")
    finally:
        torch.set_num_threads(n)
    printed = capsys.readouterr().out
    assert (f"stopped after step 1. Continue with the same spiral.py command: it resumes from "
            f"{checkpoint.step_dir(out, 1)}.\n") in printed and "--resume" not in printed
    assert checkpoint.resume_note(out, "the same spiral.py command") == (
        f"Continue with the same spiral.py command: it resumes from {checkpoint.step_dir(out, 1)}.")
    assert checkpoint.resume_note(out) == f"--resume {out} continues from {checkpoint.step_dir(out, 1)}."


def test_a_killed_writers_temp_file_is_removed_when_the_run_starts_again(tmp_path):
    """Issue 50: a SIGKILL during atomic_write left .metrics.jsonl.<pid>.tmp, which a resume kept for ever. A run's
    start removes the temp files whose writer is gone, and keeps a live writer's (here: this process's)."""
    import subprocess

    from machinery.checkpoint import prepare_out_dir

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stray = tmp_path / f".metrics.jsonl.{int(gone.stdout)}.tmp"
    live = tmp_path / f".metrics.jsonl.{os.getpid()}.tmp"
    other = tmp_path / ".notes.tmp"  # not an atomic_write name: not ours to remove
    for f in (stray, live, other):
        f.write_text("{")
    prepare_out_dir(tmp_path, False, {"lr": 1e-6})
    assert not stray.exists() and live.exists() and other.exists()
    assert (tmp_path / "args.json").is_file()
