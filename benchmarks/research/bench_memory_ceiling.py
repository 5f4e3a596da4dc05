"""How close can any shape-level memory model get to XLA's peak? A ceiling read off recorded compiles.

Run: ``python benchmarks/research/bench_memory_ceiling.py benchmarks/data/memory_calibration_tpu.jsonl [...]
[--markdown]`` (no compiling: it reads rows recorded by ``bench_memory_calibration.py``).

Two meshes of the calibration grid give every device the same batch share and the same tp split when
they split the batch the same number of ways (``dp=2,fsdp=4`` and ``fsdp=8``; ``dp=2,fsdp=2,tp=2`` and
``fsdp=4,tp=2``): the same tokens, heads and MLP width per device. They differ in how the weights are
stored (fsdp shards) and reduced, and in what XLA gathers over fsdp: a layer's weights (the same gathered
size on both) or, where the activations are the smaller operand, the activations (fsdp times the device's
share: twice as many at ``fsdp=8`` as at ``dp=2,fsdp=4``; Mixtral's dispatched tokens at full width,
``meshplan.pure.cost._gathered_operand``). A model that gives such a pair the same activation bytes
(each mesh's exact state, parameters + gradients + optimizer, added) is what the first verdict bounds; the
second lets either mesh add up to ``slack`` of its own: the whole model's weights gathered in bf16 and its
gradient in fp32, all layers at once, unsplit (6 bytes per parameter).

For each pair it asks: is there one activation figure ``A`` that puts both peaks within 0.95-1.10,
``0.95 E_i <= S_i + A + w_i <= 1.10 E_i`` with ``0 <= w_i <= slack`` (``w_i = 0`` for the first verdict)?
Where there is none, at least one of the two rows is out of the band for every such model, so ``rows -
pairs with no common figure`` is a ceiling on the rows it puts in band.

The baseline, in the same process: the pair's first mesh (the ratio column is the second mesh's
activation bytes over the first's).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/

from bench_memory_calibration import (  # noqa: E402
    BAND,
    _spec,
    analytic,
    sizes_of,
)

from meshplan.pure.cost._step_memory import _stacked_leaves

_MiB = 2**20
Row = dict[str, Any]
"""One recorded row of ``bench_memory_calibration.py --jsonl``."""


def target(row: Row) -> str:
    """What a row was compiled for: the TPU slice (``v6e-8``), else the backend."""
    return str(row.get("cluster", row["backend"]))


def pair_key(row: Row) -> tuple[object, ...]:
    """What two rows share when their devices hold the same activation shapes: the target, the model,
    the step, the shape, tp, sp, and the ways the batch is split (``dp * fsdp * ep``)."""
    sizes = sizes_of(row)
    ways = sizes.get("dp", 1) * sizes.get("fsdp", 1) * sizes.get("ep", 1)
    return (target(row), row["family"], row["remat"], row["attention"], row["batch"], row["seq"],
            sizes.get("tp", 1), sizes.get("sp", 1), ways)


def feasible(exact: tuple[float, float], state: tuple[float, float], slack: float,
             band: tuple[float, float] = BAND) -> bool:
    """Whether one activation figure ``A`` puts both peaks in the band, each mesh free to add up to
    ``slack`` of its own: the intervals ``[lo E_i - S_i - slack, hi E_i - S_i]`` meet.

    Example:
      >>> feasible((100.0, 100.0), (10.0, 20.0), slack=0.0)
      True
      >>> feasible((100.0, 200.0), (10.0, 10.0), slack=0.0)
      False
      >>> feasible((100.0, 200.0), (10.0, 10.0), slack=100.0)
      True
    """
    lo, hi = band
    return (max(lo * e - s - slack for e, s in zip(exact, state, strict=True))
            <= min(hi * e - s for e, s in zip(exact, state, strict=True)))


@dataclasses.dataclass(frozen=True)
class Pair:
    """Two rows whose devices hold the same activation shapes (:func:`pair_key`), first and second by mesh name.

    ``exact``: XLA's peaks; ``state``: the plan's exact parameters + gradients + optimizer state;
    ``analytic``: the model's activation bytes (its peak less the state); ``slack``: 6 bytes per parameter
    of the whole model; ``feasible`` / ``rigid``: whether one activation figure puts both in band with /
    without the slack (:func:`feasible`).
    """

    first: Row
    second: Row
    exact: tuple[float, float]
    state: tuple[float, float]
    analytic: tuple[float, float]
    slack: float

    @property
    def feasible(self) -> bool:
        return feasible(self.exact, self.state, self.slack)

    @property
    def rigid(self) -> bool:
        return feasible(self.exact, self.state, 0.0)

    @property
    def activations(self) -> tuple[float, float]:
        """XLA's peak less the state, per mesh."""
        return self.exact[0] - self.state[0], self.exact[1] - self.state[1]


