"""A run's files on disk, written so that a kill, a crash or a full disk never loses a resumable
checkpoint.

Every checkpoint is a folder OUT_DIR/checkpoints/step_NNNNNN/: a plain Hugging Face model folder
(evaluate.py and train.py --model load it as it is) plus train.py's trainer_state.pt, and COMPLETE,
written last, which lists every other file with its size in bytes. A folder is a checkpoint only
when COMPLETE is there and every file it lists has exactly that size; anything else is ignored. A
save goes:

    1. write every file into checkpoints/step_N.tmp/ and fsync it
                                                 (a kill here leaves a .tmp: never read)
    2. write COMPLETE (names and sizes) and fsync it
    3. rename step_N.tmp -> step_N, fsync checkpoints/
                                                 (atomic: step_N is whole or absent)
    4. rename the checkpoints beyond the newest `keep` to .trash, then delete them
                                                 (a half-deleted one is never read)

so at every instant the previous checkpoint is complete; the newest complete one is what --resume
finds. A failed save (no space left, ...) removes its .tmp and raises OSError. save_checkpoint /
restore hold the weights, the optimizer state and every rank's RNG states, so a resumed run goes on
exactly as the uninterrupted one (under FSDP both are collectives). check_out_dir and stop_requests
keep the run folder's rules (no silent reuse; Ctrl-C stops after a step's checkpoint).

    python -m machinery.checkpoint RUN_DIR   # RUN_DIR's checkpoints, and the one --resume would use
"""

import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

STEP_RE = re.compile(r"^step_(\d+)$")
MARKER = "COMPLETE"


def atomic_write(path, text: str):
    """Write `text` to `path` through a temp file in the same folder, fsync'd and then renamed over
    it: a kill or a full disk leaves either the old file or the new one, never half of one. Raises
    OSError (e.g. ENOSPC), after removing the temp file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_dir(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # makes a rename inside the folder durable
    finally:
        os.close(fd)


def step_dir(out_dir, step: int) -> Path:
    """OUT_DIR/checkpoints/step_NNNNNN (zero-padded, so names sort by step)."""
    return Path(out_dir) / "checkpoints" / f"step_{step:06d}"


def verify(folder) -> str | None:
    """None if `folder` is a complete checkpoint, else why not (one line): COMPLETE missing or
    unreadable, a listed file missing or of another size than recorded (truncated, or a partial
    copy)."""
    folder = Path(folder)
    try:
        files = json.loads((folder / MARKER).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return f"no {MARKER} marker (the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable {MARKER} marker ({err})"
    for name, size in files.items():
        f = folder / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return (f"{name} has {f.stat().st_size} bytes, {size} were written (truncated or a "
                    "partial copy)")
    return None


def enclosing_checkpoint(path) -> Path | None:
    """The checkpoints/step_N folder `path` is, or lies inside (the next save of its run may delete
    it), else None."""
    for p in (Path(path).resolve(), *Path(path).resolve().parents):
        if STEP_RE.match(p.name) and p.parent.name == "checkpoints":
            return p
    return None


def folder_problem(path) -> str | None:
    """None if `path` is a folder we may write into, or one that mkdir -p could make; else why not,
    in a few words (the path or a parent of it is a file, or the nearest existing folder is not
    writable). Writes nothing."""
    for p in (Path(path), *Path(path).parents):
        if p.exists():
            if not p.is_dir():
                return f"{p} is a file, not a folder"
            return None if os.access(p, os.W_OK | os.X_OK) else f"{p} is not writable"
    return None


def write_problem(folder: Path, probe_bytes: int = 1 << 20) -> str | None:
    """None if files can be written in `folder` now, else why not, in a few words: folder_problem's
    (a file in the way, not writable), or what writing, syncing and deleting a `probe_bytes` file
    there raised (a read-only file system, no space left on the device). Folders it had to make for
    that are removed again."""
    if problem := folder_problem(folder):
        return problem
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    probe = folder / f".write_probe.{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(bytes(probe_bytes))
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        return err.strerror or str(err)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()
    return None


def checkpoints(out_dir) -> list[tuple[int, Path]]:
    """(step, folder) of every step_N folder under OUT_DIR/checkpoints, complete or not, oldest
    first."""
    root = Path(out_dir) / "checkpoints"
    found = [
        (int(m.group(1)), p)
        for p in root.glob("step_*")
        if p.is_dir() and (m := STEP_RE.match(p.name))
    ]
    return sorted(found)


def latest(out_dir, warn=print) -> Path | None:
    """The newest complete checkpoint of a run, or None if it has none. Newer incomplete folders are
    skipped with one warning line each (through `warn`), naming why."""
    for step, folder in reversed(checkpoints(out_dir)):
        problem = verify(folder)
        if problem is None:
            return folder
        warn(f"warning: skipping {folder}: {problem}")
    return None


def resolve(path, warn=print) -> Path | None:
    """The checkpoint --resume PATH means: PATH itself if it is a checkpoint folder, else the newest
    complete one in the run folder PATH, or None (with a warning) if that run saved none yet: it
    starts over, having lost nothing. Raises FileNotFoundError if PATH does not exist, ValueError if
    it names an incomplete checkpoint folder or if all of the run's checkpoint folders are
    incomplete (a partial copy: nothing is deleted then)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"--resume {path}: no such run folder")
    if (path / MARKER).exists() or STEP_RE.match(path.name):
        problem = verify(path)
        if problem:
            raise ValueError(f"--resume {path}: not a complete checkpoint: {problem}")
        return path
    found = latest(path, warn)
    # damaged ones only: starting over would delete what may be repairable
    if found is None and checkpoints(path):
        step, folder = checkpoints(path)[-1]
        raise ValueError(f"--resume {path}: no complete checkpoint; the newest, {folder.name}: "
                         f"{verify(folder)}. "
                         "Repair or remove it, or start afresh with --overwrite")
    if found is None:
        warn(f"warning: --resume {path}: no checkpoint saved yet; starting from step 1")
    return found


