# mistake: the LLDS-MA weight (beta on the answer span) is accepted and never used
# expect: LLDS-MA: the per-token weight multiplies
# patch: llds.py llds_loss
# replace: w = 1.0 if weight is None else weight
# with: w = 1.0
