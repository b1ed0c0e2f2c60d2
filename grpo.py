"""GRPO: group-relative advantages and the clipped, KL-regularised policy loss, as the LLDS / Search-R1 code runs it.

Paper: Deng et al., "On GRPO Collapse in Search-R1: The Lazy Likelihood-Displacement Death Spiral" (arXiv 2512.04220),
v2 Eq. 1, and the official code (a veRL 0.1 fork; line numbers below are at its commit ab05c96): `core_algos.py`
compute_grpo_outcome_advantage / compute_policy_loss (lines 164-197) / kl_penalty, and `dp_actor.py` update_policy.
Letters: B = sequences (= prompts x G), G = group size, T = response tokens, V = vocab. Masks are float [B, T]: 1 on
tokens the policy generated, 0 on prompt, retrieved passages and padding.

    A_i   = (r_i - mean(r_group)) / (std(r_group) + 1e-6)                                   -> group_advantages
    ratio = pi_theta(y_t) / pi_old(y_t) = exp(logp - old_logp), capped at 100               -> grpo_loss
    L_pg  = agg( max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)) )                      Eq. 1 (sign flipped: a loss)
    L     = L_pg - entropy_coef * agg(H) + kl_coef * agg(KL_k3(pi_theta || pi_ref))         dp_actor.py

Departures from the official code (each is a bug fix or a guard; the defaults otherwise match it):
  1. Groups are keyed by a per-prompt id from the rollout, never by the dataset row index (PITFALLS P4: Search-R1 pools
     NQ row i with HotpotQA row i).
  2. "token-mean" divides by the token count of the whole optimizer mini-batch, passed in as `num_tokens`, so splitting a
     mini-batch into micro-batches does not change the gradient (P14; the code divides per micro-batch).
  3. A group whose rewards are all equal gets advantage exactly 0 even for non-binary rewards (the code's float mean
     can leave a 1e-17 residue that the 1e-6 denominator blows up to 1e-11).
  4. The PPO log-ratio and the k3 log-ratio are clamped to [-20, 20] before exp (as current veRL does), so neither
     overflows to inf and turns the backward pass into NaN (P15). The code's ratio cap at 100 (core_algos.py line 189)
     is kept on top, so loss and gradient equal the code's (within e^-20 per token) wherever the code's are finite.

Run `python grpo.py` for a demo on toy tensors.
"""

import torch

# ----------------------------------------------------------------------------------------------------------------------
# Log-probs and entropy from logits (used by train.py for the old, ref and current policy alike)


def logp_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log pi(target) under the sampling temperature.

    logits: [B, T, V] (the logits that predict `targets`), targets: [B, T] long -> [B, T] float32, in nats.
    The *logits* are divided by the temperature before log_softmax, exactly as the sampler did (PITFALLS P17);
    dividing log-probs instead gives a ratio != 1 on-policy. Computed in float32 even for bf16 logits.
    """
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]


def logp_and_entropy_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0):
    """(logp [B, T], entropy [B, T]) from one log_softmax, for the update pass that needs both.

    Entropy of the temperature-scaled next-token distribution, H = -sum_v p_v log p_v, in nats. Sharing the
    log_softmax saves a [B, T, V] copy, the memory peak of the update.
    """
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return logp, -(logp_all.exp() * logp_all).sum(-1)  # [B, T], [B, T]


# ----------------------------------------------------------------------------------------------------------------------
# Advantages (paper Eq. 1, code compute_grpo_outcome_advantage)


def group_advantages(rewards: torch.Tensor, group_ids: list, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """Group-normalised outcome advantage A_i = (r_i - mean_g) / (std_g + eps), one scalar per trajectory.

    rewards: [B] float; group_ids: length-B list of hashables naming the *prompt* each trajectory answers (P2-P4).
    Returns adv [B]. std is the unbiased (N-1) estimator, as torch.std in the code. A group of size 1 uses mean 0 and
    std 1 (veRL), so its advantage is the raw reward. A group whose rewards are all equal gets exactly 0 (departure 3).
    `scale=False` gives the Dr. GRPO variant r_i - mean_g. Raises ValueError if the lengths differ.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() != 1 or len(group_ids) != rewards.numel():
        raise ValueError(f"rewards must be [B] and group_ids length B; got {tuple(rewards.shape)} and {len(group_ids)}")
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
            a = torch.zeros_like(r)  # departure 3: equal rewards carry no signal, exactly
        adv[gid == g] = a
    return adv


