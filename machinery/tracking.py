"""Tracking: each training step's metrics sent live to an experiment tracker (train.py --report-to).

metrics.jsonl (train.py) is always written and is what scripts/plot_run.py draws; a tracker is for
watching a long run as it goes. TensorBoard writes event files to OUT_DIR/tensorboard (`tensorboard
--logdir OUT_DIR`); W&B and Trackio log to project "llds-grpo", one run per OUT_DIR, which a resumed
run continues. None of the three is a requirement of this project: the package is imported only when
asked for (`pip install tensorboard|wandb|trackio`).
"""

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from tqdm import tqdm

# name -> module
TRACKERS = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb", "trackio": "trackio"}


def missing_tracker(name: str) -> str | None:
    """Why tracker `name` (a TRACKERS key) cannot be imported here, in words with the fix, or None
    if it can."""
    try:
        found = importlib.util.find_spec(TRACKERS[name].split(".")[0]) is not None
        found = found and (
            name != "tensorboard" or importlib.util.find_spec("tensorboard") is not None
        )
    except (ImportError, ValueError):
        found = False
    return (
        None
        if found
        else f"the {name} package is not installed (pip install {name}), or leave --report-to off"
    )


def numbers(metrics: dict) -> dict:
    """The metrics a tracker can plot: ints and floats (not bools, strings such as alarm/phase, or
    None)."""
    return {k: v for k,
            v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@contextlib.contextmanager
def tracker(args, rank: int = 0):
    """Context manager yielding report(metrics, step) for train.py's Args `args` (its report_to,
    out_dir): each call sends one step's metrics (pass numbers(...)) to the tracker; leaving the
    block closes it. report_to "off", and every rank but 0, get a report that does nothing. Raises
    SystemExit with one line (before step 1) when the package is not installed or the tracker cannot
    start (no login, no network: W&B's WANDB_MODE=offline logs locally). A tracker that fails later
    (its log() or close raising: the network went away) costs one warning line on stderr, and the
    run goes on without it: metrics.jsonl is the record."""
    if args.report_to == "off" or rank != 0:
        yield lambda metrics, step: None
        return
    try:
        mod = importlib.import_module(TRACKERS[args.report_to])
    except ImportError as err:
        raise SystemExit(f"error: --report-to {args.report_to}: {err}; install it (pip install "
                         f"{args.report_to}) or "
                         "leave --report-to off") from None
    out = Path(args.out_dir).resolve()
    try:
        if args.report_to == "tensorboard":
            writer = mod.SummaryWriter(str(out / "tensorboard"))
        # W&B and Trackio share the API: init (resume="allow": a resumed run continues), log, finish
        else:
            # one run per out-dir
            run_id = f"{out.name}-{hashlib.sha1(str(out).encode()).hexdigest()[:8]}"
            extra = {"id": run_id, "dir": str(out)} if args.report_to == "wandb" else {}
            mod.init(project="llds-grpo", name=out.name, config=dataclasses.asdict(args),
                     resume="allow", **extra)
    except (
        Exception
    ) as err:  # noqa: BLE001 (the tracker's own errors: a bad folder, no login, no network)
        raise SystemExit(f"error: --report-to {args.report_to} could not start: {err}") from None

    failed = []  # the tracker's first error, once it has failed: the run goes on without it

    # one warning line: metrics.jsonl is the record, the tracker is for watching
    def gone(err: Exception, what: str):
        failed.append(err)
        tqdm.write(f"warning: --report-to {args.report_to}: {what} failed ({type(err).__name__}: "
                   f"{err}); the run goes "
                   # (the bar)
                   f"on without the tracker (every step is in {out / 'metrics.jsonl'})",
                   file=sys.stderr)

    def report(metrics: dict, step: int):
        if failed:
            return
        try:
            if args.report_to == "tensorboard":
                for k, v in metrics.items():
                    writer.add_scalar(k, v, step)
                writer.flush()  # every step on disk, for a live TensorBoard
            else:
                mod.log(metrics, step=step)
        except (
            Exception
        ) as err:  # noqa: BLE001 (the tracker's own: no network, a full disk, its server gone)
            gone(err, f"sending step {step}'s metrics")

    try:
        yield report
    finally:
        try:
            writer.close() if args.report_to == "tensorboard" else mod.finish()
        except Exception as err:  # noqa: BLE001
            failed or gone(err, "closing it")
