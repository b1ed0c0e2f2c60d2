"""A tiny policy warm-started on the search world of lab/search_world.py: it already speaks the Search-R1 protocol
(think, search the name, read the passages, answer), but imperfectly, so GRPO's groups start with mixed rewards.

Steps (`run`), all offline and seeded:
  1. `build_tokenizer`: a byte-level BPE (at most 1,500 ids; the world's text gives ~990) trained with the
     `tokenizers` library as tests/tiny.py trains its own (Qwen2.5's normalizer, pre-tokenizer regex and decoder;
     special tokens <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos); the ChatML chat template, so
     rollout.make_prompt wraps prompts as for Qwen2.5-Instruct). Its text (search_world.tokenizer_texts) holds the
     prompt, tags, towns, regions and occupations, and the name syllables *one by one*, never whole person names:
     every name, train or test, splits into the same kind of pieces, so the model must copy names, not memorise them.
  2. `build_model`: a small Qwen2ForCausalLM (2 layers, hidden 128: 0.65M parameters).
  3. `demonstration`: one training question as an Episode exactly as rollout.rollout would build it from a perfect
     policy: the prompt (make_prompt), then per supporting passage a model turn "<think> I need to find X.
     </think>\\n<search> X </search>" (loss_mask 1) and the REAL observation (observation_ids of format_passages of
     BM25Retriever.search, loss_mask 0), then "<think> I found the answer. </think>\\n<answer> Y </answer>"
     (loss_mask 1). No EOS after </answer>: rollout's cut_turn ends the turn at the stop string. A share --wrong-frac
     of the demonstrations answer a wrong value of the same kind (another town, year, occupation or region), so the
     policy samples wrong answers too.
  4. `sft`: next-token loss on loss_mask tokens only, -sum(logp * loss_mask) / sum(loss_mask), with the log-probs of
     policy.response_logp (what GRPO trains).
  5. `sampled_em`: rollout.rollout with hf_generator(do_sample=True), group_size 4: mean exact match and the share of
     groups with mixed rewards (the groups that give GRPO a signal).

Run through lab/search_world.py (it builds the world first); the result is OUT/policy, a save_pretrained folder
(model + tokenizer) that train.py --model loads unchanged.
"""

