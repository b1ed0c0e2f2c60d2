"""Snapshots for the course's graded tests (tests/test_exercises.py): seeded random inputs where hand computation does
not reach, and the outputs our code gives on them today, stored as small JSON files in tests/snapshots/.

    python tests/make_snapshots.py            # rewrite tests/snapshots/*.json from the code as it is
    python tests/make_snapshots.py --check    # exit 1 if a stored snapshot differs from what the code gives now

Inputs are stored with the outputs, so a change of torch's random generator cannot move them; tests/test_course.py
checks that the files match the code (`snapshot_differences`: the structure and every non-float exactly, floats to a
float32 tolerance, since another CPU's vectorised reductions round the last bit differently). Rewrite them only after
a deliberate change of a graded function.
"""

import json
import math
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpo  # noqa: E402
import llds  # noqa: E402

OUT = Path(__file__).resolve().parent / "snapshots"


def _l(x):
    return x.tolist() if isinstance(x, torch.Tensor) else x


def _mask(g, B, T):
    mask = (torch.rand(B, T, generator=g) < 0.75).float()  # [B, T]
    mask[:, 0] = 1.0  # every row has a model token
    return mask


def advantages() -> dict:
    g, cases = torch.Generator().manual_seed(0), []
    for case in range(6):
        sizes = [1, 2, 3, 5, 5][: 2 + case % 4]
        ids = [f"q{i}" for i, n in enumerate(sizes) for _ in range(n)]
        perm = torch.randperm(len(ids), generator=g).tolist()  # interleaved groups
        ids = [ids[p] for p in perm]
        binary = case % 2 == 0
        rewards = (torch.rand(len(ids), generator=g) < 0.5).float() if binary else torch.rand(len(ids), generator=g)
        scale = case != 5
        cases.append({"rewards": _l(rewards), "group_ids": ids, "scale": scale,
                      "adv": _l(grpo.group_advantages(rewards, ids, scale=scale))})
    return {"cases": cases}


def clipped() -> dict:
    g, cases = torch.Generator().manual_seed(1), []
    for agg in ("token-mean", "seq-mean-token-mean"):
        for eps_high, extra in ((None, 0), (0.28, 5)):
            B, T = 6, 8
            old = -torch.rand(B, T, generator=g) * 3  # [B, T]
            logp = (old + torch.randn(B, T, generator=g)).requires_grad_()  # ratios far outside the clip
            adv = torch.randn(B, generator=g)
            mask = _mask(g, B, T)
            num_tokens, num_seqs = mask.sum() + extra, B + extra  # as if a micro-batch of a larger mini-batch
            loss, m = grpo.grpo_loss(logp, old, None, adv, mask, clip_eps_high=eps_high, agg=agg, kl_coef=0.0,
                                     num_tokens=num_tokens, num_seqs=num_seqs)
            (grad,) = torch.autograd.grad(loss, logp)
            cases.append({"logp": _l(logp.detach()), "old_logp": _l(old), "adv": _l(adv), "mask": _l(mask),
                          "agg": agg, "clip_eps_high": eps_high, "num_tokens": num_tokens.item(), "num_seqs": num_seqs,
                          "loss": loss.item(), "grad": _l(grad), "clip_frac": m["grpo/clip_frac"]})
    return {"cases": cases}


def kl() -> dict:
    g = torch.Generator().manual_seed(2)
    logp = (torch.randn(40, generator=g) * 12).requires_grad_()  # log-ratios up to ~+-40: both clamps act
    ref = torch.randn(40, generator=g) * 12
    k3 = grpo.kl_k3(logp, ref)
    (grad,) = torch.autograd.grad(k3.sum(), logp)
    return {"logp": _l(logp.detach()), "ref_logp": _l(ref), "k3": _l(k3.detach()), "grad": _l(grad)}


