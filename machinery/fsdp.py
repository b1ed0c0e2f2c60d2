"""The same program on N ranks (torchrun + FSDP2), whose helpers are the identity in a single
process.

With `--fsdp` under torchrun (nccl on GPU, gloo on CPU) every rank rolls out its own prompts with
the full weights gathered (full_weights), and each optimizer mini-batch is the union of every rank's
share: token counts and metrics are summed over ranks (all_reduce), so the loss is the same as one
process computing it all (tests/test_fsdp.py). The algorithm never looks at the world size; only
seeding (seed + rank), printing (print0) and saving (rank 0 writes) do. Without torchrun the world
is one rank and every helper below returns its input. Saving and resuming a sharded run are
checkpoint.py's (save_checkpoint, restore: collectives that every rank joins).

    torchrun --nproc_per_node 2 -m machinery.fsdp   # 2 CPU ranks: shard a tiny model, sum an update
"""

import contextlib
import os
import random

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

# --------------------------------------------------------------------------------------------------
# Ranks and sharding


def setup_dist(fsdp: bool, device: str, seed: int = 0,
               multiples: dict | None = None) -> tuple[int, int, str]:
    """(rank, world_size, device) from torchrun's RANK / WORLD_SIZE / LOCAL_RANK (nanoGPT); (0, 1,
    device) without.

    --fsdp starts a process group: nccl on GPU (device cuda:LOCAL_RANK), gloo on CPU. Seeds python,
    numpy and torch with seed + rank (each rank samples its own rollouts). multiples: {flag: value}
    that must divide evenly over the ranks. Raises SystemExit (one line) when torchrun starts
    several ranks without --fsdp (they would train unsynchronised copies) or a value of `multiples`
    does not divide.
    """
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not fsdp:
        raise SystemExit("error: torchrun started several ranks; add --fsdp")
    if fsdp:
        cuda = device != "cpu" and torch.cuda.is_available()
        if cuda:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
            torch.cuda.set_device(device)
        import atexit

        # Before the group exists: fsdp imports torch.distributed.nn.functional, whose 10 functions
        # have the default argument group=group.WORLD, evaluated at import; imported after, they
        # would hold the group to the end.
        # (as: `import torch...` here would make torch a local)
        import torch.distributed.fsdp as _fsdp  # noqa: F401

        dist.init_process_group("nccl" if cuda else "gloo")
        atexit.register(_release_process_group)
    for flag, value in (multiples or {}).items():
        if value % world:
            raise SystemExit(f"error: {flag} {value} must be a multiple of the {world} ranks")
    random.seed(seed + rank), np.random.seed(seed + rank), torch.manual_seed(seed + rank)
    return rank, world, device


# the device meshes shard() made; each holds the process group (DeviceMesh._pg_registry)
_MESHES = []


def _release_process_group():
    """At exit (atexit, registered by setup_dist; before interpreter finalisation starts), after the
    program's destroy_process_group(): drop the group's last references, so that it is really
    destroyed and its threads joined.

    destroy_process_group() does not stop a group that something still references, and FSDP2's
    meshes do (DTensor's sharding caches keep them): gloo's worker threads (pt_gloo_runloop) then
    live on into finalisation. Such a thread releases a finished collective's tensors after the rank
    went on, which takes the GIL; once finalisation has begun, Python ends the thread there, inside
    a noexcept destructor: std::terminate ("terminate called without an active exception"), SIGABRT.
    Destroying the group joins them first (without holding the GIL). While the group is still
    initialised (the program ended by an exception) nothing is done: that path is as it was."""
    if dist.is_initialized():
        return
    import gc

    for mesh in _MESHES:
        getattr(mesh, "_pg_registry", {}).clear()  # (a mesh without one holds no group)
    _MESHES.clear()
    # the sharded modules the program dropped are cycles, and their FSDP state holds the group too
    gc.collect()


