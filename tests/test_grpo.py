"""Loss-correctness tests for grpo.py: advantages, clipped surrogate (PPO and GSPO), KL, entropy bonus, aggregation.

Three kinds of check: (1) hand-computed small tensors with the derivation in a comment, (2) reduction identities
checked with torch.autograd.grad + assert_close, (3) vectorised vs loop / split vs whole. Test names carry the pitfall
they pin (docs/pitfalls.md).
"""

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.testing import assert_close  # noqa: E402

from grpo import POLICY_LOSSES, aggregate, group_advantages, grpo_loss, kl_k1, kl_k2, kl_k3  # noqa: E402
import grpo  # noqa: E402
from machinery import calibadv  # noqa: E402

AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


# ----------------------------------------------------------------------------------------------------------------------
# Advantages


def test_p13_advantages_hand_computed_unbiased_std():
    # group "a" = [1, 0, 0]: mean 1/3, unbiased var = ((2/3)^2 + 2 (1/3)^2) / (3 - 1) = 1/3, std = sqrt(1/3) = 0.57735
    #   A = (2/3) / (0.57735 + 1e-6) = 1.15470, (-1/3) / (0.57735 + 1e-6) = -0.57735
    #   (the biased N-estimator would give std sqrt(2/9) = 0.4714 and A = 1.4142, -0.7071: a different answer)
    # group "b" = [0.5, 1.0]: mean 0.75, unbiased std = sqrt(2 * 0.25^2 / 1) = 0.353553, A = -+0.25 / (0.353553 + 1e-6)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0]), ["a", "a", "a", "b", "b"])
    sa, sb = math.sqrt(1 / 3), math.sqrt(2 * 0.25**2)
    expected = torch.tensor([(2 / 3) / (sa + 1e-6), (-1 / 3) / (sa + 1e-6), (-1 / 3) / (sa + 1e-6),
                             -0.25 / (sb + 1e-6), 0.25 / (sb + 1e-6)])
    assert_close(adv, expected, rtol=1e-6, atol=1e-6)
    # scale=False (Dr. GRPO): r - mean only
    adv_ns = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0]), ["a", "a", "a", "b", "b"], scale=False)
    assert_close(adv_ns, torch.tensor([2 / 3, -1 / 3, -1 / 3, -0.25, 0.25]))


def test_p13_group_of_one_uses_mean0_std1():
    # G = 1: torch.std of one element is NaN; veRL uses mean 0, std 1, so A = r / (1 + 1e-6) (the raw reward)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.7, 1.0, 0.0]), ["s1", "s2", "s3", "g", "g"])
    assert torch.isfinite(adv).all()
    assert_close(adv[:3], torch.tensor([1.0, 0.0, 0.7]) / (1.0 + 1e-6), rtol=0, atol=1e-7)
    # the G = 2 group [1, 0]: mean 0.5, unbiased std sqrt(2 * 0.5^2 / 1) = 0.70711 -> A = +-0.5 / (0.70711 + 1e-6)
    assert_close(adv[3:], torch.tensor([0.5, -0.5]) / (math.sqrt(0.5) + 1e-6), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "rewards", [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.1, 0.1, 0.1], [0.3, 0.3], [0.9, 0.9, 0.9], [0.1] * 7]
)
def test_p13_all_equal_group_is_exactly_zero(rewards):
    # non-binary equal rewards: the float32 mean need not equal the value. mean([0.9] * 3) - 0.9 = 5.96e-8 and the
    # unbiased std is 7.3e-8, so (r - mean) / (std + 1e-6) = 0.0555 without the guard (measured, torch 2.13 CPU);
    # [0.1] * 7 gives -0.0074. The advantage must be *exactly* 0 (P13 in docs/pitfalls.md).
    adv = group_advantages(torch.tensor(rewards + [1.0, 0.0]), ["q"] * len(rewards) + ["o", "o"])
    assert (adv[: len(rewards)] == 0).all(), adv


def test_p2_p3_groups_keyed_by_id_not_position():
    # interleaved layout [p0, p1, p0, p1, p0, p1] (prompts repeated as [p0, p1] * 3): ids name the prompt, not a window
    ids = ["p0", "p1", "p0", "p1", "p0", "p1"]
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])  # p0 gets [1, 0, 1], p1 gets [0, 0, 1]
    adv = group_advantages(r, ids)
    # same rewards laid out contiguously [p0, p0, p0, p1, p1, p1] must give the same per-trajectory advantages
    perm = [0, 2, 4, 1, 3, 5]
    adv_contig = group_advantages(r[perm], [ids[i] for i in perm])
    assert_close(adv[perm], adv_contig)
    # P3: advantages sum to 0 within every group, and each group has G = 3 members (P2: not size-1 groups)
    for g in ("p0", "p1"):
        idx = [i for i, x in enumerate(ids) if x == g]
        assert len(idx) == 3
        assert abs(adv[idx].sum().item()) < 1e-6
        assert adv[idx].abs().max().item() > 0.5  # mixed group: real signal, not a degenerate 0
    # hand value: p0 rewards [1, 0, 1]: mean 2/3, unbiased std sqrt((2 (1/3)^2 + (2/3)^2) / 2) = sqrt(1/3)
    #   -> [0.57735, -1.1547, 0.57735]; p1 rewards [0, 0, 1] -> [-0.57735, -0.57735, 1.1547]
    s = math.sqrt(1 / 3) + 1e-6
    assert_close(adv[[0, 2, 4]], torch.tensor([1 / 3, -2 / 3, 1 / 3]) / s)
    assert_close(adv[[1, 3, 5]], torch.tensor([-1 / 3, -1 / 3, 2 / 3]) / s)
    # contiguous windows of 3 over the interleaved layout (prime-rl's bug) mix prompts: windows [1, 0, 0] and [0, 1, 1]
    # give other numbers
    adv_window = group_advantages(r, ["w0", "w0", "w0", "w1", "w1", "w1"])
    assert not torch.allclose(adv_window, adv, atol=1e-3)