# ----------------------------------------------------------------------------------------------------------------------
# KL estimators (Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html)


def kl_k1(logp, ref_logp):
    """k1 = log pi - log pi_ref: unbiased for KL(pi || pi_ref), high variance, can be negative."""
    return logp - ref_logp


def kl_k2(logp, ref_logp):
    """k2 = 0.5 (log pi - log pi_ref)^2: low variance, biased; its gradient is the true KL gradient's first-order term."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp, ref_logp):
    """k3 ("low_var_kl") = exp(ref - logp) - (ref - logp) - 1 >= 0, clamped to [-10, 10] as the code does.

    The log-ratio is clamped to [-20, 20] first (departure 4) so exp never overflows. Used in the loss, its gradient is a
    biased estimate of the reverse-KL gradient (P15b); it is the official default.
    """
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "low_var_kl": kl_k3}

# ----------------------------------------------------------------------------------------------------------------------
# Aggregation of a per-token loss into a scalar (names follow veRL's loss_agg_mode)


def _token_mean(x, mask, num_tokens, num_seqs, norm_len):
    # NOTE(departure): num_tokens is the mini-batch's count; Search-R1 divides by each micro-batch's own (P14)
    return (x * mask).sum() / num_tokens  # every unmasked token of the mini-batch weighs the same


def _seq_mean_token_mean(x, mask, num_tokens, num_seqs, norm_len):
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B] token-mean inside each response (paper Eq. 1)
    return per_seq.sum() / num_seqs


def _seq_mean_token_sum_norm(x, mask, num_tokens, num_seqs, norm_len):
    per_seq = (x * mask).sum(-1) / norm_len  # [B] Dr. GRPO: a constant length, no per-response 1/|y|
    return per_seq.sum() / num_seqs


AGGREGATIONS = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(x, mask, agg="token-mean", num_tokens=None, num_seqs=None, norm_len=None) -> torch.Tensor:
    """Reduce a per-token quantity x [B, T] under mask [B, T] to a scalar.

    "token-mean": sum(x * mask) / num_tokens (default: this micro-batch's mask.sum(); pass the mini-batch's total so
    micro-batches add up to the mini-batch mean, P14). "seq-mean-token-mean": mean over responses of each response's
    token-mean (the paper's Eq. 1); pass num_seqs = the mini-batch's number of rows. "seq-mean-token-sum-norm": each
    response's token *sum* divided by the constant norm_len (default T), then the mean over responses (Dr. GRPO).
    Raises ValueError for an unknown mode.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {agg!r}; choose one of {sorted(AGGREGATIONS)}")
    num_tokens = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
    num_seqs = mask.shape[0] if num_seqs is None else num_seqs
    norm_len = mask.shape[1] if norm_len is None else norm_len
    return AGGREGATIONS[agg](x, mask, num_tokens, num_seqs, norm_len)


# ----------------------------------------------------------------------------------------------------------------------
# The loss

PPO_RATIO_MAX = 100.0  # the code caps the token ratio here (core_algos.py line 189): a negative-advantage token whose
# probability rose more than 100-fold then adds a constant -A * 100 and no gradient (like dual-clip PPO's bound)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    kl_coef: float = 0.001,
    kl_type: str = "k3",
    entropy_coef: float = 0.001,
    agg: str = "token-mean",
    num_tokens=None,
    num_seqs=None,
    norm_len=None,
):
    """Clipped surrogate + entropy bonus + KL-to-reference loss for one (micro-)batch; returns (loss, metrics).

    logp [B, T] (with grad), old_logp [B, T] (rollout policy, no grad), ref_logp [B, T] or None (frozen initial model;
    None or kl_coef=0 drops the KL term), adv [B] or [B, T], loss_mask [B, T] float, entropy [B, T] or None (with grad).
    Paper Eq. 1 with the code's additions (dp_actor.py): L = L_pg - entropy_coef * H + kl_coef * KL (P8: +KL, so its
    gradient pulls logp toward ref_logp). metrics are detached floats under "grpo/". num_tokens / num_seqs / norm_len:
    see `aggregate` (pass the mini-batch totals when micro-batching). Raises ValueError on shape mismatch or bad names.
    """
    if logp.shape != old_logp.shape or logp.shape != loss_mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, loss_mask "
                         f"{tuple(loss_mask.shape)} must all be [B, T]")
    if kl_type not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_type {kl_type!r}; choose one of {sorted(KL_ESTIMATORS)}")
    mask = loss_mask.float()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [B, 1] or [B, T]
    agg_ = lambda x: aggregate(x, mask, agg, num_tokens, num_seqs, norm_len)  # noqa: E731

    log_ratio = (logp - old_logp.detach()).clamp(-20.0, 20.0)  # departure 4
    ratio = log_ratio.exp().clamp(max=PPO_RATIO_MAX)  # [B, T] above 100: constant, gradient 0 (the code's cap)
    pg_unclipped = -adv * ratio  # [B, T]
    pg_clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)  # [B, T]
    pg_tok = torch.maximum(pg_unclipped, pg_clipped)  # [B, T] pessimistic bound, Eq. 1
    pg_loss = agg_(pg_tok)
    loss = pg_loss

    n = mask.sum().clamp(min=1)
    metrics = {
        "grpo/pg_loss": pg_loss.item(),
        "grpo/clip_frac": ((pg_clipped > pg_unclipped).float() * mask).sum().item() / n.item(),
        "grpo/ppo_kl": ((old_logp - logp).detach() * mask).sum().item() / n.item(),  # E_old[log pi_old - log pi]
        "grpo/ratio_mean": (ratio.detach() * mask).sum().item() / n.item(),
        "grpo/ratio_max": ratio.detach().masked_fill(mask == 0, 0).max().item() if mask.any() else 0.0,
    }
    if entropy is not None:
        ent = agg_(entropy)
        loss = loss - entropy_coef * ent  # a bonus: higher entropy lowers the loss
        metrics["grpo/entropy"] = (entropy.detach() * mask).sum().item() / n.item()
    if ref_logp is not None and kl_coef != 0.0:
        kl = agg_(KL_ESTIMATORS[kl_type](logp, ref_logp.detach()))
        loss = loss + kl_coef * kl  # P8: + (Search-R1 once subtracted it)
        metrics["grpo/kl"] = kl.item()
    return loss, metrics


