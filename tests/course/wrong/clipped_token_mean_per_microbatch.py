# mistake: token-mean divides by the micro-batch's own token count (Search-R1), not num_tokens
# expect: normalising per micro-batch


def _token_mean(x, mask, num_tokens, num_seqs, norm_len):
    return (x * mask).sum() / mask.sum().clamp(min=1)  # this micro-batch's tokens