def test_p4_searchr1_dataset_index_key_pools_two_prompts():
    # NQ row 0 and HotpotQA row 0 both have extra_info.index == 0. G = 2 each. Ours keys by prompt and keeps them
    # apart; Search-R1's uid = extra_info.index (searchr1_uid below) pools them into one group of 4.
    # nq#0 rewards [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.70711 = +-0.7071
    # hotpotqa#0 rewards [1, 1] -> exactly 0
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    prompt_ids = [0, 0, 1, 1]  # ours: rollout.py group_id = the prompt's position in this batch
    rows = [{"data_source": "nq", "index": 0}] * 2 + [{"data_source": "hotpotqa", "index": 0}] * 2

    def searchr1_uid(row):  # Search-R1 ray_trainer.py: uid = extra_info.index
        return row["index"]

    dataset_index = [searchr1_uid(row) for row in rows]
    adv = group_advantages(r, prompt_ids)
    s = math.sqrt(0.5) + 1e-6
    assert_close(adv, torch.tensor([0.5 / s, -0.5 / s, 0.0, 0.0]))
    assert (adv[2:] == 0).all()
    # keyed by dataset index (Search-R1's uid): one pooled group [1, 0, 1, 1], mean 0.75, unbiased std
    # sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5 -> [0.5, -1.5, 0.5, 0.5]: the all-correct HotpotQA group gets a fake +0.5
    pooled = group_advantages(r, dataset_index)
    assert_close(pooled, torch.tensor([0.5, -1.5, 0.5, 0.5]) * 0.5 / (0.5 + 1e-6))
    assert not torch.allclose(pooled, adv, atol=1e-3)


def test_advantages_length_mismatch_raises():
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 0.0, 1.0]), ["a", "a"])
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([[1.0, 0.0]]), ["a", "a"])


# ----------------------------------------------------------------------------------------------------------------------
# Clipped surrogate


def test_clipped_surrogate_hand_computed_2x4():
    # eps = 0.2, old_logp = log 0.5, logp = old + log(ratio). N = 7 unmasked tokens (row 1 token 3 is masked).
    # row 0, A = +1: ratio 1.5 -> max(-1.5, -1.2) = -1.2 clipped (grad 0)
    #                ratio 1.1 -> -1.1 inside (grad d(-A r)/dlogp = -1.1)
    #                ratio 0.5 -> max(-0.5, -0.8) = -0.5 unclipped, below 1-eps but pessimistic keeps it (grad -0.5)
    #                ratio 1.0 -> -1.0 (grad -1.0)
    # row 1, A = -1: ratio 1.5 -> max(1.5, 1.2) = 1.5 unclipped, above 1+eps (grad +1.5)
    #                ratio 0.9 -> 0.9 inside (grad +0.9)
    #                ratio 0.5 -> max(0.5, 0.8) = 0.8 clipped (grad 0)
    #                ratio 2.0 -> masked (loss and grad 0)
    # sum = -1.2 - 1.1 - 0.5 - 1.0 + 1.5 + 0.9 + 0.8 = -0.6 ; token-mean = -0.6 / 7
    # clip_frac = tokens where the clipped branch is strictly larger = (r0,t0) and (r1,t2) = 2 / 7
    ratio = torch.tensor([[1.5, 1.1, 0.5, 1.0], [1.5, 0.9, 0.5, 2.0]])
    old = torch.full((2, 4), math.log(0.5))
    logp = (old + ratio.log()).requires_grad_()
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    loss, m = grpo_loss(logp, old, None, torch.tensor([1.0, -1.0]), mask, kl_coef=0.0)
    assert_close(loss, torch.tensor(-0.6 / 7))
    assert_close(m["grpo/pg_loss"], -0.6 / 7)
    assert_close(m["grpo/clip_frac"], 2 / 7)
    expected_grad = torch.tensor([[0.0, -1.1, -0.5, -1.0], [1.5, 0.9, 0.0, 0.0]]) / 7
    g = _grad(loss, logp)
    assert_close(g, expected_grad)
    assert g[0, 0] == 0 and g[1, 2] == 0 and g[1, 3] == 0  # clipped / masked tokens: exactly zero gradient


def test_clip_fraction_counts_only_active_clips():
    # clip_frac = share of unmasked tokens where the clipped branch wins (the gradient is cut there), eps = 0.2.
    # A = +1 row: ratios [1.3, 0.7, 1.1, 1.3 (masked)] -> clipped branch wins only at 1.3 (-1.2 > -1.3); at 0.7 the
    #   pessimistic min keeps the unclipped -0.7 (outside the range, but not clipped); 1.1 is inside.
    # A = -1 row: ratios [1.3, 0.7, 1.0, 0.5] -> clipped wins only at 0.7 (0.8 > 0.7) and 0.5 (0.8 > 0.5); at 1.3 the
    #   unclipped 1.3 > 1.2 wins. A = 0 row: nothing is ever clipped (both branches are 0).
    # -> (1 + 2 + 0) / (3 + 4 + 4) = 3 / 11
    ratio = torch.tensor([[1.3, 0.7, 1.1, 1.3], [1.3, 0.7, 1.0, 0.5], [1.5, 0.1, 3.0, 1.0]])
    logp = ratio.log().requires_grad_()
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    _, m = grpo_loss(logp, torch.zeros(3, 4), None, torch.tensor([1.0, -1.0, 0.0]), mask, kl_coef=0.0)
    assert_close(m["grpo/clip_frac"], 3 / 11)
    _, m1 = grpo_loss(logp, logp.detach(), None, torch.tensor([1.0, -1.0, 0.0]), mask, kl_coef=0.0)
    assert m1["grpo/clip_frac"] == pytest.approx(0.0, abs=1e-12)  # on-policy: ratio 1, never clipped


def test_ppo_ratio_capped_at_100_as_the_code():
    # core_algos.py compute_policy_loss line 189 (authors' LLDS repository, commit ab05c96) clamps the ratio to
    # [-100, 100] before both branches. One token, A = -1, logp = -4, old_logp = -10: ratio e^6 = 403.43.
    #   uncapped: loss = max(-A r, -A clip(r)) = max(403.43, 1.2) = 403.43, d loss / d logp = -A r = 403.43
    #   the code: r -> 100, loss = max(100, 1.2) = 100, and the cap is flat there: d loss / d logp = 0
    logp = torch.tensor([[-4.0]], requires_grad=True)
    loss, m = grpo_loss(logp, torch.tensor([[-10.0]]), None, torch.tensor([-1.0]), torch.ones(1, 1), kl_coef=0.0)
    assert_close(loss, torch.tensor(100.0))
    assert _grad(loss, logp).item() == pytest.approx(0.0, abs=1e-12)
    assert m["grpo/ratio_max"] == pytest.approx(100.0, rel=1e-5)  # max(100, 1.2): the unclipped branch wins
    assert m["grpo/clip_frac"] == pytest.approx(0.0, abs=1e-12)
    # below the cap nothing changes: log-ratio 4 -> r = e^4 = 54.598, loss and gradient -A r = 54.598
    logp = torch.tensor([[-6.0]], requires_grad=True)
    loss, _ = grpo_loss(logp, torch.tensor([[-10.0]]), None, torch.tensor([-1.0]), torch.ones(1, 1), kl_coef=0.0)
    assert_close(loss, torch.tensor(math.exp(4.0)))
    assert_close(_grad(loss, logp), torch.tensor([[math.exp(4.0)]]))
    # log-ratio 200: the code's exp overflows to inf and its backward gives 0 * inf = NaN; ours is 100 and 0 (finite)
    logp = torch.tensor([[0.0]], requires_grad=True)
    loss, _ = grpo_loss(logp, torch.tensor([[-200.0]]), None, torch.tensor([-1.0]), torch.ones(1, 1), kl_coef=0.0)
    assert loss.item() == pytest.approx(100.0, rel=1e-5) and _grad(loss, logp).item() == pytest.approx(0.0, abs=1e-12)


