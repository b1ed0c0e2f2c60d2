"""paper.py: the paper's Tables 1-4 as typed in (each row's numbers add up, and match a second transcription), and
each LLDS-related row's recipe (docs/reproducing.md's command for it parses to the row's settings; a run's args.json
finds its row)."""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TABLES = ROOT / "tests" / "fixtures" / "paper_tables.md"

import hang  # noqa: E402
import evaluate as E  # noqa: E402
from machinery import paper  # noqa: E402


def test_paper_rows_are_self_consistent():
    """Gen = mean(NQ, TQA, PopQA), MH = mean of the 4 multi-hop sets, Avg = mean of all 7, to +-0.002 (rounding).
    All stored rows pass; the largest gap is 0.0005 (the footnoted 3B-Base +LLDS-MA Avg 0.440 = 3.077 / 7 holds: only
    its printed gain "+45.2%" is off)."""
    for label in paper.PAPER:
        v = paper.paper_row(label)
        assert len(v) == len(E.COLUMNS) == 10 and None not in v, label
        nq, tqa, pop, gen, hot, wiki, mus, bam, mh, avg = v
        assert abs(gen - (nq + tqa + pop) / 3) <= 0.002, label
        assert abs(mh - (hot + wiki + mus + bam) / 4) <= 0.002, label
        assert abs(avg - (nq + tqa + pop + hot + wiki + mus + bam) / 7) <= 0.002, label
    assert paper.paper_row("3B-Ins +LLDS")[9] == 0.441 and paper.paper_row("7B-Ins +LLDS (λ=0.3)")[0] == 0.518  # exact: parsed


def test_paper_rows_are_copied_exactly_from_the_tables():
    """paper.PAPER against tests/fixtures/paper_tables.md, a second transcription of the paper's tables."""
    spec = {}
    for line in TABLES.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and re.match(r"0\.\d{3}", cells[1]):
            numbers = " ".join(c.split()[0] for c in cells[1:])  # "0.440 (+45.2%)*" -> "0.440"
            spec.setdefault(re.sub(r"[*♢△]", "", cells[0]).strip(), []).append(numbers)
    for label, numbers in paper.PAPER.items():
        size = re.match(r"(3B|7B) ", label)  # "3B Tree-GRPO" is Table 1's "Tree-GRPO", "7B Tree-GRPO" Table 2's
        if size:
            assert spec[label[3:]][["3B", "7B"].index(size.group(1))] == numbers, label
        else:  # Table 4's rows are labelled by the method only ("GRPO-LLDS")
            assert numbers in spec[label.removeprefix("Llama3.2-3B-Base ")], label


def doc_recipes() -> tuple[list[str], dict]:
    """docs/reproducing.md, "Reproducing the paper's rows": the common command's train.py arguments, and
    {row: flags}."""
    text = (ROOT / "docs" / "reproducing.md").read_text(encoding="utf-8")
    section = text.split("# Reproducing the paper's rows", 1)[1]
    section = section.split("\n## ", 1)[0]
    common = re.search(r"```bash\n(torchrun .*?)\n```", section).group(1).split()
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| (.+?) \| (\d) \| `(.+)` \|$", line)
        if m:
            assert m.group(1) not in rows, m.group(1)
            rows[m.group(1)] = m.group(3).split()
    return common[common.index("train.py") + 1:], rows


def test_every_recipe_command_parses_to_its_rows_settings():
    """Each row's command, parsed by train.py's parser, holds exactly the row's settings (model, training data, lambda,
    gate, MA schedule and weight, policy loss), and trains with max_turns 3 (evaluation uses 4); every LLDS-related row
    of Tables 1-4 has one, and each has the paper's numbers."""
    from train import parse_args

    common, rows = doc_recipes()
    assert list(rows) == list(paper.RECIPES) and set(paper.RECIPES) <= set(paper.PAPER)
    assert "--fsdp" in common and "--retriever-url" in common
    for label, flags in rows.items():
        args = vars(parse_args(common + flags))
        assert {k: args[k] for k in paper.RECIPES[label]} == paper.RECIPES[label], label
        assert args["max_turns"] == 3 and args["group_size"] == 5 and args["prompts_per_step"] == 512, label
    assert {r["llds"] for r in paper.RECIPES.values()} == {0.0, 0.2, 0.3}  # exact: settings typed in, no arithmetic
    assert paper.RECIPES["7B-Ins +LLDS (λ=0.3)"]["llds"] == 0.3 and \
        paper.RECIPES["3B-Ins GSPO +LLDS"]["policy_loss"] == "gspo"  # exact: settings typed in
    assert E.EVAL_MAX_TURNS == 4  # evaluate.py's default search budget, the paper's


def test_compare_paper_picks_the_row_from_the_runs_args(tmp_path):
    """A checkpoint of a run started with a recipe's command: recipe_row finds that row from the run's args.json (from
    the run folder or from checkpoints/step_N), and no row for other settings or without args.json."""
    from train import parse_args

    common, rows = doc_recipes()
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000650").mkdir(parents=True)
    for label in ("3B-Ins +LLDS", "3B-Base +LLDS-MA", "3B-Ins GSPO +LLDS (response)", "7B-Ins +LLDS (λ=0.3)"):
        (run / "args.json").write_text(json.dumps(vars(parse_args(common + rows[label] + ["--steps", "650"]))))
        assert paper.recipe_row(run) == (label, run / "args.json")
        assert paper.recipe_row(run / "checkpoints" / "step_000650") == (label, run / "args.json")
    (run / "args.json").write_text(json.dumps(vars(parse_args(common + rows["3B-Ins +LLDS"] + ["--llds", "0.1"]))))
    assert paper.recipe_row(run) == (None, run / "args.json")
    assert paper.recipe_row("Qwen/Qwen2.5-3B") == (None, None)
    lines = E.compare_lines(E.score_table([{"data_source": "nq", "em": 0.5}]), "3B-Base +LLDS")
    assert [line.split("  ")[0] for line in lines[1:-2]] == ["3B-Base +LLDS"]  # the exact row, not also +LLDS-MA


def test_the_demo_lists_every_row():
    import subprocess

    out = hang.run([sys.executable, "-m", "machinery.paper"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(paper.PAPER) and sum("recipe:" in line for line in lines) == len(paper.RECIPES)
    assert "3B-Ins +LLDS                          Avg 0.441  recipe: Qwen/Qwen2.5-3B-Instruct, lambda 0.2" in lines
