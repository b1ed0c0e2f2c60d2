"""The course's graded tests (docs/course.md): each tagged @pytest.mark.exercise(name), run by course/grade.py one
exercise at a time (`pytest tests/test_exercises.py --exercise kl`). On our code they all pass, so they are also
regression tests of the functions the students write.

Each test checks one thing, and its assertion message names the pitfall it catches, because the grader prints the
first failing test's message: hand-worked cases first, the snapshots of seeded random inputs (tests/snapshots/,
written by tests/make_snapshots.py) last. A test uses only the functions of its own exercise; where it needs another
exercise's function (llds_loss calls the action gate), the grader runs it with our reference for that one.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpo  # noqa: E402
import llds  # noqa: E402

SNAP = Path(__file__).resolve().parent / "snapshots"


def ex(name):
    return pytest.mark.exercise(name)


def snapshot(name):
    if not (SNAP / f"{name}.json").is_file():  # a student copy: the snapshots are our outputs, the grader's alone
        pytest.skip("the snapshots stay with the instructor: course/grade.py runs this test")
    return json.loads((SNAP / f"{name}.json").read_text())


def fresh(name, part):
    """This grading's fresh cases of `part` (tests/make_snapshots.py FRESH): inputs drawn from course/grade.py's
    secret seed, answers from our functions (the grader's plugin puts them back in place while they are drawn). The
    runner sees only the inputs; a table of public answers cannot pass them. Skipped outside a grading."""
    grading = sys.modules.get("_grading")
    seed = getattr(grading, "CONFIG", {}).get("seed")
    if seed is None:
        pytest.skip("fresh cases are drawn by course/grade.py at each grading, from a seed of its own")
    import make_snapshots

    make, parts = make_snapshots.FRESH[name]
    with grading.ours():
        return make(seed + parts.index(part), part)


def close(a, b, atol=1e-6, rtol=1e-5) -> bool:
    """a equals b to the tolerances, element by element, with the same shape and, for two float tensors, the same
    dtype: never broadcast (torch.allclose alone takes an empty [1, 0] or [0, T] answer as equal to anything)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype != b.dtype \
            and a.is_floating_point() and b.is_floating_point():
        return False
    a, b = torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)
    return a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=False)


def num(x) -> str:
    """A returned number for a message; anything else by its type only (a string returned where a number belongs
    could carry text the student's code read: the grader's table would print it)."""
    return f"{x:.4g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else f"a {type(x).__name__}"


def fmt(x) -> list:
    """A tensor as a list of numbers rounded to 4 decimals, for messages."""
    return (torch.round(torch.as_tensor(x).detach().double() * 1e4) / 1e4).tolist()


def grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


# ----------------------------------------------------------------------------------------------------------------------
# advantages: grpo.group_advantages (Eq. 1)


@ex("advantages")
def test_advantages_use_the_unbiased_std():
    # group [1, 0, 1, 1]: mean 0.75; unbiased var = (3 * 0.25^2 + 0.75^2) / 3 = 0.25 -> std 0.5
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), ["q"] * 4)
    want = torch.tensor([0.5, -1.5, 0.5, 0.5])
    assert close(adv, want, atol=1e-5), (
        f"std must be unbiased (N-1, torch.std's default, as the official code), not the population std; rewards "
        f"[1, 0, 1, 1] gave {fmt(adv)}")


@ex("advantages")
def test_advantages_std_is_the_groups_own():
    # two groups in adjacent rows: [1, 0] (std 0.7071) and [1, 0, 0, 0] (std 0.5); the batch's std is 0.5164
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0]), ["a", "a", "b", "b", "b", "b"])
    assert close(adv, [0.7071068, -0.7071068, 1.5, -0.5, -0.5, -0.5], atol=1e-4), (
        f"A_i = (r_i - mean_g) / (std_g + eps) with each group's own std (Eq. 1), not the whole batch's; rewards "
        f"[1, 0 | 1, 0, 0, 0] gave {fmt(adv)}")


@ex("advantages")
def test_advantages_group_by_id_not_by_position():
    # P2-P4: the group is the prompt a trajectory answers, named by group_ids; rows of one group need not be adjacent
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), ["a", "b", "a", "b"])
    want = torch.tensor([0.7071, 0.0, -0.7071, 0.0])
    assert close(adv, want, atol=1e-4), (
        f"groups are keyed by group_ids, not by position (P2-P4): ids [a, b, a, b], rewards [1, 0, 0, 0] gave "
        f"{fmt(adv)}")


@ex("advantages")
def test_advantages_all_equal_group_is_exactly_zero():
    # 0.3 and 1.0 average exactly in float32; 0.9 x 3 and 0.7 x 7 leave a ~6e-8 residue, and std ~7e-8, so without
    # the rule A is ~0.056, not 0 (which sizes leave one depends on the CPU's summation order: three chances)
    rewards, ids = [0.3] * 3 + [1.0] * 3 + [0.9] * 3 + [0.7] * 7, ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["d"] * 7
    adv = grpo.group_advantages(torch.tensor(rewards), ids)
    assert adv.shape == (16,), f"one advantage per trajectory: got shape {tuple(adv.shape)} for 16"
    assert bool((adv == 0).all()), (  # exact: P13 sets these to 0, not to something near it
        f"a group whose rewards are all equal carries no signal: A must be exactly 0 (P13: the float mean "
        f"leaves a residue that 1e-6 blows up); got {fmt(adv)}")


