"""How much of a step's parameter collectives XLA leaves exposed: a grid of compiled programs, simulated.

Run from the repository root (no GPU or TPU needed; every compile is ahead of time)::

    JAX_PLATFORMS=cpu nice -n 10 timeout 7200 python benchmarks/bench_overlap_grid.py --cache /tmp/overlap-hlo \\
        [--gpu] [--tpu] [--only SUBSTRING] [--record benchmarks/data/overlap_grid.jsonl]

Each case is a model cut to a few layers at its real widths (``bench_compiled.scaled``), a mesh and a batch on
H100 nodes of 8 (XLA:GPU deviceless, the shipped target description) or TPU v5p / v6e slices (XLA:TPU through
libtpu), compiled as ``meshplan plan --verify`` compiles a row: the reference step (layers scanned, remat full,
``dot_product`` attention, AdamW), the plan's specs, XLA's default options. Its program is read
(:func:`~meshplan.pure.xla.read_schedule`) and simulated (:func:`~meshplan.pure.cost.simulate_schedule` with
:func:`~meshplan.pure.cost.default_roofline` and the cluster's links, each device in the node or slice its jax
device sits in), and every collective of the simulation is put in a class:

- **role**, from its replica groups (which mesh axes a group spans: the partition ids are the mesh's devices in
  order) and where it runs: ``gather`` (an all-gather over the batch axes, or a collective-permute of XLA:TPU's
  windowed all-gather loops, ``windowed_dot_general_body_ag``), ``grads`` (a reduce-scatter or all-reduce over the
  batch axes, or a permute of a windowed reduce-scatter loop, ``..._rs``), ``tp`` (a group over tp), ``ep``,
  ``other`` (scalars: the loss, the gradient norm);
- **where**: ``fwd`` / ``bwd`` (inside the first / second loop over the layers: their windows), or ``edge``
  (outside every layer loop: the embedding, the head, the final norm, the optimizer);
- **link**: ``intra`` (NVLink, ICI) or ``inter`` (InfiniBand, DCN), as the simulator priced it.

Per class the row records the seconds the simulator gives the collectives (on its link, alone), the seconds the
compute stream waited for them (exposed), and each layer loop's compute per trip (the window). Beside them, what
the screen prices for the same mesh and batch (``search_meshes`` with the mesh fixed): its collective seconds by
:func:`~meshplan.pure.cost._step_time.overlap_class` and link, its exposed seconds, its compute and windows.

``--fit FILE`` fits :class:`~meshplan.pure.cost.OverlapRule` to recorded rows (no compiles; rows without a forward
and a backward layer loop are left out: XLA:TPU's programs across slices show one) and prints each row's
step under the fitted rule and under the best case beside the simulated one (:func:`fit_rule`, the figures of
:mod:`meshplan.pure.cost._overlap`). ``--record FILE`` writes one JSON object per case (``benchmarks/data/overlap_grid.jsonl`` is what
:mod:`meshplan.pure.cost._overlap` was fitted on); ``--cache DIR`` keeps each compiled HLO text (the compile is the
slow part: 10-25 s per GPU case, 1-2 minutes per TPU case on 2 shared cores) and reads it back on later runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

from bench_compiled import scaled  # noqa: E402

from meshplan.pure.cluster import parse_cluster  # noqa: E402
from meshplan.pure.errors import MeshplanError  # noqa: E402
from meshplan.pure.cost import TrainingRecipe, default_roofline, schedule_links, simulate_schedule  # noqa: E402
from meshplan.pure.cost._step_time import overlap_class  # noqa: E402
from meshplan.pure.xla import read_schedule  # noqa: E402
from meshplan.pure.xla._schedule_records import ScheduledProgram  # noqa: E402

DATA = pathlib.Path(__file__).with_name("data")
BATCH_AXES = ("dp", "fsdp", "ep")


@dataclasses.dataclass(frozen=True)
class Case:
    """One compile of the grid: a model cut to ``layers`` at its real widths, a cluster, a mesh, a batch."""

    cluster: str
    model: str
    layers: int
    mesh: tuple[tuple[str, int], ...]
    batch: int
    seq: int
    remat: str = "full"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.mesh)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.mesh)

    @property
    def mesh_text(self) -> str:
        return ",".join(f"{a}={n}" for a, n in self.mesh)

    @property
    def tokens_per_device(self) -> int:
        ways = math.prod(n for a, n in self.mesh if a in BATCH_AXES)
        return self.batch // ways * self.seq

    @property
    def label(self) -> str:
        return f"{self.cluster} {self.model}/{self.layers}L {self.mesh_text} {self.batch}x{self.seq} {self.remat}"


def _m(**axes: int) -> tuple[tuple[str, int], ...]:
    return tuple((a, n) for a, n in axes.items())


def _gpu_cases() -> list[Case]:
    """H100 nodes of 8: fsdp inside a node, fsdp across nodes, dp across nodes x fsdp inside, with tp."""
    out: list[Case] = []
    for model, layers in (("llama3-8b", 2), ("llama3-70b", 2)):
        # per-device tokens 1K (seq 1024, 1 sequence), 2K and 8K (seq 2048, 1 and 4 sequences)
        for seq, per in ((1024, 1), (2048, 1), (2048, 4)):
            out.append(Case("1x8xH100", model, layers, _m(fsdp=8), 8 * per, seq))
            out.append(Case("2x8xH100", model, layers, _m(fsdp=16), 16 * per, seq))
            out.append(Case("4x8xH100", model, layers, _m(dp=4, fsdp=8), 32 * per, seq))
        out.append(Case("8x8xH100", model, layers, _m(fsdp=64), 64, 2048))
        out.append(Case("8x8xH100", model, layers, _m(dp=8, fsdp=8), 64, 2048))
        out.append(Case("2x8xH100", model, layers, _m(fsdp=4, tp=4), 4 * 2, 2048))
        out.append(Case("4x8xH100", model, layers, _m(dp=4, fsdp=2, tp=4), 8 * 2, 2048))
    for seq, per in ((2048, 1), (2048, 4)):
        out.append(Case("1x8xH100", "mixtral-8x7b", 2, _m(fsdp=8), 8 * per, seq))
        out.append(Case("2x8xH100", "mixtral-8x7b", 2, _m(fsdp=16), 16 * per, seq))
    out.append(Case("2x8xH100", "mixtral-8x7b", 2, _m(dp=2, fsdp=8), 16, 2048))
    return out


def _tpu_cases() -> list[Case]:
    """v5p and v6e slices, one slice and two (the data-center network between them)."""
    return [
        Case("v5p-32", "llama3-8b", 2, _m(fsdp=16), 16, 2048),
        Case("v5p-32", "llama3-8b", 2, _m(fsdp=16), 64, 2048),
        Case("v5p-32", "llama3-8b", 2, _m(fsdp=4, tp=4), 8, 2048),
        Case("v6e-16", "llama3-8b", 2, _m(fsdp=16), 16, 1024),
        Case("v6e-16", "llama3-70b", 2, _m(fsdp=16), 32, 2048),
        Case("2xv6e-16", "llama3-8b", 2, _m(dp=2, fsdp=16), 32, 2048),
        Case("2xv6e-16", "llama3-8b", 2, _m(fsdp=32), 32, 2048),
        Case("2xv6e-16", "llama3-70b", 2, _m(fsdp=32), 64, 2048),
        Case("v6e-16", "mixtral-8x7b", 2, _m(fsdp=16), 16, 2048),
    ]


def _is_tpu(case: Case) -> bool:
    return parse_cluster(case.cluster).device.ici_scope == "slice"


def _recipe(case: Case) -> TrainingRecipe:
    return TrainingRecipe(remat=case.remat, attention="dot_product", backend="tpu" if _is_tpu(case) else "gpu",
                          residual_split=False)


def _candidate(case: Case) -> Any:
    from meshplan.pure import search_meshes

    mesh = dict(case.mesh)
    return search_meshes(scaled(case.model, case.layers), parse_cluster(case.cluster), axes=case.names, fixed=mesh,
                         batch=case.batch, seq=case.seq, recipe=_recipe(case), headroom=0.0, top_k=1,
                         micro_batches=1).best


def _mesh(case: Case, cand: Any) -> Any:
    from meshplan.facade.verify._targets import gpu_topology_mesh, tpu_topology_mesh

    if _is_tpu(case):
        return tpu_topology_mesh(case.cluster, case.names, case.sizes, dcn_shape=cand.dcn_shape)
    return gpu_topology_mesh(case.cluster, case.names, case.sizes)


def _compile(case: Case, cand: Any, mesh: Any) -> str:
    import jax

    from meshplan.facade.verify._reference import ReferenceConfig, reference_step

    ref = reference_step(scaled(case.model, case.layers), mesh, batch=case.batch, seq=case.seq, plan=cand,
                         config=ReferenceConfig(remat=case.remat, attention="dot_product"))
    with jax.set_mesh(mesh):
        return str(ref.fn.lower(*ref.args).compile().as_text())


def program_text(case: Case, cache: pathlib.Path | None, cand: Any, mesh: Any) -> tuple[str, float | None]:
    """The compiled HLO text of ``case`` (from ``cache`` when there) and the compile's seconds (None: cached)."""
    path = cache / (case.label.replace("/", "_").replace(" ", "__").replace(",", "_") + ".hlo") if cache else None
    if path is not None and path.exists():
        return path.read_text(), None
    start = time.perf_counter()
    text = _compile(case, cand, mesh)
    seconds = time.perf_counter() - start
    if path is not None:
        path.write_text(text)
    return text, seconds


