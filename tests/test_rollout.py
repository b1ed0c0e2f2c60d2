"""Tests for rollout.py: the multi-turn Search-R1 rollout, its token bookkeeping (ids, loss_mask, answer_mask), the
observation text and the EM reward. CPU only, no network, a few seconds.

The tiny random model (tests/tiny.py) emits noise, so most tests drive it with a *scripted policy*: a LogitsProcessor
that, for every row, sets all logits to -inf except the next token of that row's script. A row's script is chosen by
its question (found from the prompt ids) and its turn (the number of observations already in its context: one
"<information>" block or one invalid-action message per finished non-final turn). Turn boundaries inside a
`generate` call are found by position: the processor remembers the input width at the first step of each call.
Group members share a question and therefore a script; they behave identically.
"""

import copy
import random
import re
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import rollout as R  # noqa: E402
from machinery.data import DEMO_CORPUS, load_corpus  # noqa: E402
from machinery.engine import hf_generator  # noqa: E402
from retriever import BM25Retriever  # noqa: E402
from rollout import (  # noqa: E402
    INVALID_ACTION,
    STOP_STRINGS,
    Episode,
    OBS_HEAD,
    OBS_TAIL,
    answer_span,
    cut_turn,
    em_check,
    extract_answer,
    format_passages,
    make_prompt,
    normalize_answer,
    observation_ids,
    rollout,
)
from tiny import build_tokenizer  # noqa: E402
from conftest import GEN_KW, Q1, Q2, FakeRetriever, ScriptedPolicy, enc, hit  # noqa: E402, F401
from conftest import scripted_rollout as run  # noqa: E402

QA_SAMPLE = REPO / "tests" / "fixtures" / "qa_sample"  # real passages, a sample (its README.md)

# ----------------------------------------------------------------------------------------------------------------------
# Fixtures and helpers


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py














def spans(mask):
    """[(start, end, value)] maximal runs of equal values."""
    out, s = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[s]:
            out.append((s, i, mask[s]))
            s = i
    return out


def searchr1_extract(solution_str):
    """Search-R1's qa_em.extract_solution, verbatim in behaviour: None unless >= 2 matches, then the last one."""
    matches = list(re.finditer(r"<answer>(.*?)</answer>", solution_str, re.DOTALL))
    if len(matches) <= 1:
        return None
    return matches[-1].group(1).strip()



# ----------------------------------------------------------------------------------------------------------------------
# The full search -> answer trajectory


def test_p5_p6_search_then_answer_ids_masks_groups(tok, model):
    s1 = enc(tok, "<think> I need to search. </think>\n<search> capital of France </search>")
    s2 = enc(tok, "<think> Paris it is. </think>\n<answer> Paris </answer>")
    t1 = enc(tok, "<search> Eiffel Tower </search>")
    t2 = enc(tok, "<answer> Berlin </answer>")
    bm25 = BM25Retriever(DEMO_CORPUS)
    spy = FakeRetriever(lambda q: bm25.search([q], 2)[0])
    scripts = {Q1: [s1, s2], Q2: [t1, t2]}
    eps, policy = run(model, tok, scripts, {Q1: ["Paris"], Q2: ["Paris"]}, spy, group_size=3, topk=2, max_turns=3)

    assert len(eps) == 6
    assert [e.group_id for e in eps] == [0, 0, 0, 1, 1, 1]  # contiguous groups (P3), per-batch prompt ids (P4)
    assert [e.question for e in eps] == [Q1] * 3 + [Q2] * 3
    assert spy.calls == [(["capital of France"] * 3 + ["Eiffel Tower"] * 3, 2)]  # one batched search per turn
    assert policy.calls == 2

    for e, (a, b, query) in zip(eps, [(s1, s2, "capital of France")] * 3 + [(t1, t2, "Eiffel Tower")] * 3):
        doc = format_passages(bm25.search([query], 2)[0])  # the hits as text: the model sees it byte for byte
        obs = observation_ids(doc, tok, 500)
        assert e.retrieved == [bm25.search([query], 2)[0]]  # the hits themselves, one list per executed search
        assert e.prompt_ids == enc(tok, make_prompt(e.question, tok))
        assert e.response_ids == a + obs + b  # exactly the sampled ids and the appended observation ids
        assert e.loss_mask == [1] * len(a) + [0] * len(obs) + [1] * len(b)
        assert len(e.answer_mask) == len(e.response_ids)
        # P5: the whole observation, wrapper tags and the newlines included, is masked.
        (z0, z1, _), = [s for s in spans(e.loss_mask) if s[2] == 0]
        masked = tok.decode(e.response_ids[z0:z1])
        assert masked == OBS_HEAD + doc.strip() + OBS_TAIL
        assert masked.startswith("\n\n<information>") and masked.endswith("</information>\n\n")
        assert tok.decode(e.response_ids[:z0]).endswith("</search>")
        assert e.num_searches == 1 and e.num_turns == 2 and e.num_valid_actions == 2 and e.done
        assert e.num_valid_searches == 1
        assert e.text == tok.decode(e.response_ids)
    assert [e.answer for e in eps] == ["Paris"] * 3 + ["Berlin"] * 3
    assert [e.reward for e in eps] == [1.0] * 3 + [0.0] * 3


def test_p4_group_ids_differ_across_prompts_and_restart_per_batch(tok, model):
    qs = [Q1, Q2, "Who wrote Hamlet"]
    scripts = {q: [enc(tok, "<answer> x </answer>")] for q in qs}
    eps, _ = run(model, tok, scripts, {q: ["x"] for q in qs}, group_size=2, max_turns=0)
    assert [e.group_id for e in eps] == [0, 0, 1, 1, 2, 2]
    eps2, _ = run(model, tok, {Q2: scripts[Q2]}, {Q2: ["x"]}, group_size=2, max_turns=0)
    assert [e.group_id for e in eps2] == [0, 0]  # a position in *this* batch, never a dataset index


