# mistake: Search-R1's turn: decode, cut the text at the tag, encode again
# expect: never decode + re-encode


def cut_turn(new_ids, tokenizer, eos_ids):
    text = tokenizer.decode(new_ids, skip_special_tokens=True)
    for tag in STOP_STRINGS:
        if tag in text:
            return tokenizer.encode(text.split(tag)[0] + tag, add_special_tokens=False), False
    ended = any(t in eos_ids for t in new_ids)
    return tokenizer.encode(text, add_special_tokens=False), ended
