"""lab/search_world.py and lab/warm_start.py: the generated world is seeded and split by person, every answer
is in the corpus, a demonstration is exactly what rollout.rollout builds when the policy emits its turns, the saved
policy loads as train.py loads it, and a few supervised steps lower the loss. Small worlds, so the file runs in
seconds."""

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))
sys.path.insert(0, str(ROOT))

import hang  # noqa: E402
import search_world as W  # noqa: E402
import warm_start as S  # noqa: E402
from retriever import BM25Retriever  # noqa: E402
from rollout import make_prompt, rollout  # noqa: E402


@pytest.fixture(scope="module")
def world():
    return W.make_world(seed=3, people=40, towns=6, regions=3)


@pytest.fixture(scope="module")
def tok(world):
    return S.build_tokenizer(W.tokenizer_texts(world), vocab_size=600)


@pytest.fixture(scope="module")
def retriever(world):
    return BM25Retriever(world["corpus"])


def test_same_seed_same_files_other_seed_other_world(tmp_path):
    files = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        paths = W.write_world(W.make_world(seed=seed, people=40, towns=6), tmp_path / name)
        files[name] = {k: p.read_bytes() for k, p in paths.items()}
    assert files["a"] == files["b"]
    assert all(files["a"][k] != files["c"][k] for k in files["a"])


def test_people_are_split_and_names_unique(world):
    people = {s: {r["metadata"]["person"] for r in world[s]} for s in ("train", "test")}
    assert people["train"] and people["test"] and not people["train"] & people["test"]
    assert len(people["test"]) == 8  # test_frac 0.2 of 40
    names = [p["name"] for p in world["people"]]
    parts = [w for n in names for w in n.split()]
    assert len(set(parts)) == len(parts)  # every first and last name once: a name query has one best passage
    train_text = " ".join(r["question"] for r in world["train"])
    assert not any(n in train_text for n in people["test"])
    assert {r["data_source"] for r in world["train"] + world["test"]} == {"world_1hop", "world_2hop"}


def test_every_answer_is_in_its_supporting_passages(world):
    passages = {c["contents"].split("\n")[0].strip('"'): c["contents"] for c in world["corpus"]}
    for row in world["train"] + world["test"]:
        titles, (gold,) = row["metadata"]["supporting_titles"], row["golden_answers"]
        person = passages[row["metadata"]["person"]]
        if row["data_source"] == "world_1hop":
            assert titles == [row["metadata"]["person"]] and gold in person.split("\n")[1].rstrip(".").split()
        else:  # the person's passage names the town, the town's passage names the region
            town = titles[1]
            assert f" born in {town} " in person and passages[town].endswith(f"region of {gold}.")


def test_bm25_finds_each_person_and_town_first(world, retriever):
    assert W.top1_rates(world, retriever) == pytest.approx({"person_top1": 1.0, "town_top1": 1.0})


