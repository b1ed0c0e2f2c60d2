"""One concept per file (issue 13): who imports whom among the top-level files, no cycle, nothing imports train.py;
train.py stays short enough to read beside the paper; --help is grouped by Args' sections; a missing default data
file says how to make it; a loss metric without a declared reduction is an error, not a silently wrong number."""

import ast
import sys
from pathlib import Path

import pytest

import hang

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODULES = sorted(p.stem for p in ROOT.glob("*.py"))
# Lines per top-level file: 450, but train.py 470: the loop holds its hooks (the fixed probe, the CPU/wall split) and
# stays unpacked (issue 41 lets it grow past 450 rather than pack its lines)
CAPS = {"train": 475}
GRAPH = {  # file -> the top-level files it imports (anywhere in it: its demo included)
    "train": {"checkpoint", "data", "engine", "fsdp", "grpo", "llds", "memory", "policy", "probe", "retriever",
              "rollout", "tracking"},
    "probe": {"checkpoint", "data", "engine", "fsdp", "grpo", "llds", "policy", "retriever", "rollout"},
    "evaluate": {"checkpoint", "data", "engine", "paper", "policy", "retriever", "rollout"},
    "engine": {"rollout"},
    "policy": {"checkpoint"},
    "retriever": {"bm25", "data", "rollout"},  # rollout: the CLI shows hits as the model sees them (format_passages)
    "rollout": {"data"},  # the demo's 5 passages
    "bm25": {"topk"},  # its compiled search
    "grpo": set(), "llds": set(), "topk": set(), "data": set(), "checkpoint": set(), "tracking": set(), "fsdp": set(),
    "memory": set(), "paper": set(),
}


def imports(module: str) -> set[str]:
    tree = ast.parse((ROOT / f"{module}.py").read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names & set(MODULES)


def test_import_graph():
    assert set(MODULES) == set(GRAPH), "a top-level file was added or removed: give it its place in GRAPH"
    got = {m: imports(m) for m in MODULES}
    assert got == GRAPH
    assert not any("train" in deps for deps in got.values())
    third_party = {m: {n.split(".")[0] for node in ast.walk(ast.parse((ROOT / f"{m}.py").read_text()))
                       if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "level", 0) == 0
                       for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module])}
                   for m in ("grpo", "llds", "rollout")}
    assert third_party["grpo"] == third_party["llds"] == {"torch"}  # the losses: torch only
    assert "transformers" not in third_party["rollout"]  # engines are callables: engine.py holds the HF one

    def visit(m, path):  # depth-first: a module met again on its own path is a cycle
        assert m not in path, " -> ".join([*path, m])
        for d in GRAPH[m]:
            visit(d, [*path, m])
    for m in MODULES:
        visit(m, [])


def test_train_py_reads_on_a_few_screens():
    src = (ROOT / "train.py").read_text(encoding="utf-8")
    main = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "main")
    loop = next(n for n in ast.walk(main) if isinstance(n, ast.For))
    assert len(src.splitlines()) <= CAPS.get("train", 450)  # a cap met by packing lines defeats its purpose
    assert main.end_lineno - main.lineno + 1 <= 70
    assert loop.end_lineno - loop.lineno + 1 <= 70  # the step, in the paper's order


def test_help_is_grouped_by_the_args_sections():
    out = hang.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    sections = [line[:-1] for line in out.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert sections[-8:] == ["model", "data and retrieval", "rollout", "GRPO loss", "LLDS", "optimisation",
                             "memory and ranks", "logging and checkpoints"], sections
    llds = out.stdout.split("\nLLDS:\n")[1].split("\n\n")[0]
    assert "--llds-gate" in llds and "--kl-coef" not in llds


def test_choices_come_from_the_loss_tables():
    import grpo
    import llds
    import train

    assert train.CHOICES["llds_gate"] == tuple(llds.GATES) and train.CHOICES["kl_type"] == tuple(grpo.KL_ESTIMATORS)
    assert train.CHOICES["policy_loss"] == tuple(grpo.POLICY_LOSSES)
    assert train.CHOICES["llds_ma"] == ("off", *llds.MA_SCHEDULES)


def test_missing_default_data_says_how_to_make_it(tmp_path):
    # (cwd tmp_path: the repository's own data/ folder, if someone made it, does not count)
    out = hang.run([sys.executable, str(ROOT / "train.py"), "--out-dir", str(tmp_path / "run")], cwd=tmp_path,
                   capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: --train-data data/hotpotqa/hotpotqa_train.jsonl: not found; make it with `python "
        "scripts/prepare_data.py --out-dir data/hotpotqa` (HotpotQA, from the hub), pass --train-data FILE|HUB_ID and "
        "--corpus FILE, or try "
        "`python scripts/spiral.py` (offline, a search world)"]


def test_a_metric_without_a_reduction_is_an_error():
    import train

    acc = {}  # two micro-batches of 3 and 1 loss tokens: a token mean weighs them 3:1, sums add, maxima take the larger
    train.add_metrics(acc, {"grpo/pg_loss": 0.25, "grpo/tokens": 3.0, "grpo/clip_frac": 0.5, "grpo/ratio_max": 2.0})
    train.add_metrics(acc, {"grpo/pg_loss": 0.25, "grpo/tokens": 1.0, "grpo/clip_frac": 0.1, "grpo/ratio_max": 3.0})
    assert train.mean_metrics(acc) == pytest.approx({"grpo/pg_loss": 0.5, "grpo/tokens": 4.0, "grpo/clip_frac": 0.4,
                                                     "grpo/ratio_max": 3.0}, rel=1e-12, abs=0)
    with pytest.raises(KeyError, match="'grpo/new_term' has no reduction: add it to grpo.REDUCE or llds.REDUCE"):
        train.add_metrics(acc, {"grpo/new_term": 1.0})
    with pytest.raises(KeyError, match="'llds/gate_rate' is a mean weighted by 'llds/units', which the same metrics"):
        train.add_metrics(acc, {"llds/gate_rate": 0.5})  # e.g. a course llds_loss that leaves its weight out


def test_every_top_level_file_is_short_and_unpacked():
    """One concept per file keeps each file short; a cap met by packing lines defeats its purpose, hence both limits."""
    for m in MODULES:
        lines = (ROOT / f"{m}.py").read_text(encoding="utf-8").splitlines()
        assert len(lines) <= CAPS.get(m, 450), f"{m}.py has {len(lines)} lines: split it by concept"
        wide = [n for n, line in enumerate(lines, 1) if len(line) > 120]
        assert not wide, f"{m}.py: lines over 120 columns: {wide}"

