"""LLDS: the likelihood-preserving regulariser of Deng et al., arXiv 2512.04220 (v2 Sec. 5.5).

GRPO in tool-use RL lowers the likelihood of *correct* responses too ("lazy likelihood
displacement"); once that starts, it feeds on itself and training collapses. LLDS pulls back up the
tokens of Y_pre = {i : A_i >= 0} that the update made rarer, wherever a whole action (or response)
lost likelihood:

    Delta_{i,t,k} = log pi_old(y_{i,t,k} | .) - log pi_theta(y_{i,t,k} | .)
                                                     (> 0: the update made the token rarer)
    L_LLDS = norm( sum_{i in Y_pre} sum_t 1[sum_k Delta_{i,t,k} > 0]
                   * sum_k w_{i,t,k} * max(0, Delta_{i,t,k}) )                           Eq. 4/5
    L_total = L_GRPO + lambda * L_LLDS                                                   Eq. 6

i -> row, t -> action (`action_segments`: a run of 1s in `loss_mask`), k -> token of the action;
Delta -> `delta`, Y_pre -> `keep`, w -> `weight` (LLDS-MA, Eq. 5: beta on the final answer span, 1
elsewhere; `ma_beta`). The gate is detached (dp_actor.py:382): a pure likelihood pull. Gates:
"action" (Eq. 4, default), "response" (Eq. 10), "token" (Eq. 9); normalisers "code" (default) or
"paper". Also the likelihood diagnostics (Eq. 2, Figs. 2, 5) and the spiral's phase alarm (5.1).
Departures: docs/departures.md. Run `python llds.py` for a demo on toy tensors.
"""

import torch


def action_segments(keep: torch.Tensor) -> torch.Tensor:
    """Number the maximal runs of 1s in each row: keep [B, T] (0/1) -> seg [B, T] long, 0 outside
    runs, 1..K inside.

    Source: the code's `chunk_sums_vectorized` (dp_actor.py:60-93), in vectorised form. A run starts
    where keep is 1 and the previous position is 0 (or the row starts), so every masked observation
    token ends the action before it: loss_mask must be 0 on every observation token (tags and the
    invalid-action message included), or two turns merge.
    """
    on = keep.bool()  # [B, T]
    # [B, T] keep shifted right by one
    prev = torch.nn.functional.pad(on[:, :-1], (1, 0), value=False)
    starts = on & ~prev  # [B, T] first token of each action
    return starts.long().cumsum(-1) * on.long()  # [B, T]


# Gates: (delta [B, T] float32, detached; keep [B, T] 0/1) -> (gate [B, T] 0/1 on kept tokens, n_on,
# n_units): n_on = units whose gate is on, n_units = units in Y_pre (a unit is an action, a
# response, or for the ungated token variant a token, n_on then counting the tokens with Delta > 0).


def _gate_action(delta, keep):
    seg = action_segments(keep)  # [B, T]
    B, T = keep.shape
    # [B, T+1] slot 0 unused (masked tokens)
    sums = torch.zeros(B, T + 1, dtype=delta.dtype, device=delta.device)
    sums.scatter_add_(1, seg, delta * keep)  # signed sum of Delta per action (dp_actor.py:379)
    # [B, T] broadcast back to the action's tokens (:380-381)
    gate = (sums > 0).to(delta.dtype).gather(1, seg) * keep
    # actions in Y_pre (numbered 1..K per row); T = 0: none
    n_units = seg.amax(-1).sum() if T else seg.new_zeros(())
    n_on = (sums[:, 1:] > 0).sum()  # unused slots hold exactly 0, so they never count
    return gate, n_on, n_units


def _gate_response(delta, keep):
    # [B, 1] signed sum over the response (dp_actor.py:386-391)
    on = (delta * keep).sum(-1, keepdim=True) > 0
    has = keep.sum(-1, keepdim=True) > 0  # [B, 1] response is in Y_pre and has tokens
    return on.to(delta.dtype) * keep, (on & has).sum(), has.sum()


def _gate_token(delta, keep):
    # no gate; "on" = tokens that lost likelihood
    return keep, ((delta > 0).to(delta.dtype) * keep).sum(), keep.sum()


GATES = {"action": _gate_action, "response": _gate_response, "token": _gate_token}