# --- the program's collectives, classified -------------------------------------------------------------------


def _subtree(program: ScheduledProgram, name: str) -> list[str]:
    """``name`` and every computation it runs, depth first, each once."""
    by_name = {c.name: c for c in program.computations}
    out: list[str] = []
    stack = [name]
    while stack:
        n = stack.pop()
        if n in out or n not in by_name:
            continue
        out.append(n)
        for op in by_name[n].ops:
            stack.extend(reversed(op.callees))
    return out


def layer_loops(program: ScheduledProgram, layers: int) -> list[tuple[str, int, list[str]]]:
    """``(loop op, trips, computations of its subtree)`` of each loop over the layers, in schedule order: a
    loop of ``layers`` trips that is not one of XLA:TPU's windowed-einsum loops, found from the entry down
    through calls (not inside another layer loop)."""
    by_name = {c.name: c for c in program.computations}
    found: list[tuple[str, int, list[str]]] = []

    def walk(comp: str, depth: int) -> None:
        if depth > 8 or comp not in by_name:
            return
        for op in by_name[comp].ops:
            if op.kind == "loop" and op.trips == layers and op.callees and "windowed" not in op.callees[0]:
                found.append((op.name, op.trips, _subtree(program, op.callees[0])
                              + ([op.callees[1]] if len(op.callees) > 1 else [])))
            elif op.kind in ("loop", "call", "conditional"):
                for callee in op.callees:
                    walk(callee, depth + 1)

    walk(program.entry, 0)
    return found


