"""The suite's one timeout for subprocesses and waits: it guards against a hang, never measures speed.

No test asserts a duration (speed belongs in benchmarks/): a machine busy with other jobs (a user's laptop, two
training runs beside README's `pytest -n 2`) makes every step slower, and the results must not change. A subprocess or
a wait that has not finished after HANG_S seconds is taken for a hang, and the failure says so.
"""

import subprocess
import threading

import pytest

HANG_S = 3600  # seconds: far beyond any test's subprocess on a loaded 2-core machine (the slowest: ~6 min at load 30)


def hung(what: str) -> None:
    """Fail the test: `what` (a command, a line awaited) did not happen within HANG_S seconds."""
    pytest.fail(f"{what}: nothing after {HANG_S} s, taken for a hang (this timeout guards only against hangs; no "
                "test asserts a duration)", pytrace=False)


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, **kwargs) with HANG_S as its timeout (`hung` if it runs past it)."""
    try:
        return subprocess.run(cmd, timeout=HANG_S, **kwargs)
    except subprocess.TimeoutExpired:
        hung(f"{' '.join(map(str, cmd))[:300]} still running")


def readline(proc: subprocess.Popen, what: str = "a line") -> str:
    """The next line of `proc`'s stdout (a text pipe), waiting up to HANG_S seconds for it (`hung`, and the process
    killed, if none came); "" once the process has closed its stdout."""
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(HANG_S)
    if not line:
        proc.kill()
        hung(f"{what} from {' '.join(map(str, proc.args))[:300]}")
    return line[0]


def wait(proc: subprocess.Popen, what: str = "") -> tuple[str, str]:
    """proc.communicate() within HANG_S seconds: (stdout, stderr); `hung` (and the process killed) if it runs past."""
    try:
        return proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        hung(what or f"{proc.args} still running")
