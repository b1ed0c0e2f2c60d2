"""Attacks on course/grade.py (issues 26, 39), each tried on a student copy and scored: module-level code that rewrites
pytest's report; a function that looks for the grader's modules, the solution's files (through /proc or by path) or
the snapshots' expected values; one that raises with text read from the reference (its type only reaches the table);
a test oracle that reads the calling test (the runner holds no test); one that ends the runner, patches builtins, or
leaves a process behind to forge the judge's results. None may earn a point, and what the table shows
the student is the grader's own text. A table of the visible tests' answers passes those tests, never the snapshots.
About a minute on 2 cores (a grading of eight exercises, and three of one). That our code scores full marks
through grade.py is in tests/test_course.py::test_the_grader_gives_full_marks_and_each_planted_mistake_its_message."""

import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "course"))

import grade  # noqa: E402
from make_assignment import EXERCISES, blank, function_source, solution_lines, splice  # noqa: E402


# issue 26 item 1: appended to grpo.py, llds.py and rollout.py of a blank copy, it made every report "passed"
REPORT_PAYLOAD = '''
import _pytest.reports as _reports
import _pytest.junitxml as _junit

_init = _reports.TestReport.__init__


def _passed(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.outcome, self.longrepr = "passed", None


_reports.TestReport.__init__ = _passed
_junit._NodeReporter.append_failure = lambda self, report: None
open("record.jsonl", "w").write("forged")
'''


def blank_copy(dest: Path) -> Path:
    """Our top-level modules with every exercise function blank: a fresh student copy's files."""
    dest.mkdir(parents=True)
    for src in ROOT.glob("*.py"):
        shutil.copy2(src, dest / src.name)
    for file in {f for spec in EXERCISES.values() for f, _ in spec["functions"]}:
        text = (dest / file).read_text()
        for ex, spec in EXERCISES.items():
            text = blank(text, [n for f, n in spec["functions"] if f == file], ex) if any(
                f == file for f, _ in spec["functions"]) else text
        (dest / file).write_text(text)
    return dest


def write(tree: Path, file: str, name: str, body: str, signature: str = ""):
    """Give `name` in tree/file this body (under our signature, or `signature` if given)."""
    ours = function_source((ROOT / file).read_text(), name)
    head = signature or ours[:ours.index(":\n", ours.index(")")) + 2]
    src = head + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    (tree / file).write_text(splice((tree / file).read_text(), name, src))


def test_a_helper_whose_default_runs_code_is_refused(tmp_path):
    tree = blank_copy(tmp_path / "student")
    (tree / "llds.py").write_text((tree / "llds.py").read_text() + "\n\ndef helper(x=open('/etc/hostname').read()):\n"
                                                                   "    return x\n")
    row = grade.run_exercise(tree, "alarm")
    assert row["points"] == 0 and row["first_failure"] == ("llds.py helper helper: a default value that is neither a "
                                                           "literal nor one of the module's names")