def _code_ppo_loss(old, logp, adv, mask, eps):
    """compute_policy_loss as core_algos.py lines 164-197 (commit ab05c96) computes it, restated: token ratio clamped to
    [-100, 100], pessimistic max of the two branches, masked token-mean; pg_clipfrac and ppo_kl over the same tokens."""
    def mean(x):  # verl_F.masked_mean
        return (x * mask).sum() / mask.sum()
    ratio = torch.clamp(torch.exp(logp - old), -100, 100)
    a, b = -adv * ratio, -adv * torch.clamp(ratio, 1 - eps, 1 + eps)
    return mean(torch.max(a, b)), mean((b > a).float()), mean(old - logp)


def test_ppo_matches_the_code_on_random_inputs_with_large_ratios():
    # log-ratios up to +-6 (ratios 0.0025 .. 403): every branch of the clip and the cap at 100 occurs
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 5, generator=g) * 8
    logp = (old + torch.empty(6, 5).uniform_(-6, 6, generator=g)).requires_grad_()
    adv = torch.randn(6, 5, generator=g)  # per-token advantages: both signs meet both sides of the clip
    mask = (torch.rand(6, 5, generator=g) > 0.2).float()
    assert ((logp - old).detach().exp() * mask * (adv < 0)).max() > 100  # the cap is exercised
    loss, m = grpo_loss(logp, old, None, adv, mask, kl_coef=0.0)
    want, clipfrac, ppo_kl = _code_ppo_loss(old, logp, adv, mask, 0.2)
    assert_close(loss, want)
    assert_close(_grad(loss, logp), _grad(want, logp))
    assert_close(m["grpo/clip_frac"], clipfrac.item())  # ours -> actor/pg_clipfrac
    assert_close(m["grpo/ppo_kl"], ppo_kl.item())  # ours -> actor/ppo_kl


def test_clip_eps_high_keeps_the_gradient_between_the_two_bounds():
    # DAPO clip-higher: bounds [1 - 0.2, 1 + 0.28]. One token each, N = 1, loss = max(-A r, -A clip(r)).
    # A = +1, r = 1.25: symmetric clip (1.2) -> loss -1.2, grad 0; clip-higher (1.28) -> loss -1.25, grad -A r = -1.25
    # A = +1, r = 1.30: above both -> -1.2 resp. -1.28, grad 0
    # A = -1, r = 0.75: the lower bound is still 1 - clip_eps = 0.8 -> max(0.75, 0.8) = 0.8, grad 0 in both
    cases = [(1.0, 1.25, (-1.2, 0.0), (-1.25, -1.25)), (1.0, 1.30, (-1.2, 0.0), (-1.28, 0.0)),
             (-1.0, 0.75, (0.8, 0.0), (0.8, 0.0))]
    for a, r, symmetric, higher in cases:
        for kw, (want_loss, want_grad) in (({}, symmetric), ({"clip_eps_high": 0.28}, higher)):
            logp = torch.tensor([[math.log(r)]], requires_grad=True)
            loss, _ = grpo_loss(logp, torch.zeros(1, 1), None, torch.tensor([a]), torch.ones(1, 1), kl_coef=0.0, **kw)
            assert_close(loss, torch.tensor(want_loss))
            assert_close(_grad(loss, logp), torch.tensor([[want_grad]]))


# ----------------------------------------------------------------------------------------------------------------------
# GSPO (the code's USE_GSPO=true branch: core_algos.py compute_policy_loss_gspo, lines 257-318 at commit ab05c96)


def _gspo_case():
    # row 0: A = +1, tokens 0-1 in the mask with log-ratios [0.3, -0.1]; tokens 2-3 masked (log-ratio 2 must not count)
    # row 1: A = -1, tokens 0-2 in the mask with log-ratios [0.6, 0.3, 0.0]; token 3 masked (log-ratio 5)
    old = torch.full((2, 4), -2.0)
    log_ratio = torch.tensor([[0.3, -0.1, 2.0, 2.0], [0.6, 0.3, 0.0, 5.0]])
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 0]])
    return (old + log_ratio).requires_grad_(), old, mask


def test_gspo_two_responses_hand_computed():
    # s_0 = exp((0.3 - 0.1) / 2) = e^0.1 = 1.105171 (inside [0.8, 1.2])
    # s_1 = exp((0.6 + 0.3 + 0) / 3) = e^0.3 = 1.349859 (the masked log-ratios 2 and 5 are left out)
    # every token of row i carries s_i; per token: row 0 max(-s_0, -clip(s_0)) = -1.105171;
    #   row 1 (A = -1) max(s_1, 1.2) = 1.349859 (above 1 + eps, but for A < 0 the pessimistic max keeps it)
    # seq-mean-token-mean: (-1.105171 + 1.349859) / 2 = 0.122344
    # gradient: d s_i,t / d logp_t = s_i, and token t of row i weighs 1 / (B |y_i|):
    #   row 0: -A s_0 / (2 * 2) = -0.276293 ; row 1: -A s_1 / (2 * 3) = +0.224977 ; masked tokens 0
    # clip_frac 0 / 5; ppo_kl = mean(old - logp) over the 5 tokens = -(0.3 - 0.1 + 0.6 + 0.3 + 0) / 5 = -0.22
    logp, old, mask = _gspo_case()
    s0, s1 = math.exp(0.1), math.exp(0.3)
    loss, m = grpo_loss(logp, old, None, torch.tensor([1.0, -1.0]), mask, kl_coef=0.0, policy_loss="gspo")
    assert_close(loss, torch.tensor((-s0 + s1) / 2))
    assert_close(_grad(loss, logp), torch.tensor([[-s0 / 4, -s0 / 4, 0, 0], [s1 / 6, s1 / 6, s1 / 6, 0]]))
    assert m["grpo/clip_frac"] == pytest.approx(0.0, abs=1e-12)
    assert_close(m["grpo/ppo_kl"], -0.22)
    assert_close(m["grpo/ratio_max"], s1)
    # token-level PPO on the same tensors differs: row 0 token 0 has r = e^0.3 = 1.35 > 1.2 with A > 0, so it is
    # clipped there (gradient 0), while GSPO, whose sequence ratio 1.105 is inside the range, keeps its gradient
    ppo, _ = grpo_loss(logp, old, None, torch.tensor([1.0, -1.0]), mask, kl_coef=0.0, policy_loss="ppo-clip")
    assert _grad(ppo, logp)[0, 0].item() == pytest.approx(0.0, abs=1e-12)
    # A = [+1, +1]: row 1 now has s_1 = 1.35 > 1.2 with A > 0: clipped, per token -1.2 and no gradient
    #   loss = (-1.105171 - 1.2) / 2 = -1.152585; clip_frac = 3 / 5 (the code counts tokens, line 314)
    loss, m = grpo_loss(logp, old, None, torch.tensor([1.0, 1.0]), mask, kl_coef=0.0, policy_loss="gspo")
    assert_close(loss, torch.tensor((-s0 - 1.2) / 2))
    assert_close(_grad(loss, logp), torch.tensor([[-s0 / 4, -s0 / 4, 0, 0], [0.0, 0, 0, 0]]))
    assert_close(m["grpo/clip_frac"], 3 / 5)
    # clip-higher applies to GSPO too: eps_high 0.4 puts 1.35 inside [0.8, 1.4], so row 1 gets -s_1 / 6 per token
    loss, _ = grpo_loss(logp, old, None, torch.tensor([1.0, 1.0]), mask, kl_coef=0.0, policy_loss="gspo",
                        clip_eps_high=0.4)
    assert_close(loss, torch.tensor((-s0 - s1) / 2))
    assert_close(_grad(loss, logp), torch.tensor([[-s0 / 4, -s0 / 4, 0, 0], [-s1 / 6, -s1 / 6, -s1 / 6, 0]]))


