"""docs/pitfalls.md is the key to the one label system the code cites ("(P9)"; "NOTE(P7): ..." where we depart from
the official code): every label the code, the tests or the README cite is defined there, every pitfall a test name
carries too, and every test the document names exists. Code comments point to the paper or to upstream files, never
to notes outside the repository. The commands and paths that README.md and docs/ give name files that exist."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "pitfalls.md"


def python_files() -> list[Path]:
    """The top-level files and those of each room (tests/test_structure.py's ROOMS: tests/, scripts/, lab/, ...)."""
    from conftest import ROOMS

    return sorted([*ROOT.glob("*.py"), *(p for room in ROOMS for p in (ROOT / room).glob("*.py"))])


def defined_labels() -> set[str]:
    """{"P1", "P2", ...}: the `### P<n>.` headings of docs/pitfalls.md (one numbering, the LLDS regulariser's own
    pitfalls included)."""
    return set(re.findall(r"^### (P\d+)\.", DOC.read_text(encoding="utf-8"), re.MULTILINE))


def test_every_cited_pitfall_label_is_defined():
    general = defined_labels()
    assert len(general) >= 25
    undefined = []
    for path in [*python_files(), ROOT / "README.md"]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            undefined += [f"{path.relative_to(ROOT)}:{n}: {label}" for label in re.findall(r"\bP\d+\b", line)
                          if label not in general]
    assert not undefined, "cited but not defined in docs/pitfalls.md:\n" + "\n".join(undefined)


def test_every_pitfall_in_a_test_name_is_defined():
    general = defined_labels()
    undefined = []
    for path in (ROOT / "tests").glob("test_*.py"):
        for name in re.findall(r"^def (test_\w+)", path.read_text(encoding="utf-8"), re.MULTILINE):
            m = re.match(r"test_((?:p\d+_)+)", name)  # test_p9_p10_...
            if m:
                labels = {f"P{n}" for n in re.findall(r"p(\d+)_", m.group(1))}
                undefined += [f"{path.name}::{name}: {label}" for label in sorted(labels - general)]
    assert not undefined, "test names carry pitfalls that docs/pitfalls.md does not define:\n" + "\n".join(undefined)


def test_every_test_the_document_names_exists():
    named = re.findall(r"\b(tests/\w+\.py)::(\w+)", DOC.read_text(encoding="utf-8"))
    assert len(named) >= 20
    missing = []
    for file, name in named:
        path = ROOT / file
        functions = set()
        if path.exists():
            functions = {node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                         if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if name not in functions:
            missing.append(f"{file}::{name}")
    assert not missing, "docs/pitfalls.md names tests that do not exist:\n" + "\n".join(missing)


def test_every_pitfall_entry_names_a_test_or_says_none():
    text = DOC.read_text(encoding="utf-8")
    for entry in re.split(r"^(?=### P\d+\.)", text, flags=re.MULTILINE)[1:]:
        pinned = re.search(r"\*\*Pinned by:\*\*(.*?)(?=^### |\Z)", entry, re.DOTALL | re.MULTILINE)
        assert pinned and ("::" in pinned.group(1) or "no test" in pinned.group(1).lower()), entry.splitlines()[0]


def test_code_cites_no_internal_notes():
    # Comments cite the paper (arXiv 2512.04220 v2: section, equation, table) or an upstream file, never the project's
    # working notes, which a clone does not have (nor may a test read them: fixtures ship in tests/fixtures), nor send a
    # user to the folder beside the checkout that holds them.
    pattern = re.compile(r"\bSPEC(?:\.md)? ?(?:part|Part|[A-E]\.\d|P\d|footnote)|\bPITFALLS\b|\bSTYLE R\d|shared/PITFALLS|\.\./shared/")
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in python_files() if p != Path(__file__).resolve()
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


DEPARTURES = ROOT / "docs" / "departures.md"
# a course copy (course/make_assignment.py leaves tests/course out) has the exercises' bodies blanked, their NOTE
# comments with them, so the lines below them move; there, only the numbering is checked
STUDENT_COPY = not (ROOT / "tests" / "course").is_dir()


def departure_links() -> dict[int, list[tuple[str, int]]]:
    """{n: [(file, line), ...]}: the entries `- **P<n>.**` of docs/departures.md (a label may key one entry in each of
    two sections, e.g. P14 for grpo.py and llds.py) and the code lines each one links."""
    entries, n = {}, None
    for line in DEPARTURES.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"- \*\*P(\d+)\.\*\* ", line):
            n = int(m.group(1))
            entries.setdefault(n, [])
        elif line.startswith("#"):
            n = None
        if n is not None:
            entries[n] += [(f, int(k)) for f, k in re.findall(r"\]\(\.\./([\w/]+\.py)#L(\d+)\)", line)]
    return entries


def test_each_departure_links_the_lines_that_carry_its_note():
    """docs/departures.md keys each departure by a pitfall label of docs/pitfalls.md (one label system) and links the
    lines where it acts; each linked line carries `NOTE(P<n>)`, and each such NOTE in a linked file is linked from
    an entry P<n>."""
    entries = departure_links()
    assert len(entries) >= 20, list(entries)
    assert not {f"P{n}" for n in entries} - defined_labels(), sorted(entries)  # every key is a pitfall label
    assert all(entries.values()), [n for n, links in entries.items() if not links]  # every entry links the code
    if STUDENT_COPY:
        return
    linked = {(f, k, n) for n, links in entries.items() for f, k in links}
    notes = set()
    for path in sorted({f for f, _, _ in linked}):
        for k, line in enumerate((ROOT / path).read_text(encoding="utf-8").splitlines(), 1):
            notes |= {(path, k, int(n)) for n in re.findall(r"NOTE\(P(\d+)\)", line)}
    wrong = [f"entry P{n} links {f}#L{k}, which has no NOTE(P{n})" for f, k, n in sorted(linked - notes)]
    wrong += [f"{f}:{k} has NOTE(P{n}), not linked from an entry P{n}" for f, k, n in sorted(notes - linked)]
    assert not wrong, "docs/departures.md and the code's NOTE(P<n>) lines disagree:\n" + "\n".join(wrong)


def test_code_marks_lines_with_one_label_system():
    """Every marked line cites a pitfall label `P<n>` (docs/pitfalls.md), a departure included (`NOTE(P<n>)`); the
    retired second system (`NOTE(departure N)`, "departure 13") appears nowhere in the code, tests or docs."""
    pattern = re.compile(r"NOTE\(departure|\b[Dd]epartures? \d")
    docs = [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")]
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in [*python_files(), *docs]
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)
            and p != Path(__file__).resolve()]
    assert not hits, "\n".join(hits)


UPSTREAM = ("scripts/data_process/",)  # Search-R1's own paths, quoted as the upstream code's (docs/pitfalls.md)


def test_every_command_and_path_names_a_file_that_exists():
    """Each file a `python` command runs in README.md, docs/ and the code's docstrings, and each path into a room
    (`lab/world0_policy`, `tests/fixtures/...`) that README.md and docs/ write, names a file or folder of this
    repository: a moved file takes its commands with it (issue 41)."""
    if STUDENT_COPY:
        pytest.skip("a course copy leaves the kit (course/) and its tests out, which the docs name")
    from conftest import ROOMS

    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    room_path = re.compile(rf"(?<![\w./-])((?:{'|'.join(ROOMS)}|docs)/[\w./-]*\w)")
    missing = []
    for path in [*docs, *python_files()]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            named = re.findall(r"\bpython3? (?:-m )?([\w./~-]+\.py)\b", line)
            named += room_path.findall(line) if path in docs else []
            missing += [f"{path.relative_to(ROOT)}:{n}: {f}" for f in named
                        if not (ROOT / f).exists() and not f.startswith(UPSTREAM)]
    assert not missing, "commands and paths that name no file of this repository:\n" + "\n".join(missing)
