r"""A small generated search world, and a tiny policy warm-started on it (lab/warm_start.py), so that the real,
unchanged pipeline (retriever.py, rollout.py, grpo.py, llds.py, train.py) trains in seconds per step on a CPU.

The world: `people` invented persons (syllable-built names no model could know), each born in an invented town in a
year and working in an occupation; each town lies in an invented region. One wiki-18-style passage per person and per
town ({"id", "contents": '"Title"\\ntext'}, retriever.py's corpus rows):

    "Velor Tamsik"\\nVelor Tamsik was born in Orunda in 1874 and worked as a glassblower.
    "Orunda"\\nOrunda is a town in the region of Kesvia.

Questions (FlashRAG rows {"id", "question", "golden_answers", "data_source", "metadata"}, as data.load_questions
reads them): three 1-hop ones per person (data_source "world_1hop": birthplace, birth year, occupation; the answer is in
the person's passage) and one 2-hop one ("world_2hop": "In which region was the birthplace of X?" needs the
person's passage, then the town's). Train and test questions are split by person: no test person appears in a
training question (a tiny model memorises names). Everything follows from --seed.

    python lab/search_world.py --out data/world                       # world + warm-started policy
    python lab/search_world.py --out data/world --sft-steps 0         # the world only (seconds)
    python train.py --model data/world/policy --train-data data/world/world_train.jsonl \
        --corpus data/world/corpus.jsonl --steps 5 --prompts-per-step 8 --group-size 4 --max-turns 2 \
        --max-new-tokens 48 --max-obs-tokens 120 --mini-batch-size 8 --micro-batch-size 8 --lr 1e-4 \
        --out-dir runs/world_smoke

Measured on 2 CPU cores (seed 0, defaults): the first command takes 4.5 min (the warm start's 1,500 steps: 250 s;
peak memory 0.9 GB); BM25 (lucene) puts the right passage first for every person's name and every town's name; the
warm start's sampled EM (group_size 4) is 0.45 on training questions, with 61% of groups of mixed rewards, and 0.24
on test people (on an Intel CPU; on an AMD EPYC the floating-point sums differ and the same command gives 0.39 and
0.19). The train.py smoke run takes ~2.4 s per step, rewards 0.22-0.53. Model turns are <= 33 tokens and observations
<= 108 (three town hits), so --max-new-tokens 48 and --max-obs-tokens 120 cut nothing.

Writes OUT/corpus.jsonl, OUT/world_train.jsonl, OUT/world_test.jsonl and (unless --sft-steps 0) OUT/policy.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machinery.data import passage_title  # noqa: E402
from retriever import BM25Retriever  # noqa: E402

ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "th", "sh")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
CODAS = ("", "", "n", "r", "s", "l", "k", "m")
OCCUPATIONS = ("glassblower", "weaver", "cartographer", "blacksmith", "astronomer", "potter", "shipwright", "botanist",
               "clockmaker", "tanner", "violinist", "surveyor", "beekeeper", "stonemason", "bookbinder", "chemist",
               "miller", "engraver", "lawyer", "printer")
QUESTIONS = {  # attribute -> (question template, data_source)
    "birthplace": ("Where was {name} born?", "world_1hop"),
    "birth_year": ("In which year was {name} born?", "world_1hop"),
    "occupation": ("What was the occupation of {name}?", "world_1hop"),
    "region": ("In which region was the birthplace of {name}?", "world_2hop"),
}


def article(noun: str) -> str:
    """"a glassblower", "an astronomer"."""
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def syllable(rng: random.Random) -> str:
    """One invented syllable: onset + vowel + optional coda, e.g. "vel", "tam", "brou"."""
    return rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS)


def invent(rng: random.Random, n: int, syllables: int, taken: set, suffix: str = "") -> list[str]:
    """n new capitalised words of `syllables` syllables (+ suffix), none in `taken` (which grows by them)."""
    out = []
    while len(out) < n:
        word = ("".join(syllable(rng) for _ in range(syllables)) + suffix).capitalize()
        if word not in taken and len(word) <= 12:
            taken.add(word)
            out.append(word)
    return out


def make_world(seed: int = 0, people: int = 600, towns: int = 60, regions: int = 8, test_frac: float = 0.2) -> dict:
    """The world as plain data, deterministic in its arguments.

    Returns {"people": [P] dicts {"name", "birthplace", "birth_year", "occupation", "region", "split"}, "towns": {town:
    region}, "corpus": [P + towns] passage rows, "train" / "test": question rows}. Raises ValueError on sizes that
    cannot make a world (fewer than 10 people, no town or region, test_frac outside (0, 1)).
    """
    if people < 10 or towns < 1 or regions < 1 or not 0 < test_frac < 1:
        raise ValueError(f"need people >= 10, towns >= 1, regions >= 1 and 0 < test_frac < 1; got people={people}, "
                         f"towns={towns}, regions={regions}, test_frac={test_frac}")
    rng, taken = random.Random(seed), set()
    region_names = invent(rng, regions, 2, taken, suffix="ia")
    town_names = invent(rng, towns, 2, taken)
    town_region = {t: region_names[i % regions] for i, t in enumerate(town_names)}  # every region has towns
    firsts, lasts = invent(rng, people, 2, taken), invent(rng, people, 2, taken)  # every name part unique
    persons = [{"name": f"{first} {last}", "birthplace": rng.choice(town_names),
                "birth_year": str(rng.randint(1700, 1950)), "occupation": rng.choice(OCCUPATIONS)}
               for first, last in zip(firsts, lasts)]
    n_test = max(1, round(test_frac * people))
    for i, p in enumerate(persons):
        p["region"] = town_region[p["birthplace"]]
        p["split"] = "test" if i >= people - n_test else "train"  # names are random, so the tail is a random sample
    corpus = [{"id": str(i), "contents": f'"{p["name"]}"\n{p["name"]} was born in {p["birthplace"]} in '
                                         f'{p["birth_year"]} and worked as {article(p["occupation"])}.'}
              for i, p in enumerate(persons)]
    corpus += [{"id": str(people + i), "contents": f'"{t}"\n{t} is a town in the region of {town_region[t]}.'}
               for i, t in enumerate(town_names)]
    questions = {"train": [], "test": []}
    for i, p in enumerate(persons):
        for attr, (template, source) in QUESTIONS.items():
            titles = [p["name"]] + ([p["birthplace"]] if attr == "region" else [])
            questions[p["split"]].append({
                "id": f"{i}-{attr}", "question": template.format(name=p["name"]), "golden_answers": [p[attr]],
                "data_source": source, "metadata": {"person": p["name"], "attribute": attr,
                                                    "supporting_titles": titles}})
    for rows in questions.values():
        random.Random(seed + 1).shuffle(rows)
    return {"people": persons, "towns": town_region, "corpus": corpus, **questions}


def write_jsonl(path: Path, rows: list[dict]):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def write_world(world: dict, out: Path) -> dict:
    """Write corpus.jsonl, world_train.jsonl and world_test.jsonl into `out` (created); return {name: path}."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"corpus": out / "corpus.jsonl", "train": out / "world_train.jsonl", "test": out / "world_test.jsonl"}
    for key, path in paths.items():
        write_jsonl(path, world[key])
    return paths


