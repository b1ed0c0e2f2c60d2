"""lab/warm_start_qa.py: a demonstration built on a FlashRAG question row is what rollout.rollout builds when the
policy emits its turns (loss_mask 0 exactly on the BM25 observations, at most max_turns searches), a few supervised
steps under bf16 autocast lower the loss, the saved folder loads as train.py loads it, and bad input is one line.
The tiny model of tests/tiny.py and a 5-question, 7-passage fixture, so the file runs in seconds."""

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lab")]

import hang  # noqa: E402
import tiny  # noqa: E402
import warm_start as S  # noqa: E402
import warm_start_qa as Q  # noqa: E402
from machinery.policy import autocast, load_policy  # noqa: E402
from machinery.data import DEMO_CORPUS  # noqa: E402
from retriever import BM25Retriever  # noqa: E402
from rollout import format_passages, observation_ids, rollout  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CORPUS = DEMO_CORPUS + [
    {"id": "5", "contents": '"Seine"\nThe Seine is a river that flows through Paris.'},
    {"id": "6", "contents": '"Louvre"\nThe Louvre is a museum in Paris that holds the Mona Lisa.'},
]
ROWS = [  # FlashRAG rows as scripts/prepare_data.py writes them; the 3-title one is cut to max_turns searches
    {"id": "h1", "question": "Which river flows through the capital of France?", "golden_answers": ["Seine"],
     "data_source": "hotpotqa", "metadata": {"type": "bridge", "supporting_titles": ["Paris", "Seine"]}},
    {"id": "h2", "question": "In which city is the Eiffel Tower", "golden_answers": ["Paris"],
     "data_source": "hotpotqa", "metadata": {"supporting_titles": ["Eiffel Tower"]}},
    {"id": "h3", "question": "Which country does the Rhine flow through?", "golden_answers": ["Germany", "Netherlands"],
     "data_source": "hotpotqa", "metadata": {"supporting_titles": ["Rhine", "Berlin"]}},
    {"id": "m1", "question": "Which museum in the city of the Seine holds the Mona Lisa?",
     "golden_answers": ["the Louvre"], "data_source": "musique",
     "metadata": {"type": "3hop1", "supporting_titles": ["Seine", "Paris", "Louvre"]}},
    {"id": "m2", "question": "What kind of thing is an apple?", "golden_answers": ["a fruit"],
     "data_source": "musique", "metadata": {"type": "2hop", "supporting_titles": ["Apple"]}},
]
MAX_OBS = 40  # cuts the longer observations, as --max-obs-tokens does


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


@pytest.fixture(scope="module")
def retriever():
    return BM25Retriever(CORPUS)


@pytest.fixture
def files(tmp_path):
    return {"train": write_jsonl(tmp_path / "qa_train.jsonl", ROWS),
            "corpus": write_jsonl(tmp_path / "corpus.jsonl", CORPUS),
            "model": tiny.save_tiny(tmp_path / "tiny")}


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_a_demonstration_replays_through_rollout(row, tok, retriever):
    (demo,) = Q.qa_demonstrations([row], tok, retriever.search, max_turns=2, max_obs_tokens=MAX_OBS)
    titles = row["metadata"]["supporting_titles"][:2]
    turns = iter(S.model_turns(demo))

    def generate(contexts):  # the demonstration's next model turn, then text that rollout's cut_turn must drop
        return [next(turns) + tok.encode(" and more", add_special_tokens=False) for _ in contexts]

    generate.eos_ids = frozenset({tok.eos_token_id})
    (ep,) = rollout(generate, tok, [row], retriever.search, group_size=1, max_turns=2, max_obs_tokens=MAX_OBS)
    assert (ep.prompt_ids, ep.response_ids) == (demo.prompt_ids, demo.response_ids)
    assert (ep.loss_mask, ep.answer_mask) == (demo.loss_mask, demo.answer_mask)
    assert (ep.reward, demo.reward, ep.num_searches, demo.num_searches) == (1.0, 1.0, len(titles), len(titles))

    # loss_mask 0 exactly on the observations: BM25's top 3 for each title, formatted as the rollout formats them
    observations = [observation_ids(format_passages(retriever.search([t], 3)[0]), tok, MAX_OBS) for t in titles]
    actions = [S.SEARCH_TURN.format(query=t) for t in titles] + [S.ANSWER_TURN.format(answer=row["golden_answers"][0])]
    expected, mask = [], []
    for k, action in enumerate(actions):
        ids = tok.encode(action, add_special_tokens=False)
        expected, mask = expected + ids, mask + [1] * len(ids)
        if k < len(observations):
            expected, mask = expected + observations[k], mask + [0] * len(observations[k])
    assert (demo.response_ids, demo.loss_mask) == (expected, mask)
    assert "</information>" in tok.decode(observations[0])  # cut inside the tags, never through them


