"""Where evaluate.py writes, checked before anything is read or written: --out (its JSON), the
records .jsonl beside it and their .partial copy. Never an input, never inside a checkpoint folder
(its run's next save may delete it), an earlier evaluation only with --overwrite, and the records
of a stopped evaluation kept until a new one is complete."""

import json
from pathlib import Path

from machinery.checkpoint import STEP_RE, enclosing_checkpoint, folder_problem


def default_out(model: str) -> Path:
    """--out when unset: eval.json in the model folder; for a checkpoints/step_N folder (the run's
    next save may delete it) eval_step_N.json in its run folder; ./eval.json for a hub id or a .gguf
    file."""
    path = Path(model)
    if not path.is_dir():
        return Path("eval.json")
    ckpt = enclosing_checkpoint(path)
    return (
        ckpt.parent.parent / f"eval_step_{int(STEP_RE.match(ckpt.name)[1])}.json"
        if ckpt
        else path / "eval.json"
    )


def earlier_evaluation(path: Path) -> bool:
    """Whether the existing file `path` is one evaluate.py wrote: an --out JSON (it opens with its
    "model" key) or a records .jsonl (its first line a record with "question" and "em"; empty: a run
    stopped before its first batch)."""
    try:
        with open(path, "rb") as f:
            start = f.read(12)
            f.seek(0)
            # a longer first line is no record of ours (json.loads fails on its cut)
            head = f.readline(1 << 20)
        if start == b'{\n "model": ':  # json.dumps(..., indent=1) of main's dict
            return True
        if not head.strip():
            return True
        record = json.loads(head)
        return isinstance(record, dict) and {"question", "em"} <= set(record)
    except (OSError, ValueError):
        return False


def output_problem(out: Path, records: Path, partial: Path, args) -> str | None:
    """Why evaluate.py must not write `out`, its `records` .jsonl or their `partial` copy (one
    line), else None; reads and writes nothing else. Never over an input (a --data or --corpus file,
    --model or a file of its folder that is not an earlier evaluation), never inside a
    checkpoints/step_N folder, never over any other file; an earlier evaluation only with
    --overwrite; and the folder must be writable."""
    inputs = {}
    for flag, paths in (("--data", args.data), ("--corpus", [args.corpus]),
                        ("--model", [args.model])):
        for name in paths:
            files = [Path(name)] if Path(name).is_file() else []
            # its weights, tokenizer, config, a run's args.json, ...
            if flag == "--model" and Path(name).is_dir():
                files = [
                    f for f in Path(name).iterdir() if f.is_file() and not earlier_evaluation(f)
                ]
            inputs |= {f.resolve(): f"the {flag} file {f}" for f in files}
    earlier, stopped = [], [p for p in (partial, writing_to(partial)) if p.exists()]
    if len(stopped) == 2:  # (each was checked below: records of ours)
        return (f"--out {out}: two stopped evaluations left their records "
                f"({', '.join(map(str, stopped))}); keep the "
                f"one you need as {partial} and delete the other")
    for path in (out, records, partial, writing_to(partial)):
        name = f"--out {out}" + ("" if path == out else f": its records file {path}")
        if path.resolve() in inputs:
            return (f"{name} is {inputs[path.resolve()]}: evaluate.py never writes over its "
                    "inputs; choose another --out")
        if ckpt := enclosing_checkpoint(path):
            return (f"--out {out} lies inside the checkpoint folder {ckpt}, which its run's next "
                    f"save may delete; "
                    f"write it to the run folder (the default: {default_out(str(ckpt))})")
        if path.is_dir():
            return f"{name} is a folder; --out names the JSON file to write"
        if path.exists():
            if not earlier_evaluation(path):
                return (f"{name} exists and is no evaluation evaluate.py wrote: refusing to "
                        "replace it; choose another --out")
            earlier.append(str(path))
    if earlier and not args.overwrite:
        return (f"--out {out}: an earlier evaluation is there ({', '.join(earlier)}): pass "
                f"--overwrite to replace it "
                "once the new one is complete, or choose another --out")
    problem = folder_problem(out.parent)
    return f"--out {out}: cannot write there ({problem})" if problem else None


def writing_to(partial: Path) -> Path:
    """Where a new evaluation writes its records as they come: `partial`, or beside it when an
    earlier evaluation that stopped left its records there (kept until the new one is complete:
    --overwrite never loses them before)."""
    return partial.with_name(partial.name + ".new") if partial.exists() else partial