def test_p5_invalid_action_message_masked(tok, model):
    eos = tok.eos_token_id
    no_tag = enc(tok, "<think> hmm </think>") + [eos]
    unclosed = enc(tok, "<search> no closing tag") + [eos]
    ans = enc(tok, "<answer> Paris </answer>")
    spy = FakeRetriever()
    eps, _ = run(model, tok, {Q1: [no_tag, ans], Q2: [unclosed, ans]}, {Q1: ["Paris"], Q2: ["Paris"]}, spy,
                 max_turns=3)
    inv = enc(tok, INVALID_ACTION)
    for e, first in zip(eps, [no_tag, unclosed]):
        assert e.response_ids == first + inv + ans
        assert e.loss_mask == [1] * len(first) + [0] * len(inv) + [1] * len(ans)
        (z0, z1, _), = [s for s in spans(e.loss_mask) if s[2] == 0]
        assert tok.decode(e.response_ids[z0:z1]) == INVALID_ACTION
        assert e.num_searches == 0 and e.num_turns == 2 and e.num_valid_actions == 1 and e.num_valid_searches == 0
        assert e.reward == 1.0
    assert spy.calls == []


def searchr1_regex_info_mask(tok, response_ids):
    """Search-R1's first masking (before PR #21, P6): decode the response, regex-find each
    <information>...</information>, and re-encode the text before its start and end to count tokens."""
    text = tok.decode(response_ids)
    mask = [1] * len(response_ids)
    for m in re.finditer(r"<information>.*?</information>", text, re.DOTALL):
        start, end = len(enc(tok, text[: m.start()])), len(enc(tok, text[: m.end()]))
        for k in range(start, min(end, len(mask))):
            mask[k] = 0
    return mask


def test_p6_searchr1_regex_reencode_mask_misaligns(tok, model):
    eos = tok.eos_token_id
    no_tag = enc(tok, "<think> hmm </think>") + [eos]
    s = enc(tok, "<search> Pari") + enc(tok, "s </search>")  # non-canonical ids, as a sampler may emit
    a = enc(tok, "<answer> Paris </answer>")
    eps, _ = run(model, tok, {Q1: [no_tag, s, a]}, {Q1: ["Paris"]}, max_turns=3)
    (e,) = eps
    obs = observation_ids(FakeRetriever().text("Paris"), tok, 500)
    inv = enc(tok, INVALID_ACTION)
    assert e.response_ids == no_tag + inv + s + obs + a
    # ours: built while concatenating, exactly 1 on the sampled ids and 0 on every appended id
    assert e.loss_mask == [1] * len(no_tag) + [0] * len(inv) + [1] * len(s) + [0] * len(obs) + [1] * len(a)
    # Search-R1's regex + re-encode mask: BPE is not compositional ('>' + '\n\n' re-encode as one '>\n\n' token, and
    # " Pari" + "s" as " Paris"), so the span shifts; and the invalid-action message is not matched at all.
    theirs = searchr1_regex_info_mask(tok, e.response_ids)
    assert theirs != e.loss_mask
    trained_obs = [k for k, (o, t) in enumerate(zip(e.loss_mask, theirs)) if o == 0 and t == 1]
    masked_model = [k for k, (o, t) in enumerate(zip(e.loss_mask, theirs)) if o == 1 and t == 0]
    assert trained_obs and masked_model  # retrieved / message tokens trained, sampled tokens dropped from the loss
    n0 = len(no_tag) + len(inv) + len(s)
    assert any(n0 <= k < n0 + len(obs) for k in trained_obs)  # inside the <information> block itself
    assert all(theirs[len(no_tag):len(no_tag) + len(inv)])  # the whole invalid-action message trained


# ----------------------------------------------------------------------------------------------------------------------
# The engines are callables; the Episode keeps ids and masks in step


def test_a_plain_function_drives_rollout_without_a_model(tok):
    """A scripted function (no model) is the generator: it sees exactly prompt + response so far, its outputs may run
    past a turn's end (words after </search>, padding after an EOS) and rollout keeps each turn up to that end."""
    eos, pad = tok.eos_token_id, tok.pad_token_id
    s1, s2 = enc(tok, "<search> Paris </search>"), enc(tok, "<search> Eiffel Tower </search>")
    bad = enc(tok, "<think> hmm </think>") + [eos]
    a = enc(tok, "<answer> Paris </answer>")
    outputs = [[s1 + enc(tok, " more words"), s2], [bad + [pad, pad], a], [a]]  # per call, one per unfinished row
    seen = []

    def generate(contexts):
        seen.append(contexts)
        return outputs[len(seen) - 1]

    generate.eos_ids = {eos}
    spy = FakeRetriever()
    rows = [{"question": Q1, "golden_answers": ["Paris"]}, {"question": Q2, "golden_answers": ["Rome"]}]
    e1, e2 = rollout(generate, tok, rows, spy, group_size=1, max_turns=2, topk=2)

    obs1, obs2 = (observation_ids(spy.text(q), tok, 500) for q in ("Paris", "Eiffel Tower"))
    inv = enc(tok, INVALID_ACTION)
    assert spy.calls == [(["Paris", "Eiffel Tower"], 2)]
    assert e1.response_ids == s1 + obs1 + bad + inv + a
    assert e1.loss_mask == [1] * len(s1) + [0] * len(obs1) + [1] * len(bad) + [0] * len(inv) + [1] * len(a)
    assert e1.answer_mask == [0] * (len(e1.response_ids) - len(a)) + [1] * len(a)
    assert e2.response_ids == s2 + obs2 + a and e2.loss_mask == [1] * len(s2) + [0] * len(obs2) + [1] * len(a)
    assert seen == [[e1.prompt_ids, e2.prompt_ids], [e1.prompt_ids + s1 + obs1, e2.prompt_ids + s2 + obs2],
                    [e1.prompt_ids + s1 + obs1 + bad + inv]]
    assert e1.retrieved == [spy.fn("Paris")] and e2.retrieved == [spy.fn("Eiffel Tower")]  # the hits, per search
    assert (e1.num_turns, e1.num_searches, e1.num_valid_actions, e1.reward) == (3, 1, 2, 1.0)
    assert (e2.num_turns, e2.num_searches, e2.answer, e2.reward) == (2, 1, "Paris", 0.0)


