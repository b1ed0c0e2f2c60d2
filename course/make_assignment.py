"""Write a student copy of this repository for the course (docs/course.md): the bodies of the chosen exercises'
functions are replaced by `raise NotImplementedError`, their signatures and docstrings kept (they give the shapes, the
equation and the source). Functions are found by name with the `ast` module, so our code carries no markers.

    python course/make_assignment.py --out DIR                       # every exercise
    python course/make_assignment.py --out DIR --exercises advantages kl
    python course/make_assignment.py --out DIR --hold-back tests/test_exercises.py

The copy holds the tracked files (`git ls-files`; without git: the tree less .git, data, runs and caches), so it has
no data, runs or virtual env, and never the paths in INSTRUCTOR_ONLY (the planted wrong answers, the snapshots and
their generator, the kit's tests, course/). `--hold-back PATH ...` leaves more out (e.g. the graded tests: grade.py
runs its own). A copy in which a line of a blanked body appears is refused (`solution_lines`, `leaks`). Grade a copy
with `python course/grade.py DIR` from this (the solution) repository; the ast machinery here (`find`, `blank`,
`splice`) is also what grade.py uses to put the student's function bodies into our modules.
"""

import argparse
import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# exercise -> points, the paper's place, the functions the student writes (file, name or Class.method), and the other
# exercises whose functions those call ("uses": the grader runs our reference of them)
EXERCISES = {
    "advantages": {"points": 15, "paper": "Eq. 1: group-normalised advantage A_i",
                   "functions": [("grpo.py", "group_advantages")]},
    "clipped": {"points": 20, "paper": "Eq. 1: clipped surrogate, token-mean and seq-mean-token-mean aggregation",
                "uses": ["kl"], "functions": [("grpo.py", "ppo_ratio"), ("grpo.py", "_token_mean"),
                                              ("grpo.py", "_seq_mean_token_mean"), ("grpo.py", "grpo_loss")]},
    "kl": {"points": 10, "paper": "App. B.2.1: KL to the reference, k3 estimator", "functions": [("grpo.py", "kl_k3")]},
    "gate": {"points": 15, "paper": "Eq. 4: actions and the action gate",
             "functions": [("llds.py", "action_segments"), ("llds.py", "_gate_action")]},
    "llds": {"points": 15, "paper": "Sec. 5.5, Eqs. 4 and 6: the LLDS loss, Y_pre and its normalisation",
             "uses": ["gate"], "functions": [("llds.py", "llds_loss")]},
    "cut_turn": {"points": 10, "paper": "Sec. 3: a turn cut at </search> by token index, loss_mask",
                 "functions": [("rollout.py", "cut_turn"), ("rollout.py", "Episode.append")]},
    "em": {"points": 10, "paper": "Sec. 3: the exact-match reward and its normalisation",
           "functions": [("rollout.py", "normalize_answer"), ("rollout.py", "em_check")]},
    "alarm": {"points": 5, "paper": "Sec. 5.1: the three phases of the death spiral, the LLD alarm",
              "functions": [("llds.py", "lld_alarm")]},
}
SKIP = {".git", "data", "runs", "__pycache__", ".venv", ".pytest_cache"}
# never in a student copy: the planted wrong answers (our functions with one edit each), the snapshots (our outputs)
# and their generator, the kit's own tests, and the kit itself (course/: this file, the grader and its plugin)
INSTRUCTOR_ONLY = ["tests/course", "tests/snapshots", "tests/make_snapshots.py", "tests/test_course.py",
                   "tests/test_grader.py", "course"]


def find(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    """The def of `name` ("f" at module level or "Class.method") in a parsed module, or None."""
    scope, node = tree.body, None
    for part in name.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    return node if isinstance(node, ast.FunctionDef) else None


def _has_docstring(node: ast.FunctionDef) -> bool:
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def blank(source: str, names: list[str], exercise: str) -> str:
    """`source` with the body of each function in `names` replaced by `raise NotImplementedError(...)`; the def lines
    and the docstring stay. Raises KeyError naming a function that `source` does not define."""
    tree, lines = ast.parse(source), source.splitlines(keepends=True)
    nodes = []
    for name in names:
        node = find(tree, name)
        if node is None:
            raise KeyError(f"no function {name} to blank")
        nodes.append((name, node))
    for name, node in sorted(nodes, key=lambda x: -x[1].lineno):  # bottom up: earlier line numbers stay valid
        body = node.body[1:] if _has_docstring(node) else node.body
        start = body[0].lineno - 1 if body else node.body[0].end_lineno  # first line of code after the docstring
        indent = " " * node.body[0].col_offset
        stub = f'{indent}raise NotImplementedError("exercise {exercise}: write {name} (docs/course.md)")\n'
        lines[start:node.end_lineno] = [stub]
    return "".join(lines)


def is_blank(source: str, name: str) -> bool:
    """True if `name` is defined in `source` and its code is one `raise NotImplementedError` (a student copy)."""
    node = find(ast.parse(source), name)
    body = node.body[1:] if node is not None and _has_docstring(node) else (node.body if node else [])
    return len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0])


