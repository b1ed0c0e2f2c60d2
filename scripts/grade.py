"""Grade a student copy of the repository (scripts/make_assignment.py) exercise by exercise, and print a points table.

    python scripts/grade.py DIR                          # every exercise
    python scripts/grade.py DIR --exercises kl gate      # some of them

Each exercise runs in its own pytest process (forked from a server that imported torch once; POSIX), with a time limit,
over a fresh temporary tree: this repository's modules, except that a file holding the exercise's functions is the
student's file with every *other* exercise's functions put back from this repository (our reference). The tests are this
repository's tests/test_exercises.py (tagged `@pytest.mark.exercise(name)`) with its snapshots, never the student's. So
an exercise's score never depends on another exercise being solved, and a crash or a hang in one stops only that one.

Score: the exercise's points x the share of its tests that pass. The table gives, for the first failing test, its
name and the first line of its message (the messages name the pitfall). Exit 0 only if every exercise graded has
full points; 1 otherwise; 2 on bad input.
"""

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_assignment import EXERCISES, ROOT, function_source, is_blank, splice  # noqa: E402

TEST_FILES = ["pytest.ini", "tests/conftest.py", "tests/tiny.py", "tests/test_exercises.py", "tests/snapshots"]


def build_tree(student: Path, exercise: str, dest: Path) -> str:
    """Write into dest the tree that grades `exercise`: our modules and tests, the student's files for the modules
    holding the exercise's functions, with the other exercises' functions in those files restored from ours.
    Returns "" or, if a student's file does not parse, what is wrong with it (one line)."""
    for src in ROOT.glob("*.py"):
        shutil.copy2(src, dest / src.name)
    for rel in TEST_FILES:
        src = ROOT / rel
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest / rel) if src.is_dir() else shutil.copy2(src, dest / rel)
    for file in sorted({file for file, _ in EXERCISES[exercise]["functions"]}):
        text = (student / file).read_text(encoding="utf-8")
        ours = (ROOT / file).read_text(encoding="utf-8")
        try:
            for other, spec in EXERCISES.items():
                for f, name in spec["functions"]:
                    if other != exercise and f == file:
                        text = splice(text, name, function_source(ours, name))
        except SyntaxError as err:
            return f"{file} does not parse: {err.msg} (line {err.lineno})"
        (dest / file).write_text(text, encoding="utf-8")
    return ""


# Each exercise's pytest runs in a process forked from a server that imported torch, pytest and transformers once
# (2-3 s a process on 2 cores, most of an exercise's time); none of our modules is imported there, so every exercise
# still imports the tree's own files, and a crash or a hang ends only its own process.
FORK = multiprocessing.get_context("forkserver")
FORK.set_forkserver_preload(["torch", "pytest", "transformers"])


def _pytest(tree: str, args: list[str], log: str):
    """In the forked process: run pytest in `tree`, its output to `log`."""
    import pytest

    for name in [p.stem for p in Path(tree).glob("*.py")] + ["conftest", "tiny", "test_exercises"]:
        sys.modules.pop(name, None)  # never one imported before the fork: the tree's own files are graded
    os.chdir(tree)
    sys.path.insert(0, tree)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1), os.dup2(fd, 2)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # no third-party pytest plugins: the same run everywhere
    os._exit(pytest.main(args))