def test_episode_append_keeps_ids_and_masks_in_step():
    e = Episode("q", ["a"], "nq", group_id=0, prompt_ids=[1, 2])
    e.append([5, 6, 7], trained=True, answer_mask=[0, 1, 1])
    e.append([8, 9], trained=False)
    e.append([10], trained=True)
    assert e.response_ids == [5, 6, 7, 8, 9, 10]
    assert e.loss_mask == [1, 1, 1, 0, 0, 1]
    assert e.answer_mask == [0, 1, 1, 0, 0, 0]
    with pytest.raises(ValueError, match="does not fit 2 action ids"):
        e.append([11, 12], trained=True, answer_mask=[1])
    with pytest.raises(ValueError, match="does not fit 1 observation ids"):
        e.append([11], trained=False, answer_mask=[1])  # an observation is never the model's answer
    assert len(e.response_ids) == len(e.loss_mask) == len(e.answer_mask) == 6  # a refused append changes nothing


# ----------------------------------------------------------------------------------------------------------------------
# P7 / P19: sampled ids are the trained ids; every turn's context is a token prefix of the next


def test_p7_sampled_ids_are_trained_ids(tok, model):
    eos = tok.eos_token_id
    # Non-canonical tokenizations: " Bei" + "jing" instead of the single token " Beijing".
    y0 = enc(tok, "<think> need facts </think>\n<search> Bei") + enc(tok, "jing capital </search>")
    y1 = enc(tok, "<think> hmm </think>") + [eos]
    y2 = enc(tok, "<answer> Bei") + enc(tok, "jing </answer>")
    for y in (y0, y2):
        assert enc(tok, tok.decode(y)) != y  # re-encoding the text would change the ids (Search-R1's drift)
    spy = FakeRetriever()
    eps, policy = run(model, tok, {Q1: [y0, y1, y2]}, {Q1: ["Beijing"]}, spy, max_turns=3)
    (e,) = eps
    obs = observation_ids(spy.text("Beijing capital"), tok, 500)
    inv = enc(tok, INVALID_ACTION)
    assert spy.calls == [(["Beijing capital"], 3)]
    assert e.response_ids == y0 + obs + y1 + inv + y2  # exactly the sampled ids, no re-tokenization
    assert e.loss_mask == [1] * len(y0) + [0] * len(obs) + [1] * len(y1) + [0] * len(inv) + [1] * len(y2)
    assert e.reward == 1.0 and e.answer == "Beijing"
    assert enc(tok, e.text) != e.response_ids  # what a decode/re-encode pipeline would have trained on

    ctxs = [c for q, _, c in policy.contexts]
    assert [t for _, t, _ in policy.contexts] == [0, 1, 2]
    assert ctxs[0] == e.prompt_ids  # the chat template is rendered once (P19)
    assert ctxs[1] == ctxs[0] + y0 + obs
    assert ctxs[2] == ctxs[1] + y1 + inv
    full = e.prompt_ids + e.response_ids
    for a, b in zip(ctxs, ctxs[1:] + [full]):
        assert b[: len(a)] == a  # token prefix, not only a text prefix


def test_p7_p19_prefix_property_across_gen_batches(tok, model):
    """gen_batch_size smaller than the batch: several generate calls per turn, same ids."""
    s = enc(tok, "<search> Pari") + enc(tok, "s </search>")
    a = enc(tok, "<answer> Paris </answer>")
    eps, policy = run(model, tok, {Q1: [s, a], Q2: [s, a]}, {Q1: ["Paris"], Q2: ["Paris"]}, group_size=3,
                      max_turns=2, batch_size=2)
    assert policy.calls == 6  # 6 rows / 2 per call, 2 turns
    for e in eps:
        obs = observation_ids(FakeRetriever().text("Paris"), tok, 500)
        assert e.response_ids == s + obs + a and e.reward == 1.0
        for q, _, c in policy.contexts:
            if q == e.question:
                assert (e.prompt_ids + e.response_ids)[: len(c)] == c


def test_p7_searchr1_decode_reencode_changes_trained_ids(tok, model):
    eos = tok.eos_token_id
    y0 = enc(tok, "<think> need facts </think>\n<search> Bei") + enc(tok, "jing capital </search>")
    y1 = enc(tok, "<think> hmm </think>") + [eos]
    y2 = enc(tok, "<answer> Bei") + enc(tok, "jing </answer>")

    def searchr1_turn(sampled):  # generation.py _postprocess_responses: decode, cut the text at the tag, re-encode
        text = tok.decode(sampled, skip_special_tokens=True)
        for tag in ("</search>", "</answer>"):
            if tag in text:
                text = text.split(tag)[0] + tag
                break
        return enc(tok, text)

    spy = FakeRetriever()
    eps, _ = run(model, tok, {Q1: [y0, y1, y2]}, {Q1: ["Beijing"]}, spy, max_turns=3)
    (e,) = eps
    obs = observation_ids(spy.text("Beijing capital"), tok, 500)
    inv = enc(tok, INVALID_ACTION)
    sampled = y0 + obs + y1 + inv + y2
    assert e.response_ids == sampled  # ours: the trained ids are the sampled ids
    theirs = searchr1_turn(y0) + obs + searchr1_turn(y1) + inv + searchr1_turn(y2)
    assert theirs != sampled  # Search-R1 trains on ids the policy never sampled
    for y in (y0, y2):
        assert searchr1_turn(y) != y and tok.decode(searchr1_turn(y)) == tok.decode(y)  # same text, other ids
    assert searchr1_turn(y1) == y1[:-1]  # and the EOS is gone (P9a)
    # the ids differ, so their log-probs under the sampling policy differ: the ratio is not 1 on-policy (off-policy)
    def seq_logp(ids):  # log pi(response ids | prompt) under the sampling policy
        with torch.no_grad():
            logits = model(torch.tensor([e.prompt_ids + ids])).logits[0, len(e.prompt_ids) - 1:-1]  # [T, V]
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).sum().item()

    assert abs(seq_logp(sampled) - seq_logp(theirs)) > 1e-3