# ----------------------------------------------------------------------------------------------------------------------

if __name__ == "__main__":
    torch.set_printoptions(precision=4)
    # Two prompts, G = 2 each: rewards 1,0 | 1,1 -> advantages +-0.7071 (std of [1,0] is 0.7071) | exactly 0
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), ["q0", "q0", "q1", "q1"])
    print("adv", adv)  # tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    # 2 responses x 4 tokens; the last token of row 1 is a retrieved passage (mask 0)
    old_logp = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.7, 0.5, 0.3, 0.5], [0.5, 0.5, 0.5, 0.9]])).requires_grad_()
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    loss, m = grpo_loss(logp, old_logp, None, torch.tensor([1.0, -1.0]), mask, kl_coef=0.0)
    # row 0 (A=+1): ratios 1.4, 1, 0.6, 1 -> losses -1.2 (clipped), -1, -0.6 (below the clip: min keeps it), -1
    # row 1 (A=-1): ratios 1, 1, 1 (token 4 masked) -> losses 1, 1, 1 ; token-mean over 7 tokens = -0.8 / 7
    print(f"pg_loss {loss.item():.4f} clip_frac {m['grpo/clip_frac']:.4f}")  # pg_loss -0.1143 clip_frac 0.1429
    loss.backward()
    print("grad", logp.grad)  # [[0, -0.1429, -0.0857, -0.1429], [0.1429, 0.1429, 0.1429, 0]]: clipped token -> 0
    print("k3", kl_k3(torch.tensor([0.0, -50.0]), torch.tensor([0.0, 0.0])))  # tensor([ 0., 10.]): finite at +-50
