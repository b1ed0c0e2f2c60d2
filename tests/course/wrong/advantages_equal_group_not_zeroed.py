# mistake: no rule for an all-equal group: the float32 mean of 0.9, 0.9, 0.9 leaves a residue that std + eps blows up
# expect: A must be exactly 0
# patch: grpo.py group_advantages
# replace: r.numel() > 1 and bool((r == r[0]).all())
# with: False
