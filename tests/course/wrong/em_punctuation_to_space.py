# mistake: punctuation replaced by a space instead of deleted
# expect: deleted, not replaced by a space


def normalize_answer(s: str) -> str:
    """Search-R1 / SQuAD normalisation, in its exact order: lower, drop ASCII punctuation, drop a/an/the, squash spaces."""
    s = s.lower()
    s = "".join(" " if ch in set(string.punctuation) else ch for ch in s)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())