def test_p19_prompt_rendered_once_each_context_is_token_prefix_of_next(tok, model, monkeypatch):
    renders = []
    real_make_prompt = R.make_prompt
    monkeypatch.setattr(R, "make_prompt", lambda q, t: renders.append(q) or real_make_prompt(q, t))
    eos = tok.eos_token_id
    s = enc(tok, "<think> look it up </think>\n<search> Paris </search>")
    bad = enc(tok, "<think> hmm </think>") + [eos]
    a = enc(tok, "<answer> Paris </answer>")
    eps, policy = run(model, tok, {Q1: [s, bad, a], Q2: [bad, s, a]}, {Q1: ["Paris"], Q2: ["Paris"]}, group_size=2,
                      max_turns=3)
    assert sorted(renders) == sorted([Q1, Q2])  # the chat template is rendered once per question, never per turn
    for e in eps:
        full = e.prompt_ids + e.response_ids
        ctxs = [c for q, _, c in policy.contexts if q == e.question]
        assert len(ctxs) == 2 * 3  # 2 group members x 3 turns
        assert all(c[: len(e.prompt_ids)] == e.prompt_ids for c in ctxs)
        for a_, b_ in zip(ctxs[::2], ctxs[2::2] + [full]):  # member 0's contexts, turn by turn, then the trained ids
            assert len(a_) < len(b_) and b_[: len(a_)] == a_  # each context is a token prefix of the next
        assert tok.decode(full).count("<|im_start|>") == 2  # the template's markers occur in the prompt only
        assert full.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2

    # Re-rendering the conversation every turn (chat template over [user, assistant-so-far]) is not append-only: ChatML
    # closes the assistant message with <|im_end|>, so turn t's context is not a token prefix of turn t+1's.
    e = eps[0]
    user = R.PROMPT.format(question=Q1 + "?")

    def rerender(response_ids):
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": tok.decode(response_ids)}]
        return enc(tok, tok.apply_chat_template(msgs, tokenize=False))

    cut = len(s) + len(observation_ids(FakeRetriever().text("Paris"), tok, 500))
    turn1, final = rerender(e.response_ids[:cut]), rerender(e.response_ids)
    assert final[: len(turn1)] != turn1


# ----------------------------------------------------------------------------------------------------------------------
# Cutting a turn by token index


def test_stop_by_token_index_in_rollout(tok, model):
    extra = enc(tok, "<search> Rhine </search> extra words")
    overhang = enc(tok, "<search> Seine </search>\n\nmore words")  # '>\n\n' is one token: the stop ends mid-token
    a = enc(tok, "<answer> Germany </answer>")
    spy = FakeRetriever()
    eps, _ = run(model, tok, {Q1: [extra, a], Q2: [overhang, a]}, {Q1: ["Germany"], Q2: ["x"]}, spy, max_turns=2)
    assert spy.calls == [(["Rhine", "Seine"], 3)]
    for e, script, query in zip(eps, [extra, overhang], ["Rhine", "Seine"]):
        k = min(k for k in range(1, len(script) + 1) if "</search>" in tok.decode(script[:k]))
        assert k < len(script)
        obs = observation_ids(spy.text(query), tok, 500)
        assert e.response_ids == script[:k] + obs + a  # cut right after the token completing </search>
        assert e.loss_mask == [1] * k + [0] * len(obs) + [1] * len(a)
    assert tok.decode(eps[1].response_ids[: eps[1].loss_mask.index(0)]).endswith("</search>\n\n")


def test_cut_turn_unit(tok):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    s = enc(tok, "<search> Rhine </search>")
    assert cut_turn(s + enc(tok, " extra words"), tok, {eos}) == (s, False)
    assert cut_turn(s + [pad] * 5, tok, {eos}) == (s, False)  # generate's padding after a finished row
    assert cut_turn(s + [eos, eos, eos], tok, {eos}) == (s, False)  # pad == eos: the stop string ended the turn
    t = enc(tok, "<think> ok </think>")
    assert cut_turn(t + [eos] + [pad] * 3, tok, {eos}) == (t + [eos], True)  # EOS kept (P9)
    assert cut_turn(t + [eos] + s, tok, {eos}) == (t + [eos], True)  # nothing after the first EOS
    a = enc(tok, "<answer> Bonn </answer>")
    assert cut_turn(a + s, tok, {eos}) == (a, False)  # the first of </answer>, </search> wins
    assert cut_turn(t, tok, {eos}) == (t, False)  # max_new_tokens hit: unchanged
    assert cut_turn([], tok, {eos}) == ([], False)


# ----------------------------------------------------------------------------------------------------------------------
# P9 / P10: EOS, pad == eos, mixed lengths


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_p9_p10_eos_kept_mixed_lengths_no_padding(tok, model, pad_is_eos):
    if pad_is_eos:  # Qwen base: pad and EOS share an id
        tok = build_tokenizer()
        tok.pad_token = tok.eos_token
        model = copy.deepcopy(model)
        model.generation_config.pad_token_id = tok.eos_token_id
        assert tok.pad_token_id == tok.eos_token_id
    eos = tok.eos_token_id
    max_new = 12
    short = enc(tok, "<think> short </think>") + [eos]
    long = enc(tok, "the quick brown fox jumps over the lazy dog and then the dog sleeps again")
    assert len(short) < max_new < len(long) and eos not in long
    ans = enc(tok, "<answer> Paris </answer>")

    seen = []  # attention masks passed to generate
    generate = model.generate

    def spy_generate(*args, **kw):
        seen.append((kw["input_ids"].clone(), kw["attention_mask"].clone()))
        return generate(*args, **kw)

    model.generate = spy_generate
    try:
        eps, policy = run(model, tok, {Q1: [short, ans], Q2: [long, long]}, {Q1: ["Paris"], Q2: ["Paris"]},
                          max_turns=1, max_new_tokens=max_new)
    finally:
        del model.generate
    inv = enc(tok, INVALID_ACTION)
    a, b = eps
    assert a.response_ids == short + inv + ans  # EOS kept, and nothing (no pad, no 2nd EOS) after it
    assert a.loss_mask == [1] * len(short) + [0] * len(inv) + [1] * len(ans)
    assert a.response_ids.count(eos) == 1 and a.loss_mask[len(short) - 1] == 1
    assert a.reward == 1.0
    assert b.response_ids == long[:max_new] + inv + long[:max_new]  # exactly max_new_tokens per turn
    assert b.loss_mask == [1] * max_new + [0] * len(inv) + [1] * max_new
    assert eos not in b.response_ids and tok.pad_token_id not in b.response_ids
    assert b.answer is None and b.reward == 0.0 and not b.ended_on_eos
    # The attention mask is built by position: the EOS inside row a's turn-1 context is attended to.
    ids, att = seen[1]
    for row, ctx in zip(range(2), [a.prompt_ids + short + inv, b.prompt_ids + long[:max_new] + inv]):
        assert att[row].sum().item() == len(ctx)
        assert ids[row, -len(ctx):].tolist() == ctx  # exact: token ids
    assert ids[0, -len(inv) - 1].item() == eos and att[0, -len(inv) - 1].item() == 1  # exact: token ids


