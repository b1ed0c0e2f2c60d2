"""Multi-turn search rollouts as Search-R1 runs them, each scored by its exact-match reward.

Source: Search-R1 `search_r1/llm_agent/generation.py` (run_llm_loop),
`verl/utils/reward_score/qa_em.py` and `scripts/data_process/qa_search_train_merge.py` (prompt), as
the LLDS paper (arXiv 2512.04220, v2 Sec. 3 and App. B.2.1) trains with them. A trajectory is (y_0,
o_0, y_1, o_1, ..., y_T): model actions y_t and tool observations o_t. The model writes
<think>...</think>, then <search> query </search> (we append "\n\n<information>top-k
docs</information>\n\n") or <answer> ... </answer> (the trajectory ends); anything else gets the
invalid-action message. After `max_turns` such turns, one last generation runs with no search
executed. The reward is r_i = EM(the last <answer> of the model's own actions, the golds); loss_mask
is 1 on the tokens of the y_t, 0 on those of the o_t.

Every row of a batch is one trajectory; the G trajectories of a prompt are contiguous and share
`group_id`, a per-batch prompt number (never a dataset row index, P4). `rollout` takes its engine
(`generate`, machinery/engine.py) and its `search` (retriever.py) as callables. Departures:
docs/departures.md. Run `python rollout.py` for a demo of the reward and the observation format.
"""

import re
import string
from collections import Counter
from dataclasses import dataclass, field

import torch

PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new "
    "information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query "
    "</search> and it will return the top searched results between <information> and "
    "</information>. You can search as "
    "many times as your want. If you find no further external knowledge needed, you can directly "
    "provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing "
    "</answer>. "
    "Question: {question}\n"
)
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> "
    "and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
OBS_HEAD, OBS_TAIL = "\n\n<information>", "</information>\n\n"
STOP_STRINGS = ("</search>", "</answer>")
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# greedy: ends at the last non-space character followed by a space
WORD_END = re.compile(r".*\S(?= )", re.DOTALL)

# --------------------------------------------------------------------------------------------------
# Reward: exact match (qa_em.py)