# Normalisers: (pen [B, T] penalty on kept tokens, keep [B, T], mask [B, T], counts) -> the loss.
# Each count is the mini-batch's when the caller passes it (micro-batching then leaves the gradient
# unchanged), else this batch's.


def _by_all_tokens(pen, keep, mask, num_tokens, num_pre, num_pre_tokens):  # "code": dp_actor.py:396
    return pen.sum() / (mask.sum().clamp(min=1) if num_tokens is None else num_tokens)


def _per_response(pen, keep, mask, num_tokens, num_pre, num_pre_tokens):  # "paper", Eq. 4
    per_resp = pen.sum(-1) / keep.sum(-1).clamp(min=1)  # [B] 1 / sum_t |y_{i,t}|
    # 1 / |Y_pre|
    return per_resp.sum() / ((keep.sum(-1) > 0).sum().clamp(min=1) if num_pre is None else num_pre)


def _by_kept_tokens(pen, keep, mask, num_tokens, num_pre, num_pre_tokens):  # "paper", Eqs. 9 and 10
    # 1 / sum_{Y_pre} |y_i|
    return pen.sum() / (keep.sum().clamp(min=1) if num_pre_tokens is None else num_pre_tokens)


NORMS = {
    "code": {gate: _by_all_tokens for gate in GATES},
    "paper": {"action": _per_response, "response": _by_kept_tokens, "token": _by_kept_tokens},
}


def llds_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    gate: str = "action",
    norm: str = "code",
    weight: torch.Tensor | None = None,
    num_tokens=None,
    num_pre=None,
    num_pre_tokens=None,
):
    """The LLDS term (without lambda) for one (micro-)batch; returns (loss, metrics). Loss is
    float32.

    logp [B, T] (current policy, with grad; float32 or bfloat16), old_logp [B, T] (rollout policy;
    detached here), adv [B] or [B, T], loss_mask [B, T] float (1 = model token). weight [B, T] or
    None: LLDS-MA per-token weight (beta on the answer span, 1 elsewhere). Mini-batch totals, when
    micro-batching (default: this batch's): num_tokens, the unmasked tokens ("code" normalisation);
    num_pre, the Y_pre responses with a model token ("paper", action gate, and the
    llds/active_per_response metric); num_pre_tokens, the model tokens of Y_pre responses ("paper",
    response and token gates). Source: v2 Eqs. 4/9/10 and dp_actor.py:347-396 (update_policy).
    metrics (floats, "llds/"): penalty (this value), gate_rate (gated units / units in Y_pre, a unit
    being an action, a response, or a token with Delta > 0 for the token variant),
    active_per_response (gated units per Y_pre response, normalised like the loss by num_pre so that
    micro-batch values add up; action gate: the code's actor/mean_reduce_chunk), delta_mean (mean
    Delta over Y_pre tokens; > 0 means the kept responses lost likelihood), frac_tokens (share of
    Y_pre tokens that are penalised), units and kept_tokens (the units and the model tokens in
    Y_pre: the weights REDUCE uses to combine the means exactly over micro-batches). Raises
    ValueError on unknown gate / norm, or unless logp, old_logp, loss_mask (and weight) are [B, T]
    and adv is [B] or [B, T].
    """
    if gate not in GATES:
        raise ValueError(f"unknown LLDS gate {gate!r}; choose one of {sorted(GATES)}")
    if norm not in NORMS:
        raise ValueError(f"unknown LLDS normalisation {norm!r}; choose one of {sorted(NORMS)}")
    if logp.dim() != 2 or logp.shape != old_logp.shape or logp.shape != loss_mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, loss_mask "
                         f"{tuple(loss_mask.shape)} must all be [B, T]")
    if tuple(adv.shape) not in ((logp.shape[0],), tuple(logp.shape)):
        raise ValueError(f"adv {tuple(adv.shape)} must be [B] = {(logp.shape[0],)} or [B, T] = "
                         f"{tuple(logp.shape)}")
    if weight is not None and weight.shape != logp.shape:
        raise ValueError(f"weight {tuple(weight.shape)} must be [B, T] = {tuple(logp.shape)}, as "
                         f"logp")
    mask = loss_mask.float()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [B, 1] or [B, T]
    # old minus current (the LLD diagnostic, v2 Eq. 2, uses the other sign), in float32: in bf16
    # rounding would set the sign of the gate's sums of hundreds of Deltas; NOTE(P31): 0 on
    # masked slots, so a -inf log-prob there cannot become NaN (-inf * 0) in the gate's sums
    delta = torch.where(mask > 0, old_logp.detach().float() - logp.float(),
                        torch.zeros((), device=logp.device))
    # [B, T] preserving set Y_pre (A >= 0), model tokens only (dp_actor.py:347, 378)
    keep = (adv >= 0).float() * mask
    # [B, T] gate, detached: it routes, it is not trained
    g, n_on, n_units = GATES[gate](delta.detach(), keep)
    w = 1.0 if weight is None else weight
    # NOTE(P32): relu, whose gradient at Delta == 0 is 0; the code's torch.maximum(0,
    # Delta) gives half of it there (dp_actor.py:374) and clamp(min=0) all of it, so an ungated
    # on-policy token would be pulled up
    pen = g * torch.relu(delta) * w * mask  # [B, T] max(0, Delta) on gated tokens only
    # NOTE(P14): "code" divides by the mini-batch's num_tokens; the code by each
    # micro-batch's own count
    loss = NORMS[norm][gate](pen, keep, mask, num_tokens, num_pre, num_pre_tokens)

    n_keep = keep.sum().item()
    n_pre = (keep.sum(-1) > 0).sum().item() if num_pre is None else float(num_pre)
    metrics = {
        "llds/penalty": loss.item(),
        "llds/gate_rate": n_on.item() / max(n_units.item(), 1),
        "llds/active_per_response": n_on.item() / max(n_pre, 1),
        "llds/delta_mean": (delta.detach() * keep).sum().item() / max(n_keep, 1),
        "llds/frac_tokens": ((pen.detach() > 0).float() * keep).sum().item() / max(n_keep, 1),
        # the weights of the means above (REDUCE): units and tokens in Y_pre
        "llds/units": float(n_units.item()),
        "llds/kept_tokens": n_keep,
    }
    return loss, metrics


