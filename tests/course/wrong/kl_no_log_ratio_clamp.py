# mistake: no clamp of the log-ratio before exp (the output clamp kept): inf, then a NaN gradient
# expect: P15


def kl_k3(logp, ref_logp):
    """k3 ("low_var_kl") = exp(ref - logp) - (ref - logp) - 1 >= 0, clamped to [-10, 10] as the code does.

    The log-ratio is clamped to [-20, 20] first (P15) so exp never overflows. Used in the loss, its gradient is a
    biased estimate of the reverse-KL gradient (P15b); it is the official default.
    """
    log_ratio = ref_logp - logp
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)