def _axes_of(group: Sequence[int], sizes: Sequence[int], names: Sequence[str]) -> tuple[str, ...]:
    """The mesh axes along which a replica group's devices differ (partition ``i`` is the mesh's device ``i``)."""
    if len(group) < 2:
        return ()
    coords = np.array(np.unravel_index(np.asarray(group), tuple(sizes))).T
    return tuple(n for k, n in enumerate(names) if len(set(coords[:, k].tolist())) > 1)


def _windowed_kind(program: ScheduledProgram, comp: str, index: int) -> str:
    """``"ag"`` / ``"rs"``: the windowed-einsum loop a permute at ``index`` of ``comp`` belongs to (its own
    computation's name, else the next windowed loop of ``comp``); ``""``: none."""
    if "windowed_dot_general_body_ag" in comp:
        return "ag"
    if "windowed_dot_general_body_rs" in comp:
        return "rs"
    ops = next(c for c in program.computations if c.name == comp).ops
    for op in ops[index:]:
        if op.kind == "loop" and op.callees:
            body = op.callees[0]
            if "windowed_dot_general_body_ag" in body:
                return "ag"
            if "windowed_dot_general_body_rs" in body:
                return "rs"
    return ""


def role_of(program: ScheduledProgram, comp: str, index: int, names: Sequence[str], sizes: Sequence[int]) -> str:
    """The class of the collective at ``index`` of computation ``comp`` (see the module docstring)."""
    op = next(c for c in program.computations if c.name == comp).ops[index]
    coll = op.collective
    assert coll is not None
    axes = set()
    for g in coll.groups[:4]:
        axes |= set(_axes_of(g, sizes, names))
    if coll.nbytes <= 64 * 1024:  # scalars and norms' gradients: the loss, the gradient norm, tiny vectors
        return "other"
    if "tp" in axes:
        return "tp"
    if "ep" in axes or coll.kind in ("all-to-all", "ragged-all-to-all"):
        return "ep"
    if not axes or not axes <= set(BATCH_AXES):
        return "other"
    if coll.kind == "all-gather":
        return "gather"
    if coll.kind in ("reduce-scatter", "all-reduce"):
        return "grads"
    if coll.kind == "collective-permute":
        return {"ag": "gather", "rs": "grads"}.get(_windowed_kind(program, comp, index), "other")
    return "other"


