"""GRPO: group-relative advantages and the clipped, KL-regularised policy loss as Search-R1 runs it.

Deng et al., arXiv 2512.04220, v2 Eq. 1, as the official code (a veRL 0.1 fork; line numbers at its
commit ab05c96) computes it: core_algos.py compute_grpo_outcome_advantage / compute_policy_loss
(lines 164-197) / compute_policy_loss_gspo (257-318) / kl_penalty, and dp_actor.py update_policy.
B = prompts x G sequences, T = response tokens; masks are float [B, T], 1 on generated tokens.

    A_i   = (r_i - mean(r_group)) / (std(r_group) + 1e-6)                 -> group_advantages
    r_t   = pi_theta(y_t) / pi_old(y_t) = exp(logp - old_logp), at most 100  -> ppo_ratio (ppo-clip)
    s_i   = exp( mean_{t in y_i} (logp - old_logp) )                        -> gspo_ratio (gspo)
    s_i,t = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]     (value s_i, gradient s_i * grad logp_t:
                                                             GSPO-token)
    L_pg  = agg( max(-A * r, -A * clip(r, 1 - eps, 1 + eps_high)) ),  r = r_t or s_i,t
                                                             Eq. 1, sign flipped: a loss
    L     = L_pg - entropy_coef * agg(H) + kl_coef * agg(KL_k3(pi_theta || pi_ref))    dp_actor.py

"ppo-clip" is the default; "gspo" (arXiv 2507.18071) is the code's USE_GSPO=true branch; eps_high >
eps is DAPO's clip-higher. At the end, off by default: CalibAdv's calibrated advantages (train.py
--calib-adv). Departures: docs/departures.md. Run `python grpo.py` for a demo on toy tensors.
"""

import torch

# --------------------------------------------------------------------------------------------------
# Advantages (paper Eq. 1, code compute_grpo_outcome_advantage)


def group_advantages(rewards: torch.Tensor, group_ids: list, eps: float = 1e-6,
                     scale: bool = True) -> torch.Tensor:
    """Group-normalised outcome advantage A_i = (r_i - mean_g) / (std_g + eps), one scalar per
    trajectory.

    rewards: [B] float; group_ids: length-B list of hashables (or a [B] tensor / array of ids)
    naming the *prompt* each trajectory answers (P2-P4). Returns adv [B]. std is the unbiased (N-1)
    estimator, as torch.std in the code. A group of size 1 uses mean 0 and std 1 (veRL), so its
    advantage is the raw reward. A group whose rewards are all equal gets exactly 0 (P13).
    `scale=False` gives the Dr. GRPO variant r_i - mean_g. Raises ValueError if the lengths differ.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    # tensor(0) would be a new key each
    group_ids = group_ids.tolist() if hasattr(group_ids, "tolist") else group_ids
    if rewards.dim() != 1 or len(group_ids) != rewards.numel():
        raise ValueError(f"rewards must be [B] and group_ids length B; got {tuple(rewards.shape)} "
                         f"and {len(group_ids)}")
    index = {g: i for i, g in enumerate(dict.fromkeys(group_ids))}
    gid = torch.tensor([index[g] for g in group_ids])  # [B] 0..num_groups-1
    adv = torch.zeros_like(rewards)
    for g in range(len(index)):
        r = rewards[gid == g]  # [G]
        if r.numel() == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = r.mean(), r.std()  # unbiased, as the code
        a = (r - mean) / (std + eps) if scale else r - mean
        if r.numel() > 1 and bool((r == r[0]).all()):
            a = torch.zeros_like(r)  # NOTE(P13): equal rewards carry no signal, exactly
        adv[gid == g] = a
    return adv


# --------------------------------------------------------------------------------------------------
# KL estimators (Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html)


def kl_k1(logp, ref_logp):
    """k1 = log pi - log pi_ref: unbiased for KL(pi || pi_ref), high variance, can be negative."""
    return logp - ref_logp


def kl_k2(logp, ref_logp):
    """k2 = 0.5 (log pi - log pi_ref)^2: low variance, biased; its gradient is the true KL
    gradient's first-order term."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp, ref_logp):
    """k3 ("low_var_kl") = exp(ref - logp) - (ref - logp) - 1 >= 0, clamped to [-10, 10] as the code
    does.

    The log-ratio is clamped to [-20, 20] first (P15) so exp never overflows. Used in the
    loss, its gradient is a biased estimate of the reverse-KL gradient (P15b); it is the official
    default.
    """
    # NOTE(P15); float32: P31
    log_ratio = (ref_logp.float() - logp.float()).clamp(-20.0, 20.0)
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "low_var_kl": kl_k3}

