# mistake: the ratio without the log-ratio clamp or the cap at 100
# expect: capped at 100


def ppo_ratio(logp, old_logp, mask):
    return torch.exp(logp - old_logp)
