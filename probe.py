"""The LLD probes: the log-likelihood of *fixed* responses as the policy trains (v2 Def. 4.1, Eqs.
2-3, Fig. 3a, 5).

A correct response y+ of x suffers lazy likelihood displacement (LLD) when an update lowers log
pi(y+ | x) (Def. 4.1); the spiral is E Delta <= eps < 0 from some step on, falling further (Def.
A.3). train.py's diag/* keys measure the likelihood of each step's *own* samples, which vanish once
the reward is 0. These two probes hold the responses fixed:
  - FixedProbe (every run): at step 0 the starting policy's trajectories on --probe-questions
    training questions (group_size each, ids as sampled, in a random stream of their own) are frozen
    in OUT_DIR/probe_rank{R}.json; every --probe-every steps their teacher-forced log-likelihood
    under the current policy is logged as probe/* keys (probe_stats): defined at every step,
    whatever the policy samples now.
  - delta_probe (Fig. 3a, Eq. 3): from one set of weights, for each mixed group (correct and
    incorrect answers), k updates of the GRPO loss (+ lambda x LLDS) on that group alone; Delta(x) =
    the mean change of its correct responses' sequence log-likelihood. LLDS is inert on a first
    update (logp = old_logp: no token has lost anything).

    python probe.py --model RUN_OR_MODEL --train-data Q.jsonl --corpus C.jsonl --questions 48 \
        --k 1 2 4 --llds 0 0.2
"""

import argparse
import contextlib
import copy
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from grpo import group_advantages, grpo_loss
from llds import action_segments, llds_loss
from machinery.checkpoint import atomic_write
from machinery.policy import batch_logp, collate, response_logp

# questions per rollout call when sampling the Delta(x) probe's groups: a tick of its progress bar
SAMPLE_CHUNK = 16
SETS = ("correct", "incorrect")
PARTS = {"first": lambda seg, ans: seg == 1, "later": lambda seg, ans: seg > 1,
         "answer": lambda seg, ans: ans > 0}


def probe_stats(logp, loss_mask, answer_mask, reward, start: dict | None = None,
                prefix: str = "probe/") -> dict:
    """The log-likelihood of fixed responses, by set and by part. logp, loss_mask, answer_mask [B,
    T] (1 = a model token; the final <answer> span); reward [B] (1 = correct). Per set s in
    (correct, incorrect), floats in nats, None for an empty set or part:
      {prefix}logp_s: token mean over the set's model tokens (nats/token); {prefix}seqlogp_s: mean
        over its responses
      of the sequence sum (nats/response); {prefix}logp_s_first / _later / _answer: token means over
        the first action
      (before the first observation), the later actions, the final answer span (Fig. 5);
        {prefix}n_s: responses;
      with `start` (this function's output at step 0), {prefix}delta_s = seqlogp_s - start's (Def.
        A.3's E Delta,
      nats/response) and {prefix}dlogp_s = logp_s - start's (nats/token).
    """
    # seg [B, T]: 1 on the first action, 2.. later
    mask, seg = loss_mask.float(), action_segments(loss_mask.float())
    out = {}
    for name in SETS:
        # [B] responses of the set
        w = ((reward == 1) == (name == "correct")).float() * (mask.sum(-1) > 0).float()
        m = mask * w[:, None]
        n, tokens = w.sum().item(), m.sum().item()
        out[f"{prefix}n_{name}"] = int(n)
        out[f"{prefix}logp_{name}"] = (logp * m).sum().item() / tokens if tokens else None
        out[f"{prefix}seqlogp_{name}"] = ((logp * m).sum(-1)).sum().item() / n if n else None
        for part, pick in PARTS.items():
            pm = m * pick(seg, answer_mask).float()
            out[f"{prefix}logp_{name}_{part}"] = (
                (logp * pm).sum().item() / pm.sum().item() if pm.sum() else None
            )
        if start is not None:
            for key, change in (("seqlogp", "delta"), ("logp", "dlogp")):
                a, b = out[f"{prefix}{key}_{name}"], start.get(f"{prefix}{key}_{name}")
                out[f"{prefix}{change}_{name}"] = a - b if a is not None and b is not None else None
    return out


