"""README.md's set-up commands are what CI runs: a fresh virtual env, the same install lines in the same order, and
the README's test command. So a green CI means a new user following the README gets a green suite. And README.md's
paper -> code table points at the functions as they are today (file, name, line range)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_block() -> list[str]:
    """The command lines of the first ```bash block under README.md's "## Set up and test"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set up and test", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_setup_in_a_fresh_venv():
    readme = setup_block()
    assert re.fullmatch(r"python3 -m venv (\S+) && \. \1/bin/activate", readme[0]), readme[0]
    assert readme[-1] == "pytest -q -n 2"  # the test command (pytest-xdist: two test processes)
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    venv = next(i for i, line in enumerate(ci) if line.startswith("python3 -m venv "))
    assert ci[venv + 1].startswith(". ") and ci[venv + 1].rstrip("\"").endswith("/bin/activate")  # and it is used
    commands = [line for line in ci[venv + 2:] if not line.startswith(("python --version", "pip list"))]
    assert commands == readme[1:], (commands, readme[1:])


def walkthrough() -> list[dict]:
    """The rows of README.md's "## Paper to code" table: the row's text, paper, file and function ("name" or
    "Class.method"). The lines cell is a link, [Lstart-Lend](file#Lstart-Lend), checked as part of the row's text."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Paper to code", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert lines[0] == "| paper | file | function | lines |", lines[0]
    rows = []
    for line in lines[2:]:
        m = re.fullmatch(r"\| (.+) \| `([\w/]+\.py)` \| `([\w.]+)` \| \[L\d+-L\d+\]\([\w/]+\.py#L\d+-L\d+\) \|", line)
        assert m, f"a row of the paper -> code table does not parse: {line}"
        rows.append({"line": line, "paper": m.group(1), "file": m.group(2), "function": m.group(3)})
    return rows


def definition_lines(file: str, name: str) -> tuple[int, int] | None:
    """(first, last) line of the def (or class) `name` in `file`, "Class.method" for a method; None if absent.
    The first line is the `def` line itself, after any decorators."""
    scope = ast.parse((ROOT / file).read_text(encoding="utf-8")).body
    node = None
    for part in name.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    return node.lineno, node.end_lineno


# a course copy (course/make_assignment.py leaves tests/course out): the functions the student writes have their own
# lengths, so the line ranges below them move; there, only that each function exists is checked
STUDENT_COPY = not (ROOT / "tests" / "course").is_dir()


def test_walkthrough_line_ranges_match_the_code():
    """Each row of README's paper -> code table names a function that exists in that file, and its line range (the
    text and the link) is that function's def..end today. On failure it prints the table's rows as they should be."""
    rows = walkthrough()
    assert len(rows) >= 12
    wrong, fixed = [], []
    for row in rows:
        where = definition_lines(row["file"], row["function"]) if (ROOT / row["file"]).exists() else None
        if where is None:
            found = sorted(f.name for f in ROOT.glob("*.py") if definition_lines(f.name, row["function"]))
            wrong.append(f"{row['file']} has no {row['function']} (defined in: {', '.join(found) or 'none'})")
            fixed.append(row["line"])
            continue
        r = f"L{where[0]}-L{where[1]}"
        good = f"| {row['paper']} | `{row['file']}` | `{row['function']}` | [{r}]({row['file']}#{r}) |"
        fixed.append(good)
        if row["line"] != good and not STUDENT_COPY:
            wrong.append(f"{row['file']} {row['function']} is at {r}")
    assert not wrong, "README.md's paper -> code table is out of date:\n  " + "\n  ".join(wrong) + \
        "\nthe rows as they should read:\n" + "\n".join(fixed)


def prose_words(text: str) -> int:
    """Words of README.md outside its ``` code blocks (tables and headings count: they are read)."""
    return len(re.sub(r"```.*?```", "", text, flags=re.DOTALL).split())


def test_the_map_comes_first_and_the_prose_stays_short():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings.index("Paper to code") < next(i for i, h in enumerate(headings) if h.startswith("Quick start"))
    assert headings.index("Paper to code") == 1, headings  # right after "What this is" and its one-step diagram
    assert prose_words(text) <= 1500, f"README.md has {prose_words(text)} words of prose: move detail to docs/"
    assert prose_words("a b\n```bash\nc d e\n```\nf") == 3  # code blocks are not prose
