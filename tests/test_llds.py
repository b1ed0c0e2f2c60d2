"""Loss-correctness tests for llds.py: the LLDS regulariser (arXiv 2512.04220 v2 Eqs. 4, 5, 9, 10; the official
code's verl/workers/actor/dp_actor.py:347-431 at commit 6453f61).

Delta = old_logp - logp (> 0: the update made the token rarer). Most tests build old_logp = 0 and logp = -Delta, so the
Deltas can be read off the test. Test names carry the pitfall they pin (docs/pitfalls.md; P25-P29 are the LLDS
regulariser's own).
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.testing import assert_close  # noqa: E402

from llds import MA_SCHEDULES, action_segments, llds_loss, ma_answer_weight, ma_beta, official_metrics  # noqa: E402

GATES = ["action", "response", "token"]
NORMS = ["code", "paper"]


def _from_delta(delta):
    """old_logp = 0, logp = -Delta (a leaf with grad), so old - logp == Delta exactly."""
    old = torch.zeros_like(delta)
    return (-delta).clone().requires_grad_(), old


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


# ----------------------------------------------------------------------------------------------------------------------
# Reduction identities


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("norm", NORMS)
def test_on_policy_loss_and_gradient_exactly_zero(gate, norm):
    # logp == old_logp -> Delta == 0 everywhere: max(0, Delta) = 0 and no token has Delta > 0, so the loss *and* its
    # gradient are exactly 0 (mini-batch #1 of every rollout is on-policy). The token variant has no gate, so this also
    # pins the gradient of max(0, Delta) at Delta = 0 to 0 (P32: only tokens with Delta > 0 are pulled up).
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 6, generator=g)
    logp = old.clone().requires_grad_()
    mask = torch.tensor([[1.0, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 0, 1, 0, 1, 0]])
    for adv in (torch.tensor([1.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 0.0])):
        loss, m = llds_loss(logp, old, adv, mask, gate=gate, norm=norm)
        assert loss.item() == pytest.approx(0.0, abs=1e-12)
        assert (_grad(loss, logp) == 0).all()
        zeros = pytest.approx([0.0] * 3, abs=1e-12)
        assert [m[k] for k in ("llds/gate_rate", "llds/frac_tokens", "llds/delta_mean")] == zeros


def test_action_segments_hand_written():
    keep = torch.tensor([
        [1, 1, 0, 1, 0, 0, 1, 1],  # three runs, the last one at the row end
        [0, 0, 0, 0, 0, 0, 0, 0],  # no model tokens
        [0, 1, 1, 1, 0, 1, 1, 1],  # starts masked, run at the row end
        [1, 0, 1, 0, 1, 0, 1, 0],  # single-token runs
        [1, 1, 1, 1, 1, 1, 1, 1],  # one run
    ])
    want = torch.tensor([
        [1, 1, 0, 2, 0, 0, 3, 3],
        [0, 0, 0, 0, 0, 0, 0, 0],
        [0, 1, 1, 1, 0, 2, 2, 2],
        [1, 0, 2, 0, 3, 0, 4, 0],
        [1, 1, 1, 1, 1, 1, 1, 1],
    ])
    assert torch.equal(action_segments(keep), want)  # exact: integer action ids
    assert torch.equal(action_segments(keep.float()), want)  # exact: integer ids; float masks as llds_loss passes


# ----------------------------------------------------------------------------------------------------------------------
# Gates (hand-computed)

# row 0 (A = +1): action 1 = tokens 0-3, Delta [0.5, -0.2, -0.2, -0.2], signed sum -0.1 -> OFF (one big positive Delta)
#                 token 4 = observation (mask 0, Delta 5.0 must be ignored)
#                 action 2 = tokens 5-7, Delta [-0.1, 0.3, 0.0], signed sum +0.2 -> ON; penalised: token 6 (0.3) only
#                 response signed sum = -0.1 + 0.2 = +0.1 -> ON
# row 1 (A = +1): one action, tokens 0-3, Delta [0.4, -0.3, -0.3, 0.1], sum -0.1 -> OFF (action and response);
#                 tokens 4-7 are padding (mask 0, Delta 7.0 must be ignored)
# unmasked tokens N = 7 + 4 = 11 ("code" normalisation)
GATE_DELTA = torch.tensor([[0.5, -0.2, -0.2, -0.2, 5.0, -0.1, 0.3, 0.0], [0.4, -0.3, -0.3, 0.1, 7.0, 7.0, 7.0, 7.0]])
GATE_MASK = torch.tensor([[1.0, 1, 1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0]])


def test_action_gate_uses_signed_sum_per_action():
    logp, old = _from_delta(GATE_DELTA)
    loss, m = llds_loss(logp, old, torch.tensor([1.0, 1.0]), GATE_MASK, gate="action")
    # only (0, 6) is penalised: 0.3 / 11. Token (0, 0) has Delta = 0.5 > 0 but its action sums to -0.1: gate off
    assert_close(loss, torch.tensor(0.3 / 11))
    want = torch.zeros(2, 8)
    want[0, 6] = -1 / 11
    assert_close(_grad(loss, logp), want, rtol=0, atol=1e-7)
    assert_close(m["llds/gate_rate"], 1 / 3)  # 1 of 3 actions in Y_pre


def test_p29_response_gate_uses_signed_sum_of_response():
    # row 0: response sum +0.1 -> ON, penalty 0.5 + 0.3 = 0.8; row 1: sum -0.1 -> OFF although 0.4 and 0.1 dropped
    # (the pre-6453f61 bug summed max(0, Delta): row 1 would fire and the R-gate would equal the token variant)
    logp, old = _from_delta(GATE_DELTA)
    loss, m = llds_loss(logp, old, torch.tensor([1.0, 1.0]), GATE_MASK, gate="response")
    assert_close(loss, torch.tensor(0.8 / 11))
    want = torch.zeros(2, 8)
    want[0, 0] = want[0, 6] = -1 / 11
    assert_close(_grad(loss, logp), want, rtol=0, atol=1e-7)
    assert_close(m["llds/gate_rate"], 1 / 2)
    tok, _ = llds_loss(logp, old, torch.tensor([1.0, 1.0]), GATE_MASK, gate="token")
    assert loss.item() < tok.item() - 0.01


@pytest.mark.parametrize("gate", ["action", "response"])
def test_gate_is_strict_at_zero_sum(gate):
    # "activated only when sum > 0": Delta [0.5, -0.5, 0.25, -0.25] sums to exactly 0 in float (all dyadic), so the
    # action / response gate stays OFF although tokens 0 and 2 lost likelihood; a `>= 0` gate would penalise 0.75 / 4
    logp, old = _from_delta(torch.tensor([[0.5, -0.5, 0.25, -0.25]]))
    loss, m = llds_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 4), gate=gate)
    assert loss.item() == pytest.approx(0.0, abs=1e-12) and m["llds/gate_rate"] == pytest.approx(0.0, abs=1e-12)
    assert (_grad(loss, logp) == 0).all()


def test_token_variant_is_ungated():
    # every unmasked Y_pre token with Delta > 0: 0.5, 0.3 (row 0) + 0.4, 0.1 (row 1) = 1.3 -> 1.3 / 11
    logp, old = _from_delta(GATE_DELTA)
    loss, m = llds_loss(logp, old, torch.tensor([1.0, 1.0]), GATE_MASK, gate="token")
    assert_close(loss, torch.tensor(1.3 / 11))
    want = torch.zeros(2, 8)
    want[0, 0] = want[0, 6] = want[1, 0] = want[1, 3] = -1 / 11
    assert_close(_grad(loss, logp), want, rtol=0, atol=1e-7)
    assert_close(m["llds/gate_rate"], 4 / 11)  # token variant: share of Y_pre tokens with Delta > 0


# row 0 (A = +1): action 1 = tokens 0-2, Delta [0.4, 0.1, 0.1] sum +0.6 -> ON, all three penalised
#                 tokens 3-4 = observation <information>...</information>, Delta [-0.2, -0.2]
#                 action 2 = tokens 5-7, Delta [-0.3, -0.3, 0.3] sum -0.3 -> OFF
# row 1 (A = -1): 8 tokens, Delta 1.0 each: not in Y_pre, never penalised, but counted in the "code" denominator
SPLIT_DELTA = torch.tensor([[0.4, 0.1, 0.1, -0.2, -0.2, -0.3, -0.3, 0.3], [1.0] * 8])
SPLIT_MASK = torch.tensor([[1.0, 1, 1, 0, 0, 1, 1, 1], [1.0] * 8])
SPLIT_ADV = torch.tensor([1.0, -1.0])


def test_p26_actions_split_at_observation_tokens():
    logp, old = _from_delta(SPLIT_DELTA)
    split, _ = llds_loss(logp, old, SPLIT_ADV, SPLIT_MASK, gate="action")
    assert_close(split, torch.tensor(0.6 / 14))  # (0.4 + 0.1 + 0.1) / (6 + 8)
    # the same Deltas with the observation tokens left unmasked: one action, sum 0.6 - 0.4 - 0.3 = -0.1 -> OFF
    merged_mask = torch.ones(2, 8)
    assert torch.equal(action_segments(merged_mask[:1]), torch.ones(1, 8, dtype=torch.long))
    merged, m = llds_loss(logp, old, SPLIT_ADV, merged_mask, gate="action")
    assert merged.item() == pytest.approx(0.0, abs=1e-12) and m["llds/gate_rate"] == pytest.approx(0.0, abs=1e-12)
    assert (_grad(merged, logp) == 0).all()


def test_metrics_hand_checked():
    # on the SPLIT example (action gate): Y_pre = row 0 only, 6 tokens, 2 actions, 1 gated
    # gate_rate = 1/2 ; delta_mean = (0.4 + 0.1 + 0.1 - 0.3 - 0.3 + 0.3) / 6 = 0.3 / 6 = 0.05
    #   (observation tokens and the A < 0 row are excluded)
    # frac_tokens = 3 penalised / 6 = 0.5 ; penalty = 0.6 / 14
    logp, old = _from_delta(SPLIT_DELTA)
    loss, m = llds_loss(logp, old, SPLIT_ADV, SPLIT_MASK, gate="action")
    assert_close(m["llds/gate_rate"], 0.5)
    assert_close(m["llds/delta_mean"], 0.05)
    assert_close(m["llds/frac_tokens"], 0.5)
    assert_close(m["llds/penalty"], 0.6 / 14)
    assert_close(m["llds/penalty"], loss.item())


@pytest.mark.parametrize("gate, want", [("action", 0.5), ("response", 0.5), ("token", 2.0)])
def test_active_per_response_hand_checked(gate, want):
    # GATE example, both rows A = +1, so |Y_pre| = 2 responses:
    #   action: row 0 has 2 actions, 1 gated; row 1 one action, off -> 1 / 2 (the code's actor/mean_reduce_chunk,
    #           dp_actor.py:383: mean over A >= 0 rows of the activated actions per row = mean(1, 0))
    #   response: row 0 on, row 1 off -> 1 / 2 ; token: Delta > 0 on (0,0), (0,6), (1,0), (1,3) -> 4 / 2
    logp, old = _from_delta(GATE_DELTA)
    _, m = llds_loss(logp, old, torch.tensor([1.0, 1.0]), GATE_MASK, gate=gate)
    assert_close(m["llds/active_per_response"], want)
    # SPLIT: row 1 has A < 0 and is not counted: 1 gated action of the one Y_pre response
    logp, old = _from_delta(SPLIT_DELTA)
    assert_close(llds_loss(logp, old, SPLIT_ADV, SPLIT_MASK)[1]["llds/active_per_response"], 1.0)


def test_active_per_response_matches_the_official_loop_on_random_tensors():
    # dp_actor.py:376-383 written out: per row with A >= 0, count the runs of (loss_mask * [A >= 0]) whose signed
    # sum of Delta is > 0; the metric is the mean of that count over those rows
    g = torch.Generator().manual_seed(21)
    B, T = 7, 16
    delta = 0.3 * torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) < 0.7).float()
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5, -0.2, 1.0, 0.0])
    counts = []
    for i in range(B):
        if adv[i] < 0:
            continue
        n, run = 0, []
        for t in range(T + 1):
            if t < T and mask[i, t] == 1:
                run.append(delta[i, t].item())
            elif run:
                n, run = n + (sum(run) > 0), []
        counts.append(n)
    assert max(counts) >= 2  # not vacuous
    logp, old = _from_delta(delta)
    _, m = llds_loss(logp, old, adv, mask, gate="action")
    assert m["llds/active_per_response"] == pytest.approx(sum(counts) / len(counts), rel=1e-6)


@pytest.mark.parametrize("gate", GATES)
def test_p27_negative_advantage_never_penalised_zero_advantage_is(gate):
    # identical rows, every Delta = 0.5 > 0 (so every gate fires); A = [-1, 0, +1]
    # row 0 (A < 0): no penalty, zero gradient ; rows 1 (A = 0, in Y_pre) and 2: 4 x 0.5 each -> 4.0 / 12 ("code")
    delta = torch.full((3, 4), 0.5)
    logp, old = _from_delta(delta)
    loss, _ = llds_loss(logp, old, torch.tensor([-1.0, 0.0, 1.0]), torch.ones(3, 4), gate=gate)
    assert_close(loss, torch.tensor(4.0 / 12))
    g = _grad(loss, logp)
    assert (g[0] == 0).all()
    assert_close(g[1:], torch.full((2, 4), -1 / 12))
    # per-token advantages [B, T] work the same way
    adv_tok = torch.tensor([-1.0, 0.0, 1.0])[:, None].expand(3, 4)
    loss_tok, _ = llds_loss(logp, old, adv_tok, torch.ones(3, 4), gate=gate)
    assert_close(loss_tok, loss)


# ----------------------------------------------------------------------------------------------------------------------
# Vectorised vs plain loop (v2 Eqs. 4, 9, 10 and dp_actor.py:373-396, written out token by token)


def _llds_loop(logp, old, adv, mask, gate, norm):
    """Plain-Python LLDS from v2 Eqs. 4, 9, 10 / dp_actor.py. Returns (loss, dloss/dlogp) as Python floats / lists."""
    B, T = len(mask), len(mask[0])
    n_tok = sum(sum(row) for row in mask)
    in_pre = [adv[i] >= 0 and sum(mask[i]) > 0 for i in range(B)]
    n_pre = sum(in_pre)
    n_pre_tok = sum(sum(mask[i]) for i in range(B) if in_pre[i])
    loss, coef = 0.0, [[0.0] * T for _ in range(B)]
    for i in range(B):
        if adv[i] < 0:
            continue
        delta = [old[i][t] - logp[i][t] for t in range(T)]
        runs, t = [], 0
        while t < T:  # maximal runs of model tokens = actions
            if mask[i][t] == 1:
                s = t
                while t < T and mask[i][t] == 1:
                    t += 1
                runs.append(list(range(s, t)))
            else:
                t += 1
        if gate == "action":
            units = [(r, sum(delta[t] for t in r) > 0) for r in runs]
        elif gate == "response":
            tokens = [t for r in runs for t in r]
            units = [(tokens, sum(delta[t] for t in tokens) > 0)]
        else:
            units = [([t], True) for r in runs for t in r]
        # "code": / all unmasked tokens of the batch ; "paper": Eq. 4 (action) / (this response's tokens * |Y_pre|),
        # Eqs. 9/10 (token, response) / all tokens of the Y_pre responses
        denom = n_tok if norm == "code" else sum(mask[i]) * n_pre if gate == "action" else n_pre_tok
        for tokens, on in units:
            for t in tokens:
                if on and delta[t] > 0:
                    loss += delta[t] / denom
                    coef[i][t] = -1.0 / denom  # d max(0, old - logp) / d logp = -1 where Delta > 0
    return loss, coef


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("norm", NORMS)
def test_gradient_matches_loop_reference_on_random_tensors(gate, norm):
    # logp comes from logits, so the check is dL/dlogits == sum_{gated, Delta>0} -(1/denom) * d logp_tok / d logits
    g = torch.Generator().manual_seed(7)
    B, T, V = 6, 14, 9
    old_logits = torch.randn(B, T, V, generator=g)
    logits = (old_logits + 0.3 * torch.randn(B, T, V, generator=g)).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=g)
    old = torch.log_softmax(old_logits, -1).gather(-1, targets[..., None])[..., 0]
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    same = torch.rand(B, T, generator=g) < 0.2  # some tokens unchanged: Delta exactly 0, never pulled
    logp = torch.where(same, old, logp)
    mask = (torch.rand(B, T, generator=g) < 0.75).float()  # several actions per row, observations in between
    mask[1] = 0.0  # a row with no model tokens
    mask[2, :] = 1.0  # a row that is one long action
    adv = torch.tensor([1.0, 0.5, 0.0, -1.0, 2.0, -0.3])

    loss, _ = llds_loss(logp, old, adv, mask, gate=gate, norm=norm)
    ref_loss, coef = _llds_loop(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), gate, norm)
    coef = torch.tensor(coef)
    assert (coef != 0).sum() >= 5  # the case is not vacuous
    assert_close(loss.item(), ref_loss, rtol=1e-5, atol=1e-7)
    g_logp, g_logits = torch.autograd.grad(loss, [logp, logits], retain_graph=True)
    assert_close(g_logp, coef, rtol=0, atol=1e-6)  # -1/denom on gated Delta > 0 tokens, 0 elsewhere
    assert (g_logp[coef == 0] == 0).all()  # exactly 0, not merely small
    want = _grad((logp * coef).sum(), logits)  # chain rule through log_softmax: sum_tok coef * d logp_tok / d logits
    assert_close(g_logits, want, rtol=0, atol=1e-6)


def test_gradient_is_minus_lambda_grad_logp_on_gated_tokens():
    # The gate is detached: d/dtheta [lambda * L_LLDS] = -(lambda / denom) * grad logp on gated tokens with Delta > 0, 0
    # elsewhere. logp comes from logits (theta), old = logp + Delta exactly where Delta = 0. lambda = 0.2, action gate.
    # row 0 (A = +1), mask [1, 1, 0, 1, 1, 1]: action 1 Delta [0.3, -0.1] sum +0.2 ON -> token 0 pulled (token 1 < 0);
    #        token 2 observation (Delta 0.5 ignored); action 2 Delta [0.2, -0.4, 0] sum -0.2 OFF -> nothing pulled
    # row 1 (A = 0), mask [1, 1, 1, 1, 0, 0]: Delta [0.1, 0, 0.2, -0.05] sum +0.25 ON -> tokens 0 and 2 (Delta = 0: no)
    # row 2 (A = -1), mask [1, 1, 1, 0, 0, 0]: Delta 0.5 everywhere but never pulled; counted in the denominator
    # denom ("code") = 5 + 4 + 3 = 12 ; loss = 0.2 * (0.3 + 0.1 + 0.2) / 12 = 0.01
    lam = 0.2
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(3, 6, 5, generator=g).requires_grad_()
    targets = torch.randint(0, 5, (3, 6), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]  # [3, 6]
    delta = torch.tensor([[0.3, -0.1, 0.5, 0.2, -0.4, 0.0], [0.1, 0.0, 0.2, -0.05, 0.0, 0.0], [0.5] * 6])
    old = torch.where(delta == 0, logp.detach(), logp.detach() + delta)
    mask = torch.tensor([[1.0, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    reg, _ = llds_loss(logp, old, torch.tensor([1.0, 0.0, -1.0]), mask, gate="action")
    loss = lam * reg  # train.py: loss = pg + lambda * llds
    assert_close(loss, torch.tensor(0.01), rtol=1e-5, atol=1e-7)
    gated = torch.zeros(3, 6)
    gated[0, 0] = gated[1, 0] = gated[1, 2] = 1.0
    g_logp, g_logits = torch.autograd.grad(loss, [logp, logits], retain_graph=True)
    assert_close(g_logp, -lam / 12 * gated, rtol=0, atol=1e-6)
    assert (g_logp[gated == 0] == 0).all()
    want = _grad((-lam / 12 * gated * logp).sum(), logits)  # -lambda * grad logp, summed over the gated tokens
    assert_close(g_logits, want, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# Normalisation, LLDS-MA, micro-batching


def test_p25_code_and_paper_normalisation_hand_computed():
    # action gate, A = [1, 0, -1]
    # row 0: 4 tokens, Delta [0.4, -0.1, 0.2, 0.3], sum 0.8 > 0 -> penalty 0.4 + 0.2 + 0.3 = 0.9
    # row 1: 2 tokens (+2 padding), Delta [0.6, 0.2], sum 0.8 > 0 -> penalty 0.8
    # row 2: A < 0, 3 tokens: no penalty, but its 3 tokens are in the code denominator
    # code  = (0.9 + 0.8) / (4 + 2 + 3)          = 1.7 / 9
    # paper = mean over Y_pre of per-response means = (0.9/4 + 0.8/2) / 2 = (0.225 + 0.4) / 2 = 0.3125
    delta = torch.tensor([[0.4, -0.1, 0.2, 0.3], [0.6, 0.2, 9.0, 9.0], [1.0, 1.0, 1.0, 9.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    adv = torch.tensor([1.0, 0.0, -1.0])
    logp, old = _from_delta(delta)
    code, _ = llds_loss(logp, old, adv, mask, norm="code")
    paper, _ = llds_loss(logp, old, adv, mask, norm="paper")
    assert_close(code, torch.tensor(1.7 / 9))
    assert_close(paper, torch.tensor(0.3125))
    # paper gradient: -1/(|y_i| |Y_pre|) = -1/8 on row 0's penalised tokens, -1/4 on row 1's
    want = torch.tensor([[-1 / 8, 0, -1 / 8, -1 / 8], [-1 / 4, -1 / 4, 0, 0], [0, 0, 0, 0]])
    assert_close(_grad(paper, logp), want)


# rows (A = [1, 0, -1, 1]), each one action (no observation):
# row 0: 4 tokens, Delta [0.4, -0.1, 0.2, 0.3], sum 0.8 > 0 (on) -> penalty 0.4 + 0.2 + 0.3 = 0.9
# row 1: 2 tokens (+2 padding), Delta [0.6, 0.2], sum 0.8 (on) -> 0.8
# row 2: A < 0, 3 tokens: never penalised, in the "code" denominator only
# row 3: 2 tokens, Delta [0.5, -0.7], sum -0.2: response / action gate off; the token variant penalises 0.5
POOL_DELTA = torch.tensor([[0.4, -0.1, 0.2, 0.3], [0.6, 0.2, 9.0, 9.0], [1.0, 1.0, 1.0, 9.0], [0.5, -0.7, 9.0, 9.0]])
POOL_MASK = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]])
POOL_ADV = torch.tensor([1.0, 0.0, -1.0, 1.0])


@pytest.mark.parametrize("gate, want, penalised", [
    # Eqs. 10 / 9 pool over the kept tokens: one denominator, the 4 + 2 + 2 = 8 model tokens of the Y_pre responses
    ("response", (0.9 + 0.8) / 8, [(0, 0), (0, 2), (0, 3), (1, 0), (1, 1)]),  # 0.2125
    ("token", (0.9 + 0.8 + 0.5) / 8, [(0, 0), (0, 2), (0, 3), (1, 0), (1, 1), (3, 0)]),  # 0.275
])
def test_paper_normalisation_of_response_and_token_gates_pools_kept_tokens(gate, want, penalised):
    # The per-response mean of Eq. 4 (what "paper" gave these gates before) differs here, because the Y_pre responses
    # have 4, 2 and 2 tokens: response (0.9/4 + 0.8/2 + 0/2) / 3 = 0.2083, token (0.9/4 + 0.8/2 + 0.5/2) / 3 = 0.2917.
    logp, old = _from_delta(POOL_DELTA)
    loss, _ = llds_loss(logp, old, POOL_ADV, POOL_MASK, gate=gate, norm="paper")
    assert_close(loss, torch.tensor(want))
    grad = torch.zeros(4, 4)
    for i, t in penalised:
        grad[i, t] = -1 / 8  # the same -1 / (sum_{Y_pre} |y_i|) on every penalised token, long or short response
    assert_close(_grad(loss, logp), grad)
    # the action gate keeps Eq. 4's per-response mean: (0.9/4 + 0.8/2 + 0/2) / 3
    action, _ = llds_loss(logp, old, POOL_ADV, POOL_MASK, gate="action", norm="paper")
    assert_close(action, torch.tensor((0.225 + 0.4) / 3))


@pytest.mark.parametrize("gate", GATES)
def test_bf16_log_probs_give_the_fp32_result(gate):
    # bf16 log-probs, as an autocast forward can return them (the action gate used to raise in scatter_add_: a float32
    # Delta * keep added into a bf16 buffer). Delta is now formed in float32, so the loss equals the float32 loss on the
    # same (bf16-rounded) values to float32 rounding, and the float32 loss on the unrounded values to bf16 precision.
    g = torch.Generator().manual_seed(5)
    B, T = 6, 24
    old = -3 * torch.rand(B, T, generator=g)
    logp32 = old + 0.3 * torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) < 0.8).float()
    adv = torch.tensor([1.0, 0.0, -1.0, 0.5, 1.0, 0.0])
    lp16 = logp32.bfloat16().requires_grad_()
    loss16, m16 = llds_loss(lp16, old.bfloat16(), adv, mask, gate=gate)
    assert loss16.dtype == torch.float32
    lp_ref = lp16.detach().float().requires_grad_()
    ref, m_ref = llds_loss(lp_ref, old.bfloat16().float(), adv, mask, gate=gate)
    assert loss16.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)  # bf16 inputs: another code path
    assert m16 == pytest.approx(m_ref, rel=1e-5, abs=1e-6)
    g16 = _grad(loss16, lp16)
    assert g16.dtype == torch.bfloat16
    assert_close(g16.float(), _grad(ref, lp_ref), rtol=2 ** -8, atol=0)  # -1/N rounded to bf16
    full, _ = llds_loss(logp32, old, adv, mask, gate=gate)
    assert full.item() > 0.01  # not vacuous
    assert_close(loss16.item(), full.item(), rtol=0.02, atol=0)  # bf16 rounds log-probs near -3 by <= 2^-7 nats


def test_gradient_at_zero_delta_is_zero_where_the_official_maximum_gives_half():
    # P32. One A >= 0 response, 4 tokens, on-policy: Delta == 0 exactly on every token, token variant (no gate).
    # ours (relu): gradient 0. The code's torch.maximum(zeros, Delta) (dp_actor.py:374) splits the tie: d/dlogp =
    # -1/2 per token, / 4 tokens = -0.125; clamp(min=0) passes all of it: -0.25.
    logp = torch.full((1, 4), -1.0, requires_grad=True)
    old = logp.detach().clone()
    loss, _ = llds_loss(logp, old, torch.ones(1), torch.ones(1, 4), gate="token")
    assert loss.item() == pytest.approx(0.0, abs=1e-12) and (_grad(loss, logp) == 0).all()
    official = torch.maximum(torch.zeros_like(logp), old - logp).sum() / 4
    assert_close(_grad(official, logp), torch.full((1, 4), -0.125))
    assert_close(_grad((old - logp).clamp(min=0).sum() / 4, logp), torch.full((1, 4), -0.25))


def test_p28_ma_weight_scales_only_answer_span():
    # one response, one action, Delta [0.2, 0.2, 0.4, 0.4] (sum > 0). Answer span = last 2 tokens, beta = 0.5.
    # weighted = (0.2 + 0.2 + 0.5 * 0.4 + 0.5 * 0.4) / 4 = 0.8 / 4 = 0.2 ; unweighted = 1.2 / 4 = 0.3
    delta = torch.tensor([[0.2, 0.2, 0.4, 0.4]])
    weight = torch.tensor([[1.0, 1.0, 0.5, 0.5]])
    logp, old = _from_delta(delta)
    plain, _ = llds_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 4))
    ma, _ = llds_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 4), weight=weight)
    assert_close(plain, torch.tensor(0.3))
    assert_close(ma, torch.tensor(0.2))
    assert_close(_grad(ma, logp), torch.tensor([[-0.25, -0.25, -0.125, -0.125]]))
    # beta = 0 switches the answer span off entirely; the gate itself is unchanged (it uses the unweighted Delta)
    ma0, m0 = llds_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 4), weight=torch.tensor([[1.0, 1, 0, 0]]))
    assert_close(_grad(ma0, logp), torch.tensor([[-0.25, -0.25, 0.0, 0.0]]))
    assert m0["llds/gate_rate"] == pytest.approx(1.0, rel=1e-5)
    assert m0["llds/frac_tokens"] == pytest.approx(0.5, rel=1e-5)


@pytest.mark.parametrize(
    "v, code, paper",
    [(0.0, 0.0, 0.0), (1.0, 0.0, 0.5), (1.5, 0.5, 0.75), (2.0, 1.0, 1.0), (3.0, 1.0, 1.0)],
)
def test_p28_ma_beta_schedules(v, code, paper):
    # code: clip(V - 1, 0, 1) (MASK_ADAPTIVE=true) ; paper: min(V / 2, 1) (v2 App. B.2.1). They differ at V = 1, 1.5.
    assert ma_beta(v, "code") == pytest.approx(code)
    assert ma_beta(v, "paper") == pytest.approx(paper)


@pytest.mark.parametrize(
    "schedule, v, want",
    # one response, one action, Delta [0.2, 0.2, 0.4, 0.4] (sum > 0), answer span = the last 2 tokens.
    # weight = 1 + (beta - 1) * answer_mask (train.py) -> loss = (0.2 + 0.2 + beta * (0.4 + 0.4)) / 4
    # code  (beta = clip(V - 1, 0, 1)): V = 1 -> beta 0   -> 0.4 / 4 = 0.1 ; V = 1.5 -> 0.5 -> 0.8 / 4 = 0.2
    # paper (beta = min(V / 2, 1))    : V = 1 -> beta 0.5 -> 0.8 / 4 = 0.2 ; V = 1.5 -> 0.75 -> 1.0 / 4 = 0.25
    # both at V = 2: beta 1 -> plain LLDS, 1.2 / 4 = 0.3
    [("code", 1.0, 0.1), ("code", 1.5, 0.2), ("code", 2.0, 0.3),
     ("paper", 1.0, 0.2), ("paper", 1.5, 0.25), ("paper", 2.0, 0.3)],
)
def test_p28_llds_ma_with_code_and_paper_beta(schedule, v, want):
    answer_mask = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    beta = ma_beta(v, schedule)
    weight = 1.0 + (beta - 1.0) * answer_mask  # as train.py builds it
    logp, old = _from_delta(torch.tensor([[0.2, 0.2, 0.4, 0.4]]))
    loss, _ = llds_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 4), gate="action", weight=weight)
    assert_close(loss, torch.tensor(want))
    assert_close(_grad(loss, logp), -weight / 4)


@pytest.mark.parametrize("schedule, v, lam, w, beta, answer_weight", [
    # fixed (MASK_ADAPTIVE=false, MASK_ANS=true): the answer coefficient min(w, lambda), whatever V
    ("fixed", 1.0, 0.2, 0.05, 0.25, 0.05),  # w = 0.05 (v1's probable setting): 0.05 / 0.2
    ("fixed", 3.0, 0.2, 0.05, 0.25, 0.05),
    ("fixed", 1.0, 0.2, 0.5, 1.0, 0.5),  # capped at lambda: min(0.5, 0.2) / 0.2
    ("fixed", 1.0, 0.3, 0.2, 2 / 3, 0.2),  # lambda 0.3 (7B-Instruct) with the scripts' MASK_WEIGHT 0.2
    # code (MASK_ADAPTIVE=true): min(w * max(V - 1, 0), lambda) / lambda; answer_weight is logged before the cap
    ("code", 1.5, 0.3, 0.2, 1 / 3, 0.1),  # 0.2 * 0.5 = 0.1 -> 0.1 / 0.3
    ("code", 3.0, 0.2, 0.2, 1.0, 0.4),  # 0.2 * 2 = 0.4 -> capped at 0.2
    ("code", 0.5, 0.2, 0.2, 0.0, 0.0),
    # paper: min(V / 2, 1), w unused; its answer coefficient is lambda * beta
    ("paper", 1.0, 0.3, 0.05, 0.5, 0.15),
])
def test_ma_beta_fixed_and_code_schedules_with_mask_weight(schedule, v, lam, w, beta, answer_weight):
    assert ma_beta(v, schedule, lam=lam, mask_weight=w) == pytest.approx(beta)
    assert ma_answer_weight(v, schedule, lam=lam, mask_weight=w) == pytest.approx(answer_weight)
    assert ma_beta(v, schedule, lam=0.0, mask_weight=w) == pytest.approx(1.0)  # the term is off: penalty unweighted


@pytest.mark.parametrize("schedule", ["code", "fixed"])
@pytest.mark.parametrize("v", [0.8, 1.25, 2.0, 2.7])
@pytest.mark.parametrize("lam, w", [(0.2, 0.2), (0.2, 0.05), (0.3, 0.2), (0.1, 0.4)])
def test_ma_weight_times_lambda_is_the_official_coefficient_map(schedule, v, lam, w):
    # dp_actor.py:359-371, 395-396 written out: answer-span tokens get min(mask_weight, lambda), the others lambda,
    # with mask_weight = w * max(V - 1, 0) (MASK_ADAPTIVE=true) or w; loss = masked_mean(valid * coeff). Ours, lambda *
    # llds_loss(weight = 1 + (beta - 1) * answer_mask), must be the same number (P28), gate and all.
    g = torch.Generator().manual_seed(13)
    delta = 0.3 * torch.randn(3, 10, generator=g)
    mask = torch.ones(3, 10)
    mask[0, 4:6] = mask[2, 7:] = 0.0
    answer = torch.zeros(3, 10)
    answer[0, 7:] = answer[1, 6:] = 1.0
    adv = torch.tensor([1.0, 0.0, -1.0])
    logp, old = _from_delta(delta)
    beta = ma_beta(v, schedule, lam=lam, mask_weight=w)
    loss, _ = llds_loss(logp, old, adv, mask, weight=1.0 + (beta - 1.0) * answer)
    mask_weight = w * max(v - 1.0, 0.0) if schedule == "code" else w
    coeff = torch.where(answer.bool(), min(mask_weight, lam), lam)  # the code's answer_mask is 0 on the span
    gate_tok = torch.zeros(3, 10)
    keep = (adv >= 0).float()[:, None] * mask
    for i in range(3):  # the action gate, as a loop
        t = 0
        while t < 10:
            if keep[i, t]:
                s = t
                while t < 10 and keep[i, t]:
                    t += 1
                gate_tok[i, s:t] = float(delta[i, s:t].sum() > 0)
            else:
                t += 1
    official = (gate_tok * delta.clamp(min=0) * coeff * mask).sum() / mask.sum()
    assert official.item() > 0
    assert_close(lam * loss, official)


def test_ma_beta_unknown_schedule_raises():
    assert sorted(MA_SCHEDULES) == ["code", "fixed", "paper"]  # train.py's --llds-ma choices come from this table
    with pytest.raises(ValueError):
        ma_beta(1.0, "linear")


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("norm", NORMS)
def test_p14_llds_microbatch_invariance(gate, norm):
    g = torch.Generator().manual_seed(3)
    B, T = 8, 10
    old = -torch.rand(B, T, generator=g) * 2
    theta = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_()
    lengths = torch.tensor([10, 3, 7, 1, 9, 5, 2, 8])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    mask[0, 4:6] = 0.0  # an observation block
    mask[4, 2] = 0.0
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5, 1.0, -0.5, 1.0, 0.0])
    full, _ = llds_loss(theta * 1.0, old, adv, mask, gate=gate, norm=norm)
    g_full = _grad(full, theta)
    assert g_full.abs().max() > 0
    num_tokens = mask.sum()  # mini-batch totals, computed before splitting
    num_pre = ((adv >= 0).float()[:, None] * mask).sum(-1).gt(0).sum()
    num_pre_tokens = ((adv >= 0).float()[:, None] * mask).sum()
    total, active = torch.zeros_like(theta), 0.0
    for rows in (slice(0, 4), slice(4, 8)):
        loss, m = llds_loss(theta[rows] * 1.0, old[rows], adv[rows], mask[rows], gate=gate, norm=norm,
                            num_tokens=num_tokens, num_pre=num_pre, num_pre_tokens=num_pre_tokens)
        total += _grad(loss, theta)
        active += m["llds/active_per_response"]  # normalised by the mini-batch's num_pre: the halves add up
    assert_close(total, g_full, rtol=0, atol=1e-6)
    assert active == pytest.approx(llds_loss(theta, old, adv, mask, gate=gate)[1]["llds/active_per_response"])
    # without the mini-batch totals the two halves (47 vs 22 tokens) are normalised differently ("code")
    if norm == "code":
        naive = sum(_grad(llds_loss(theta[r] * 1.0, old[r], adv[r], mask[r], gate=gate)[0], theta) / 2
                    for r in (slice(0, 4), slice(4, 8)))
        assert (naive - g_full).abs().max().item() > 1e-3


def test_unknown_gate_norm_or_shape_raises():
    x = torch.zeros(2, 4, requires_grad=True)
    adv, mask = torch.ones(2), torch.ones(2, 4)
    with pytest.raises(ValueError):
        llds_loss(x, x.detach(), adv, mask, gate="chunk")
    with pytest.raises(ValueError):
        llds_loss(x, x.detach(), adv, mask, norm="mean")
    with pytest.raises(ValueError):
        llds_loss(x, x.detach(), adv, torch.ones(2, 5))


def test_official_metrics_hand_computed():
    # rows: A = [1, 0, -1]; loss_mask [[1,1,0,1], [1,1,1,0], [1,1,0,0]] -> 8 model tokens (the denominator of all four
    # pos_/neg_ averages, dp_actor.py:418-426)
    # pos_avg_old = (-1 - 2 - 3  -1 - 1 - 1) / 8 = -9/8 ; neg_avg_old = (-4 - 2) / 8 = -0.75 (sum = the token mean)
    # ref = old - 0.5 -> pos = (-9 - 6 * 0.5) / 8 = -1.5 ; neg = (-6 - 2 * 0.5) / 8 = -7/8
    # answer_mask [[0,0,0,1], [0,1,1,0], [0,0,0,0]]: per response 1, 2, 0 tokens -> answer_tokens 1.0, answer_frac 2/3
    # answer-token probabilities exp(logp) = 0.25 | 0.5, 0.125 -> mean 0.875 / 3; min: the code's masked_min, each
    # response's minimum (0.25, 0.125; row 2 has no span and is left out) averaged: 0.1875 (the global min is 0.125)
    old = torch.tensor([[-1.0, -2, 9, -3], [-1, -1, -1, 9], [-4, -2, 9, 9]])
    mask = torch.tensor([[1.0, 1, 0, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    answer = torch.tensor([[0.0, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]])
    logp = torch.log(torch.tensor([[0.9, 0.9, 0.9, 0.25], [0.9, 0.5, 0.125, 0.01], [0.9, 0.9, 0.9, 0.9]]))
    m = official_metrics(old, logp, torch.tensor([1.0, 0.0, -1.0]), mask, answer, ref_logp=old - 0.5)
    assert m["llds/pos_avg_old_logp"] == pytest.approx(-9 / 8) and m["llds/neg_avg_old_logp"] == pytest.approx(-0.75)
    assert m["llds/pos_avg_ref_logp"] == pytest.approx(-1.5) and m["llds/neg_avg_ref_logp"] == pytest.approx(-7 / 8)
    assert m["llds/answer_tokens"] == pytest.approx(1.0) and m["llds/answer_frac"] == pytest.approx(2 / 3)
    assert m["llds/answer_prob_mean"] == pytest.approx(0.875 / 3) and m["llds/answer_prob_min"] == pytest.approx(0.1875)
    # no answer span anywhere: 0.0, as the code logs (dp_actor.py:413-415); no reference: no ref_ keys
    m = official_metrics(old, logp, torch.tensor([1.0, 0.0, -1.0]), mask, torch.zeros(3, 4))
    zeros = pytest.approx([0.0] * 3, abs=1e-12)
    assert [m[k] for k in ("llds/answer_prob_mean", "llds/answer_prob_min", "llds/answer_frac")] == zeros
    assert "llds/pos_avg_ref_logp" not in m


# ----------------------------------------------------------------------------------------------------------------------
# Diagnostics (v2 Sec. 4-5, Figs. 2, 5) and the LLD alarm

from llds import likelihood_diagnostics, lld_alarm  # noqa: E402


def test_likelihood_diagnostics_by_hand():
    """Two correct responses and one incorrect; the first action is the run of 1s before the first observation."""
    mask = torch.tensor([[1.0, 1, 0, 1, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 1]])  # row 1 padded, rows 0/2 two actions
    before = torch.tensor([[-1.0, -2, 9, -3, 9], [-1, -1, -1, 9, 9], [-4, 9, 9, -2, -2]])
    after = before - torch.tensor([[0.5, 0, 7, 0, 7], [0, 0, -0.3, 7, 7], [0, 7, 7, 1, 0]])
    d = likelihood_diagnostics(before, after, mask, torch.tensor([1.0, 1, 0]))
    assert d["diag/logp_correct"] == pytest.approx((-1 - 2 - 3 - 1 - 1 - 1) / 6)  # token-mean, masked tokens ignored
    assert d["diag/seqlogp_correct"] == pytest.approx((-6 + -3) / 2)  # mean of the per-response sums
    assert d["diag/logp_incorrect"] == pytest.approx(-8 / 3) and d["diag/seqlogp_incorrect"] == pytest.approx(-8)
    assert d["diag/delta_correct"] == pytest.approx((-0.5 + 0.3) / 2)  # sum_t (after - before), mean over responses
    assert d["diag/delta_incorrect"] == pytest.approx(-1.0)
    assert d["diag/seqlogp_correct_after"] == pytest.approx((-6.5 - 2.7) / 2)
    assert d["diag/frac_correct_lld"] == pytest.approx(0.5)  # response 0 lost likelihood, response 1 gained
    assert d["diag/logp_first_action"] == pytest.approx((-1 - 2 - 1 - 1 - 1 - 4) / 6)
    assert d["diag/logp_later_actions"] == pytest.approx((-3 - 2 - 2) / 3)


def test_likelihood_diagnostics_empty_sets_are_none():
    mask = torch.ones(2, 3)
    d = likelihood_diagnostics(-torch.ones(2, 3), -torch.ones(2, 3), mask, torch.zeros(2))  # nothing correct
    assert d["diag/logp_correct"] is None and d["diag/delta_correct"] is None and d["diag/frac_correct_lld"] is None
    assert d["diag/logp_incorrect"] == pytest.approx(-1.0) and d["diag/logp_later_actions"] is None  # one action each


@pytest.mark.parametrize("delta, gnorm, phase", [
    ([0.2, 0.1, 0.3, 0.05], [1.0] * 4, ""),  # the likelihood of correct responses rises: healthy
    ([0.2, 0.0, -0.01, 0.0], [1.0] * 4, "stagnation"),  # flat (<= 0) for k = 3 steps, not clearly falling (phase I)
    ([0.1, -0.10, -0.12, -0.11], [1.0, 1.1, 0.9, 1.0], "steady decay"),  # falls, grad norm stable (phase II)
    ([0.1, -0.1, -0.3, -0.8], [1.0] * 4, "acceleration"),  # falls faster each step, 8x within k steps (phase III)
    ([-0.1, -0.1, -0.1, -0.1, -0.1, -0.1], [1, 1, 1, 1, 1, 5.0], "acceleration"),  # grad-norm spike (red star)
    ([0.1, -0.1, None, -0.2, None, -0.15], [1.0] * 6, "steady decay"),  # steps without a correct response skipped
    ([-0.5, -0.6], [1.0, 1.0], ""),  # fewer than k values: no verdict yet
    ([-0.1, -0.2, 0.01], [1.0] * 3, ""),  # one step of recovery clears it
])
def test_lld_alarm_phases(delta, gnorm, phase):
    assert lld_alarm(delta, gnorm, k=3) == phase


def test_lld_alarm_walks_through_the_three_phases_before_the_reward_collapses():
    """A synthetic run shaped like v2 Fig. 2: the reward rises for 40 steps while the correct-response likelihood
    first stalls, then decays, then drops with a grad-norm spike; the reward collapses only after step 50. The alarm
    names the phases in order and fires its first acceleration warning before the reward falls."""
    steps = range(60)
    delta = [0.3 if s < 10 else 0.0 if s < 20 else -0.05 if s < 40 else -0.05 * 1.5 ** (s - 39) for s in steps]
    gnorm = [1.0 if s < 44 else 6.0 for s in steps]
    reward = [min(0.6, 0.015 * s) if s < 50 else 0.0 for s in steps]
    phases = [lld_alarm(delta[: s + 1], gnorm[: s + 1]) for s in steps]
    order = [p for i, p in enumerate(phases) if p and (i == 0 or phases[i - 1] != p)]
    assert order == ["stagnation", "steady decay", "acceleration"]
    first_acc = phases.index("acceleration")
    assert 40 <= first_acc < reward.index(0.0, 1) and max(reward[:first_acc]) > 0.5
    with pytest.raises(ValueError):
        lld_alarm([0.0], [1.0], k=0)


# ----------------------------------------------------------------------------------------------------------------------
# Issue 22: inputs at the edges (-inf on masked slots, no tokens, wrong shapes)


@pytest.mark.parametrize("gate", ["action", "response", "token"])
def test_minus_inf_log_probs_on_masked_slots_change_nothing(gate):
    """A -inf log-prob on a masked slot of a kept row (padding, an observation) leaves the loss, gradient and metrics
    as they are with a finite value there: before, the response gate summed -inf * 0 = NaN, and NaN > 0 switched it
    off, so the penalty came out a finite 0.0 instead of its value."""
    old = torch.tensor([[-1.0, -1.0, -2.0, -1.0], [-1.0, -2.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    logp_fin = torch.tensor([[-1.5, -1.2, -3.0, -3.0], [-1.1, -2.5, -1.0, -3.0]])
    adv = torch.tensor([1.0, 0.0])
    lp_fin = logp_fin.clone().requires_grad_()
    want, m_want = llds_loss(lp_fin, old, adv, mask, gate=gate)
    grad_want = _grad(want, lp_fin)
    assert want.item() > 0.1  # both rows lost likelihood: the gate is on
    for where in ("old_logp", "logp", "both"):
        o, lp = old.clone(), logp_fin.clone()
        if where in ("old_logp", "both"):
            o[0, 2:] = -math.inf
        if where in ("logp", "both"):
            lp[1, 3] = -math.inf
        lp.requires_grad_()
        loss, m = llds_loss(lp, o, adv, mask, gate=gate)
        assert_close(loss, want, rtol=1e-6, atol=1e-7)
        assert_close(_grad(loss, lp), grad_want, rtol=1e-6, atol=1e-7)
        assert m == pytest.approx(m_want, rel=1e-6, abs=1e-7), where


def test_no_response_tokens_and_wrong_shapes():
    """T = 0 (no response token) gives 0 with every gate; a wrongly sized adv or weight is a ValueError naming it."""
    for gate in ("action", "response", "token"):
        logp = torch.zeros(3, 0, requires_grad=True)
        loss, m = llds_loss(logp, torch.zeros(3, 0), torch.tensor([1.0, 0.0, -1.0]), torch.zeros(3, 0), gate=gate)
        assert abs(loss.item()) <= 1e-12 and m["llds/gate_rate"] == pytest.approx(0.0, abs=1e-12)
    logp, mask = torch.zeros(3, 4), torch.ones(3, 4)
    for adv in (torch.ones(2), torch.ones(3, 2), torch.ones(4, 4), torch.ones(3, 4, 1)):
        with pytest.raises(ValueError, match=r"adv \(.*\) must be \[B\] = \(3,\) or \[B, T\] = \(3, 4\)"):
            llds_loss(logp, logp, adv, mask)
    with pytest.raises(ValueError, match=r"weight \(3, 1\) must be \[B, T\] = \(3, 4\)"):
        llds_loss(logp, logp, torch.ones(3), mask, weight=torch.ones(3, 1))