def _frozen(episodes) -> dict:
    return {
        k: [getattr(e, k) for e in episodes]
        for k in ("prompt_ids", "response_ids", "loss_mask", "answer_mask", "reward", "group_id")
    }


def _batch(frozen: dict, pad_id: int):
    """collate() of frozen trajectories, and their rewards [B]."""
    from types import SimpleNamespace

    rows = [SimpleNamespace(**dict(zip(frozen, v))) for v in zip(*frozen.values())]
    return collate(rows, pad_id), torch.tensor(frozen["reward"], dtype=torch.float32)


class FixedProbe:
    """The fixed probe responses of one rank (module docstring), scored by `model` (the run's
    policy: the same object once sharded) under `amp` (policy.autocast's function).
    FixedProbe(...)(step) -> the probe/* metrics of this step (every rank's responses gathered:
    probe_stats) and perf/probe_s, or {} off-step or when off."""

    def __init__(self, model, amp, frozen: dict | None, start: dict, every: int, pad_id: int,
                 micro: int,
                 temperature: float, vocab_size: int):
        self.model, self.amp, self.frozen, self.start, self.every, self.micro = (
            model,
            amp,
            frozen,
            start,
            every,
            micro,
        )
        self.temperature, self.vocab_size = temperature, vocab_size
        self.batch = _batch(frozen, pad_id) if frozen else None

    @classmethod
    def start_run(cls, model, tokenizer, rows: list[dict], generate, search, *, path: Path,
                  questions: int,
                  every: int, micro: int, temperature: float, amp, amp0, rank: int = 0,
                  world: int = 1,
                  resumed: bool = False, warn=print, **sample):
        """The probe of a train.py run: read back from `path` (OUT_DIR/probe_rank{rank}.json) when
        resuming, else sampled now by `generate` (rollout's seam, over the starting policy `model`,
        not yet sharded) and `search`: n = min(questions, len(rows)) // world x world training
        questions, the same for every run of these questions (a fixed choice and a random stream of
        their own: training's samples and metrics are unchanged by the probe), rank r taking every
        world-th, each sampled as rollout(**sample) says (group_size, max_turns, max_obs_tokens,
        topk); then their log-likelihood at step 0 (the `start` of probe/delta_*) under `amp0`,
        written with them. Every `every` steps after, scored in micro-batches of `micro` rows at
        `temperature` under `amp` (the run's policy.autocast functions). Off (questions 0, or a
        resumed run without a probe file: warned) -> a probe that logs nothing."""
        from rollout import rollout

        vocab, n = len(tokenizer), min(questions, len(rows)) // world * world
        if resumed or not n:
            if n and not path.is_file():
                warn(f"no {path.name} in the resumed run: probe/* not logged (it must be sampled "
                     f"at step 0)")
            saved = (
                json.loads(path.read_text())
                if n and path.is_file()
                else {"frozen": None, "start": {}}
            )
            return cls(model, amp, saved["frozen"], saved["start"], every, tokenizer.pad_token_id,
                       micro,
                       temperature, vocab)
        chosen = np.random.default_rng(0).choice(len(rows), n, replace=False).tolist()[rank::world]
        device = next(model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), amp0():
            torch.manual_seed(1_000_003 + rank)
            episodes = rollout(generate, tokenizer, [rows[i] for i in chosen], search, **sample)
        probe = cls(model, amp, _frozen(episodes), {}, every, tokenizer.pad_token_id, micro,
                    temperature, vocab)
        with amp0():
            probe.start = probe.measure()
        atomic_write(path, json.dumps({"frozen": probe.frozen, "start": probe.start}))
        return probe

    def measure(self) -> dict:
        """probe_stats of the frozen responses under the model now (no grad), every rank's rows
        gathered."""
        from machinery.fsdp import gather_rows

        batch, reward = self.batch
        # [B, T]
        logp = batch_logp(self.model, batch, self.micro, self.temperature, self.vocab_size)
        logp, mask, ans, reward = (
            gather_rows(x)
            for x in (logp, batch["loss_mask"], batch["answer_mask"], reward[:, None])
        )
        return probe_stats(logp, mask, ans, reward[:, 0], self.start or None)

    def __call__(self, step: int) -> dict:
        if self.batch is None or step % self.every:
            return {}
        t = time.time()
        with self.amp():
            out = self.measure()
        return {**out, "perf/probe_s": time.time() - t}