def splice(source: str, name: str, function_source: str) -> str:
    """`source` with the def of `name` (decorators included) replaced by `function_source` (one def, any indent),
    re-indented to its place. A module-level function missing from `source` is appended; a missing method raises
    KeyError."""
    node = find(ast.parse(source), name)
    new = textwrap.dedent(function_source).strip("\n") + "\n"
    if node is None:
        if "." in name:
            raise KeyError(f"no method {name} to replace")
        return source.rstrip("\n") + "\n\n\n" + new
    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    lines = source.splitlines(keepends=True)
    lines[first:node.end_lineno] = [textwrap.indent(new, " " * node.col_offset)]
    return "".join(lines)


def function_source(source: str, name: str) -> str:
    """The text of the def of `name` in `source` (decorators included), dedented. Raises KeyError if absent."""
    node = find(ast.parse(source), name)
    if node is None:
        raise KeyError(f"no function {name}")
    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    return textwrap.dedent("".join(source.splitlines(keepends=True)[first:node.end_lineno]))


def solution_lines(root: Path, exercises: list[str]) -> set[str]:
    """The non-trivial lines (stripped, 16 characters or more) of the bodies our reference gives the functions of
    `exercises`, docstrings left out: none of them may appear in a student copy. A line that our top-level modules
    also hold outside those bodies (e.g. `mask = loss_mask.float()` in another loss) is an idiom the copy gives away
    anyway, not the solution, and is left out."""
    lines, given = set(), set()
    for ex in exercises:
        for file, name in EXERCISES[ex]["functions"]:
            source = (root / file).read_text(encoding="utf-8")
            node = find(ast.parse(source), name)
            body = node.body[1:] if _has_docstring(node) else node.body
            text = source.splitlines()[body[0].lineno - 1:node.end_lineno] if body else []
            lines |= {line.strip() for line in text if len(line.strip()) >= 16}
    for path in root.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        names = [n for spec in EXERCISES.values() for f, n in spec["functions"] if f == path.name]
        given |= {line.strip() for line in blank(text, names, "-").splitlines()}
    return lines - given


def leaks(copy: Path, lines: set[str]) -> list[str]:
    """'path:line: text' for each line of a text file in `copy` that is one of `lines` (stripped)."""
    found = []
    for path in sorted(p for p in copy.rglob("*") if p.is_file()):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip() in lines:
                found.append(f"{path.relative_to(copy)}:{i}: {line.strip()}")
    return found


def tracked_files(root: Path) -> list[str]:
    """Paths (relative, '/'-separated) of the files to copy: `git ls-files` if root is a git checkout, else a walk."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=60)
        return [p for p in out.stdout.decode().split("\0") if p and (root / p).is_file()]
    except (OSError, subprocess.SubprocessError):
        return [str(p.relative_to(root)).replace("\\", "/") for p in sorted(root.rglob("*"))
                if p.is_file() and not SKIP & set(p.relative_to(root).parts)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="folder to write the student copy into (new or empty)")
    ap.add_argument("--exercises", nargs="+", default=list(EXERCISES), metavar="NAME",
                    help="exercises to blank (default: all): " + " ".join(EXERCISES))
    ap.add_argument("--hold-back", nargs="*", default=[], metavar="PATH", help="files or folders to leave out")
    args = ap.parse_args(argv)
    unknown = [e for e in args.exercises if e not in EXERCISES]
    if unknown:
        print(f"error: unknown exercise {unknown[0]!r}; choose from {' '.join(EXERCISES)}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"error: --out {args.out}: exists and is not an empty folder", file=sys.stderr)
        return 2
    if out == ROOT or ROOT in out.parents:
        print(f"error: --out {args.out}: inside this repository; choose a folder outside it", file=sys.stderr)
        return 2
    held = [h.strip("/") for h in args.hold_back] + INSTRUCTOR_ONLY
    files = [f for f in tracked_files(ROOT) if not any(f == h or f.startswith(h + "/") for h in held)]
    for f in files:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, out / f)
    print(f"copied {len(files)} files to {out} (held back: {' '.join(held)})")
    by_file: dict[str, list[tuple[str, str]]] = {}
    for ex in args.exercises:
        for file, name in EXERCISES[ex]["functions"]:
            by_file.setdefault(file, []).append((ex, name))
    for file, todo in by_file.items():
        text = (out / file).read_text(encoding="utf-8")
        for ex, name in todo:
            text = blank(text, [name], ex)
        (out / file).write_text(text, encoding="utf-8")
        print(f"  {file}: blanked {', '.join(name for _, name in todo)}")
    leaked = leaks(out, solution_lines(ROOT, args.exercises))
    if leaked:  # a self-check: a blanked body quoted elsewhere (a doc, a test) would hand the student the solution
        print(f"error: {len(leaked)} lines of the blanked bodies appear in the copy:\n  " + "\n  ".join(leaked[:20]),
              file=sys.stderr)
        return 1
    total = sum(EXERCISES[e]["points"] for e in args.exercises)
    print(f"{len(args.exercises)} exercises, {total} points; handout: docs/course.md; "
          f"grade from this repository with: python course/grade.py {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