def clean(out_dir):
    """Remove what interrupted saves and deletions left behind (checkpoints/*.tmp and *.trash
    folders)."""
    for pattern in ("*.tmp", "*.trash"):
        for p in (Path(out_dir) / "checkpoints").glob(pattern):
            shutil.rmtree(p, ignore_errors=True)


def _discard(folder: Path):
    """Rename `folder` to a unique *.trash name (from then on it is no checkpoint), then delete
    it."""
    trash = folder.with_name(f"{folder.name}.{time.time_ns()}.trash")
    os.replace(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)  # what a kill leaves of it, clean() removes


def save(out_dir, step: int, write, keep: int = 1) -> Path:
    """Save checkpoint `step` of the run in OUT_DIR: `write(folder)` puts the files into a fresh
    folder, then steps 2-4 of the module docstring make it the newest checkpoint and keep only the
    `keep` (>= 1) newest complete ones.

    Returns the checkpoint folder. Raises OSError if writing fails (a full disk, whatever `write`
    raised): the partial folder is removed and every earlier checkpoint is untouched.
    """
    final = step_dir(out_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    clean(out_dir)
    tmp = final.with_name(final.name + ".tmp")
    try:
        tmp.mkdir()
        write(tmp)
        files = {}
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())  # the data is on disk before the marker says it is
                files[str(f.relative_to(tmp))] = f.stat().st_size
        atomic_write(tmp / MARKER, json.dumps({"step": step, "files": files}, indent=1))
        # a damaged folder of this step (resume skipped it): older complete ones still exist
        if final.exists():
            _discard(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    # a full disk shows as OSError, or as RuntimeError from torch.save's zip writer
    except Exception as err:
        # give the space back; earlier checkpoints are untouched
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(final.parent).free / 2**20
        raise OSError(f"could not save checkpoint {final} ({type(err).__name__}: {err}; {free:.0f} "
                      f"MiB free there); "
                      "the earlier checkpoints are untouched") from err
    older = [p for s, p in checkpoints(out_dir) if s < step]
    # the newest complete older ones
    keep_too = [p for p in reversed(older) if verify(p) is None][: keep - 1]
    for old in older:
        if old not in keep_too:
            _discard(old)
    return final


# --------------------------------------------------------------------------------------------------
# A training run's checkpoint: the model folder and trainer_state.pt, saved and put back on every
# rank


def save_checkpoint(model, tokenizer, optimizer, out_dir: Path, step: int, state: dict,
                    keep: int) -> Path | None:
    """Save checkpoint `step` as OUT_DIR/checkpoints/step_N (save: a kill or a full disk at any
    point leaves the previous one complete): the model as save_pretrained writes it (evaluate.py and
    --model read the folder as it is), and trainer_state.pt = `state` + the optimizer state + every
    rank's RNG state, for an exact --resume. Under FSDP every rank joins the gathers (full state
    dicts) and rank 0 writes. Returns the folder (None on the other ranks). Raises OSError when the
    disk is full or not writable, the earlier checkpoints untouched."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=full)
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
           torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    # every rank samples its own rollouts
    rngs = [rng] * (dist.get_world_size() if dist.is_initialized() else 1)
    if dist.is_initialized():
        dist.all_gather_object(rngs, rng)
    state = {**state, "step": step,
             "optimizer": get_optimizer_state_dict(model, optimizer, options=full), "rng": rngs}
    if dist.is_initialized() and dist.get_rank() != 0:
        return None

    def write(folder: Path):
        model.save_pretrained(folder, state_dict=weights)
        tokenizer.save_pretrained(folder)
        torch.save(state, folder / "trainer_state.pt")

    return save(out_dir, step, write, keep)


def restore(model, optimizer, scheduler, state: dict):
    """Put a trainer_state (load_trainer_state) back: optimizer (sharded again under FSDP), lr
    scheduler, and this rank's RNG states, so the resumed run samples and updates exactly as the
    uninterrupted one. Raises SystemExit if the checkpoint was saved by another number of ranks
    (each rank's RNG state is its own)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    world = dist.get_world_size() if dist.is_initialized() else 1
    if len(state["rng"]) != world:
        raise SystemExit(f"error: the checkpoint was saved by {len(state['rng'])} ranks; resume "
                         f"with the same number")
    set_optimizer_state_dict(model, optimizer, state["optimizer"],
                             options=StateDictOptions(full_state_dict=True))
    scheduler.load_state_dict(state["scheduler"])
    rng = state["rng"][dist.get_rank() if dist.is_initialized() else 0]
    random.setstate(rng[0]), np.random.set_state(rng[1]), torch.set_rng_state(rng[2])
    if torch.cuda.is_available() and rng[3]:
        torch.cuda.set_rng_state_all(rng[3])


# --------------------------------------------------------------------------------------------------
# The run folder: is it free, clear it, where a resume continues, stopping at a step's end


def load_trainer_state(ckpt: Path) -> dict:
    """trainer_state.pt of a checkpoint folder (see save_checkpoint). Raises ValueError naming the
    file if it cannot be read (a damaged file that kept its size; checkpoint.verify already caught
    truncation)."""
    try:
        return torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"{ckpt / 'trainer_state.pt'}: missing (a model folder, not a "
                                f"training checkpoint)")
    # what unpickling a damaged file raises: EOFError, UnpicklingError, RuntimeError, ...
    except Exception as err:
        raise ValueError(f"{ckpt / 'trainer_state.pt'}: unreadable ({type(err).__name__}: {err}); "
                         f"resume from an "
                         "earlier checkpoints/step_N folder") from None


def open_run(out_dir: Path, resume: str, overwrite: bool,
             warn=print) -> tuple[Path | None, dict | None, bool]:
    """Where a train.py run starts: (the checkpoint to resume or None, its trainer state or None,
    whether out_dir must be cleared first), after check_out_dir. Raises ValueError / OSError with
    one line for anything that does not fit."""
    ckpt = resolve(resume, warn=warn) if resume else None
    state = load_trainer_state(ckpt) if ckpt else None
    return ckpt, state, check_out_dir(out_dir, resume, ckpt, state["step"] if state else 0,
                                      overwrite)


def check_out_dir(out_dir: Path, resume: str, ckpt: Path | None, step: int,
                  overwrite: bool) -> bool:
    """Whether --out-dir may be used: raises ValueError (one line) for an out-dir that holds a run
    (metrics.jsonl or checkpoints/), unless --resume continues that run from its newest checkpoint
    or --overwrite asks to start afresh. Returns True when the run files in it are to be deleted
    first: --overwrite, or --resume of a run that saved no complete checkpoint yet (it starts over,
    and its metrics would not match)."""
    held = [p.name for p in (out_dir / "metrics.jsonl", out_dir / "checkpoints") if p.exists()]
    inside = ckpt is not None and ckpt.resolve().is_relative_to(out_dir.resolve())
    if overwrite and inside:
        raise ValueError(f"--overwrite would delete the checkpoint --resume {ckpt} continues from")
    if not held:
        return False
    if overwrite or (resume and ckpt is None and Path(resume).resolve() == out_dir.resolve()):
        return True
    if ckpt is None:
        raise ValueError(f"--out-dir {out_dir} holds a run ({', '.join(held)}): continue it with "
                         f"--resume {out_dir}, "
                         "or pass --overwrite to start afresh (deletes its metrics, rollouts and "
                         "checkpoints)")
    if not inside:
        raise ValueError(f"--out-dir {out_dir} holds another run ({', '.join(held)}): continuing "
                         f"{ckpt} there would "
                         "overwrite it; choose an empty --out-dir (or --overwrite)")
    newer = [s for s, p in checkpoints(out_dir) if s > step and verify(p) is None]
    if newer:
        raise ValueError(f"--resume {ckpt}: {out_dir} has a newer checkpoint (step {newer[-1]}); "
                         f"continue from it "
                         f"(--resume {out_dir}) or write this branch to another --out-dir")
    return False


def prepare_out_dir(out_dir: Path, clear: bool, args: dict):
    """Create --out-dir, delete the run files in it if `clear` (check_out_dir), and write `args` as
    args.json. The temp files of atomic_write that a killed process left (.metrics.jsonl.<pid>.tmp,
    its pid gone) are removed."""
    for tmp in out_dir.glob(".*.tmp"):
        found = re.fullmatch(r"\..+\.(\d+)\.tmp", tmp.name)
        if found and not pid_alive(int(found[1])):
            tmp.unlink(missing_ok=True)
    if clear:
        for f in [out_dir / "metrics.jsonl", *out_dir.glob("rollouts_step*.jsonl")]:
            f.unlink(missing_ok=True)
        shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "args.json", json.dumps(args, indent=2))


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0: nothing is sent; a process of another user
    counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def resume_note(out_dir: Path, rerun: str = "") -> str:
    """One sentence: where a rerun with --resume continues from. rerun: the command that continues
    the run when it is not train.py's own with --resume (spiral.py: "the same spiral.py
    command")."""
    found = latest(out_dir, warn=lambda _: None)
    if not found:
        return "No checkpoint was saved yet."
    return f"Continue with {rerun}: it resumes from {found}." if rerun else \
        f"--resume {out_dir} continues from {found}."


