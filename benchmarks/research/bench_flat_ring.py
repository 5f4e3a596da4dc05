"""What if a collective over GPUs in several nodes ran as one flat ring at a fraction of the NIC's line rate?

Run: ``python benchmarks/research/bench_flat_ring.py [--markdown]`` (about 70 s). meshplan's pricing is
not changed: the script swaps ``meshplan.pure.cost._placement._two_level`` in its own process.

The question: Megatron-LM's Table 2 (``bench_megatron_table2.py``) measured ZeRO-3 steps that do not shrink
from 768 to 1536 A100s (174.6B) or from 1120 to 2240 (529.6B): communication-bound, at a bus bandwidth of
16-18 GB/s per GPU, 0.63-0.71 of one HDR port, where meshplan's two-level schedule (a ring of 8 on NVLink,
then a ring over the nodes of 1/8 of the buffer, so a node's 8 ports share its traffic) prices 120 GB/s.
The alternative priced here is the rule :func:`meshplan.pure.cluster.select_link` states: a group that spans
nodes runs at the network link, "a ring is as slow as its slowest hop": ``(n-1) alpha_inter + (n-1)/n B /
(eta x bw_inter)``, each GPU's whole ring volume through its own port, ``eta`` the fraction of line rate
achieved. ``--all-groups`` applies it to groups with one GPU per node too (PTD-P's dp all-reduce: then only
``eta`` changes them).

Prints, for the pricing as shipped, ``eta = 1`` and ``eta`` fit on the two purely communication-bound
174.6B rows (768 and 1536 GPUs; least squares on log(pred / pub)): every Table 2 row's pred / pub tok/s,
Table 1's 145.6B and 1008B runs' rank and the layouts within 5/10/25% of the best, and the published
multi-node FSDP runs of ``bench_published.py`` (torchtitan, trainy) whose ``fsdp`` spans nodes. Then what
the fit leaves: the balanced rows (384, 640 GPUs: compute about equal to communication) give ``kappa``,
the compute seconds a hidden communication second would have to cost (NCCL's kernels share the SMs and
HBM), and the 145.6B ranking with ``step + kappa x hidden``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np

import bench_megatron_table2 as t2
import bench_published as bp

import meshplan.pure.cost._placement as sc
from meshplan.pure import search_meshes
from meshplan.pure.cluster import Link
from meshplan.pure.cost import collective_time
from meshplan.pure.search import price_pipeline, search_pipelines

SHIPPED = sc._two_level


def flat_ring(eta: float, *, all_groups: bool = False) -> Callable[..., Any]:
    """``_two_level`` with every group that spans nodes (with several GPUs per node, unless ``all_groups``)
    priced as one ring over all its GPUs at ``eta`` x the network link's bandwidth."""
    def two_level(kind: Any, nbytes: Any, i: Any, d: Any, cluster: Any) -> Any:
        shipped = SHIPPED(kind, nbytes, i, d, cluster)
        if kind == "collective-permute":
            return shipped
        i, d = np.asarray(i), np.asarray(d)
        slow = Link(cluster.inter_link.bandwidth * eta, cluster.inter_link.latency)
        spans = (d > 1) if all_groups else (i > 1) & (d > 1)
        return np.where(spans, collective_time(kind, nbytes, i * d, slow), shipped)
    return two_level


@contextlib.contextmanager
def pricing(two_level: Callable[..., Any]) -> Iterator[None]:
    sc._two_level = two_level
    try:
        yield
    finally:
        sc._two_level = SHIPPED


def fit_eta(all_groups: bool) -> float:
    """``eta`` (to 0.01) that minimises the squared log error of the 174.6B rows on 768 and 1536 GPUs."""
    fit_rows = [r for r in t2.ZERO_RUNS if r.model == "gpt-174.6b" and r.gpus >= 768]
    def loss(eta: float) -> float:
        with pricing(flat_ring(eta, all_groups=all_groups)):
            return sum(math.log(t2.price_zero3(r).step_s / r.pub_step) ** 2 for r in fit_rows)
    return min((round(e, 2) for e in np.arange(0.40, 1.001, 0.01)), key=loss)


def _hidden(c: Any) -> float:
    return sum(t.seconds - (t.exposed or 0.0) for t in c.comm)