@ex("advantages")
def test_advantages_group_of_one_is_the_raw_reward():
    adv = grpo.group_advantages(torch.tensor([0.7, 1.0, 0.0]), ["solo", "g", "g"])
    assert close(adv[0], 0.7), f"a group of one uses mean 0 and std 1 (veRL): A = r; got {adv[0].item()}"


@ex("advantages")
def test_advantages_eps_is_added_to_the_std():
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0]), ["q", "q"], eps=0.5)  # std 0.7071 -> 0.5 / 1.2071
    assert close(adv, [0.5 / 1.2071068, -0.5 / 1.2071068]), (
        f"A = (r - mean) / (std + eps), eps outside the square root; got {fmt(adv)}")


@ex("advantages")
def test_advantages_dr_grpo_variant_and_bad_input():
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0]), ["q"] * 3, scale=False)
    assert close(adv, [2 / 3, -1 / 3, -1 / 3]), f"scale=False (Dr. GRPO) is r - mean, no std; got {fmt(adv)}"
    with pytest.raises(ValueError):
        grpo.group_advantages(torch.tensor([1.0, 0.0]), ["q"])  # lengths differ: ValueError, as the docstring says


@ex("advantages")
def test_advantages_snapshot():
    for c in snapshot("advantages")["cases"]:
        adv = grpo.group_advantages(torch.tensor(c["rewards"]), c["group_ids"], scale=c["scale"])
        assert close(adv, c["adv"], atol=1e-5), (  # the expected values never reach a message (a lookup table)
            f"snapshot {c['group_ids']} {c['rewards']}: the advantages differ; got {fmt(adv)}")


@ex("advantages")
@pytest.mark.parametrize("part", ["binary", "continuous"])
def test_advantages_fresh(part):
    for i, c in enumerate(fresh("advantages", part)):
        adv = grpo.group_advantages(torch.tensor(c["rewards"]), c["group_ids"], eps=c["eps"], scale=c["scale"])
        assert close(adv, c["adv"], atol=1e-5), (
            f"fresh case {i} ({part}; eps {c['eps']:.3g}, scale {c['scale']}): the advantages differ; got {fmt(adv)}")


# ----------------------------------------------------------------------------------------------------------------------
# clipped: grpo.ppo_ratio, the aggregations _token_mean / _seq_mean_token_mean, grpo.grpo_loss (Eq. 1)

# 2 responses x 4 tokens, the last token of row 1 a retrieved passage (mask 0); A = [+1, -1]
# row 0 ratios 1.4, 1, 0.6, 1 -> per-token loss max(-A r, -A clip(r)) = -1.2 (clipped), -1, -0.6, -1
# row 1 ratios 1, 1, 1 -> 1, 1, 1; token-mean over 7 tokens = (-3.8 + 3) / 7 = -0.8 / 7
OLD = torch.log(torch.full((2, 4), 0.5))
NEW = torch.log(torch.tensor([[0.7, 0.5, 0.3, 0.5], [0.5, 0.5, 0.5, 0.9]]))
MASK = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
ADV = torch.tensor([1.0, -1.0])


@ex("clipped")
def test_clipped_ratio_is_exp_of_the_log_ratio_capped_at_100():
    r = grpo.ppo_ratio(torch.tensor([[0.0, 1.0, -1.0, 30.0, 200.0]]), torch.zeros(1, 5), torch.ones(1, 5))
    want = torch.tensor([[1.0, 2.7182817, 0.3678794, 100.0, 100.0]])
    assert close(r, want), f"r_t = exp(logp - old_logp), log-ratio clamped to [-20, 20], r capped at 100 (the " \
                           f"code's cap, P15); got {fmt(r)}"


@ex("clipped")
def test_clipped_surrogate_takes_the_pessimistic_max():
    logp = NEW.clone().requires_grad_()
    loss, m = grpo.grpo_loss(logp, OLD, None, ADV, MASK, kl_coef=0.0)
    assert close(loss, -0.8 / 7), (
        f"per-token loss is max(-A r, -A clip(r, 1-eps, 1+eps)) (the pessimistic bound, Eq. 1 as a loss), not the "
        f"min; got {loss.item():.4f}")
    want = torch.tensor([[0, -1 / 7, -0.6 / 7, -1 / 7], [1 / 7, 1 / 7, 1 / 7, 0]])
    assert close(grad(loss, logp), want), "gradient: 0 on the clipped token, -A r / N elsewhere, 0 on masked tokens"


@ex("clipped")
def test_clipped_clip_frac_counts_only_active_clips():
    _, m = grpo.grpo_loss(NEW.clone(), OLD, None, ADV, MASK, kl_coef=0.0)
    assert close(m["grpo/clip_frac"], 1 / 7), (
        f"grpo/clip_frac is the share of mask tokens where the clipped branch is strictly larger (token (0, 0) only; "
        f"(0, 2) has r = 0.6 < 0.8 but A > 0 keeps the unclipped one); got {num(m['grpo/clip_frac'])}")
    assert close(m["grpo/pg_loss"], -0.8 / 7), "metrics['grpo/pg_loss'] must hold the policy-gradient loss"


@ex("clipped")
def test_clipped_eps_high_widens_only_the_upper_bound():
    logp = NEW.clone().requires_grad_()
    loss, _ = grpo.grpo_loss(logp, OLD, None, ADV, MASK, kl_coef=0.0, clip_eps_high=0.5)  # 1.4 now inside [0.8, 1.5]
    # row 0: -1.4 - 1 - 0.6 - 1 = -4, row 1: 3 -> -1 / 7
    assert close(loss, -1.0 / 7), f"clip range [1 - clip_eps, 1 + clip_eps_high] (DAPO clip-higher); got " \
                                  f"{loss.item():.4f}"