def simulated_classes(program: ScheduledProgram, case: Case, links: Any) -> dict[str, Any]:
    """The simulated step and its collectives' seconds / exposed seconds by (role, where, link)."""
    cluster = parse_cluster(case.cluster)
    t = simulate_schedule(program, default_roofline(cluster.device), links, top=10 ** 6)
    loops = layer_loops(program, case.layers)
    where_of: dict[str, str] = {}
    for k, (_, _, comps) in enumerate(loops[:2]):
        for c in comps:
            where_of.setdefault(c, ("fwd", "bwd")[k])
    index = {(c.name, op.name): i for c in program.computations for i, op in enumerate(c.ops)}
    classes: dict[str, list[float]] = {}
    for c in t.collectives:
        if c.kind == "copy":
            continue
        comp, _, opname = c.name.rpartition("/")
        role = role_of(program, comp, index[(comp, opname)], case.names, case.sizes)
        key = f"{role}/{where_of.get(comp, 'edge')}/{c.link}"
        acc = classes.setdefault(key, [0.0, 0.0, 0])
        acc[0] += c.seconds
        acc[1] += c.exposed_s
        acc[2] += c.calls
    windows = []
    for _, trips, comps in loops[:2]:
        s = sum(o.seconds for o in t.top_ops if o.name.rpartition("/")[0] in comps)
        windows.append(s / trips)
    return {"step_s": t.step_s, "compute_s": t.compute_s, "exposed_s": t.exposed_s,
            "layer_loops": len(loops), "window_s": windows,
            "classes": {k: {"seconds": v[0], "exposed_s": v[1], "calls": int(v[2])} for k, v in sorted(classes.items())},
            "approximations": list(t.approximations)}


def screen_classes(cand: Any) -> dict[str, Any]:
    """What the screen prices for the mesh: collective seconds and exposed seconds by (overlap class, link)."""
    classes: dict[str, list[float]] = {}
    for term in cand.comm:
        link = "inter" if "inter" in term.link else "intra"
        acc = classes.setdefault(f"{overlap_class(term.what, term.kind)}/{link}", [0.0, 0.0])
        acc[0] += term.seconds
        acc[1] += term.exposed or 0.0
    step = cand.step
    return {"step_s": step.step_s, "compute_s": step.compute_s, "exposed_s": step.exposed_s,
            "classes": {k: {"seconds": v[0], "exposed_s": v[1]} for k, v in sorted(classes.items())}}


