"""A train.py run's bookkeeping, kept out of the loop: the command line read from a dataclass, the
micro-batch metrics folded into mini-batch means, the step's log (metrics.jsonl, one console line, a
few trajectories as text), the health checks that stop a diverged run, the clocks, and the optimizer
with the official code's schedule.

Nothing here is the method: train.py's `main` and `update` are, and they read the paper's order.
This module imports no concept file; what it needs of them (the loss tables, the alarm's phase)
train.py passes in.
"""

import argparse
import dataclasses
import inspect
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LambdaLR

from machinery import checkpoint
from machinery.fsdp import all_finite, print0


def parse_dataclass(cls, description: str, ranges: dict, choices: dict, argv=None):
    """argparse over the fields of dataclass `cls`: --field-name VALUE for each, help from the
    field's comment, grouped by the `# --- section` comments of its source. ranges: field ->
    (valid?(value), the valid range in words); choices: field -> the valid values. A bad value exits
    (status 2) with one line naming the flag and the valid range, never 40 lines of usage first.
    Returns (the instance, the parser's `error` for checks of the caller's)."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    # a bad value is one line (its error), not the usage first
    ap.print_usage = lambda file=None: None
    group, groups, docs, above = None, {}, {}, []
    # a field's help: its comment, or the comment lines above it
    for line in inspect.getsource(cls).splitlines():
        if m := re.fullmatch(r"    # --- (.+)", line):
            group, above = ap.add_argument_group(m[1]), []
        elif m := re.fullmatch(r"    # (.+)", line):
            above.append(m[1])
        elif m := re.fullmatch(r"    (\w+): [^#]*?(?:  # (.+))?", line):
            groups[m[1]], docs[m[1]], above = group, m[2] or " ".join(above), []
    for f in dataclasses.fields(cls):
        # str, int, float
        kw = {"action": argparse.BooleanOptionalAction} if f.type is bool else {"type": f.type}
        default = "unset" if f.default in (None, "") else f.default
        groups[f.name].add_argument("--" + f.name.replace("_", "-"), **kw, default=f.default,
                                    help=f"{docs[f.name]} (default: {default})")
    args = cls(**vars(ap.parse_args(argv)))
    for name, ok in choices.items():
        if getattr(args, name) not in ok:
            ap.error(f"--{name.replace('_', '-')} must be one of {ok}, got {getattr(args, name)!r}")
    # every number is checked here, not at step 1 deep inside a library
    for name, (ok, valid) in ranges.items():
        value = getattr(args, name)
        if (isinstance(value, float) and not math.isfinite(value)) or not ok(value):
            ap.error(f"--{name.replace('_', '-')} must be {valid}, got {value}")
    return args, ap.error


@dataclass
class Run:
    """What a run starts from, all checked before step 1 (train.load_run)."""
    ckpt: Path | None  # the checkpoint it resumes, or None
    state: dict | None  # that checkpoint's trainer state (history, data order, scheduler), or None
    rows: list  # the training questions
    retriever: object  # .search(queries, topk) -> hits
    model: torch.nn.Module  # the policy, not yet sharded
    tokenizer: object
    device: str
    ref: object  # () -> the frozen reference for one pass, or None without a KL term
    probe: object  # (step) -> the probe/* metrics of that step


def add_metrics(acc: dict, metrics: dict, reduce: dict):
    """Fold a micro-batch's loss metrics into its mini-batch's `acc` as `reduce` (metric -> "sum",
    "max" or ("mean", weight key); grpo.REDUCE and llds.REDUCE) says: "sum" adds, "max" keeps the
    largest, ("mean", w) adds value * metrics[w] (a weighted sum; `mean_metrics` divides by the
    summed weight). Raises KeyError for a metric `reduce` does not list, or a weighted mean whose
    weight the same metrics lack."""
    for k, v in metrics.items():
        if k not in reduce:
            raise KeyError(f"metric {k!r} has no reduction: add it to grpo.REDUCE or llds.REDUCE "
                           "('sum', 'max' or ('mean', weight key))")
        how = reduce[k]
        if isinstance(how, tuple) and how[1] not in metrics:
            raise KeyError(f"metric {k!r} is a mean weighted by {how[1]!r}, "
                           "which the same metrics lack: return both")
        if how == "max":
            acc[k] = max(acc.get(k, v), v)
        else:
            acc[k] = acc.get(k, 0.0) + (v if how == "sum" else v * metrics[how[1]])


def mean_metrics(acc: dict, reduce: dict) -> dict:
    """The mini-batch's metrics from add_metrics' sums (after they are summed over ranks): each
    ("mean", w) metric divided by its summed weight w (0.0 where w is 0: nothing to average), so it
    is the exact mean over the mini-batch's units however the mini-batch was split into
    micro-batches."""
    out = dict(acc)
    for k, how in reduce.items():
        if k in acc and isinstance(how, tuple):
            out[k] = acc[k] / acc[how[1]] if acc[how[1]] else 0.0
    return out


def log_step(step: int, m: dict, history: list, episodes, adv, args, rank: int,
             alarm_before: str = ""):
    """metrics.jsonl (the whole history, rewritten atomically), the LLD alarm's line when
    m["alarm/phase"] changed from `alarm_before`, one console line, and at step 1 and every
    --log-rollouts-every steps a few full trajectories as text (rollouts_step{N}.jsonl). args:
    train.Args."""
    out_dir = Path(args.out_dir)
    if m["alarm/phase"] and m["alarm/phase"] != alarm_before:
        print0(f"LLD alarm at step {step}: {m['alarm/phase']} (the likelihood of correct responses "
               f"fell or stalled for {args.alarm_k} steps; reward lags it, v2 Sec. 5.1)")
    if rank == 0:
        text = "".join(json.dumps(h) + "\n" for h in history)
        checkpoint.atomic_write(out_dir / "metrics.jsonl", text)
    print0(f"step {step} | reward {m['rollout/reward']:.3f} | pg {m['grpo/pg_loss']:.4f} | "
           f"kl {m.get('grpo/kl', 0):.5f} | llds {m['llds/penalty']:.5f} | "
           f"gate {m['llds/gate_rate']:.2f} | clip {m['grpo/clip_frac']:.3f} | "
           f"gnorm {m['grpo/grad_norm']:.3f} | search/ep {m['rollout/searches_per_traj']:.2f} | "
           f"{m['perf/step_s']:.0f}s")
    if rank == 0 and (step == 1 or step % args.log_rollouts_every == 0):
        recs = [{"question": e.question, "golden_answers": e.golden_answers, "answer": e.answer,
                 "reward": e.reward, "adv": adv[i].item(), "searches": e.num_searches,
                 "text": e.text}
                for i, e in enumerate(episodes[:args.num_log_rollouts])]
        text = "".join(json.dumps(r) + "\n" for r in recs)
        checkpoint.atomic_write(out_dir / f"rollouts_step{step}.jsonl", text)


def check_health(model, new_logp, loss_mask, bad: int, stepped: list, step: int, args,
                 rerun: str = "") -> int:
    """Consecutive skipped optimizer steps after this step's `stepped`. Stops (one line) at
    --max-bad-steps, or when the update left non-finite weights or log-probs: never a checkpoint of
    a diverged policy. rerun: as train.main's."""
    for ok in stepped:
        bad = 0 if ok else bad + 1
    if bad >= args.max_bad_steps:
        raise SystemExit(f"error: {bad} consecutive optimizer steps had a non-finite loss or "
                         f"grad norm and were skipped (step {step}): the policy collapsed or "
                         f"diverged, see {args.out_dir}/metrics.jsonl")
    if not all_finite(model, new_logp, loss_mask):
        note = checkpoint.resume_note(Path(args.out_dir), rerun)
        raise SystemExit(f"error: step {step}: the update left non-finite weights or log-probs "
                         f"(the policy diverged; --lr {args.lr:g}?); not saved. {note}")
    return bad