@ex("clipped")
def test_clipped_old_logp_is_a_constant_on_policy_gives_reinforce():
    # P22: on-policy (old_logp is logp) the loss is -mean(A) but its gradient is REINFORCE's -A / N, not 0
    logp = OLD.clone().requires_grad_()
    loss, _ = grpo.grpo_loss(logp, logp, None, ADV, MASK, kl_coef=0.0)
    g = grad(loss, logp)
    want = -ADV[:, None] * MASK / 7
    assert close(g, want), f"old_logp must be detached: on-policy the gradient is REINFORCE's -A / N (P22); got " \
                           f"{fmt(g)}"


@ex("clipped")
def test_clipped_token_mean_divides_by_the_mini_batch_tokens_p14():
    # two micro-batches (one row each) must add up to the mini-batch loss when num_tokens is the mini-batch's 7
    full, _ = grpo.grpo_loss(NEW, OLD, None, ADV, MASK, kl_coef=0.0)
    parts = [grpo.grpo_loss(NEW[i:i + 1], OLD[i:i + 1], None, ADV[i:i + 1], MASK[i:i + 1], kl_coef=0.0,
                            num_tokens=MASK.sum())[0] for i in range(2)]
    assert close(sum(parts), full), (
        f"normalising per micro-batch: token-mean must divide by num_tokens, the mini-batch's token count, when "
        f"given (P14); micro-batches sum to {sum(parts).item():.4f}, the mini-batch loss is {full.item():.4f}")


@ex("clipped")
def test_clipped_seq_mean_token_mean_hand_computed():
    # per response token-mean: row 0 (-1.2 - 1 - 0.6 - 1) / 4 = -0.95, row 1 3 / 3 = 1 -> mean over 2 rows = 0.025
    loss, _ = grpo.grpo_loss(NEW, OLD, None, ADV, MASK, kl_coef=0.0, agg="seq-mean-token-mean")
    assert close(loss, 0.025), f"seq-mean-token-mean (Eq. 1): each response's token-mean over its own mask tokens, " \
                               f"then the mean over responses; got {loss.item():.4f}"
    loss, _ = grpo.grpo_loss(NEW, OLD, None, ADV, MASK, kl_coef=0.0, agg="seq-mean-token-mean", num_seqs=4)
    assert close(loss, 0.0125), f"seq-mean-token-mean divides the sum over responses by num_seqs when given (the " \
                                f"mini-batch's rows, P14); got {loss.item():.4f}"


@ex("clipped")
def test_clipped_kl_is_added_and_entropy_subtracted():
    logp = NEW.clone().requires_grad_()
    base, _ = grpo.grpo_loss(logp, OLD, None, ADV, MASK, kl_coef=0.0)
    with_kl, m = grpo.grpo_loss(logp, OLD, NEW - 1.0, ADV, MASK, kl_coef=0.1)  # k3 at log-ratio -1: e^-1 = 0.3679
    assert close(with_kl - base, 0.1 * 0.3678794), f"L = L_pg + kl_coef * KL (P8: plus), KL token-mean aggregated;" \
                                                   f" got a KL term of {(with_kl - base).item():.5f}"
    assert close(m.get("grpo/kl", float("nan")), 0.3678794), "metrics['grpo/kl'] holds the aggregated KL"
    ent = torch.full((2, 4), 2.0)
    with_ent, _ = grpo.grpo_loss(logp, OLD, None, ADV, MASK, kl_coef=0.0, entropy=ent, entropy_coef=0.01)
    assert close(with_ent - base, -0.02), "entropy is a bonus: L = L_pg - entropy_coef * H"


@ex("clipped")
def test_clipped_snapshot():
    for i, c in enumerate(snapshot("clipped")["cases"]):
        logp = torch.tensor(c["logp"], requires_grad=True)
        loss, m = grpo.grpo_loss(logp, torch.tensor(c["old_logp"]), None, torch.tensor(c["adv"]),
                                 torch.tensor(c["mask"]), clip_eps_high=c["clip_eps_high"], agg=c["agg"], kl_coef=0.0,
                                 num_tokens=torch.tensor(c["num_tokens"]), num_seqs=c["num_seqs"])
        assert close(loss, c["loss"]), (f"snapshot {i} ({c['agg']}, clip_eps_high {c['clip_eps_high']}): the loss "
                                        f"differs; got {loss.item():.6f}")
        assert close(grad(loss, logp), c["grad"]), f"snapshot {i}: the gradient differs"
        assert close(m["grpo/clip_frac"], c["clip_frac"]), f"snapshot {i}: clip_frac differs"


@ex("clipped")
@pytest.mark.parametrize("part", ["token-mean", "seq-mean-token-mean"])
def test_clipped_fresh(part):
    for i, c in enumerate(fresh("clipped", part)):
        logp = torch.tensor(c["logp"], requires_grad=True)
        loss, m = grpo.grpo_loss(logp, torch.tensor(c["old_logp"]), None, torch.tensor(c["adv"]),
                                 torch.tensor(c["mask"]), clip_eps_high=c["clip_eps_high"], agg=c["agg"], kl_coef=0.0,
                                 num_tokens=torch.tensor(c["num_tokens"]), num_seqs=c["num_seqs"])
        assert close(loss, c["loss"]), f"fresh case {i} ({part}, clip_eps_high {c['clip_eps_high']}): the loss differs"
        assert close(grad(loss, logp), c["grad"]), f"fresh case {i} ({part}): the gradient differs"
        assert close(m["grpo/clip_frac"], c["clip_frac"]), f"fresh case {i} ({part}): clip_frac differs"