def test_gspo_gradient_is_the_sequence_level_objectives():
    # GSPO's objective is per response: (1/B) sum_i max(-A_i s_i, -A_i clip(s_i)), s_i = exp(mean_t (logp - old)).
    # The token-level straight-through form, aggregated seq-mean-token-mean, must give the same value and gradient.
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(6, 7, generator=g) * 3
    logp = (old + 0.6 * torch.randn(6, 7, generator=g)).requires_grad_()
    mask = (torch.arange(7)[None] < torch.tensor([7, 2, 5, 1, 6, 4])[:, None]).float()
    mask[0, 3] = 0.0  # a retrieved passage inside row 0
    # s = [1.35, 1.27, 0.83, 0.34, 0.77, 1.14]: clipped (A > 0, s > 1.2), kept (A < 0), inside, kept (A > 0, s < 0.8),
    # clipped (A < 0, s < 0.8), inside
    adv = torch.tensor([1.0, -0.7, 0.5, 1.2, -1.5, -0.3])
    loss, _ = grpo_loss(logp, old, None, adv, mask, kl_coef=0.0, policy_loss="gspo")
    s = (((logp - old) * mask).sum(-1) / mask.sum(-1)).exp()  # [B] with its true gradient
    want = torch.maximum(-adv * s, -adv * s.clamp(0.8, 1.2)).mean()
    assert_close(loss, want)
    grad = _grad(loss, logp)
    assert_close(grad, _grad(want, logp))
    assert (grad[[0, 4]] == 0).all() and (grad[[1, 2, 3, 5]].abs().sum(-1) > 0).all()  # the clip zeroes rows 0 and 4


