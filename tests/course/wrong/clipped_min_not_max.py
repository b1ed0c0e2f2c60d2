# mistake: torch.minimum of the two branches: the optimistic bound, where PPO takes the pessimistic one
# expect: pessimistic bound
# patch: grpo.py grpo_loss
# replace: torch.maximum(pg_unclipped, pg_clipped)
# with: torch.minimum(pg_unclipped, pg_clipped)