def gate() -> dict:
    g, cases = torch.Generator().manual_seed(3), []
    for _ in range(4):
        keep = (torch.rand(6, 12, generator=g) < 0.6).float()  # [B, T]
        delta = torch.randn(6, 12, generator=g).round(decimals=1)  # some actions sum to exactly 0 and more
        seg = llds.action_segments(keep)
        gate_, n_on, n_units = llds._gate_action(delta, keep)
        cases.append({"keep": _l(keep), "delta": _l(delta), "seg": _l(seg), "gate": _l(gate_),
                      "n_on": int(n_on), "n_units": int(n_units)})
    return {"cases": cases}


def llds_() -> dict:
    g, cases = torch.Generator().manual_seed(4), []
    for gate_ in llds.GATES:
        for norm in llds.NORMS:
            B, T = 6, 10
            old = -torch.rand(B, T, generator=g) * 3
            logp = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_()
            adv = torch.tensor([1.0, 0.0, -1.0, 0.5, 0.0, -0.5])[torch.randperm(B, generator=g)]
            mask = _mask(g, B, T)
            loss, m = llds.llds_loss(logp, old, adv, mask, gate=gate_, norm=norm)
            (grad,) = torch.autograd.grad(loss, logp)
            cases.append({"gate": gate_, "norm": norm, "logp": _l(logp.detach()), "old_logp": _l(old), "adv": _l(adv),
                          "mask": _l(mask), "loss": loss.item(), "grad": _l(grad), "gate_rate": m["llds/gate_rate"]})
    return {"cases": cases}


SNAPSHOTS = {"advantages": advantages, "clipped": clipped, "kl": kl, "gate": gate, "llds": llds_}


# ----------------------------------------------------------------------------------------------------------------------
# Fresh cases (course/grade.py): drawn anew at every grading from its secret seed, their answers our functions' on
# them, so that no table of public answers passes them. Each part is a mix no constant answer passes; its structure
# (which cases it holds) is fixed, only the values are drawn, so one mistake fails the same parts at every grading.
# tests/test_exercises.py's test_<exercise>_fresh calls FRESH[exercise][part](seed) with our functions in place.


def _sizes_ids(g, sizes):
    ids = [f"q{i}" for i, n in enumerate(sizes) for _ in range(n)]
    perm = torch.randperm(len(ids), generator=g).tolist()  # interleaved groups
    return [ids[p] for p in perm]


def fresh_advantages(seed: int, part: str) -> list[dict]:
    g, cases = torch.Generator().manual_seed(seed), []
    for _ in range(4):
        if part == "binary":  # groups of 2-6, 0/1 rewards, one group all equal (its advantages exactly 0)
            sizes = [int(x) for x in torch.randint(2, 7, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g)]
            ids = _sizes_ids(g, sizes)
            rewards = (torch.rand(len(ids), generator=g) < 0.5).float()
            rewards[[i for i, q in enumerate(ids) if q == "q0"]] = float(torch.rand(1, generator=g) < 0.5)
            rewards[[i for i, q in enumerate(ids) if q == "q1"][:2]] = torch.tensor([1.0, 0.0])  # one mixed group
            eps, scale = 1e-6, True
        else:  # "continuous": a group of one beside larger ones, another eps, and scale=False in half the cases
            ids = _sizes_ids(g, [1, 3, int(torch.randint(2, 6, (1,), generator=g))])
            rewards = torch.rand(len(ids), generator=g) * 2 - 0.5
            eps, scale = float(torch.rand(1, generator=g)) * 0.5, len(cases) % 2 == 0
        cases.append({"rewards": _l(rewards), "group_ids": ids, "eps": eps, "scale": scale,
                      "adv": _l(grpo.group_advantages(rewards, ids, eps=eps, scale=scale))})
    return cases


