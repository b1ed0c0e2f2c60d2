"""The paper's Tables 1-4 (arXiv 2512.04220 v2): each row's reported exact match, and for every
LLDS-related row the train.py settings that reproduce it; and evaluate.py's printed tables (ours,
and ours under the paper's rows).

`evaluate.py --compare-paper` prints these rows beside a model's scores; docs/reproducing.md gives
each recipe as one command, and tests/test_paper.py checks that every command parses to its row's
settings here. Numbers are in the order of COLUMNS: NQ, TQA, PopQA, Gen, HotpotQA, 2Wiki,
Musique, Bamb., MH, Avg.

    python -m machinery.paper        # list the rows, and the recipe of each LLDS-related one
"""

import json
from pathlib import Path

GEN, MH = ("NQ", "TQA", "PopQA"), ("HotpotQA", "2Wiki", "Musique", "Bamb.")
COLUMNS = (*GEN, "Gen", *MH, "MH", "Avg")  # the column order of the paper's Tables 1-4

# Exact match from arXiv 2512.04220 v2 Table 1 (Qwen2.5-3B) and Table 2 (Qwen2.5-7B), in COLUMNS
# order; "-" = not run. Printed relative gains are left out: Table 1's 3B-Base +LLDS-MA says
# "+45.2%", but 0.440 / 0.312 is +41.0%.
PAPER = {
    "3B Search-R1-PPO-Base":
        "0.406 0.587 0.435 0.476 0.284 0.273 0.049 0.088 0.174 0.303",
    "3B Search-R1-PPO-Ins":
        "0.341 0.545 0.378 0.421 0.324 0.319 0.103 0.264 0.253 0.325",
    "3B Tree-GRPO":
        "0.468 0.597 0.436 0.500 0.424 0.437 0.178 0.432 0.368 0.424",
    "3B-Base Search-R1-GRPO":
        "0.421 0.583 0.413 0.472 0.297 0.274 0.066 0.128 0.191 0.312",
    "3B-Base +LLDS":
        "0.479 0.627 0.453 0.520 0.345 0.323 0.082 0.210 0.240 0.360",
    "3B-Base +LLDS-MA":
        "0.483 0.633 0.474 0.530 0.452 0.443 0.197 0.395 0.372 0.440",
    "3B-Ins Search-R1-GRPO":
        "0.397 0.565 0.391 0.451 0.331 0.310 0.124 0.232 0.249 0.336",
    "3B-Ins +LLDS":
        "0.462 0.627 0.468 0.519 0.443 0.447 0.197 0.444 0.383 0.441",
    "3B-Ins Search-R1-GSPO":
        "0.376 0.561 0.374 0.437 0.332 0.329 0.098 0.250 0.252 0.331",
    "3B-Ins GSPO +LLDS":
        "0.489 0.640 0.483 0.537 0.466 0.456 0.215 0.403 0.385 0.451",
    "7B Search-R1-PPO-Base":
        "0.480 0.638 0.457 0.525 0.433 0.382 0.196 0.432 0.361 0.431",
    "7B Search-R1-PPO-Ins":
        "0.393 0.610 0.397 0.467 0.370 0.414 0.146 0.368 0.325 0.385",
    "7B Tree-GRPO":
        "0.481 0.633 0.452 0.522 0.446 0.423 0.202 0.440 0.378 0.439",
    "7B-Base Search-R1-GRPO":
        "0.395 0.560 0.388 0.448 0.326 0.297 0.125 0.360 0.277 0.350",
    "7B-Base +LLDS":
        "0.512 0.672 0.480 0.555 0.486 0.469 0.232 0.508 0.424 0.480",
    "7B-Ins Search-R1-GRPO":
        "0.429 0.623 0.427 0.493 0.386 0.346 0.162 0.400 0.324 0.396",
    "7B-Ins +LLDS (λ=0.3)":
        "0.518 0.676 0.486 0.560 0.492 0.490 0.228 0.492 0.426 0.483",
    # Table 3 (v2 App. B.4.1): gate variants and NQ-only training; its NQ+Hotpot GRPO and action
    # rows repeat Table 1's
    "3B-Base NQ-only: Search-R1-GRPO":
        "0.440 0.582 0.413 0.478 0.265 0.244 0.061 0.113 0.171 0.303",
    "3B-Base NQ-only: +LLDS (token)":
        "0.462 0.609 0.464 0.512 0.286 0.248 0.063 0.113 0.178 0.321",
    "3B-Base NQ-only: +LLDS (response)":
        "0.478 0.605 0.449 0.511 0.288 0.250 0.062 0.129 0.182 0.323",
    "3B-Base NQ-only: +LLDS (action)":
        "0.491 0.615 0.450 0.519 0.306 0.275 0.067 0.121 0.192 0.332",
    "3B-Base NQ+Hotpot: +LLDS (response)":
        "0.480 0.631 0.455 0.522 0.352 0.311 0.087 0.153 0.226 0.353",
    "3B-Ins NQ-only: +LLDS (token)":
        "0.469 0.609 0.457 0.512 0.291 0.250 0.057 0.097 0.174 0.319",
    "3B-Ins NQ-only: +LLDS (response)":
        "0.490 0.610 0.450 0.517 0.294 0.193 0.074 0.121 0.171 0.319",
    "3B-Ins NQ-only: +LLDS (action)":
        "0.485 0.614 0.455 0.517 0.299 0.266 0.062 0.129 0.189 0.330",
    "3B-Ins NQ+Hotpot: +LLDS (response)":
        "0.462 0.622 0.460 0.515 0.432 0.383 0.180 0.395 0.347 0.419",
    "3B-Ins GSPO +LLDS (response)":
        "0.484 0.637 0.475 0.532 0.452 0.448 0.212 0.387 0.375 0.442",
    # Table 4 (v2 App. B.4.3): Llama3.2-3B-Base
    "Llama3.2-3B-Base GRPO":
        "0.233 0.461 0.220 0.305 0.196 0.232 0.044 0.097 0.142 0.212",
    "Llama3.2-3B-Base GRPO-LLDS":
        "0.486 0.643 0.467 0.532 0.366 0.298 0.113 0.242 0.255 0.374",
    "Llama3.2-3B-Base GRPO-LLDS-MA":
        "0.493 0.640 0.480 0.538 0.449 0.462 0.164 0.298 0.343 0.427",
}

