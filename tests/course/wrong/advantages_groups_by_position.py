# mistake: groups taken as runs of adjacent rows, as if every group were contiguous
# expect: keyed by group_ids, not by position


def group_advantages(rewards, group_ids, eps=1e-6, scale=True):
    """A_i = (r_i - mean_g) / (std_g + eps), a group being a run of adjacent rows with the same id."""
    import itertools

    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() != 1 or len(group_ids) != rewards.numel():
        raise ValueError("rewards must be [B] and group_ids length B")
    adv, start = torch.zeros_like(rewards), 0
    for _, run in itertools.groupby(group_ids):
        n = len(list(run))
        r = rewards[start:start + n]
        if n == 1:
            a = r.clone()
        elif bool((r == r[0]).all()):
            a = torch.zeros_like(r)
        else:
            a = (r - r.mean()) / (r.std() + eps) if scale else r - r.mean()
        adv[start:start + n], start = a, start + n
    return adv
