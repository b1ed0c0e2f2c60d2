# mistake: the gate's sign reversed: it opens where the action's likelihood rose (sum Delta < 0)
# expect: sign of the gate
# patch: llds.py _gate_action
# replace: gate = (sums > 0)
# with: gate = (sums < 0)