# ----------------------------------------------------------------------------------------------------------------------
# kl: grpo.kl_k3 (App. B.2.1; Schulman's k3)


@ex("kl")
def test_kl_k3_hand_values():
    k = grpo.kl_k3(torch.tensor([0.0, 0.0, -1.0]), torch.tensor([0.0, -1.0, 0.0]))
    want = torch.tensor([0.0, 0.3678794, 0.7182818])  # x = ref - logp: e^x - x - 1 at 0, -1, +1
    assert close(k, want), f"k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1 (the log-ratio is ref - logp, the " \
                           f"ratio pi_ref / pi_theta); got {fmt(k)}"


@ex("kl")
def test_kl_k3_direction_matters():
    k = grpo.kl_k3(torch.tensor([-2.0]), torch.tensor([0.0]))  # x = +2: e^2 - 3 = 4.389; the reverse gives 0.1353
    assert close(k, [4.3890561]), f"direction: k3 estimates KL(pi_theta || pi_ref) with x = ref_logp - logp; " \
                                  f"not logp - ref_logp; got {k.item():.4f}"


@ex("kl")
def test_kl_k3_is_clamped_and_finite_p15():
    logp = torch.tensor([0.0, -50.0, 50.0, -100.0, 100.0], requires_grad=True)
    k = grpo.kl_k3(logp, torch.zeros(5))
    assert close(k, [0.0, 10.0, 10.0, 10.0, 10.0]), f"k3 is clamped to [-10, 10], as the code does; got {fmt(k)}"
    g = grad(k.sum(), logp)
    assert bool(torch.isfinite(g).all()), (
        f"P15: clamp the log-ratio to [-20, 20] before exp, else exp overflows to inf and the clamp's zero gradient "
        f"times inf is NaN; gradient {fmt(g)}")


@ex("kl")
def test_kl_k3_snapshot():
    s = snapshot("kl")
    logp = torch.tensor(s["logp"], requires_grad=True)
    k = grpo.kl_k3(logp, torch.tensor(s["ref_logp"]))
    assert close(k, s["k3"]), "snapshot: k3 values differ"
    assert close(grad(k.sum(), logp), s["grad"]), "snapshot: the gradient of k3 differs"


@ex("kl")
@pytest.mark.parametrize("part", ["moderate", "extreme"])
def test_kl_k3_fresh(part):
    for c in fresh("kl", part):
        logp = torch.tensor(c["logp"], requires_grad=True)
        k = grpo.kl_k3(logp, torch.tensor(c["ref_logp"]))
        assert close(k, c["k3"]), f"fresh case ({part} log-ratios): k3 values differ"
        assert close(grad(k.sum(), logp), c["grad"]), f"fresh case ({part} log-ratios): the gradient of k3 differs"


# ----------------------------------------------------------------------------------------------------------------------
# gate: llds.action_segments and llds._gate_action (Eq. 4)


