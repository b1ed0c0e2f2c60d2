"""Rule: compare a computed float with a tolerance chosen from its dtype, not exactly, unless its line says `# exact:`.

The guard of issue 22 (a stored gradient one float32 ulp off on another x86 CPU failed the suite): it parses every .py
under tests/, scripts/, lab/, course/, gpu/ and benchmarks/ with `ast` and lists file:line of each comparison that holds
a float exactly:

- `==` / `!=` / `in` where a side is float-valued by its form: a float literal (`0.5`, `-1e-3`, `2 / 3`, `[0.0, 1.0]`,
  `{"k": 0.5}`, a tuple element), `float(...)`, `round(x, n)`, `math.*(...)`, or a comprehension of such;
- `==` / `!=` with `.item()` or `.tolist()` on a side, unless the other side is an int / bool / str / None literal
  (`.item() == 3`, `.tolist() == [1, pad]`) or the tensor is visibly integer (`.long()`, `dtype=torch.long`, ...);
- `(a == b).all()` / `.any()` / `torch.all(a == b)` of tensors not visibly integer;
- a whole JSON document compared with `==` (`json.loads(...) == ...`): every float inside it is compared exactly;
- `torch.equal`, `np.array_equal`, `np.array_equiv`, `np.testing.assert_array_equal` / `assert_equal` of tensors not
  visibly integer, and tolerance compares with every tolerance 0 (`assert_close(a, b, rtol=0, atol=0)`,
  `math.isclose(a, b, rel_tol=0)`, `pytest.approx(x, rel=0, abs=0)`);
- `pytest.approx` of a str / f-string / bool / None (it compares those exactly, or raises on pytest >= 9.2).

`x == pytest.approx(...)` is a tolerance, and INDICATORS (em_check, sub_em, an Episode's reward) against 0.0 / 1.0 are
exact by construction (a branch returns the constant). Tolerances: float32 values (tensors, metrics taken from them)
rel 1e-5, abs 1e-6 (~80 ulps: another CPU's vector width reorders float32 sums; make_snapshots.RTOL says more); Python
float64 arithmetic pytest.approx's defaults (rel 1e-6, abs 1e-12); a 0 by construction (a masked or clamped term) abs
1e-12. A determinism claim may stay exact, marked `# exact: <why>` on one of its lines: both sides computed here, in one
run on one machine, by the same code (a resume, the same pass twice, a cached index), or bit for bit being the very
claim of the code (test_retriever.py's docstring). Two code paths that round differently (bf16 vs fp32 inputs,
micro-batched vs not, a re-implementation with other arithmetic) get a tolerance. Settings compared as given (a parsed
`--clip-eps 0.2`) are marked too. The guard reads forms, not types: `hits == expected` with floats inside passes it
unseen, so such comparisons were reviewed by hand (issue 22) and carry the mark as well.
"""

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "scripts", "lab", "course", "gpu", "benchmarks")  # every .py under these, recursively ...
NOT_SCANNED = ("tests/course/wrong",)  # ... but the course's wrong answers: implementations (of grpo.py etc.), not checks
INDICATORS = {"em_check", "sub_em"}  # return 0.0 or 1.0 by a branch (a string match), no arithmetic: exact on any CPU
INDICATOR_ATTRS = {"reward"}  # Episode.reward = em_check(...)

_INT_METHODS = {"long", "int", "short", "bool", "argmax", "argmin", "nonzero", "argsort", "numel", "count_nonzero"}
_EXACT_CALLS = {"equal", "array_equal", "array_equiv", "assert_array_equal", "assert_equal"}
_TOLERANCES = {"isclose": ("rel_tol", "abs_tol"), "assert_close": ("rtol", "atol"), "allclose": ("rtol", "atol"),
               "approx": ("rel", "abs")}
