"""README.md's set-up commands are what CI runs: a fresh virtual env, the same install lines in the same order, and
the README's test command. So a green CI means a new user following the README gets a green suite."""

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
    assert readme[-1] == "pytest -q"  # the test command
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    venv = next(i for i, line in enumerate(ci) if line.startswith("python3 -m venv "))
    assert ci[venv + 1].startswith(". ") and ci[venv + 1].rstrip("\"").endswith("/bin/activate")  # and it is used
    commands = [line for line in ci[venv + 2:] if not line.startswith(("python --version", "pip list"))]
    assert commands == readme[1:], (commands, readme[1:])