def fresh_clipped(seed: int, part: str) -> list[dict]:
    """part: the aggregation; each case a random batch, ratios inside and outside the clip, eps_high or not."""
    g, cases = torch.Generator().manual_seed(seed), []
    for i in range(3):
        B, T = int(torch.randint(2, 7, (1,), generator=g)), int(torch.randint(3, 11, (1,), generator=g))
        old = -torch.rand(B, T, generator=g) * 3
        logp = (old + torch.randn(B, T, generator=g) * 0.5).requires_grad_()
        adv = torch.randn(B, generator=g)
        mask = _mask(g, B, T)
        extra = int(torch.randint(0, 6, (1,), generator=g))
        eps_high = None if i == 0 else 0.28
        num_tokens, num_seqs = mask.sum() + extra, B + extra
        loss, m = grpo.grpo_loss(logp, old, None, adv, mask, clip_eps_high=eps_high, agg=part, kl_coef=0.0,
                                 num_tokens=num_tokens, num_seqs=num_seqs)
        (grad,) = torch.autograd.grad(loss, logp)
        cases.append({"logp": _l(logp.detach()), "old_logp": _l(old), "adv": _l(adv), "mask": _l(mask), "agg": part,
                      "clip_eps_high": eps_high, "num_tokens": num_tokens.item(), "num_seqs": num_seqs,
                      "loss": loss.item(), "grad": _l(grad), "clip_frac": m["grpo/clip_frac"]})
    return cases


def fresh_kl(seed: int, part: str) -> list[dict]:
    """part "moderate": log-ratios within +-4; "extreme": up to +-40, where the clamps act."""
    g = torch.Generator().manual_seed(seed)
    n, scale = int(torch.randint(10, 41, (1,), generator=g)), 1.5 if part == "moderate" else 15.0
    logp = (torch.randn(n, generator=g) * scale).requires_grad_()
    ref = torch.randn(n, generator=g) * scale
    k3 = grpo.kl_k3(logp, ref)
    (grad,) = torch.autograd.grad(k3.sum(), logp)
    return [{"logp": _l(logp.detach()), "ref_logp": _l(ref), "k3": _l(k3.detach()), "grad": _l(grad)}]


def fresh_gate(seed: int, part: str) -> list[dict]:
    """part "segments": action_segments alone; "gate": _gate_action, some action sums exactly 0."""
    g, cases = torch.Generator().manual_seed(seed), []
    for _ in range(3):
        B, T = int(torch.randint(2, 7, (1,), generator=g)), int(torch.randint(4, 16, (1,), generator=g))
        keep = (torch.rand(B, T, generator=g) < 0.6).float()
        delta = torch.randn(B, T, generator=g).round(decimals=1)
        case = {"keep": _l(keep), "seg": _l(llds.action_segments(keep))}
        if part == "gate":
            gate_, n_on, n_units = llds._gate_action(delta, keep)
            case.update(delta=_l(delta), gate=_l(gate_), n_on=int(n_on), n_units=int(n_units))
        cases.append(case)
    return cases


def fresh_llds(seed: int, part: str) -> list[dict]:
    """part "action": the action gate under both normalisations; "response-token": the other two gates."""
    g, cases = torch.Generator().manual_seed(seed), []
    gates = ["action"] if part == "action" else ["response", "token"]
    for gate_ in gates:
        for norm in llds.NORMS:
            B, T = int(torch.randint(3, 8, (1,), generator=g)), int(torch.randint(4, 12, (1,), generator=g))
            old = -torch.rand(B, T, generator=g) * 3
            logp = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_()
            adv = torch.randn(B, generator=g).round(decimals=1)
            adv[int(torch.randint(0, B, (1,), generator=g))] = 0.0  # a zero advantage: in Y_pre
            mask = _mask(g, B, T)
            loss, m = llds.llds_loss(logp, old, adv, mask, gate=gate_, norm=norm)
            (grad,) = torch.autograd.grad(loss, logp)
            cases.append({"gate": gate_, "norm": norm, "logp": _l(logp.detach()), "old_logp": _l(old),
                          "adv": _l(adv), "mask": _l(mask), "loss": loss.item(), "grad": _l(grad),
                          "gate_rate": m["llds/gate_rate"]})
    return cases


WORDS = ["Rhine", "Bonn", "capital", "the", "river", "of", "Paris", "Seine", "a", "museum", "x", "Bei", "jing"]