def normalize_answer(s: str) -> str:
    """Search-R1 / SQuAD normalisation, in its exact order: lower, drop ASCII punctuation, drop
    a/an/the, squash spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def em_check(prediction: str | None, golden_answers) -> float:
    """1.0 if the normalised prediction equals the normalised form of any gold alias, else 0.0
    (qa_em.em_check).

    golden_answers: a str or a list of str. Guard (P20): a gold that normalises to "" (e.g. "The")
    would match an empty or article-only prediction; such golds are compared on their lower-cased,
    whitespace-squashed text instead.
    """
    if prediction is None:
        return 0.0
    golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    pred = normalize_answer(prediction)
    for gold in golds:
        g = normalize_answer(gold)
        # NOTE(P20): P20 guard; Search-R1 would match an empty / article-only prediction
        # here
        if g == "":
            if " ".join(prediction.lower().split()) == " ".join(gold.lower().split()) != "":
                return 1.0
        elif pred == g:
            return 1.0
    return 0.0


def f1_score(prediction: str | None, golden_answers) -> float:
    """Token F1 over normalize_answer tokens, max over golds (SQuAD v1.1 / FlashRAG F1_Score;
    evaluate.py's column, and the answer score of CalibAdv's silver passages,
    machinery/calibadv.py).

    F1 = 2 P R / (P + R), P = |common| / |pred tokens|, R = |common| / |gold tokens| (multiset
    overlap). As FlashRAG (and HotpotQA's official script): a "yes"/"no"/"noanswer" on either side
    scores 0 unless both are equal.
    """
    if prediction is None:
        return 0.0
    pred, best = normalize_answer(prediction), 0.0
    for gold in [golden_answers] if isinstance(golden_answers, str) else golden_answers:
        g = normalize_answer(gold)
        if (pred in ("yes", "no", "noanswer") or g in ("yes", "no", "noanswer")) and pred != g:
            continue
        common = sum((Counter(pred.split()) & Counter(g.split())).values())
        if common:
            p, r = common / len(pred.split()), common / len(g.split())
            best = max(best, 2 * p * r / (p + r))
    return best


def extract_answer(response_text: str) -> str | None:
    """The last <answer>...</answer> of a response text (rollout passes one model action), stripped;
    None if none.

    P1: Search-R1 searches prompt + response and returns None unless there are >= 2
    matches.
    """
    matches = ANSWER_RE.findall(response_text)
    # NOTE(P1): last match of the response only; Search-R1 needs >= 2 over prompt +
    # response (P1)
    return matches[-1].strip() if matches else None


# --------------------------------------------------------------------------------------------------
# Prompt and observations


def make_prompt(question: str, tokenizer) -> str:
    """Search-R1's instruction for one question (a '?' is appended if missing), wrapped in the chat
    template if the tokenizer has one (add_generation_prompt=True), else the raw text. Raises
    ValueError on an empty question."""
    q = question.strip()
    if not q:
        raise ValueError("empty question")
    if not q.endswith("?"):
        q += "?"
    text = PROMPT.format(question=q)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


def format_passages(hits: list[dict]) -> str:
    """One query's hits -> the observation text, as Search-R1's `_passages2string` (generation.py)
    builds it.

    Each hit's contents '"Title"\\ntext' gives the line f"Doc {i+1}(Title: {title}) {text}\\n",
    where title is the first line (quotes kept) and text the remaining lines joined by "\\n". No
    hits -> "".
    """
    out = ""
    for i, hit in enumerate(hits):
        lines = hit["document"]["contents"].split("\n")
        title, text = lines[0], "\n".join(lines[1:])
        out += f"Doc {i + 1}(Title: {title}) {text}\n"
    return out


def _word_prefix(text: str, n: int) -> str:
    """text cut to at most n characters, just before a space that follows a non-space, so that no
    pre-token straddles the cut: a GPT-2/Qwen/Llama-3-style pre-tokenizer never joins "x" and a
    following " " (it does join "." and a following "\\n", hence spaces only), so the prefix's
    tokens are exactly the first tokens of the whole text. Without such a space in text[n // 2 : n +
    1] (a "word" of over n / 2 characters: no real passage) the cut is at n anyway."""
    if n >= len(text):
        return text
    m = WORD_END.match(text, n // 2, n + 1)  # one C-level backtrack from n, however long the text
    return text[:m.end()] if m else text[:n]


def observation_ids(docs: str, tokenizer, max_obs_tokens: int) -> list[int]:
    """Token ids of "\\n\\n<information>{docs}</information>\\n\\n", at most max_obs_tokens long.

    The document text is cut to fit *inside* the tags (P12), so the block is always
    closed. Only a prefix of the text is tokenized: about 8 characters per token of budget, doubled
    until it gives the budget (a 10 MB passage costs what a short one does, where tokenizing it all
    took seconds and gigabytes). The prefix ends at a word boundary (`_word_prefix`), so the ids
    equal those of tokenizing the whole text and cutting them (the tests check it on the real
    corpus). Raises ValueError if the budget cannot even hold the two tags.
    """
    head = tokenizer.encode(OBS_HEAD, add_special_tokens=False)
    tail = tokenizer.encode(OBS_TAIL, add_special_tokens=False)
    budget = max_obs_tokens - len(head) - len(tail)
    if budget < 0:
        raise ValueError(f"max_obs_tokens={max_obs_tokens} cannot hold the <information> tags "
                         f"({len(head) + len(tail)})")
    # Qwen: ~4 characters per English token, so one pass is the rule
    text, n = docs.strip(), 8 * budget + 64
    while True:
        prefix = _word_prefix(text, n)
        body = tokenizer.encode(prefix, add_special_tokens=False) if budget else []
        if len(body) >= budget or len(prefix) == len(text):
            break
        n *= 2
    # NOTE(P12): cut the text, then wrap; Search-R1 cuts the wrapped ids and loses
    # </information> (P12)
    return head + body[:budget] + tail


def check_obs_budget(tokenizer, max_obs_tokens: int):
    """Raise ValueError naming --max-obs-tokens if that budget cannot hold the <information> tags:
    checked at start-up (train.py, evaluate.py), not at the first search."""
    try:
        observation_ids("", tokenizer, max_obs_tokens)
    except ValueError as err:
        raise ValueError(f"--max-obs-tokens {max_obs_tokens} is too small: {err}") from None


def longest_prompt(tokenizer, rows: list[dict], context: int, flag: str = "--train-data",
                   of: int = 64) -> int:
    """Tokens of the longest prompt (make_prompt) of question rows `rows`, from the `of` longest
    questions by characters (the longest in tokens is among them unless a tokenization is freakish;
    a million questions would take minutes). Raises ValueError naming `flag` (one line, the question
    shown) when that prompt alone is longer than the model's `context`
    (config.max_position_embeddings: positions it never saw; it trained without a word before)."""
    longest = sorted(rows, key=lambda r: len(r["question"]))[-of:]
    n, question = max(
        (
            len(tokenizer.encode(make_prompt(r["question"], tokenizer), add_special_tokens=False)),
            r["question"],
        )
        for r in longest
    )
    if n > context:
        shown = question if len(question) <= 80 else question[:77] + "..."
        raise ValueError(f"{flag}: a prompt of {n} tokens is longer than the model's context of "
                         f"{context} ({shown!r}); "
                         "drop such questions or use a model with a longer context")
    return n


# --------------------------------------------------------------------------------------------------
# Cutting a turn by token index


def _first_prefix(ids: list[int], tokenizer, ok) -> int:
    """Smallest k in [1, len(ids)] with ok(decode(ids[:k])) true (ok must be monotone in k);
    len(ids) if none."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(tokenizer.decode(ids[:mid])):
            hi = mid
        else:
            lo = mid + 1
    return lo


def cut_turn(new_ids: list[int], tokenizer, eos_ids: set) -> tuple[list[int], bool]:
    """Keep the sampled ids up to and including the first EOS or the token that completes a stop
    string.

    Returns (kept ids, ended_on_eos). Never re-encodes text (P7); the EOS stays in (P9).
    """
    ended_on_eos = False
    for k, t in enumerate(new_ids):
        # NOTE(P9): EOS kept; Search-R1 decodes with skip_special_tokens and drops it
        if t in eos_ids:
            new_ids, ended_on_eos = new_ids[: k + 1], True
            break

    def has_stop(text: str) -> bool:
        return any(s in text for s in STOP_STRINGS)

    if new_ids and has_stop(tokenizer.decode(new_ids)):
        # NOTE(P7): cut by token index, never decode + re-encode as Search-R1 does
        new_ids, ended_on_eos = new_ids[: _first_prefix(new_ids, tokenizer, has_stop)], False
    return new_ids, ended_on_eos


def answer_span(action_ids: list[int], tokenizer) -> list[int]:
    """0/1 per token of one action: 1 on the tokens of its last <answer>...</answer> (tags
    included), for LLDS-MA.

    P28: any span length, mapped by prefix lengths of the sampled ids; the LLDS code
    searches the response's last 50 tokens only and re-tokenizes text to find the span
    (generation.py:426, 455-467).
    """
    text = tokenizer.decode(action_ids)
    spans = list(ANSWER_RE.finditer(text))
    if not spans:
        return [0] * len(action_ids)
    # NOTE(P28): the whole span, by prefix lengths of the sampled ids; the LLDS code reads
    # the last 50 tokens
    start = spans[-1].start()
    # token holding the '<' of <answer>
    first = _first_prefix(action_ids, tokenizer, lambda t: len(t) > start) - 1
    # tokens up to </answer>
    end = _first_prefix(action_ids, tokenizer, lambda t: len(t) >= spans[-1].end())
    return [1 if first <= k < end else 0 for k in range(len(action_ids))]


# --------------------------------------------------------------------------------------------------
# The rollout


@dataclass
class Episode:
    """One trajectory. response_ids = y_0 o_0 y_1 o_1 ... y_T exactly as sampled/appended; loss_mask
    aligned with it.

    Counts, as the LLDS code keeps them (generation.py:254-349): num_turns = generation calls;
    num_valid_actions = turns whose text parses as <search> or <answer> (valid_action_stats);
    num_valid_searches = turns that parse as <search>, *including* one in the final answer-only
    turn, which is not executed (valid_search_stats, :295, :338, :515-520; the LLDS-MA schedule
    averages it, dp_actor.py:275-277); num_searches = searches actually executed (logging).
    """

    question: str
    golden_answers: list
    data_source: str
    # the prompt's position in this batch: trajectories with the same id form one GRPO group
    group_id: int
    prompt_ids: list
    response_ids: list = field(default_factory=list)
    loss_mask: list = field(default_factory=list)  # 1 = sampled by the policy, 0 = observation
    # 1 on the final <answer>...</answer> tokens (LLDS-MA)
    answer_mask: list = field(default_factory=list)
    text: str = ""  # decoded response (logging and reward)
    answer: str | None = None
    reward: float = 0.0
    num_searches: int = 0  # searches executed
    # turns that parsed as <search>, the unexecuted one of the final turn too (LLDS-MA's V)
    num_valid_searches: int = 0
    # one list of hits (the `search` callable's) per executed search
    retrieved: list = field(default_factory=list)
    num_turns: int = 0  # generation calls
    num_valid_actions: int = 0
    ended_on_eos: bool = False
    done: bool = False

    def append(self, ids: list[int], trained: bool, answer_mask: list[int] | None = None):
        """Extend the response by `ids` ([n]): a model action (trained=True, loss_mask 1) or an
        observation (trained=False, loss_mask 0, tags included: P5). answer_mask: [n] 0/1
        (`answer_span`), actions only; default 0s. The only writer of response_ids / loss_mask /
        answer_mask, so the three stay aligned (P6: the mask is built while concatenating, never by
        a regex over decoded text). Raises ValueError on an answer_mask of another length, or with a
        1 on an observation."""
        answer_mask = [0] * len(ids) if answer_mask is None else list(answer_mask)
        if len(answer_mask) != len(ids) or (not trained and any(answer_mask)):
            kind = "action" if trained else "observation"
            raise ValueError(f"answer_mask {answer_mask} does not fit {len(ids)} {kind} ids")
        self.response_ids += ids
        # NOTE(P6): built while concatenating, no regex
        self.loss_mask += [int(trained)] * len(ids)
        self.answer_mask += answer_mask


def rollout(generate, tokenizer, rows: list[dict], search, *, group_size: int = 5,
            max_turns: int = 3,
            max_obs_tokens: int = 500, topk: int = 3) -> list[Episode]:
    """Roll out `group_size` trajectories per question; returns len(rows) * group_size Episodes,
    groups contiguous.

    generate: the engine, a callable (contexts: [N] lists of token ids, prompt + response so far) ->
    [N] lists of new ids, the turn up to its first EOS or stop string, possibly followed by more
    (padding, overshoot: `cut_turn` drops it), with an `eos_ids` attribute (the ids that end a turn)
    and an optional `reset()`, called when the rollout ends: machinery.engine.CBGenerator(model,
    tokenizer, stop_strings=STOP_STRINGS, ...) (the default), its hf_generator and kv_generator, or
    any function. search: a callable (queries: list[str], topk: int) -> one list of hits per query,
    as retriever.BM25Retriever.search and RemoteRetriever.search give them ([{"document": {"id",
    "contents"}, "score"}, ...]); the model sees `format_passages` of them, the Episode keeps them
    (Episode.retrieved). rows: dicts with "question", "golden_answers" (list of str) and optional
    "data_source". max_turns: search-enabled generations before the final answer-only one (LLDS
    trains with 3, Search-R1 with 4). max_obs_tokens: per observation (P12). topk: passages
    per search. Model tokens get loss_mask 1; observation tokens 0. Raises ValueError on a row
    without question/golden_answers.
    """
    episodes = []
    for i, row in enumerate(rows):
        if "question" not in row or "golden_answers" not in row:
            raise ValueError(f"question row {i} needs 'question' and 'golden_answers'; has "
                             f"{sorted(row)}")
        prompt_ids = tokenizer.encode(make_prompt(row["question"], tokenizer),
                                      add_special_tokens=False)
        for _ in range(group_size):  # contiguous groups (P3)
            # NOTE(P4): group_id = position in this batch, not Search-R1's dataset index
            # uid (P4)
            episodes.append(
                Episode(
                    row["question"],
                    list(row["golden_answers"]),
                    row.get("data_source", "unknown"),
                    group_id=i,
                    prompt_ids=prompt_ids,
                )
            )

    invalid = tokenizer.encode(INVALID_ACTION, add_special_tokens=False)
    for turn in range(max_turns + 1):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        final = turn == max_turns  # the answer-only turn: searches are not executed
        outs = generate([e.prompt_ids + e.response_ids for e in active])
        queries = []
        for e, new in zip(active, outs, strict=True):
            ids, e.ended_on_eos = cut_turn(new, tokenizer, generate.eos_ids)
            # NOTE(P7): the sampled ids themselves; Search-R1 re-encodes the text
            e.append(ids, trained=True, answer_mask=answer_span(ids, tokenizer))
            e.num_turns += 1
            action_text = tokenizer.decode(ids)
            match = ACTION_RE.search(action_text)
            # NOTE(P1): the answer is read from this model action only, never prompt +
            # response (P1)
            # P1: only the ending action can hold a full <answer>
            e.answer = extract_answer(action_text)
            action = match.group(1) if match else None
            e.num_valid_actions += action is not None
            # the final turn's too: is_search is set before do_search acts
            e.num_valid_searches += action == "search"
            if action == "answer" or final:
                e.done = True
            elif action == "search":
                queries.append((e, match.group(2).strip()))
            else:
                e.append(invalid, trained=False)
        if queries:
            hits = search([q for _, q in queries], topk)  # one batched search per turn
            for (e, _), h in zip(queries, hits, strict=True):
                e.append(observation_ids(format_passages(h), tokenizer, max_obs_tokens),
                         trained=False)
                e.num_searches += 1
                # evaluate.py reads the passage titles from it (retrieval recall)
                e.retrieved.append(h)

    # an engine that keeps KV (engine.CBGenerator, kv_generator) frees it
    getattr(generate, "reset", lambda: None)()
    for e in episodes:
        e.text = tokenizer.decode(e.response_ids)
        e.reward = em_check(e.answer, e.golden_answers)
    return episodes


# episode_stats' columns
STATS = ("reward", "num_searches", "num_turns", "num_valid_actions", "num_valid_searches")


def episode_stats(episodes: list[Episode]) -> torch.Tensor:
    """[B, 5] float32: each Episode's STATS, a tensor so that train.py can gather it over ranks."""
    return torch.tensor([[float(getattr(e, k)) for k in STATS] for e in episodes],
                        dtype=torch.float32)


def rollout_metrics(stats: torch.Tensor, loss_mask: torch.Tensor, group_size: int) -> dict:
    """What a batch of trajectories did, from episode_stats [B, 5] and loss_mask [B, T] (groups
    contiguous): mean reward; executed searches and valid <search> calls per trajectory (LLDS-MA's
    V, which counts a final-turn <search> too); the share of generation turns that were a valid
    action; model tokens per trajectory; and the share of groups whose rewards are all equal (they
    give GRPO no signal)."""
    reward, searches, turns, valid_actions, valid_searches = stats.T
    groups = reward.view(-1, group_size)  # [prompts, G]
    return {
        "rollout/reward": reward.mean().item(),
        "rollout/searches_per_traj": searches.mean().item(),
        "rollout/valid_searches_per_traj": valid_searches.mean().item(),
        "rollout/valid_action_ratio": valid_actions.sum().item() / max(turns.sum().item(), 1),
        "rollout/response_tokens": loss_mask.sum(-1).mean().item(),
        "rollout/frac_zero_std_groups": (groups.max(1).values == groups.min(1).values)
        .float()
        .mean()
        .item(),
    }

# --------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    from machinery.data import DEMO_CORPUS

    # eiffeltower  (ASCII punctuation is deleted, not spaced)
    print(normalize_answer("The  Eiffel-Tower!"))
    print(em_check("the Eiffel Tower", ["Eiffel Tower", "La tour Eiffel"]))  # 1.0
    # Lyon
    print(extract_answer("<think>..</think><answer> Paris </answer> then <answer> Lyon </answer>"))
    print(repr(INVALID_ACTION[:30]))  # '\nMy previous action is invalid'

    def search(queries: list[str], topk: int) -> list[list[dict]]:
        """A stand-in for retriever.BM25Retriever.search: the passages holding the most query words,
        best first."""
        def shared_words(query: str, row: dict) -> int:
            return len(
                set(query.lower().split()) & set(re.findall(r"\w+", row["contents"].lower()))
            )

        return [[{"document": row, "score": float(shared_words(q, row))}
                 for row in sorted(DEMO_CORPUS,
                                   key=lambda row: -shared_words(q, row))[:topk]] for q in queries]

    print(OBS_HEAD + format_passages(search(["Eiffel Tower Paris"], 1)[0]).strip() + OBS_TAIL)
    # \n\n<information>Doc 1(Title: "Eiffel Tower") The Eiffel Tower is in Paris,
    # France.</information>\n\n
