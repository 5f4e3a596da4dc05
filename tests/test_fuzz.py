"""Nested garbage into every public callable: only typed meshplan errors may come out.

Every name in ``__all__`` of ``meshplan``, ``meshplan.pure`` and every public
room of the core (each ``meshplan/pure/<room>/`` package not named ``_...``,
found on disk: ``mesh``, ``specs``, ``rules``, ``presets``, ``cluster``,
``cost``, ``xla``, ``search``, ``verify``, ``report`` today) is enumerated, so
a new public name, or a new room, is fuzzed without touching this file:
functions are called, classes are constructed, and their public methods,
classmethods and properties are called on a valid instance (see
``_instances``). Each argument is drawn either from a pool of garbage (None,
bools, huge/negative/nan numbers, ``10**400``, numpy scalars, arrays and
scalar *types*, odd strings, bytes, nested containers, objects with a string
``.shape``, ShapeDtypeStructs of absurd shapes, PartitionSpecs with junk) or
from plausible values for that parameter name (``_plausible``). Half the
calls mix the two in every argument; the other half give one argument garbage
and the others plausible values, so the garbage gets past the checks of the
arguments before it and reaches the code that reads it.
tests/test_fuzz_selfcheck.py checks that this machinery fails on a callable
that leaks a raw error, and that a name added to a public ``__all__`` is
fuzzed; tests/test_fuzz_report_file.py edits a saved plan report field by
field and renders what reads back.

The contract checked: a call returns, or raises a
:class:`~meshplan.errors.MeshplanError` that is also a ``ValueError`` or
``TypeError``. The one exception is the user's own code: a rule or function
the caller passed in (here :class:`_UserRule`, which raises :class:`_UserBug`)
may raise, and its exception passes through unwrapped (so does a step given to
``compiled_memory`` / ``compiled_collectives`` that fails while jax traces it; a
class as the step, or an argument jax cannot trace, is a typed error up front).

An absurd input must be refused, not computed: a call that returns after more
than ``_SLOW_S`` fails the test. No call is ever interrupted: an exception
raised by a signal handler inside jax leaves its tracing state half-updated and
every later call fails (a deep run used to end in a cascade of RecursionErrors
that way). A call that truly hangs is caught by a watchdog thread instead
(``faulthandler``): after ``_HANG_S`` it prints every thread's traceback and
ends the process, which a hang would otherwise block forever.

The garbage nests at most ``_DEPTH`` containers deep: hypothesis's
``st.recursive`` bounds leaves, not depth (empty containers cost no leaf), and
a deep enough draw overflows the recursion of hypothesis's own internals.

The default run draws ``_EXAMPLES`` (10) calls per callable, so the CI run stays quick;
``HYPOTHESIS_PROFILE=deep`` runs 40x the examples (about 8 minutes on 2 busy cores). Run it with the address
space bounded, so a call that allocates without bound (``canonical_entries(spec, 2**31)`` padded a 16 GB
tuple) fails here as a raw ``MemoryError`` instead of waking the kernel's OOM killer:
``(ulimit -v 8000000; HYPOTHESIS_PROFILE=deep nice .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_fuzz.py)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import importlib
import inspect
import math
import os
import pkgutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.errors import MeshplanError
from tests.recursion import recursion_budget


def _public_modules() -> tuple[str, ...]:
    """``meshplan``, ``meshplan.pure`` and every public subpackage of it, found on disk, not listed by hand.

    A new room (``meshplan/pure/<name>/`` with an ``__init__``) is fuzzed the day it lands; a name starting
    with ``_`` is private and left out.
    """
    import meshplan.pure

    rooms = sorted(info.name for info in pkgutil.iter_modules(meshplan.pure.__path__, "meshplan.pure.")
                   if info.ispkg and not info.name.rsplit(".", 1)[1].startswith("_"))
    return ("meshplan", "meshplan.pure", *rooms)


_MODULES = _public_modules()
# Not fuzzed, each for a reason (keep this short):
_SKIP = {
    # protocols and abstract bases: calling them is Python's own TypeError by design, not meshplan code
    "Rule", "CollectiveKind", "ShardingRule",
    # compiles a real training step per call (seconds each): too slow to fuzz in a unit test
    "reference_step", "pipeline_step",
    # runs micro-benchmarks on every device per call (seconds each); its arguments are checked in
    # tests/facade/test_profile.py
    "profile_machine",
    # connects to the network address it is given (a garbage string waits out the connect timeout);
    # tests/facade/test_executor_dask.py gives it real and unreachable addresses
    "dask_executor",
}
# Fuzzed with garbage only, never the plausible values of _plausible(): a valid SearchResult would make each
# example compile the plan's top meshes (tens of seconds a call); their checks of garbage are still fuzzed.
_GARBAGE_ONLY = {"verify_plan", "verify_pipelines"}
# Escapes found by this test and not fixed yet (label -> why); each is an xfail, not a pass, so
# fixing one turns it into an XPASS to clean up here. Empty: every escape found so far is fixed at its root.
_KNOWN_ESCAPES: dict[str, str] = {}
# Public classes whose methods are not fuzzed for want of a factory in _instances() (name -> why).
# Empty: every public class with methods has one.
_NO_INSTANCE_YET: dict[str, str] = {}
_DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
_EXAMPLES = 400 if _DEEP else 10
_SLOW_S = 20.0  # generous: the default run shares 2 cores with other work; an absurd input takes hours
_HANG_S = 120.0  # the watchdog: past this, one call is hung, and the process ends with every traceback
_DEPTH = 3


class _UserBug(Exception):
    """Raised by the user's own code (a rule); allowed to pass through."""


