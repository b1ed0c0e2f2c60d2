"""Grade a student copy of the repository (course/make_assignment.py) exercise by exercise, and print a points table.

    python course/grade.py DIR                          # every exercise
    python course/grade.py DIR --exercises kl gate      # some of them

Only what the student wrote is graded, and no student code runs where a verdict is made:

1. From the student's files (their own regular files only: a symbolic link or a special file scores 0; UTF-8, a
   byte-order mark accepted), the `ast` module takes the *bodies* of the exercise's functions (and of helper functions
   the student added); none of the student's module-level code runs, not even a def's decorators or defaults (the
   signature is ours). They go into copies of our modules in a fresh temporary tree, in which every other exercise's
   function is blank except those the exercise uses (`"uses"` in make_assignment.EXERCISES: our reference).
2. The *plan*: our tests run on our code in a tree of our own, and every call a test makes to an exercise function
   is written down with its inputs only (course/grade_plugin.py).
3. The *runner*, a separate `python` process with a clean environment whose working folder is the tree of step 1
   (no path to this repository, to the grader's scripts, to the tests or to the snapshots), makes the planned calls
   on the student's functions and records what each returned or raised (an exception: its type only). No test runs
   there and no expected value exists there; its output is not read. On Linux it runs in a sandbox (SANDBOX below)
   that sees only the system, Python and its tree, read-only, with limits.
4. The *judge*, another process with our code only, runs the same tests with the recorded results played back in
   place of the student's functions, against the full snapshots; its assertions give the verdicts and the messages,
   which carry no expected value.

Score: the exercise's points x the share of its tests that pass. The table gives, for the first failing test, its
name and the first line of its message (the messages name the pitfall), escaped, at most 300 characters, and quoting
at most 120 characters of any text the student's code returned. Exit 0 only if every exercise graded has
full points; 1 otherwise; 2 on bad input. Where the sandbox cannot run (it needs Linux user namespaces, `unshare`,
`setpriv` and `prlimit`), grade.py refuses to grade unless given --allow-unsandboxed, and then the runner is an
ordinary process of your user and the table says so: for code you trust only (or run this as a user that cannot read
the solution repository, or in a container).
"""

import argparse
import ast
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_assignment import EXERCISES, ROOT, blank, find, is_blank, splice  # noqa: E402

PLUGIN = Path(__file__).resolve().parent / "grade_plugin.py"
MODULES = sorted({file for spec in EXERCISES.values() for file, _ in spec["functions"]})  # grpo.py llds.py rollout.py
TEST_FILES = ["pytest.ini", "tests/conftest.py", "tests/tiny.py", "tests/test_exercises.py", "tests/make_snapshots.py"]
SNAPSHOTS = ["advantages", "clipped", "kl", "gate", "llds"]  # exercises with snapshot tests (tests/snapshots/)
MAX_RECORD = 50_000_000  # bytes of a runner's record read back


# ---------------------------------------------------------------------------------------------------------------------
# the student's functions, by ast


def _plain_value(node: ast.expr, known: set):
    """Raise ValueError unless `node` is a value whose evaluation runs no code of the student's: a literal, or a
    dotted name rooted in a name our module defines (`torch.float32`; the student's module-level code never runs)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    if isinstance(node, ast.Name):
        if node.id not in known:
            raise ValueError(f"a name our module does not define ({node.id})")
        return
    ast.literal_eval(node)


def _body_only(node: ast.FunctionDef, ours: ast.FunctionDef | None, known: set = frozenset()) -> ast.FunctionDef:
    """The student's def with nothing that runs when it is defined: our signature (or, for a helper, no decorators,
    no annotations, and defaults that are literals or our module's dotted names: `_plain_value`)."""
    node.decorator_list, node.returns = [], None
    if ours is not None:
        node.args = ours.args
        return node
    for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs + [node.args.vararg, node.args.kwarg]:
        if a is not None:
            a.annotation = None
    for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
        _plain_value(d, known)  # ValueError: it would run code
    return node