# --------------------------------------------------------------------------------------------------
# Delta(x): one group, k updates, the change of its responses' likelihood (Fig. 3a)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% for z = 1.96) of a proportion k / n; (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def group_delta(model, batch, reward, *, k: int, llds: float, lr: float, optimizer: str = "adamw",
                temperature: float = 1.0, vocab_size: int, clip_eps: float = 0.2, amp=None):
    """Per response of ONE group, the change of its sequence log-likelihood after k updates on that
    group alone: (Delta [G] = sum_t (log pi_k - log pi_0)(y_t) over model tokens, nats per response
    (Eq. 2); the per-token change [G, T], 0 off the model tokens). The loss of each update is the
    GRPO policy loss (PPO clip, token mean; no KL, no entropy term: plain GRPO) + llds x L_LLDS
    (action gate, the code's norm), the advantages the group's own (Eq. 1), the old log-probs
    pi_0's; the optimizer is a fresh AdamW (the training defaults: betas 0.9/0.999, weight decay
    0.01) or SGD at lr. `amp`: policy.autocast's function (None: fp32). The model's weights are
    restored before returning. batch: collate() of the group's G responses; reward [G].
    (group_delta_after with ks=(k,).)"""
    return group_delta_after(model, batch, reward, ks=(k,), llds=llds, lr=lr, optimizer=optimizer,
                             temperature=temperature, vocab_size=vocab_size, clip_eps=clip_eps,
                             amp=amp)[0]


def group_delta_after(model, batch, reward, *, ks, llds: float, lr: float, optimizer: str = "adamw",
                      temperature: float = 1.0, vocab_size: int, clip_eps: float = 0.2,
                      amp=None) -> list:
    """group_delta for every k in ks in one chain of max(ks) updates, the change measured after the
    k-th: the same numbers as separate calls (the k-th update of a longer chain starts from the same
    weights and optimizer state, and measuring changes neither), in max(ks) updates instead of
    sum(ks). Returns [(Delta [G], change [G, T])], one per k, in the order of ks."""
    amp = amp or (lambda cache=True: contextlib.nullcontext())
    saved = copy.deepcopy(model.state_dict())
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999),
                            weight_decay=0.01) if optimizer == "adamw" \
        else torch.optim.SGD(params, lr=lr)
    rows, mask = slice(None), batch["loss_mask"]
    adv = group_advantages(reward, [0] * len(reward))  # [G]
    got = {}
    try:
        with amp():
            old = batch_logp(model, batch, len(reward), temperature, vocab_size)  # [G, T]
        for step in range(1, max(ks) + 1):
            with amp(cache=False):
                logp, _ = response_logp(model, batch, rows, temperature, vocab_size)
                dev = logp.device
                pg, _ = grpo_loss(logp, old.to(dev), None, adv.to(dev), mask.to(dev),
                                  clip_eps=clip_eps,
                                  kl_coef=0.0, entropy_coef=0.0)
                reg, _ = llds_loss(logp, old.to(dev), adv.to(dev), mask.to(dev))
            opt.zero_grad(set_to_none=True)
            (pg + llds * reg).backward()
            opt.step()
            if step in ks:
                with amp():
                    after = batch_logp(model, batch, len(reward), temperature, vocab_size)
                got[step] = (((after - old) * mask).sum(-1), (after - old) * mask)  # [G], [G, T]
        return [got[k] for k in ks]
    finally:
        model.load_state_dict(saved)


def is_mixed(group: dict) -> bool:
    """Some of the group's answers right, some wrong: the groups GRPO learns from (the others have
    advantage 0)."""
    return 0 < sum(r == 1 for r in group["reward"]) < len(group["reward"])