def clock(device: str) -> tuple[float, float]:
    """(wall s, CPU s of all threads) once the kernels queued on `device` have run (perf/*)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()  # CUDA runs kernels asynchronously
    return time.time(), time.process_time()


def perf(t0, t_rollout, t_update, t_end) -> dict:
    """perf/{rollout,logp,update,step}_s (wall) and _cpu_s (CPU) from four clock() readings."""
    spans = {"rollout": (t0, t_rollout), "logp": (t_rollout, t_update), "update": (t_update, t_end),
             "step": (t0, t_end)}
    out = {}
    for name, (a, b) in spans.items():
        out[f"perf/{name}_s"] = b[0] - a[0]  # wall
        out[f"perf/{name}_cpu_s"] = b[1] - a[1]  # CPU, all threads
    return out


def make_optimizer(model, args):
    """AdamW (betas 0.9, 0.999; fused: one in-place kernel per tensor, no temporaries at the peak)
    and the official code's lr schedule: linear from 0 over --warmup-ratio of the steps, then
    constant (one scheduler step per rollout step). args: train.Args (lr, weight_decay,
    warmup_ratio, steps). Returns (optimizer, scheduler)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999),
                                  weight_decay=args.weight_decay, fused=True)
    warmup = int(args.warmup_ratio * args.steps)
    scheduler = LambdaLR(optimizer, lambda s: min(1.0, s / warmup) if warmup else 1.0)
    return optimizer, scheduler
