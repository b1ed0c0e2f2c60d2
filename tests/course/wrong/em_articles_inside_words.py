# mistake: articles removed wherever the letters occur, not as whole words
# expect: whole-word


def normalize_answer(s: str) -> str:
    """Search-R1 / SQuAD normalisation, in its exact order: lower, drop ASCII punctuation, drop a/an/the, squash spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"(a|an|the)", " ", s)
    return " ".join(s.split())