@ex("gate")
def test_gate_action_segments_hand_written():
    keep = torch.tensor([[1, 1, 0, 1, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 1, 1, 1],
                         [1, 0, 1, 0, 1, 0, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    want = torch.tensor([[1, 1, 0, 2, 0, 0, 3, 3], [0, 0, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 2, 2, 2],
                         [1, 0, 2, 0, 3, 0, 4, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    got = llds.action_segments(keep.float())
    assert torch.equal(got.long(), want), (
        f"an action is a maximal run of 1s in the mask, numbered 1..K per row, 0 outside (a masked observation ends "
        f"the action before it, P26); got {fmt(got)}")


# row 0: action 1 = tokens 0-3, Delta [0.5, -0.2, -0.2, -0.2], sum -0.1 -> off; token 4 observation (Delta 5 ignored)
#        action 2 = tokens 5-7, Delta [-0.1, 0.3, 0.0], sum +0.2 -> on
# row 1: one action, tokens 0-3, Delta [0.4, -0.3, -0.3, 0.1], sum -0.1 -> off; tokens 4-7 padding
GATE_DELTA = torch.tensor([[0.5, -0.2, -0.2, -0.2, 5.0, -0.1, 0.3, 0.0], [0.4, -0.3, -0.3, 0.1, 7.0, 7.0, 7.0, 7.0]])
GATE_KEEP = torch.tensor([[1.0, 1, 1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0]])


@ex("gate")
def test_gate_opens_where_the_action_lost_likelihood():
    # Delta = old_logp - logp: the first action lost likelihood on every token (Delta > 0), the second gained on every
    # token (Delta < 0): gated, not gated, whichever way the gate counts its tokens
    delta, keep = torch.tensor([[0.2, 0.1, 0.0, -0.2, -0.1]]), torch.tensor([[1.0, 1, 0, 1, 1]])
    gate, _, _ = llds._gate_action(delta, keep)
    assert close(gate, [[1.0, 1, 0, 0, 0]]), (
        f"the sign of the gate: it opens where the action lost likelihood, sum_k Delta_k > 0 with Delta = old_logp - "
        f"logp (Eq. 4), not where it gained; got {fmt(gate)}")


@ex("gate")
def test_gate_uses_the_signed_sum_of_each_action():
    gate, n_on, n_units = llds._gate_action(GATE_DELTA, GATE_KEEP)
    want = torch.tensor([[0.0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0]])
    assert close(gate, want), (
        f"the gate of an action is 1[sum_k Delta_k > 0], the *signed* sum over the action's tokens (Eq. 4), not "
        f"'some token lost likelihood'; got {fmt(gate)}")


@ex("gate")
def test_gate_is_strict_at_a_zero_sum():
    delta = torch.tensor([[0.5, -0.5, 0.25, -0.25]])  # sums to exactly 0 in float: the gate stays off
    gate, n_on, _ = llds._gate_action(delta, torch.ones(1, 4))
    assert close(gate.sum(), 0.0, atol=1e-12, rtol=0) and int(n_on) == 0, (
        f"the gate opens only when sum Delta > 0, strictly: `>` not `>=` (an action whose likelihood did not move "
        f"is not pulled back); got gate {fmt(gate)}")


@ex("gate")
def test_gate_counts_actions():
    _, n_on, n_units = llds._gate_action(GATE_DELTA, GATE_KEEP)
    assert (int(n_on), int(n_units)) == (1, 3), f"(n_on, n_units) = (actions gated, actions in keep); " \
                                                f"got ({int(n_on)}, {int(n_units)})"


@ex("gate")
def test_gate_is_zero_outside_the_kept_tokens():
    keep = torch.tensor([[1.0, 1, 0, 0, 1]])
    gate, _, n_units = llds._gate_action(torch.tensor([[0.2, 0.1, 3.0, 3.0, 0.1]]), keep)
    assert close(gate, [[1.0, 1, 0, 0, 1]]) and int(n_units) == 2, (
        f"gate is 0 on tokens outside keep (observations, padding, A < 0 rows), and the Deltas there never enter a "
        f"sum; got gate {fmt(gate)}, n_units {int(n_units)}")


@ex("gate")
def test_gate_snapshot():
    for i, c in enumerate(snapshot("gate")["cases"]):
        keep, delta = torch.tensor(c["keep"]), torch.tensor(c["delta"])
        seg = llds.action_segments(keep)
        assert torch.equal(seg.long(), torch.tensor(c["seg"])), f"snapshot {i}: segments"
        gate, n_on, n_units = llds._gate_action(delta, keep)
        assert close(gate, c["gate"]), f"snapshot {i}: the gate differs"
        counts = (int(n_on), int(n_units))
        assert counts == (c["n_on"], c["n_units"]), f"snapshot {i}: n_on / n_units differ"  # exact: counts


@ex("gate")
@pytest.mark.parametrize("part", ["segments", "gate"])
def test_gate_fresh(part):
    for i, c in enumerate(fresh("gate", part)):
        keep = torch.tensor(c["keep"])
        seg = llds.action_segments(keep)
        assert torch.equal(torch.as_tensor(seg).long(), torch.tensor(c["seg"])), f"fresh case {i}: segments differ"
        if part == "gate":
            gate, n_on, n_units = llds._gate_action(torch.tensor(c["delta"]), keep)
            assert close(gate, c["gate"]), f"fresh case {i}: the gate differs"
            counts = (int(n_on), int(n_units))
            assert counts == (c["n_on"], c["n_units"]), f"fresh case {i}: n_on / n_units differ"  # exact: counts


# ----------------------------------------------------------------------------------------------------------------------
# llds: llds.llds_loss (Sec. 5.5, Eqs. 4 and 6)


def from_delta(delta):
    """(logp with grad, old_logp) such that old_logp - logp = delta."""
    old = torch.zeros_like(delta)
    return (old - delta).requires_grad_(), old


@ex("llds")
def test_llds_hand_computed_action_gate():
    logp, old = from_delta(GATE_DELTA)
    loss, m = llds.llds_loss(logp, old, torch.tensor([1.0, 1.0]), GATE_KEEP)
    # only token (0, 6) is gated and lost likelihood: 0.3 / 11 unmasked tokens
    assert close(loss, 0.3 / 11), f"L = sum over gated tokens of max(0, Delta) / all unmasked tokens ('code' " \
                                  f"normalisation); got {loss.item():.5f}"
    want = torch.zeros(2, 8)
    want[0, 6] = -1 / 11
    assert close(grad(loss, logp), want), "gradient: -1/N on gated tokens with Delta > 0, 0 elsewhere"
    assert close(m["llds/gate_rate"], 1 / 3), (
        f"llds/gate_rate = gated actions / actions in Y_pre; got {m['llds/gate_rate']:.4f}")


@ex("llds")
def test_llds_zero_advantage_responses_are_preserved():
    # Y_pre = {A >= 0}: an all-equal group has A = 0 for every response, and LLDS must still hold them
    logp, old = from_delta(torch.tensor([[0.4, 0.2, 0.0]]))
    loss, _ = llds.llds_loss(logp, old, torch.tensor([0.0]), torch.ones(1, 3))
    assert close(loss, 0.2), f"the preserving set is Y_pre = {{A >= 0}}: `>=`, not `>`: a response with A = 0 is " \
                             f"kept; got {loss.item():.4f}"


@ex("llds")
def test_llds_negative_advantage_never_penalised_but_counted():
    logp, old = from_delta(torch.tensor([[0.3, 0.3], [1.0, 1.0]]))
    loss, _ = llds.llds_loss(logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    assert close(loss, 0.6 / 4), (
        f"A < 0 responses are never penalised, but 'code' normalisation divides by *all* unmasked tokens of the "
        f"batch, theirs included (dp_actor.py:396); got {loss.item():.4f}")


@ex("llds")
def test_llds_micro_batches_add_up_p14():
    logp, old = from_delta(GATE_DELTA)
    full, _ = llds.llds_loss(logp, old, torch.tensor([1.0, 1.0]), GATE_KEEP)
    parts = [llds.llds_loss(logp[i:i + 1], old[i:i + 1], torch.tensor([1.0]), GATE_KEEP[i:i + 1],
                            num_tokens=GATE_KEEP.sum())[0] for i in range(2)]
    assert close(sum(parts), full), (
        f"normalising per micro-batch: 'code' normalisation divides by num_tokens, the mini-batch's unmasked "
        f"tokens, when given (P14); micro-batches sum to {sum(parts).item():.5f}, the mini-batch gives "
        f"{full.item():.5f}")


@ex("llds")
def test_llds_paper_normalisation_is_per_response():
    # action gate, A = [1, 0, -1]; row 0 penalty 0.9 over 4 tokens, row 1 0.8 over 2 -> (0.225 + 0.4) / 2 = 0.3125
    delta = torch.tensor([[0.4, -0.1, 0.2, 0.3], [0.6, 0.2, 9.0, 9.0], [1.0, 1.0, 1.0, 9.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    logp, old = from_delta(delta)
    loss, _ = llds.llds_loss(logp, old, torch.tensor([1.0, 0.0, -1.0]), mask, norm="paper")
    assert close(loss, 0.3125), f"norm='paper' with the action gate (Eq. 4): per response divide by its tokens, " \
                                f"then average over Y_pre; got {loss.item():.4f}"


@ex("llds")
def test_llds_on_policy_is_exactly_zero_with_zero_gradient():
    for gate in llds.GATES:
        logp = torch.full((2, 3), -1.0, requires_grad=True)
        loss, _ = llds.llds_loss(logp, logp.detach().clone(), torch.tensor([1.0, 0.0]), torch.ones(2, 3), gate=gate)
        g = grad(loss, logp)
        assert close(loss, 0.0, atol=1e-12, rtol=0) and bool((g == 0).all()), (
            f"on-policy (Delta = 0) the {gate} gate's loss and gradient are exactly 0: max(0, Delta) is torch.relu "
            f"(gradient 0 at 0; clamp(min=0) passes a gradient there, P32); got grad {fmt(g)}")


@ex("llds")
def test_llds_bf16_log_probs_give_the_float32_result():
    # bf16 log-probs (exact in bf16); Delta = old - logp in float32: [3.0146, -1.6992, 0.1992, 0.2969], sum +1.81;
    # subtracting in bf16 rounds the first to 3.0156 and the second to -1.7031
    old = torch.tensor([[-0.001, -2.0, -0.5, -1.0]]).bfloat16()
    logp = torch.tensor([[-3.015625, -0.3, -0.7, -1.3]]).bfloat16()
    loss, _ = llds.llds_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 4))
    want, _ = llds.llds_loss(logp.float(), old.float(), torch.tensor([1.0]), torch.ones(1, 4))
    assert loss.dtype == torch.float32 and close(loss, want), (
        f"Delta = old_logp - logp is formed in float32 (cast each, then subtract) whatever the log-probs' dtype: "
        f"subtracting in bf16 rounds it; got {loss.item():.6f} ({loss.dtype})")


@ex("llds")
def test_llds_ma_weight_multiplies_the_penalty():
    # LLDS-MA: weight [B, T] is beta on the answer span, 1 elsewhere; the gated token (0, 6) weighs 0.5: 0.15 / 11
    logp, old = from_delta(GATE_DELTA)
    weight = torch.ones(2, 8)
    weight[0, 5:] = 0.5
    loss, _ = llds.llds_loss(logp, old, torch.tensor([1.0, 1.0]), GATE_KEEP, weight=weight)
    assert close(loss, 0.15 / 11), (
        f"LLDS-MA: the per-token weight multiplies max(0, Delta) (beta on the answer span), not ignored; "
        f"got {loss.item():.5f}")


@ex("llds")
def test_llds_snapshot():
    for i, c in enumerate(snapshot("llds")["cases"]):
        logp = torch.tensor(c["logp"], requires_grad=True)
        loss, m = llds.llds_loss(logp, torch.tensor(c["old_logp"]), torch.tensor(c["adv"]), torch.tensor(c["mask"]),
                                 gate=c["gate"], norm=c["norm"])
        assert close(loss, c["loss"]), (f"snapshot {i} (gate {c['gate']}, norm {c['norm']}): the loss differs; got "
                                        f"{loss.item():.6f}")
        assert close(grad(loss, logp), c["grad"]), f"snapshot {i} (gate {c['gate']}, norm {c['norm']}): gradient"
        assert close(m["llds/gate_rate"], c["gate_rate"]), f"snapshot {i}: llds/gate_rate differs"


@ex("llds")
@pytest.mark.parametrize("part", ["action", "response-token"])
def test_llds_fresh(part):
    for i, c in enumerate(fresh("llds", part)):
        logp = torch.tensor(c["logp"], requires_grad=True)
        loss, m = llds.llds_loss(logp, torch.tensor(c["old_logp"]), torch.tensor(c["adv"]), torch.tensor(c["mask"]),
                                 gate=c["gate"], norm=c["norm"])
        where = f"fresh case {i} (gate {c['gate']}, norm {c['norm']})"
        assert close(loss, c["loss"]), f"{where}: the loss differs"
        assert close(grad(loss, logp), c["grad"]), f"{where}: the gradient differs"
        assert close(m["llds/gate_rate"], c["gate_rate"]), f"{where}: llds/gate_rate differs"


# ----------------------------------------------------------------------------------------------------------------------
# cut_turn: rollout.cut_turn and rollout.Episode.append (Sec. 3)


@pytest.fixture(scope="module")
def tok():
    from tiny import build_tokenizer

    return build_tokenizer()


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


@ex("cut_turn")
def test_cut_turn_keeps_the_sampled_ids_p7(tok):
    from rollout import cut_turn

    # a non-canonical tokenization, as sampling produces: " Bei" + "jing" where the text encodes as one " Beijing"
    y = enc(tok, "<search> Bei") + enc(tok, "jing capital </search>")
    assert enc(tok, tok.decode(y)) != y
    kept, eos = cut_turn(y + enc(tok, " more text"), tok, {tok.eos_token_id})
    assert kept == y, (
        f"cut by token index: the kept ids are the sampled ids up to the token that completes </search>, never "
        f"decode + re-encode (P7); got {kept}")


@ex("cut_turn")
def test_cut_turn_keeps_the_eos_p9(tok):
    from rollout import cut_turn

    eos, pad = tok.eos_token_id, tok.pad_token_id
    t = enc(tok, "<think> ok </think>")
    got = cut_turn(t + [eos] + [pad] * 3, tok, {eos})
    assert got == (t + [eos], True), f"a turn that ends on EOS keeps the EOS (trained, P9) and says so (True); " \
                                     f"got {got}"
    got = cut_turn(t + [eos] + enc(tok, "<search> x </search>"), tok, {eos})
    assert got == (t + [eos], True), f"nothing after the first EOS is kept; got {got}"


@ex("cut_turn")
def test_cut_turn_at_the_first_stop_string(tok):
    from rollout import cut_turn

    eos = tok.eos_token_id
    s, a = enc(tok, "<search> Rhine </search>"), enc(tok, "<answer> Bonn </answer>")
    got = cut_turn(a + s, tok, {eos})
    assert got == (a, False), f"the turn ends at the first of </search> or </answer>; got {got}"
    got = cut_turn(s + [eos, eos], tok, {eos})
    assert got == (s, False), f"a stop string before the EOS ends the turn (pad == eos: trailing EOS ids are " \
                              f"padding); got {got}"
    got = cut_turn(enc(tok, "<think> x"), tok, {eos})
    assert got == (enc(tok, "<think> x"), False), f"no stop: unchanged; got {got}"
    got = cut_turn([], tok, {eos})
    assert got == ([], False), f"an empty turn stays empty; got {got}"


@ex("cut_turn")
def test_cut_turn_episode_append_builds_the_loss_mask_p5_p6():
    from rollout import Episode

    e = Episode("q", ["a"], "nq", group_id=0, prompt_ids=[1, 2])
    e.append([5, 6, 7], trained=True, answer_mask=[0, 1, 1])
    e.append([8, 9], trained=False)
    e.append([10], trained=True)
    assert e.response_ids == [5, 6, 7, 8, 9, 10], f"append extends response_ids; got {e.response_ids}"
    assert e.loss_mask == [1, 1, 1, 0, 0, 1], (
        f"loss_mask is built while concatenating: 1 on the policy's actions, 0 on every observation token, tags "
        f"included (P5, P6); got {e.loss_mask}")
    assert e.answer_mask == [0, 1, 1, 0, 0, 0], f"answer_mask stays aligned (0s by default); got {e.answer_mask}"
    with pytest.raises(ValueError):
        e.append([11, 12], trained=True, answer_mask=[1])  # answer_mask of another length
    with pytest.raises(ValueError):
        e.append([11], trained=False, answer_mask=[1])  # an observation is never the model's answer
    assert len(e.response_ids) == len(e.loss_mask) == 6, "a refused append changes nothing"


@ex("cut_turn")
@pytest.mark.parametrize("part", ["cut", "append"])
def test_cut_turn_fresh(part, tok):
    from rollout import Episode, cut_turn

    for i, c in enumerate(fresh("cut_turn", part)):
        if part == "cut":
            got = cut_turn(c["ids"], tok, {tok.eos_token_id})
            assert (list(got[0]), bool(got[1])) == (c["kept"], c["eos"]), f"fresh case {i}: got {got}"  # exact: ids
            continue
        e = Episode("q", ["a"], "nq", group_id=0, prompt_ids=[1, 2])
        for step in c["steps"]:
            e.append(step["ids"], trained=step["trained"], answer_mask=step["answer_mask"])
        got = (e.response_ids, e.loss_mask, e.answer_mask)
        assert got == (c["response_ids"], c["loss_mask"], c["answer_mask"]), (  # exact: lists of ints
            f"fresh case {i}: response_ids, loss_mask, answer_mask after {len(c['steps'])} appends: got {got}")


# ----------------------------------------------------------------------------------------------------------------------
# em: rollout.normalize_answer and rollout.em_check (the exact-match reward)


@ex("em")
def test_em_normalize_deletes_punctuation():
    from rollout import normalize_answer

    got = normalize_answer("The  Eiffel-Tower!")
    assert got == "eiffeltower", f"ASCII punctuation is deleted, not replaced by a space (SQuAD / Search-R1): " \
                                 f"'The  Eiffel-Tower!' gave {got!r}"


@ex("em")
def test_em_normalize_order_and_whole_word_articles():
    from rollout import normalize_answer

    cases = {"  A  cat, an apple; THE end. ": "cat apple end", "Theatre": "theatre", "the.": "", "an.": "",
             "Jean–Paul": "jean–paul",  # whole-word articles; Unicode dashes are not ASCII punctuation
             "A.M.": "am", "The-Who": "thewho"}  # punctuation goes before articles: else 'a' of 'a.m.' is an article
    for text, want in cases.items():
        got = normalize_answer(text)
        assert got == want, f"lower, delete ASCII punctuation, drop whole-word a/an/the (\\b), squash spaces, in " \
                            f"that order: {text!r} gave {got!r}"


@ex("em")
def test_em_check_aliases_and_none():
    from rollout import em_check

    golds = ["New York City", "Big Apple", "NYC"]
    got = [em_check("the Big Apple", golds), em_check("New York", golds)]
    assert got == [1.0, 0.0], f"any alias counts: em('the Big Apple'), em('New York') gave {got}"  # exact: branch
    got = [em_check("Paris", "Paris"), em_check("P", "Paris")]
    assert got == [1.0, 0.0], f"a str gold is one alias, never a list of characters; got {got}"  # exact: a branch
    got = em_check(None, ["Paris"])
    assert got == 0.0, f"no <answer> (prediction None) scores 0; got {got}"  # exact: em_check returns by a branch


@ex("em")
def test_em_check_is_exact_match_not_a_substring():
    from rollout import em_check

    got = [em_check("Paris, France", ["Paris"]), em_check("the city of Paris", "Paris"), em_check("Paris", "paris.")]
    assert got == [0.0, 0.0, 1.0], (  # exact: em_check returns 0.0 or 1.0 by a branch
        f"exact match, not a substring: the normalised prediction must equal a normalised gold (Search-R1's "
        f"subem_check, 'gold in prediction', is another metric); got {got}")


@ex("em")
def test_em_check_article_only_gold_p20():
    from rollout import em_check

    got = [em_check("", "The"), em_check("a", "The"), em_check("the", "The"), em_check(None, "The")]
    assert got == [0.0, 0.0, 1.0, 0.0], (  # exact: em_check returns 0.0 or 1.0, by a branch
        f"P20: a gold that normalises to '' (e.g. 'The') would match an empty prediction; compare such golds on the "
        f"lower-cased, whitespace-squashed text: em('', 'The'), em('a', 'The'), em('the', 'The'), em(None, 'The') "
        f"gave {got}")


@ex("em")
@pytest.mark.parametrize("part", ["normalize", "check"])
def test_em_fresh(part):
    from rollout import em_check, normalize_answer

    for c in fresh("em", part):
        if part == "normalize":
            got = normalize_answer(c["text"])
            assert got == c["norm"], f"fresh case: {c['text']!r} gave {got!r}"
        else:
            got = em_check(c["prediction"], c["golds"])
            assert got == c["em"], f"fresh case: em({c['prediction']!r}, {c['golds']!r}) gave {got}"  # exact: 0/1


# ----------------------------------------------------------------------------------------------------------------------
# alarm: llds.lld_alarm (Sec. 5.1)


@ex("alarm")
@pytest.mark.parametrize("delta, gnorm, phase", [
    ([0.2, 0.1, 0.3, 0.05], [1.0] * 4, ""),  # the likelihood of correct responses rises: healthy
    ([0.2, 0.0, -0.01, 0.0], [1.0] * 4, "stagnation"),  # flat (<= 0) for k = 3 steps, not all falling (phase I)
    ([0.1, -0.10, -0.12, -0.11], [1.0, 1.1, 0.9, 1.0], "steady decay"),  # falls, grad norm stable (phase II)
    ([0.1, -0.1, -0.3, -0.8], [1.0] * 4, "acceleration"),  # falls faster each step (phase III)
    ([-0.5, -0.6], [1.0, 1.0], ""),  # fewer than k values: no verdict yet
    ([-0.1, -0.2, 0.01], [1.0] * 3, ""),  # one step of recovery clears it
])
def test_alarm_phases(delta, gnorm, phase):
    got = llds.lld_alarm(delta, gnorm, k=3)
    assert got == phase, f"phases (Sec. 5.1): delta_correct {delta}, grad norms {gnorm} gave {got!r}"


@ex("alarm")
def test_alarm_skips_steps_without_a_correct_response():
    got = llds.lld_alarm([0.1, -0.1, None, -0.2, None, -0.15], [1.0] * 6, k=3)
    assert got == "steady decay", f"None (no correct response that step) is skipped: the last k *defined* values " \
                                  f"count; got {got!r}"


@ex("alarm")
def test_alarm_spike_is_against_the_median_before_the_window():
    # falling steadily; grad norms before the window [1, 1, 1, 1, 30] have median 1 (mean 6.8): 5.0 is a 5x spike
    got = llds.lld_alarm([-0.1] * 8, [1, 1, 1, 1, 30, 1, 1, 5.0], k=3)
    assert got == "acceleration", f"grad-norm spike: the last grad norm > spike x the *median* of the steps before " \
                                  f"the window (robust to one outlier); got {got!r}"
    with pytest.raises(ValueError):
        llds.lld_alarm([0.0], [1.0], k=0)


@ex("alarm")
@pytest.mark.parametrize("part", ["phases", "gaps"])
def test_alarm_fresh(part):
    for c in fresh("alarm", part):
        got = llds.lld_alarm(c["delta"], c["gnorm"], k=c["k"])
        assert got == c["phase"], f"fresh case: delta_correct {c['delta']}, grad norms {c['gnorm']}, k {c['k']} " \
                                  f"gave {got!r}"
