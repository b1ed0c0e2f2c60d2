# mistake: torch.minimum of the two branches: the optimistic bound, where PPO takes the pessimistic one
# expect: pessimistic bound


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
    """Clipped surrogate + entropy bonus + KL-to-reference loss for one (micro-)batch; returns (loss, metrics).

    logp [B, T] (with grad), old_logp [B, T] (rollout policy, no grad), ref_logp [B, T] or None (frozen initial model;
    None or kl_coef=0 drops the KL term), adv [B] or [B, T], loss_mask [B, T] float, entropy [B, T] or None (with grad).
    Paper Eq. 1 with the code's additions (dp_actor.py): L = L_pg - entropy_coef * H + kl_coef * KL (P8: +KL, so its
    gradient pulls logp toward ref_logp). policy_loss: "ppo-clip" (token ratio r_t, aggregated by `agg`) or "gspo"
    (sequence ratio s_i,t, always seq-mean-token-mean; entropy and KL still use `agg`, as the code). The clip range is
    [1 - clip_eps, 1 + clip_eps_high]; clip_eps_high None means clip_eps (the code's symmetric clip). metrics are
    detached floats under "grpo/" (the module docstring maps them to the code's). num_tokens / num_seqs / norm_len: see
    `aggregate` (pass the mini-batch totals when micro-batching). Raises ValueError on shape mismatch or bad names.
    """
    if logp.shape != old_logp.shape or logp.shape != loss_mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, loss_mask "
                         f"{tuple(loss_mask.shape)} must all be [B, T]")
    if kl_type not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_type {kl_type!r}; choose one of {sorted(KL_ESTIMATORS)}")
    if policy_loss not in POLICY_LOSSES:
        raise ValueError(f"unknown policy_loss {policy_loss!r}; choose one of {sorted(POLICY_LOSSES)}")
    mask = loss_mask.float()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [B, 1] or [B, T]
    agg_ = lambda x, mode=agg: aggregate(x, mask, mode, num_tokens, num_seqs, norm_len)  # noqa: E731
    ratio_fn, pg_agg = POLICY_LOSSES[policy_loss]
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high

    ratio = ratio_fn(logp, old_logp.detach(), mask)  # [B, T] r_t or s_i,t
    pg_unclipped = -adv * ratio  # [B, T]
    pg_clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + eps_high)  # [B, T] DAPO clip-higher when eps_high > eps
    pg_tok = torch.minimum(pg_unclipped, pg_clipped)  # [B, T] pessimistic bound, Eq. 1
    pg_loss = agg_(pg_tok, pg_agg or agg)
    loss = pg_loss

    n = mask.sum().clamp(min=1)
    metrics = {
        "grpo/pg_loss": pg_loss.item(),
        "grpo/clip_frac": ((pg_clipped > pg_unclipped).float() * mask).sum().item() / n.item(),  # actor/pg_clipfrac
        "grpo/ppo_kl": ((old_logp - logp).detach() * mask).sum().item() / n.item(),  # actor/ppo_kl: E_old[log old/pi]
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
