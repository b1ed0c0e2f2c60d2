"""Which cure stops the spiral: the per-cure table of runs made by lab/spiral.py, one --out folder per cure.

Each CELL=FOLDER names a folder of spiral.py runs (FOLDER/world{W}_lr{LR}_llds{L}_seed{S}/ with metrics.jsonl and
eval.json), all made with one cure's flags; the first cell is the baseline (plain GRPO). Every run is judged with
spiral.py's measures (the collapse on 5-step reward windows, the fixed probe's onset, Def. A.3), and each cell gets a
verdict against the baseline, paired by (world, seed), under the rules of results/fixes/PROTOCOL.md:

  stops     collapses in at most half as many runs as the baseline (the baseline at >= 3 collapses), and keeps the
            probe (probe/dlogp_correct at the end) above the baseline's in >= 6 of 9 pairs (two thirds of the pairs);
  delays    fewer collapses but the probe not kept up, or later collapse steps in >= two thirds of the pairs where
            both collapsed;
  no effect otherwise; untested instead where the baseline itself collapsed in fewer than 3 runs (then "stops"
            cannot be reached: the probe column says what the collapses cannot).

It prints every run's row, then one row per cell: collapses, degraded and held runs; the final reward; the probe's
change at the end (mean and range); test EM (mean and range); the CPU seconds a step against the baseline's; the
verdict. --copy DIR also writes each run's metrics.jsonl and args.json (no rollouts, no weights) to DIR/<cell>_<run>/.

    python lab/cures.py plain=runs/fixes/plain llds=runs/fixes/llds calibadv=runs/fixes/calibadv --copy results/fixes
"""

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab"))

from spiral import fmt, keeps_up, measures  # noqa: E402

RUN = re.compile(r"world(\d+)_lr([\d.e-]+)_llds([\d.e-]+)_seed(\d+)")


def read_cell(folder: Path) -> list[dict]:
    """spiral.measures of every finished run in `folder` (one with eval.json), with world, lr, llds, seed, test_em
    (greedy EM over all test questions) and cpu_s (perf/step_cpu_s, mean over steps). Raises SystemExit with one line
    if the folder holds none."""
    rows = []
    for run in sorted(folder.iterdir()):
        m = RUN.fullmatch(run.name)
        if not (m and (run / "metrics.jsonl").is_file() and (run / "eval.json").is_file()):
            continue
        history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        records = json.loads((run / "eval.json").read_text())["records"]
        rows.append({"world": int(m[1]), "lr": float(m[2]), "llds": float(m[3]), "seed": int(m[4]), "run": run,
                     "test_em": sum(r["em"] for r in records) / len(records), **measures(history),
                     "cpu_s": sum(h["perf/step_cpu_s"] for h in history) / len(history), "steps": len(history)})
    if not rows:
        raise SystemExit(f"error: {folder}: no finished spiral.py run (world*_lr*_llds*_seed*/ with eval.json)")
    return rows


def later_collapses(cell: list[dict], base: list[dict]) -> tuple[int, int]:
    """(pairs where the cell's collapse step is later than the baseline's, pairs where both collapsed)."""
    steps = {(r["world"], r["seed"]): r["collapse_step"] for r in base}
    pairs = [(r["collapse_step"], steps.get((r["world"], r["seed"]))) for r in cell]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    return sum(a > b for a, b in pairs), len(pairs)


def verdict(cell: list[dict], base: list[dict]) -> str:
    """results/fixes/PROTOCOL.md's verdict of `cell` against the baseline's runs `base`."""
    col, col0 = (sum(r["verdict"] == "collapsed" for r in runs) for runs in (cell, base))
    up, pairs = keeps_up(cell, base)  # paired by (world, lr, seed)
    later, both = later_collapses(cell, base)
    kept = bool(pairs) and up >= 2 * pairs / 3
    if col0 >= 3 and col <= col0 / 2 and kept:
        return "stops"
    if (col < col0 and not kept) or (both and later >= 2 * both / 3):  # fewer, the probe not kept up; or later
        return "delays"
    return "no effect" if col0 >= 3 else "untested: the baseline collapsed in fewer than 3 runs"


