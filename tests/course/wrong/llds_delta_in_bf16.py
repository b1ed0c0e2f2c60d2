# mistake: Delta formed in the log-probs' dtype and cast afterwards: bf16 subtraction rounds it
# expect: Delta = old_logp - logp is formed in float32
# patch: llds.py llds_loss
# replace: old_logp.detach().float() - logp.float()
# with: (old_logp.detach() - logp).float()