def shard(model):
    """FSDP2: fully_shard each decoder layer, then the root (pytorch/examples FSDP2). On GPU
    parameters stay fp32 shards and compute in bf16 with fp32 gradient reduction. Gradients are
    *summed* over ranks (divide factor 1): our losses are already normalised by the global token
    count, so averaging would divide by the world size twice."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    on_gpu = next(model.parameters()).is_cuda
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if on_gpu
          else MixedPrecisionPolicy())
    # FSDP2's default; released at exit
    mesh = init_device_mesh("cuda" if on_gpu else "cpu", (dist.get_world_size(),))
    _MESHES.append(mesh)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


@contextlib.contextmanager
def full_weights(model):
    """Gather the full weights on every rank for the rollout, reshard after. Ranks generate
    different numbers of tokens, and a sharded forward all-gathers each layer, which would need
    every rank in lock-step. No-op unsharded."""
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in mods:
        m.unshard()
        m.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for m in mods:
            m.set_reshard_after_forward(True)
            m.reshard()


def all_reduce(values, op: str = "sum") -> list[float]:
    """Sum (or "max") of each value over ranks; the values themselves in a single process."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if dist.is_initialized():
        t = t.to("cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.cpu().tolist()


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """[b, T] on each rank -> [world * b, T'] in rank order (T' = largest T, zero right-padded); x
    in one process."""
    if not dist.is_initialized():
        return x
    T = int(all_reduce([x.shape[1]], "max")[0])
    x = torch.nn.functional.pad(x.float(), (0, T - x.shape[1]))
    x = x.to("cuda") if dist.get_backend() == "nccl" else x
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return torch.cat(out).cpu()


def all_finite(model, logp: torch.Tensor, loss_mask: torch.Tensor) -> bool:
    """True if every weight (this rank's shards) and every response-token log-prob `logp` [B, T] is
    finite, on every rank. An update can leave finite but huge weights whose forward pass overflows:
    the log-probs catch that."""
    bad = sum(
        int(not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all())
        for p in model.parameters()
    )
    bad += int(not torch.isfinite(logp[loss_mask > 0]).all())
    return all_reduce([bad])[0] == 0


def print0(*a):
    """Print on rank 0 only (through tqdm, so the progress bar stays intact)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        tqdm.write(" ".join(str(x) for x in a))


# --------------------------------------------------------------------------------------------------

# torchrun --nproc_per_node 2 -m machinery.fsdp (plain `python -m machinery.fsdp`: a group of one
# rank)
def _demo():
    """Every name is local, so the sharded model is gone when _demo returns and the exit hook can
    destroy the group (module globals would hold it into interpreter finalisation: the SIGABRT of
    _release_process_group)."""
    import copy
    import socket

    from transformers import Qwen2Config, Qwen2ForCausalLM

    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(s.getsockname()[1]))
    rank, world, _ = setup_dist(True, "cpu")
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4,
                      num_key_value_heads=2)
    torch.manual_seed(0)
    # the same tiny random model on every rank; one copy stays unsharded
    whole = Qwen2ForCausalLM(cfg)
    model = shard(copy.deepcopy(whole))
    ids = torch.arange(world * 8).view(world, 8) * 7 % 64  # [world, 8]: one row per rank
    # this rank's row only
    loss = model(input_ids=ids[rank:rank + 1], labels=ids[rank:rank + 1]).loss
    # FSDP sums the gradients over ranks: the gradient of the sum of every rank's loss
    loss.backward()
    grad = model.lm_head.weight.grad
    sharded = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).norm().item()
    # one process, every row
    sum(whole(input_ids=row[None], labels=row[None]).loss for row in ids).backward()
    print0(f"{world} rank(s), one row each | sum of their losses "
           f"{all_reduce([loss.item()])[0]:.4f} | |grad lm_head| "
           f"sharded {sharded:.6f}, one process over all "
           f"{gather_rows(ids[rank:rank + 1]).shape[0]} rows "
           f"{whole.lm_head.weight.grad.norm().item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    _demo()