# NOTE(P33): how train.update combines each llds_loss metric over micro-batches and ranks
# (as grpo.REDUCE): "sum" for values divided by the mini-batch's totals (num_tokens, num_pre) and
# for counts, ("mean", w) for averages over the micro-batch's own units (gate_rate: actions,
# responses or tokens of Y_pre; delta_mean, frac_tokens: Y_pre tokens), weighted by their count w,
# so the mini-batch's value is the exact mean however it is split.
REDUCE = {"llds/penalty": "sum", "llds/active_per_response": "sum", "llds/units": "sum",
          "llds/kept_tokens": "sum",
          "llds/gate_rate": ("mean", "llds/units"), "llds/delta_mean": ("mean", "llds/kept_tokens"),
          "llds/frac_tokens": ("mean", "llds/kept_tokens")}


# --------------------------------------------------------------------------------------------------
# LLDS-MA: the answer span's weight beta (v2 Eq. 5, App. B.2.1; dp_actor.py:359-371)

# schedule -> (V, mask_weight w, lambda, V_B) -> beta, the answer span's weight in the term, in [0,
# 1]. The code weighs answer-span tokens by min(answer_weight, lambda) and the others by lambda, and
# we apply lambda outside the term (P28), so its beta is min(answer_weight / lambda, 1);
# the paper gives beta itself. V: batch-mean valid <search> calls per trajectory, counted as the
# code counts them (generation.py meta_info valid_search_stats: a <search> in the final answer-only
# turn counts).
MA_SCHEDULES = {
    # MASK_ADAPTIVE=true (dp_actor.py:361-363)
    "code": lambda v, w, lam, v_b: min(w * max(v - 1.0, 0.0) / lam, 1.0),
    # MASK_ADAPTIVE=false, MASK_ANS=true (dp_actor.py:364-365)
    "fixed": lambda v, w, lam, v_b: min(w / lam, 1.0),
    # v2 App. B.2.1: beta = min(V / V_B, 1), V_B = 2
    "paper": lambda v, w, lam, v_b: min(v / v_b, 1.0),
}