def _code_gspo_loss(old, logp, adv, mask, eps):
    """compute_policy_loss_gspo as core_algos.py lines 283-318 (commit ab05c96) computes it, restated: mean log-ratio
    over each row's mask, straight-through token form clamped at <= 10, clip, agg_loss "seq-mean-token-mean" (lines
    240-246: rows without a loss token are left out of the row count); pg_clipfrac and ppo_kl per token."""
    neg_kl = logp - old
    seq = (neg_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    ratio = torch.exp(torch.clamp(logp - logp.detach() + seq.detach().unsqueeze(-1), max=10.0))
    a, b = -adv * ratio, -adv * torch.clamp(ratio, 1 - eps, 1 + eps)
    per_row = (torch.maximum(a, b) * mask).sum(-1) / (mask.sum(-1) + 1e-8)
    rows = (mask.sum(-1) > 0).float()
    def mean(x):  # verl_F.masked_mean
        return (x * mask).sum() / mask.sum()
    return (per_row * rows).sum() / rows.sum(), mean((b > a).float()), mean(-neg_kl)


def test_gspo_matches_the_code_including_its_clamp_at_10():
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(5, 6, generator=g) * 4
    log_ratio = torch.randn(5, 6, generator=g) * 0.4
    log_ratio[3] = 12.0  # row 3: mean log-ratio 12 > 10 -> s = e^10 and no gradient for the whole row
    logp = (old + log_ratio).requires_grad_()
    mask = (torch.rand(5, 6, generator=g) > 0.25).float()
    mask[:, 0] = 1.0  # every row has a loss token (the code leaves empty rows out of the count; see P14)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0, 0.7])[:, None].expand(5, 6)
    loss, m = grpo_loss(logp, old, None, adv, mask, kl_coef=0.0, policy_loss="gspo")
    want, clipfrac, ppo_kl = _code_gspo_loss(old, logp, adv, mask, 0.2)
    assert_close(loss, want)
    grad = _grad(loss, logp)
    assert_close(grad, _grad(want, logp))
    assert (grad[3] == 0).all() and (grad[[0, 1, 2, 4]] * mask[[0, 1, 2, 4]] != 0).any()
    assert_close(m["grpo/clip_frac"], clipfrac.item())
    assert_close(m["grpo/ppo_kl"], ppo_kl.item())


def test_unknown_policy_loss_raises():
    lp = torch.zeros(2, 4, requires_grad=True)
    with pytest.raises(ValueError, match="policy_loss"):
        grpo_loss(lp, lp.detach(), None, torch.zeros(2), torch.ones(2, 4), policy_loss="gspo-seq")


# ----------------------------------------------------------------------------------------------------------------------
# KL estimators


def test_kl_estimators_hand_values():
    # d = ref - logp = [1, -1, 0, 2]
    # k1 = logp - ref = -d = [-1, 1, 0, -2]
    # k2 = 0.5 (logp - ref)^2 = [0.5, 0.5, 0, 2]
    # k3 = e^d - d - 1 = [e - 2, e^-1, 0, e^2 - 3] = [0.718282, 0.367879, 0, 4.389056]
    logp = torch.tensor([0.0, 0.0, -0.3, -2.5])
    ref = logp + torch.tensor([1.0, -1.0, 0.0, 2.0])
    assert_close(kl_k1(logp, ref), torch.tensor([-1.0, 1.0, 0.0, -2.0]))
    assert_close(kl_k2(logp, ref), torch.tensor([0.5, 0.5, 0.0, 2.0]))
    assert_close(kl_k3(logp, ref), torch.tensor([math.e - 2, math.exp(-1), 0.0, math.exp(2) - 3]))


def test_p15_k3_finite_under_large_log_ratio():
    # ref - logp = +50: exp(50) = 5e21 would be fine in fp32 but exp(100) overflows; clamp to 20 first, then k3 is
    # clamped to 10 (code). ref - logp = -50: e^-50 + 50 - 1 = 49 -> 10. Gradients must be finite (0 under the clamps).
    logp = torch.tensor([0.0, 0.0, -100.0, 0.0], requires_grad=True)
    ref = torch.tensor([50.0, -50.0, 0.0, 0.0])  # log-ratios +50, -50, +100, 0
    k = kl_k3(logp, ref)
    assert torch.isfinite(k).all()
    assert_close(k, torch.tensor([10.0, 10.0, 10.0, 0.0]))
    g = _grad(k.sum(), logp)
    assert torch.isfinite(g).all()
    # and through grpo_loss, with the policy ratio also at +-50 (ratio clamp at +-20 keeps exp finite)
    old = torch.tensor([[50.0, -50.0, 0.0, 0.0]])
    lp = torch.zeros(1, 4, requires_grad=True)
    loss, _ = grpo_loss(lp, old, ref[None], torch.tensor([1.0]), torch.ones(1, 4), kl_coef=0.001, kl_type="k3",
                        entropy=None)
    assert torch.isfinite(loss)
    assert torch.isfinite(_grad(loss, lp)).all()


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_p8_kl_gradient_pulls_logp_toward_ref(kl_type):
    # adv = 0 -> the PG term is 0, entropy off: the loss is kl_coef * token-mean(KL). One gradient-descent step must
    # reduce |logp - ref_logp| on every token (Search-R1 once *subtracted* the KL, which pushes away).
    # k1 = logp - ref has the constant per-token gradient +1: descent always lowers logp, which approaches ref only
    # where logp > ref (k1 is unbiased for the KL value, not a per-token pull), so for k1 only that side is tested.
    ref = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.5, -0.2, -2.5, -1.0]])
    if kl_type == "k1":
        gap = torch.tensor([[0.5, 1.0, 0.3, 2.0], [0.2, 0.1, 0.7, 0.4]])
    else:
        gap = torch.tensor([[0.5, -1.0, 0.3, -2.0], [-0.2, 0.1, -0.7, 0.4]])
    logp = (ref + gap).requires_grad_()
    mask = torch.ones(2, 4)
    loss, m = grpo_loss(logp, logp.detach(), ref, torch.zeros(2), mask, kl_coef=0.1, kl_type=kl_type)
    assert "grpo/kl" in m
    g = _grad(loss, logp)
    assert (g * gap > 0).all()  # the gradient has the sign of (logp - ref): descent moves logp toward ref
    stepped = logp.detach() - 0.5 * g  # small step: 0.5 * 0.1 / 8 * |dKL| < |gap| on every token
    assert ((stepped - ref).abs() < gap.abs()).all()


def test_kl_off_when_coef_zero_or_ref_none():
    logp = torch.randn(2, 4, requires_grad=True)
    ref = torch.randn(2, 4)
    l0, m0 = grpo_loss(logp, logp.detach(), ref, torch.zeros(2), torch.ones(2, 4), kl_coef=0.0)
    l1, m1 = grpo_loss(logp, logp.detach(), None, torch.zeros(2), torch.ones(2, 4), kl_coef=0.5)
    assert "grpo/kl" not in m0 and "grpo/kl" not in m1
    assert l0.item() == pytest.approx(0.0, abs=1e-12) and l1.item() == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        grpo_loss(logp, logp.detach(), ref, torch.zeros(2), torch.ones(2, 4), kl_type="k4")


# ----------------------------------------------------------------------------------------------------------------------
# Entropy bonus


def test_entropy_bonus_sign():
    # adv = 0, KL off: loss = -entropy_coef * token-mean(H). Mask has 6 tokens.
    # H_lo token-mean = (0.5 + 1 + 1.5 + 2 + 1 + 1) / 6 = 7 / 6 -> loss = -0.01 * 7/6
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    h_lo = torch.tensor([[0.5, 1.0, 1.5, 2.0], [1.0, 1.0, 9.0, 9.0]], requires_grad=True)
    lp = torch.zeros(2, 4, requires_grad=True)
    loss_lo, m = grpo_loss(lp, lp.detach(), None, torch.zeros(2), mask, entropy=h_lo, entropy_coef=0.01, kl_coef=0.0)
    assert_close(loss_lo, torch.tensor(-0.01 * 7 / 6))
    assert_close(m["grpo/entropy"], 7 / 6)
    # d loss / dH = -0.01 / 6 on unmasked tokens: increasing entropy lowers the loss (a bonus, not a penalty)
    assert_close(_grad(loss_lo, h_lo), -0.01 / 6 * mask)
    h_hi = (h_lo.detach() + 0.5).requires_grad_()
    loss_hi, _ = grpo_loss(lp, lp.detach(), None, torch.zeros(2), mask, entropy=h_hi, entropy_coef=0.01, kl_coef=0.0)
    assert loss_hi.item() < loss_lo.item()
    assert_close(loss_hi, torch.tensor(-0.01 * 10 / 6))


# ----------------------------------------------------------------------------------------------------------------------
# Aggregation


def test_p11_aggregation_modes_hand_computed():
    # ragged mask: row 0 has 3 tokens, row 1 has 1; masked entries hold 100 and must not leak in
    # token-mean              = (1 + 2 + 3 + 4) / 4                 = 2.5
    # seq-mean-token-mean     = mean(6/3, 4/1) = (2 + 4) / 2        = 3.0   (short row 1 weighs as much as row 0)
    # seq-mean-token-sum-norm = mean(6/4, 4/4) (norm_len = T = 4)   = 1.25 ; with norm_len = 2: mean(3, 2) = 2.5
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])
    assert_close(aggregate(x, mask, "token-mean"), torch.tensor(2.5))
    assert_close(aggregate(x, mask, "seq-mean-token-mean"), torch.tensor(3.0))
    assert_close(aggregate(x, mask, "seq-mean-token-sum-norm"), torch.tensor(1.25))
    assert_close(aggregate(x, mask, "seq-mean-token-sum-norm", norm_len=2), torch.tensor(2.5))
    # and through grpo_loss: on-policy, A = [-1, -2] -> per-token pg = -A * 1 = [1, 1, 1 | 2]
    # token-mean = 5/4 ; seq-mean-token-mean = (1 + 2)/2 = 1.5 ; sum-norm = (3/4 + 2/4)/2 = 0.625
    lp = torch.zeros(2, 4, requires_grad=True)
    for agg, want in [("token-mean", 1.25), ("seq-mean-token-mean", 1.5), ("seq-mean-token-sum-norm", 0.625)]:
        loss, _ = grpo_loss(lp, lp.detach(), None, torch.tensor([-1.0, -2.0]), mask, kl_coef=0.0, agg=agg)
        assert_close(loss, torch.tensor(want))