ATTACKS = {
    # issue 26 item 2: the grader's own modules, through sys.modules or an import
    ("grpo.py", "kl_k3"): """
        import importlib, sys
        for name in ("make_assignment", "grade", "grade_plugin"):
            module = sys.modules.get(name)
            if module is None:
                try:
                    module = importlib.import_module(name)
                except ImportError:
                    continue
            if getattr(module, "ROOT", None) is not None:
                ns = {}
                exec(open(f"{module.ROOT}/grpo.py").read(), ns)
                return ns["kl_k3"](logp, ref_logp)
        raise NotImplementedError("no grader in reach")
    """,
    # issue 26 item 3: the expected values of the snapshots, read at run time next to the tests
    ("grpo.py", "group_advantages"): """
        import json, os
        for folder in ("tests/snapshots", os.path.join(os.path.dirname(__file__), "tests", "snapshots")):
            try:
                cases = json.load(open(os.path.join(folder, "advantages.json")))["cases"]
            except OSError:
                continue
            for c in cases:
                if c["rewards"] == rewards.tolist() and c["group_ids"] == list(group_ids):
                    return torch.tensor(c["adv"])
        raise NotImplementedError("no table entry")
    """,
    # the solution's files: any process's working folder (/proc/*/cwd, e.g. the grader's), or a guessed path
    ("llds.py", "action_segments"): """
        import glob, os
        places = [os.readlink(f"/proc/{p}/cwd") for p in os.listdir("/proc") if p.isdigit()
                  and os.path.exists(f"/proc/{p}/cwd")] + [os.path.dirname(p) for p in glob.glob("/*/*/llds.py")]
        for place in places:
            path = os.path.join(place, "llds.py")
            text = open(path).read() if os.path.isfile(path) else ""
            if "def action_segments" in text and "/proc" not in text and "exercise gate" not in text:
                ns = {}
                exec(text, ns)
                return ns["action_segments"](keep)
        raise NotImplementedError("no solution in reach")
    """,
    # issue 26 item 4: raise with the reference's text (the action gate, which llds_loss's runner holds)
    ("llds.py", "llds_loss"): """
        import inspect
        text = inspect.getsource(GATES["action"]) + inspect.getsource(GATES["response"])
        raise ValueError(text.replace("\\n", " | ")[100:])
    """,
    # end the runner at the first call
    ("rollout.py", "cut_turn"): """
        import os
        os._exit(0)
    """,
    # make every check pass in the runner: torch's comparisons, isinstance, AssertionError
    ("rollout.py", "normalize_answer"): """
        import builtins, torch
        torch.allclose = torch.equal = lambda *a, **k: True
        builtins.AssertionError = type("Never", (Exception,), {})
        builtins.isinstance = lambda *a: True
        return "whatever"
    """,
    # a process left behind, to forge the judge's results once the runner is gone
    ("llds.py", "lld_alarm"): """
        import json, os, time
        if os.fork() == 0:
            os.setsid()
            judge = os.path.join(os.getcwd(), "..", "judge")
            for _ in range(600):
                if os.path.isdir(judge):
                    for i in range(100):
                        with open(os.path.join(judge, "results.jsonl"), "a") as f:
                            f.write(json.dumps({"test": f"forged{i}", "exercise": "alarm", "when": "call",
                                                "outcome": "passed", "message": ""}) + "\\n")
                    break
                time.sleep(0.05)
            os._exit(0)
        return "forged"
    """,
}


def test_attacks_score_0(tmp_path):
    # one grading of a blank copy: the module-level payload in grpo.py, llds.py and rollout.py, a decorator and a
    # default that run code on kl_k3, and (where the runner has its sandbox) the attacks from inside a function
    sandboxed = grade.sandbox_works()
    tree = blank_copy(tmp_path / "student")
    if sandboxed:  # without the sandbox grade.py warns that the runner runs as you: these are out of its reach
        for (file, name), body in ATTACKS.items():
            write(tree, file, name, body)
    for file in ("grpo.py", "llds.py", "rollout.py"):
        (tree / file).write_text((tree / file).read_text() + REPORT_PAYLOAD)
    # a def's defaults and decorators run when it is defined: ours replace them
    src = (tree / "grpo.py").read_text().replace(
        "def kl_k3(logp, ref_logp):", "@__import__('os')._exit\ndef kl_k3(logp, ref_logp=__import__('os')._exit(0)):")
    (tree / "grpo.py").write_text(src)
    rows = {r["exercise"]: r for r in grade.grade(tree, list(EXERCISES))}
    shown = grade.table(list(rows.values()))
    print(shown)
    assert all(r["points"] == 0 for r in rows.values()), shown
    assert "NotImplementedError" in rows["clipped"]["first_failure"], shown  # the payload forged nothing
    if not sandboxed:
        assert all("NotImplementedError" in r["first_failure"] for r in rows.values()), shown
        return
    # an exception reaches the table as its type only: no attack's text (nor the reference's it raised) gets out
    assert not any(text in shown for text in ("no solution in reach", "no grader in reach", "no table entry", "def "))
    assert "not graded: the runner recorded no call" in rows["cut_turn"]["first_failure"]  # each test's child ended
    # what the student is shown of the text it raised (the reference the runner holds: the exercises used by others,
    # here the action gate): nothing, only the exception's type
    assert rows["llds"]["first_failure"] == "test_llds_hand_computed_action_gate: ValueError"
    assert all(len(r["first_failure"]) <= 400 for r in rows.values())
    not_held = [ex for ex in EXERCISES if not any(ex in spec.get("uses", []) for spec in EXERCISES.values())]
    assert not [line for line in solution_lines(ROOT, not_held) if line in shown]