class _UserRule:
    """A user's rule that is broken: meshplan must let its exception through, not hide it."""

    name = "users-rule"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Any arguments: also given as a step to compiled_memory, it must fail as the user's code, not on
        # its signature (a TypeError from calling it with the wrong arguments read as meshplan's escape).
        raise _UserBug("the user's rule failed")


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


class _StringShape:
    shape = "abc"
    dtype = "float32"


class _BadDtype:
    shape = (4, 4)
    dtype = {"not": "a dtype"}


def _safe(make: Callable[[], Any]) -> list[Any]:
    try:
        return [make()]
    except Exception:  # a jax version that refuses this junk at construction: leave it out
        return []


def _garbage_atoms() -> list[Any]:
    sds = jax.ShapeDtypeStruct
    atoms: list[Any] = [
        None, True, False, 0, 1, -1, 2, 3, 4, 8, 7, -5, 2**31, 2**63, -(2**63), 2**80, 10**400,
        0.0, -0.0, 0.5, 2.0, 1e308, float("nan"), float("inf"), -float("inf"), complex(1, 2),
        np.int64(4), np.int8(-3), np.uint64(2**64 - 1), np.float32("nan"), np.float64(2.0), np.bool_(True),
        np.array([1, 2]), np.zeros((2, 2)), np.array("x"), np.array([]), np.array(3),
        np.float32, np.int32, np.dtype("float32"), np.dtype("O"), np.dtype("U3"), int, str, object, type,
        "", "x", "dp", "tp", "data", "float32", "bfloat16", "dp:2,tp:4", "8x8xH100", "H100", "v5p-64",
        "99999999999999999999x8xH100", "2x4xH100", "gpt2", "\udcff\udcfe", "\x00", "é" * 3, "a" * 300,
        b"\xff\xfe", b"dp", bytearray(b"x"), object(), _Opaque(), _StringShape(), _BadDtype(), _UserRule(),
        Ellipsis, slice(None), range(3), {1, 2}, frozenset({"dp"}), lambda *a, **k: None,
        sds((8, 4), np.float32), sds((), np.float32), sds((2**40, 2**40), np.float32), sds((0, 3), np.int8),
        sds((3, 5), jax.numpy.bfloat16), sds((1024, 4096), np.float32),
        P(), P("dp"), P("dp", "tp"), P(("dp", "tp")), P(None, "dp"), P("nope"), P("dp", "dp"),
    ]
    atoms += _safe(lambda: P(3))
    atoms += _safe(lambda: P(("dp", 4)))
    atoms += _safe(lambda: sds((-1, 4), np.float32))
    atoms += _safe(lambda: P(P.UNCONSTRAINED))
    return atoms


_ATOMS = _garbage_atoms()
_keys = st.one_of(st.sampled_from(["dp", "tp", "w", "data", "", "params", "name", "model"]), st.integers(-2, 3),
                  st.none())


def _nested(depth: int) -> st.SearchStrategy[Any]:
    """Atoms, and lists / tuples / dicts of them nested at most ``depth`` deep (see the module docstring)."""
    strategy: st.SearchStrategy[Any] = st.sampled_from(_ATOMS)
    for _ in range(depth):
        inner = strategy
        strategy = st.one_of(
            st.sampled_from(_ATOMS),
            st.lists(inner, max_size=4),
            st.lists(inner, max_size=4).map(tuple),
            st.dictionaries(_keys, inner, max_size=3),
        )
    return strategy


garbage = _nested(_DEPTH)


@functools.cache
def _search_result() -> Any:
    """One small search (a few tenths of a second), for every instance and plausible value that needs one."""
    from meshplan.pure.search import search_meshes

    return search_meshes("gpt2", "1x8xH100", batch=8, seq=128)