# The train.py settings of each LLDS-related row of Tables 1-4: the authors' train_grpo_nqhot.sh
# (lambda NO_REDUCE_LAMBDA 0.2, action gate ISCHUNK=true, USE_GSPO, MASK_ANS/MASK_ADAPTIVE with
# MASK_WEIGHT 0.2) and v2 App. B.2.1 / B.4 (lambda 0.3 for 7B-Instruct; NQ-only and gate ablations;
# Llama). Everything else is train.py's defaults (the paper's: 512 x 5, lr 1e-6, max_turns 3, ...);
# README.md's "Reproducing the paper" table holds the commands and tests/test_evaluate.py checks
# that each parses to its row here. The paper's GRPO rows marked ♢ are Search-R1's reported numbers:
# the recipe is plain GRPO in this code (--llds 0).
NQ_HOTPOT, NQ_ONLY = "PeterJinGo/nq_hotpotqa_train", "RUC-NLPIR/FlashRAG_datasets:nq"
MODELS = {"3B-Base": "Qwen/Qwen2.5-3B", "3B-Ins": "Qwen/Qwen2.5-3B-Instruct",
          "7B-Base": "Qwen/Qwen2.5-7B",
          "7B-Ins": "Qwen/Qwen2.5-7B-Instruct", "Llama3.2-3B-Base": "meta-llama/Llama-3.2-3B"}


def recipe(model: str, llds=0.2, gate="action", ma="off", loss="ppo-clip", data=NQ_HOTPOT) -> dict:
    return {"model": MODELS[model], "train_data": data, "llds": llds, "llds_gate": gate,
            "llds_ma": ma,
            "llds_ma_weight": 0.2, "policy_loss": loss}


RECIPES = {
    "3B-Base Search-R1-GRPO": recipe("3B-Base", llds=0.0),
    "3B-Base +LLDS": recipe("3B-Base"),
    "3B-Base +LLDS-MA": recipe("3B-Base", ma="code"),  # adaptive answer weight (MASK_ADAPTIVE=true)
    "3B-Ins Search-R1-GRPO": recipe("3B-Ins", llds=0.0),
    "3B-Ins +LLDS": recipe("3B-Ins"),
    "3B-Ins Search-R1-GSPO": recipe("3B-Ins", llds=0.0, loss="gspo"),
    "3B-Ins GSPO +LLDS": recipe("3B-Ins", loss="gspo"),
    "7B-Base Search-R1-GRPO": recipe("7B-Base", llds=0.0),
    "7B-Base +LLDS": recipe("7B-Base"),
    "7B-Ins Search-R1-GRPO": recipe("7B-Ins", llds=0.0),
    "7B-Ins +LLDS (λ=0.3)": recipe("7B-Ins", llds=0.3),
    "3B-Base NQ-only: Search-R1-GRPO": recipe("3B-Base", llds=0.0, data=NQ_ONLY),
    "3B-Base NQ-only: +LLDS (token)": recipe("3B-Base", gate="token", data=NQ_ONLY),
    "3B-Base NQ-only: +LLDS (response)": recipe("3B-Base", gate="response", data=NQ_ONLY),
    "3B-Base NQ-only: +LLDS (action)": recipe("3B-Base", data=NQ_ONLY),
    "3B-Base NQ+Hotpot: +LLDS (response)": recipe("3B-Base", gate="response"),
    "3B-Ins NQ-only: +LLDS (token)": recipe("3B-Ins", gate="token", data=NQ_ONLY),
    "3B-Ins NQ-only: +LLDS (response)": recipe("3B-Ins", gate="response", data=NQ_ONLY),
    "3B-Ins NQ-only: +LLDS (action)": recipe("3B-Ins", data=NQ_ONLY),
    "3B-Ins NQ+Hotpot: +LLDS (response)": recipe("3B-Ins", gate="response"),
    "3B-Ins GSPO +LLDS (response)": recipe("3B-Ins", gate="response", loss="gspo"),
    "Llama3.2-3B-Base GRPO": recipe("Llama3.2-3B-Base", llds=0.0),
    "Llama3.2-3B-Base GRPO-LLDS": recipe("Llama3.2-3B-Base"),
    "Llama3.2-3B-Base GRPO-LLDS-MA": recipe("Llama3.2-3B-Base", ma="code"),
}


