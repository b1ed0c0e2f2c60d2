# mistake: the preserving set as A > 0: zero-advantage responses (all-equal groups) left unprotected
# expect: `>=`, not `>`
# patch: llds.py llds_loss
# replace: keep = (adv >= 0).float()
# with: keep = (adv > 0).float()