# --------------------------------------------------------------------------------------------------
# Aggregation of a per-token loss into a scalar (names follow veRL's loss_agg_mode)


def _token_mean(x, mask, num_tokens, num_seqs, norm_len):
    # NOTE(P14): num_tokens is the mini-batch's count; Search-R1 divides by each
    # micro-batch's own (P14)
    return (x * mask).sum() / num_tokens  # every unmasked token of the mini-batch weighs the same


def _seq_mean_token_mean(x, mask, num_tokens, num_seqs, norm_len):
    # [B] token-mean inside each response (paper Eq. 1)
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / num_seqs


def _seq_mean_token_sum_norm(x, mask, num_tokens, num_seqs, norm_len):
    # [B] Dr. GRPO: a constant length, no per-response 1/|y|
    per_seq = (x * mask).sum(-1) / norm_len
    return per_seq.sum() / num_seqs


AGGREGATIONS = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(x, mask, agg="token-mean", num_tokens=None, num_seqs=None,
              norm_len=None) -> torch.Tensor:
    """Reduce a per-token quantity x [B, T] under mask [B, T] to a scalar.

    "token-mean": sum(x * mask) / num_tokens (default: this micro-batch's mask.sum(); pass the
    mini-batch's total so micro-batches add up to the mini-batch mean, P14). "seq-mean-token-mean":
    mean over responses of each response's token-mean (the paper's Eq. 1); pass num_seqs = the
    mini-batch's number of rows. "seq-mean-token-sum-norm": each response's token *sum* divided by
    the constant norm_len (default T), then the mean over responses (Dr. GRPO). Raises ValueError
    for an unknown mode.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {agg!r}; choose one of {sorted(AGGREGATIONS)}")
    num_tokens = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
    num_seqs = mask.shape[0] if num_seqs is None else num_seqs
    norm_len = mask.shape[1] if norm_len is None else norm_len
    return AGGREGATIONS[agg](x, mask, num_tokens, num_seqs, norm_len)


# --------------------------------------------------------------------------------------------------
# Importance ratios: one per token (PPO / GRPO) or one per response, carried by each of its tokens
# (GSPO)

# the code caps the token ratio here (core_algos.py line 189): a negative-advantage token whose
# probability rose more than 100-fold then adds a constant -A * 100 and no gradient (like dual-clip
# PPO's bound)
PPO_RATIO_MAX = 100.0


def ppo_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token ratio r_t = exp(logp - old_logp), capped at 100 as compute_policy_loss does
    (core_algos.py lines 186-189).

    logp, old_logp, mask: [B, T] -> [B, T]. The log-ratio is clamped to [-20, 20] first (P15): the
    code's exp overflows to inf beyond ~88 nats, and the cap's zero gradient times inf is NaN.
    `mask` is unused (per token).
    """
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # [B, T] NOTE(P15)
    # [B, T] above 100: constant, gradient 0 (the code's cap)
    return log_ratio.exp().clamp(max=PPO_RATIO_MAX)