def paper_row(label: str) -> list[float | None]:
    """PAPER[label] as 10 numbers in COLUMNS order (None for '-')."""
    return [None if v in "-–" else float(v) for v in PAPER[label].split()]


def recipe_row(model_path) -> tuple[str | None, Path | None]:
    """(the paper row, the args.json it came from) for a checkpoint of a train.py run: the RECIPES
    row whose settings all equal the run's saved args (a run folder, or checkpoints/step_N inside
    one). (None, file) when none matches, (None, None) when there is no args.json (e.g. a hub
    id)."""
    path = Path(model_path)
    for folder in (path, path.parent.parent):
        file = folder / "args.json"
        if file.is_file():
            try:
                saved = json.loads(file.read_text(encoding="utf-8"))
            except ValueError:
                return None, file
            row = next(
                (
                    label
                    for label, r in RECIPES.items()
                    if all(saved.get(k) == v for k, v in r.items())
                ),
                None,
            )
            return row, file
    return None, None


# --------------------------------------------------------------------------------------------------
# Printing: evaluate.py's score table, and our row under the paper's

def _fmt(x, spec=".3f") -> str:
    return "–" if x is None else format(x, spec)


def table_lines(table: dict, topk: int = 3) -> list[str]:
    """The score table as text: one row per source, then the averages, each naming the sources it
    covers."""
    lines = [
        f"{'data_source':<14}{'n':>6}{'EM':>8}{'F1':>8}{'sub-EM':>8}{'search/q':>10}"
        f"{f'recall@{topk}':>10}"
    ]
    for src, t in table.items():
        group = GEN if src == "Gen-Avg" else MH if src == "MH-Avg" else ()
        missing = [c for c in group if c not in t["sources"]]
        note = (
            f"  (over {', '.join(t['sources'])} only; not run: {', '.join(missing)})"
            if missing
            else ""
        )
        # the paper's Avg: each source weighs the same, not each question
        if src == "average" and len(table) > 2:
            sources = len(table) - 1 - ("Gen-Avg" in table) - ("MH-Avg" in table)
            note = f"  (the mean of the {sources} sources)"
        lines.append(f"{src:<14}{t['n']:>6}" + "".join(f"{_fmt(t.get(m)):>{w}}" for m, w in
                     (("em", 8), ("f1", 8), ("sub_em", 8), ("searches", 10),
                      ("recall", 10))) + note)
    return lines


def compare_lines(table: dict, which: str = "") -> list[str]:
    """Our EM beside the paper's rows whose label is `which` or, if none is, contains it (all if
    ""), in the paper's column order. Our Gen / MH / Avg are means over the paper's sources we ran;
    a '*' marks one that misses some of them."""
    em = {c: table[c]["em"] for c in GEN + MH if "em" in table.get(c, {})}

    def mean(cols):  # (value, partial)
        vals = [em[c] for c in cols if c in em]
        return (sum(vals) / len(vals), len(vals) < len(cols)) if vals else (None, False)

    ours = {c: (em.get(c), False) for c in GEN + MH} | {"Gen": mean(GEN), "MH": mean(MH),
                                                        "Avg": mean(GEN + MH)}
    rows = [which] if which in PAPER else [k for k in PAPER if which.lower() in k.lower()]
    w = max([24, *(len(k) + 1 for k in rows)])  # the label column
    lines = [f"{'EM':<{w}}" + "".join(f"{c:>9}" for c in COLUMNS)]
    lines += [f"{k:<{w}}" + "".join(f"{_fmt(v):>9}" for v in paper_row(k)) for k in rows]
    lines.append(
        f"{'ours':<{w}}"
        + "".join(f"{_fmt(v) + '*' * partial:>9}" for v, partial in map(ours.get, COLUMNS))
    )
    if any(partial for _, partial in ours.values()):
        lines.append("* ours: mean over the sources we ran only (the paper's covers all of them)")
    return lines


if __name__ == "__main__":
    # e.g. 3B-Ins +LLDS    Avg 0.441  recipe: Qwen/Qwen2.5-3B-Instruct, lambda 0.2
    for label in PAPER:
        r = RECIPES.get(label)
        recipe_text = f"  recipe: {r['model']}, lambda {r['llds']:g}" if r else ""
        print(f"{label:<38}Avg {paper_row(label)[-1]:.3f}{recipe_text}")