ORACLE = """
    import os, sys
    frame, files = sys._getframe(), []
    while frame is not None:
        files.append(frame.f_code.co_filename)
        frame = frame.f_back
    seen = [f for f in files if "test_" in os.path.basename(f)] + [p for p in ("tests/test_exercises.py",
            "tests/snapshots", "tests/conftest.py") if os.path.exists(p)]
    if seen:
        raise NotImplementedError("found " + " ".join(seen))
    return {answer}
"""


def test_a_test_oracle_finds_no_test_and_no_expected_value(tmp_path):
    """Issue 39's oracle scored 89/100 by reading the calling test's frame and its source in the runner. The runner
    now makes planned calls only: no test frame above the student's function, no test file, no snapshot in its tree,
    so the oracle finds nothing (it returns its own answer, graded as any answer is) and no hand-worked value either:
    its hand-worked answer for the first advantages test scores that test only if it is right."""
    tree = blank_copy(tmp_path / "student")
    write(tree, "grpo.py", "group_advantages", ORACLE.format(answer="torch.tensor([0.5, -1.5, 0.5, 0.5])"))
    write(tree, "llds.py", "lld_alarm", ORACLE.format(answer="'steady decay'"))
    rows = {r["exercise"]: r for r in grade.grade(tree, ["advantages", "alarm"])}
    shown = grade.table(list(rows.values()))
    assert "found" not in shown and "NotImplementedError" not in shown, shown  # nothing of the tests in reach
    assert rows["advantages"]["passed"] == 1 and rows["alarm"]["passed"] == 2, shown  # right where it is right


def test_a_table_of_the_visible_tests_fails_the_snapshots(tmp_path):
    # the hand-worked tests' inputs and answers are in the copy's tests/test_exercises.py (unless held back), so a table
    # passes those; the snapshots' expected values are public in this repository, but the fresh cases are drawn at
    # each grading: the table passes none of them, and an exercise scores the smaller share of the two (0)
    tree = blank_copy(tmp_path / "student")
    write(tree, "grpo.py", "group_advantages", """
        key = (tuple(round(float(r), 4) for r in rewards), tuple(group_ids), eps, scale)
        if len(group_ids) != len(rewards):
            raise ValueError("lengths differ")
        table = {((1.0, 0.0, 1.0, 1.0), ("q",) * 4, 1e-6, True): [0.5, -1.5, 0.5, 0.5],
                 ((1.0, 0.0, 0.0, 0.0), ("a", "b", "a", "b"), 1e-6, True): [0.7071, 0.0, -0.7071, 0.0],
                 ((1.0, 0.0, 1.0, 0.0, 0.0, 0.0), ("a", "a", "b", "b", "b", "b"), 1e-6, True):
                     [0.7071, -0.7071, 1.5, -0.5, -0.5, -0.5],
                 ((0.7, 1.0, 0.0), ("solo", "g", "g"), 1e-6, True): [0.7, 0.7071, -0.7071],
                 ((1.0, 0.0), ("q", "q"), 0.5, True): [0.5 / 1.2071068, -0.5 / 1.2071068],
                 ((1.0, 0.0, 0.0), ("q",) * 3, 1e-6, False): [2 / 3, -1 / 3, -1 / 3]}
        return torch.tensor(table.get(key, [0.0] * len(group_ids)))
    """)
    row = grade.run_exercise(tree, "advantages")  # issue 48: it scored 13.1 of 15 before the fresh cases
    assert (row["passed"], row["total"]) == (7, 10) and row["points"] == pytest.approx(0.0, abs=1e-12), row
    assert row["first_failure"].startswith("test_advantages_snapshot: snapshot"), row
    assert [f for f, _ in row["failures"]][1:] == ["test_advantages_fresh[binary]", "test_advantages_fresh[continuous]"]


