"""What the concepts at the top level run on, kept out of their way.

The root holds the paper (retriever.py, rollout.py, grpo.py, llds.py, train.py, evaluate.py, and
probe.py, its instrument); this package holds what they need and the paper does not discuss:

    data.py        question rows and passage corpora from .jsonl / .parquet files or the hub
    bm25.py        the BM25 index behind retriever.py (bm25_numba/: its compiled top-k search)
    engine.py      decoding engines for rollout's generate(contexts) -> new ids seam (hf, hf-kv, cb)
    policy.py      loading a model, its log-prob passes, autocast
    checkpoint.py  resumable runs: atomic saves, resume, stop requests
    fsdp.py        sharding over ranks (torch FSDP2)
    memory.py      the memory plan: rows per generation batch and per update micro-batch
    paper.py       the paper's reported figures, for comparisons
    calibadv.py    CalibAdv's turn scores from a rollout's episodes (grpo.calibadv_advantages uses them)
    tracking.py    metrics to tensorboard / wandb

Its modules import each other and never a file of the root. Demos run as modules: `python -m
machinery.engine`.
"""
