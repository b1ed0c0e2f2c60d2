# mistake: the "code" normalisation by this micro-batch's tokens, ignoring num_tokens
# expect: normalising per micro-batch
# patch: llds.py llds_loss
# replace: (pen, keep, mask, num_tokens, num_pre, num_pre_tokens)
# with: (pen, keep, mask, None, num_pre, num_pre_tokens)