def gspo_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token ratio s_i,t = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)], s_i = exp(mean_t(logp -
    old_logp)) on y_i.

    logp, old_logp, mask: [B, T] -> [B, T]; i -> row, t -> column, y_i -> the row's mask-1 tokens
    (an empty row gets s_i = 1). Every token of row i carries the value s_i and the gradient s_i *
    grad logp_t, so under seq-mean-token-mean the gradient is that of the sequence-level GSPO
    objective (GSPO paper, Sec. 4.3: GSPO-token's gradient, Eq. 18, is GSPO's, Eq. 11, when every
    token of a response has the same advantage, as here). log s_i,t is clamped at <= 10 (no lower
    bound), as core_algos.py compute_policy_loss_gspo lines 291-301 (commit ab05c96) do.
    """
    # [B, 1]
    log_s = ((logp - old_logp) * mask).sum(-1,
                                           keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    # [B, T] value log s_i, gradient that of logp_t (straight-through)
    log_st = logp - logp.detach() + log_s.detach()
    # [B, T] the code's clamp; above it the row gets no gradient
    return log_st.clamp(max=10.0).exp()


# policy_loss -> (ratio function, aggregation of the clipped surrogate; None = the caller's `agg`)
POLICY_LOSSES = {
    "ppo-clip": (ppo_ratio, None),
    # fixed, as the code (lines 309-311): each response weighs 1/B
    "gspo": (gspo_ratio, "seq-mean-token-mean"),
}

# --------------------------------------------------------------------------------------------------
# The loss


def check_shapes(logp, old_logp, adv, loss_mask, **more):
    """Raise ValueError unless logp, old_logp, loss_mask and each tensor of `more` (None: skipped)
    are all [B, T] and adv is [B] or [B, T]."""
    if logp.dim() != 2 or logp.shape != old_logp.shape or logp.shape != loss_mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, loss_mask "
                         f"{tuple(loss_mask.shape)} must all be [B, T]")
    for name, x in more.items():
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"{name} {tuple(x.shape)} must be [B, T] = {tuple(logp.shape)}, as "
                             f"logp")
    if tuple(adv.shape) not in ((logp.shape[0],), tuple(logp.shape)):
        raise ValueError(f"adv {tuple(adv.shape)} must be [B] = {(logp.shape[0],)} or [B, T] = "
                         f"{tuple(logp.shape)}")


def masked_float(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x [B, T] as float32, with masked slots (mask 0) set to 0: a -inf log-prob on padding then
    adds 0, not NaN (0 * inf), and the gradient there is 0."""
    return torch.where(mask > 0, x.float(), torch.zeros((), device=x.device))


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    policy_loss: str = "ppo-clip",
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.001,
    kl_type: str = "k3",
    entropy_coef: float = 0.001,
    agg: str = "token-mean",
    num_tokens=None,
    num_seqs=None,
    norm_len=None,
):
    """Clipped surrogate + entropy bonus + KL-to-reference loss for one (micro-)batch; returns
    (loss, metrics).

    logp [B, T] (with grad), old_logp [B, T] (rollout policy, no grad), ref_logp [B, T] or None
    (frozen initial model; None or kl_coef=0 drops the KL term), adv [B] or [B, T], loss_mask [B, T]
    float, entropy [B, T] or None (with grad). Paper Eq. 1 with the code's additions (dp_actor.py):
    L = L_pg - entropy_coef * H + kl_coef * KL (P8: +KL, so its gradient pulls logp toward
    ref_logp). policy_loss: "ppo-clip" (token ratio r_t, aggregated by `agg`) or "gspo" (sequence
    ratio s_i,t, always seq-mean-token-mean; entropy and KL still use `agg`, as the code). The clip
    range is [1 - clip_eps, 1 + clip_eps_high]; clip_eps_high None means clip_eps (the code's
    symmetric clip). metrics are detached floats under "grpo/" (docs/training.md maps them to the
    code's). num_tokens / num_seqs / norm_len: see `aggregate` (pass the mini-batch totals when
    micro-batching). Computed in float32 whatever the log-probs' dtype, with masked slots set to 0
    first (P31). Raises ValueError unless logp, old_logp, ref_logp, loss_mask and entropy
    are [B, T] and adv is [B] or [B, T], or on unknown names.
    """
    check_shapes(logp, old_logp, adv, loss_mask, ref_logp=ref_logp, entropy=entropy)
    if kl_type not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_type {kl_type!r}; choose one of {sorted(KL_ESTIMATORS)}")
    if policy_loss not in POLICY_LOSSES:
        raise ValueError(f"unknown policy_loss {policy_loss!r}; choose one of "
                         f"{sorted(POLICY_LOSSES)}")
    mask = loss_mask.float()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [B, 1] or [B, T]
    # float32 (an fp16 exp overflows past ~11 nats), and 0 on masked slots, so a -inf there cannot
    # turn into NaN
    # NOTE(P31)
    logp, old_logp = masked_float(logp, mask), masked_float(old_logp.detach(), mask)
    ref_logp = None if ref_logp is None else masked_float(ref_logp.detach(), mask)
    entropy = None if entropy is None else masked_float(entropy, mask)
    def agg_(x, mode=agg):
        return aggregate(x, mask, mode, num_tokens, num_seqs, norm_len)
    ratio_fn, pg_agg = POLICY_LOSSES[policy_loss]
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high

    ratio = ratio_fn(logp, old_logp, mask)  # [B, T] r_t or s_i,t
    pg_unclipped = -adv * ratio  # [B, T]
    # [B, T] DAPO clip-higher when eps_high > eps
    pg_clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + eps_high)
    pg_tok = torch.maximum(pg_unclipped, pg_clipped)  # [B, T] pessimistic bound, Eq. 1
    pg_loss = agg_(pg_tok, pg_agg or agg)
    loss = pg_loss

    n = mask.sum().clamp(min=1)
    metrics = {
        "grpo/pg_loss": pg_loss.item(),
        "grpo/tokens": mask.sum().item(),  # the weight of the token means below (REDUCE)
        # actor/pg_clipfrac
        "grpo/clip_frac": ((pg_clipped > pg_unclipped).float() * mask).sum().item() / n.item(),
        # actor/ppo_kl: E_old[log old/pi]
        "grpo/ppo_kl": ((old_logp - logp).detach() * mask).sum().item() / n.item(),
        "grpo/ratio_mean": (ratio.detach() * mask).sum().item() / n.item(),
        "grpo/ratio_max": ratio.detach().masked_fill(mask == 0,
                                                     0).max().item() if mask.any() else 0.0,
    }
    if entropy is not None:
        ent = agg_(entropy)
        loss = loss - entropy_coef * ent  # a bonus: higher entropy lowers the loss
        metrics["grpo/entropy"] = (entropy.detach() * mask).sum().item() / n.item()
    if ref_logp is not None and kl_coef != 0.0:
        kl = agg_(KL_ESTIMATORS[kl_type](logp, ref_logp))
        loss = loss + kl_coef * kl  # P8: + (Search-R1 once subtracted it)
        metrics["grpo/kl"] = kl.item()
    return loss, metrics