_NUMERIC_CALLS = {"len", "sum", "int", "float", "abs", "round", "min", "max"}
_MATH_NOT_FLOAT = {"floor", "ceil", "isclose", "isnan", "isinf", "isfinite", "comb", "perm", "gcd", "factorial", "isqrt",
                   "lcm"}


def _attr(node) -> str | None:
    """The called name of a call (`torch.equal(...)` -> "equal", `x.item()` -> "item", `float(x)` -> "float")."""
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return None


def _listy(node) -> bool:
    return isinstance(node, (ast.List, ast.Tuple)) or (isinstance(node, ast.BinOp) and (
        (isinstance(node.op, ast.Mult) and isinstance(node.left, (ast.List, ast.Tuple)))
        or (isinstance(node.op, ast.Add) and _listy(node.left) and _listy(node.right))))


def _leaves(node):
    """The elements of a (nested) list / tuple / set literal, `[x] * n + [y] * m` included; else the node itself."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        for e in node.elts:
            yield from _leaves(e)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.left, (ast.List, ast.Tuple)):
        yield from _leaves(node.left)  # [x] * n: n is a count
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _listy(node):
        yield from _leaves(node.left)
        yield from _leaves(node.right)
    else:
        yield node


def _number(node):
    """The value of a numeric literal (`3`, `-0.5`), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _number(node.operand)
        return None if v is None else -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    return None


def _exact_literal(node) -> bool:
    """An int / bool / str / bytes / None literal, or a list / tuple / set of them: exact by nature."""
    if isinstance(node, ast.Constant):
        return not isinstance(node.value, (float, complex))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _exact_literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_exact_literal(e) for e in node.elts)
    return False


def _int_literal_container(node) -> bool:
    """A list / tuple literal of int constants, possibly with names among them (`[[5, 6, pad], [pad, 5, 8]]`)."""
    if not isinstance(node, (ast.List, ast.Tuple)):
        return False
    leaves = list(_leaves(node))
    consts = [x for x in leaves if isinstance(x, ast.Constant)]
    return bool(consts) and all(_exact_literal(x) for x in consts) and not any(_floaty(x) for x in leaves)


def _visibly_int(node) -> bool:
    """An expression whose value is recognisably integer, bool or str: an exact literal, `torch.tensor(<int
    literals>)`, `x.long()`, `x.argmax()`, `len(x)`, a call with `dtype=torch.long`, ... (or `.item()` / `.tolist()`
    of one of those)."""
    if _exact_literal(node) or _int_literal_container(node) or isinstance(node, (ast.Compare, ast.JoinedStr)):
        return True
    name = _attr(node)
    if name in _INT_METHODS or name in {"len", "int", "bool", "str"}:
        return True
    if name in {"item", "tolist"} and isinstance(node.func, ast.Attribute):
        return _visibly_int(node.func.value)
    if isinstance(node, ast.Call):
        dtype = next((ast.unparse(k.value) for k in node.keywords if k.arg == "dtype"), "")
        if any(t in dtype for t in ("long", "int", "bool", "uint8")):
            return True
        if name in {"tensor", "as_tensor", "LongTensor", "BoolTensor"} and node.args and not dtype \
                and (_exact_literal(node.args[0]) or _int_literal_container(node.args[0])):
            return True
    return False


def _pathlike(node) -> bool:
    """`ROOT / "tests"`, `tmp_path / f"step_{n}"`: a division with a string in it is a path, not a number."""
    if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and (_pathlike(node.left)
                                                                              or _pathlike(node.right))


def _numeric(node) -> bool:
    return _number(node) is not None or _floaty(node) or _itemish(node) or _attr(node) in _NUMERIC_CALLS \
        or (isinstance(node, ast.BinOp) and _numeric(node.left) and _numeric(node.right))