def test_unknown_aggregation_raises():
    with pytest.raises(ValueError):
        aggregate(torch.zeros(2, 4), torch.ones(2, 4), "seq-sum")
    lp = torch.zeros(2, 4, requires_grad=True)
    with pytest.raises(ValueError):
        grpo_loss(lp, lp.detach(), None, torch.zeros(2), torch.ones(2, 4), agg="mean")


def _minibatch(seed=0, B=8, T=6):
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 1, 3, 5, 2, 6, 4, 1]  # ragged: micro-batches of 2 rows hold 7, 8, 8, 5 tokens
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    mask[0, 2] = 0.0  # an observation token in the middle of row 0
    old = -torch.rand(B, T, generator=g) * 3
    theta = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_()
    ref = old + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    return theta, old, ref, adv, mask


def _loss_of(theta, old, ref, adv, mask, rows, agg, **kw):
    logp = theta[rows] * 1.0
    entropy = theta[rows].sin() + 1.0  # any differentiable function of the parameters
    loss, _ = grpo_loss(logp, old[rows], ref[rows], adv[rows], mask[rows], entropy=entropy, kl_coef=0.05,
                        entropy_coef=0.01, agg=agg, **kw)
    return loss


@pytest.mark.parametrize("policy_loss", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("n_micro", [1, 2, 4])
def test_p14_microbatch_split_gives_full_minibatch_gradient(agg, n_micro, policy_loss):
    # GSPO's surrogate is always seq-mean-token-mean (divided by num_seqs = 8); its entropy and KL follow `agg`
    theta, old, ref, adv, mask = _minibatch()
    full = _grad(_loss_of(theta, old, ref, adv, mask, slice(0, 8), agg, policy_loss=policy_loss), theta)
    num_tokens = mask.sum()  # computed on the mini-batch, before splitting
    total = torch.zeros_like(theta)
    k = 8 // n_micro
    for s in range(0, 8, k):
        total += _grad(_loss_of(theta, old, ref, adv, mask, slice(s, s + k), agg, num_tokens=num_tokens, num_seqs=8,
                                policy_loss=policy_loss), theta)
    assert_close(total, full, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n_micro", [2, 4])
def test_p14_searchr1_per_microbatch_token_mean_does_not_match(n_micro):
    # Search-R1 / legacy veRL (dp_actor.py): each micro-batch divides by its *own* token count, then by grad_accum.
    # With ragged lengths that is not the mini-batch token-mean: short micro-batches are up-weighted. Ours (the mini-
    # batch count passed as num_tokens) matches the full mini-batch exactly; Search-R1's does not.
    theta, old, ref, adv, mask = _minibatch()
    full = _grad(_loss_of(theta, old, ref, adv, mask, slice(0, 8), "token-mean"), theta)
    k = 8 // n_micro

    def searchr1_microbatch_loss(rows):  # token-mean over this micro-batch's tokens, / grad_accum
        return _loss_of(theta, old, ref, adv, mask, rows, "token-mean") / n_micro

    searchr1 = sum(_grad(searchr1_microbatch_loss(slice(s, s + k)), theta) for s in range(0, 8, k))
    ours = sum(_grad(_loss_of(theta, old, ref, adv, mask, slice(s, s + k), "token-mean", num_tokens=mask.sum()), theta)
               for s in range(0, 8, k))
    assert_close(ours, full, rtol=0, atol=1e-6)
    assert (searchr1 - full).abs().max().item() > 1e-3


def test_p22_on_policy_loss_zero_but_reinforce_gradient():
    # 2 prompts x G = 3, equal lengths (3 model tokens + 1 masked position at the same place in every row), ratio == 1,
    # KL and entropy off. Advantages sum to 0 per group, so loss = -sum_i A_i * 3 / 18 = 0 (up to float), yet
    # d loss / d logp_{i,t} = -A_i * ratio / N = -A_i / 18 on every unmasked token (REINFORCE), 0 on the masked one.
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0]), ["a", "a", "a", "b", "b", "b"])
    mask = torch.tensor([[1.0, 1, 0, 1]] * 6)
    logp = (-torch.rand(6, 4)).requires_grad_()
    for agg in AGGS:
        loss, m = grpo_loss(logp, logp.detach(), None, adv, mask, kl_coef=0.0, agg=agg)
        assert abs(loss.item()) < 1e-6
        assert m["grpo/clip_frac"] == pytest.approx(0.0, abs=1e-12)
        g = _grad(loss, logp)
        assert g.abs().max().item() > 0.01  # "loss = 0" is not "no learning signal"
        n = {"token-mean": 18.0, "seq-mean-token-mean": 3.0 * 6, "seq-mean-token-sum-norm": 4.0 * 6}[agg]
        assert_close(g, -adv[:, None] * mask / n, rtol=0, atol=1e-7)


# ----------------------------------------------------------------------------------------------------------------------
# Wiring in train.py: --policy-loss and --clip-eps-high reach grpo_loss, and LLDS works on top of GSPO