def _plausible() -> dict[str, list[Any]]:
    """Valid-looking values per parameter name, so garbage in one argument reaches deeper checks."""
    from meshplan.pure import DeviceInfo, HybridMeshShape, MeshShape, parse_cluster
    from meshplan.pure.cluster import DEVICE_SPECS, Link

    sds = jax.ShapeDtypeStruct
    tree = {"w": sds((64, 32), np.float32), "b": sds((32,), np.float32)}
    sizes = {"dp": 2, "tp": 4}
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    names = ("dp", "tp")
    cluster = parse_cluster("2x4xH100")
    link = Link(1e11, 1e-6)
    infos = tuple(DeviceInfo(i, process_index=i // 4) for i in range(8))
    table = {
        "tree": [tree], "pytree": [tree], "params": [tree], "x": [tree["w"]], "opt_state": [(tree, tree)],
        "specs": [{"w": P("dp"), "b": P()}], "param_specs": [{"w": P("dp"), "b": P()}],
        "partition_specs": [{"w": P("dp"), "b": P()}], "spec": [P("dp", "tp"), P()],
        "partition_spec": [P("dp")], "axis_sizes": [sizes, {"dp": 8}], "mesh": [mesh, None],
        "axis_names": [names, ["dp", "tp"]], "names": [names], "mesh_axis_names": [names],
        "axis_dims": [(2, 4), (2, -1)], "dims": [(2, 4)], "mesh_shape": [(2, 4)], "global_mesh_shape": [(2, 4)],
        "global_shape": [(2, 4)], "dcn_mesh_dims": [(1, 1), None], "shape": [(64, 32), HybridMeshShape((2, 4), (1, 1))],
        "array_shape": [(64, 32)], "global_batch_shape": [(16, 8)], "dtype": ["float32", np.float32],
        "num_devices": [8], "total_devices": [8], "num_granules": [1, 2], "num_processes": [1, 2], "total": [8],
        "num_axes": [2], "devices_per_granule": [4], "devices": [infos], "cluster": [cluster, "2x4xH100"],
        "model": ["gpt2"], "name": ["gpt2", "x"], "text": ["2x4xH100", "dp:2,tp:4"], "link": [link],
        "intra": [link], "inter": [link], "nbytes": [1 << 20], "n": [4], "kind": ["all_gather"],
        "device": [DEVICE_SPECS["H100"]], "rule": [_UserRule()], "rules": [(("w", P("dp")),)],
        "batch_axis_names": ["dp", ("dp",)], "process_grid": [(1, 1)], "timeout": [1.0, 5],
        "mesh_rules": [(("cpu", (2, 4)),)], "selector": ["cpu"], "data": [{}], "hybrid": [HybridMeshShape((2, 4), (1, 1))],
        "keypath": [()], "entries": [("dp", None)], "rank": [2, None], "max_memory_per_device": [1 << 20],
        "methods": [[("dp",)]], "patterns": [((".*", P()),)], "shape_patterns": [{".*": P()}],
        "batch": [8], "seq": [128], "axes": [("dp", "tp")], "fixed": [{"tp": 2}], "top_k": [3],
        "global_shape_": [(2, 4)], "mesh_shape_": [MeshShape(names, (2, 4))], "fn": [lambda t: t],
        "device_ids": [np.arange(8).reshape(2, 4)], "ici_domain_size": [4], "path": ["w", "a/b/0"],
    }
    table.update(_plausible_planning(link))
    return table


def _plausible_planning(link: Any) -> dict[str, list[Any]]:
    """Valid-looking values for the cost, search, verify and report rooms' parameters (one search, reused)."""
    from meshplan.pure import cost, presets, report, rules, verify
    from meshplan.pure.specs import tree_facts

    gpt2 = presets.MODEL_SPECS["gpt2"]
    result = _search_result()
    row = verify.VerifyRow("fsdp=8", 1, 100, 200, "8 x XLA:CPU", peak_bytes=125)
    ints = [1, 2, 4, 8]
    table: dict[str, list[Any]] = {
        "model": ["gpt2", gpt2, presets.MODEL_SPECS["mixtral-8x7b"]], "sizes": [{"dp": 8}, {"fsdp": 4, "tp": 2}],
        "recipe": [cost.TrainingRecipe()], "flops": [cost.step_flops(gpt2, {"dp": 8}, batch=8, seq=128)],
        "terms": [[("fsdp all-gather", "all-gather", 0.2)], result.best.comm], "layers": [12], "tokens": [1024],
        "peak_flops": [1e15, None], "efficiency": [0.5], "moe_layer": [False, True], "seq": [128],
        "report": [report.PlanReport(result), result], "result": [result], "value": [result],
        "base": [row], "outcome": [verify.CompileOutcome("8 x XLA:CPU", None, oom=True)], "compiler": ["XLA:CPU"],
        "cached": [False], "peak_bytes": [125], "budget_bytes": [200], "deviceless": [False, True],
        "range_highs": [(100, None, 300)], "decided": [{0: "exact"}], "top": [2], "start": [0],
        "cand": [result.best], "candidate": [result.best], "stages": ints, "micro_batches": ints,
        "num_layers": [12], "backend": ["gpu", "tpu", "cpu"], "itemsize": [2], "stage_layout": [{"fsdp": 4}],
        "pp": [2], "boundary_link": [link], "data_link": [link], "tp": ints, "fsdp": ints, "dp": ints,
        "shards": ints, "attention": ["flash"], "remat": ["full"], "mem_fraction": [0.75, None],
        "spans_nodes": [True, False], "fmt": ["json", "flax", "maxtext"], "schedule": ["1f1b", "gpipe"],
        "virtual": [1, 2], "rows": [(row,)], "status": ["exact", "estimate"], "target": ["8 x XLA:CPU"],
        "dims": [(("mlp/wi/kernel", ("layers", "in", "out")),), (2, 4)], "num_heads": [8, None],
        "num_kv_heads": [8, None], "num_experts": [8, None], "convention": ["auto"], "capacity_factor": [1.25],
        "moe_dispatch": ["einsum", "dropless"], "top_k": [2, 3], "experts": [8], "stage": [0, 1],
        "ctx": [rules.LeafContext((64, 32), np.dtype("float32"), {"fsdp": 4, "tp": 2}, 0,
                                  tree_facts({"mlp": {"up_proj": {"weight": np.zeros((64, 32))}}}))],
        "template": ["model/layers/*/mlp/up_proj/weight"], "fsdp_axis": ["fsdp"], "tp_axis": ["tp"],
        "ep_axis": ["ep"],
    }
    return table


_PLAUSIBLE: dict[str, list[Any]] | None = None


def _arg(name: str, plausible: bool = True, *, good_only: bool = False) -> st.SearchStrategy[Any]:
    """Garbage or a plausible value for the parameter ``name``; only a plausible one with ``good_only``."""
    global _PLAUSIBLE
    if not plausible:
        return garbage
    if _PLAUSIBLE is None:
        _PLAUSIBLE = _plausible()
    good = _PLAUSIBLE.get(name)
    if good:
        return st.sampled_from(good) if good_only else st.one_of(garbage, st.sampled_from(good))
    return garbage


def _has_plausible(name: str) -> bool:
    return bool(_PLAUSIBLE and _PLAUSIBLE.get(name))


@st.composite
def _call_args(draw: st.DrawFn, fn: Callable[..., Any], plausible: bool = True) -> tuple[list[Any], dict[str, Any]]:
    """Arguments for ``fn``: every required parameter, and each optional one half of the time.

    Half the calls mix garbage and plausible values in every argument; the other half give one argument
    garbage and every other one a plausible value where ``_plausible`` has one, so the garbage gets past
    the checks of the arguments before it and reaches the code that reads it (with every argument mixed,
    a call of eight parameters is almost always refused at its first).
    """
    params = [p for p in inspect.signature(fn).parameters.values()
              if not (p.name.startswith("_") or p.name == "self" or p.kind is p.VAR_KEYWORD)]
    bad = draw(st.one_of(st.just(-1), st.integers(0, len(params) - 1))) if plausible and params else -1
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for i, p in enumerate(params):
        good_only = bad not in (-1, i)
        strategy = _arg(p.name, plausible, good_only=good_only)
        if p.kind is p.VAR_POSITIONAL:
            args += draw(st.lists(strategy, max_size=2))
            continue
        # An optional argument is left out half the time, and always where it should be valid but only
        # garbage is known for it (its default is valid).
        if p.default is not p.empty and i != bad and (good_only and not _has_plausible(p.name)
                                                       or not draw(st.booleans())):
            continue
        value = draw(strategy)
        if p.kind is p.POSITIONAL_ONLY or (p.kind is p.POSITIONAL_OR_KEYWORD and not kwargs):
            args.append(value)
        else:
            kwargs[p.name] = value
    # A ``**options`` parameter gets an extra keyword half the time: an unknown name, or one the callable
    # passes on alongside its own (``num_heads`` to AxisKindRule.for_model), must be refused, not forwarded
    # into a raw "unexpected keyword" TypeError.
    takes_options = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    if takes_options and draw(st.booleans()):
        name = draw(st.sampled_from(["not_a_parameter", "num_heads", "target", "x"]))
        kwargs.setdefault(name, draw(garbage))
    return args, kwargs


@contextlib.contextmanager
def _watchdog() -> Iterator[None]:
    """End the process with every thread's traceback if the body runs past ``_HANG_S`` (it is never interrupted)."""
    faulthandler.dump_traceback_later(_HANG_S, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _check_call(label: str, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Call ``fn``; fail unless it returns or raises a typed meshplan error (or the user's own error)."""
    start = time.perf_counter()
    try:
        with _watchdog():
            out = fn(*args, **kwargs)
            repr(out)  # a returned object must be printable (Plan.__repr__, dataclass reprs)
    except _UserBug:
        out = None
    except MeshplanError as err:
        assert isinstance(err, (ValueError, TypeError)), f"{label}: {type(err).__name__} is not a Value/TypeError"
        str(err)
        out = None
    except BaseException as err:
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise AssertionError(
            f"{label}(*{args!r:.400}, **{kwargs!r:.400}) raised {type(err).__name__}: {err!s:.400}"
        ) from err
    seconds = time.perf_counter() - start
    if seconds > _SLOW_S:
        pytest.fail(f"{label}(*{args!r:.300}, **{kwargs!r:.300}) took {seconds:.0f} s (> {_SLOW_S:.0f} s): an "
                    "absurd input must be refused, not computed")
    return out


# The schedule simulator's own example program: a gather started beside a matmul and waited for after it.
_TWO_OP_HLO = """HloModule m, num_partitions=2
ENTRY %main (p: bf16[1024,1024]) -> bf16[1024,1024] {
  %p = bf16[1024,1024]{1,0} parameter(0)
  %ag = ((bf16[1024,1024]{1,0}), bf16[2048,1024]{1,0}) all-gather-start(%p), replica_groups=[1,2]<=[2], dimensions={0}
  %d = bf16[1024,1024]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %g = bf16[2048,1024]{1,0} all-gather-done(%ag)
  ROOT %t = (bf16[1024,1024]{1,0}, bf16[2048,1024]{1,0}) tuple(%d, %g)
}"""


def _instances() -> dict[str, Callable[[], Any]]:
    """A valid instance per public class, so its methods and properties are fuzzed too."""
    import meshplan
    from meshplan import pure
    from meshplan.pure import mesh as pmesh
    from meshplan.pure import cluster, compare, cost, presets, report, rules, search, serve, specs, verify, xla

    sds = jax.ShapeDtypeStruct

    def _compare_option(nodes: int = 1) -> Any:
        return compare.CompareOption(f"{nodes}x8xH100", "H100", 8 * nodes, True, "fsdp=8", "estimate", 2**30, 2**31,
                                     2.0 / nodes, 8192, 0.4, price_per_device_hour=2.0)
    tree = {"w": sds((64, 32), np.float32), "b": sds((32,), np.float32)}

    gpt2 = presets.MODEL_SPECS["gpt2"]

    result = _search_result

    def program() -> Any:
        return xla.read_schedule(_TWO_OP_HLO)

    def simulated() -> Any:
        return cost.simulate_schedule(program(), cost.Roofline(1e12, 1e15, cost.SizeEfficiency(1.0)),
                                      cost.ScheduleLinks(cluster.Link(1e9, 0.0), cluster.Link(1e9, 0.0)))

    def timings() -> Any:
        return [cluster.CollectiveTiming("intra", "all-reduce", 4, b, 6e-5 + 1.5 * b / 1e10) for b in (2**20, 2**24)]

    def profile() -> Any:
        rows = tuple(cluster.CollectiveTiming("intra", "all-gather", 8, b, 7e-5 + 0.875 * b / 2e11)
                     for b in (2**20, 2**26))
        return cluster.MachineProfile("NVIDIA H100 80GB HBM3", "gpu", 8, 1, (), "2026-01-02T03:04:05Z",
                                      collectives=rows)

    def serve_plan() -> Any:
        return serve.plan_serving("llama3.1-8b", "H100", context=2048, concurrency=8)

    def flops() -> Any:
        return cost.step_flops(gpt2, {"dp": 8}, batch=8, seq=128)

    def mesh() -> Any:
        return meshplan.create_mesh((2, 4), ("dp", "tp"))

    def reference() -> Any:
        # A one-layer gpt2 of width 64: building takes ~0.05 s and lower() ~0.3 s on CPU.
        tiny = dataclasses.replace(presets.MODEL_SPECS["gpt2"], num_layers=1, hidden_size=64, num_heads=2,
                                   num_kv_heads=2, head_dim=32, intermediate_size=128, vocab_size=256,
                                   num_params=None)
        return meshplan.reference_step(tiny, mesh(), batch=8, seq=16)

    def pipeline() -> Any:
        # Two one-layer stages of width 64 over pp=2: building takes ~0.1 s, lower() ~1 s on CPU.
        tiny = dataclasses.replace(presets.MODEL_SPECS["llama3-8b"], num_layers=2, hidden_size=64, num_heads=2,
                                   num_kv_heads=2, head_dim=32, intermediate_size=128, vocab_size=256,
                                   num_params=None)
        return meshplan.pipeline_step(tiny, meshplan.create_mesh((2, 4), ("pp", "dp")), batch=8, seq=16,
                                      micro_batches=2)

    def step_memory() -> Any:
        dims = cost.layer_dims(presets.MODEL_SPECS["llama3-8b"])
        return cost.step_memory(dims, {"fsdp": 8}, cost.TrainingRecipe(), batch=8, seq=4096,
                                  params=2 * 10**9, grads=2 * 10**9, optimizer=8 * 10**9)

    logical = (("embed", "dp"), ("mlp", "tp"))

    return {
        "Plan": lambda: pure.plan_tree(tree, pure.AutoRule(min_shard_size=1), {"dp": 2, "tp": 4}),
        "MeshShape": lambda: pure.MeshShape(("dp", "tp"), (2, 4)),
        "HybridMeshShape": lambda: pure.HybridMeshShape((2, 4), (1, 1)),
        "Cluster": lambda: pure.parse_cluster("2x4xH100"),
        "DeviceSpec": lambda: cluster.DEVICE_SPECS["H100"],
        "SearchResult": result,
        "SearchRequest": lambda: result().request,
        "MeshCandidate": lambda: result().best,
        "MemoryBreakdown": lambda: result().best.memory,
        "CommTerm": lambda: result().best.comm[0],
        "ParamGroup": lambda: result().best.groups[0],
        "ActivationLayout": lambda: result().best.activations,
        "ActivationSpec": lambda: result().best.activations["residual"],
        "TrainingLayout": lambda: result().best.training_layout(pure.get_preset("gpt2").params),
        "ModelSpec": lambda: presets.MODEL_SPECS["gpt2"],
        "AxisKindRule": lambda: pure.AxisKindRule(num_heads=8, num_kv_heads=8),
        "CompositeRule": lambda: pure.CompositeRule((pure.AutoRule(),)),
        "PathRule": lambda: pure.PathRule((("w", P("dp")),)),
        "TreeFacts": lambda: pure.tree_facts(tree),
        "MemoryEstimate": lambda: pure.estimate_memory(tree, {"w": P("dp"), "b": P()}, {"dp": 2}),
        "TrainingMemoryEstimate": lambda: pure.estimate_training_memory(tree, {"w": P("dp"), "b": P()}, {"dp": 2}),
        "MeshConfig": lambda: meshplan.MeshConfig((2, 4), ("data", "model")),
        "ShardingAnalyzer": lambda: meshplan.ShardingAnalyzer(mesh()),
        "MeshPartitionHelper": lambda: meshplan.MeshPartitionHelper(mesh()),
        "AutoShardingRule": lambda: meshplan.AutoShardingRule(mesh=mesh()),
        "MemoryConstrainedShardingRule": lambda: meshplan.MemoryConstrainedShardingRule(1 << 20, mesh=mesh()),
        "ShapeBasedShardingRule": lambda: meshplan.ShapeBasedShardingRule({(None, 32): P()}, mesh=mesh()),
        "HostBatchSlice": lambda: specs.host_batch_slices((16, 8), ("dp", "tp"), np.arange(2).reshape(2, 1), "dp")[0],
        "MLADims": lambda: presets.MODEL_SPECS["deepseek-v3"].mla,
        "Preset": lambda: presets.get_preset("gpt2"),
        "Rejection": lambda: search.Rejection("memory", 2, "dp=8"),
        "Link": lambda: cluster.Link(1e11, 1e-6),
        "Decision": lambda: pure.Decision(P(), "why", "mine"),
        "CompositeShardingRule": lambda: meshplan.CompositeShardingRule(meshplan.AutoShardingRule(mesh=mesh())),
        "PlanRule": lambda: rules.PlanRule(pure.plan_tree(tree, pure.AutoRule(), {"dp": 2})),
        "MeshRequest": lambda: pmesh.resolve_mesh_request((2, 4), ("dp", "tp"), num_devices=8),
        "LeafContext": lambda: pure.LeafContext((8, 4), np.dtype("float32"), {"dp": 2}),
        "ShardGeometry": lambda: specs.shard_geometry((8, 4), P("dp"), {"dp": 2}),
        "LeafLayout": lambda: pure.leaf_layout("model/layers/0/self_attn/q_proj/weight", (128, 64)),
        "TpuTopology": lambda: cluster.tpu_topology(pure.parse_cluster("v4-8")),
        "LogicalRule": lambda: pure.LogicalRule(logical, names={"w": ("embed", "mlp")}),
        "LogicalShardingRule": lambda: meshplan.LogicalShardingRule(logical, names={"w": ("embed", "mlp")},
                                                                    mesh=mesh()),
        "LogicalExport": lambda: pure.logical_export(pure.plan_tree(tree, pure.AutoRule(min_shard_size=1),
                                                                    {"dp": 2, "tp": 4})),
        "TrainingRecipe": lambda: cost.TrainingRecipe(),
        "StepMemory": step_memory,
        "ReferenceConfig": lambda: meshplan.ReferenceConfig(),
        "ReferenceStep": reference,
        "PipelineStep": pipeline,
        "LiveBuffer": lambda: xla.LiveBuffer("fusion.7", 32768, "f32[2,32,32]", "f32", "temp", "jit(f)/dot"),
        "BufferReport": lambda: xla.BufferReport(3, (xla.LiveBuffer("a", 64, "f32[16]", "f32", "parameter"),
                                                        xla.LiveBuffer("b", 8, "f32[2]", "f32", "temp",
                                                                          memory_space="vmem")), 72),
        "CompiledMemory": lambda: meshplan.compiled_memory(jax.jit(lambda a: a * 2), sds((256,), np.float32)),
        "VerifyRow": lambda: meshplan.VerifyRow("fsdp=8", 1, 100, 200, "8 x XLA:CPU", peak_bytes=125),
        "Measurement": lambda: meshplan.Measurement((), "1x8xXLA:CPU", "cpu", "cpu", "", ()),
        "CompareOption": lambda: _compare_option(),
        "Comparison": lambda: compare.build_comparison("gpt2", None, 1024, [_compare_option()], tokens=10**9),
        "KindScaling": lambda: compare.scaling_knees([_compare_option(), _compare_option(2)])[0],
        "ScalingStep": lambda: compare.scaling_knees([_compare_option(), _compare_option(2)])[0].steps[0],
        "MatmulTiming": lambda: cluster.MatmulTiming("mlp up", 64, 1, 512, 64, 256, "bfloat16", 1e-4),
        "MemoryTiming": lambda: cluster.MemoryTiming(2**20, 1e-4),
        "MachineProfile": lambda: cluster.MachineProfile(
            "cpu", "cpu", 8, 1, (("jax", "0.10.2"),), "2026-01-02T03:04:05Z",
            memory=(cluster.MemoryTiming(2**20, 1e-4),),
            collectives=(cluster.CollectiveTiming("intra", "all-reduce", 8, 2**20, 1e-4),)),
        "StepTiming": lambda: cluster.StepTiming("tiny", 64, "fsdp=8", 8, 32, 3, 0.01, 0.009, 0.011, 2**20, "note",
                                                 0.012, 0.008, 0.02, 0.5, 2**21, None),
        "PlanVerification": lambda: meshplan.PlanVerification(
            (meshplan.VerifyRow("fsdp=8", 1, 100, 200, "8 x XLA:CPU", peak_bytes=125),), (), "XLA:CPU", "", 1.0),
        "CompileOutcome": lambda: verify.CompileOutcome("8 x XLA:CPU", None, oom=True, oom_required_bytes=300,
                                                        oom_available_bytes=200),
        "PlanReport": lambda: report.PlanReport(result()),
        # The schedule rooms: a two-op program read, simulated and summarised (the simulator's own example).
        "ScheduledProgram": program,
        "ScheduledOp": lambda: program().computation("main").ops[1],
        "Roofline": lambda: cost.Roofline(1e12, 1e15, cost.SizeEfficiency(1.0)),
        "OverlapRule": lambda: cost.OVERLAP_FIT["gpu"],
        "ScheduleLinks": lambda: cost.ScheduleLinks(cluster.Link(1e9, 0.0), cluster.Link(1e9, 0.0)),
        "ScheduleTime": simulated,
        "CollectiveExposure": lambda: simulated().collectives[0],
        "CompiledStep": lambda: verify.compiled_step_of(simulated()),
        # A machine profile's fits, and what priced a plan by it.
        "LinkFit": lambda: cost.fit_link(timings(), "intra"),
        "MatmulFit": lambda: cost.fit_matmuls([cluster.MatmulTiming("sweep", h, 1, 4096, h, 4 * h, "bfloat16",
                                                                    2 * 4096 * h * 4 * h / 4e14)
                                               for h in (1024, 2048, 4096)], 1e15),
        "StepFit": lambda: cost.fit_steps([cluster.StepTiming("m", 64, "fsdp=8", 8, 32, 3, 0.2, 0.19, 0.21, None, "",
                                                              0.1, 0.1, 0.0, 0.5, 10, None)], lambda h: 0.5),
        "ProfileFigures": lambda: cost.profile_figures(profile()),
        "ProfilePricing": lambda: cost.profiled_cluster(pure.parse_cluster("64x8xH100"), profile(), hidden=8192)[2],
        # Serving: a plan of a small model on one GPU, and its parts.
        "ServePlan": serve_plan,
        "ServeRequest": lambda: serve_plan().request,
        "ServeRow": lambda: serve_plan().best,
        "ServeLayout": lambda: serve.ServeLayout(1, 2),
        "KvGeometry": lambda: serve.kv_geometry(presets.MODEL_SPECS["llama3-8b"], serve.ServeLayout(1, 1),
                                                "bfloat16", serve.CacheFormat("paged", 16)),
        "WeightBytes": lambda: serve.weight_bytes(presets.MODEL_SPECS["llama3-8b"], serve.ServeLayout(1, 1)),
        "WeightQuant": lambda: serve.weight_quant("bf16"),
        "LayerFlops": lambda: cost.layer_flops(gpt2, moe_layer=False, batch=8, seq=128),
        "StepFlops": flops,
        "StepTime": lambda: cost.step_time(flops(), [("fsdp all-gather", "all-gather", 0.2)], layers=12,
                                           tokens=1024, devices=8, peak_flops=1e15, efficiency=0.5),
        "StepEstimate": lambda: result().best.step,
        "MoeDispatch": lambda: cost.MoeDispatch(),
        "PipelinePlan": lambda: cost.plan_stages(12, 2, micro_batches=4, layer_param_bytes=1 << 20,
                                                 embed_param_bytes=1 << 20, head_param_bytes=1 << 20,
                                                 layer_activation_bytes=1 << 16),
        "PipelineTime": lambda: cost.pipeline_time(1.0, 2, 4, boundary_bytes=1 << 20,
                                                   boundary_link=cluster.Link(1e11, 1e-6), stage_grad_bytes=1 << 20,
                                                   data_ways=2, data_link=cluster.Link(1e11, 1e-6)),
        "ScheduleMemory": lambda: cost.schedule_memory(2, 4, saved_bytes=1 << 16, input_bytes=1 << 10,
                                                       weight_bytes=1 << 20)[0],
    }


def _targets(modules: tuple[str, ...] = _MODULES) -> list[tuple[str, Callable[..., Any] | None, str | None]]:
    """(label, callable, None) for functions and constructors; (label, None, method) for instance members.

    Read from each module's ``__all__``: a name made public is fuzzed from then on, with nothing to list.
    """
    out: list[tuple[str, Callable[..., Any] | None, str | None]] = []
    seen: set[int] = set()
    for modname in modules:
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if name in _SKIP or id(obj) in seen or not callable(obj):
                continue
            if isinstance(obj, type) and issubclass(obj, BaseException):
                continue
            seen.add(id(obj))
            out.append((name, obj, None))
            if isinstance(obj, type):
                for attr in sorted(dir(obj)):
                    owner = next((k for k in obj.__mro__ if attr in vars(k)), None)
                    if attr.startswith("_") or owner is None or not owner.__module__.startswith("meshplan"):
                        continue  # tuple.count of a NamedTuple, object's members: not meshplan's
                    raw = inspect.getattr_static(obj, attr)
                    if isinstance(raw, (classmethod, staticmethod)):
                        out.append((f"{name}.{attr}", getattr(obj, attr), None))
                    elif callable(raw) or isinstance(raw, property):
                        out.append((f"{name}().{attr}", None, attr))
    return out


_TARGETS = _targets()
_INSTANCE_CACHE: dict[str, Any] = {}


def _instance(cls_name: str) -> Any:
    if cls_name not in _INSTANCE_CACHE:
        make = _instances().get(cls_name)
        _INSTANCE_CACHE[cls_name] = None if make is None else make()
    return _INSTANCE_CACHE[cls_name]


def test_every_public_class_with_methods_has_an_instance_to_fuzz() -> None:
    """A new public class with public methods needs a factory in _instances() (or an entry in _NO_INSTANCE_YET)."""
    classes = {label.split("()")[0] for label, _, method in _TARGETS if method is not None}
    assert classes - set(_instances()) - set(_NO_INSTANCE_YET) == set()


def _fuzzable_parameters(fn: Callable[..., Any]) -> list[str]:
    """The parameters _call_args draws for (``self``, ``_private`` and ``**kwargs`` are never drawn)."""
    return [p.name for p in inspect.signature(fn).parameters.values()
            if not (p.name.startswith("_") or p.name == "self" or p.kind is p.VAR_KEYWORD)]


def _params() -> list[Any]:
    out = []
    for label, fn, method in _TARGETS:
        marks = []
        if label in _KNOWN_ESCAPES:
            marks.append(pytest.mark.xfail(reason=_KNOWN_ESCAPES[label], strict=False))
            if not _DEEP:  # they fail anyway; the default run spends its seconds on the rest
                marks.append(pytest.mark.skip(reason="known escape; run under HYPOTHESIS_PROFILE=deep"))
        if method is not None and label.split("()")[0] in _NO_INSTANCE_YET:
            marks.append(pytest.mark.skip(reason=_NO_INSTANCE_YET[label.split("()")[0]]))
        out.append(pytest.param(label, fn, method, id=label, marks=marks))
    return out


@pytest.mark.parametrize("label,fn,method", _params())
def test_garbage_in_gives_a_typed_meshplan_error_or_an_answer(label: str, fn: Any, method: str | None) -> None:
    # Measured twice from this frame, the budget must not shrink: a C extension that fails without
    # releasing its recursion guard (jaxlib's flatten of a dict whose keys do not sort did) leaks it for
    # good, and a long run then fails every later call with a RecursionError far from the culprit.
    budget = recursion_budget()
    _fuzz(label, fn, method)
    lost = budget - recursion_budget()
    assert lost <= 0, f"{label}: its calls leaked {lost} levels of the interpreter's recursion budget"


def _fuzz(label: str, fn: Any, method: str | None, obj: Any = None, examples: int = _EXAMPLES) -> None:
    """Fuzz one target of :func:`_targets` with ``examples`` calls; a method on ``obj``, or on its class's
    :func:`_instances` entry."""
    if method is not None:
        obj = _instance(label.split("()")[0]) if obj is None else obj
        raw = inspect.getattr_static(type(obj), method)
        if isinstance(raw, property):
            _check_call(label, lambda: getattr(obj, method), [], {})
            return
        fn = getattr(obj, method)
        if not _fuzzable_parameters(fn):
            # Nothing to draw (ReferenceStep().lower): one call says all; 400 identical jax lowerings in the
            # deep run would only cost minutes.
            _check_call(label, fn, [], {})
            return

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(_call_args(fn, label not in _GARBAGE_ONLY))
    def run(call: tuple[list[Any], dict[str, Any]]) -> None:
        args, kwargs = call
        _check_call(label, fn, args, kwargs)

    run()


def test_the_garbage_pool_holds_the_values_the_issue_names() -> None:
    """The pool must keep its nastiest members, or the fuzz test silently stops finding their escapes."""
    assert any(x is np.float32 for x in _ATOMS)
    assert any(type(x) is int and x == 10**400 for x in _ATOMS)
    assert any(isinstance(x, float) and math.isnan(x) for x in _ATOMS)
    assert any(isinstance(x, _StringShape) for x in _ATOMS)
    assert any(type(x) is bytes and x == b"\xff\xfe" for x in _ATOMS)


# --- hand-edited plan files: garbage at every field of a saved plan, activation specs included ---

_PLAN_DOC: dict[str, Any] | None = None


def _plan_document() -> dict[str, Any]:
    global _PLAN_DOC
    if _PLAN_DOC is None:
        from meshplan import pure

        _PLAN_DOC = pure.search_meshes("gpt2", "1x8xH100", batch=8, seq=128).to_dict()
    return _PLAN_DOC


def _json_paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document a hand edit can change: each dict value and list entry."""
    out: list[tuple[Any, ...]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        out.append((*path, key))
        out += _json_paths(child, (*path, key))
    return out


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.sampled_from(
        ["", "dp", "tp", "x", "bfloat16", "8x8xH100", "residual", "all_gather"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["T", "dp", "name", ""]),
                                                                          inner, max_size=2)),
    max_leaves=6,
)


def _plan_edits() -> st.SearchStrategy[tuple[tuple[Any, ...], Any]]:
    paths = _json_paths(_plan_document())
    # Half the edits go to the activation specs, the field a PartitionSpec is built from: a uniform pick
    # over ~1,000 paths reached them too rarely to find the unhashable-dict escape of issue 26.
    specs = [p for p in paths if "activations" in p and "spec" in p]
    return st.tuples(st.one_of(st.sampled_from(specs), st.sampled_from(paths)), _json_values)


def test_the_plan_edits_reach_every_activation_spec_entry() -> None:
    paths = _json_paths(_plan_document())
    entries = [p for p in paths if "activations" in p and p[-2] == "spec"]
    tensors = {p[p.index("tensors") + 1] for p in entries}
    assert tensors == {0, 1, 2}, entries  # batch, residual, logits: each spec's entries are edited


@settings(max_examples=_EXAMPLES * 5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(_plan_edits())
def test_a_hand_edited_plan_file_gives_a_typed_error_or_a_plan(edit: tuple[tuple[Any, ...], Any]) -> None:
    import copy
    import json

    from meshplan import pure

    path, value = edit
    data = copy.deepcopy(_plan_document())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    _check_call(f"SearchResult.from_json(plan with {path} = {value!r:.80})", pure.SearchResult.from_json,
                [json.dumps(data)], {})