def group_deltas(model, tokenizer, group: dict, *, ks=(1, 2, 4), lambdas=(0.0, 0.2), lr: float,
                 optimizer: str = "adamw", temperature: float = 1.0, amp=None) -> dict:
    """One mixed group's changes for every (k, lambda): {"k,lambda": {set or set_part: nats per
    response}} with set in (correct, incorrect) the mean of group_delta over the set's responses and
    part in (first, later, answer) the token sums of the change over the first action, the later
    actions, the final answer span."""
    batch, reward = _batch(group, tokenizer.pad_token_id)
    seg, ans = action_segments(batch["loss_mask"]), batch["answer_mask"]
    out = {}
    for lam in lambdas:  # one chain of updates per lambda, measured after each k
        chain = group_delta_after(model, batch, reward, ks=tuple(ks), llds=lam, lr=lr,
                                  optimizer=optimizer,
                                  temperature=temperature, vocab_size=len(tokenizer), amp=amp)
        for k, (delta, tok) in zip(ks, chain):
            cell = out[f"{k},{lam:g}"] = {}
            for s in SETS:
                w = (reward == 1) == (s == "correct")
                cell[s] = delta[w].mean().item()
                for q, pick in PARTS.items():
                    cell[f"{s}_{q}"] = (tok * pick(seg, ans).float()).sum(-1)[w].mean().item()
    return out


def summarize(results: list[dict], groups: int, ks, lambdas) -> list[dict]:
    """The Fig. 3a table of group_deltas' results (one per mixed group): per (k, lambda), the mixed
    groups, the fraction with Delta(x) < 0 (Delta(x): the group's mean change over its correct
    responses) and its Wilson 95% interval, and the means over groups of each set's and part's
    change (delta_correct, delta_incorrect_first, ...)."""
    out = []
    for k in ks:
        for lam in lambdas:
            cells = [r[f"{k},{lam:g}"] for r in results]
            neg = sum(c["correct"] < 0 for c in cells)
            lo, hi = wilson(neg, len(cells))
            keys = [f"{s}{p}" for s in SETS for p in ("", *(f"_{q}" for q in PARTS))]
            out.append(
                {
                    "k": k,
                    "llds": lam,
                    "groups": groups,
                    "mixed": len(cells),
                    "frac_neg": neg / len(cells) if cells else None,
                    "ci95": [lo, hi],
                    **{
                        f"delta_{key}": float(np.mean([c[key] for c in cells])) if cells else None
                        for key in keys
                    },
                }
            )
    return out


def delta_probe(model, tokenizer, groups: list[dict], *, ks=(1, 2, 4), lambdas=(0.0, 0.2),
                lr: float,
                optimizer: str = "adamw", temperature: float = 1.0, amp=None,
                done: list[dict] | None = None,
                on_group=None) -> list[dict]:
    """Fig. 3a's probe over `groups` (frozen trajectories of one question each, _frozen()), keeping
    the mixed ones: summarize() of group_deltas() of each. `done`: the results of the first mixed
    groups from an earlier, stopped call (skipped); on_group(result) is called after each group (to
    save it). Returns one dict per (k, lambda)."""
    from tqdm import tqdm

    mixed, results = [g for g in groups if is_mixed(g)], list(done or [])
    for g in tqdm(mixed[len(results):], desc="mixed groups", initial=len(results), total=len(mixed),
                  disable=len(mixed) < 2):
        results.append(
            group_deltas(
                model,
                tokenizer,
                g,
                ks=ks,
                lambdas=lambdas,
                lr=lr,
                optimizer=optimizer,
                temperature=temperature,
                amp=amp,
            )
        )
        if on_group:
            on_group(results[-1])
    return summarize(results, len(groups), ks, lambdas)


def read_saved_groups(path: Path) -> dict:
    """A stopped probe's OUT.groups.json ({"args", "groups", "rng"}). Raises SystemExit with one
    line naming the file when it is not that (damaged, not UTF-8, or another program's)."""
    try:
        saved = json.loads(path.read_bytes().decode("utf-8"))
        if isinstance(saved, dict) and isinstance(saved.get("args"),
                                                  dict) and isinstance(saved.get("groups"), list):
            return saved
    except (UnicodeDecodeError, ValueError):
        pass
    raise SystemExit(f"error: {path}: not a stopped probe's saved groups (damaged?): delete it to "
                     f"sample again")


