# mistake: the "code" normalisation by this micro-batch's tokens, ignoring num_tokens
# expect: normalising per micro-batch


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
    """The LLDS term (without lambda) for one (micro-)batch; returns (loss, metrics). Loss is float32.

    logp [B, T] (current policy, with grad; float32 or bfloat16), old_logp [B, T] (rollout policy; detached here),
    adv [B] or [B, T], loss_mask [B, T] float (1 = model token). weight [B, T] or None: LLDS-MA per-token weight (beta
    on the answer span, 1 elsewhere). Mini-batch totals, when micro-batching (default: this batch's): num_tokens, the
    unmasked tokens ("code" normalisation); num_pre, the Y_pre responses with a model token ("paper", action gate, and
    the llds/active_per_response metric); num_pre_tokens, the model tokens of Y_pre responses ("paper", response and
    token gates). Source: v2 Eqs. 4/9/10 and dp_actor.py:347-396 (update_policy).
    metrics (floats, "llds/"): penalty (this value), gate_rate (gated units / units in Y_pre, a unit being an action,
    a response, or a token with Delta > 0 for the token variant), active_per_response (gated units per Y_pre response,
    normalised like the loss by num_pre so that micro-batch values add up; action gate: the code's
    actor/mean_reduce_chunk), delta_mean (mean Delta over Y_pre tokens; > 0 means the kept responses lost likelihood),
    frac_tokens (share of Y_pre tokens that are penalised).
    Raises ValueError on unknown gate / norm or shape mismatch.
    """
    if gate not in GATES:
        raise ValueError(f"unknown LLDS gate {gate!r}; choose one of {sorted(GATES)}")
    if norm not in NORMS:
        raise ValueError(f"unknown LLDS normalisation {norm!r}; choose one of {sorted(NORMS)}")
    if logp.shape != old_logp.shape or logp.shape != loss_mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, loss_mask "
                         f"{tuple(loss_mask.shape)} must all be [B, T]")
    mask = loss_mask.float()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [B, 1] or [B, T]
    # old minus current (the LLD diagnostic, v2 Eq. 2, uses the other sign); float32, so that bf16 log-probs work
    delta = old_logp.detach().float() - logp.float()  # [B, T]
    keep = (adv >= 0).float() * mask  # [B, T] preserving set Y_pre (A >= 0), model tokens only (dp_actor.py:347, 378)
    g, n_on, n_units = GATES[gate](delta.detach(), keep)  # [B, T] gate, detached: it routes, it is not trained
    w = 1.0 if weight is None else weight
    # NOTE(departure): relu, whose gradient at Delta == 0 is 0; the code's torch.maximum(0, Delta) gives half of it
    # there (dp_actor.py:374) and clamp(min=0) all of it, so an ungated on-policy token would be pulled up
    pen = g * torch.relu(delta) * w * mask  # [B, T] max(0, Delta) on gated tokens only
    # NOTE(departure): "code" divides by the mini-batch's num_tokens; the code by each micro-batch's own count
    loss = NORMS[norm][gate](pen, keep, mask, None, num_pre, num_pre_tokens)

    n_keep = keep.sum().clamp(min=1).item()
    n_pre = (keep.sum(-1) > 0).sum().item() if num_pre is None else float(num_pre)
    metrics = {
        "llds/penalty": loss.item(),
        "llds/gate_rate": n_on.item() / max(n_units.item(), 1),
        "llds/active_per_response": n_on.item() / max(n_pre, 1),
        "llds/delta_mean": (delta.detach() * keep).sum().item() / n_keep,
        "llds/frac_tokens": ((pen.detach() > 0).float() * keep).sum().item() / n_keep,
    }
    return loss, metrics
