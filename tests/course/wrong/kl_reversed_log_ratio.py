# mistake: the log-ratio taken as logp - ref_logp: the k3 of the other direction
# expect: the log-ratio is ref - logp


def kl_k3(logp, ref_logp):
    """k3 ("low_var_kl") = exp(ref - logp) - (ref - logp) - 1 >= 0, clamped to [-10, 10] as the code does.

    The log-ratio is clamped to [-20, 20] first (P15) so exp never overflows. Used in the loss, its gradient is a
    biased estimate of the reverse-KL gradient (P15b); it is the official default.
    """
    log_ratio = (logp - ref_logp).clamp(-20.0, 20.0)
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)