import contextlib
import math
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machinery.policy import collate, load_policy, response_logp  # noqa: E402
from machinery.engine import hf_generator  # noqa: E402
from rollout import (STOP_STRINGS, Episode, answer_span, em_check, format_passages, make_prompt,  # noqa: E402
                     observation_ids, rollout)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 (tests/tiny.py's)
CHAT_TEMPLATE = (  # Qwen2.5's ChatML template without the default system message (tests/tiny.py's)
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN_PRETOKENIZE_REGEX = (  # Qwen2.5's (transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX)
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SEARCH_TURN = "<think> I need to find {query}. </think>\n<search> {query} </search>"
ANSWER_TURN = "<think> I found the answer. </think>\n<answer> {answer} </answer>"
GUESS_TURN = "<think> I know the answer. </think>\n<answer> {answer} </answer>"  # answers without searching


# ----------------------------------------------------------------------------------------------------------------------
# Tokenizer and model


def build_tokenizer(texts: list[str], vocab_size: int = 1500):
    """A Qwen2Tokenizer (byte-level BPE) trained on `texts`, as tests/tiny.py builds its own: eos <|im_end|>, pad
    <|endoftext|>, no bos or unk, the ChatML chat template. Any text encodes (all 256 bytes are in the vocab)."""
    import json

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, unk_token=None, bos_token=None, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"],
                         clean_up_tokenization_spaces=False, model_max_length=2048, padding_side="right")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(tokenizer, layers: int = 2, hidden: int = 128, seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM (float32) for `tokenizer`: `layers` layers of width `hidden`, 4 heads,
    MLP 4 x hidden, tied embeddings, vocab = len(tokenizer), generation_config eos <|im_end|> and pad <|endoftext|>."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM._from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# ----------------------------------------------------------------------------------------------------------------------
# Demonstrations and the supervised pass


def demonstration(row: dict, tokenizer, search, *, max_obs_tokens: int, topk: int = 3,
                  answer: str | None = None, searches: bool = True, max_searches: int | None = None) -> Episode:
    """One question row (search_world's, with metadata.supporting_titles) as the Episode a perfect policy's rollout
    would give: a search turn per supporting title (query = the title), each followed by the retrieved observation,
    then the answer turn with `answer` (default: the first gold). Model turns have loss_mask 1, observations 0;
    response_ids / loss_mask / answer_mask are [T]. search: (queries, topk) -> hits, as BM25Retriever.search.
    searches=False: no search turn, only GUESS_TURN with `answer` (a policy that answers from its own belief).
    max_searches: search the first titles only (the rollout's max_turns: a demonstration with more searches than the
    rollout allows teaches turns the policy never gets to take); None: every title."""
    prompt_ids = tokenizer.encode(make_prompt(row["question"], tokenizer), add_special_tokens=False)
    ep = Episode(row["question"], list(row["golden_answers"]), row["data_source"], group_id=0, prompt_ids=prompt_ids)

    def act(text):
        ids = tokenizer.encode(text, add_special_tokens=False)
        ep.append(ids, trained=True, answer_mask=answer_span(ids, tokenizer))
        ep.num_turns += 1

    for query in row["metadata"]["supporting_titles"][:max_searches] if searches else ():
        act(SEARCH_TURN.format(query=query))
        hits = search([query], topk)[0]
        ep.append(observation_ids(format_passages(hits), tokenizer, max_obs_tokens), trained=False)
        ep.retrieved.append(hits)
        ep.num_searches += 1
    ep.answer = row["golden_answers"][0] if answer is None else answer
    act((ANSWER_TURN if searches else GUESS_TURN).format(answer=ep.answer))
    ep.reward = em_check(ep.answer, ep.golden_answers)
    ep.text = tokenizer.decode(ep.response_ids)
    return ep


def model_turns(ep: Episode) -> list[list[int]]:
    """The model turns of an Episode: its maximal runs of loss_mask-1 ids, in order (observations separate them)."""
    turns, prev = [], 0
    for t, m in zip(ep.response_ids, ep.loss_mask):
        if m and not prev:
            turns.append([])
        if m:
            turns[-1].append(t)
        prev = m
    return turns


def demonstrations(world: dict, tokenizer, search, *, max_obs_tokens: int, wrong_frac: float,
                   seed: int) -> list[Episode]:
    """One demonstration per training question; a share wrong_frac (seeded) answers another value of the question's
    attribute (drawn from the world's values), so the policy learns to sample wrong answers sometimes."""
    rng, values, out = random.Random(seed), attribute_values(world), []
    for row in tqdm(world["train"], desc="demonstrations", unit="q", leave=False):
        answer = None
        if rng.random() < wrong_frac:
            answer = rng.choice([v for v in values[row["metadata"]["attribute"]] if v not in row["golden_answers"]])
        out.append(demonstration(row, tokenizer, search, max_obs_tokens=max_obs_tokens, answer=answer))
    return out


def attribute_values(world: dict) -> dict[str, list[str]]:
    """Every value each question attribute takes in the world, sorted: {"birthplace": towns, "birth_year": years,
    "occupation": occupations, "region": regions}."""
    values = {attr: sorted({p[attr] for p in world["people"]}) for attr in ("birthplace", "birth_year", "occupation")}
    return {**values, "region": sorted(set(world["towns"].values()))}


def redrawn_demonstrations(world: dict, tokenizer, search, *, max_obs_tokens: int, wrong_frac: float,
                           guess_frac: float, seed: int, variants: int = 4):
    """A draw(gen, n) -> [n Episodes] for `sft` whose errors are redrawn at every draw, so that they are a habit of
    the policy (sometimes answer another value; sometimes answer without searching), the same for every question,
    not a wrong answer memorised per training question (which no reward can teach away from test people).

    Per training question it builds the right demonstration, `variants` wrong ones (another value of the attribute,
    after the real searches) and `variants` guesses (GUESS_TURN, no search, a value of the attribute drawn from all
    of them, so right by chance only). A draw picks questions uniformly (`gen`), then for each, independently:
    a guess with probability guess_frac, a wrong answer with wrong_frac, the right one otherwise (`seed`).
    """
    if not (0 <= wrong_frac and 0 <= guess_frac and wrong_frac + guess_frac <= 1):
        raise ValueError(f"need wrong_frac, guess_frac >= 0 and wrong_frac + guess_frac <= 1; got {wrong_frac}, "
                         f"{guess_frac}")
    rng, values, hits = random.Random(seed), attribute_values(world), {}

    def cached(queries, topk):  # the same query always finds the same passages
        return [hits.setdefault((q, topk), search([q], topk)[0]) for q in queries]

    pool = []
    for row in tqdm(world["train"], desc="demonstrations", unit="q", leave=False):
        values_of = values[row["metadata"]["attribute"]]
        wrong = [v for v in values_of if v not in row["golden_answers"]]

        def demo(answer=None, searches=True):
            return demonstration(row, tokenizer, cached, max_obs_tokens=max_obs_tokens, answer=answer,
                                 searches=searches)

        pool.append({"right": [demo()], "wrong": [demo(v) for v in rng.sample(wrong, min(variants, len(wrong)))],
                     "guess": [demo(v, False) for v in rng.choices(values_of, k=variants)]})

    def draw(gen: torch.Generator, n: int) -> list[Episode]:
        out = []
        for i in torch.randint(len(pool), (n,), generator=gen).tolist():
            u = rng.random()
            out.append(rng.choice(pool[i]["guess" if u < guess_frac else "wrong" if u < guess_frac + wrong_frac
                                          else "right"]))
        return out

    draw.pool = pool
    return draw


def sft_loss(model, episodes: list[Episode], pad_id: int) -> torch.Tensor:
    """Mean next-token loss over the loss_mask tokens of `episodes`: -sum(logp * loss_mask) / sum(loss_mask), with
    logp [B, T] from policy.response_logp (temperature 1), i.e. what GRPO's ratio is made of."""
    batch = collate(episodes, pad_id)
    logp, _ = response_logp(model, batch, slice(None), 1.0, model.config.vocab_size)  # [B, T]
    mask = batch["loss_mask"].to(logp.device)  # [B, T]
    return -(logp * mask).sum() / mask.sum().clamp(min=1.0)


def sft(model, demos, pad_id: int, steps: int, *, batch_size: int = 16, lr: float = 2e-3,
        seed: int = 0, progress: bool = True, amp=contextlib.nullcontext) -> list[float]:
    """AdamW on sft_loss over batches of `batch_size` demonstrations drawn at random (seeded); lr warms up linearly
    over the first 5% of the steps, then decays by a cosine to 10%. Returns the loss of every step ([steps]).
    demos: a list of Episodes (drawn uniformly), or a draw(gen, n) function (redrawn_demonstrations).
    amp: a function giving a fresh context for each forward pass (policy.autocast: bf16 over fp32 weights)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else
                                              0.1 + 0.45 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))))
    gen, losses = torch.Generator().manual_seed(seed), []
    bar = tqdm(range(steps), desc="warm start", unit="step", disable=not progress)
    for _ in bar:
        batch = demos(gen, batch_size) if callable(demos) else \
            [demos[i] for i in torch.randint(len(demos), (batch_size,), generator=gen).tolist()]
        with amp():
            loss = sft_loss(model, batch, pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return losses


def loss_curve(losses: list[float]) -> str:
    """The mean loss of each tenth of a run (the last part may be shorter), e.g. "2.104 1.310 ... 0.412"."""
    tenth = max(1, len(losses) // 10)
    return " ".join(f"{sum(losses[i:i + tenth]) / len(losses[i:i + tenth]):.3f}" for i in range(0, len(losses), tenth))


# ----------------------------------------------------------------------------------------------------------------------
# Measuring the warm start as RL will see it


def sampled_em(model, tokenizer, rows: list[dict], search, *, group_size: int = 4, max_turns: int = 2,
               max_new_tokens: int = 48, max_obs_tokens: int = 120, seed: int = 0) -> dict:
    """Sampled rollouts of `rows` (rollout.rollout + hf_generator(do_sample=True), temperature 1, top_p 0.95, as
    train.py samples): mean EM reward overall and per data_source, the share of groups of `group_size` whose rewards
    are not all equal (GRPO learns from those only), executed searches per trajectory, and the share of trajectories
    that gave an <answer> (a policy that never uses the tags gets no reward to learn from)."""
    torch.manual_seed(seed)
    generate = hf_generator(model, tokenizer, stop_strings=STOP_STRINGS, max_new_tokens=max_new_tokens,
                            do_sample=True)
    eps = rollout(generate, tokenizer, rows, search, group_size=group_size, max_turns=max_turns,
                  max_obs_tokens=max_obs_tokens)
    reward = torch.tensor([e.reward for e in eps])  # [B]
    groups = reward.view(-1, group_size)  # [prompts, G]
    out = {"em": reward.mean().item(), "mixed": (groups.max(1).values != groups.min(1).values).float().mean().item(),
           "searches": sum(e.num_searches for e in eps) / len(eps),
           "answers": sum(e.answer is not None for e in eps) / len(eps)}
    for source in sorted({e.data_source for e in eps}):
        out[source] = sum(e.reward for e in eps if e.data_source == source) / sum(e.data_source == source for e in eps)
    return out


def run(world: dict, texts: list[str], retriever, out: Path, *, seed: int = 0, sft_steps: int = 1500,
        wrong_frac: float = 0.3, max_obs_tokens: int = 120, eval_questions: int = 64, batch_size: int = 8,
        lr: float = 3e-3, redraw: bool = False, guess_frac: float = 0.0):
    """Tokenizer (a BPE trained on `texts`: search_world.tokenizer_texts), model, demonstrations, supervised pass,
    save_pretrained to `out`, then the sampled EM of the saved policy (loaded back with policy.load_policy, as
    train.py loads it) on train and test questions. redraw: errors redrawn at every draw (redrawn_demonstrations,
    with guess_frac), else one fixed demonstration per question."""
    t0 = time.time()
    random.seed(seed)
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(texts)
    model = build_model(tokenizer, seed=seed)
    if redraw:
        demos = redrawn_demonstrations(world, tokenizer, retriever.search, max_obs_tokens=max_obs_tokens,
                                       wrong_frac=wrong_frac, guess_frac=guess_frac, seed=seed)
        every = [d for kinds in demos.pool for variants in kinds.values() for d in variants]
        what = (f"{len(demos.pool)} questions x (right, wrong, guess) demonstrations, redrawn per draw: wrong "
                f"{wrong_frac:g}, guess without searching {guess_frac:g}")
    else:
        demos = every = demonstrations(world, tokenizer, retriever.search, max_obs_tokens=max_obs_tokens,
                                       wrong_frac=wrong_frac, seed=seed)
        what = f"{len(demos)} demonstrations ({sum(d.reward == 0 for d in demos)} answer wrong)"
    turn_len = max(len(t) for d in every for t in model_turns(d))
    lengths = [len(d.prompt_ids) + len(d.response_ids) for d in every]
    print(f"tokenizer: {len(tokenizer)} ids | model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params | "
          f"{what}, {min(lengths)}-{max(lengths)} tokens, model turns <= {turn_len} tokens | {time.time() - t0:.1f}s")
    t1 = time.time()
    losses = sft(model, demos, tokenizer.pad_token_id, sft_steps, batch_size=batch_size, lr=lr, seed=seed)
    print(f"warm start: {sft_steps} steps x {batch_size} demonstrations in {time.time() - t1:.0f}s | loss per tenth "
          f"of the run: {loss_curve(losses)}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"saved {out}")
    policy, tok, _ = load_policy(str(out), device="cpu")
    for split in ("train", "test"):
        t2 = time.time()
        m = sampled_em(policy, tok, world[split][:eval_questions], retriever.search, max_obs_tokens=max_obs_tokens,
                       seed=seed)
        print(f"sampled EM on {min(eval_questions, len(world[split]))} {split} questions x 4: {m['em']:.3f} "
              f"(1-hop {m.get('world_1hop', float('nan')):.3f}, 2-hop {m.get('world_2hop', float('nan')):.3f}) | "
              f"mixed-reward groups {m['mixed']:.2f} | searches/traj {m['searches']:.2f} | {time.time() - t2:.0f}s")