def top1_rates(world: dict, retriever: BM25Retriever) -> dict:
    """Share of people whose name, and of towns whose name, finds that entity's own passage at BM25 rank 1."""
    names = [p["name"] for p in world["people"]]
    towns = list(world["towns"])

    def hit(queries):
        tops = retriever.search(queries, 1)
        return sum(bool(h) and passage_title(h[0]) == q for q, h in zip(queries, tops)) / len(queries)

    return {"person_top1": hit(names), "town_top1": hit(towns)}


def tokenizer_texts(world: dict) -> list[str]:
    """The warm start's BPE training text (warm_start.build_tokenizer): the chat-wrapped prompt and the demonstration
    turns with towns in the name slots, passages without person names, the observation tags and the invalid-action
    message, and every name syllable alone (capitalised and not, with and without a leading space). Person names
    never appear whole, so every name, train or test, splits into the same kind of pieces."""
    from rollout import INVALID_ACTION, OBS_HEAD, OBS_TAIL, PROMPT
    from warm_start import ANSWER_TURN, SEARCH_TURN

    lines = [INVALID_ACTION, OBS_HEAD + OBS_TAIL] + [f"Doc {i}(Title: " for i in range(1, 4)]
    for town, region in world["towns"].items():
        for template, _ in QUESTIONS.values():
            lines.append(f"<|im_start|>user\n{PROMPT.format(question=template.format(name=town))}<|im_end|>\n"
                         f"<|im_start|>assistant\n")
        lines += [SEARCH_TURN.format(query=town), ANSWER_TURN.format(answer=region),
                  f'Doc 1(Title: "{town}") {town} is a town in the region of {region}.\n']
    for p in world["people"]:
        lines.append(f"was born in {p['birthplace']} in {p['birth_year']} and worked as {article(p['occupation'])}.\n")
        lines.append(ANSWER_TURN.format(answer=p["occupation"]))
    syllables = [o + v + c for o in ONSETS for v in VOWELS for c in dict.fromkeys(CODAS)]  # ordered: no hash seed
    lines += [" ".join(s.capitalize() for s in syllables), " ".join(syllables), "".join(syllables)]
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for corpus.jsonl, world_*.jsonl and policy/")
    ap.add_argument("--seed", type=int, default=0, help="seeds the world, the tokenizer corpus and the warm start")
    ap.add_argument("--people", type=int, default=600, help="invented people (one passage and 4 questions each)")
    ap.add_argument("--towns", type=int, default=60, help="invented towns (one passage each)")
    ap.add_argument("--regions", type=int, default=8, help="invented regions (the 2-hop answers)")
    ap.add_argument("--test-frac", type=float, default=0.2, help="share of people whose questions are test questions")
    ap.add_argument("--sft-steps", type=int, default=1500, help="warm-start optimizer steps (0: write the world only)")
    ap.add_argument("--sft-batch-size", type=int, default=8, help="demonstrations per warm-start step")
    ap.add_argument("--sft-lr", type=float, default=3e-3, help="warm-start AdamW peak learning rate")
    ap.add_argument("--wrong-frac", type=float, default=0.3,
                    help="share of demonstrations whose final answer is a wrong value (mixed rewards for RL)")
    ap.add_argument("--redraw-errors", action="store_true",
                    help="redraw each demonstration's error at every draw (a habit, not a memorised wrong answer)")
    ap.add_argument("--guess-frac", type=float, default=0.0,
                    help="with --redraw-errors: share of draws that answer without searching (a random value)")
    ap.add_argument("--max-obs-tokens", type=int, default=120, help="per <information> block, as train.py's")
    ap.add_argument("--eval-questions", type=int, default=64, help="train and test questions for the sampled EM")
    args = ap.parse_args(argv)
    if (args.sft_steps < 0 or args.sft_batch_size < 1 or not args.sft_lr > 0 or args.eval_questions < 1
            or not 0 <= args.wrong_frac <= 1 or args.max_obs_tokens < 1
            or not 0 <= args.guess_frac <= 1 - args.wrong_frac or (args.guess_frac and not args.redraw_errors)):
        ap.error("need --sft-steps >= 0, --sft-batch-size >= 1, --sft-lr > 0, --eval-questions >= 1, "
                 "0 <= --wrong-frac <= 1, 0 <= --guess-frac <= 1 - --wrong-frac (with --redraw-errors) and "
                 "--max-obs-tokens >= 1")
    t0, out = time.time(), Path(args.out)
    if file := next((p for p in (out, *out.parents) if p.is_file()), None):
        ap.error(f"--out {out}: {file} is a file, not a folder")
    try:
        world = make_world(args.seed, args.people, args.towns, args.regions, args.test_frac)
    except ValueError as err:
        ap.error(str(err))
    paths = write_world(world, out)
    retriever = BM25Retriever(world["corpus"])  # what train.py builds from corpus.jsonl (lucene, english analyzer)
    rates = top1_rates(world, retriever)
    n_train = sum(p["split"] == "train" for p in world["people"])
    print(f"world: {len(world['people'])} people ({n_train} train, {len(world['people']) - n_train} test), "
          f"{len(world['towns'])} towns, {len(set(world['towns'].values()))} regions | "
          f"{len(world['corpus'])} passages | "
          f"{len(world['train'])} train / {len(world['test'])} test questions | BM25 top-1: name -> person "
          f"{rates['person_top1']:.3f}, town -> town {rates['town_top1']:.3f} | {time.time() - t0:.1f}s")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    if args.sft_steps:
        import warm_start

        warm_start.run(world, tokenizer_texts(world), retriever, out / "policy", seed=args.seed,
                       sft_steps=args.sft_steps, wrong_frac=args.wrong_frac, max_obs_tokens=args.max_obs_tokens,
                       eval_questions=args.eval_questions, batch_size=args.sft_batch_size, lr=args.sft_lr,
                       redraw=args.redraw_errors, guess_frac=args.guess_frac)


if __name__ == "__main__":
    main()