@contextlib.contextmanager
def io_errors_stop_the_run(out_dir: Path, rerun: str = ""):
    """An OSError during the run (disk full or read-only, a retrieval server that stopped answering)
    ends it with one line saying what failed and where a rerun continues from (resume_note), not a
    traceback. Nothing already saved is touched."""
    try:
        yield
    except OSError as err:
        raise SystemExit(f"error: {err}. {resume_note(out_dir, rerun)}") from None


@contextlib.contextmanager
def stop_requests(say=print, distributed: bool = False):
    """While active, SIGINT (Ctrl-C) and SIGTERM do not kill the run: they are recorded in the
    yielded list, and the training loop saves and stops at the end of the step in progress. A second
    Ctrl-C in one process stops at once (KeyboardInterrupt, no save); when `distributed` (torchrun,
    whose agent forwards the signal to the ranks again) repeats are ignored. `say` prints the
    one-line notice. Handlers are restored on exit. Outside the main thread (signals cannot be
    caught there) it yields a list that stays empty."""
    received = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def on_signal(signum, _frame):
        if received and signum == signal.SIGINT and not distributed:
            raise KeyboardInterrupt
        if not received:
            say(f"{signal.Signals(signum).name}: stopping after this step and its checkpoint "
                f"(Ctrl-C again: stop at "
                "once, without saving)")
        received.append(signum)

    before = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    run = Path(sys.argv[1])
    if not run.is_dir():
        raise SystemExit(f"error: {run}: no such run "
                         f"folder" + (" (a file)" if run.exists() else ""))
    for step, folder in checkpoints(run):
        print(f"step {step:>6}  {folder}  {verify(folder) or 'complete'}")
    chosen = latest(run, warn=lambda _: None)
    print(f"--resume {run} continues from: {chosen or 'nothing (no complete checkpoint)'}")
