"""Puts tests/ on the path (tiny.py); `--exercise NAME`: run only the tests tagged @pytest.mark.exercise(NAME), the
course's graded tests (tests/test_exercises.py, course/grade.py, docs/course.md); the `one_thread` fixture.

Convention (issue 22, enforced by tests/test_float_compare.py): a computed float is compared with a tolerance chosen
from its dtype (float32: rel 1e-5, abs 1e-6; Python floats: pytest.approx's defaults; a 0 by construction: abs 1e-12),
never with ==, torch.equal or the like, since another CPU rounds vectorised sums differently; a deliberate exact
comparison (the same computation twice on this machine, a bit-for-bit claim, a setting) ends its line `# exact: <why>`."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))


def pytest_addoption(parser):
    parser.addoption("--exercise", action="append", default=[], metavar="NAME",
                     help="run only the tests of this course exercise (repeatable; docs/course.md)")


def pytest_collection_modifyitems(config, items):
    names = config.getoption("--exercise")
    if not names:
        return
    chosen = [it for it in items if (m := it.get_closest_marker("exercise")) and m.args and m.args[0] in names]
    config.hook.pytest_deselected(items=[it for it in items if it not in chosen])
    items[:] = chosen


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): the tiny models are far
    faster so, with no contention with other CPU jobs; the thread count is restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok():
    """The tests' tokenizer (tiny.py); a module may define its own `tok`, which then takes precedence."""
    from tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    """A tiny random Qwen2 for `tok`, seed 0 (tiny.py)."""
    from tiny import build_model

    return build_model(tok, seed=0)