def fresh_cut_turn(seed: int, part: str) -> list[dict]:
    """part "cut": cut_turn on random turns with </search>, </answer> and EOS at random places (and none);
    "append": Episode.append sequences of actions and observations."""
    from rollout import Episode, cut_turn
    from tiny import build_tokenizer

    g, tok, cases = random.Random(seed), build_tokenizer(), []
    if part == "cut":
        eos = tok.eos_token_id
        for stop in ("</search>", "</answer>", "eos", "none", "</search>", "eos"):
            ids = tok.encode(" ".join(g.choice(WORDS) for _ in range(g.randint(1, 6))), add_special_tokens=False)
            tail = tok.encode(" " + " ".join(g.choice(WORDS) for _ in range(g.randint(0, 4))), add_special_tokens=False)
            ids += {"eos": [eos], "none": []}.get(stop) or tok.encode(f" {stop}", add_special_tokens=False)
            ids += tail + [eos] * g.randint(0, 2)
            kept, on_eos = cut_turn(ids, tok, {eos})
            cases.append({"ids": ids, "kept": list(kept), "eos": bool(on_eos)})
        return cases
    for _ in range(3):
        e, steps = Episode("q", ["a"], "nq", group_id=0, prompt_ids=[1, 2]), []
        for _ in range(g.randint(2, 6)):
            n, trained = g.randint(1, 5), g.random() < 0.5
            ids = [g.randint(3, 60) for _ in range(n)]
            mask = [g.randint(0, 1) for _ in range(n)] if trained and g.random() < 0.5 else None
            e.append(ids, trained=trained, answer_mask=mask)
            steps.append({"ids": ids, "trained": trained, "answer_mask": mask})
        cases.append({"steps": steps, "response_ids": e.response_ids, "loss_mask": e.loss_mask,
                      "answer_mask": e.answer_mask})
    return cases


def fresh_em(seed: int, part: str) -> list[dict]:
    """part "normalize": normalize_answer on random texts (case, ASCII punctuation inside and between words, articles
    as words and inside words, runs of spaces, a Unicode dash); "check": em_check, matches and near misses."""
    from rollout import em_check, normalize_answer

    g, cases = random.Random(seed), []
    words = ["Theatre", "an", "Eiffel", "The", "a", "Anna", "tower", "A.M.", "Jean–Paul", "apple", "THE", "isle"]
    def text():
        out = "".join(g.choice(["", " ", "  "]) + g.choice(words) + g.choice(["", ",", "!", "-", ".", ";"])
                      for _ in range(g.randint(1, 5)))
        return out if g.random() < 0.5 else out.upper()
    if part == "normalize":
        return [{"text": t, "norm": normalize_answer(t)} for t in (text() for _ in range(8))]
    for _ in range(8):
        golds = [text() for _ in range(g.randint(1, 3))]
        kind = g.choice(["same", "case", "punct", "other", "substring", "none", "article"])
        pred = {"same": golds[0], "case": golds[0].swapcase(), "punct": f"the {golds[0]}!", "other": text(),
                "substring": f"{golds[0]} tower", "none": None, "article": "The"}[kind]
        cases.append({"prediction": pred, "golds": golds, "em": em_check(pred, golds)})
    return cases


def fresh_alarm(seed: int, part: str) -> list[dict]:
    """part "phases": rising, flat, steadily falling and accelerating likelihoods; "gaps": the same with steps
    without a correct response (None) and grad-norm spikes."""
    g, cases = random.Random(seed), []
    for shape in ("rise", "flat", "decay", "accelerate") * 2:
        k, n = g.randint(2, 4), g.randint(5, 9)
        base = [round(g.uniform(-0.3, 0.3), 3) for _ in range(n - k)]
        tail = {"rise": [round(g.uniform(0.01, 0.3), 3) for _ in range(k)],
                "flat": [round(g.choice([0.0, -0.01, 0.02]), 3) for _ in range(k)],
                "decay": [round(-0.1 - g.uniform(0, 0.02), 3) for _ in range(k)],
                "accelerate": [round(-0.1 * 2 ** i, 3) for i in range(k)]}[shape]
        delta = base + tail
        gnorm = [round(g.uniform(0.8, 1.2), 3) for _ in range(n)]
        if part == "gaps":
            delta.insert(g.randint(1, n - 1), None)
            gnorm.insert(0, 1.0)
            if g.random() < 0.5:
                gnorm[-1] = round(g.uniform(3, 6), 3)
        cases.append({"delta": delta, "gnorm": gnorm, "k": k, "phase": llds.lld_alarm(delta, gnorm, k=k)})
    return cases