# NOTE(P14): how train.update combines each metric of grpo_loss over the micro-batches (and
# ranks) of one optimizer mini-batch: "sum" for terms already divided by the mini-batch's totals and
# for counts (their micro-batch parts add up), "max" for maxima, and ("mean", w) for averages over
# the micro-batch's own units, which count w: the mini-batch's value is sum(value * w) / sum(w), the
# exact mean whatever the split. A metric missing here stops train.update with an error, so a new
# one cannot be combined the wrong way silently.
REDUCE = {
    "grpo/pg_loss": "sum",
    "grpo/kl": "sum",
    "grpo/tokens": "sum",
    "grpo/ratio_max": "max",
    **{
        k: ("mean", "grpo/tokens")
        for k in ("grpo/clip_frac", "grpo/ppo_kl", "grpo/ratio_mean", "grpo/entropy")
    },
}


# --------------------------------------------------------------------------------------------------
# CalibAdv (Wu et al., "Negative Advantage Is a Double-Edged Sword", arXiv 2604.18235): calibrated
# advantages, a cure for GRPO's collapse on search that is off by default (train.py --calib-adv 0).
# Its official code (wujwyi/CalibAdv at 6ae1c4e; read, not run) scores each search turn of a
# response by the group's "silver" passages it found (machinery/calibadv.py: main_ppo_format.py:
# 512-590), softens the negative advantage of the turns that found them (core_algos.py:1187-1210),
# then rescales the answer turns of each group so that their positive and negative advantages
# balance (advantage_scale, core_algos.py:501-547). results/fixes/sources.md has what was read.


