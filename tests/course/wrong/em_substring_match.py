# mistake: substring match (Search-R1's subem_check, another metric): 'paris france' scores 1 against 'Paris'
# expect: exact match, not a substring
# patch: rollout.py em_check
# replace: elif pred == g:
# with: elif g in pred:
