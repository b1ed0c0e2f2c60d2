# mistake: loss_mask 1 on every appended token, observations included
# expect: 0 on every observation token


def append(self, ids: list[int], trained: bool, answer_mask: list[int] | None = None):
    """Extend the response by `ids` ([n]): a model action (trained=True, loss_mask 1) or an observation
    (trained=False, loss_mask 0, tags included: P5). answer_mask: [n] 0/1 (`answer_span`), actions only; default
    0s. The only writer of response_ids / loss_mask / answer_mask, so the three stay aligned (P6: the mask is built
    while concatenating, never by a regex over decoded text). Raises ValueError on an answer_mask of another
    length, or with a 1 on an observation."""
    answer_mask = [0] * len(ids) if answer_mask is None else list(answer_mask)
    if len(answer_mask) != len(ids) or (not trained and any(answer_mask)):
        kind = "action" if trained else "observation"
        raise ValueError(f"answer_mask {answer_mask} does not fit {len(ids)} {kind} ids")
    self.response_ids += ids
    self.loss_mask += [1] * len(ids)  # NOTE(P6): built while concatenating, no regex
    self.answer_mask += answer_mask