def ma_beta(mean_valid_searches: float, schedule: str = "code", *, lam: float = 0.2,
            mask_weight: float = 0.2,
            v_b: float = 2.0) -> float:
    """LLDS-MA's answer-span weight beta (Eq. 5), in [0, 1]: MA_SCHEDULES[schedule]
    (dp_actor.py:359-371).

    With mask_weight = lambda (the scripts' 0.2 and 0.2): "code" beta = clip(V - 1, 0, 1)
    (MASK_ADAPTIVE=true, the run behind the 3B-Base LLDS-MA row), "fixed" beta = 1; "paper" beta =
    min(V / 2, 1). At V = 1 "code" and "paper" give 0 and 0.5; both reach 1 at V = 2. A fixed weight
    of 0.05 at lambda = 0.2 gives beta = 0.25. mask_weight is the official scripts' MASK_WEIGHT
    (answer_no_reduce_lambda; 0.2 in train_grpo_nqhot.sh). lam <= 0 (the term is off): beta = 1, so
    llds/penalty is unweighted. Raises ValueError on an unknown schedule.
    """
    if schedule not in MA_SCHEDULES:
        raise ValueError(f"unknown MA schedule {schedule!r}; choose one of {sorted(MA_SCHEDULES)}")
    return (
        float(MA_SCHEDULES[schedule](mean_valid_searches, mask_weight, lam, v_b))
        if lam > 0
        else 1.0
    )


def ma_answer_weight(mean_valid_searches: float, schedule: str = "code", *, lam: float = 0.2,
                     mask_weight: float = 0.2, v_b: float = 2.0) -> float:
    """The official actor/answer_weight (dp_actor.py:366), logged as llds/answer_weight: the answer
    span's coefficient before the code caps it at lambda. "code": mask_weight * max(V - 1, 0);
    "fixed": mask_weight; "paper" (not in the code): lambda * beta. Raises ValueError on an unknown
    schedule."""
    beta = ma_beta(mean_valid_searches, schedule, lam=lam, mask_weight=mask_weight, v_b=v_b)
    official = {"code": mask_weight * max(mean_valid_searches - 1.0, 0.0), "fixed": mask_weight}
    return float(official.get(schedule, lam * beta))


def ma_weight(mean_valid_searches: float, answer_mask: torch.Tensor, schedule: str = "code", *,
              lam: float = 0.2,
              mask_weight: float = 0.2) -> tuple[torch.Tensor, dict]:
    """LLDS-MA's per-token weight [B, T] for llds_loss: beta (ma_beta) on the final answer span
    (answer_mask [B, T], 1 there), 1 elsewhere; and its metrics llds/ma_beta and llds/answer_weight
    (the code's actor/answer_weight). mean_valid_searches: V, the batch mean of valid <search> calls
    per trajectory as the code counts them."""
    beta = ma_beta(mean_valid_searches, schedule, lam=lam, mask_weight=mask_weight)
    return 1.0 + (beta - 1.0) * answer_mask, {  # NOTE(P28): beta; lambda is the caller's
        "llds/ma_beta": beta,
        "llds/answer_weight": ma_answer_weight(mean_valid_searches, schedule, lam=lam,
                                               mask_weight=mask_weight)}


# --------------------------------------------------------------------------------------------------
# The official code's monitoring quantities (dp_actor.py:398-426), over the whole batch