FRESH = {"advantages": (fresh_advantages, ("binary", "continuous")),
         "clipped": (fresh_clipped, ("token-mean", "seq-mean-token-mean")),
         "kl": (fresh_kl, ("moderate", "extreme")), "gate": (fresh_gate, ("segments", "gate")),
         "llds": (fresh_llds, ("action", "response-token")), "cut_turn": (fresh_cut_turn, ("cut", "append")),
         "em": (fresh_em, ("normalize", "check")), "alarm": (fresh_alarm, ("phases", "gaps"))}

# Every stored float is a float32 value (a tensor's, or a metric taken from one). A CPU with other vector widths sums
# the same float32 terms in another order: a few ulps apart (issue 22: a gradient -0.016324304 here, -0.016324302
# there, 1 ulp = 1.9e-9). RTOL 1e-5 is ~80 float32 ulps (eps 1.19e-7): room for sums reordered over the snapshots'
# few dozen terms, far below what a change of formula moves. ATOL 1e-6 covers values that cancel to ~0 (a sum near 0,
# whose rounding error scales with its terms, not with the result). The same tolerances as tests/test_exercises.py's
# `close`, which grades students' code against these files.
RTOL, ATOL = 1e-5, 1e-6


def differences(stored, computed, where: str = "", limit: int = 10) -> list[str]:
    """Where `computed` differs from `stored` (both parsed JSON), as "where: stored X, computed Y" lines (at most
    `limit`): dicts must have the same keys and lists the same lengths; a number compared with a float is equal within
    RTOL / ATOL (math.isclose); every other value (int, bool, str, None) must be equal exactly, type included."""
    out = []

    def walk(a, b, at):
        if len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                out.append(f"{at or '.'}: keys {sorted(a)} stored, {sorted(b)} computed")
                return
            for k in a:
                walk(a[k], b[k], f"{at}.{k}" if at else k)
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                out.append(f"{at}: {len(a)} items stored, {len(b)} computed")
                return
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{at}[{i}]")
        elif _is_number(a) and _is_number(b) and (isinstance(a, float) or isinstance(b, float)):
            if not (math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL) or (math.isnan(a) and math.isnan(b))):
                out.append(f"{at}: stored {a!r}, computed {b!r}")
        elif type(a) is not type(b) or a != b:
            out.append(f"{at}: stored {a!r}, computed {b!r}")

    walk(stored, computed, where)
    return out


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def snapshot_differences(name: str) -> list[str]:
    """How tests/snapshots/{name}.json differs from what the code gives now (`differences`); [] if it matches, one
    line if the file is missing. Used by --check and tests/test_course.py."""
    path = OUT / f"{name}.json"
    if not path.exists():
        return [f"{path.name}: missing"]
    computed = json.loads(json.dumps(SNAPSHOTS[name]()))  # as written: tuples become lists, float32 -> float repr
    return [f"{path.name}: {d}" for d in differences(json.loads(path.read_text()), computed)]


def main(argv=None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    OUT.mkdir(exist_ok=True)
    stale = []
    for name, make in SNAPSHOTS.items():
        path = OUT / f"{name}.json"
        if check:
            diffs = snapshot_differences(name)
            if diffs:
                stale.append(path.name)
                print("\n".join(diffs))
        else:
            path.write_text(json.dumps(make(), separators=(",", ":")) + "\n")
            print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size / 1024:.1f} KB)")
    if stale:
        print(f"stale snapshots: {', '.join(stale)}; rewrite with: python tests/make_snapshots.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