def span(values: list, spec: str = "+.3f") -> str:
    """'mean [min, max]' of the values that are not None, or '-'."""
    v = [x for x in values if x is not None]
    return f"{sum(v) / len(v):{spec}} [{min(v):{spec}}, {max(v):{spec}}]" if v else "-"


def tables(cells: dict[str, list[dict]]) -> list[str]:
    """Every run's row, then the per-cure table (markdown); the first cell is the baseline."""
    names = list(cells)
    base = cells[names[0]]
    lines = ["| cure | world | seed | start reward | final reward | verdict | collapse step | probe onset | "
             "probe dlogp correct (end) | test EM | CPU s/step |", "|" + "---|" * 11]
    for name, runs in cells.items():
        for r in runs:
            lines.append(f"| {name} | {r['world']} | {r['seed']} | {r['start_reward']:.3f} | {r['final_reward']:.3f} "
                         f"| {r['verdict']} | {fmt(r['collapse_step'], 'd')} | {fmt(r.get('probe_correct'), 'd')} | "
                         f"{fmt(r.get('dlogp_correct_end'), '+.3f')} | {r['test_em']:.3f} | {r['cpu_s']:.1f} |")
    lines += ["", "| cure | runs | collapsed / degraded / held | final reward | probe dlogp correct (end) | "
              "probe kept above the baseline's | later collapse (both collapsed) | test EM | CPU s/step vs baseline | "
              "verdict |", "|" + "---|" * 10]
    cpu0 = sum(r["cpu_s"] for r in base) / len(base)
    for name, runs in cells.items():
        counts = " / ".join(str(sum(r["verdict"] == v for r in runs)) for v in ("collapsed", "degraded", "held"))
        final = sum(r["final_reward"] for r in runs) / len(runs)
        cpu = sum(r["cpu_s"] for r in runs) / len(runs)
        if runs is base:
            up = later = judged = "(baseline)"
        else:
            u, p = keeps_up(runs, base)
            lt, both = later_collapses(runs, base)
            up, later, judged = f"{u} of {p}", f"{lt} of {both}", verdict(runs, base)
        probe = span([r.get("dlogp_correct_end") for r in runs])
        lines.append(f"| {name} | {len(runs)} | {counts} | {final:.3f} | {probe} | {up} | {later} | "
                     f"{span([r['test_em'] for r in runs], '.3f')} | {cpu / cpu0:.2f}x | {judged} |")
    return lines


def copy_runs(cells: dict[str, list[dict]], dest: Path):
    """Each run's metrics.jsonl and args.json to dest/<cell>_<run folder>/ (a few hundred KB; no rollouts, no
    weights), so anyone can redraw the curves."""
    for name, runs in cells.items():
        for r in runs:
            to = dest / f"{name}_{r['run'].name}"
            to.mkdir(parents=True, exist_ok=True)
            for f in ("metrics.jsonl", "args.json"):
                shutil.copyfile(r["run"] / f, to / f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cells", nargs="+", metavar="CELL=FOLDER", help="a cure's name and its spiral.py --out folder; "
                    "the first is the baseline")
    ap.add_argument("--copy", metavar="DIR", help="also copy each run's metrics.jsonl and args.json under DIR")
    args = ap.parse_args(argv)
    cells = {}
    for spec in args.cells:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not Path(folder).is_dir():
            ap.error(f"{spec!r}: give CELL=FOLDER with an existing folder")
        cells[name] = read_cell(Path(folder))
    print("\n".join(tables(cells)))
    if args.copy:
        copy_runs(cells, Path(args.copy))
        print(f"copied {sum(map(len, cells.values()))} runs' metrics and args to {args.copy}")


if __name__ == "__main__":
    main()
