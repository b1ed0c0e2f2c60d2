# mistake: the grad-norm spike measured against the mean of the earlier steps: one outlier hides it
# expect: median
# patch: llds.py lld_alarm
# replace: spike * before[len(before) // 2]
# with: spike * sum(before) / len(before)
