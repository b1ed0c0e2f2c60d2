# mistake: the action sums max(0, Delta) (the pre-fix official code): on whenever one token lost likelihood
# expect: signed


def _gate_action(delta, keep):
    seg = action_segments(keep)  # [B, T]
    B, T = keep.shape
    sums = torch.zeros(B, T + 1, dtype=delta.dtype, device=delta.device)  # [B, T+1] slot 0 unused (masked tokens)
    sums.scatter_add_(1, seg, torch.relu(delta) * keep)  # signed sum of Delta per action (dp_actor.py:379)
    gate = (sums > 0).to(delta.dtype).gather(1, seg) * keep  # [B, T] broadcast back to the action's tokens (:380-381)
    n_units = seg.max(-1).values.sum()  # actions in the preserving set (segments are numbered 1..K per row)
    n_on = (sums[:, 1:] > 0).sum()  # unused slots hold exactly 0, so they never count
    return gate, n_on, n_units