def official_metrics(old_logp, logp, adv, loss_mask, answer_mask, ref_logp=None) -> dict:
    """The log-probability and answer-span statistics dp_actor.py logs around LLDS, with its
    formulas, on a batch.

    old_logp, logp [B, T]: rollout policy and current policy (train.py passes the policy after the
    step's updates); adv [B] or [B, T]; loss_mask [B, T] (1 = model token); answer_mask [B, T] (1 on
    the final <answer>...</answer> span; the code's answer_mask is the complement, 0 there);
    ref_logp [B, T] or None (no ref_ keys then). Returns floats: llds/pos_avg_old_logp = sum over A
    >= 0 model tokens of old_logp / all model tokens, neg_ the same over A < 0 (dp_actor.py:418-421:
    the denominator is *all* tokens, so pos_ + neg_ is the token mean); likewise
    pos_/neg_avg_ref_logp (:423-426); llds/answer_tokens (mean answer-span tokens per response,
    :398-401), answer_frac (share of responses with an answer span, :400-402), answer_prob_mean
    (mean of exp(logp) over all answer-span tokens, :404-409), answer_prob_min (the code's
    masked_min: each response's lowest answer-token probability, averaged over the responses that
    have an answer span, :410-415; the code also averages in +inf for each response without one,
    which makes the logged value inf whenever one response has no answer: ours leaves them out,
    P33). Both are 0.0 when no response has an answer span, as the code logs.
    """
    mask = loss_mask.float()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [B, 1] or [B, T]
    pos, neg = (adv >= 0).float() * mask, (adv < 0).float() * mask  # [B, T]
    n = mask.sum().clamp(min=1)
    out = {"llds/pos_avg_old_logp": ((old_logp * pos).sum() / n).item(),
           "llds/neg_avg_old_logp": ((old_logp * neg).sum() / n).item()}
    if ref_logp is not None:
        out["llds/pos_avg_ref_logp"] = ((ref_logp * pos).sum() / n).item()
        out["llds/neg_avg_ref_logp"] = ((ref_logp * neg).sum() / n).item()
    ans = answer_mask.float()  # [B, T]
    per_resp = ans.sum(-1)  # [B]
    prob = logp.detach().float().exp()  # [B, T]
    has = bool((ans > 0).any())
    out.update({
        "llds/answer_tokens": per_resp.mean().item(),
        "llds/answer_frac": (per_resp > 0).float().mean().item(),
        "llds/answer_prob_mean": ((prob * ans).sum() / ans.sum()).item() if has else 0.0,
        # NOTE(P33): the code's verl_F.masked_min (torch_functional.py): each response's
        # minimum, then the mean over responses, here over those with an answer span only
        "llds/answer_prob_min": prob.masked_fill(ans == 0,
                                                 float("inf")).amin(-1)[per_resp > 0].mean().item()
        if has else 0.0,
    })
    return out


# --------------------------------------------------------------------------------------------------
# Seeing LLD: the paper's likelihood diagnostics (v2 Sec. 4-5, Figs. 2, 5) and an alarm on the death
# spiral's phases


def likelihood_diagnostics(logp_before, logp_after, loss_mask, reward) -> dict:
    """Log-likelihood of correct and incorrect responses before and after one training step (v2 Sec.
    4-5, Fig. 2, 5).

    logp_before [B, T]: log-probs of the sampled tokens under the rollout policy (pi_old, before the
    step's updates); logp_after [B, T]: under the policy after all of the step's updates; loss_mask
    [B, T] (1 = model token); reward [B] (1 = correct). Returns floats in nats, None where a set is
    empty (no correct response this step):
      diag/logp_{correct,incorrect}[_after]: token-mean log-likelihood (nats/token) over the set's
        model tokens;
      diag/seqlogp_{correct,incorrect}[_after]: mean over responses of the sequence sum
        (nats/response);
      diag/delta_{correct,incorrect}: mean over responses of sum_t [log pi_after - log pi_before],
        the per-response likelihood change of v2 Eq. 2 / Def. A.3 (< 0 on correct responses: LLD);
      diag/frac_correct_lld: fraction of correct responses with that change <= 0 (v2 Def. 4.1 with
        eps = 0);
      diag/logp_first_action, diag/logp_later_actions: token-mean log-likelihood (before the step)
        of the first action (tokens before the first tool observation) and of the later ones (Fig.
        5).
    """
    mask = loss_mask.float()
    seg = action_segments(mask)  # [B, T] 1 on the first action, 2.. later
    first, later = (seg == 1).float(), (seg > 1).float()
    correct = (reward == 1).float()  # [B]
    # [B] nats per response
    seq_before, seq_after = (logp_before * mask).sum(-1), (logp_after * mask).sum(-1)
    out = {}

    def token_mean(x, m):
        n = m.sum().item()
        return (x * m).sum().item() / n if n else None

    def seq_mean(x, w):
        n = w.sum().item()
        return (x * w).sum().item() / n if n else None

    for name, w in (("correct", correct), ("incorrect", 1 - correct)):
        w = w * (mask.sum(-1) > 0).float()  # [B] responses of the set that have model tokens
        out[f"diag/logp_{name}"] = token_mean(logp_before, mask * w[:, None])
        out[f"diag/logp_{name}_after"] = token_mean(logp_after, mask * w[:, None])
        out[f"diag/seqlogp_{name}"] = seq_mean(seq_before, w)
        out[f"diag/seqlogp_{name}_after"] = seq_mean(seq_after, w)
        out[f"diag/delta_{name}"] = seq_mean(seq_after - seq_before, w)
    w = correct * (mask.sum(-1) > 0).float()
    out["diag/frac_correct_lld"] = seq_mean((seq_after - seq_before <= 0).float(), w)
    out["diag/logp_first_action"] = token_mean(logp_before, first)
    out["diag/logp_later_actions"] = token_mean(logp_before, later)
    return out


