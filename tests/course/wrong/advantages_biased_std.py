# mistake: the population std (divides by N), where the official code uses torch.std (N - 1)
# expect: std must be unbiased
# patch: grpo.py group_advantages
# replace: r.mean(), r.std()
# with: r.mean(), r.std(unbiased=False)