def test_only_the_students_own_regular_files_are_read(tmp_path):
    """A copy whose grpo.py is a symbolic link (to /proc/self/cwd/grpo.py: the grader's own folder, our reference) or
    a FIFO scores nothing from it; a UTF-8 byte-order mark (some Windows editors write one) is read as Python does."""
    import grade

    (tmp_path / "link.py").symlink_to("/proc/self/cwd/grpo.py")
    text, problem = grade.read_student(tmp_path / "link.py")
    assert text == "" and "not a regular file" in problem and "symbolic link" in problem
    os.mkfifo(tmp_path / "fifo.py")
    text, problem = grade.read_student(tmp_path / "fifo.py")  # O_NONBLOCK: no hang on a FIFO nobody writes
    assert text == "" and "not a regular file" in problem
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfdef f():\n    return 1\n")
    assert grade.read_student(tmp_path / "bom.py") == ("def f():\n    return 1\n", "")
    assert grade.read_student(tmp_path / "missing.py")[1] == "not in the student's copy"


def test_a_copy_of_links_to_the_graders_folder_scores_0(tmp_path, monkeypatch):
    """The attack that scored 100/100: a blank copy whose grpo.py, llds.py and rollout.py are symbolic links to
    /proc/self/cwd/<file>, graded from the solution's folder, would have the grader parse our reference."""
    tree = blank_copy(tmp_path / "student")
    for file in ("grpo.py", "llds.py", "rollout.py"):
        (tree / file).unlink()
        (tree / file).symlink_to(f"/proc/self/cwd/{file}")
    monkeypatch.chdir(ROOT)
    rows = grade.grade(tree, list(EXERCISES))
    assert all(r["points"] == 0 for r in rows), grade.table(rows)
    assert all("not a regular file" in r["first_failure"] for r in rows), grade.table(rows)


def test_honest_style_and_a_byte_order_mark_grade_like_the_code_they_are(tmp_path):
    """Our own answers, written as a student might: an unused helper with a default naming a module attribute
    (dtype=torch.float32), a module-level constant and a helper class that an exercise function uses, and the file
    saved with a UTF-8 byte-order mark: full points, as the same code without them."""
    tree = blank_copy(tmp_path / "student")
    text = (ROOT / "llds.py").read_text(encoding="utf-8")
    ours = "    seg = action_segments(keep)  # [B, T]\n"
    assert text.count(ours) == 1
    text = text.replace(ours, "    seg = action_segments(keep) + _Offset().by(OFFSET)  # [B, T]\n")
    text += ('\n\nOFFSET = 0\n\n\nclass _Offset:\n    """adds nothing"""\n    unit = 1\n\n'
             '    def by(self, k, scale=1):\n        return k * scale * self.unit\n\n\n'
             'def _as_float(x, dtype=torch.float32):\n    return torch.as_tensor(x, dtype=dtype)\n')
    (tree / "llds.py").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    row = grade.run_exercise(tree, "gate")
    assert row["points"] == row["max"], row


SANDBOX_PROBE = """
import json, os, resource
out = {n: resource.getrlimit(getattr(resource, n))[0] for n in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE",
                                                                 "RLIMIT_NPROC")}
for path, size in (("/tree/x", 16), ("/usr/x", 16), ("/usr/share/probe_x", 16), ("/tmp/x", 16),
                   ("/tmp/big", 100 << 20)):
    try:
        with open(path, "wb") as f:
            f.write(b"x" * size)
        out[path] = "written"
    except OSError as err:
        out[path] = err.errno
out["submount seen"] = os.path.exists("/usr/share/host_file")
print(json.dumps(out))
"""