def test_bad_world_size_is_one_error_line(tmp_path):
    out = hang.run([sys.executable, str(ROOT / "lab" / "search_world.py"), "--out", str(tmp_path),
                    "--people", "5", "--sft-steps", "0"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("search_world.py: error: need people >= 10")
    with pytest.raises(ValueError, match="test_frac"):
        W.make_world(test_frac=1.0)


def test_tokenizer_has_the_chat_template_and_no_whole_names(world, tok):
    assert make_prompt("Where was X born", tok).startswith("<|im_start|>user\nAnswer the given question.")
    assert make_prompt("Where was X born", tok).endswith("Where was X born?\n<|im_end|>\n<|im_start|>assistant\n")
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    vocab = tok.get_vocab()
    for p in world["people"]:  # names are copied piece by piece, never memorised as one token
        assert not any(("Ġ" + part) in vocab or part in vocab for part in p["name"].split())


@pytest.mark.parametrize("source", ["world_1hop", "world_2hop"])
def test_a_demonstration_replays_through_rollout(world, tok, retriever, source):
    row = next(r for r in world["train"] if r["data_source"] == source)
    demo = S.demonstration(row, tok, retriever.search, max_obs_tokens=120)
    turns = S.model_turns(demo)
    assert len(turns) == len(row["metadata"]["supporting_titles"]) + 1 and demo.reward == 1.0

    def generate(contexts):  # the demonstration's next model turn, then overshoot that cut_turn must drop
        (context,) = contexts
        done = len(context) - len(demo.prompt_ids)
        mask = demo.loss_mask[:done + 1]  # the turn to give = the observation -> model switches up to here
        k = sum(1 for i in range(1, len(mask)) if mask[i - 1] == 0 and mask[i])
        return [turns[k] + tok.encode(" trailing text", add_special_tokens=False)]

    generate.eos_ids = frozenset({tok.eos_token_id})
    (ep,) = rollout(generate, tok, [row], retriever.search, group_size=1, max_turns=2, max_obs_tokens=120)
    assert ep.prompt_ids == demo.prompt_ids
    assert (ep.response_ids, ep.loss_mask, ep.answer_mask) == (demo.response_ids, demo.loss_mask, demo.answer_mask)
    assert (ep.reward, ep.num_searches, ep.answer) == (1.0, demo.num_searches, row["golden_answers"][0])
    assert sum(demo.answer_mask) > 0 and all(m for a, m in zip(demo.answer_mask, demo.loss_mask) if a)


def test_wrong_demonstrations_answer_another_value_of_the_same_kind(world, tok, retriever):
    demos = S.demonstrations(world, tok, retriever.search, max_obs_tokens=120, wrong_frac=0.5, seed=0)
    wrong = [d for d in demos if d.reward == 0]
    assert 0.3 < len(wrong) / len(demos) < 0.7
    years = {p["birth_year"] for p in world["people"]}
    for d, row in zip(demos, world["train"]):
        assert d.question == row["question"]
        if d.reward == 0 and row["metadata"]["attribute"] == "birth_year":
            assert d.answer in years and d.answer not in row["golden_answers"]


def test_saved_policy_loads_as_train_py_loads_it(tok, tmp_path):
    from machinery.policy import load_policy

    model = S.build_model(tok, layers=1, hidden=32)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, tok2, _ = load_policy(str(tmp_path), device="cpu")
    assert tok2.encode("Velor Tamsik") == tok.encode("Velor Tamsik") and tok2.chat_template == tok.chat_template
    assert loaded.config.vocab_size == len(tok2) and loaded.generation_config.eos_token_id == tok.eos_token_id


def test_a_few_supervised_steps_lower_the_loss(world, tok, retriever):
    demos = S.demonstrations(world, tok, retriever.search, max_obs_tokens=120, wrong_frac=0.0, seed=0)[:8]
    model = S.build_model(tok, layers=1, hidden=32, seed=0)
    with torch.no_grad():
        before = S.sft_loss(model, demos, tok.pad_token_id).item()
    losses = S.sft(model, demos, tok.pad_token_id, 12, batch_size=4, lr=1e-2, seed=0, progress=False)
    with torch.no_grad():
        after = S.sft_loss(model, demos, tok.pad_token_id).item()
    assert len(losses) == 12 and after < 0.8 * before, (before, after)


def test_tokenizer_is_the_same_in_every_process():
    # a set's order changes with PYTHONHASHSEED; the BPE's training text must not depend on it
    code = ("import hashlib, sys; sys.path.insert(0, 'lab'); import search_world as W, warm_start as S; "
            "t = S.build_tokenizer(W.tokenizer_texts(W.make_world(seed=3, people=40, towns=6)), vocab_size=600); "
            "print(hashlib.sha256(t.backend_tokenizer.to_str().encode()).hexdigest())")
    out = [hang.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                    env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2")]
    assert all(o.returncode == 0 for o in out), out[0].stderr[-500:]
    assert out[0].stdout == out[1].stdout and len(out[0].stdout.strip()) == 64


def test_redrawn_errors_are_a_habit_not_a_memorised_answer(world, tok, retriever):
    draw = S.redrawn_demonstrations(world, tok, retriever.search, max_obs_tokens=120, wrong_frac=0.2,
                                    guess_frac=0.3, seed=0)
    gen = torch.Generator().manual_seed(0)
    eps = [e for _ in range(40) for e in draw(gen, 10)]  # 400 draws over 32 training questions
    guesses = [e for e in eps if e.num_searches == 0]
    wrong = [e for e in eps if e.num_searches and e.reward == 0]
    assert 0.2 < len(guesses) / len(eps) < 0.4 and 0.12 < len(wrong) / len(eps) < 0.28
    assert all(e.text.startswith("<think> I know the answer. </think>\n<answer> ") for e in guesses)
    answers = {}
    for e in eps:  # one question is answered right, wrong and by a guess at different draws, with several values
        answers.setdefault(e.question, set()).add((e.num_searches > 0, e.reward, e.answer))
    assert max(len(a) for a in answers.values()) >= 4
    with pytest.raises(ValueError, match="wrong_frac \\+ guess_frac <= 1"):
        S.redrawn_demonstrations(world, tok, retriever.search, max_obs_tokens=120, wrong_frac=0.6, guess_frac=0.5,
                                 seed=0)


def test_a_guess_replays_through_rollout(world, tok, retriever):
    row = world["train"][0]
    demo = S.demonstration(row, tok, retriever.search, max_obs_tokens=120, answer="Nowhere", searches=False)
    (turn,) = S.model_turns(demo)
    def generate(contexts):
        return [turn]
    generate.eos_ids = frozenset({tok.eos_token_id})
    (ep,) = rollout(generate, tok, [row], retriever.search, group_size=1, max_turns=2, max_obs_tokens=120)
    assert (ep.response_ids, ep.loss_mask, ep.answer_mask) == (demo.response_ids, demo.loss_mask, demo.answer_mask)
    assert (ep.num_searches, ep.answer, ep.reward) == (0, "Nowhere", 0.0)


def test_out_file_is_one_error_line(tmp_path):
    """--out FILE (or a folder below a file) was a FileExistsError traceback from write_world."""
    (tmp_path / "file").write_text("")
    for out in (tmp_path / "file", tmp_path / "file" / "world"):
        r = hang.run([sys.executable, str(ROOT / "lab" / "search_world.py"), "--out", str(out), "--sft-steps",
                      "0"], capture_output=True, text=True)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines()[-1] == (f"search_world.py: error: --out {out}: {tmp_path}/file is a file, "
                                                     "not a folder")