def _literal_assign(node: ast.stmt) -> ast.Assign | None:
    """NAME = a literal (one or more names), as an Assign; None for any other statement."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        try:
            ast.literal_eval(node.value)
        except ValueError:
            return None
        if all(isinstance(t, ast.Name) for t in targets):
            return ast.Assign(targets=targets, value=node.value, lineno=0)
    return None


def _helper(node: ast.stmt, known: set) -> str | None:
    """The source of a student's module-level helper for the runner: a function (`_body_only`), a constant (NAME = a
    literal), or a class of methods, literal attributes and a docstring with no bases, keywords or decorators; None
    for any other statement (not graded: it never runs). Raises ValueError for a default that would run code."""
    if isinstance(node, ast.FunctionDef):
        return ast.unparse(_body_only(node, None, known))
    if (assign := _literal_assign(node)) is not None:
        return ast.unparse(assign)
    if isinstance(node, ast.ClassDef) and not (node.bases or node.keywords or node.decorator_list):
        body = []
        for item in node.body:
            if isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant):
                body.append(item)  # the docstring
            elif isinstance(item, ast.FunctionDef):
                body.append(_body_only(item, None, known))
            elif (assign := _literal_assign(item)) is not None:
                body.append(assign)
            else:
                return None  # a class statement that would run code: not graded
        node.body = body or [ast.Pass()]
        return ast.unparse(node)
    return None


def student_functions(text: str, ours: str, names: list[str]) -> tuple[dict, list, str, list]:
    """From a student's file: ({name: source of the def}, [helper defs' sources], problem or "", notes), notes naming
    each top-level import and constant that is not taken (the runner never runs module-level code). Source that Python
    cannot parse, or whose nesting exhausts the parser's stack or memory (10,000 unary minus signs, a megabyte-long
    expression), is one problem line: "does not parse"."""
    try:
        return _student_functions(text, ours, names)
    except SyntaxError as err:
        return {}, [], f"does not parse: {err.msg}" + (f" (line {err.lineno})" if err.lineno else ""), []
    except (RecursionError, MemoryError, ValueError) as err:
        return {}, [], f"does not parse: {type(err).__name__} (nested too deep or too large for Python's parser)", []


def _student_functions(text: str, ours: str, names: list[str]) -> tuple[dict, list, str, list]:
    tree = ast.parse(text)
    ref = ast.parse(ours)
    found, helpers = {}, []
    for name in names:
        node = find(tree, name)
        if node is None or is_blank(text, name):
            continue
        found[name] = ast.unparse(_body_only(node, find(ref, name)))
    defined = {n.name for n in ref.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in ref.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    imports = [n for n in ref.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    known = defined | {(a.asname or a.name).split(".")[0] for n in imports for a in n.names}  # defaults may name them
    our_imports, notes = {ast.unparse(n) for n in imports}, []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and ast.unparse(node) not in our_imports:
            notes.append(f"line {node.lineno}: `{ast.unparse(node)[:60]}` is not taken (module-level code never runs: "
                         f"import inside the function)")
            continue
        names = {node.name} if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
            {t.id for t in (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)])
             if isinstance(t, ast.Name)}
        if not names or names & defined:
            continue  # ours (imports, our functions and constants) or not a definition
        try:
            source = _helper(node, known)
        except ValueError:
            return {}, [], f"helper {node.name}: a default value that is neither a literal nor one of the module's " \
                           "names", []
        if source:
            helpers.append(source)
        else:
            notes.append(f"line {node.lineno}: {', '.join(sorted(names))} is not taken (only functions, literal "
                         f"constants and plain classes are: module-level code never runs)")
    return found, helpers, "", notes


def read_student(path: Path) -> tuple[str, str]:
    """(the text of the student's file, "") or ("", what is wrong). Only the student's own regular file is read: not a
    symbolic link (a link to /proc/self/cwd/grpo.py would make this process read our reference), nor a FIFO or a
    device (O_NOFOLLOW | O_NONBLOCK, then fstat); UTF-8, a byte-order mark accepted (Python runs such a file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "", "not in the student's copy"
    except OSError:
        return "", "not a regular file (a symbolic link?): only the student's own files are graded"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return "", "not a regular file (a folder, FIFO or device): only the student's own files are graded"
        return f.read(2_000_000).decode("utf-8-sig", errors="replace"), ""


def build_runner_tree(student: Path, exercise: str, dest: Path, taken_notes: list | None = None) -> str:
    """The runner's tree for `exercise`: our modules with the student's functions of the exercise, ours of the
    exercises it uses, every other exercise function blank; our tests; snapshots without their expected values.
    Returns "" or, if a student's file is missing or does not parse, what is wrong (one line); appends to
    `taken_notes` a line for each top-level import or constant of the student's that is not taken."""
    taken_notes = [] if taken_notes is None else taken_notes
    spec = EXERCISES[exercise]
    keep = set(spec.get("uses", []))
    for file in MODULES:
        ours = (ROOT / file).read_text(encoding="utf-8")
        text = ours
        for other, other_spec in EXERCISES.items():
            names = [n for f, n in other_spec["functions"] if f == file]
            if names and other != exercise and other not in keep:
                text = blank(text, names, other)
        mine = [n for f, n in spec["functions"] if f == file]
        if mine:
            source, problem = read_student(student / file)
            if problem:
                return f"{file}: {problem}"
            found, helpers, problem, notes = student_functions(source, ours, mine)
            if problem:
                return f"{file} {problem}"
            taken_notes.extend(f"{file} {note}" for note in notes)
            text = blank(text, [n for n in mine if n not in found], exercise)
            for name, source in found.items():
                text = splice(text, name, source)
            for source in helpers:
                text = text.rstrip("\n") + "\n\n\n" + source + "\n"
        (dest / file).write_text(text, encoding="utf-8")
    (dest / "tests").mkdir()
    for rel in ("tests/tiny.py", "tests/_grading.py"):  # the tokenizer a planned call may take; the runner itself
        shutil.copy2(PLUGIN if rel.endswith("_grading.py") else ROOT / rel, dest / rel)
    return ""


def _copy_tests(dest: Path, snapshots):
    """Our tests, the grading plugin and the snapshots (with their expected values) into a tree of our code."""
    for rel in TEST_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    shutil.copy2(PLUGIN, dest / "tests" / "_grading.py")
    (dest / "tests" / "snapshots").mkdir()
    for name in snapshots:
        shutil.copy2(ROOT / "tests" / "snapshots" / f"{name}.json", dest / "tests" / "snapshots" / f"{name}.json")


# ---------------------------------------------------------------------------------------------------------------------
# the two processes


def _functions(exercises) -> list:
    return [[file.removesuffix(".py"), name] for ex in exercises for file, name in EXERCISES[ex]["functions"]]


# The runner's sandbox (Linux, util-linux's unshare, setpriv and prlimit): new mount, PID, network, UTS and IPC
# namespaces; a root of its own (a 16 MiB tmpfs, read-only once built) holding the system and Python and the tree at
# /tree, all read-only, every mount below them included (a bind is not read-only below its top: each submount is
# remounted read-only, or taken away where it cannot be), nothing else (not this repository, not the other trees, not
# the grader's processes, not the host's /etc: only the loader's and the time zone's files and a passwd naming the
# student); a fresh /proc whose /proc/sys is read-only; a /tmp of TMPSIZE; limits on its address space, CPU time, file
# size and processes (LIMITS); every capability dropped before Python starts, so it cannot remount anything writable;
# and every process it starts dies with it. Who the student's code is (ROOT_UNSHARE, USER_UNSHARE):
# * grade.py run as root (a container, a course VM): no user namespace; root builds the view, then setpriv drops to an
#   unprivileged uid and gid of the grader's choosing (a fresh one each run, in no group), so nothing the host's root
#   may do (write /proc/sys, read /etc/shadow, ignore RLIMIT_NPROC) is left to it;
# * as any other user: a user namespace mapping that user to uid 1000 inside; the host sees the grader's own uid.
# Symbolic links on the way to Python (a venv at /tmp/venv -> /data/venv) are recreated, and what they point to bound.
SANDBOX = r"""set -e
NEW=$1; TREE=$2; shift 2
mount -t tmpfs -o mode=755,size=16m tmpfs "$NEW"
mkdir -p "$NEW/tmp"; mount -t tmpfs -o "size=$TMPSIZE,mode=1777" tmpfs "$NEW/tmp"  # before the binds: a venv in /tmp
bind() {  # $1 at the same path in the new root, unless it is there already (inside an earlier bind)
    if [ -L "$1" ]; then
        mkdir -p "$NEW$(dirname "$1")"
        [ -e "$NEW$1" ] || [ -L "$NEW$1" ] || ln -s "$(readlink "$1")" "$NEW$1"
        bind "$(readlink -f "$1")"
    elif [ -d "$1" ] && [ ! -e "$NEW$1" ]; then mkdir -p "$NEW$1"; mount --rbind "$1" "$NEW$1"; fi
}
for p in /usr "$BASE" "$PREFIX" /bin /lib /lib64 /sbin; do bind "$p"; done
mkdir -p "$NEW/etc" "$NEW/tree" "$NEW/dev" "$NEW/proc" "$NEW/.old"
for f in ld.so.cache ld.so.conf localtime nsswitch.conf; do [ ! -e "/etc/$f" ] || cp -L "/etc/$f" "$NEW/etc/$f"; done
for d in ld.so.conf.d alternatives; do [ ! -d "/etc/$d" ] || cp -a "/etc/$d" "$NEW/etc/$d"; done
echo "student:x:$RUN_UID:$RUN_GID:student:/tmp:/bin/false" > "$NEW/etc/passwd"
echo "student:x:$RUN_GID:" > "$NEW/etc/group"
: > "$NEW/etc/fstab"  # umount run by a user that is not root (the user-namespace case) reads it, then unmounts
for d in null zero random urandom; do touch "$NEW/dev/$d"; mount --bind "/dev/$d" "$NEW/dev/$d"; done
mount --bind "$TREE" "$NEW/tree"
awk -v root="$NEW/" 'index($5, root) == 1 {print $5, $6}' /proc/self/mountinfo | sort -r | while read -r m opts; do
    case "$m" in "$NEW/dev/"*|"$NEW/tmp") continue;; esac  # /tmp stays writable, its binds do not
    keep=$(echo "$opts" | tr , '\n' | grep -E '^(nosuid|nodev|noexec)$' | tr '\n' , || true)
    mount -o "remount,bind,ro,${keep}" "$m" 2>/dev/null || umount -l "$m"
done
mount -t proc -o nosuid,nodev,noexec proc "$NEW/proc"
for p in sys sysrq-trigger; do
    [ ! -e "$NEW/proc/$p" ] || { mount --bind "$NEW/proc/$p" "$NEW/proc/$p"; mount -o remount,bind,ro "$NEW/proc/$p"; }
done
cd "$NEW"
pivot_root . .old
umount -l /.old
rmdir /.old
mount -o remount,bind,ro /
cd /tree
exec prlimit --as="$AS" --cpu="$CPU" --fsize="$FSIZE" --nproc="$NPROC" --core=0 -- \
    setpriv $DROP --inh-caps=-all --ambient-caps=-all --bounding-set=-all --no-new-privs "$@"
"""
LIMITS = {"AS": 4 << 30, "FSIZE": 64 << 20, "NPROC": 64, "TMPSIZE": "64m"}  # bytes, bytes, processes and threads
NAMESPACES = ["--mount", "--pid", "--fork", "--kill-child", "--net", "--uts", "--ipc", "--propagation", "private"]
ROOT_UNSHARE = ["unshare", *NAMESPACES]
USER_UNSHARE = ["unshare", "--map-user=1000", "--map-group=1000", "--keep-caps", *NAMESPACES]
FIRST_UID = 1_900_000_000  # as root, the student's uid is one of 100,000,000 from here: in no passwd, used by no one


def unshare() -> list[str]:
    """The unshare command for this grader's user (root: ROOT_UNSHARE; anyone else: USER_UNSHARE)."""
    return ROOT_UNSHARE if os.geteuid() == 0 else USER_UNSHARE


def student_ids() -> dict:
    """The environment that names who the student's code runs as: as root, a fresh unprivileged uid and gid and the
    setpriv flags that switch to them with no supplementary group; otherwise uid 1000 of the user namespace."""
    if os.geteuid() != 0:
        return {"RUN_UID": "1000", "RUN_GID": "1000", "DROP": ""}
    uid = str(FIRST_UID + secrets.randbelow(100_000_000))
    return {"RUN_UID": uid, "RUN_GID": uid, "DROP": f"--reuid={uid} --regid={uid} --clear-groups"}


def sandbox_works() -> bool:
    """Whether this machine can run the sandbox (checked once)."""
    if "ok" not in _SANDBOX_OK:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "tree").mkdir()
                (Path(tmp) / "root").mkdir()
                out = subprocess.run(unshare() + ["/bin/sh", "-c", SANDBOX, "sandbox", f"{tmp}/root", f"{tmp}/tree",
                                                sys.executable, "-c", "print('ok')"],
                                     capture_output=True, text=True, timeout=60, env=_base_env(60))
                _SANDBOX_OK["ok"] = out.returncode == 0 and out.stdout.strip() == "ok"
        except (OSError, subprocess.SubprocessError):
            _SANDBOX_OK["ok"] = False
    return _SANDBOX_OK["ok"]


_SANDBOX_OK: dict = {}


def _base_env(cpu_s: float) -> dict:
    return {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "BASE": sys.base_prefix, "PREFIX": sys.prefix,
            "CPU": str(max(1, int(cpu_s))), **{k: str(v) for k, v in LIMITS.items()}, **student_ids()}


def _spawn(tree: Path, args: list[str], config: dict, timeout: float, runner: bool) -> tuple[int | None, str]:
    """`python ARGS` in `tree` with grading.json = config, a clean environment, its own session (killed whole at
    the time limit), its output to a file beside the tree; the runner in the sandbox where there is one, its
    record written to an inherited file descriptor (config["record_fd"]; tree/record.jsonl here). Returns (exit code or
    None on timeout, its output's tail: shown to nobody but our own tests)."""
    marker = secrets.token_hex(8)
    sandboxed = runner and sandbox_works()
    where = Path("/tree") if sandboxed else tree
    scratch = Path("/tmp") if sandboxed else tree
    env = {"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch), "PYTHONPATH": str(where / "tests"),
           "PYTHONUTF8": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "GRADE_RUN": marker}
    # no -O for the runner: it finds no .opt-1.pyc files, so it compiled torch anew each time (twice the import's time)
    cmd = [sys.executable, *args]
    if sandboxed:
        (tree.parent / f"{tree.name}_root").mkdir()
        cmd = unshare() + ["/bin/sh", "-c", SANDBOX, "sandbox", str(tree.parent / f"{tree.name}_root"), str(tree)] + cmd
        env.update(_base_env(timeout), PATH="/usr/bin:/bin:/usr/sbin:/sbin")
    with open(tree / "record.jsonl", "ab") as record, open(tree.parent / f"{tree.name}.out", "w+b") as out:
        (tree / "grading.json").write_text(json.dumps({**config, "record_fd": record.fileno()}))
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                pass_fds=(record.fileno(),) if runner else (), start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        _kill_leftovers(proc, marker)
        out.seek(max(0, out.seek(0, os.SEEK_END) - 3000))
        tail = out.read().decode(errors="replace") if code is not None else ""
    return code, tail


def _pytest_args(exercises: list[str]) -> list[str]:
    return ["-m", "pytest", "-q", "-p", "_grading", "-p", "no:cacheprovider", "tests/test_exercises.py",
            *[a for ex in exercises for a in ("--exercise", ex)]]


def _kill_leftovers(proc: subprocess.Popen, marker: str):
    """Kill what the process left running: its session, and any process that still carries its GRADE_RUN marker (a
    child that left the session). A process that also cleared its environment escapes this: grade code you do not
    trust as another user, or in a container."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    needle = f"GRADE_RUN={marker}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


_PARSE_LOCK = threading.Lock()  # run_student's tree building, which parses the student's files


def plan(exercises: list[str], tmp: Path, seed: int, timeout: float = 600.0) -> dict:
    """The call plan: our tests on our code, every call to an exercise function written down with its inputs only.
    Returns {exercise: {test id: [call, ...]}}."""
    tree = tmp / "plan"
    tree.mkdir()
    for file in MODULES:
        shutil.copy2(ROOT / file, tree / file)
    _copy_tests(tree, [e for e in exercises if e in SNAPSHOTS])
    config = {"mode": "plan", "functions": _functions(exercises), "plan": "plan.jsonl", "seed": seed}
    code, tail = _spawn(tree, _pytest_args(exercises), config, timeout, runner=False)
    if code != 0 or not (tree / "plan.jsonl").is_file():
        raise RuntimeError(f"our tests failed on our code while planning (exit {code}): {tail}")
    out = {ex: {} for ex in exercises}
    for line in (tree / "plan.jsonl").read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        out[entry["exercise"]][entry["test"]] = entry["calls"]
    return out


def run_student(student: Path, exercise: str, tmp: Path, timeout: float, calls: dict) -> dict:
    """The runner for one exercise: the planned `calls` ({test id: [call]}) made on the student's functions.
    Returns {"problem": one line or "", "recorded": {test id: calls}}."""
    tree, notes = tmp / f"runner_{exercise}", []
    tree.mkdir()
    with _PARSE_LOCK:  # one tree at a time: its ast.parse calls in two threads at once can raise CPython 3.11's
        try:  # "AST constructor recursion depth mismatch" (gh-106905)
            problem = build_runner_tree(student, exercise, tree, notes)
        except (RecursionError, MemoryError) as err:  # a student's def too deep to splice back into our module
            problem = f"the student's code does not parse: {type(err).__name__} (nested too deep or too large)"
    if problem:
        return {"problem": problem, "recorded": {}, "notes": notes}
    (tree / "plan.json").write_text(json.dumps(calls))
    names = sorted({c["name"] for test in calls.values() for c in test})
    config = {"mode": "run", "functions": [n.split(".", 1) for n in names] or _functions([exercise]),
              "plan": "plan.json"}
    code, _ = _spawn(tree, ["tests/_grading.py"], config, timeout, runner=True)
    recorded = {}
    record = tree / "record.jsonl"
    if record.is_file() and record.stat().st_size <= MAX_RECORD:
        for line in record.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
                recorded.setdefault(str(entry["test"]), list(entry["calls"]))  # the first entry of a test counts
            except (ValueError, KeyError, TypeError, RecursionError):  # a line the student's code wrote, perhaps
                continue
    problem = f"timed out after {timeout:.0f} s (an endless loop?)" if code is None else \
        "" if recorded else f"the runner recorded nothing (exit {code}): does the student's code import?"
    return {"problem": problem, "recorded": recorded, "notes": notes}


def judge(recorded: dict, exercises: list[str], tmp: Path, seed: int, timeout: float = 600.0) -> list[dict]:
    """Our tests, on our code, with the recorded calls played back: [{test, exercise, when, outcome, message}]."""
    tree = tmp / "judge"
    tree.mkdir()
    for file in MODULES:
        shutil.copy2(ROOT / file, tree / file)
    _copy_tests(tree, [e for e in exercises if e in SNAPSHOTS])
    (tree / "recorded.json").write_text(json.dumps(recorded))
    config = {"mode": "replay", "functions": _functions(exercises), "recorded": "recorded.json",
              "results": "results.jsonl", "seed": seed}
    code, tail = _spawn(tree, _pytest_args(exercises), config, timeout, runner=False)
    results = tree / "results.jsonl"
    if code is None or not results.is_file():
        raise RuntimeError(f"the judge failed (exit {code}): {tail}")
    return [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]


def grade(student: Path, exercises: list[str], timeout: float = 120.0, jobs: int = 2) -> list[dict]:
    """Grade `exercises` of the copy `student`: a row per exercise {exercise, passed, total, points, max,
    first_failure, failures, seconds}; failures: [(test id, first line of its message)]."""
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="grade_") as tmp:
        tmp = Path(tmp)
        seed = secrets.randbits(48)  # this grading's fresh cases: drawn in the plan and again in the judge, never
        calls = plan(exercises, tmp, seed)  # told to the runner
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            runs = dict(zip(exercises, pool.map(lambda ex: run_student(student, ex, tmp, timeout, calls[ex]),
                                                exercises)))
        verdicts = judge({ex: r["recorded"] for ex, r in runs.items()}, exercises, tmp, seed)
    rows = []
    for ex in exercises:
        outcome = {}
        for v in verdicts:
            if v["exercise"] == ex:
                ok = outcome.get(v["test"], (True, ""))
                outcome[v["test"]] = (ok[0] and v["outcome"] != "failed", ok[1] or sanitize(v["message"]))
        failures = [(test.split("::")[-1], msg) for test, (ok, msg) in outcome.items() if not ok]
        failures.sort(key=lambda f: is_fresh(f[0]))  # the hand-worked tests' messages teach: they come first
        passed = len(outcome) - len(failures)
        row = {"exercise": ex, "passed": passed, "total": len(outcome), "max": EXERCISES[ex]["points"],
               "failures": failures, "points": round(EXERCISES[ex]["points"] * share(outcome), 1),
               "first_failure": f"{failures[0][0]}: {failures[0][1]}" if failures else "",
               "seconds": time.time() - t0}
        if runs[ex]["problem"]:  # a file that does not parse, a time limit, a runner that ran nothing: 0 points
            row.update(points=0.0, passed=0, first_failure=runs[ex]["problem"])
        row["notes"] = runs[ex].get("notes", [])
        if EXERCISES[ex].get("uses") and failures and not runs[ex]["problem"]:  # its runner held another
            name, _, message = row["first_failure"].partition(": ")  # exercise's reference: no number it gave shown
            row["first_failure"] = f"{name}: " + re.sub(r"(?<![\w.])\d+(\.\d+)?(e[+-]?\d+)?", "#", message)
        rows.append(row)
    return rows


def is_fresh(test: str) -> bool:
    """Whether a test id is one of the fresh cases (tests/test_exercises.py test_<exercise>_fresh[part])."""
    return "_fresh" in test.split("::")[-1]


def share(outcome: dict) -> float:
    """The share of an exercise's points a student earns: {test id: (passed, message)} -> the smaller of the shares
    passed among its public tests (hand-worked and snapshots: their answers are in the repository) and among its
    fresh cases (drawn at this grading). A table of the public answers passes no fresh case and scores 0; honest
    code that is right scores 1 on both; one mistake costs what it fails of either."""
    groups = [[ok for test, (ok, _) in outcome.items() if is_fresh(test) == fresh] for fresh in (False, True)]
    return min((sum(g) / len(g) for g in groups if g), default=0.0)


def run_exercise(student: Path, exercise: str, timeout: float = 120.0) -> dict:
    """Grade one exercise (see grade)."""
    return grade(student, [exercise], timeout)[0]


def sanitize(message: str, limit: int = 300) -> str:
    """The first line of a judge's message, printable ASCII, at most `limit` characters."""
    text = (message or "").strip()
    text = text[len("AssertionError: "):] if text.startswith("AssertionError: ") else text
    line = text.splitlines()[0] if text else "(no message)"
    line = "".join(c if 32 <= ord(c) < 127 else c.encode("unicode_escape").decode("ascii") for c in line)
    return line if len(line) <= limit else line[:limit - 3] + "..."


def table(rows: list[dict], sandboxed: bool = True) -> str:
    """The points table, one row per exercise and a total; a last line when the runner had no sandbox."""
    out = [f"{'exercise':11s} {'tests':>7s} {'points':>11s}  first failure", "-" * 100]
    for r in rows:
        out.append(f"{r['exercise']:11s} {r['passed']:>3d}/{r['total']:<3d} {r['points']:>5.1f}/{r['max']:<5d}  "
                   f"{r['first_failure']}")
        if r["points"] < r["max"]:  # why a top-level import or constant the student's code may need was not there
            out.extend(f"{'':31s}note: {sanitize(note, 200)}" for note in r.get("notes", [])[:3])
    got, most = sum(r["points"] for r in rows), sum(r["max"] for r in rows)
    out.append(f"{'total':11s} {'':7s} {got:>5.1f}/{most:<5d}")
    if not sandboxed:
        out.append("UNSANDBOXED (--allow-unsandboxed): the student's code ran as the grader's user; these points hold "
                   "only for code you trust")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("dir", type=Path, help="the student's copy of the repository")
    ap.add_argument("--exercises", nargs="+", default=list(EXERCISES), metavar="NAME",
                    help="exercises to grade (default: all): " + " ".join(EXERCISES))
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds allowed to one exercise's tests")
    ap.add_argument("--jobs", type=int, default=2, help="exercises whose runners run at once")
    ap.add_argument("--allow-unsandboxed", action="store_true",
                    help="grade where the sandbox cannot run (the student's code runs as you: only for code you trust;"
                         "\nthe table says so)")
    args = ap.parse_args(argv)
    if not 0 < args.timeout < float("inf"):  # 0 or less: every exercise would "time out" and score 0
        ap.error(f"--timeout must be a number of seconds > 0, got {args.timeout:g}")
    if not args.dir.is_dir() or not all((args.dir / f).is_file() for f in MODULES):
        print(f"error: {args.dir}: not a copy of the repository (it needs {', '.join(MODULES)})", file=sys.stderr)
        return 2
    unknown = [e for e in args.exercises if e not in EXERCISES]
    if unknown:
        print(f"error: unknown exercise {unknown[0]!r}; choose from {' '.join(EXERCISES)}", file=sys.stderr)
        return 2
    ours = {f: (ROOT / f).read_text(encoding="utf-8") for f in MODULES}
    if any(is_blank(ours[f], n) for spec in EXERCISES.values() for f, n in spec["functions"]) or \
            not (ROOT / "tests" / "snapshots").is_dir():
        print(f"error: {ROOT} is a student copy: grade with the solution repository's course/grade.py",
              file=sys.stderr)
        return 2
    t0 = time.time()
    print(f"grading {' '.join(args.exercises)} ...", flush=True)
    sandboxed = sandbox_works()
    if not sandboxed and os.geteuid() == 0:  # never the student's code as root, not even when allowed
        print("error: grade.py runs as root here and cannot set up its sandbox (as root it needs mount, PID, network, "
              "UTS and IPC namespaces, i.e. CAP_SYS_ADMIN, and unshare, setpriv and prlimit): the student's code "
              "would run as root; grade as an ordinary user, or in a container given CAP_SYS_ADMIN (docker run "
              "--cap-add SYS_ADMIN)", file=sys.stderr)
        return 2
    if not sandboxed and not args.allow_unsandboxed:
        print("error: no sandbox here (it needs Linux user namespaces, unshare, setpriv and prlimit): the student's "
              "code would run as you and read what you can; grade elsewhere, or pass --allow-unsandboxed for code you "
              "trust (the table says so)", file=sys.stderr)
        return 2
    rows = grade(args.dir.resolve(), args.exercises, args.timeout, args.jobs)
    print(table(rows, sandboxed))
    print(f"graded {args.dir} in {time.time() - t0:.0f} s")
    return 0 if all(r["points"] == r["max"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