def test_p9_final_turn_ending_on_eos(tok, model):
    eos = tok.eos_token_id
    y = enc(tok, "<think> I do not know. </think>") + [eos]
    eps, _ = run(model, tok, {Q1: [y]}, {Q1: ["Paris"]}, max_turns=0)
    (e,) = eps
    assert e.response_ids == y and e.loss_mask == [1] * len(y) and e.ended_on_eos and e.num_turns == 1


def test_p9_searchr1_pad_value_mask_erases_eos(model):
    from machinery.policy import collate

    tok = build_tokenizer()
    tok.pad_token = tok.eos_token  # Qwen base: pad == eos
    m = copy.deepcopy(model)
    m.generation_config.pad_token_id = tok.eos_token_id
    pad = eos = tok.eos_token_id
    short = enc(tok, "<think> short </think>") + [eos]
    a = enc(tok, "<answer> Paris </answer>")
    eps, _ = run(m, tok, {Q1: [short, a], Q2: [a]}, {Q1: ["Paris"], Q2: ["Paris"]}, max_turns=1)
    batch = collate(eps, pad)
    T = batch["loss_mask"].shape[1]
    resp = batch["input_ids"][:, -T:]  # [B, T] right-padded responses
    k = len(short) - 1  # row 0's EOS
    assert resp[0, k].item() == eos and batch["loss_mask"][0, k] == 1  # exact: token ids; ours: the EOS is trained
    assert batch["attention_mask"][0, -T + k] == 1

    def searchr1_mask(ids, info_mask):  # tensor_helper.create_attention_mask: ids != pad, times the info mask
        return (ids != pad).float() * info_mask

    theirs = searchr1_mask(resp, batch["loss_mask"])
    assert theirs[0, k] == 0  # the real EOS is erased from the loss
    assert not torch.equal(theirs, batch["loss_mask"])  # exact: 0/1 masks
    assert torch.equal(theirs[resp != pad], batch["loss_mask"][resp != pad])  # exact: 0/1 masks, apart on pad/eos


# ----------------------------------------------------------------------------------------------------------------------
# The observation text: Search-R1's _passages2string


def test_format_passages_exact_string():
    hits = [
        {"document": {"id": "7", "contents": '"Evan Morris"\nEvan L. Morris was a lobbyist.'}, "score": 2.5},
        {"document": {"id": "9", "contents": '"Genentech"\nA company.\nIt is in California.'}, "score": 1.0},
    ]
    expected = (
        'Doc 1(Title: "Evan Morris") Evan L. Morris was a lobbyist.\n'
        'Doc 2(Title: "Genentech") A company.\nIt is in California.\n'
    )
    assert format_passages(hits) == expected
    assert format_passages([]) == ""


# ----------------------------------------------------------------------------------------------------------------------
# P12: observation truncation keeps the closing tag


def test_p12_observation_truncation_keeps_closing_tag(tok, model):
    text = "Paris is the capital and most populous city of France. " * 40
    long_doc = "Doc 1(Title: Paris) " + text
    spy = FakeRetriever(lambda q: [hit("Paris\n" + text)])
    s = enc(tok, "<search> Paris </search>")
    a = enc(tok, "<answer> Paris </answer>")
    max_obs = 20
    eps, _ = run(model, tok, {Q1: [s, a]}, {Q1: ["Paris"]}, spy, max_turns=2, max_obs_tokens=max_obs)
    (e,) = eps
    (z0, z1, _), = [sp for sp in spans(e.loss_mask) if sp[2] == 0]
    obs_text = tok.decode(e.response_ids[z0:z1])
    assert z1 - z0 <= max_obs
    assert obs_text.startswith(OBS_HEAD) and obs_text.endswith(OBS_TAIL)
    assert obs_text.count("</information>") == 1
    assert e.response_ids[z1:] == a and e.reward == 1.0
    head, tail = enc(tok, OBS_HEAD), enc(tok, OBS_TAIL)
    assert e.response_ids[z0:z1] == head + enc(tok, long_doc.strip())[: max_obs - len(head) - len(tail)] + tail


def test_p12_observation_ids_unit(tok):
    head, tail = enc(tok, OBS_HEAD), enc(tok, OBS_TAIL)
    doc = "Doc 1(Title: Rhine) The Rhine flows through Germany.\n"
    assert observation_ids(doc, tok, 500) == head + enc(tok, doc.strip()) + tail  # short docs are untouched
    assert tok.decode(observation_ids(doc, tok, 500)) == OBS_HEAD + doc.strip() + OBS_TAIL
    assert observation_ids(doc, tok, len(head) + len(tail)) == head + tail  # no room for text, tags survive
    assert observation_ids("", tok, 500) == head + tail  # no hits
    for n in range(len(head) + len(tail), 40):
        ids = observation_ids(doc * 10, tok, n)
        assert len(ids) == n and ids[-len(tail):] == tail
    with pytest.raises(ValueError, match="max_obs_tokens"):
        observation_ids(doc, tok, len(head) + len(tail) - 1)


def test_p12_searchr1_truncating_wrapped_observation_loses_closing_tag(tok):
    long_doc = "Doc 1(Title: Paris) " + "Paris is the capital and most populous city of France. " * 40

    def searchr1_obs(docs, max_obs):  # generation.py _process_next_obs: wrap, tokenize, then cut to max_obs_length
        return enc(tok, OBS_HEAD + docs + OBS_TAIL)[:max_obs]

    for budget in (20, 64, 200):
        ours, theirs = observation_ids(long_doc, tok, budget), searchr1_obs(long_doc, budget)
        assert len(ours) == len(theirs) == budget
        assert tok.decode(ours).endswith("</information>\n\n")
        assert "</information>" not in tok.decode(theirs)  # the next turn would start inside an open block
    short = "Doc 1(Title: Rhine) The Rhine flows through Germany.\n"
    # nothing cut: the same text (ours tokenizes head, body and tail separately, so the ids may differ)
    assert tok.decode(observation_ids(short, tok, 500)) == tok.decode(searchr1_obs(short.strip(), 500))


