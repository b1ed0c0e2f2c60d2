# mistake: steps without a correct response (None) counted as a change of 0 instead of skipped
# expect: is skipped


def lld_alarm(delta_correct: list, grad_norm: list, k: int = 3, eps: float = 0.0, spike: float = 2.0) -> str:
    """The phase of the LLD death spiral the last k steps show, or "" when the correct responses' likelihood rises.

    delta_correct: per step, diag/delta_correct (nats/response; None on steps without a correct response, skipped);
    grad_norm: per step, the pre-clip grad norm. The rule, from v2 Sec. 5.1 (three phases) and Def. A.3:
      - "" (healthy) unless the last k defined changes are all <= eps (LLD, v2 Def. 4.1, on every one of k steps);
      - "acceleration" (phase III) if all k are < -eps (likelihood falls) and either they fall faster each step
        (strictly decreasing: Def. A.3's self-amplification) or the last grad norm exceeds `spike` x the median of
        the steps before the window (the paper's grad-norm spike, the "red star" of Fig. 2);
      - "steady decay" (phase II) if all k are < -eps with a stable grad norm;
      - "stagnation" (phase I) otherwise: the likelihood of correct responses no longer rises, but does not fall yet.
    Fewer than k defined values -> "". Raises ValueError if k < 1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    d = [0.0 if x is None else x for x in delta_correct][-k:]
    if len(d) < k or any(x > eps for x in d):
        return ""
    if not all(x < -eps for x in d):
        return "stagnation"
    before = sorted(g for g in grad_norm[:-k] if g is not None and g == g)
    spiking = bool(before) and grad_norm[-1] > spike * before[len(before) // 2]
    falling_faster = k > 1 and all(b < a for a, b in zip(d, d[1:])) and d[-1] <= spike * d[0]
    return "acceleration" if spiking or falling_faster else "steady decay"