def read_finished(path: Path, ks, lambdas) -> list[dict]:
    """The finished groups a stopped probe kept in OUT.partial.jsonl: its lines up to the first that
    is not one (a line a kill cut, another program's, or not UTF-8), which and every line after it
    are dropped (with a note) and the file rewritten with the rest."""
    done, lines = [], path.read_bytes().split(b"\n")
    for line in lines:
        try:
            r = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            break
        if not (
            isinstance(r, dict)
            and all(isinstance(r.get(f"{k},{lam:g}"), dict) for k in ks for lam in lambdas)
        ):
            break
        done.append(r)
    if dropped := sum(bool(x.strip()) for x in lines[len(done):]):
        print(f"{path}: {dropped} line(s) from line {len(done) + 1} on are not a finished group "
              f"(cut by a kill, or "
              f"not this probe's): those groups are probed again")
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in done))
    return done


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True,
                    help="a model folder, a checkpoint or a train.py run folder")
    ap.add_argument("--train-data", required=True,
                    help="questions (.jsonl): the first --questions are probed")
    ap.add_argument("--corpus", required=True, help="passages (.jsonl) for the searches")
    ap.add_argument("--questions", type=int, default=48,
                    help="questions, group-size rollouts each (default 48)")
    ap.add_argument("--group-size", type=int, default=5, help="rollouts per question (default 5)")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4],
                    help="updates per group (default 1 2 4)")
    ap.add_argument("--llds", type=float, nargs="+", default=[0.0, 0.2],
                    help="lambda values (default 0 0.2)")
    ap.add_argument("--lr", type=float, default=1e-6,
                    help="the updates' learning rate (default 1e-6, train.py's)")
    ap.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                    help="fresh each group (default adamw)")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=500)
    ap.add_argument("--max-obs-tokens", type=int, default=500)
    ap.add_argument("--topk", type=int, default=3, help="passages per search (default 3)")
    ap.add_argument("--amp", choices=("off", "bf16"), default="off",
                    help="bf16 autocast (a GPU, or a CPU with bf16 units; default off)")
    ap.add_argument("--seed", type=int, default=0, help="the rollouts' sampling seed")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--out", default="",
                    help="write the table's rows here as JSON (default: print only); the "
                    f"rollouts (saved every {SAMPLE_CHUNK} questions) and each finished group are "
                    f"kept beside it "
                    "(OUT.groups.json, OUT.partial.jsonl) until the table is written, so the same "
                    "command resumes "
                    "a stopped probe")
    a = ap.parse_args(argv)
    for flag, v in (("--questions", a.questions), ("--group-size", a.group_size),
                    ("--max-turns", a.max_turns + 1),
                    ("--max-new-tokens", a.max_new_tokens), ("--max-obs-tokens", a.max_obs_tokens),
                    ("--topk", a.topk), *(("--k", k) for k in a.k)):
        if v < 1:
            ap.error(f"{flag} must be >= 1 (--max-turns >= 0), got {v}")
    if a.lr <= 0 or any(lam < 0 for lam in a.llds) or a.group_size < 2:
        ap.error("--lr must be > 0, every --llds >= 0 and --group-size >= 2 (a group needs two "
                 "answers to be mixed)")
    from machinery.data import load_questions
    from machinery.engine import GENERATORS
    from machinery.policy import autocast, load_policy
    from retriever import make_retriever
    from rollout import STOP_STRINGS, rollout

    out = Path(a.out) if a.out else None
    if out and out.is_dir():
        raise SystemExit(f"error: --out {out} is a folder: name the JSON file to write (e.g. "
                         f"{out / 'delta.json'})")
    saved_groups, partial = (Path(f"{out}.groups.json"),
                             Path(f"{out}.partial.jsonl")) if out else (None, None)
    keep = {k: v for k, v in vars(a).items() if k != "out"}
    saved = read_saved_groups(saved_groups) if saved_groups and saved_groups.is_file() else None
    # a stopped probe: its groups so far (and the sampler's RNG), or all of them
    if saved and saved["args"] != keep:
        changed = sorted(k for k in keep if saved["args"].get(k) != keep[k])
        raise SystemExit(f"error: --out {out}: a stopped probe with other flags "
                         f"({', '.join(changed)}) is kept "
                         f"beside it in {saved_groups.name}; give another --out, or delete it to "
                         f"start over")
    try:
        model, tokenizer, device = load_policy(a.model, "float32", a.device)
        rows = load_questions(a.train_data)[:a.questions]
        sampled = saved["groups"] if saved else []
        retriever = make_retriever(a.corpus, "") if len(sampled) < len(rows) else None
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    amp = autocast(a.amp, device)
    groups = sampled
    if saved:
        print(f"resuming: {len(groups)} of {len(rows)} groups read back from {saved_groups}")
        # the sampler's CPU stream where it stopped (a CUDA device's own stream is not kept)
        if "rng" in saved:
            torch.set_rng_state(torch.tensor(saved["rng"], dtype=torch.uint8))
    else:
        torch.manual_seed(a.seed)
    # sampled SAMPLE_CHUNK questions at a time, each chunk saved: a kill loses one
    if len(groups) < len(rows):
        from tqdm import tqdm

        generate = GENERATORS["cb"](model, tokenizer, stop_strings=STOP_STRINGS,
                                    max_new_tokens=a.max_new_tokens,
                                    batch_size=64)
        t = time.time()
        with tqdm(total=len(rows), initial=len(groups), desc="sampling", unit="question") as bar:
            for i in range(len(groups), len(rows), SAMPLE_CHUNK):
                with amp():
                    episodes = rollout(generate, tokenizer, rows[i:i + SAMPLE_CHUNK],
                                       retriever.search,
                                       group_size=a.group_size, max_turns=a.max_turns,
                                       max_obs_tokens=a.max_obs_tokens, topk=a.topk)
                groups += [
                    _frozen(episodes[j : j + a.group_size])
                    for j in range(0, len(episodes), a.group_size)
                ]
                if out:
                    atomic_write(saved_groups, json.dumps({"args": keep, "groups": groups,
                                                           "rng": torch.get_rng_state().tolist()}))
                bar.update(len(episodes) // a.group_size)
        print(f"{len(rows)} questions x {a.group_size} rollouts ({time.time() - t:.0f} s this "
              f"time); mean reward "
              f"{np.mean([r for g in groups for r in g['reward']]):.3f}; "
              f"{sum(map(is_mixed, groups))} mixed groups")
    done = read_finished(partial, a.k, a.llds) if partial and partial.is_file() else []

    def save(result):
        if partial:
            with open(partial, "a") as f:
                f.write(json.dumps(result) + "\n")
                f.flush()
                os.fsync(f.fileno())
    table = delta_probe(model, tokenizer, groups, ks=a.k, lambdas=a.llds, lr=a.lr,
                        optimizer=a.optimizer, amp=amp,
                        done=done, on_group=save)
    print(f"{'k':>2} {'lambda':>6} {'mixed':>5} {'Delta<0':>8} {'95% CI':>13} {'correct':>9} "
          f"{'first':>8} "
          f"{'later':>8} {'answer':>8} {'incorrect':>9}")
    for r in table:
        f = lambda x: "-" if x is None else f"{x:+.3f}"  # noqa: E731
        print(f"{r['k']:>2} {r['llds']:>6g} {r['mixed']:>5} {f(r['frac_neg']):>8} "
              f"{'[%.2f, %.2f]' % tuple(r['ci95']):>13} {f(r['delta_correct']):>9} "
              f"{f(r['delta_correct_first']):>8} "
              f"{f(r['delta_correct_later']):>8} {f(r['delta_correct_answer']):>8} "
              f"{f(r['delta_incorrect']):>9}")
    if out:
        atomic_write(out, json.dumps({"args": vars(a), "rows": table}, indent=1))
        saved_groups.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
