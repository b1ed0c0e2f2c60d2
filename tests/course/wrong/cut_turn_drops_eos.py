# mistake: the EOS is cut off the turn (Search-R1 decodes with skip_special_tokens)
# expect: keeps the EOS


def cut_turn(new_ids: list[int], tokenizer, eos_ids: set) -> tuple[list[int], bool]:
    """Keep the sampled ids up to and including the first EOS or the token that completes a stop string.

    Returns (kept ids, ended_on_eos). Never re-encodes text (P7); the EOS stays in (P9).
    """
    ended_on_eos = False
    for k, t in enumerate(new_ids):
        if t in eos_ids:  # NOTE(P9): EOS kept; Search-R1 decodes with skip_special_tokens and drops it
            new_ids, ended_on_eos = new_ids[:k], True
            break

    def has_stop(text: str) -> bool:
        return any(s in text for s in STOP_STRINGS)

    if new_ids and has_stop(tokenizer.decode(new_ids)):
        # NOTE(P7): cut by token index, never decode + re-encode as Search-R1 does
        new_ids, ended_on_eos = new_ids[: _first_prefix(new_ids, tokenizer, has_stop)], False
    return new_ids, ended_on_eos