def test_a_few_supervised_steps_under_bf16_autocast_lower_the_loss(tok, retriever):
    demos = Q.qa_demonstrations(ROWS, tok, retriever.search, max_turns=2, max_obs_tokens=MAX_OBS)
    model = tiny.build_model(tok, seed=0)
    with torch.no_grad():
        before = S.sft_loss(model, demos, tok.pad_token_id).item()
    losses = S.sft(model, demos, tok.pad_token_id, 10, batch_size=4, lr=1e-2, seed=0, progress=False,
                   amp=autocast("bf16", "cpu"))
    with torch.no_grad():
        after = S.sft_loss(model, demos, tok.pad_token_id).item()
    assert len(losses) == 10 and after < 0.8 * before, (before, after)


def test_the_saved_folder_loads_as_train_py_loads_it(files, tmp_path, capsys):
    out = tmp_path / "warm"
    argv = ["--model", files["model"], "--train-data", files["train"], "--corpus", files["corpus"], "--out", str(out),
            "--sft-steps", "3", "--sft-batch-size", "2", "--sft-lr", "1e-3", "--amp", "off", "--max-turns", "2",
            "--max-obs-tokens", str(MAX_OBS), "--max-new-tokens", "6", "--eval-questions", "2"]
    Q.main(argv)
    printed = capsys.readouterr().out
    assert "3 training questions" in printed  # 2 of the 5 held out: no --test-data
    for line in ("before: sampled EM on 2 train questions x 2: ", "before: sampled EM on 2 held-out questions x 2: ",
                 "after: sampled EM on 2 train questions x 2: ", "after: sampled EM on 2 held-out questions x 2: "):
        assert line in printed
    # --measure-only (issue 47): the saved model on the questions of the "after" lines gives their figures;
    # nothing is trained or written
    written = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    model_args = ["--model", str(out), *argv[2:argv.index("--out")], *argv[argv.index("--out") + 2:]]
    Q.main(model_args + ["--measure-only"])
    measured = capsys.readouterr().out.splitlines()
    after = [line.split(" | ")[:-1] for line in printed.splitlines() if line.startswith("after: ")]
    assert [line.replace("measured: ", "after: ", 1).split(" | ")[:-1] for line in measured
            if line.startswith("measured: ")] == after  # exact: the same sampling of the same weights, here
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == written  # exact: untouched
    with pytest.raises(SystemExit, match="--measure-only with --eval-questions 0: nothing to measure"):
        Q.main(model_args + ["--measure-only", "--eval-questions", "0"])
    with pytest.raises(SystemExit, match="--out: required"):
        Q.main(model_args)
    model, tok, _ = load_policy(str(out), device="cpu")
    base, _, _ = load_policy(files["model"], device="cpu")
    assert tok.chat_template == tiny.CHAT_TEMPLATE and len(tok) == len(tiny.build_tokenizer())
    assert (model.lm_head.weight - base.lm_head.weight).abs().max() > 0  # trained
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary folder left

    Q.main(argv + ["--overwrite", "--sft-steps", "1", "--eval-questions", "0"])  # replaced only once saved
    again, _, _ = load_policy(str(out), device="cpu")
    assert (again.lm_head.weight - model.lm_head.weight).abs().max() > 0  # the new run's weights, not the first's
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []



def test_bad_input_is_one_line(files, tmp_path):
    untitled = [{k: v for k, v in r.items() if k != "metadata"} for r in ROWS]
    no_titles = write_jsonl(tmp_path / "nq_train.jsonl", ROWS[:2] + untitled[2:3])
    (tmp_path / "taken").mkdir()
    (tmp_path / "a_file").write_text("x")
    base = ["--model", files["model"], "--corpus", files["corpus"], "--sft-steps", "1"]
    cases = {
        "question file not found: ": ["--train-data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")],
        "1 of 3 questions have no metadata.supporting_titles (the first: question 3, id h3)":
            ["--train-data", no_titles, "--out", str(tmp_path / "o")],
        "exists; pass --overwrite to replace it": ["--train-data", files["train"], "--out", str(tmp_path / "taken")],
        "a file, not a folder": ["--train-data", files["train"], "--out", str(tmp_path / "a_file"), "--overwrite"],
        "corpus file not found": ["--train-data", files["train"], "--out", str(tmp_path / "o"),
                                  "--corpus", str(tmp_path / "none.jsonl")],
        "--sft-lr 0.0: must be > 0": ["--train-data", files["train"], "--out", str(tmp_path / "o"), "--sft-lr", "0"],
    }
    for message, argv in cases.items():
        with pytest.raises(SystemExit) as err:
            Q.main(base + argv)
        text = str(err.value.code)
        assert text.startswith("error: ") and message in text and "\n" not in text, text
    assert not (tmp_path / "o").exists()


def test_the_command_line_says_it_in_one_line(files, tmp_path):
    untitled = [{k: v for k, v in r.items() if k != "metadata"} for r in ROWS]
    no_titles = write_jsonl(tmp_path / "nq_train.jsonl", untitled)
    out = hang.run([sys.executable, str(ROOT / "lab" / "warm_start_qa.py"), "--model", files["model"],
                    "--train-data", files["train"], no_titles, "--corpus", files["corpus"],
                    "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == [f"error: --train-data {no_titles}: 5 of 5 questions have no "
                                       "metadata.supporting_titles (the first: question 1, id h1); the demonstrations "
                                       "search those titles, which HotpotQA and MuSiQue rows carry "
                                       "(scripts/prepare_data.py)"]
