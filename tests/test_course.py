"""The course kit (docs/course.md): course/make_assignment.py writes a student copy that imports and collects, with
every exercise at 0 points, and that holds no solution; grading is independent across exercises; each typical wrong
answer in tests/course/wrong/ loses points with a message that names its mistake; the snapshots match our code today.
Attacks on the grader are in tests/test_grader.py. Each grading is a runner process per exercise and a judge process,
so the planted mistakes run through the graded tests in this process, and three of them through grade.py."""

import ast
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "course"))
sys.path.insert(0, str(ROOT / "tests"))

import hang  # noqa: E402
import grade  # noqa: E402
import make_snapshots  # noqa: E402
from make_assignment import EXERCISES, INSTRUCTOR_ONLY, blank, function_source, is_blank, splice  # noqa: E402
from make_assignment import leaks, solution_lines  # noqa: E402
from make_assignment import main as make_assignment  # noqa: E402

WRONG = sorted((ROOT / "tests" / "course" / "wrong").glob("*.py"))


def modules_tree(dest: Path) -> Path:
    """A tree with our top-level modules only: what grade.py needs of a student's copy."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in ROOT.glob("*.py"):
        shutil.copy2(src, dest / src.name)
    return dest


def test_snapshots_match_the_code_today():
    # structure and non-floats exactly, floats to a float32 tolerance: make_snapshots.differences says why
    diffs = [d for name in make_snapshots.SNAPSHOTS for d in make_snapshots.snapshot_differences(name)]
    assert not diffs, "stale snapshots (rewrite with: python tests/make_snapshots.py):\n" + "\n".join(diffs)


def test_snapshot_differences_tolerate_float32_rounding_only():
    stored = {"cases": [{"agg": "token-mean", "n": 3, "on": True, "grad": [[-0.016324304, 0.0], [1.5, None]]}]}
    same = json.loads(json.dumps(stored))
    assert make_snapshots.differences(stored, same) == []
    same["cases"][0]["grad"][0] = [-0.016324302, 1e-9]  # the other CPU: 1 ulp; and a ~0 that is not 0
    assert make_snapshots.differences(stored, same) == []
    for path, value in ((("grad", 0, 0), -0.016324304 * (1 + 1e-3)), (("n",), 4), (("n",), 3.5), (("on",), 1),
                        (("agg",), "seq-mean-token-mean"), (("grad", 1, 1), 0.0), (("grad", 1), [1.5])):
        other = json.loads(json.dumps(stored))
        *parents, last = path
        target = other["cases"][0]
        for key in parents:
            target = target[key]
        target[last] = value
        assert make_snapshots.differences(stored, other), (path, value)
    assert make_snapshots.differences(stored, {"cases": []}) == ["cases: 1 items stored, 0 computed"]


def test_every_exercise_function_exists_and_every_exercise_has_tests():
    tagged = set(re.findall(r'@ex\("(\w+)"\)', (ROOT / "tests" / "test_exercises.py").read_text()))
    assert tagged == set(EXERCISES)
    for spec in EXERCISES.values():
        for file, name in spec["functions"]:
            assert function_source((ROOT / file).read_text(), name)
    assert sum(spec["points"] for spec in EXERCISES.values()) == 100


def test_blank_keeps_signature_and_docstring_and_splice_restores():
    src = (ROOT / "grpo.py").read_text()
    out = blank(src, ["group_advantages", "_token_mean"], "advantages")
    tree = ast.parse(out)  # still a module
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "group_advantages")
    assert ast.get_docstring(fn).startswith("Group-normalised outcome advantage")
    assert is_blank(out, "group_advantages") and is_blank(out, "_token_mean") and not is_blank(out, "kl_k3")
    back = splice(splice(out, "group_advantages", function_source(src, "group_advantages")), "_token_mean",
                  function_source(src, "_token_mean"))
    assert back == src
    method = blank((ROOT / "rollout.py").read_text(), ["Episode.append"], "cut_turn")
    assert is_blank(method, "Episode.append") and not is_blank(method, "cut_turn")


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("course") / "student"
    assert make_assignment(["--out", str(out), "--hold-back", "tests/test_plot_run.py"]) == 0
    return out


def test_student_copy_imports_and_collects(student):
    assert not (student / "tests" / "test_plot_run.py").exists()  # held back
    assert not (student / "data").exists() and (student / "docs" / "course.md").exists()
    assert (student / "tests" / "test_exercises.py").exists()  # the graded tests, less their snapshots
    for path in INSTRUCTOR_ONLY:
        assert not (student / path).exists(), f"{path} is the instructor's: the planted mistakes, snapshots, grader"
    for spec in EXERCISES.values():
        for file, name in spec["functions"]:
            assert is_blank((student / file).read_text(), name), f"{file} {name} was not blanked"
    code = "import grpo, llds, rollout, train, evaluate, probe, machinery.fsdp"
    out = hang.run([sys.executable, "-c", code], cwd=student, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = hang.run([sys.executable, "-m", "pytest", "--collect-only", "-q"], cwd=student, capture_output=True,
                   text=True)
    assert out.returncode == 0 and " collected" in out.stdout.splitlines()[-1], out.stdout[-2000:] + out.stderr


def test_no_line_of_a_blanked_body_appears_in_a_student_copy(student):
    lines = solution_lines(ROOT, list(EXERCISES))
    assert len(lines) > 80  # the check has something to look for: the bodies' own lines, less shared idioms
    assert not leaks(student, lines)
    # and it would see one: a planted wrong answer (our function with one edit) or a quoted body
    planted = student / "tests" / "planted.py"
    planted.write_text((ROOT / "tests" / "course" / "wrong" / "llds_per_microbatch.py").read_text() + "\n" +
                       function_source((ROOT / "grpo.py").read_text(), "kl_k3"))
    try:
        found = leaks(student, lines)
        assert found and all(f.startswith("tests/planted.py:") for f in found), found
    finally:
        planted.unlink()


def test_make_assignment_refuses_a_copy_that_quotes_a_body(tmp_path, monkeypatch, capsys):
    import make_assignment as kit

    monkeypatch.setattr(kit, "INSTRUCTOR_ONLY", [p for p in kit.INSTRUCTOR_ONLY if p != "tests/course"])
    assert kit.main(["--out", str(tmp_path / "copy"), "--exercises", "advantages"]) == 1
    err = capsys.readouterr().err
    assert "lines of the blanked bodies appear in the copy" in err and "tests/course/wrong/advantages_" in err


def test_student_copy_scores_0_and_one_solved_exercise_scores_full_alone(student, tmp_path):
    # the fresh copy with only `llds` solved: llds_loss calls the action gate, which is blank here; the grader runs
    # it with our gate, so llds has full points and every other exercise 0 (all eight were graded blank in
    # test_grader.py::test_attacks_score_0)
    tree = modules_tree(tmp_path / "tree")
    for file in ("grpo.py", "llds.py", "rollout.py"):
        shutil.copy2(student / file, tree / file)
    text = (tree / "llds.py").read_text()
    (tree / "llds.py").write_text(splice(text, "llds_loss", function_source((ROOT / "llds.py").read_text(),
                                                                            "llds_loss")))
    rows = {r["exercise"]: r for r in grade.grade(tree, ["llds", "gate", "clipped", "em"])}  # one per file, and
    print(grade.table(list(rows.values())))  # the gate llds_loss calls
    assert rows["llds"]["points"] == rows["llds"]["max"], rows["llds"]
    for ex, row in rows.items():
        if ex != "llds":
            assert row["points"] == 0 and row["total"] > 0 and "NotImplementedError" in row["first_failure"], row


def test_grade_rejects_what_is_not_a_tree(tmp_path, capsys):
    assert grade.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a copy of the repository" in err[0]


@pytest.mark.parametrize("timeout", ["0", "-5", "nan", "inf"])
def test_grade_rejects_a_timeout_that_is_no_positive_number_of_seconds(timeout, capsys):
    """--timeout 0 was accepted, and then every exercise timed out: the reference scored 0/15."""
    with pytest.raises(SystemExit) as stop:
        grade.main([str(ROOT), "--timeout", timeout])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1].endswith(f"error: --timeout must be a number of seconds > 0, got {timeout}")


def wrong_tree(wrong: Path, dest: Path) -> tuple[str, str, dict]:
    """Our modules with the planted wrong answer `wrong` put in: (its exercise, its header's expected text, {file:
    (the patched file's text, [qualified names of the functions it changes]))."""
    exercise = next(ex for ex in EXERCISES if wrong.stem.startswith(ex + "_"))
    header = dict(re.findall(r"^# (mistake|expect|patch|replace|with): (.+)$", wrong.read_text(), re.MULTILINE))
    tree, changed = modules_tree(dest), {}
    if "patch" in header:  # a one-line mistake: our function with one text replaced (it must occur exactly once)
        file, name = header["patch"].split()
        ours = function_source((ROOT / file).read_text(), name)
        assert ours.count(header["replace"]) == 1, f"{wrong.name}: '{header['replace']}' is not once in {name}"
        text = (tree / file).read_text()
        (tree / file).write_text(splice(text, name, ours.replace(header["replace"], header["with"])))
        changed.setdefault(file, []).append(name)
    names = {name.split(".")[-1]: (file, name) for file, name in EXERCISES[exercise]["functions"]}
    for node in ast.parse(wrong.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            file, name = names[node.name]
            text = (tree / file).read_text()
            (tree / file).write_text(splice(text, name, ast.get_source_segment(wrong.read_text(), node)))
            changed.setdefault(file, []).append(name)
    return exercise, header, {file: ((tree / file).read_text(), names) for file, names in changed.items()}


class FirstFailure:
    """A pytest plugin that keeps each test's outcome and the first failure's message, as grade.py's judge does."""

    def __init__(self):
        self.outcomes, self.first = {}, ""

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.failed:
            ok = self.outcomes.get(report.nodeid, True) and not report.failed
            self.outcomes[report.nodeid] = ok
            if report.failed and not self.first:
                crash = getattr(report.longrepr, "reprcrash", None)
                message = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
                self.first = f"{report.nodeid.split('::')[-1]}: {grade.sanitize(message)}"


@pytest.mark.parametrize("wrong", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_answer_loses_points_with_a_message_that_names_it(wrong, tmp_path, monkeypatch):
    # the graded tests run here, in this process, with the wrong function in place of ours (a grading of each would
    # cost two processes; test_the_grader_gives_full_marks_and_each_planted_mistake_its_message runs three through
    # grade.py)
    import importlib.util

    exercise, header, changed = wrong_tree(wrong, tmp_path / "tree")
    for file, (text, names) in changed.items():
        module = importlib.import_module(file[:-3])
        spec = importlib.util.spec_from_loader(f"_wrong_{file[:-3]}", loader=None)
        patched = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, patched)  # dataclasses look their module up
        exec(compile(text, str(tmp_path / "tree" / file), "exec"), patched.__dict__)
        for name in {n for spec in EXERCISES.values() for f, n in spec["functions"] if f == file}:  # whole, so a
            *cls, attr = name.split(".")  # table of functions (grpo_loss's aggregations) holds the patched ones
            owner, new = module, patched
            for c in cls:
                owner, new = getattr(owner, c), getattr(new, c)
            monkeypatch.setattr(owner, attr, new.__dict__[attr])
    result = FirstFailure()
    code = pytest.main([str(ROOT / "tests" / "test_exercises.py"), "--exercise", exercise, "-q",
                        "-p", "no:cacheprovider", "--rootdir", str(ROOT)], plugins=[result])
    assert result.outcomes, f"{wrong.name}: no graded test ran (exit {code})"
    assert not all(result.outcomes.values()), f"{wrong.name} ({header['mistake']}) passed every test"
    assert header["expect"] in result.first, result.first


def test_the_grader_gives_full_marks_and_each_planted_mistake_its_message(tmp_path):
    # our code with three of the four mistakes issue 26 found uncaught put in, each in its own exercise (the fourth,
    # llds_ma_weight_ignored, is also an llds_loss: the sweep above has it), graded by grade.py (runner and judge):
    # each of those three loses points with the message its mistake expects, and the five untouched exercises, our
    # code, get full marks
    chosen = ["advantages_equal_group_not_zeroed", "em_articles_before_punctuation", "llds_delta_in_bf16"]
    tree, expect = modules_tree(tmp_path / "tree"), {}
    for stem in chosen:
        exercise, header, changed = wrong_tree(ROOT / "tests" / "course" / "wrong" / f"{stem}.py", tmp_path / stem)
        for file, (text, names) in changed.items():
            for name in names:
                (tree / file).write_text(splice((tree / file).read_text(), name, function_source(text, name)))
        expect[exercise] = (stem, header)
    rows = grade.grade(tree, list(EXERCISES))
    print(grade.table(rows))
    for row in rows:
        if row["exercise"] not in expect:
            assert row["points"] == row["max"] and row["total"] > 0, row
            continue
        stem, header = expect[row["exercise"]]
        assert row["points"] < row["max"], f"{stem} ({header['mistake']}) passed every test"
        assert header["expect"] in row["first_failure"], (stem, row["first_failure"])


def test_handout_covers_every_exercise_and_names_only_tests_that_exist():
    text = (ROOT / "docs" / "course.md").read_text(encoding="utf-8")
    for ex, spec in EXERCISES.items():
        assert f"`{ex}` ({spec['points']} points)" in text, f"docs/course.md has no section for {ex}"
    tests = set(re.findall(r"^def (test_\w+)", (ROOT / "tests" / "test_exercises.py").read_text(), re.MULTILINE))
    named = set(re.findall(r"tests/test_exercises\.py::(\w+)", text))
    assert named <= tests, f"docs/course.md names tests that do not exist: {sorted(named - tests)}"
    fresh = {t for t in tests if t.endswith("_fresh")}  # one line says what they are: `test_<exercise>_fresh[...]`
    assert "`test_<exercise>_fresh[...]`" in text and len(fresh) == len(EXERCISES), sorted(fresh)
    assert tests - fresh <= named, f"docs/course.md does not say what these tests catch: {sorted(tests - fresh - named)}"
    assert "../shared" not in text


def test_a_file_that_does_not_parse_or_a_hang_costs_only_its_exercises(tmp_path):
    tree = modules_tree(tmp_path / "tree")
    src = (tree / "grpo.py").read_text()
    (tree / "grpo.py").write_text(splice(src, "kl_k3", "def kl_k3(logp, ref_logp):\n    while True:\n        pass\n"))
    hang = grade.run_exercise(tree, "kl", timeout=4)
    assert hang["points"] == 0 and "timed out after 4 s" in hang["first_failure"]
    (tree / "grpo.py").write_text(src.replace("def kl_k3(logp, ref_logp):", "def kl_k3(logp, ref_logp:"))
    broken, em = grade.grade(tree, ["advantages", "em"])  # one grading: rollout.py's exercises are graded on their own
    assert broken["points"] == 0 and broken["first_failure"].startswith("grpo.py does not parse:")
    assert em["points"] == 10, em
