"""Two optimizer steps of train.update() on fixed trajectories, in one process or sharded with FSDP2 under torchrun.

    python tests/fsdp_update.py OUT.json                                   # one process, plain model
    python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_update.py OUT.json --fsdp   # 2 ranks, gloo
    python tests/fsdp_update.py OUT.json --micro-batch-size 1              # the same in micro-batches of 1

Writes (rank 0) the per-mini-batch metrics, grad norms and a few full weights after each step, so tests/test_fsdp.py
can check that sharding changes nothing but the arithmetic order. The rollouts are fixed (random token ids with
observation gaps), so both runs see the same data: mini-batch k is rows [k M, (k+1) M) of the global order, and rank r
holds its r-th share of every mini-batch, as train.main assigns whole prompts to ranks.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from machinery import policy  # noqa: E402
from machinery.fsdp import setup_dist, shard  # noqa: E402
import train  # noqa: E402
from grpo import group_advantages  # noqa: E402
from tiny import build_model, build_tokenizer  # noqa: E402

B, G, M = 16, 4, 8  # trajectories, group size, global mini-batch (2 updates per step)


class Ep:
    def __init__(self, g, prompt, act1, obs, act2):
        self.group_id, self.prompt_ids, self.response_ids = g, prompt, act1 + obs + act2
        self.loss_mask = [1] * len(act1) + [0] * len(obs) + [1] * len(act2)
        self.answer_mask = [0] * (len(act1) + len(obs)) + [1] * len(act2)


def episodes(step):
    gen = torch.Generator().manual_seed(100 + step)

    def ids(n):
        return torch.randint(3, 700, (n,), generator=gen).tolist()

    def n(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=gen))

    eps = [Ep(i // G, ids(n(4, 9)), ids(n(2, 8)), ids(n(0, 5)), ids(n(1, 6))) for i in range(B)]
    rewards = torch.randint(0, 2, (B,), generator=gen).float()
    return eps, rewards


def two_steps(fsdp: bool = False, micro_batch_size: int = 2) -> list[dict]:
    """Run the two steps; returns (on rank 0) one record per step: metrics per mini-batch, grad norms, weights."""
    rank, world, _ = setup_dist(fsdp, "cpu")
    args = train.parse_args(["--mini-batch-size", str(M), "--micro-batch-size", str(micro_batch_size), "--lr", "1e-3",
                             "--kl-coef", "0.01", "--llds", "0.5", "--warmup-ratio", "0"])
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    ref = build_model(tok, seed=0).requires_grad_(False)
    if fsdp:
        model, ref = shard(model), shard(ref)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, foreach=False)
    log = []
    for step in range(2):
        eps, rewards = episodes(step)
        adv = group_advantages(rewards, [e.group_id for e in eps])
        share = M // world  # rank r: its share of each global mini-batch
        mine = [i for k in range(0, B, M) for i in range(k + rank * share, k + (rank + 1) * share)]
        batch = policy.collate([eps[i] for i in mine], tok.pad_token_id)
        old = policy.batch_logp(model, batch, micro_batch_size, 1.0, len(tok))
        ref_logp = policy.batch_logp(ref, batch, micro_batch_size, 1.0, len(tok))
        old = old + 0.05 * torch.sin(batch["input_ids"][:, -old.shape[1]:].float())  # off-policy, so LLDS acts
        per_mini, norms, stepped, _ = train.update(model, optimizer, batch, old, ref_logp, adv[mine], None, args,
                                                   len(tok), share)
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            log.append({"metrics": per_mini, "grad_norms": norms, "stepped": stepped,
                        "weights": {k: full[k].flatten()[:64].tolist() for k in sorted(full)}})
    if dist.is_initialized():
        dist.destroy_process_group()
    return log


if __name__ == "__main__":
    torch.set_num_threads(1)
    micro = int(sys.argv[sys.argv.index("--micro-batch-size") + 1]) if "--micro-batch-size" in sys.argv else 2
    log = two_steps("--fsdp" in sys.argv, micro)
    if log:
        Path(sys.argv[1]).write_text(json.dumps(log))

