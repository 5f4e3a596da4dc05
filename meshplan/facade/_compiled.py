"""Exact step memory, ahead of time: ask XLA's buffer assignment.

:func:`compiled_memory` lowers and compiles a jitted step for abstract
arguments (``ShapeDtypeStruct``s with shardings, nothing allocated) and reads
``compiled.memory_analysis()``: per device, the bytes of the arguments, the
outputs, the outputs that reuse donated arguments, the temporaries, and the
peak of the whole program. These are the compiler's own figures for the target
it compiled for (the local backend; a TPU slice from :func:`tpu_topology_mesh`,
which needs libtpu: ``pip install 'meshplan[tpu]'``; or a GPU cluster from
:func:`gpu_topology_mesh`, which needs the jax CUDA plugin and no GPU:
``pip install 'meshplan[gpu]'``). A step that does not fit a TPU raises
:class:`~meshplan.errors.CompiledOutOfMemoryError` carrying XLA's message;
XLA:GPU compiles a step too big for the GPU all the same, so there the caller
compares ``peak_bytes`` with its budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from meshplan.pure._check import as_count, as_sequence, as_str
from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import (
    ClusterError,
    CompiledOutOfMemoryError,
    MeshplanTypeError,
    PlanError,
)
from meshplan.pure.xla._buffer_report import LiveBuffer, parse_buffer_report
from meshplan.pure.cluster._cluster import Cluster, parse_cluster
from meshplan.pure.cluster._topology import TpuTopology, tpu_topology
from meshplan.pure.specs._tree import flatten_with_path, path_str

__all__ = ["CompiledMemory", "compiled_memory", "gpu_topology_mesh", "libtpu_available", "local_gpus",
           "tpu_topology_mesh"]

_NO_PEAK = "argument + output - alias + temp (this backend reports no peak_memory_in_bytes)"
# XLA:CPU reports a peak_memory_in_bytes that leaves the temporaries out (it is below temp_size_in_bytes
# for every train step tried), so on CPU the peak is the bound with everything allocated at once.
_CPU_PEAK = "argument + output - alias + temp (XLA:CPU's peak_memory_in_bytes leaves temporaries out)"


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledMemory:
    """XLA's memory figures for one compiled step, per device.

    Attributes:
      argument_bytes: inputs (parameters, optimizer state, batch) on one device.
      output_bytes: outputs on one device.
      alias_bytes: outputs that reuse donated input buffers (counted in both above).
      temp_bytes: temporaries of the program (activations, gradients, collectives' buffers).
      peak_bytes: the most live at once; see ``peak_source``.
      peak_source: ``"peak_memory_in_bytes"`` when XLA's figure is used, else how it was derived.
      reported_peak_bytes: XLA's ``peak_memory_in_bytes`` as reported (0 where absent).
      generated_code_bytes: the compiled program's size.
      host_temp_bytes: temporaries in host memory (host-offloaded remat), 0 without.
      platform: ``"cpu"``, ``"tpu"``, ``"gpu"``.
      device_kind: e.g. ``"TPU v5 lite"``.
      num_devices: devices the step runs on.
      compile_seconds: lowering plus compilation time.
      largest: the biggest buffers in device memory live at the step where it is
        fullest (the moment ``peak_bytes`` reports), biggest first
        (:class:`~meshplan.pure.search.LiveBuffer`: name, bytes, shape, dtype,
        kind, source), read from XLA's buffer-assignment dump; ``()`` where there
        is none, and ``largest_note`` says why.
      largest_note: where ``largest`` comes from, or why it is empty.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.ShapeDtypeStruct((128, 128), jnp.float32)
      >>> m = compiled_memory(jax.jit(lambda a: a @ a), x)
      >>> m.argument_bytes, m.output_bytes
      (65536, 65536)
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    peak_bytes: int
    peak_source: str
    reported_peak_bytes: int
    generated_code_bytes: int
    host_temp_bytes: int
    platform: str
    device_kind: str
    num_devices: int
    compile_seconds: float
    largest: tuple[LiveBuffer, ...] = ()
    largest_note: str = ""

    @property
    def resident_bytes(self) -> int:
        """Arguments plus outputs that do not reuse them: what stays allocated around the step."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes

    def describe(self) -> str:
        """``'peak 12.1 GiB (arguments 4.0 GiB, temp 8.1 GiB, outputs 4.0 GiB, aliased 4.0 GiB) on 4 x TPU v5 lite'``."""
        return (f"peak {fmt_bytes(self.peak_bytes)} (arguments {fmt_bytes(self.argument_bytes)}, temp "
                f"{fmt_bytes(self.temp_bytes)}, outputs {fmt_bytes(self.output_bytes)}, aliased "
                f"{fmt_bytes(self.alias_bytes)}) on {self.num_devices} x {self.device_kind}")


# jax's own words when it cannot read an argument of a jitted function (jax 0.10): the caller's
# bad input, not the step failing to trace, so it becomes a typed error.
_JAX_ARGUMENT_ERRORS = ("Error interpreting argument", "An overflow was encountered while parsing an argument")


def jitted_step(step: Any, abstract_args: Any, compiler_options: Any) -> Any:
    """``step`` jitted (as given when it already is), after the checks that need no tracing.

    A class is refused although callable: jitting it would trace its constructor,
    which is never a training step. For a plain function, every argument leaf must
    be something jax traces (an array, a ShapeDtypeStruct, a scalar); a function
    the caller jitted may take static arguments, so there jax's own refusal of an
    argument is translated instead (:func:`lower_step`). Errors raised by the
    step itself while tracing pass through untouched: they are the user's code.

    Example:
      >>> import jax.numpy as jnp
      >>> jitted_step(lambda a: a, ((jnp.zeros(2),), {}), None).lower(jnp.zeros(2)) is not None
      True
    """
    if isinstance(step, type) or not callable(step):
        raise MeshplanTypeError(f"step={step!r:.80} must be a function (ideally jax.jit-ed), not "
                                f"{'a class' if isinstance(step, type) else type(step).__name__}.")
    if compiler_options is not None and not (
            isinstance(compiler_options, Mapping) and all(isinstance(k, str) for k in compiler_options)):
        raise MeshplanTypeError(f"compiler_options={compiler_options!r:.80} must map XLA option names (str) "
                                "to values, or be None.")
    if hasattr(step, "lower"):
        return step
    args, kwargs = abstract_args
    named = [(f"args[{i}]", a) for i, a in enumerate(args)] + [(str(k), v) for k, v in kwargs.items()]
    for where, tree in named:
        for keypath, leaf in flatten_with_path(tree, f"the step's argument {where}")[0]:
            _check_traceable(f"{where}/{path_str(keypath)}" if keypath else where, leaf)
    return jax.jit(step)


def _check_traceable(where: str, leaf: Any) -> None:
    try:
        jax.typeof(leaf)
    except (TypeError, ValueError, OverflowError) as err:
        raise MeshplanTypeError(
            f"argument {where}={leaf!r:.60} is not something jax can trace "
            f"({str(err).splitlines()[0][:120]}); pass arrays, jax.ShapeDtypeStructs or scalars "
            "(or jit the step with static_argnums for static arguments).") from None


def lower_step(jitted: Any, *args: Any, **kwargs: Any) -> Any:
    """``jitted.lower(*args, **kwargs)``, with jax's refusal of an argument as a typed error.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> lower_step(jax.jit(lambda a: a), jnp.zeros(2)) is not None
      True
    """
    try:
        return jitted.lower(*args, **kwargs)
    except (TypeError, OverflowError) as err:
        if not str(err).startswith(_JAX_ARGUMENT_ERRORS):
            raise  # the user's step failed while tracing: their error, unwrapped
        raise MeshplanTypeError(f"the step's arguments: {str(err).splitlines()[0][:300]}") from None


def _devices_of(args: Sequence[Any], mesh: Mesh | None) -> list[Any]:
    if mesh is not None:
        return list(mesh.devices.flat)
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and hasattr(sharding, "device_set"):
            return sorted(sharding.device_set, key=lambda d: d.id)
    return list(jax.devices()[:1])


_SIZE_RE = re.compile(r"([0-9.]+)\s*([KMGTP]?)(i?B)?\b")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def _size(text: str) -> int | None:
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _oom_figures(message: str) -> tuple[int | None, int | None]:
    """(required, available) bytes from XLA's out-of-memory text, where it states them."""
    m = re.search(r"required for [^(]*\(([^)]+)\) exceeds available \w+ \(([^)]+)\)", message)
    if m:
        return _size(m.group(1)), _size(m.group(2))
    m = re.search(r"Used ([0-9.]+[KMGTP]?) of ([0-9.]+[KMGTP]?) \w+", message)
    if m:
        return _size(m.group(1)), _size(m.group(2))
    return None, None


def _is_oom(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "out of memory" in text.lower()


_MAX_TOP = 10_000
_DUMP_SUFFIXES = ("live-range.txt", "buffer-assignment.txt", "buffer-assignment-values.txt",
                  "memory-usage-report.txt")


def _dump_options(directory: str) -> dict[str, Any]:
    """XLA's debug options that write the buffer-assignment reports of the compiled module to ``directory``.

    Text only and no per-pass snapshots (those need ``xla_dump_hlo_pass_re``): the
    reports are written once, after optimisation. XLA also writes the module's
    HLO (and on CPU its LLVM IR); the files last only as long as the directory.
    """
    return {"xla_dump_to": directory, "xla_dump_hlo_as_text": True}


def _read_dump(directory: str) -> tuple[str, ...] | None:
    """The texts of the live-range, buffer-assignment, values and memory-usage reports (None: no report)."""
    lives = [name for name in os.listdir(directory) if name.endswith("-live-range.txt")]
    if not lives:
        return None
    # One module per compile; should a backend write several, the program's own is the biggest report.
    main = max(lives, key=lambda name: (os.path.getsize(os.path.join(directory, name)), name))
    prefix = os.path.join(directory, main[: -len("live-range.txt")])
    texts = []
    for suffix in _DUMP_SUFFIXES:
        try:
            with open(prefix + suffix, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
        except FileNotFoundError:
            texts.append("")
    return tuple(texts)


def _largest(dump_dir: str | None, top: int, options: Mapping[str, Any]) -> tuple[tuple[LiveBuffer, ...], str]:
    """The ``top`` biggest device buffers live at the peak, and a note saying where they come from."""
    if top == 0:
        return (), "not asked for (top_buffers=0)"
    if dump_dir is None:
        return (), (f"not read: compiler_options sets xla_dump_to={str(options.get('xla_dump_to'))!r:.80}, "
                    "where XLA writes its buffer-assignment reports")
    try:
        texts = _read_dump(dump_dir)
    except OSError as err:
        return (), f"not available: XLA's dump could not be read ({err})"
    if texts is None:
        return (), ("not available: XLA wrote no buffer-assignment report for this compile (an executable "
                    "taken from jax's persistent compilation cache is not recompiled, so nothing is dumped)")
    report = parse_buffer_report(*texts)
    if report.moment < 0:
        return (), "not available: XLA's live-range report has no live ranges and states no peak"
    device, largest = report.device_buffers, report.largest(top)
    return largest, (f"XLA's buffer assignment: the {len(largest)} biggest of {len(device)} buffers in device "
                     f"memory at its fullest step (schedule step {report.moment}; "
                     f"{fmt_bytes(report.device_bytes)} live then)")


def compiled_memory(step: Any, *abstract_args: Any, mesh: Mesh | None = None,
                    compiler_options: Mapping[str, Any] | None = None, top_buffers: int = 10,
                    **abstract_kwargs: Any) -> CompiledMemory:
    """Compile ``step`` for its abstract arguments and return XLA's per-device memory figures.

    Args:
      step: a ``jax.jit``-ed function (a plain function is jitted here, with
        no donation: jit it yourself with ``donate_argnums`` to count aliasing).
      *abstract_args: its arguments as ``jax.ShapeDtypeStruct`` trees; their
        ``sharding`` says where each lives (a TPU topology's devices compile
        for that TPU from any machine). Real arrays work too.
      mesh: made current while lowering, for steps whose sharding constraints
        name bare PartitionSpecs; also fixes the device count reported.
      compiler_options: XLA options for ``compile()``; e.g. on CPU
        ``{"xla_backend_optimization_level": 0}`` halves the compile time (it
        changes code generation after buffer assignment, not the figures).
      top_buffers: how many of the buffers live at the peak to list in
        ``largest`` (0: none, and no dump is written). They are read from
        XLA's buffer-assignment reports, dumped for this one compile into a
        temporary directory that is removed afterwards; not when
        ``compiler_options`` sets ``xla_dump_to`` itself. The directory is
        part of the compile options, so such a compile always runs (jax's
        in-memory cache never serves it).
      **abstract_kwargs: keyword arguments, likewise abstract.

    Returns:
      A :class:`CompiledMemory`.

    Raises:
      CompiledOutOfMemoryError: the compiler says the step does not fit the
        target's device memory (the exception carries its message and figures).
      MeshplanTypeError: ``step`` is not callable or ``mesh`` not a Mesh.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> x = jax.ShapeDtypeStruct((256,), jnp.float32)
      >>> m = compiled_memory(jax.jit(lambda a: a * 2, donate_argnums=0), x)
      >>> m.alias_bytes
      1024
    """
    jitted = jitted_step(step, (abstract_args, abstract_kwargs), compiler_options)
    if mesh is not None and not isinstance(mesh, Mesh):
        raise MeshplanTypeError(f"mesh={mesh!r:.80} must be a jax.sharding.Mesh or None.")
    top = as_count(top_buffers, "top_buffers", minimum=0, maximum=_MAX_TOP, error=PlanError)
    devices = _devices_of((abstract_args, abstract_kwargs), mesh)
    options = dict(compiler_options) if compiler_options else {}
    start = time.perf_counter()
    ctx = jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()
    with contextlib.ExitStack() as stack:
        dump_dir = None
        if top and "xla_dump_to" not in options:
            dump_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="meshplan-xla-dump-",
                                                                       ignore_cleanup_errors=True))
            options = {**_dump_options(dump_dir), **options}
        try:
            with ctx:
                lowered = lower_step(jitted, *abstract_args, **abstract_kwargs)
                compiled = lowered.compile(options or None)
            seconds = time.perf_counter() - start  # the compile alone; reading the dump is not the compiler's
        except Exception as err:  # XLA raises JaxRuntimeError; anything else is the user's step failing to trace
            if not _is_oom(err):
                raise
            required, available = _oom_figures(str(err))
            where = f"{len(devices)} x {devices[0].device_kind}" if devices else "the target"
            need = f" (needs {fmt_bytes(required)} of {fmt_bytes(available)})" if required and available else ""
            raise CompiledOutOfMemoryError(
                f"the step does not fit on {where}{need}; XLA: {str(err).strip()}",
                xla_message=str(err), required_bytes=required, available_bytes=available) from None
        largest, largest_note = _largest(dump_dir, top, options)
    ma = compiled.memory_analysis()
    if ma is None:
        raise PlanError(f"the {devices[0].platform if devices else 'local'} backend gives no memory analysis "
                        "for compiled programs; compile for CPU or a TPU topology instead.")
    argument, output = int(ma.argument_size_in_bytes), int(ma.output_size_in_bytes)
    alias, temp = int(ma.alias_size_in_bytes), int(ma.temp_size_in_bytes)
    reported = int(getattr(ma, "peak_memory_in_bytes", 0) or 0)
    first = devices[0] if devices else None
    platform = str(getattr(first, "platform", "unknown"))
    peak, source = reported, "peak_memory_in_bytes"
    if reported <= 0:
        peak, source = argument + output - alias + temp, _NO_PEAK
    elif platform == "cpu":
        peak, source = argument + output - alias + temp, _CPU_PEAK
    return CompiledMemory(
        argument_bytes=argument, output_bytes=output, alias_bytes=alias, temp_bytes=temp, peak_bytes=peak,
        peak_source=source, reported_peak_bytes=reported, generated_code_bytes=int(ma.generated_code_size_in_bytes),
        host_temp_bytes=int(getattr(ma, "host_temp_size_in_bytes", 0) or 0),
        platform=platform, device_kind=str(getattr(first, "device_kind", "unknown")),
        num_devices=len(devices), compile_seconds=seconds, largest=largest, largest_note=largest_note)


TPU_WINDOWED_EINSUM_OFF = ("--xla_tpu_enable_windowed_einsum_for_all_gather=false "
                           "--xla_tpu_enable_windowed_einsum_for_reduce_scatter=false")
"""``LIBTPU_INIT_ARGS`` that keep XLA:TPU from running an all-gather or reduce-scatter and its matmul as a
windowed loop (its collective matmul), for checking a compiled step's FLOPs and collectives against the
analytic model: ``cost_analysis()`` counts a loop body once. libtpu reads them once, when it starts."""


def libtpu_available() -> bool:
    """Whether libtpu is installed, so TPU topologies can be compiled for (``pip install 'meshplan[tpu]'``).

    Example:
      >>> isinstance(libtpu_available(), bool)
      True
    """
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


@functools.lru_cache(maxsize=16)
def _topology_devices(topology: TpuTopology) -> tuple[Any, ...]:
    from jax.experimental import topologies

    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no cloud metadata server to ask on this machine
    # Compiling for a topology touches no TPU, so several processes (test workers, a benchmark) may load
    # libtpu at once; without this the second one fails on libtpu's single-process lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    desc = topologies.get_topology_desc(**topology.kwargs())
    return tuple(desc.devices)


def local_gpus() -> list[Any]:
    """This process's GPUs (none when jax has no GPU backend).

    Example:
      >>> local_gpus()  # the test suite runs on CPU devices
      []
    """
    try:
        return list(jax.devices("gpu"))
    except RuntimeError:
        return []


def _mesh_axes(axis_names: Sequence[str], axis_sizes: Sequence[int], num_devices: int,
               where: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Checked axis names and sizes of a mesh over ``num_devices`` devices of ``where``."""
    names = tuple(as_str(n, f"axis_names[{i}]", nonempty=True, error=PlanError)
                  for i, n in enumerate(as_sequence(axis_names, "axis_names")))
    sizes = tuple(as_count(n, f"axis_sizes[{i}]", error=PlanError)
                  for i, n in enumerate(as_sequence(axis_sizes, "axis_sizes")))
    if len(set(names)) != len(names):
        raise PlanError(f"axis_names={names!r:.80} must not repeat a name.")
    if len(names) != len(sizes) or math.prod(sizes) != num_devices:
        raise PlanError(f"mesh {dict(zip(names, sizes, strict=False))} must have one size per axis, multiplying "
                        f"to the {num_devices} devices of {where}.")
    return names, sizes


def gpu_topology_mesh(cluster: Cluster | str, axis_names: Sequence[str], axis_sizes: Sequence[int], *,
                      target_config: str | None = None) -> Mesh:
    """A mesh of a GPU cluster's compile-only devices, for compiling ahead of time with or without a GPU.

    XLA:GPU compiles for a topology of GPUs it does not have (``jax.experimental.topologies``,
    platform ``cuda``, topology ``"1 x hosts x GPUs per host"``) from a description of the GPU:
    with no local GPU of the cluster's kind, the one meshplan ships for it
    (:func:`~meshplan.facade._gpu_targets.gpu_target_config`; needs the jax CUDA plugin,
    ``pip install 'meshplan[gpu]'``, and a process whose jax runs with ``JAX_PLATFORMS=cpu``);
    with one, the local GPU's own. So a laptop compiles a step for ``1x8xH100`` or ``8x8xH100``:
    the program, its collectives and its buffer assignment are the whole cluster's; it compiles,
    it does not run. XLA:GPU does not refuse a step that is too big: compare the compiled peak
    with the budget.

    Args:
      cluster: a GPU :class:`~meshplan.pure.Cluster` or its text (``"1x8xH200"``).
      axis_names, axis_sizes: the mesh, outermost first; sizes multiply to the device count.
      target_config: a ``GpuTargetConfigProto`` text to compile for instead of the shipped one
        (or the local GPU's).

    Returns:
      A ``jax.sharding.Mesh`` (Auto axes) over the cluster's compile-only GPU devices, hosts outermost.

    Raises:
      ClusterError: a TPU cluster; a GPU with no shipped description (the message names the known
        ones); no CUDA plugin, a mismatched one, or a process not running with ``JAX_PLATFORMS=cpu``.
      PlanError: sizes that do not multiply to the device count.

    Example:
      >>> mesh = gpu_topology_mesh("2x8xH100", ("dp", "fsdp"), (2, 8))  # doctest: +SKIP
      >>> mesh.devices.shape, mesh.devices.flat[0].device_kind  # doctest: +SKIP
      ((2, 8), 'NVIDIA H100 80GB HBM3')
    """
    from meshplan.facade._gpu_targets import deviceless_gpu_ready, gpu_target_config

    clus = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(clus, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.80} must be a Cluster or its text, e.g. '1x8xH200'.")
    if clus.device.ici_scope == "slice":
        raise ClusterError(f"{clus.text} is a TPU cluster; use tpu_topology_mesh for it.")
    names, sizes = _mesh_axes(axis_names, axis_sizes, clus.num_devices, clus.text)
    if target_config is not None:
        config: str | None = as_str(target_config, "target_config", nonempty=True, error=PlanError)
    elif any(clus.device.matches_kind(d.device_kind) for d in local_gpus()):
        config = None  # the local GPU describes itself
    else:
        config = gpu_target_config(clus.device)  # ClusterError naming the known GPUs when none is shipped
    if config is not None:
        problem = deviceless_gpu_ready()
        if problem is not None:
            raise ClusterError(f"compiling for {clus.text} with no local {clus.device.name}: {problem}.")
    devices = _gpu_topology_devices(f"1x{clus.num_nodes}x{clus.devices_per_node}", config)
    from jax.sharding import AxisType

    grid = np.array(list(devices), dtype=object).reshape(sizes)
    return Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))


@functools.lru_cache(maxsize=16)
def _gpu_topology_devices(topology: str, target_config: str | None) -> tuple[Any, ...]:
    from jax.experimental import topologies

    kwargs = {} if target_config is None else {"target_config": target_config}
    try:
        desc = topologies.get_topology_desc(platform="cuda", topology=topology, **kwargs)
    except (NotImplementedError, RuntimeError) as err:  # jax's words when the CUDA plugin is absent or failed
        raise ClusterError(f"XLA:GPU could not describe topology {topology}: {str(err).splitlines()[0][:200]}; "
                           "pip install 'meshplan[gpu]' and run with JAX_PLATFORMS=cpu.") from None
    return tuple(desc.devices)


def tpu_topology_mesh(cluster: Cluster | str, axis_names: Sequence[str], axis_sizes: Sequence[int], *,
                      dcn_shape: Sequence[int] | None = None) -> Mesh:
    """A mesh of a TPU cluster's devices, for compiling ahead of time on any machine.

    The cluster's slice is named for libtpu by
    :func:`~meshplan.pure.search.tpu_topology` (``v5p-256`` -> ``v5:4x4x8``,
    megacore, wrapped); its devices are laid out by jax's ``mesh_utils`` (the
    hybrid ICI x DCN layout when ``dcn_shape`` spans slices).

    Args:
      cluster: a TPU :class:`~meshplan.pure.Cluster` or its text (``"v5e-16"``).
      axis_names, axis_sizes: the mesh, outermost first; sizes multiply to the device count.
      dcn_shape: each axis's part across slices (a search candidate's ``dcn_shape``).

    Returns:
      A ``jax.sharding.Mesh`` over TPU devices (they compile, they do not run).

    Raises:
      ClusterError: not a TPU cluster, or libtpu is not installed.
      PlanError: sizes that do not multiply to the device count.

    Example:
      >>> mesh = tpu_topology_mesh("v5e-4", ("dp", "tp"), (2, 2))  # doctest: +SKIP
      >>> mesh.devices.shape  # doctest: +SKIP
      (2, 2)
    """
    clus = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    topology = tpu_topology(clus)
    if not libtpu_available():
        raise ClusterError(f"compiling for {clus.text} needs libtpu, which is not installed; "
                           "pip install 'meshplan[tpu]' (or jax[tpu] matching your jax).")
    names, sizes = _mesh_axes(axis_names, axis_sizes, topology.num_devices, clus.text)
    devices = list(_topology_devices(topology))
    from jax.experimental import mesh_utils

    dcn = None if dcn_shape is None else tuple(
        as_count(d, f"dcn_shape[{i}]", error=PlanError)
        for i, d in enumerate(as_sequence(dcn_shape, "dcn_shape")))
    if dcn is not None and (len(dcn) != len(sizes) or any(s % d for s, d in zip(sizes, dcn, strict=False))):
        raise PlanError(f"dcn_shape={dcn} must have one entry per axis, each dividing its size {sizes}.")
    if dcn is not None and math.prod(dcn) > 1:
        ici = tuple(s // d for s, d in zip(sizes, dcn, strict=True))
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, allow_split_physical_axes=True)
    else:
        try:
            grid = mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
        except (ValueError, NotImplementedError, AssertionError):
            # Shapes mesh_utils has no physical layout for: jax's device order, reshaped.
            grid = np.array(devices, dtype=object).reshape(sizes)
    return Mesh(grid, names)
