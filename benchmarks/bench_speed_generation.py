"""Benchmark (issue 27, generation): the decoding engines of engine.py side by side, in one process, interleaved.

For each workload, multi-turn rollouts (rollout.rollout with BM25 search, sampling at temperature 1 / top-p 0.95 as
in training) run with each engine in turn, hf hf-kv cb hf hf-kv cb ..., under the same seed per repeat:
  (a) useful tokens per generated slot: useful = the model ids `cut_turn` keeps (Episode.loss_mask), slot = one row
      position decoded in one forward step (the ids an engine returns: hf and hf-kv pad a row that stopped to its
      call's longest row, cb returns each row up to its stop); the reference is plain `model.generate` of one row at
      a time (hf_generator with batch_size=1: no row ever waits for another), run once (on the first question only
      for the real model: it is slow);
  (b) useful tokens per second, wall-clock and CPU time (time.process_time, all threads), each engine's median over
      the repeats and its ratio to hf (today's former default), the median of the per-repeat ratios (each repeat runs
      the engines back to back, so the machine's load drifts less between them). "best" columns are best-of-N.
The machine's load (os.getloadavg) is printed before and after. Workloads:
  world:   lab/world0_policy (0.65M parameters, it searches and answers: rows stop at different turns
           and steps) on the search world (lab/search_world.py), 8 questions x 4, 64 new tokens a turn, 3 search
           turns + the answer turn; with 32 slots (every row in one batch) and 8 slots (4x more rows than slots);
  smollm2: SmolLM2-135M-Instruct (Llama; read from $OFFLINE_MODEL_DIR/smollm2, by default
           ~/.cache/offline-models/smollm2: `huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct
           --local-dir ~/.cache/offline-models/smollm2` puts it there) on the shipped tests/fixtures/qa_sample
           (HotpotQA questions, its 600 passages), 2 questions x 4, 8 slots; greedy ids of every engine are also
           compared with hf's there (4 rows). Without the model folder the tests' tiny random model stands in
           (said in the table): its rows never stop early, so it shows little.
Nothing is asserted: run(quick) returns the rows, `python benchmarks/bench_speed_generation.py [--quick]` prints them.

    nice -n 5 python benchmarks/bench_speed_generation.py            # ~15 minutes on 2 busy cores at 1 thread
    nice -n 5 python benchmarks/bench_speed_generation.py --quick    # ~2 minutes: fewer rows, tokens and repeats
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "lab")]

from machinery.data import load_questions  # noqa: E402
from machinery.engine import GENERATORS, hf_generator  # noqa: E402
from retriever import BM25Retriever  # noqa: E402
from rollout import STOP_STRINGS, rollout  # noqa: E402

ENGINES = ("hf", "hf-kv", "cb")
SMOLLM2 = Path(os.environ.get("OFFLINE_MODEL_DIR", Path.home() / ".cache" / "offline-models")) / "smollm2"


def counting(generate):
    """generate, counting the slots it decodes (the ids it returns) in .slots."""
    def wrapped(contexts):
        out = generate(contexts)
        wrapped.slots += sum(len(o) for o in out)
        return out
    wrapped.slots, wrapped.eos_ids = 0, generate.eos_ids
    wrapped.reset = getattr(generate, "reset", lambda: None)
    return wrapped


def workloads(quick: bool, tmp: Path) -> list[dict]:
    """The workloads: label, model, tok, rows, search, rollout and engine settings, a note."""
    import search_world
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = search_world.write_world(search_world.make_world(seed=0), tmp)
    policy = ROOT / "lab" / "world0_policy"
    world = dict(model=AutoModelForCausalLM.from_pretrained(policy).eval(), tok=AutoTokenizer.from_pretrained(policy),
                 rows=load_questions(str(paths["test"]))[:4 if quick else 8],
                 search=BM25Retriever.from_jsonl(str(paths["corpus"])).search, group_size=4, max_new_tokens=64,
                 max_obs_tokens=200, greedy_check=False, plain_questions=8, note="world_guess_policy 0.65M")
    out = [dict(world, label=f"world/{s} slots", batch_size=s) for s in ((16, 4) if quick else (32, 8))]
    qa = ROOT / "tests" / "fixtures" / "qa_sample"
    real = dict(rows=load_questions(str(qa / "hotpotqa_test.jsonl"))[:1 if quick else 2],
                search=BM25Retriever.from_jsonl(str(qa / "corpus.jsonl")).search, group_size=4,
                max_new_tokens=32 if quick else 64, max_obs_tokens=200, batch_size=8, greedy_check=not quick,
                plain_questions=1)
    if (SMOLLM2 / "config.json").exists():
        real.update(model=AutoModelForCausalLM.from_pretrained(SMOLLM2).eval(),
                    tok=AutoTokenizer.from_pretrained(SMOLLM2), label="smollm2", note="SmolLM2-135M-Instruct")
    else:
        from tiny import build_model, build_tokenizer

        tok = build_tokenizer()
        real.update(model=build_model(tok, seed=0), tok=tok, label="tiny (no smollm2)",
                    note=f"{SMOLLM2} absent: the tests' tiny random model instead; its rows never stop early")
    return out + [real]


def one_rollout(w: dict, make, seed: int, do_sample: bool = True, batch_size: int | None = None):
    """One rollout of workload w with engine factory `make`: (useful, slots, wall s, cpu s, response ids)."""
    generate = counting(make(w["model"], w["tok"], stop_strings=STOP_STRINGS, max_new_tokens=w["max_new_tokens"],
                             temperature=1.0, top_p=0.95, do_sample=do_sample,
                             batch_size=batch_size or w["batch_size"]))
    torch.manual_seed(seed)
    wall, cpu = time.perf_counter(), time.process_time()
    eps = rollout(generate, w["tok"], w["rows"], w["search"], group_size=w["group_size"], max_turns=3,
                  max_obs_tokens=w["max_obs_tokens"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return sum(sum(e.loss_mask) for e in eps), generate.slots, wall, cpu, [e.response_ids for e in eps]


def bench(w: dict, repeats: int) -> list[dict]:
    """Rows of one workload: each engine's figures over `repeats` interleaved rollouts, and the 1-row reference."""
    for name in ENGINES:  # warm-up: first-call costs (allocator, the stop-string tables)
        GENERATORS[name](w["model"], w["tok"], stop_strings=STOP_STRINGS, max_new_tokens=2)(
            [w["tok"].encode("Hi", add_special_tokens=False)])
    runs = {name: [] for name in ENGINES}
    for rep in range(repeats):
        for name in ENGINES:
            runs[name].append(one_rollout(w, GENERATORS[name], seed=rep))
    ref = dict(w, rows=w["rows"][:w["plain_questions"]])
    plain = one_rollout(ref, hf_generator, seed=0, batch_size=1)  # plain generate, one row at a time
    plain_eff = plain[0] / plain[1]
    same = {}
    if w["greedy_check"]:  # greedy ids of each engine against hf's: 2 questions x 2
        small = dict(w, rows=w["rows"][:2], group_size=2)
        ids = {name: one_rollout(small, GENERATORS[name], seed=0, do_sample=False)[4] for name in ENGINES}
        same = {name: "same" if ids[name] == ids["hf"] else "differ" for name in ENGINES}
    out = []
    for name in ENGINES + ("generate 1 row",):
        rs = runs.get(name, [plain])
        rate_wall, rate_cpu = [r[0] / r[2] for r in rs], [r[0] / r[3] for r in rs]
        hf_wall, hf_cpu = [r[0] / r[2] for r in runs["hf"]], [r[0] / r[3] for r in runs["hf"]]
        useful, slots = sum(r[0] for r in rs), sum(r[1] for r in rs)
        out.append({
            "part": "generation", "workload": w["label"], "engine": name, "note": w["note"],
            "rows": len((ref if name not in runs else w)["rows"]) * w["group_size"],
            "slots": 1 if name not in runs else w["batch_size"],
            "repeats": len(rs), "useful_per_slot": useful / slots, "vs_plain": useful / slots / plain_eff,
            "useful_tokens": statistics.median(r[0] for r in rs), "wall_s": statistics.median(r[2] for r in rs),
            "cpu_s": statistics.median(r[3] for r in rs), "tok_s_wall": statistics.median(rate_wall),
            "tok_s_cpu": statistics.median(rate_cpu), "best_tok_s_wall": max(rate_wall),
            "x_hf_wall": statistics.median(a / b for a, b in zip(rate_wall, hf_wall)) if name in runs else None,
            "x_hf_cpu": statistics.median(a / b for a, b in zip(rate_cpu, hf_cpu)) if name in runs else None,
            "greedy_vs_hf": same.get(name, "-"),
        })
    return out


