# mistake: steps without a correct response (None) counted as a change of 0 instead of skipped
# expect: is skipped
# patch: llds.py lld_alarm
# replace: [x for x in delta_correct if x is not None][-k:]
# with: [0.0 if x is None else x for x in delta_correct][-k:]
