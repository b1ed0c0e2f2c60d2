"""CalibAdv's turn scores: which search turns of a response found the group's "silver" passages.

Wu et al., "Negative Advantage Is a Double-Edged Sword" (arXiv 2604.18235), a cure for GRPO's
collapse on search (train.py --calib-adv, off by default). Its official code (wujwyi/CalibAdv at
6ae1c4e; read, not run) scores each search turn of a response by the passages it found
(main_ppo_format.py:512-590); grpo.calibadv_advantages turns the scores into token advantages
(core_algos.py:1187-1210 and advantage_scale, 501-547). This file is the bookkeeping between a
rollout's episodes and those scores; results/fixes/sources.md has what was read.
"""

SILVER_F1, THINK_SIM = 0.7, 0.5  # main_ppo_format.py lines 520 and 572


def word_edit_similarity(a: str, b: str) -> float:
    """1 - (Levenshtein distance between the word lists) / (the longer list's length); 0 when both
    are empty (main_ppo_format.py:207-211, which calls Levenshtein.distance on a.split() and
    b.split())."""
    w1, w2 = a.split(), b.split()
    if not (w1 or w2):
        return 0.0
    prev = list(range(len(w2) + 1))  # edit distance of w1[:0] to each prefix of w2
    for i, x in enumerate(w1, 1):
        cur = [i]
        for j, y in enumerate(w2, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return 1.0 - prev[-1] / max(len(w1), len(w2))


def turn_scores(docs: list, thinks: list, f1: list, format_ok: list,
                group_ids: list) -> list[list[float]]:
    """The step score s_ik in [0, 1] of each search turn k of each response i (the code's
    query_score_calculator "old").

    docs[i][k]: the ids of the passages search k of response i returned; thinks[i][k]: the <think>
    text before search k; f1[i]: its answer's token F1; format_ok[i]: a well-formed response that
    answered. A group's silver passages are those returned to its best-F1 well-formed responses with
    F1 >= 0.7 (ties pool theirs); s_ik = (silver passages of turn k not returned earlier in response
    i) / (passages of turn k), and 0 ("no score": the turn keeps its advantage; the code writes
    1e-6 and skips it, the same advantage) when that count is 0, when turn k's think is more than
    0.5 word-edit-similar to an earlier think, or when turn k shares more than one passage with an
    earlier turn. A response that is not well formed, or whose group has no silver passage, gets []
    (no turn is scored). Returns B lists, one float per search.
    """
    best, silver = {}, {}
    for d, f, ok, g in zip(docs, f1, format_ok, group_ids, strict=True):
        if ok and f >= SILVER_F1 and f >= best.get(g, f):
            if f > best.get(g, f):
                silver[g] = set()  # a better response: its passages replace the silver set so far
            best[g] = f
            silver.setdefault(g, set()).update(p for turn in d for p in turn)
    scores = []
    for d, t, ok, g in zip(docs, thinks, format_ok, group_ids):
        if not ok or g not in silver:
            scores.append([])
            continue
        seen, row = set(), []
        for k, turn in enumerate(d):
            good = sum(p in silver[g] and p not in seen for p in turn)
            seen.update(turn)
            if any(word_edit_similarity(t[k], earlier) > THINK_SIM for earlier in t[:k]) or \
                    any(len(set(turn) & set(earlier)) > 1 for earlier in d[:k]):
                good = 0
            row.append(good / len(turn))
        scores.append(row)
    return scores


def episode_turn_scores(episodes, tokenizer, f1) -> list[list[float]]:
    """turn_scores of rollout.Episode objects: each search's passage ids (Episode.retrieved), the
    <think> of each action (decoded from its run of loss_mask 1s), the answer's F1 (`f1(answer,
    golden_answers)`: rollout.f1_score) and whether the response is well formed (it answered,
    searched, and every action was valid: our reading of the code's format check,
    qa_em_format.is_valid_sequence, which also parses the tags' order)."""
    docs = [[[h["document"]["id"] for h in hits] for hits in e.retrieved] for e in episodes]
    thinks = []
    for e in episodes:
        row, mask = [], e.loss_mask + [0]
        for a in (i for i in range(len(e.loss_mask)) if mask[i] and (i == 0 or not mask[i - 1])):
            text = tokenizer.decode(e.response_ids[a:mask.index(0, a)])
            start, end = text.find("<think>"), text.find("</think>")
            row.append(text[start + len("<think>"):end].strip() if 0 <= start < end else "")
        thinks.append(row + [""] * len(e.retrieved))  # a search whose action had no think: ""
    ok = [
        e.answer is not None and e.num_searches > 0 and e.num_valid_actions == e.num_turns
        for e in episodes
    ]
    return turn_scores(docs, thinks, [f1(e.answer, e.golden_answers) for e in episodes], ok,
                       [e.group_id for e in episodes])


if __name__ == "__main__":
    # One group of 3: r0 answered right (F1 1.0) after searches that returned passages [1, 2] then
    # [3, 4]: {1, 2, 3, 4} is the silver set. r1 answered wrong; its first search found [1, 9] (one
    # silver passage of 2: s = 0.5), its second [9, 8] (none: 0). r2 was not well formed: [].
    docs = [[[1, 2], [3, 4]], [[1, 9], [9, 8]], [[1, 2]]]
    thinks = [["who wrote it", "when was he born"], ["the author", "his birth"], ["x"]]
    print(turn_scores(docs, thinks, [1.0, 0.0, 0.0], [True, True, False], ["q", "q", "q"]))
    # [[1.0, 1.0], [0.5, 0.0], []]
