"""A tiny, offline Qwen2-style tokenizer + model for the unit tests.

Nothing is downloaded. The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on a built-in English
corpus that contains the Search-R1 prompt, its tags and question/document-like text; the model is a randomly
initialised 2-layer ``Qwen2ForCausalLM``.

API
---
``build_tokenizer()``               -> ``Qwen2Tokenizer`` (a ``PreTrainedTokenizerFast``): 800 ids, ChatML template,
                                       eos ``<|im_end|>`` (2), pad ``<|endoftext|>`` (0), ``<|im_start|>`` (1), no bos/unk
``build_model(tok, seed, dropout)`` -> ``Qwen2ForCausalLM`` (float32, eval mode, vocab = ``len(tok) + 16``)
``save_tiny(path, seed)``           -> ``str(path)``: a folder loadable with ``AutoTokenizer`` / ``AutoModelForCausalLM``

From the command line, ``python tests/tiny.py OUT_DIR`` saves the same tokenizer + model into OUT_DIR (the README's
offline quick start trains it; its weights are random, so its answers are noise).

The BPE training (~0.03 s) runs once per process and is cached (``functools.lru_cache``); every ``build_tokenizer()``
call returns a *fresh* tokenizer object built from the cached vocab/merges (~1 ms), so callers may freely mutate their
copy (e.g. ``tok.padding_side = "left"``) without affecting other tests. The vocabulary is identical in every call and
every process.

The pipeline is exactly Qwen2.5's (NFC normalizer, Qwen's pre-tokenization regex, byte-level BPE). So, as with the real
Qwen tokenizer: any text encodes; ``decode(encode(s)) == s`` for NFC text (non-NFC input such as ``"e\u0301"`` comes
back composed); the Search-R1 tags (``<think>``, ``<search>``, ``<answer>``, ``<information>`` and closing tags) are
ordinary text split into several BPE pieces, NOT special tokens; only ``<|endoftext|>``, ``<|im_start|>`` and
``<|im_end|>`` are special; there is no BOS and ``add_special_tokens=True`` adds nothing.
Ids ``>= len(tok)`` exist in the model's lm_head but decode silently to ``""``.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from pathlib import Path

import torch

__all__ = [
    "SPECIAL_TOKENS",
    "CHAT_TEMPLATE",
    "PROMPT_TEMPLATE",
    "VOCAB_SIZE_TARGET",
    "EXTRA_MODEL_VOCAB",
    "corpus",
    "build_tokenizer",
    "build_model",
    "save_tiny",
]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE_TARGET = 800  # BPE trainer target (incl. 256 byte symbols and the 3 special tokens)
EXTRA_MODEL_VOCAB = 16  # model vocab = len(tokenizer) + this, like Qwen2.5's padded lm_head

# Qwen2.5's ChatML template, simplified: no default system message, no tool calls.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Search-R1 "base" prompt (scripts/data_process/qa_search_train_merge.py, make_prefix), typo "your want" included;
# ends with "\n" after the question.
PROMPT_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

# --------------------------------------------------------------------------------------------------------------------
# Built-in corpus
# --------------------------------------------------------------------------------------------------------------------

_FACTS = [
    # (subject, question, answer, title, document sentence)
    ("France", "what is the capital of france", "Paris", "Paris",
     "Paris is the capital and most populous city of France, on the river Seine."),
    ("China", "what is the capital of china", "Beijing", "Beijing",
     "Beijing is the capital of the People's Republic of China and one of the oldest cities in the world."),
    ("Japan", "what is the capital of japan", "Tokyo", "Tokyo",
     "Tokyo is the capital of Japan and the seat of the Japanese government."),
    ("Italy", "what is the capital of italy", "Rome", "Rome",
     "Rome is the capital city of Italy and was the centre of the Roman Empire."),
    ("Hamlet", "who wrote the play hamlet", "William Shakespeare", "Hamlet",
     "Hamlet is a tragedy written by William Shakespeare sometime between 1599 and 1601."),
    ("Pride and Prejudice", "who wrote pride and prejudice", "Jane Austen", "Pride and Prejudice",
     "Pride and Prejudice is an 1813 novel of manners by the English writer Jane Austen."),
    ("the telephone", "who invented the telephone", "Alexander Graham Bell", "Telephone",
     "Alexander Graham Bell was awarded the first United States patent for the telephone in 1876."),
    ("the Eiffel Tower", "when was the eiffel tower built", "1889", "Eiffel Tower",
     "The Eiffel Tower was built from 1887 to 1889 as the entrance arch of the World's Fair."),
    ("the Moon landing", "who was the first person to walk on the moon", "Neil Armstrong", "Apollo 11",
     "Apollo 11 landed on the Moon in 1969; Neil Armstrong was the first person to step onto the surface."),
    ("water", "what is the chemical formula of water", "H2O", "Water",
     "Water is an inorganic compound with the chemical formula H2O."),
    ("the Amazon", "what is the longest river in south america", "Amazon River", "Amazon River",
     "The Amazon River in South America is the largest river by discharge volume of water in the world."),
    ("Mount Everest", "what is the highest mountain on earth", "Mount Everest", "Mount Everest",
     "Mount Everest is Earth's highest mountain above sea level, located in the Himalayas."),
    ("the Mona Lisa", "who painted the mona lisa", "Leonardo da Vinci", "Mona Lisa",
     "The Mona Lisa is a half-length portrait painting by the Italian artist Leonardo da Vinci."),
    ("gold", "what is the chemical symbol for gold", "Au", "Gold",
     "Gold is a chemical element with the symbol Au and atomic number 79."),
    ("the Beatles", "which city did the beatles come from", "Liverpool", "The Beatles",
     "The Beatles were an English rock band formed in Liverpool in 1960."),
    ("Canada", "what is the capital of canada", "Ottawa", "Ottawa",
     "Ottawa is the capital city of Canada, located on the south bank of the Ottawa River."),
    ("the Pacific", "what is the largest ocean", "Pacific Ocean", "Pacific Ocean",
     "The Pacific Ocean is the largest and deepest of Earth's five oceanic divisions."),
    ("relativity", "who developed the theory of relativity", "Albert Einstein", "Theory of relativity",
     "The theory of relativity usually encompasses two interrelated physics theories by Albert Einstein."),
    ("Brazil", "what language is spoken in brazil", "Portuguese", "Brazil",
     "Brazil is the largest country in South America and its official language is Portuguese."),
    ("penicillin", "who discovered penicillin", "Alexander Fleming", "Penicillin",
     "Penicillin was discovered in 1928 by the Scottish scientist Alexander Fleming."),
    ("the Titanic", "in what year did the titanic sink", "1912", "Titanic",
     "RMS Titanic sank in the North Atlantic Ocean on 15 April 1912 after striking an iceberg."),
    ("Australia", "what is the capital of australia", "Canberra", "Canberra",
     "Canberra is the capital city of Australia, founded following the federation of the colonies."),
    ("the Nile", "what is the longest river in africa", "Nile", "Nile",
     "The Nile is a major north-flowing river in northeastern Africa and among the longest rivers."),
    ("Harry Potter", "who is the author of harry potter", "J. K. Rowling", "Harry Potter",
     "Harry Potter is a series of seven fantasy novels written by British author J. K. Rowling."),
    ("the Olympic Games", "where were the first modern olympic games held", "Athens", "1896 Summer Olympics",
     "The 1896 Summer Olympics were the first international Olympic Games held in modern history, in Athens."),
    ("Germany", "what is the currency of germany", "Euro", "Germany",
     "Germany is a country in Central Europe; its currency is the euro."),
    ("the Great Wall", "in which country is the great wall", "China", "Great Wall of China",
     "The Great Wall of China is a series of fortifications built across the historical northern borders of China."),
    ("Spain", "what is the capital of spain", "Madrid", "Madrid",
     "Madrid is the capital and most populous city of Spain."),
    ("the piano", "who invented the piano", "Bartolomeo Cristofori", "Piano",
     "The piano was invented in Italy by Bartolomeo Cristofori around the year 1700."),
    ("DNA", "who discovered the structure of dna", "Watson and Crick", "DNA",
     "The double helix structure of DNA was described by James Watson and Francis Crick in 1953."),
]

_FILLER = [
    "The quick brown fox jumps over the lazy dog.",
    "Let me think about this step by step before I answer.",
    "I need more information, so I will search for it.",
    "The search results show that the answer is clear.",
    "Based on the information above, I can now answer the question.",
    "My previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.",
    "This is a simple sentence with numbers 1, 2, 3 and 42, and punctuation: commas, periods; colons!",
    "Questions about history, science, geography and literature are common in open-domain QA datasets.",
    "Natural Questions, TriviaQA, PopQA, HotpotQA, 2WikiMultiHopQA, Musique and Bamboogle are QA benchmarks.",
    "The exact match reward is one if the normalized prediction equals a golden answer, and zero otherwise.",
    "A café in Zürich serves crème brûlée – naïve résumé, façade, São Paulo, Málaga, Kraków.",
    "Hello world! How are you today? I am fine, thank you.",
]


def corpus() -> list[str]:
    """The built-in training text (a few hundred lines, deterministic)."""
    lines: list[str] = []
    lines.append(PROMPT_TEMPLATE.format(question="What is the capital of France?"))
    for subject, q, a, title, doc in _FACTS:
        question = q[0].upper() + q[1:] + "?"
        prompt = PROMPT_TEMPLATE.format(question=question)
        lines.append(prompt)
        lines.append(question)
        lines.append(f"Q: {question} A: {a}")
        lines.append(doc)
        lines.append(f"Doc 1(Title: {title}) {doc}")
        lines.append(f"<think> I need to find out {q}. </think>")
        lines.append(f"<think> I do not know much about {subject}, so I will search. </think>\n<search> {q} </search>")
        lines.append(f"<search> {title} </search>")
        lines.append(f"\n\n<information>Doc 1(Title: {title}) {doc}\nDoc 2(Title: {subject}) {doc}\n"
                     f"Doc 3(Title: {a}) {a} is related to {subject}.</information>\n\n")
        lines.append(f"<think> The documents say that the answer is {a}. </think>\n<answer> {a} </answer>")
        lines.append(f"<answer> {a} </answer>")
        lines.append(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
                     f"<think> {question} </think>\n<search> {title} </search><|im_end|>")
    # A few combinations for more question-like variety.
    for (s1, q1, a1, t1, _), (s2, q2, a2, t2, _) in itertools.islice(
            itertools.combinations(_FACTS, 2), 0, None, 7):
        lines.append(f"Is {a1} connected to {s2}? Which came first, {t1} or {t2}?")
        lines.append(f"<think> First I search for {t1}, then for {t2}. </think>\n<search> {t1} and {t2} </search>")
    lines.extend(_FILLER * 3)
    return lines


# --------------------------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------------------------

# Qwen2.5's pre-tokenization regex (same as transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX).
_QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


@functools.lru_cache(maxsize=1)
def _trained_vocab_merges() -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]:
    """Train the byte-level BPE once per process; return (vocab items, merges), both immutable.

    The normalizer / pre-tokenizer / decoder are exactly Qwen2.5's (NFC, Qwen regex split, byte-level), because
    transformers 5 loads a saved folder whose config.json says ``model_type: qwen2`` as ``Qwen2Tokenizer``, which
    rebuilds that pipeline from vocab + merges and ignores the one stored in tokenizer.json.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE_TARGET,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,  # ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes -> any text encodes
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = tuple(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    merges = tuple(tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"])
    return vocab, merges


def build_tokenizer():
    """Return a fresh ``Qwen2Tokenizer`` (a ``PreTrainedTokenizerFast``) over the cached tiny BPE vocabulary.

    Same vocabulary on every call (and in every process). Each call returns a new object (~2 ms), so per-test mutation
    (``padding_side``, added tokens, ...) does not leak between tests.
    """
    from transformers import Qwen2Tokenizer

    vocab, merges = _trained_vocab_merges()
    tok = Qwen2Tokenizer(
        vocab=dict(vocab),
        merges=list(merges),
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,  # otherwise decode(" .") -> "." and round-trips break
        model_max_length=2048,
        padding_side="right",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


# --------------------------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------------------------

def build_model(tokenizer, seed: int = 0, dropout: float = 0.0, **shape):
    """A randomly initialised 2-layer ``Qwen2ForCausalLM`` (float32, eval mode) matching ``tokenizer``.

    The vocab is ``len(tokenizer) + 16``: ids >= len(tokenizer) exist in the lm_head but not in the tokenizer (as in
    Qwen2.5), so tests can check such ids are never sampled. shape: Qwen2Config fields that replace the tiny ones
    (gpu/gpu_check.py builds Qwen2.5-0.5B and 3B with gpu/memory_plan.py's CONFIGS); a vocab_size
    below len(tokenizer) is a ValueError.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    pad_id = tokenizer.pad_token_id
    eos_id = tokenizer.eos_token_id
    # Qwen2.5 has no BOS token in the tokenizer but bos_token_id = <|endoftext|> in config.json; mirror that.
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad_id
    config = Qwen2Config(**{
        "vocab_size": len(tokenizer) + EXTRA_MODEL_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "attention_dropout": dropout,
        "tie_word_embeddings": False,
        **shape,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    })
    if config.vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size {config.vocab_size} < the tokenizer's {len(tokenizer)} tokens")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM._from_config(config, dtype=torch.float32)
    model.eval()
    gc = model.generation_config
    gc.eos_token_id = eos_id
    gc.pad_token_id = pad_id
    gc.bos_token_id = bos_id
    return model


def save_tiny(path, seed: int = 0) -> str:
    """Build the tokenizer and model and ``save_pretrained`` both into folder ``path``; return ``str(path)``."""
    path = Path(path)
    os.makedirs(path, exist_ok=True)
    tok = build_tokenizer()
    model = build_model(tok, seed=seed)
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return str(path)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Save the tiny random 2-layer Qwen2 model + tokenizer of the tests.")
    parser.add_argument("out_dir", help="folder to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    cli = parser.parse_args()
    print(save_tiny(cli.out_dir, seed=cli.seed))