def _floaty(node) -> bool:
    """A float-valued expression by its form: a float literal, a true division of numbers, float(...), round(x, n),
    math.f(...), a container or comprehension of such."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, float)
    if isinstance(node, ast.UnaryOp):
        return _floaty(node.operand)
    if isinstance(node, ast.BinOp):
        if _pathlike(node):
            return False
        if isinstance(node.op, ast.Div):
            return _numeric(node.left) or _numeric(node.right)
        return _floaty(node.left) or _floaty(node.right)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return any(_floaty(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(_floaty(v) for v in node.values)
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        return _floaty(node.elt) or _itemish(node.elt)
    if isinstance(node, ast.DictComp):
        return _floaty(node.value) or _itemish(node.value)
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name) and (f.id == "float" or (f.id == "round" and len(node.args) == 2)):
            return True
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math" \
                and f.attr not in _MATH_NOT_FLOAT:
            return True
    return False


def _itemish(node) -> bool:
    """`.item()` / `.tolist()` of a tensor that is not visibly integer: a float unless shown otherwise."""
    return _attr(node) in {"item", "tolist"} and isinstance(node.func, ast.Attribute) and not _visibly_int(node)


def _json_doc(node) -> bool:
    return _attr(node) in {"loads", "load"} and isinstance(node.func, ast.Attribute) \
        and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"


def _indicator(node) -> bool:
    """em_check(...), sub_em(...), `e.reward`, or a list of them: 0.0 or 1.0 by construction."""
    if isinstance(node, ast.Call):
        return _attr(node) in INDICATORS
    if isinstance(node, ast.Attribute):
        return node.attr in INDICATOR_ATTRS
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return _indicator(node.elt)
    if isinstance(node, (ast.List, ast.Tuple)):
        return bool(node.elts) and all(_indicator(e) for e in node.elts)
    return False


def _unit_literal(node) -> bool:
    """0.0 / 1.0, or a list literal of them (`[1.0] * 3 + [0.0] * 3`): the values an indicator takes."""
    leaves = list(_leaves(node))
    return bool(leaves) and all(_number(x) in (0, 1) for x in leaves)


def _zero(node) -> bool:
    return _number(node) == 0


def _pairs(a, b):
    """The pairs a comparison really compares: two tuple literals of one length element by element."""
    if isinstance(a, ast.Tuple) and isinstance(b, ast.Tuple) and len(a.elts) == len(b.elts):
        for x, y in zip(a.elts, b.elts):
            yield from _pairs(x, y)
    else:
        yield a, b


def _exact_pair(op, a, b) -> str | None:
    """Why `a op b` compares a float exactly, or None."""
    if _attr(a) == "approx" or _attr(b) == "approx":  # `x == pytest.approx(y, ...)`: a tolerance (its args: below)
        return None
    if (_indicator(a) and (_unit_literal(b) or _indicator(b))) or (_indicator(b) and _unit_literal(a)):
        return None
    if _floaty(a) or _floaty(b):
        return "a float compared exactly"
    if not isinstance(op, (ast.Eq, ast.NotEq)):
        return None
    if (_itemish(a) and not _visibly_int(b)) or (_itemish(b) and not _visibly_int(a)):
        return ".item() / .tolist() of a tensor compared exactly"
    if _json_doc(a) or _json_doc(b):
        return "a JSON document (its floats) compared exactly"
    return None


def _problems(tree) -> list[tuple[ast.AST, str]]:
    """(node, what) for each exact float comparison in a parsed module, marked or not."""
    out = []
    reduced = {}  # id(Compare) -> the .all() / .any() / torch.all(...) around it
    for node in ast.walk(tree):
        if _attr(node) in {"all", "any"}:
            inner = node.args[0] if node.args else node.func.value if isinstance(node.func, ast.Attribute) else None
            if isinstance(inner, ast.Compare):
                reduced[id(inner)] = node
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, sides, sides[1:]):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                why = next((w for x, y in _pairs(a, b) if (w := _exact_pair(op, x, y))), None)
                if why is None and id(node) in reduced and isinstance(op, (ast.Eq, ast.NotEq)) \
                        and not (_visibly_int(a) or _visibly_int(b)):
                    why, node_shown = "tensors compared elementwise exactly", reduced[id(node)]
                else:
                    node_shown = node
                if why:
                    out.append((node, f"`{ast.unparse(node_shown)[:90]}`: {why}"))
                    break
        elif isinstance(node, ast.Call):
            name = _attr(node)
            kw = {k.arg: k.value for k in node.keywords}
            shown = f"`{ast.unparse(node)[:90]}`"
            if name in _EXACT_CALLS and node.args and not any(_visibly_int(x) for x in node.args):
                out.append((node, f"{shown}: an exact equality of tensors / arrays"))
            elif name in _TOLERANCES and all(t in kw and _zero(kw[t]) for t in _TOLERANCES[name]):
                out.append((node, f"{shown}: a tolerance compare with zero tolerances"))
            elif name == "isclose" and "rel_tol" in kw and _zero(kw["rel_tol"]) and "abs_tol" not in kw:
                out.append((node, f"{shown}: math.isclose with rel_tol=0 and no abs_tol"))
            elif name == "approx" and node.args and (
                    isinstance(node.args[0], ast.JoinedStr) or _attr(node.args[0]) in {"str", "repr", "format"}
                    or (isinstance(node.args[0], ast.Constant) and not isinstance(node.args[0].value, (int, float)))
                    or (isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, bool))):
                out.append((node, f"{shown}: pytest.approx of a non-number (compared exactly, or a TypeError)"))
    return out


def exact_float_comparisons(source: str, filename: str = "<string>") -> list[str]:
    """The exact float comparisons in a Python source, as "file:line: what" lines; a line range (a statement's lines)
    that carries `# exact:` is allowed. Empty when the source keeps the rule."""
    tree = ast.parse(source, filename=filename)
    marked = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT and tok.string.lstrip("# ").startswith("exact:")}
    stmts = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
    found = set()
    for node, what in _problems(tree):
        # the innermost statement around the node: `# exact:` on any of its lines (a wrapped assert) allows it
        around = min((s for s in stmts if s.lineno <= node.lineno and node.end_lineno <= s.end_lineno
                      and not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While,
                                             ast.If, ast.With, ast.Try))),
                     key=lambda s: s.end_lineno - s.lineno, default=node)
        lines = range(min(around.lineno, node.lineno), max(around.end_lineno, node.end_lineno) + 1)
        if not marked.intersection(lines):
            found.add((node.lineno, f"{filename}:{node.lineno}: {what}"))
    return [msg for _, msg in sorted(found)]


def scanned_files() -> list[Path]:
    """Every .py the guard reads: the SCANNED folders and below."""
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py")
                  if not any(p.is_relative_to(ROOT / skip) for skip in NOT_SCANNED))


def test_no_exact_float_comparison_in_tests_scripts_benchmarks():
    found = [msg for p in scanned_files()
             for msg in exact_float_comparisons(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not found, "exact float comparisons (give each a dtype-chosen tolerance, or end the line with " \
                      "`# exact: <why>` if both sides are this run's same computation):\n" + "\n".join(found)


BAD = {
    "float literal": "assert m['grpo/clip_frac'] == 0.5",
    "negative literal": "assert x != -1e-3",
    "true division": "assert f1 == 2 / 3",
    "list of floats": "assert got == [0.0, 1.5]",
    "dict of floats": "assert metrics == {'loss': 0.25}",
    "item vs item": "assert loss_a.item() == loss_b.item()",
    "item vs stored": "assert loss.item() == c['loss']",
    "tolist vs stored": "assert grad.tolist() == c['grad']",
    "float()": "assert float(m['x']) == y",
    "round": "assert round(x, 4) == y",
    "comprehension of items": "assert [t.item() for t in ts] == want",
    "elementwise all": "assert (a == b).all()",
    "torch.all": "assert torch.all(a == b)",
    "json document": "assert stored == json.loads(json.dumps(make()))",
    "torch.equal": "assert torch.equal(a, b)",
    "np.array_equal": "assert np.array_equal(a, b)",
    "assert_array_equal": "np.testing.assert_array_equal(a, b)",
    "assert_close zero": "torch.testing.assert_close(a, b, rtol=0, atol=0)",
    "isclose zero": "assert math.isclose(a, b, rel_tol=0)",
    "approx zero": "assert a == pytest.approx(b, rel=0, abs=0)",
    "approx of str": "assert s == pytest.approx('0.5')",
    "approx of f-string": "assert s == pytest.approx(f'{x:.3f}')",
    "approx of bool": "assert s == pytest.approx(True)",
    "in floats": "assert x in (0.5, 1.0)",
    "wrapped assert": "assert (loss.item()\n        == want), 'message'",
    "tuple element": "assert (n, loss.item()) == (3, want)",
    "indicator vs non-unit": "assert em_check(a, b) == 0.5",
    "metric vs unit": "assert m['llds/gate_rate'] == 1.0",
    "list of items": "assert [m['x'] for m in ms] == [0.0, 1.0]",
}
GOOD = {
    "len": "assert len(x) == 3",
    "int item": "assert mask.sum().item() == 3",
    "int tolist": "assert ids.tolist() == [1, 2, 3]",
    "long tolist": "assert a.long().tolist() == b",
    "argmax": "assert (a.argmax(-1) == b).all()",
    "int tensor equal": "assert torch.equal(seg.long(), torch.tensor(c['seg']))",
    "int literal tensor": "assert torch.equal(x, torch.tensor([0, 1, 2]))",
    "string": "assert name == 'grpo'",
    "approx": "assert x == pytest.approx(0.5, rel=1e-5, abs=1e-6)",
    "item approx": "assert loss.item() == pytest.approx(want, rel=1e-5) and [t.item() for t in ts] != pytest.approx(w)",
    "isclose": "assert math.isclose(x, 0.5, rel_tol=1e-5, abs_tol=1e-6)",
    "assert_close": "torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)",
    "isclose abs only": "assert math.isclose(x, 0.0, rel_tol=0, abs_tol=1e-12)",
    "marked": "assert a.item() == b.item()  # exact: the same call twice in one process",
    "marked wrapped": "assert (a.tolist()\n        == b.tolist())  # exact: resume is bit for bit on one machine",
    "ordering": "assert x.item() < 0.5",
    "int comparisons": "assert (n_on, n_units) == (3, 4) and step != 0",
    "paths": "assert folder == tmp_path / 'checkpoints' / f'step_{n:06d}' and ROOT / 'x' in files",
    "int list with names": "assert b['input_ids'].tolist() == [[5, 6, pad], [pad, 5, 8]]",
    "long dtype": "assert torch.equal(segments(keep), torch.ones(1, 8, dtype=torch.long))",
    "indicators": "assert em_check('a', ['a']) == 1.0 and E.sub_em(x, y) == 0.0 and e.reward == 1.0",
    "indicator tuple": "assert (e.num_turns, e.reward) == (3, 1.0)",
    "indicator list": "assert [e.reward for e in eps] == [1.0] * 3 + [0.0] * 3",
}


@pytest.mark.parametrize("name", BAD)
def test_the_guard_flags_an_exact_float_comparison(name):
    got = exact_float_comparisons(BAD[name], "bad.py")
    assert len(got) == 1 and got[0].startswith("bad.py:1: "), (name, got)


@pytest.mark.parametrize("name", GOOD)
def test_the_guard_allows_tolerances_integers_and_marked_lines(name):
    assert exact_float_comparisons(GOOD[name], "good.py") == [], name


def test_the_guard_reads_files():
    assert len(scanned_files()) > 30 and ROOT / "tests" / "test_exercises.py" in scanned_files()  # a student copy's too