def _domains(case: Case, mesh: Any) -> tuple[int, ...]:
    cluster = parse_cluster(case.cluster)
    devices = list(mesh.devices.flat)
    if cluster.device.ici_scope == "slice":
        return tuple(int(getattr(d, "slice_index", 0) or 0) for d in devices)
    return tuple(int(getattr(d, "process_index", 0) or 0) for d in devices)


def run_case(case: Case, cache: pathlib.Path | None) -> dict[str, Any]:
    """One grid row (see the module docstring); a failed compile is a row with its error."""
    row: dict[str, Any] = {"case": case.label, "cluster": case.cluster, "model": case.model, "layers": case.layers,
                           "mesh": dict(case.mesh), "batch": case.batch, "seq": case.seq, "remat": case.remat,
                           "backend": "tpu" if _is_tpu(case) else "gpu", "tokens_per_device": case.tokens_per_device}
    cand = _candidate(case)
    row["screen"] = screen_classes(cand)
    try:
        mesh = _mesh(case, cand)
        text, seconds = program_text(case, cache, cand, mesh)
    except (MeshplanError, RuntimeError, ValueError) as err:  # a failed compile is one row's outcome
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return row
    row["compile_s"] = seconds
    program = read_schedule(text)
    links = schedule_links(parse_cluster(case.cluster), _domains(case, mesh))
    row["simulated"] = simulated_classes(program, case, links)
    return row


def _fmt_share(block: Mapping[str, Any], role: str, link: str | None = None) -> str:
    s = e = 0.0
    for key, v in block.items():
        parts = key.split("/")
        if parts[0] == role and (link is None or parts[-1] == link):
            s += v["seconds"]
            e += v["exposed_s"]
    return "-" if s == 0 else f"{e / s:.2f} of {s * 1e3:.1f}"


def print_row(row: Mapping[str, Any]) -> None:
    if "error" in row:
        print(f"| {row['case']} | {row['error']} |", flush=True)
        return
    sim, scr = row["simulated"], row["screen"]
    c = row["compile_s"]
    print(f"| {row['case']} | {row['tokens_per_device']} | {_fmt_share(sim['classes'], 'gather')} | "
          f"{_fmt_share(scr['classes'], 'gather')} | {_fmt_share(sim['classes'], 'grads')} | "
          f"{_fmt_share(scr['classes'], 'grads')} | {sim['step_s'] * 1e3:.1f} | {scr['step_s'] * 1e3:.1f} | "
          f"{'cached' if c is None else f'{c:.0f}'} |", flush=True)


# --- the rule, fitted ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Window:
    """One recorded row as the screen sees it: per-layer windows and the collectives sharing them (seconds)."""

    case: str
    layers: int
    forward: float  # a layer's forward compute
    backward: float  # a layer's backward compute (recompute included)
    gathers_fwd: float  # a layer's parameter all-gathers in its forward (the edge's spread over the layers)
    gathers_bwd: float
    grads: float  # a layer's gradient syncs (the edge's spread likewise)
    exposed: float  # the simulated step's exposed seconds of those collectives (the whole step's)
    step: float  # the simulated step


def windows(rows: Sequence[Mapping[str, Any]]) -> list[Window]:
    """The rows that compiled, as :class:`Window` records (gathers and syncs outside the layer loops, the
    embedding's and the data-parallel all-reduce after the loop, spread over the layers as the screen does)."""
    out = []
    for r in rows:
        if "simulated" not in r or len(r["simulated"]["window_s"]) < 2:
            continue  # not compiled, or no forward and backward layer loop to window (XLA:TPU across slices)
        sim, n = r["simulated"], r["layers"]
        c = sim["classes"]

        def total(prefix: str, key: str = "seconds") -> float:
            return sum(v[key] for k, v in c.items() if k.startswith(prefix))

        edge_g = total("gather/edge")
        out.append(Window(r["case"], n, sim["window_s"][0], sim["window_s"][1],
                          (total("gather/fwd") + edge_g / 2) / n, (total("gather/bwd") + edge_g / 2) / n,
                          total("grads") / n, total("gather", "exposed_s") + total("grads", "exposed_s"),
                          sim["step_s"]))
    return out