def pairs(rows: Iterable[Row]) -> list[Pair]:
    """Every pair of rows with the same :func:`pair_key`, in a fixed order."""
    groups: dict[tuple[object, ...], list[Row]] = collections.defaultdict(list)
    for row in rows:
        groups[pair_key(row)].append(row)
    return [_pair(first, second)
            for key in sorted(groups, key=str)
            for group in [sorted(groups[key], key=lambda r: str(r["mesh"]))]
            for i, first in enumerate(group) for second in group[i + 1:]]


def _pair(first: Row, second: Row) -> Pair:
    exact, state, activations = [], [], []
    for row in (first, second):
        cand, _ = analytic(str(row["family"]), sizes_of(row), str(row["remat"]), str(row["attention"]),
                           int(row["batch"]), int(row["seq"]), str(row["backend"]), target(row))
        m = cand.memory
        exact.append(float(row["exact"]))
        state.append(float(m.params + m.grads + m.optimizer))
        activations.append(float(m.total) - state[-1])
    # Every weight gathered in bf16 and its gradient in fp32, all layers at once, unsplit.
    slack = 6.0 * sum(_stacked_leaves(_spec(str(first["family"]))))
    return Pair(first, second, (exact[0], exact[1]), (state[0], state[1]), (activations[0], activations[1]), slack)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jsonl", nargs="+", help="rows recorded by bench_memory_calibration.py --jsonl")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    args = parser.parse_args(argv)
    sep = "|" if args.markdown else " "
    for path in args.jsonl:
        with open(path, encoding="utf-8") as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
        found = pairs(rows)
        print(f"\n{os.path.basename(path)}: {len(rows)} rows, {len(found)} pairs\n")
        print(sep.join(["", "target", "family", "remat", "attention", "b x s", "meshes", "activation MiB",
                        "ratio", "analytic MiB", "slack MiB", "both in band: same A", "with slack", ""]))
        if args.markdown:
            print("|---|---|---|---|---|---|---:|---:|---:|---:|---|---|")
        for p in found:
            a, b = p.first, p.second
            (xa, xb), (aa, ab) = p.activations, p.analytic
            print(sep.join(["", target(a), str(a["family"]), str(a["remat"]), str(a["attention"]),
                            f"{a['batch']}x{a['seq']}", f"{a['mesh']} / {b['mesh']}",
                            f"{xa / _MiB:.0f} / {xb / _MiB:.0f}", f"{xb / xa:.2f}",
                            f"{aa / _MiB:.0f} / {ab / _MiB:.0f}", f"{p.slack / _MiB:.0f}",
                            "yes" if p.rigid else "**no**", "yes" if p.feasible else "**no**", ""]))
        print()
        for key in sorted({(target(r), str(r["remat"])) for r in rows}):
            n = sum((target(r), str(r["remat"])) == key for r in rows)
            mine = [p for p in found if (target(p.first), str(p.first["remat"])) == key]
            rigid = sum(not p.rigid for p in mine)
            loose = sum(not p.feasible for p in mine)
            print(f"{key[0]} remat {key[1]}: {n} rows, {len(mine)} pairs; at most {n - rigid} in band for a model "
                  f"that gives a pair the same activation bytes, at most {n - loose} with the slack")


if __name__ == "__main__":
    main()