# Only a word-boundary prefix of the passages is tokenized: the same ids as the whole text, at the cost of a short one.
# Random texts from these pieces put every kind of pre-token boundary (".\n" joins, runs of spaces, NBSP, CRLF, digits,
# contractions, combining marks, CJK, a special token) at the cut.
PIECES = ["Paris", " is", " the", " capital", ".", ".\n", "\n", "\n\n", "  ", " ", "\t", "123", "4567", "'s", " 's",
          "\u00e9", "e\u0301", "\u6771\u4eac", "\U0001f642", "--", "\r\n", "\u00a0", " \n ", "...", "(Title:", "x" * 30,
          "<|im_end|>", "Doc 1"]


def random_texts(n, max_pieces, seed=0):
    rnd = random.Random(seed)
    return ["".join(rnd.choice(PIECES) for _ in range(rnd.randrange(1, max_pieces))) for _ in range(n)]


def test_word_prefix_tokenizes_as_the_start_of_the_whole_text(tok):
    """The property observation_ids rests on: where the cut finds a space after a non-space, the prefix's ids are the
    first ids of the whole text. (Cutting at n, or before any whitespace, breaks it on these texts: ".\n" is one
    pre-token.)"""
    rnd, checked = random.Random(1), 0
    for text in random_texts(200, 200):
        text, full = text.strip(), enc(tok, text.strip())
        for n in rnd.sample(range(1, len(text) + 1), min(10, len(text))):
            prefix = R._word_prefix(text, n)
            assert len(prefix) <= n and text.startswith(prefix)
            if re.search(r"\S ", text[n // 2:n + 1]):  # a word boundary to cut at
                ids = enc(tok, prefix)
                assert ids == full[:len(ids)], (text, n)
                checked += 1
    assert checked > 700


def test_observation_ids_equal_tokenizing_the_whole_text(tok):
    head, tail = enc(tok, OBS_HEAD), enc(tok, OBS_TAIL)
    long_doc = "Doc 1(Title: Paris) " + "Paris is the capital and most populous city of France.\n" * 4000  # 236 KB
    for text in random_texts(200, 400) + [long_doc]:
        full = enc(tok, text.strip())
        for budget in (1, 5, 17, 60, 500):
            assert observation_ids(text, tok, budget + len(head) + len(tail)) == head + full[:budget] + tail, text


def test_observation_ids_equal_tokenizing_the_whole_text_real_corpus(tok):
    """Every second of the 600 real passages of the sample, in 3-hit observations as format_passages writes them."""
    head, tail = enc(tok, OBS_HEAD), enc(tok, OBS_TAIL)
    corpus = load_corpus(QA_SAMPLE / "corpus.jsonl")[::2]
    for i in range(0, len(corpus) - 2, 3):
        text = format_passages([{"document": d} for d in corpus[i:i + 3]])
        full = enc(tok, text.strip())
        for budget in (1, 50, 200, 487):
            assert observation_ids(text, tok, budget + len(head) + len(tail)) == head + full[:budget] + tail, i


class CountingTokenizer:
    """The tokenizer's encode, counting the characters it is given."""

    def __init__(self, tokenizer):
        self.tok, self.chars = tokenizer, 0

    def encode(self, text, **kwargs):
        self.chars += len(text)
        return self.tok.encode(text, **kwargs)


@pytest.mark.parametrize("kind", ["text", "one word", "whitespace"])
def test_observation_ids_of_a_2mb_passage_tokenize_a_short_prefix(tok, kind):
    """A 2 MB passage costs what a short one does (it used to be tokenized whole: 3 s here, 9x a training step's time
    with a 10 MB one); a passage without word boundaries ("one word", or a long run of whitespace) stays bounded."""
    doc = {"text": "Doc 1(Title: Paris) " + "Paris is the capital and most populous city of France. " * 37_000,
           "one word": "x" * 2_000_000, "whitespace": "a" + " " * 2_000_000 + "b"}[kind]
    counting = CountingTokenizer(tok)
    ids = observation_ids(doc, counting, 500)
    assert counting.chars < 20_000, counting.chars  # 8 characters per token of the budget, plus the tags
    assert len(ids) == 500 and tok.decode(ids).startswith(OBS_HEAD + doc[:100].strip())
    assert tok.decode(ids).endswith(OBS_TAIL)  # P12: the block is closed
    if kind == "text":
        assert ids == observation_ids(doc[:100_000], tok, 500)  # the same ids as a mere 100 KB of it


# ----------------------------------------------------------------------------------------------------------------------
# max_turns semantics


@pytest.mark.parametrize("max_turns", [0, 1, 2])
def test_max_turns_always_search(tok, model, max_turns):
    s = enc(tok, "<think> more </think>\n<search> Paris </search>")
    spy = FakeRetriever()
    eps, policy = run(model, tok, {Q1: [s] * (max_turns + 1)}, {Q1: ["Paris"]}, spy, group_size=2,
                      max_turns=max_turns)
    obs = observation_ids(spy.text("Paris"), tok, 500)
    assert policy.calls == max_turns + 1  # max_turns search turns + one final generation
    assert spy.calls == [(["Paris", "Paris"], 3)] * max_turns  # the final turn's search is not executed
    for e in eps:
        assert e.num_searches == max_turns and e.num_turns == max_turns + 1
        assert e.num_valid_actions == max_turns + 1
        assert e.num_valid_searches == max_turns + 1  # the official count: the unexecuted final search too
        assert e.response_ids == (s + obs) * max_turns + s  # ends on the unexecuted search, no observation
        assert e.loss_mask[-len(s):] == [1] * len(s)
        assert e.answer is None and e.reward == 0.0 and e.done


def test_valid_search_count_includes_the_final_turns_search_and_sets_the_ma_beta(tok, model):
    """LLDS-MA's V is the official valid-search count (generation.py:295 and :338 add is_search in the search turns
    and in the final answer-only turn, where execute_predictions sets it for a <search> it does not run, :515-520;
    dp_actor.py:275-277 averages it). A trajectory that searches in its only search turn and again in the final turn
    has V = 2, executed searches 1: the "code" schedule gives beta = clip(V - 1, 0, 1) = 1 for a batch of it, where the
    executed count gives 0 and switches the answer span off."""
    from machinery import policy
    import train

    s = enc(tok, "<search> Paris </search>")
    pre, ans = enc(tok, "<think> ok </think>\n"), enc(tok, "<answer> Paris </answer>")
    spy = FakeRetriever()
    eps, _ = run(model, tok, {Q1: [s, s], Q2: [s, pre + ans]}, {Q1: ["Paris"], Q2: ["Paris"]}, spy, max_turns=1)
    e1, e2 = eps
    assert spy.calls == [(["Paris", "Paris"], 3)]  # only the first turn's searches run
    assert (e1.num_searches, e1.num_valid_searches) == (1, 2)  # the final turn's <search> counted, not executed
    assert (e2.num_searches, e2.num_valid_searches) == (1, 1)  # search, then an answer
    args = train.parse_args(["--llds-ma", "code", "--llds", "0.2", "--llds-ma-weight", "0.2"])
    batch = policy.collate([e1], tok.pad_token_id)
    weight, m = train.llds_ma_weight([e1], batch["answer_mask"], args)
    assert m["llds/ma_beta"] == pytest.approx(1.0) and m["llds/answer_weight"] == pytest.approx(0.2)  # executed: 0
    # both trajectories: V = (2 + 1) / 2 = 1.5 -> beta 0.5 on e2's answer span (the executed count, 1.0, gives 0)
    batch = policy.collate(eps, tok.pad_token_id)
    weight, m = train.llds_ma_weight(eps, batch["answer_mask"], args)
    assert m["llds/ma_beta"] == pytest.approx(0.5)
    span = batch["answer_mask"] > 0
    assert span[1].sum() == len(ans) and not span[0].any()
    assert torch.allclose(weight[span], torch.tensor(0.5)) and torch.allclose(weight[~span], torch.tensor(1.0))
    assert train.llds_ma_weight(eps, batch["answer_mask"], train.parse_args([]))[0] is None  # --llds-ma off


# ----------------------------------------------------------------------------------------------------------------------
# P1: the reward reads the response only, last <answer> wins


def test_p1_extract_answer_counts(tok):
    assert extract_answer("<think> no idea </think>") is None
    assert extract_answer("<think>x</think>\n<answer> Paris </answer>") == "Paris"
    assert extract_answer("<answer> Paris </answer> then <answer>\nLyon\n</answer>") == "Lyon"  # last wins
    assert extract_answer("<answer></answer>") == ""
    assert extract_answer("<answer> unclosed") is None
    # P1: the same texts under Search-R1's rule, applied to the response only, lose the single answer.
    assert searchr1_extract("<think>x</think>\n<answer> Paris </answer>") is None
    assert searchr1_extract("<answer> Paris </answer> then <answer> Lyon </answer>") == "Lyon"


def test_p1_searchr1_two_match_rule_fails_prompt_example_never_counts(tok, model):
    prompt = make_prompt(Q1, tok)
    assert prompt.count("<answer> Beijing </answer>") == 1
    # The instruction sentence "... inside <answer> and </answer>, ..." is a complete tag pair too: Search-R1's prompt
    # already holds TWO matches, "and" and "Beijing" (qa_em.extract_solution's >= 2 rule assumes one).
    assert R.ANSWER_RE.findall(prompt) == [" and ", " Beijing "]
    eos = tok.eos_token_id
    none = enc(tok, "<think> I do not know. </think>") + [eos]
    right = enc(tok, "<answer> Beijing </answer>")
    eps, _ = run(model, tok, {Q1: [none], Q2: [right]}, {Q1: ["Beijing"], Q2: ["Beijing"]}, max_turns=0)
    silent, answered = eps
    assert silent.answer is None and silent.reward == 0.0  # the prompt's examples are not answers
    assert answered.answer == "Beijing" and answered.reward == 1.0

    # Search-R1's rule (>= 2 matches over prompt + response) with a prompt holding two examples -- which the real
    # prompt does -- scores a trajectory that answered nothing on the prompt's "Beijing":
    assert searchr1_extract(prompt + silent.text) == "Beijing"
    assert em_check(searchr1_extract(prompt + silent.text), silent.golden_answers) == 1.0  # wrong
    assert em_check(extract_answer(silent.text), silent.golden_answers) == 0.0  # ours
    # With exactly one example in the prompt (the case the >= 2 rule was written for) it is right ...
    one = prompt.replace("inside <answer> and </answer>,", "inside answer tags,")
    assert len(R.ANSWER_RE.findall(one)) == 1
    assert searchr1_extract(one + silent.text) is None
    assert searchr1_extract(one + answered.text) == "Beijing"
    # ... and scoring only the response under the >= 2 rule drops a correct answer.
    assert searchr1_extract(answered.text) is None
    assert em_check(searchr1_extract(answered.text), answered.golden_answers) == 0.0  # wrong
    assert em_check(extract_answer(answered.text), answered.golden_answers) == 1.0  # ours


def test_p1_invalid_message_and_documents_are_not_answers(tok, model):
    """The invalid-action text contains "<answer> and </answer>" and documents may contain tags: neither is an answer.

    Before the fix, extract_answer read the decoded response incl. observations, so this trajectory answered "and".
    """
    assert "<answer> and </answer>" in INVALID_ACTION
    eos = tok.eos_token_id
    no_tag = enc(tok, "<think> hmm </think>") + [eos]
    s = enc(tok, "<search> and </search>")
    final = enc(tok, "<think> still unsure </think>") + [eos]
    spy = FakeRetriever(lambda q: [hit("x\n<answer> and </answer>")])  # "Doc 1(Title: x) <answer> and </answer>\n"
    eps, _ = run(model, tok, {Q1: [no_tag, final], Q2: [s, final]}, {Q1: ["and"], Q2: ["and"]}, spy, max_turns=1)
    for e in eps:
        assert extract_answer(e.text) == "and"  # the text does hold a tag pair ...
        assert e.answer is None and e.reward == 0.0  # ... but the model never answered


# ----------------------------------------------------------------------------------------------------------------------
# P20: EM normalisation edge cases


def test_p20_normalize_answer():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"  # ASCII punctuation deleted, not spaced
    assert normalize_answer("  A  cat, an apple; THE end. ") == "cat apple end"
    assert normalize_answer("The") == "" and normalize_answer("a") == "" and normalize_answer("an.") == ""
    assert normalize_answer("Theatre") == "theatre"  # articles are whole words only
    # Unicode punctuation is NOT removed (Search-R1's behaviour, kept): the en dash and curly quote survive.
    assert normalize_answer("Jean–Paul") == "jean–paul"
    assert normalize_answer("Jean-Paul") == "jeanpaul"
    assert normalize_answer("Jeanne d’Arc") == "jeanne d’arc" != normalize_answer("Jeanne d'Arc") == "jeanne darc"


def test_p20_em_check_edge_cases():
    # Articles-only golds normalise to "": guarded, so an empty / other-article prediction does not match.
    assert em_check("", "The") == 0.0
    assert em_check("  ", ["The"]) == 0.0
    assert em_check("a", "The") == 0.0
    assert em_check("An", ["a"]) == 0.0
    assert em_check("the", "The") == 1.0 and em_check(" THE ", ["the"]) == 1.0
    assert em_check("A", ["a"]) == 1.0
    # Documented: in the guarded path punctuation is not stripped, so "The." does not match "The" (Search-R1: 1.0).
    assert em_check("The.", "The") == 0.0
    # Without the guard an empty prediction would match (what Search-R1 does):
    assert normalize_answer("") == normalize_answer("The")
    # Unicode dash: a false negative, kept for reproducibility with Search-R1 (documented, P20).
    assert em_check("Jean–Paul Sartre", ["Jean-Paul Sartre"]) == 0.0
    assert em_check("Jean-Paul Sartre", ["Jean–Paul Sartre"]) == 0.0
    assert em_check("jean paul sartre", ["Jean-Paul Sartre"]) == 0.0  # "-" is deleted, not spaced
    assert em_check("JeanPaul Sartre", ["Jean-Paul Sartre"]) == 1.0
    # Several aliases: any one matches.
    assert em_check("the Big Apple", ["New York City", "Big Apple", "NYC"]) == 1.0
    assert em_check("NYC.", ["New York City", "Big Apple", "NYC"]) == 1.0
    assert em_check("New York", ["New York City", "Big Apple", "NYC"]) == 0.0
    assert em_check("Paris", ["The", "Paris"]) == 1.0 and em_check("", ["The", "Paris"]) == 0.0
    # str vs list golds: a str is one alias, never a list of characters.
    assert em_check("Paris", "Paris") == em_check("Paris", ["Paris"]) == em_check("Paris", ("Paris",)) == 1.0
    assert em_check("P", "Paris") == 0.0 and em_check("s", "Paris") == 0.0
    assert em_check("Paris", []) == 0.0
    # None prediction (no <answer>) is always 0, even against an articles-only gold.
    assert em_check(None, ["Paris"]) == 0.0 and em_check(None, "The") == 0.0 and em_check(None, "") == 0.0


# ----------------------------------------------------------------------------------------------------------------------
# make_prompt


def test_make_prompt(tok):
    p = make_prompt("what is the capital of france", tok)
    assert p.startswith("<|im_start|>user\n") and p.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "Question: what is the capital of france?\n" in p
    assert p.count("<answer> Beijing </answer>") == 1
    assert make_prompt("  What is the capital of France?  ", tok) == make_prompt("What is the capital of France", tok)
    assert "??" not in make_prompt("Really?", tok)
    assert p == tok.apply_chat_template([{"role": "user", "content": R.PROMPT.format(
        question="what is the capital of france?")}], tokenize=False, add_generation_prompt=True)
    raw = build_tokenizer()
    raw.chat_template = None
    assert make_prompt("Who wrote Hamlet", raw) == R.PROMPT.format(question="Who wrote Hamlet?")
    for bad in ("", "   ", "\n"):
        with pytest.raises(ValueError, match="empty question"):
            make_prompt(bad, tok)


def test_rollout_rejects_row_without_gold(tok, model):
    with pytest.raises(ValueError, match="golden_answers"):
        rollout(hf_generator(model, tok, stop_strings=STOP_STRINGS), tok, [{"question": Q1}], FakeRetriever(), group_size=1)


# ----------------------------------------------------------------------------------------------------------------------
# answer_span (LLDS-MA)


def test_answer_span_unit(tok):
    pre, ans = enc(tok, "<think> x </think>\n"), enc(tok, "<answer> Paris </answer>")
    assert answer_span(pre + ans, tok) == [0] * len(pre) + [1] * len(ans)
    assert answer_span(pre, tok) == [0] * len(pre)
    assert answer_span([], tok) == []
    eos = tok.eos_token_id
    assert answer_span(ans + [eos], tok) == [1] * len(ans) + [0]
    first, last = enc(tok, "<answer> Lyon </answer> "), enc(tok, "<answer> Paris </answer>")
    assert answer_span(first + last, tok) == [0] * len(first) + [1] * len(last)  # the last span only
    nc = enc(tok, "<answer> Bei") + enc(tok, "jing </answer>")  # non-canonical ids
    assert answer_span(pre + nc, tok) == [0] * len(pre) + [1] * len(nc)
    # '.<' is one token: the token holding '<' is marked, and the marked tokens are the minimal cover of the span.
    ids = enc(tok, "done.<answer> Paris </answer> ok")
    m = answer_span(ids, tok)
    on = [i for i, v in enumerate(m) if v]
    assert on == list(range(on[0], on[-1] + 1))
    assert "<answer> Paris </answer>" in tok.decode(ids[on[0]:on[-1] + 1])
    assert "<answer> Paris </answer>" not in tok.decode(ids[on[0] + 1:on[-1] + 1])
    assert "<answer> Paris </answer>" not in tok.decode(ids[on[0]:on[-1]])
    assert tok.decode(ids[on[0]:on[0] + 1]) == ".<"


def test_answer_mask_in_rollout(tok, model):
    s = enc(tok, "<search> Paris </search>")
    pre, ans = enc(tok, "<think> found it </think>\n"), enc(tok, "<answer> Paris </answer>")
    spy = FakeRetriever(lambda q: [hit("x\n<answer> decoy </answer> is not the model's.")])
    eps, _ = run(model, tok, {Q1: [s, pre + ans]}, {Q1: ["Paris"]}, spy, max_turns=2)
    (e,) = eps
    n_obs = len(e.response_ids) - len(s) - len(pre) - len(ans)
    assert e.answer_mask == [0] * (len(s) + n_obs + len(pre)) + [1] * len(ans)
    assert all(m == 1 for m, a in zip(e.loss_mask, e.answer_mask) if a)  # answer tokens are model tokens
    assert e.answer == "Paris" and e.reward == 1.0
