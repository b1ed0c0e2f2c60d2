# mistake: the population std (divides by N), where the official code uses torch.std (N - 1)
# expect: std must be unbiased


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
            mean, std = r.mean(), r.std(unbiased=False)  # population std
        a = (r - mean) / (std + eps) if scale else r - mean
        if r.numel() > 1 and bool((r == r[0]).all()):
            a = torch.zeros_like(r)  # departure 3: equal rewards carry no signal, exactly
        adv[gid == g] = a
    return adv