def test_train_parse_policy_loss_and_clip_eps_high(capsys):
    from train import parse_args

    a = parse_args([])
    assert a.policy_loss == "ppo-clip" and \
        a.clip_eps_high == a.clip_eps == 0.2  # exact: as parsed; unset: the code's symmetric clip
    assert parse_args(["--clip-eps", "0.1"]).clip_eps_high == 0.1  # exact: a parsed setting, no arithmetic
    a = parse_args(["--policy-loss", "gspo", "--clip-eps-high", "0.28"])
    assert a.policy_loss == "gspo" and a.clip_eps_high == 0.28 and a.clip_eps == 0.2  # exact: parsed settings
    for argv, err in ((["--policy-loss", "grpo"], "--policy-loss must be one of ('ppo-clip', 'gspo'), got 'grpo'"),
                      (["--clip-eps-high=0"], "--clip-eps-high must be > 0, got 0.0"),
                      (["--clip-eps-high=-0.1"], "--clip-eps-high must be > 0, got -0.1"),
                      (["--clip-eps-high=nan"], "--clip-eps-high must be > 0, got nan")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert capsys.readouterr().err.strip().endswith(err)


def test_train_two_steps_gspo_with_llds(tmp_path, monkeypatch):
    """--policy-loss gspo --llds 0.2: two steps of the real loop on the tiny model; grpo_loss gets the flags and LLDS,
    a separate term added in train.update, is live (a non-zero gate on the off-policy second mini-batch)."""
    import train
    from machinery.data import DEMO_CORPUS
    from tiny import save_tiny

    questions = [{"question": q, "golden_answers": [a], "data_source": "toy"}
                 for q, a in (("Where is the Eiffel Tower", "Paris"), ("What is the capital of Germany", "Berlin"))]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in DEMO_CORPUS))
    seen = []

    def spy(*a, **kw):
        seen.append((kw.get("policy_loss"), kw.get("clip_eps"), kw.get("clip_eps_high")))
        return grpo_loss(*a, **kw)

    monkeypatch.setattr(train, "grpo_loss", spy)
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # far faster for the tiny model on a busy CPU
    try:
        train.main(train.parse_args([
            "--model", save_tiny(tmp_path / "model"), "--train-data", str(tmp_path / "q.jsonl"), "--corpus",
            str(tmp_path / "corpus.jsonl"), "--out-dir", str(tmp_path / "out"), "--steps", "2", "--policy-loss", "gspo",
            "--clip-eps-high", "0.28", "--llds", "0.2", "--prompts-per-step", "2", "--group-size", "4", "--max-turns",
            "2", "--max-new-tokens", "16", "--max-obs-tokens", "48", "--mini-batch-size", "4", "--micro-batch-size",
            "2", "--lr", "1e-3", "--amp", "off"]))
    finally:
        torch.set_num_threads(n)
    metrics = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert seen and set(seen) == {("gspo", 0.2, 0.28)}  # exact: the settings passed on (2 x 2 x 2 calls)
    assert all(math.isfinite(m[k]) for m in metrics for k in ("grpo/pg_loss", "grpo/clip_frac", "grpo/ppo_kl",
                                                                 "llds/penalty", "grpo/grad_norm"))
    assert any(m["llds/gate_rate"] > 0 for m in metrics)  # LLDS on top of GSPO sees a likelihood drop


# ----------------------------------------------------------------------------------------------------------------------
# Issue 22: inputs at the edges (fp16, -inf on masked slots, tensor group ids, wrong shapes)


@pytest.mark.parametrize("policy_loss", ["ppo-clip", "gspo"])
def test_fp16_log_probs_far_from_the_rollout_policy_give_finite_gradients(policy_loss):
    """Log-ratios past ~11 nats overflow exp in fp16 (65504): the loss is formed in float32, so PPO's capped ratio and
    k3 stay finite, and equal the float32 loss of the same (fp16-representable) values."""
    old = torch.tensor([[-20.0, -1.0, -2.0], [-1.0, -19.0, -3.0]])
    logp32 = torch.tensor([[-1.0, -20.0, -2.5], [-15.0, -1.0, -2.0]])  # log-ratios of +-14 to +-19 nats
    ref = torch.tensor([[-18.0, -2.0, -2.0], [-2.0, -17.0, -3.0]])
    mask, adv = torch.ones(2, 3), torch.tensor([1.0, -1.0])
    kw = dict(kl_coef=0.1, policy_loss=policy_loss)
    lp16, lp32 = logp32.half().requires_grad_(), logp32.clone().requires_grad_()
    loss16, _ = grpo_loss(lp16, old.half(), ref.half(), adv, mask, **kw)
    loss32, _ = grpo_loss(lp32, old, ref, adv, mask, **kw)
    g16, g32 = _grad(loss16, lp16), _grad(loss32, lp32)
    assert torch.isfinite(loss16) and bool(torch.isfinite(g16).all()), (loss16, g16)
    assert_close(loss16, loss32, rtol=1e-6, atol=1e-6)  # the inputs are exact in fp16; the arithmetic is float32
    assert_close(g16.float(), g32, rtol=1e-3, atol=1e-3)  # the gradient is rounded to fp16 on its way back
    k3 = kl_k3(lp16.detach(), ref.half())
    assert bool(torch.isfinite(k3).all())


@pytest.mark.parametrize("policy_loss", ["ppo-clip", "gspo"])
def test_minus_inf_on_masked_slots_changes_nothing(policy_loss):
    """-inf log-probs on masked slots (padding) leave loss, gradient and metrics as with finite values there."""
    old = torch.tensor([[-1.0, -2.0, -1.0], [-1.5, -1.0, -2.0]])
    logp = torch.tensor([[-1.2, -1.5, -3.0], [-1.0, -1.2, -3.0]])
    ref, ent = old - 0.1, torch.full((2, 3), 0.5)
    mask, adv = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]), torch.tensor([1.0, -1.0])
    kw = dict(kl_coef=0.1, policy_loss=policy_loss)
    lp = logp.clone().requires_grad_()
    want, m_want = grpo_loss(lp, old, ref, adv, mask, entropy=ent, **kw)
    g_want = _grad(want, lp)
    o, r, e, lp = old.clone(), ref.clone(), ent.clone(), logp.clone()
    o[:, 2], r[:, 2], e[:, 2], lp[:, 2] = -math.inf, -math.inf, math.nan, -math.inf
    lp.requires_grad_()
    loss, m = grpo_loss(lp, o, r, adv, mask, entropy=e, **kw)
    assert_close(loss, want, rtol=1e-6, atol=1e-7)
    assert_close(_grad(loss, lp), g_want, rtol=1e-6, atol=1e-7)
    assert m == pytest.approx(m_want, rel=1e-6, abs=1e-7)


def test_group_ids_may_be_a_tensor_and_adv_must_be_b_or_b_t():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert_close(group_advantages(rewards, torch.tensor([0, 0, 1, 1])), group_advantages(rewards, [0, 0, 1, 1]),
                 rtol=0, atol=0)  # exact: the same code on the same numbers once the ids are plain
    logp, mask = torch.zeros(3, 4), torch.ones(3, 4)
    for adv in (torch.ones(2), torch.ones(3, 2), torch.ones(4, 4), torch.ones(3, 4, 1)):
        with pytest.raises(ValueError, match=r"adv \(.*\) must be \[B\] = \(3,\) or \[B, T\] = \(3, 4\)"):
            grpo_loss(logp, logp, None, adv, mask)
    with pytest.raises(ValueError, match=r"ref_logp \(3, 1\) must be \[B, T\] = \(3, 4\)"):
        grpo_loss(logp, logp, torch.zeros(3, 1), torch.ones(3), mask)