def lld_alarm(delta_correct: list, grad_norm: list, k: int = 3, eps: float = 0.0,
              spike: float = 2.0) -> str:
    """The phase of the LLD death spiral the last k steps show, or "" when the correct responses'
    likelihood rises.

    delta_correct: per step, diag/delta_correct (nats/response; None on steps without a correct
    response, skipped); grad_norm: per step, the pre-clip grad norm. The rule, from v2 Sec. 5.1
    (three phases) and Def. A.3:
      - "" (healthy) unless the last k defined changes are all <= eps (LLD, v2 Def. 4.1, on every
        one of k steps);
      - "acceleration" (phase III) if all k are < -eps (likelihood falls) and either they fall
        faster and faster (Def. A.3's self-amplification: k > 1, each change strictly below the one
        before, and the last at least `spike` x the first, e.g. -0.1, -0.15, -0.2 with spike 2) or
        the last grad norm exceeds `spike` x the median of the steps before the window (the upper
        median, None and NaN left out; the paper's grad-norm spike, the "red star" of Fig. 2);
      - "steady decay" (phase II) if all k are < -eps with a stable grad norm;
      - "stagnation" (phase I) otherwise: the likelihood of correct responses no longer rises, but
        does not fall yet.
    Fewer than k defined values -> "". Raises ValueError if k < 1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    d = [x for x in delta_correct if x is not None][-k:]
    if len(d) < k or any(x > eps for x in d):
        return ""
    if not all(x < -eps for x in d):
        return "stagnation"
    before = sorted(g for g in grad_norm[:-k] if g is not None and g == g)
    spiking = bool(before) and grad_norm[-1] > spike * before[len(before) // 2]
    falling_faster = k > 1 and all(b < a for a, b in zip(d, d[1:])) and d[-1] <= spike * d[0]
    return "acceleration" if spiking or falling_faster else "steady decay"


# --------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    # One response with A >= 0: action 1 (3 tokens) | observation (2 masked tokens) | action 2 (3
    # tokens)
    mask = torch.tensor([[1.0, 1, 1, 0, 0, 1, 1, 1]])
    old_logp = torch.zeros(1, 8)
    logp = torch.tensor([[-0.5, 0.2, 0.1, 9, 9, 0.3, -0.1, 0.1]], requires_grad=True)
    # Delta = old - new = [0.5, -0.2, -0.1 | . . | -0.3, 0.1, -0.1]; action sums: +0.2 (gate on),
    # -0.3 (gate off)
    for gate in ("action", "response", "token"):
        loss, m = llds_loss(logp, old_logp, torch.tensor([1.0]), mask, gate=gate)
        print(f"{gate:8s} loss {loss.item():.4f} gate_rate {m['llds/gate_rate']:.2f}")
    # action   loss 0.0833 gate_rate 0.50   (only token 1 of action 1: 0.5 / 6 unmasked tokens)
    # response loss 0.0000 gate_rate 0.00   (response sum -0.1 <= 0: gate off)
    # token    loss 0.1000 gate_rate 0.33   (tokens 1 and 7: (0.5 + 0.1) / 6; 2 of 6 have Delta > 0)
    loss, _ = llds_loss(logp, old_logp, torch.tensor([1.0]), mask, gate="action")
    loss.backward()
    # [[-0.1667, 0, 0, 0, 0, 0, 0, 0]]: -1/6 on the one gated token with Delta > 0
    print("grad", logp.grad)
    print("on-policy", llds_loss(old_logp, old_logp, torch.tensor([1.0]), mask)[0].item())  # 0.0
    bf16 = llds_loss(logp.detach().bfloat16(), old_logp.bfloat16(), torch.tensor([1.0]), mask)[0]
    # torch.float32 0.0833 (Delta is formed in float32)
    print("bf16", bf16.dtype, f"{bf16.item():.4f}")
    print("beta at V=1: code", ma_beta(1.0), "paper", ma_beta(1.0, "paper"),  # code 0.0 paper 0.5
          "fixed 0.05", ma_beta(1.0, "fixed", mask_weight=0.05))  # fixed 0.25 (= 0.05 / lambda 0.2)