def table(label: str) -> list[str]:
    """One column of the comparison: every figure under the pricing in force."""
    cells = [label]
    cells += [f"{r.pub_step / t2.price_zero3(r).step_s:.2f}" for r in t2.ZERO_RUNS]
    for run in t2.PTDP_RUNS:
        c = t2.compare_pipeline(run, models=t2.MODELS)
        assert c.pinned is not None and c.pinned.step is not None
        pub = run.batch * run.seq / (run.tokens_per_s * bp._cluster(run.cluster).num_devices)
        cells.append(f"{pub / c.pinned.step.step_s:.2f} ({c.rank}/{c.ranked})")
    for run in bp.PIPELINE_RUNS[:2]:
        c = bp.compare_pipeline(run)
        assert c.pinned is not None and c.pinned.step is not None and c.best_step_s is not None
        cells.append(f"{c.rank}/{c.ranked}, {c.pinned.step.step_s / c.best_step_s:.2f} x best, "
                     f"{'/'.join(map(str, t2.within(c)))}; best {c.best_text}")
    runs = {r.key: r for r in bp.PUBLISHED_RUNS}
    for key in FSDP_RUNS:
        cells.append(f"{(bp.compare(runs[key]).pinned_tokens_per_s or 0.0) / runs[key].tokens_per_s:.2f}")
    return cells


FSDP_RUNS = ("tt-8b-128xH100", "trainy-8b-32xH200", "trainy-8b-64xH200", "tt-70b-256xH100")


def contention(eta: float, all_groups: bool) -> list[str]:
    """kappa on the balanced ZeRO-3 rows, and the 145.6B ranking with ``step + kappa x hidden``."""
    lines = []
    with pricing(flat_ring(eta, all_groups=all_groups)):
        kappas = []
        for r in t2.ZERO_RUNS:
            if r.gpus not in (384, 640):
                continue
            c = t2._mesh(t2.MODELS[r.model], r.gpus, r.batch)[0]
            assert c.step is not None
            kappas.append((r.pub_step - c.step.step_s) / _hidden(c))
            lines.append(f"{r.key}: pred {c.step.step_s:.1f} s, pub {r.pub_step:.1f} s, hidden communication "
                         f"{_hidden(c):.1f} s: kappa = {kappas[-1]:.2f}")
        run = bp.PIPELINE_RUNS[0]
        spec, cluster = bp.PIPELINE_MODELS[run.model], bp._cluster(run.cluster)
        rec = bp._pipeline_recipe(run, cluster)
        pinned = price_pipeline(spec, cluster, pp=run.pp, stage_layout=run.stage_layout, batch=run.batch,
                                seq=run.seq, schedule=run.schedule, virtual=run.virtual,
                                micro_batches=run.micro_batches, recipe=rec)
        cands = [c for c in search_pipelines(spec, cluster, batch=run.batch, seq=run.seq, recipe=rec,
                                             top_k=1000).candidates if c.step is not None]
        cands += [c for c in search_meshes(spec, cluster, batch=run.batch, seq=run.seq, recipe=rec,
                                           top_k=1000).candidates if c.step is not None and c.fits]
    for kappa in (0.0, min(kappas), max(kappas)):
        steps = sorted(c.step.step_s + kappa * _hidden(c) for c in cands)
        mine = pinned.step.step_s + kappa * _hidden(pinned)
        near = [sum(1 for s in steps if s <= steps[0] * (1 + f)) for f in (0.05, 0.10, 0.25)]
        lines.append(f"{run.key} with kappa {kappa:.2f}: published {mine:.2f} s (measured 24.82 s), best "
                     f"{steps[0]:.2f} s, rank {1 + sum(1 for s in steps if s < mine)}/{len(steps)}, within "
                     f"5/10/25%: {'/'.join(map(str, near))}")
    return lines


def main() -> None:
    all_groups = "--all-groups" in sys.argv
    eta = fit_eta(all_groups)
    rows = ["ZeRO-3 " + r.key for r in t2.ZERO_RUNS] + [r.key + " (rank)" for r in t2.PTDP_RUNS]
    rows += [r.key + ": rank, pinned / best, within 5/10/25%" for r in bp.PIPELINE_RUNS[:2]]
    rows += [k + " (bench_published pred/pub)" for k in FSDP_RUNS]
    columns = [table("shipped (two-level)")]
    for e in (1.0, eta):
        with pricing(flat_ring(e, all_groups=all_groups)):
            columns.append(table(f"flat ring, eta {e:.2f}" + (" (fit)" if e == eta else "")))
    heads = ["figure (pred/pub tok/s unless stated)"] + [c[0] for c in columns]
    body = [[name] + [c[k + 1] for c in columns] for k, name in enumerate(rows)]
    bp._print_table(f"Flat rings over nodes ({'every group' if all_groups else 'groups with > 1 GPU per node'})",
                    heads, body, heads)
    print()
    for line in contention(eta, all_groups):
        print(f"- {line}")


if __name__ == "__main__":
    main()
