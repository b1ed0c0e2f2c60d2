"""The grading plugin of course/grade.py, copied into each graded tree as tests/_grading.py. It reads grading.json in
the working folder and works in one of three modes:

* plan (pytest `-p _grading`, our code only): each exercise function is wrapped; every call a test makes to it (not
  the calls the functions make to each other) is written down with its *inputs only* (arguments, which tensors
  require a gradient, a method's object state before the call): the call plan, one JSON line per test.
* run (the *runner*: this file run by python in the runner's tree; the student's functions, no pytest, no test file,
  no snapshot): each planned call is made on the student's function with the planned inputs, and what it returned
  or raised is written down and, for a returned tensor that has a gradient, its Jacobian with respect to each input
  tensor that requires one (a method: also its object's state after the call). The runner holds inputs only: no
  expected value exists in its process, and it judges nothing.
* replay (the *judge*: pytest, our code only, never the student's): each exercise function is replaced by a stub that
  hands the test, call by call, what the runner recorded (a tensor with Jacobians has the recorded value and, through
  autograd, the recorded gradient J^T g), and the test's own assertions decide. The outcome of every test goes to
  grading.json's "results" file.

In plan and replay, grading.json's "seed" (secret, new at each grading) draws the fresh cases, whose answers come
from our functions (`ours`); the runner only ever sees their inputs.

So the verdicts, and every expected value, live in processes in which no student code runs.
"""

import builtins
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

CONFIG = json.loads(Path("grading.json").read_text(encoding="utf-8"))
MAX_STR = 120  # characters of a string the runner records: a grader's message quotes at most this much of it
MAX_JACOBIAN = 4096  # elements of an output tensor whose Jacobian is recorded
UNRECORDABLE = "grader: a value it cannot record (tensors, numbers, strings; lists, tuples, dicts and sets of them)"


# ---------------------------------------------------------------------------------------------------------------------
# values <-> JSON