def rule_exposed(w: Window, a_g: Any, a_r: Any, b: Any) -> Any:
    """The rule's exposed seconds of ``w``'s collectives over its layers (numpy-broadcast in the coefficients)."""

    def one(g: float, r: float, window: float) -> Any:
        return a_g * g + a_r * r + np.maximum(0.0, (1 - a_g) * g + (1 - a_r) * r - b * window)

    return w.layers * (one(w.gathers_fwd, 0.0, w.forward) + one(w.gathers_bwd, w.grads, w.backward))


def fit_rule(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, float]:
    """``(a_g, a_r, b)`` minimising the squared error of the exposed seconds as a share of the simulated step,
    over a grid: ``a_g`` and ``a_r`` in ``[0, 1]`` and ``b`` in ``[0, 2]``, steps of 0.02."""
    a_g = np.linspace(0, 1, 51)[:, None, None]
    a_r = np.linspace(0, 1, 51)[None, :, None]
    b = np.linspace(0, 2, 101)[None, None, :]
    err = sum(((rule_exposed(w, a_g, a_r, b) - w.exposed) / w.step) ** 2 for w in windows(rows))
    i, j, k = np.unravel_index(int(np.argmin(err)), np.shape(err))
    return round(float(a_g.ravel()[i]), 2), round(float(a_r.ravel()[j]), 2), round(float(b.ravel()[k]), 2)


def print_fit(rows: Sequence[Mapping[str, Any]]) -> None:
    """The fitted rule and each row's step under it and under the best case, over the simulated step."""
    from meshplan.pure.cost import OVERLAP_FIT

    fitted = fit_rule(rows)
    print(f"fitted (a_g, a_r, b) = {fitted}; shipped OVERLAP_FIT['gpu'] = {OVERLAP_FIT['gpu']}\n")
    print("| case | simulated step ms | rule / simulated | best case / simulated |")
    print("|---|---:|---:|---:|")
    ratios, best = [], []
    for w in windows(rows):
        rest = w.step - w.exposed
        ratios.append((rest + float(rule_exposed(w, *fitted))) / w.step)
        best.append((rest + float(rule_exposed(w, 0.0, 0.0, 1.0))) / w.step)
        print(f"| {w.case} | {w.step * 1e3:.1f} | {ratios[-1]:.3f} | {best[-1]:.3f} |")
    for name, xs in (("rule", ratios), ("best case", best)):
        print(f"\n{name}: {min(xs):.3f}-{max(xs):.3f}x the simulated step, median |ln| "
              f"{float(np.median(np.abs(np.log(xs)))):.4f}", end="")
    print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="the H100 cases (default: both)")
    parser.add_argument("--tpu", action="store_true", help="the TPU cases (default: both)")
    parser.add_argument("--only", default="", help="only the cases whose label contains this")
    parser.add_argument("--cache", type=pathlib.Path, help="keep compiled HLO texts in this directory")
    parser.add_argument("--record", type=pathlib.Path, help="write the rows here (JSON lines)")
    parser.add_argument("--fit", type=pathlib.Path, help="fit the rule to these recorded rows (no compiles)")
    args = parser.parse_args(argv)
    if args.fit:
        print_fit([json.loads(line) for line in args.fit.read_text().splitlines() if line.strip()])
        return
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    both = not args.gpu and not args.tpu
    cases = (_gpu_cases() if args.gpu or both else []) + (_tpu_cases() if args.tpu or both else [])
    cases = [c for c in cases if args.only in c.label]
    print("exposed share of the simulated / screened collectives (exposed / seconds, of ms)\n")
    print("| case | tokens/device | gathers simulated | gathers screen | grads simulated | grads screen | "
          "step simulated ms | step screen ms | compile s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for case in cases:
        row = run_case(case, args.cache)
        rows.append(row)
        print_row(row)
        if args.record:
            args.record.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


if __name__ == "__main__":
    main()
