# mistake: each group's mean, but the whole batch's std (a batch-normalised advantage, another estimator)
# expect: each group's own std
# patch: grpo.py group_advantages
# replace: r.mean(), r.std()
# with: r.mean(), rewards.std()