@pytest.mark.skipif(not grade.sandbox_works(), reason="no sandbox on this machine (grade.py refuses to grade here)")
def test_the_sandbox_has_limits_and_is_read_only_below_every_bind(tmp_path):
    """Issue 39 item 4: limits on memory, CPU time, file size and processes, a sized /tmp, and a view that is read-only
    in every submount of what it binds: a tmpfs mounted on /usr/share in an outer namespace (as Docker mounts
    /etc/hosts) is seen inside but not writable (the old sandbox wrote through it to the host)."""
    import json
    import subprocess

    (tmp_path / "tree").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "tree" / "probe.py").write_text(SANDBOX_PROBE)
    inner = [*grade.unshare(), "/bin/sh", "-c", grade.SANDBOX, "sandbox", str(tmp_path / "root"),
             str(tmp_path / "tree"), sys.executable, "/tree/probe.py"]
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]  # root: no user namespace (the sandbox's uid)
    outer = ["unshare", *user, "--mount", "--propagation", "private", "/bin/sh", "-c",
             'mount -t tmpfs tmpfs /usr/share && echo host > /usr/share/host_file && exec "$@"', "outer", *inner]
    r = subprocess.run(outer, capture_output=True, text=True, env=grade._base_env(30), timeout=300)
    if r.returncode and "unshare" in r.stderr and not r.stdout:  # no nested namespaces here: the limits alone
        r = subprocess.run(inner, capture_output=True, text=True, env=grade._base_env(30), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    print(got)
    assert (got["RLIMIT_AS"], got["RLIMIT_CPU"], got["RLIMIT_FSIZE"], got["RLIMIT_NPROC"]) == (
        grade.LIMITS["AS"], 30, grade.LIMITS["FSIZE"], grade.LIMITS["NPROC"])
    assert got["/tree/x"] == got["/usr/x"] == 30 and got["/tmp/x"] == "written"  # 30: EROFS
    assert got["/tmp/big"] in (27, 28)  # EFBIG (the file-size limit) or ENOSPC (the sized /tmp): never written
    if got["submount seen"]:
        assert got["/usr/share/probe_x"] == 30


def test_no_sandbox_no_grade_unless_allowed_and_then_the_table_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grade, "sandbox_works", lambda: False)
    monkeypatch.setattr(grade.os, "geteuid", lambda: 1000)  # an ordinary user (as root: refused, test below)
    tree = blank_copy(tmp_path / "student")
    assert grade.main([str(tree), "--exercises", "kl"]) == 2
    assert "--allow-unsandboxed" in capsys.readouterr().err
    assert grade.main([str(tree), "--exercises", "kl", "--allow-unsandboxed"]) == 1  # graded: 0 points, said
    assert "UNSANDBOXED (--allow-unsandboxed)" in capsys.readouterr().out


