# mistake: articles dropped before punctuation is deleted: 'A.M.' becomes 'm', 'The-Who' becomes 'who'
# expect: in that order


def normalize_answer(s: str) -> str:
    """Search-R1 / SQuAD normalisation, in its exact order: lower, drop ASCII punctuation, drop a/an/the, squash spaces."""
    s = s.lower()
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    return " ".join(s.split())