# ----------------------------------------------------------------------------------------------------------------------
# CalibAdv (issue 49): machinery.calibadv.turn_scores and word_edit_similarity, grpo.calibadv_advantages


def calib_mask(actions, T=10):
    """[len(actions), T] loss masks: each row's actions as (start, end) runs of 1s, observations between them 0."""
    mask = torch.zeros(len(actions), T)
    for i, runs in enumerate(actions):
        for a, b in runs:
            mask[i, a:b] = 1.0
    return mask


def test_calibadv_turn_scores_by_hand():
    # group "q": r0 and r1 well formed with F1 1.0 (the best: their passages pooled, {1..6, 11}, are the silver set);
    # r2 F1 0.8 (>= 0.7 but not the best: its passage 99 is not silver)
    docs = [[[1, 2, 3], [4, 5, 6]], [[1, 11, 3]], [[99, 1, 2]],
            [[1, 7, 8], [2, 9, 10]],  # 1 new silver passage of 3, then 1 (2: new to this response) of 3
            [[1, 2, 8], [1, 2, 9]],  # 2 of 3; then {1, 2} shared with turn 1: more than one passage -> none
            [[7, 8, 9], [3, 4, 5]],  # no silver passage: none; then its think repeats turn 1's (similar > 0.5)
            [[1, 2, 3]],  # not well formed: no score
            [[1, 2, 3]]]  # group "z": no response with F1 >= 0.7, no silver set
    thinks = [["a", "b"], ["a"], ["a"], ["find x", "find y"], ["find x", "find y"],
              ["find the capital of France", "find the capital of France now"], ["a"], ["a"]]
    f1 = [1.0, 1.0, 0.8, 0.0, 0.0, 0.0, 0.0, 0.5]
    ok = [True] * 6 + [False, True]
    ids = ["q"] * 7 + ["z"]
    got = calibadv.turn_scores(docs, thinks, f1, ok, ids)
    none = 0.0  # no score: the turn keeps its advantage
    want = [[1.0, 1.0], [1.0], [2 / 3], [1 / 3, 1 / 3], [2 / 3, none], [none, none], [], []]
    assert [len(r) for r in got] == [len(r) for r in want]
    for g, w in zip(got, want):
        assert g == pytest.approx(w)
    # word-level edit similarity: 1 - 1 insertion / 6 words
    assert calibadv.word_edit_similarity("find the capital of France", "find the capital of France now") == \
        pytest.approx(1 - 1 / 6)
    assert calibadv.word_edit_similarity("", "") == pytest.approx(0.0, abs=1e-12)


def test_calibadv_advantages_by_hand():
    # one group of 4, rewards 1, 0, 0, 0: A = 0.75 / 0.5, -0.25 / 0.5 (unbiased std 0.5); each row: search 1 on
    # tokens 0-1, a passage on 2-3 (mask 0), search 2 on 4-5, a passage on 6-7, the answer on 8-9
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), ["q"] * 4)
    mask = calib_mask([[(0, 2), (4, 6), (8, 10)]] * 4)
    scores = [[1.0, 1.0], [2 / 3, 0.0], [], [1.0, 1 / 3]]
    tok = grpo.calibadv_advantages(adv, mask, ["q"] * 4, scores, target_ratio=2.0)
    a, b = adv[0].item(), adv[1].item()
    want = torch.tensor([
        [a, a, 0, 0, a, a, 0, 0, a / 2, a / 2],  # positive: searches unchanged; answer x -N / (P * 2) = 3b' / (2a * 2)
        [b / 3, b / 3, 0, 0, b, b, 0, 0, b, b],  # s 2/3: b (1 - 2/3); the unscored turn keeps b
        [b, b, 0, 0, b, b, 0, 0, b, b],  # no scores: unchanged
        [0, 0, 0, 0, 2 * b / 3, 2 * b / 3, 0, 0, b, b]])  # s 1: no penalty at all on that search
    # the answer tokens: P = 2a, N = 6b; -N / (P * 2) = -6b / (4a) = 0.5 here (a = 1.5, b = -0.5, to float32 eps)
    want[0, 8:] = a * (-6 * b / (2 * a * 2.0))
    assert torch.allclose(tok, want, atol=1e-6)


def test_calibadv_reduces_to_grpo_and_leaves_equal_groups_at_zero():
    """No turn scored and a group whose answers balance (2 right, 2 wrong, equal answer lengths): the plain GRPO
    advantage on every model token. A group of equal rewards stays exactly 0."""
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0]), ["g"] * 4 + ["h"] * 2)
    mask = calib_mask([[(0, 3), (5, 8)]] * 6)
    tok = grpo.calibadv_advantages(adv, mask, ["g"] * 4 + ["h"] * 2, [[]] * 6, target_ratio=1.0)
    assert torch.allclose(tok, adv[:, None] * mask, atol=1e-6)
    assert torch.count_nonzero(tok[4:]) == 0
    with pytest.raises(ValueError, match="calibadv_advantages"):
        grpo.calibadv_advantages(adv, mask[:5], ["g"] * 6, [[]] * 6)


def test_calibadv_gradient_touches_what_it_should():
    """Through grpo_loss on policy = rollout policy (ratio 1): d loss / d logp = -A_t / tokens on model tokens. A
    negative response's search that found only silver passages (s = 1) gets no gradient; one with s = 1/3 two thirds
    of it; observation tokens none."""
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0]), ["q", "q"])  # +-0.7071
    mask = calib_mask([[(0, 2), (4, 6)], [(0, 2), (4, 6)]], T=6)
    tok = grpo.calibadv_advantages(adv, mask, ["q", "q"], [[], [1.0]], target_ratio=1.0)
    old = torch.full((2, 6), -1.0)
    logp = old.clone().requires_grad_()
    loss, _ = grpo.grpo_loss(logp, old, None, tok, mask, kl_coef=0.0)
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.count_nonzero(g[:, 2:4]) == 0  # observation tokens
    assert torch.count_nonzero(g[1, 0:2]) == 0  # s = 1: the good search of the wrong answer is not pushed down
    assert torch.allclose(g[1, 4:6], -tok[1, 4:6] / mask.sum(), atol=1e-7) and bool((g[1, 4:6] > 0).all())
    tok = grpo.calibadv_advantages(adv, mask, ["q", "q"], [[], [1 / 3]], target_ratio=1.0)
    assert torch.allclose(tok[1, 0:2], adv[1] * (2 / 3) * torch.ones(2), atol=1e-6)
