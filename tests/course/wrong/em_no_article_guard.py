# mistake: Search-R1's em_check: normalised strings only, so "" matches an article-only gold
# expect: P20


def em_check(prediction, golden_answers):
    if prediction is None:
        return 0.0
    golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    return float(any(normalize_answer(prediction) == normalize_answer(g) for g in golds))