@pytest.mark.skipif(not grade.sandbox_works(), reason="no sandbox on this machine (grade.py refuses to grade here)")
def test_the_sandbox_runs_a_virtual_env_that_lives_under_tmp(tmp_path):
    """A user's clone (and its .venv) under /tmp: the sandbox's own /tmp used to be mounted over the venv's bind, so
    the grader could not start Python there ('setpriv: failed to execute'). The venv is bound read-only, /tmp beside
    it stays writable."""
    import subprocess
    import tempfile
    import venv

    (tmp_path / "tree").mkdir()
    (tmp_path / "root").mkdir()
    code = "import os, sys; open('/tmp/x', 'w').write('x'); print(sys.prefix, os.access(sys.prefix, os.W_OK))"
    with tempfile.TemporaryDirectory(dir="/tmp") as where:  # /tmp itself, whatever TMPDIR or pytest's basetemp say
        prefix = Path(where) / ".venv"
        venv.EnvBuilder(system_site_packages=True, with_pip=False).create(prefix)
        r = subprocess.run([*grade.unshare(), "/bin/sh", "-c", grade.SANDBOX, "sandbox", str(tmp_path / "root"),
                            str(tmp_path / "tree"), str(prefix / "bin" / "python"), "-c", code],
                           capture_output=True, text=True, env={**grade._base_env(30), "PREFIX": str(prefix)},
                           timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [str(prefix), "False"]


# ----------------------------------------------------------------------------------------------------------------------
# issue 48: a grader run as root; a record the student cannot write; fresh cases; hostile source; a linked venv

ROOT_PROBE = """
import errno, json, os, socket
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(), "pid": os.getpid(),
       "uts": os.readlink("/proc/self/ns/uts"), "ipc": os.readlink("/proc/self/ns/ipc"),
       "etc": sorted(os.listdir("/etc"))}
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches"):
    try:  # opened for writing, never written: a probe must not change the host
        os.close(os.open(path, os.O_WRONLY))
        out[path] = "opened"
    except OSError as err:
        out[path] = errno.errorcode[err.errno]
for path in ("/etc/shadow", "/etc/hostname", "{repo}"):
    out[path] = os.path.exists(path)
try:
    socket.sethostname("student")
    out["sethostname"] = "changed"
except OSError as err:
    out["sethostname"] = errno.errorcode[err.errno]
kids = []
for _ in range(120):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        import time
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
out["forks"] = len(kids)
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not grade.sandbox_works(),
                    reason="needs root and the sandbox (CI runs as root)")
def test_as_root_the_student_runs_as_nobody_of_ours_in_its_own_namespaces(tmp_path):
    """Issue 48 item 1: a grader run as root ran the student as root (its hostname change, /proc/sys write and
    /etc/shadow read reached the host; 120 of 120 forks). Now root builds the view, then the student's code runs as a
    fresh unprivileged uid with no group, in its own UTS, IPC, PID, mount and network namespaces, /proc/sys read-only,
    /etc holding the loader's files and a passwd naming it, and RLIMIT_NPROC binding."""
    import json
    import socket
    import subprocess

    (tmp_path / "tree").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "tree" / "probe.py").write_text(ROOT_PROBE.replace("{repo}", str(ROOT / ".git")))
    host = {k: os.readlink(f"/proc/self/ns/{k}") for k in ("uts", "ipc")}
    hostname = socket.gethostname()
    r = subprocess.run([*grade.unshare(), "/bin/sh", "-c", grade.SANDBOX, "sandbox", str(tmp_path / "root"),
                        str(tmp_path / "tree"), sys.executable, "/tree/probe.py"],
                       capture_output=True, text=True, env=grade._base_env(30), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    print(got)
    assert got["uid"] == got["euid"] == got["gid"] >= grade.FIRST_UID and got["groups"] == [] and got["pid"] == 1
    assert got["uts"] != host["uts"] and got["ipc"] != host["ipc"]
    assert all(got[p] in ("EACCES", "EROFS", "EPERM") for p in ("/proc/sys/kernel/core_pattern",
                                                               "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches"))
    assert not got["/etc/shadow"] and not got["/etc/hostname"] and not got[str(ROOT / ".git")]
    assert set(got["etc"]) <= {"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
                               "alternatives", "passwd", "group", "fstab"}
    assert got["sethostname"] == "EPERM" and socket.gethostname() == hostname
    assert got["forks"] < grade.LIMITS["NPROC"]


def test_as_root_without_a_sandbox_grade_py_refuses_even_when_allowed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grade, "sandbox_works", lambda: False)
    monkeypatch.setattr(grade.os, "geteuid", lambda: 0)
    tree = blank_copy(tmp_path / "student")
    assert grade.main([str(tree), "--exercises", "kl", "--allow-unsandboxed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs as root" in err[0] and "--cap-add SYS_ADMIN" in err[0], err


FORGER = """
    import json, os, signal
    config = json.load(open("grading.json"))
    forged = json.dumps({"test": "tests/test_exercises.py::test_kl_k3_hand_values", "calls": []}) + "\\n"
    for fd in {config["record_fd"], 3}:  # the runner's record descriptor, by its number
        try:
            os.write(fd, forged.encode() * 50)  # first lines for every test, empty: would score 0 (issue 48 item 2)
        except OSError:
            pass
    for pid in (1, os.getppid()):
        try:
            os.kill(pid, signal.SIGKILL)  # and end the runner, truncating the record
        except OSError:
            pass
    x = (ref_logp.float() - logp.float()).clamp(-20.0, 20.0)
    return (x.exp() - x - 1.0).clamp(-10.0, 10.0)
"""


@pytest.mark.skipif(not grade.sandbox_works(), reason="no sandbox on this machine (grade.py refuses to grade here)")
def test_the_record_is_the_runners_an_honest_forger_keeps_its_points(tmp_path):
    """Issue 48 item 2: an honest kl_k3 that first wrote forged record lines to the runner's descriptor scored 0/10.
    Each test's calls now run in a child that holds no record descriptor, and the runner (the PID namespace's init,
    not dumpable) frames what the child returns: the forgery and the kill reach nothing. (What the child sends back is
    the student's to spoil, and it spoils that test's calls only: as returning a wrong value would.)"""
    tree = blank_copy(tmp_path / "student")
    write(tree, "grpo.py", "kl_k3", FORGER)
    row = grade.run_exercise(tree, "kl")
    assert row["points"] == row["max"], row


@pytest.mark.parametrize("body", ["return " + "-" * 10_000 + "1", "return " + "1+" * 700_000 + "1"],
                         ids=["10000 minus signs", "a 1.4 MB expression"])
def test_hostile_source_is_one_line_never_a_traceback(tmp_path, body):
    tree = blank_copy(tmp_path / "student")
    write(tree, "grpo.py", "kl_k3", body)
    row = grade.run_exercise(tree, "kl")
    assert row["points"] == 0 and row["first_failure"].startswith("grpo.py does not parse: "), row
    assert "\n" not in row["first_failure"] and len(row["first_failure"]) < 200, row


def test_a_top_level_import_not_taken_is_said_in_the_table(tmp_path):
    """Module-level code never runs in the runner: a kl_k3 that needs a top-level `import math` fails, and the table
    says why under the exercise's row; the same import inside the function scores full points."""
    tree = blank_copy(tmp_path / "student")
    write(tree, "grpo.py", "kl_k3", "x = (ref_logp.float() - logp.float()).clamp(-20.0, 20.0)\n"
                                    "return (x.exp() - x - 1.0).clamp(-10.0, 10.0) * math.pi / math.pi")
    (tree / "grpo.py").write_text("import math\nSCALE = float('1.0')\n" + (tree / "grpo.py").read_text())
    row = grade.run_exercise(tree, "kl")
    shown = grade.table([row])
    assert row["points"] == 0 and "note: grpo.py line 1: `import math` is not taken" in shown, shown
    assert "note: grpo.py line 2: SCALE is not taken" in shown, shown
    write(tree, "grpo.py", "kl_k3", "import math\nx = (ref_logp.float() - logp.float()).clamp(-20.0, 20.0)\n"
                                    "return (x.exp() - x - 1.0).clamp(-10.0, 10.0) * math.pi / math.pi")
    assert grade.run_exercise(tree, "kl")["points"] == 10


def test_an_exercise_that_holds_anothers_reference_shows_no_number_it_returned(tmp_path):
    """Issue 48 item 4: clipped's runner holds our kl_k3 (llds's our gate); a grpo_loss that packs that source into
    the floats it returns had 50 characters a grading printed. The table now shows no digit of such a message."""
    tree = blank_copy(tmp_path / "student")
    write(tree, "grpo.py", "grpo_loss", """
        import inspect
        code = [float(ord(c)) for c in inspect.getsource(kl_k3)[:64]]
        return torch.tensor(code).sum() + logp.sum() * 0, {"grpo/clip_frac": code[0]}
    """)
    row = grade.run_exercise(tree, "clipped")
    message = row["first_failure"].partition(": ")[2]
    assert row["points"] < row["max"] and not any(c.isdigit() for c in message), row


@pytest.mark.skipif(not grade.sandbox_works(), reason="no sandbox on this machine (grade.py refuses to grade here)")
def test_the_sandbox_runs_a_virtual_env_reached_through_a_symbolic_link(tmp_path):
    """Issue 48: /tmp/venv -> /data/venv made the grader answer "no sandbox here"; the link is recreated inside and
    what it points to bound read-only."""
    import subprocess
    import tempfile
    import venv

    (tmp_path / "tree").mkdir()
    (tmp_path / "root").mkdir()
    real = tmp_path / "data" / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(real)
    with tempfile.TemporaryDirectory(dir="/tmp") as where:
        link = Path(where) / "venv"
        link.symlink_to(real)
        r = subprocess.run([*grade.unshare(), "/bin/sh", "-c", grade.SANDBOX, "sandbox", str(tmp_path / "root"),
                            str(tmp_path / "tree"), str(link / "bin" / "python"), "-c", "import os, sys; print("
                            "sys.prefix, os.path.islink(sys.prefix), os.access(sys.prefix, os.W_OK))"],
                           capture_output=True, text=True, env={**grade._base_env(30), "PREFIX": str(link)},
                           timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [str(link), "True", "False"]