def encode(x, depth=0):
    """A returned value as JSON: tensors, tuples and dicts tagged; anything else is refused."""
    if depth > 8:
        raise TypeError("a value nested deeper than 8 levels")
    if isinstance(x, torch.Tensor):
        t = torch.Tensor.cpu(torch.Tensor.detach(x))
        return {"__tensor__": torch.Tensor.tolist(t), "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape)}
    if x is None or isinstance(x, bool):
        return x if x is None else bool(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str.__str__(x)[:MAX_STR]
    if isinstance(x, tuple):
        return {"__tuple__": [encode(v, depth + 1) for v in x]}
    if isinstance(x, list):
        return [encode(v, depth + 1) for v in x]
    if isinstance(x, (set, frozenset)):
        return {"__set__": sorted((encode(v, depth + 1) for v in x), key=repr)}
    if isinstance(x, dict):
        return {"__dict__": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    raise TypeError(f"cannot record a {type(x).__name__}")


def decode(x):
    if isinstance(x, list):
        return [decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    if "__tensor__" in x:
        return torch.tensor(x["__tensor__"], dtype=getattr(torch, x["dtype"])).reshape(x["shape"])
    if "__tuple__" in x:
        return tuple(decode(v) for v in x["__tuple__"])
    if "__set__" in x:
        return {decode(v) for v in x["__set__"]}
    return {_hashable(decode(k)): decode(v) for k, v in x["__dict__"]}


def _hashable(k):
    return tuple(k) if isinstance(k, list) else k


def encode_input(x, memo: dict, depth=0):
    """A call's input as JSON, in full: a tensor with its dtype and whether it requires a gradient (a tensor passed
    twice is written once and referred to after), the test's tokenizer by name (tests/tiny.py builds it again), an
    exercise class's object as its state; anything else is refused (the plan must hold inputs only)."""
    if depth > 8:
        raise TypeError("an input nested deeper than 8 levels")
    if isinstance(x, torch.Tensor):
        if id(x) in memo:
            return {"__ref__": memo[id(x)]}
        memo[id(x)] = len(memo)
        return {**encode(x), "grad": bool(x.requires_grad), "ref": memo[id(x)]}
    if any(c.__name__ == "PreTrainedTokenizerBase" for c in type(x).__mro__):
        return {"__tokenizer__": "tiny"}
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, (tuple, list, set, frozenset)):
        items = [encode_input(v, memo, depth + 1) for v in x]
        return items if isinstance(x, list) else {"__tuple__": items} if isinstance(x, tuple) else \
            {"__set__": items}
    if isinstance(x, dict):
        return {"__dict__": [[encode_input(k, memo, depth + 1), encode_input(v, memo, depth + 1)]
                             for k, v in x.items()]}
    if hasattr(x, "__dict__") and type(x).__module__ in {m for m, _ in CONFIG["functions"]}:
        return {"__object__": [type(x).__module__, type(x).__qualname__],
                "state": encode_input(_state(x), memo, depth + 1)}
    return encode(x, depth)


def decode_input(x, memo: dict):
    """encode_input's inverse: new leaf tensors (requiring a gradient where the test's did), the tokenizer, objects
    made without running their class's __init__ and given their state."""
    if isinstance(x, list):
        return [decode_input(v, memo) for v in x]
    if not isinstance(x, dict):
        return x
    if "__ref__" in x:
        return memo[x["__ref__"]]
    if "__tensor__" in x:
        t = decode(x)
        memo[x["ref"]] = t.requires_grad_(True) if x.get("grad") and t.is_floating_point() else t
        return memo[x["ref"]]
    if "__tokenizer__" in x:
        from tiny import build_tokenizer

        return build_tokenizer()
    if "__tuple__" in x:
        return tuple(decode_input(v, memo) for v in x["__tuple__"])
    if "__set__" in x:
        return {decode_input(v, memo) for v in x["__set__"]}
    if "__object__" in x:
        import importlib

        cls = importlib.import_module(x["__object__"][0])
        for part in x["__object__"][1].split("."):
            cls = getattr(cls, part)
        obj = object.__new__(cls)
        obj.__dict__.update(decode_input(x["state"], memo))
        return obj
    return {_hashable(decode_input(k, memo)): decode_input(v, memo) for k, v in x["__dict__"]}


def _grad_inputs(args, kwargs) -> list[tuple]:
    """(key, tensor) of the inputs that require a gradient; key is an argument's position or name."""
    items, seen, out = list(enumerate(args)) + sorted(kwargs.items()), set(), []
    for k, v in items:
        if isinstance(v, torch.Tensor) and v.requires_grad and id(v) not in seen:  # a tensor passed twice counts once
            seen.add(id(v))
            out.append((k, v))
    return out


def jacobians(out, inputs) -> list:
    """For each tensor in `out` (itself, or a tuple's element) that has a gradient: [path, {input key: J}]."""
    found = [((), out)] if isinstance(out, torch.Tensor) else \
        [((i,), v) for i, v in enumerate(out)] if isinstance(out, tuple) else []
    result = []
    for path, t in found:
        if not (isinstance(t, torch.Tensor) and t.requires_grad and inputs and t.numel() <= MAX_JACOBIAN):
            continue
        flat, rows = t.reshape(-1), {str(k): [] for k, _ in inputs}
        for i in range(flat.numel()):
            grads = torch.autograd.grad(flat[i], [x for _, x in inputs], retain_graph=True, allow_unused=True)
            for (k, x), g in zip(inputs, grads):
                rows[str(k)].append((torch.zeros_like(x) if g is None else g).reshape(-1).tolist())
        result.append([list(path), rows])
    return result


class _Played(torch.autograd.Function):
    """A recorded value whose gradient with respect to xs is the recorded Jacobians' J^T grad (J may hold NaN or inf:
    they reach the gradient only, as they did in the runner)."""

    @staticmethod
    def forward(ctx, value, jacobians, *xs):
        ctx.jacobians, ctx.shapes = jacobians, [(x.shape, x.dtype) for x in xs]
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        g = grad.reshape(-1).double()
        return (None, None, *[(J.double().T @ g).reshape(shape).to(dtype)
                              for J, (shape, dtype) in zip(ctx.jacobians, ctx.shapes)])


def with_jacobians(out, jac, args, kwargs):
    """`out` with each tensor that had a gradient in the runner given the recorded value and Jacobians."""
    inputs = dict((str(k), x) for k, x in _grad_inputs(args, kwargs))
    for path, rows in jac:
        t = out if not path else out[path[0]]
        used = [(torch.tensor(J, dtype=torch.float64).reshape(t.numel(), -1), inputs[key])
                for key, J in rows.items() if key in inputs]
        if used:
            t = _Played.apply(t, [J for J, _ in used], *[x for _, x in used])
        out = t if not path else out[:path[0]] + (t,) + out[path[0] + 1:]
    return out


def _state(obj) -> dict:
    return {k: v for k, v in vars(obj).items() if not k.startswith("__")}


# ---------------------------------------------------------------------------------------------------------------------
# record (runner) and replay (judge)

_calls: list = []  # this test's calls
_depth = [0]
_test = {"id": None}
_exercise_of: dict = {}  # test id -> its exercise (the judge's results say which)


def _recorder(name, fn, method):
    def wrapper(*args, **kwargs):
        if _depth[0]:  # a call from another exercise function: not the test's
            return fn(*args, **kwargs)
        _depth[0] += 1
        call = {"name": name}
        try:
            out = fn(*args, **kwargs)
        except BaseException as err:
            kind = type(err).__name__
            call["raise"] = kind if getattr(builtins, kind, None) is type(err) else "Exception"  # its type only: a
            raise  # message could carry text the student's code read (a dependency's source), a grading at a time
        else:
            try:
                call["value"], call["jac"] = encode(out), jacobians(out, _grad_inputs(args, kwargs))
            except Exception as err:
                call = {"name": name, "raise": "TypeError", "msg": UNRECORDABLE}
            return out
        finally:
            _depth[0] -= 1
            if method:
                try:
                    call["state"] = encode(_state(args[0]))
                except Exception:
                    pass
            _calls.append(call)

    return wrapper


def _planner(name, fn, method):
    def wrapper(*args, **kwargs):
        if _depth[0]:  # a call from another exercise function: not the test's
            return fn(*args, **kwargs)
        memo = {}
        _calls.append({"name": name, "args": encode_input(args, memo), "kwargs": encode_input(kwargs, memo)})
        _depth[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _depth[0] -= 1

    return wrapper


def run_plan():
    """The runner: every planned call made on the student's functions (recorded by _recorder), one line per test.

    Each test's calls run in a child of this process (a fork: the student's code never runs here), whose calls come
    back through a pipe of its own; only this process holds the record's file descriptor (the child closes it before
    any call), and this process is not dumpable (no ptrace, no /proc/<pid>/fd or mem of it for the child) and, in the
    sandbox, the PID namespace's init, which a signal from inside cannot stop. So the student's code can choose what
    its own functions return, and nothing else: not another test's line, not the record's framing."""
    import ctypes
    import os
    import signal

    sys.path[:0] = [os.getcwd()]
    targets = {}
    for owner, attr, qualified, method in list(_targets()):
        setattr(owner, attr, _recorder(qualified, getattr(owner, attr), method))
        targets[qualified] = (owner, attr)
    plan = json.loads(Path(CONFIG["plan"]).read_text(encoding="utf-8"))
    record = os.fdopen(CONFIG["record_fd"], "a", encoding="utf-8")  # the grader's file: the tree is read-only
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no handler: as the namespace's init, not stopped from inside
    for test, calls in plan.items():
        record.write(json.dumps({"test": test, "calls": _calls_in_child(calls, targets, record.fileno())}) + "\n")
        record.flush()


MAX_CHILD = 20_000_000  # bytes of one test's calls read back from its child


def _calls_in_child(calls: list, targets: dict, record_fd: int) -> list:
    """One test's planned calls made in a forked child; returns the calls it recorded (a list of dicts, else [])."""
    import os
    import select

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no record, then the student's functions
        try:
            os.close(read)
            os.close(record_fd)
            _calls.clear()
            for call in calls:
                if call["name"] not in targets:  # not one of this exercise's functions: replayed as not graded
                    break
                owner, attr = targets[call["name"]]
                memo = {}
                args, kwargs = decode_input(call["args"], memo), decode_input(call["kwargs"], memo)
                try:
                    getattr(owner, attr)(*args, **kwargs)
                except Exception:
                    pass  # recorded
            data = json.dumps(list(_calls)).encode()
            while data:
                data = data[os.write(write, data):]
        finally:
            os._exit(0)
    os.close(write)
    chunks, size, done = [], 0, False
    while size <= MAX_CHILD:  # until the child has ended and its pipe is drained (a process it left behind that
        ready, _, _ = select.select([read], [], [], 0.05)  # holds the pipe open is not waited for)
        chunk = os.read(read, 1 << 20) if ready else b""
        chunks.append(chunk)
        size += len(chunk)
        if ready and not chunk:  # EOF: nobody holds the pipe any more
            break
        if not ready:
            if done:
                break
            done = os.waitpid(pid, os.WNOHANG)[0] == pid  # one more pass to drain what it wrote before it ended
    os.close(read)
    if not done:
        os.waitpid(pid, 0)
    try:
        got = json.loads(b"".join(chunks)) if size <= MAX_CHILD else None
    except (ValueError, RecursionError):
        got = None
    return got if isinstance(got, list) and all(isinstance(c, dict) for c in got) else []


def _replayer(name, method):
    def stub(*args, **kwargs):
        calls = RECORDED.get(_test["id"])
        if calls is None:
            raise RuntimeError("not graded: the runner stopped before this test (a crash, os._exit or the time limit)")
        if not calls or calls[0].get("name") != name:
            raise RuntimeError(f"not graded: the runner recorded no call of {name} here")
        call = calls.pop(0)
        if method and isinstance(call.get("state"), dict):
            for k, v in decode(call["state"]).items():
                if not str(k).startswith("__"):
                    setattr(args[0], str(k), v)
        if "raise" in call:
            kind = getattr(builtins, str(call["raise"]), Exception)
            kind = kind if isinstance(kind, type) and issubclass(kind, Exception) else Exception
            raise kind(UNRECORDABLE if call.get("msg") == UNRECORDABLE else "")
        return with_jacobians(decode(call.get("value")), call.get("jac") or [], args, kwargs)

    return stub


RECORDED: dict = {}
ORIGINALS: dict = {}  # (owner, attribute) -> our function, before it was wrapped (plan) or replaced by a stub (replay)


@contextmanager
def ours():
    """Our functions back in place for the block: a fresh case's answer (tests/test_exercises.py `fresh`) is ours,
    never the recorded one, and drawing it is not a planned call."""
    now = {key: getattr(*key) for key in ORIGINALS}
    for (owner, attr), fn in ORIGINALS.items():
        setattr(owner, attr, fn)
    try:
        yield
    finally:
        for (owner, attr), fn in now.items():
            setattr(owner, attr, fn)


def _targets():
    """(owner object, attribute, qualified name, is a method) of each function named in grading.json."""
    import importlib

    for module, name in CONFIG["functions"]:
        owner = importlib.import_module(module)
        *cls, attr = name.split(".")
        for c in cls:
            owner = getattr(owner, c)
        yield owner, attr, f"{module}.{name}", bool(cls)


def pytest_configure(config):
    if CONFIG["mode"] == "replay":
        by_exercise = json.loads(Path(CONFIG["recorded"]).read_text(encoding="utf-8"))
        RECORDED.update({(ex, test): calls for ex, tests in by_exercise.items() for test, calls in tests.items()})
    for owner, attr, qualified, method in list(_targets()):
        fn = getattr(owner, attr)
        ORIGINALS[(owner, attr)] = fn
        setattr(owner, attr, _planner(qualified, fn, method) if CONFIG["mode"] == "plan" else
                _replayer(qualified, method))


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("exercise")
    ex = marker.args[0] if marker and marker.args else ""
    _calls.clear()
    _exercise_of[item.nodeid] = ex
    _test["id"] = item.nodeid if CONFIG["mode"] == "plan" else (ex, item.nodeid)


def pytest_runtest_teardown(item):
    if CONFIG["mode"] == "plan":
        with open(CONFIG["plan"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": item.nodeid, "exercise": _exercise_of[item.nodeid], "calls": list(_calls)})
                    + "\n")


def pytest_runtest_logreport(report):
    if CONFIG["mode"] != "replay" or (report.when != "call" and report.passed):
        return
    message = ""
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    with open(CONFIG["results"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"test": report.nodeid, "exercise": _exercise_of.get(report.nodeid, ""),
                            "when": report.when, "outcome": report.outcome, "message": message}) + "\n")


if __name__ == "__main__" and CONFIG["mode"] == "run":
    run_plan()