def run_exercise(student: Path, exercise: str, timeout: float = 120.0) -> dict:
    """Grade one exercise; returns {exercise, passed, total, points, max, first_failure, failures, seconds}.
    failures: [(test id, first line of its message)] for every failing test. A script that imports grade to call this
    must keep its own code under `if __name__ == "__main__":` (the fork server imports the caller's main file)."""
    t0 = time.time()
    row = {"exercise": exercise, "passed": 0, "total": 0, "points": 0.0, "max": EXERCISES[exercise]["points"],
           "first_failure": "", "failures": []}
    with tempfile.TemporaryDirectory(prefix=f"grade_{exercise}_") as tmp:
        tmp = Path(tmp)
        problem = build_tree(student, exercise, tmp)
        if problem:
            row.update(first_failure=problem, seconds=time.time() - t0)
            return row
        report, log = tmp / "report.xml", tmp / "pytest.log"
        args = ["-q", "-p", "no:cacheprovider", "tests/test_exercises.py", "--exercise", exercise,
                f"--junitxml={report}", "-o", "junit_family=xunit1"]
        proc = FORK.Process(target=_pytest, args=(str(tmp), args, str(log)))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            row.update(first_failure=f"timed out after {timeout:.0f} s (an endless loop?)", seconds=time.time() - t0)
            return row
        if not report.exists():
            tail = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            row.update(first_failure="pytest did not run: " + (tail[-1] if tail else f"exit {proc.exitcode}"),
                       seconds=time.time() - t0)
            return row
        cases = ET.parse(report).getroot().iter("testcase")
        for case in cases:
            row["total"] += 1
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is None and case.find("skipped") is None:
                row["passed"] += 1
            elif bad is not None:
                row["failures"].append((case.get("name"), _first_line(bad)))
    if row["total"] == 0:
        row["first_failure"] = "no test collected: does the student's file import?"
    else:
        row["points"] = round(row["max"] * row["passed"] / row["total"], 1)
    if row["failures"]:
        name, msg = row["failures"][0]
        row["first_failure"] = f"{name}: {msg}"
    row["seconds"] = time.time() - t0
    return row


def _first_line(element) -> str:
    """The first informative line of a junit failure: the assertion's own message when it has one."""
    text = (element.get("message") or element.text or "").strip()
    if text == "collection failure":  # e.g. an import error: the last "E   ..." line of the report says which
        said = [line[1:].strip() for line in (element.text or "").splitlines() if line.startswith("E ")]
        text = f"collection failure: {said[-1]}" if said else text
    text = text[len("AssertionError: "):] if text.startswith("AssertionError: ") else text
    line = text.splitlines()[0] if text else "(no message)"
    return line if len(line) <= 300 else line[:297] + "..."


def table(rows: list[dict]) -> str:
    """The points table, one row per exercise and a total."""
    out = [f"{'exercise':11s} {'tests':>7s} {'points':>11s}  first failure", "-" * 100]
    for r in rows:
        out.append(f"{r['exercise']:11s} {r['passed']:>3d}/{r['total']:<3d} {r['points']:>5.1f}/{r['max']:<5d}  "
                   f"{r['first_failure']}")
    got, most = sum(r["points"] for r in rows), sum(r["max"] for r in rows)
    out.append(f"{'total':11s} {'':7s} {got:>5.1f}/{most:<5d}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("dir", type=Path, help="the student's copy of the repository")
    ap.add_argument("--exercises", nargs="+", default=list(EXERCISES), metavar="NAME",
                    help="exercises to grade (default: all): " + " ".join(EXERCISES))
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds allowed to one exercise's tests")
    args = ap.parse_args(argv)
    if not 0 < args.timeout < float("inf"):  # 0 or less: every exercise would "time out" and score 0
        ap.error(f"--timeout must be a number of seconds > 0, got {args.timeout:g}")
    files = sorted({f for spec in EXERCISES.values() for f, _ in spec["functions"]})
    if not args.dir.is_dir() or not all((args.dir / f).is_file() for f in files):
        print(f"error: {args.dir}: not a copy of the repository (it needs {', '.join(files)})", file=sys.stderr)
        return 2
    unknown = [e for e in args.exercises if e not in EXERCISES]
    if unknown:
        print(f"error: unknown exercise {unknown[0]!r}; choose from {' '.join(EXERCISES)}", file=sys.stderr)
        return 2
    ours = {f: (ROOT / f).read_text(encoding="utf-8") for f in files}
    if any(is_blank(ours[f], n) for spec in EXERCISES.values() for f, n in spec["functions"]):
        print(f"error: {ROOT} is a student copy: grade with the solution repository's scripts/grade.py",
              file=sys.stderr)
        return 2
    rows, t0 = [], time.time()
    for ex in args.exercises:
        print(f"grading {ex} ...", flush=True)
        rows.append(run_exercise(args.dir.resolve(), ex, args.timeout))
    print(table(rows))
    print(f"graded {args.dir} in {time.time() - t0:.0f} s")
    return 0 if all(r["points"] == r["max"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