def calibadv_advantages(adv: torch.Tensor, loss_mask: torch.Tensor, group_ids: list,
                        turn_scores: list,
                        target_ratio: float = 1.0) -> torch.Tensor:
    """Token advantages [B, T] from the response advantages adv [B] (group_advantages) and the turn
    scores turn_scores[i][k] = s_ik in [0, 1] (machinery/calibadv.py); loss_mask [B, T], whose k-th
    run of 1s is the policy's k-th action (its last: the answer).

    1. A response with A_i < 0: the tokens of its search turn k get A_i * (1 - s_ik) (a search
       that found the group's silver passages is punished less; s_ik = 0, no score, keeps A_i);
       its other tokens keep A_i. Positive responses keep A_i.
    2. Per group, on each response's last action: P = the sum of its positive token advantages, N of
       its negative ones; all of them 0 if P or N is 0, else the positive ones times -N / (P *
       target_ratio) (the group's answer tokens then pull up exactly as hard as they push down, at
       target_ratio 1).
    Raises ValueError if the shapes or lengths disagree.
    """
    if (
        adv.dim() != 1
        or loss_mask.dim() != 2
        or not adv.shape[0] == loss_mask.shape[0] == len(group_ids) == len(turn_scores)
    ):
        raise ValueError(f"calibadv_advantages: adv [B], loss_mask [B, T], B group ids and "
                         f"turn-score lists; got "
                         f"{tuple(adv.shape)}, {tuple(loss_mask.shape)}, {len(group_ids)}, "
                         f"{len(turn_scores)}")
    mask = loss_mask.float()
    # [B, T] the first token of each run
    starts = (mask > 0) & (torch.nn.functional.pad(mask, (1, 0))[:, :-1] == 0)
    # [B, T] k on the k-th action, 0 elsewhere
    seg = torch.cumsum(starts.long(), dim=1) * (mask > 0)
    tok = adv.float()[:, None] * mask  # [B, T]
    for i, row in enumerate(turn_scores):
        if adv[i] < 0:
            for k, s in enumerate(row, 1):  # s = 0: the turn keeps A_i exactly
                tok[i][seg[i] == k] = adv[i].float() * (1.0 - s)
    # [B, T] each response's last action
    last = (seg == seg.max(dim=1, keepdim=True).values) & (seg > 0)
    for g in dict.fromkeys(group_ids):
        # [B, T] this group's answer tokens
        rows = torch.tensor([h == g for h in group_ids])[:, None] & last
        pos, neg = rows & (tok > 0), rows & (tok < 0)
        p, n = tok[pos].sum(), tok[neg].sum()
        if (
            p == 0 or n == 0
        ):  # exact: sums of advantages that are 0 only when no token has one of that sign
            tok[rows] = 0.0
        else:
            tok[pos] = tok[pos] * (-n / (p * target_ratio))
    return tok


# --------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    torch.set_printoptions(precision=4)
    # Two prompts, G = 2 each: rewards 1,0 | 1,1 -> advantages +-0.7071 (std of [1,0] is 0.7071) |
    # exactly 0
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), ["q0", "q0", "q1", "q1"])
    print("adv", adv)  # tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    # 2 responses x 4 tokens; the last token of row 1 is a retrieved passage (mask 0)
    old_logp = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.7, 0.5, 0.3, 0.5], [0.5, 0.5, 0.5, 0.9]])).requires_grad_()
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    loss, m = grpo_loss(logp, old_logp, None, torch.tensor([1.0, -1.0]), mask, kl_coef=0.0)
    # row 0 (A=+1): ratios 1.4, 1, 0.6, 1 -> losses -1.2 (clipped), -1, -0.6 (below the clip: min
    # keeps it), -1 row 1 (A=-1): ratios 1, 1, 1 (token 4 masked) -> losses 1, 1, 1 ; token-mean
    # over 7 tokens = -0.8 / 7
    # pg_loss -0.1143 clip_frac 0.1429
    print(f"pg_loss {loss.item():.4f} clip_frac {m['grpo/clip_frac']:.4f}")
    loss.backward()
    # [[0, -0.1429, -0.0857, -0.1429], [0.1429, 0.1429, 0.1429, 0]]: clipped token -> 0
    print("grad", logp.grad)
    # GSPO, same tensors: s_0 = (1.4 * 1 * 0.6 * 1)^(1/4) = 0.9573 (inside [0.8, 1.2]); s_1 = 1 (the
    # masked 1.8 is left out) -> seq-mean-token-mean of [-0.9573 | +1] = (1 - 0.9573) / 2 = 0.0213;
    # grad row 0: -s_0 / (2 * 4) = -0.1197
    lp = logp.detach().requires_grad_()
    loss, m = grpo_loss(lp, old_logp, None, torch.tensor([1.0, -1.0]), mask, kl_coef=0.0,
                        policy_loss="gspo")
    loss.backward()
    # gspo_loss 0.0213 grad -0.1197
    print(f"gspo_loss {loss.item():.4f} grad {lp.grad[0, 0].item():.4f}")
    # tensor([ 0., 10.]): finite at +-50
    print("k3", kl_k3(torch.tensor([0.0, -50.0]), torch.tensor([0.0, 0.0])))