def run(quick: bool = False) -> list[dict]:
    """All workloads (quick: fewer rows, tokens and repeats); one dict per (workload, engine), with the load before
    and after (os.getloadavg: 1, 5 and 15 minutes) and the torch threads."""
    load_before, rows = os.getloadavg(), []
    with tempfile.TemporaryDirectory() as tmp:
        for w in workloads(quick, Path(tmp)):
            rows += bench(w, repeats=1 if quick else 7 if w["label"].startswith("world") else 2)
    load_after = os.getloadavg()
    for r in rows:
        r.update(load_before=load_before, load_after=load_after, threads=torch.get_num_threads(),
                 cores=os.cpu_count())
    return rows


def print_table(rows: list[dict]):
    r0 = rows[0]
    print(f"{r0['cores']} cores, torch threads {r0['threads']}; load (1/5/15 min) before "
          f"{' '.join(f'{x:.2f}' for x in r0['load_before'])}, after {' '.join(f'{x:.2f}' for x in r0['load_after'])}")
    print("useful = kept model ids; slot = a row position decoded in a forward step; tok/s = useful tokens per second "
          "(median of the repeats; best = best-of-N); x hf = median of per-repeat ratios to hf")
    head = (f"{'workload':<16} {'engine':<14} {'rows/slots':>10} {'N':>2} {'useful/slot':>11} {'vs plain':>8} "
            f"{'useful':>6} {'wall s':>7} {'cpu s':>7} {'tok/s':>7} {'cpu tok/s':>9} {'best tok/s':>10} "
            f"{'x hf wall':>9} {'x hf cpu':>8} {'greedy':>6}")
    print(head)
    for r in rows:
        fmt = (lambda x: f"{x:.2f}" if x is not None else "-")
        print(f"{r['workload']:<16} {r['engine']:<14} {r['rows']:>5}/{r['slots']:<4} {r['repeats']:>2} "
              f"{r['useful_per_slot']:>11.3f} {r['vs_plain']:>8.3f} {r['useful_tokens']:>6.0f} {r['wall_s']:>7.2f} "
              f"{r['cpu_s']:>7.2f} {r['tok_s_wall']:>7.1f} {r['tok_s_cpu']:>9.1f} {r['best_tok_s_wall']:>10.1f} "
              f"{fmt(r['x_hf_wall']):>9} {fmt(r['x_hf_cpu']):>8} {r['greedy_vs_hf']:>6}")
    for note in dict.fromkeys(f"{r['workload']}: {r['note']}" for r in rows):
        print(note)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rows, tokens and repeats (~2 minutes)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier figures on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print_table(run(quick=args.quick))
