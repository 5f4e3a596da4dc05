"""Exact step memory, ahead of time: ask XLA's buffer assignment (:func:`compiled_memory`).

:func:`compiled_memory` lowers and compiles a jitted step for abstract
arguments (``ShapeDtypeStruct``s with shardings, nothing allocated) and reads
``compiled.memory_analysis()``: per device, the bytes of the arguments, the
outputs, the outputs that reuse donated arguments, the temporaries, and the
peak of the whole program. These are the compiler's own figures for the target
it compiled for (the local backend; a TPU slice from
:func:`~meshplan.facade.verify.tpu_topology_mesh`, which needs libtpu: ``pip install 'meshplan[tpu]'``; or
a GPU cluster from :func:`~meshplan.facade.verify.gpu_topology_mesh`, which needs the jax CUDA plugin and
no GPU: ``pip install 'meshplan[gpu]'``). The figures come back as a
:class:`~meshplan.pure.xla.CompiledMemory` record. A step that does not fit a TPU raises
:class:`~meshplan.errors.CompiledOutOfMemoryError` carrying XLA's message;
XLA:GPU compiles a step too big for the GPU all the same, so there the caller
compares ``peak_bytes`` with its budget.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from meshplan.pure._check import as_count
from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import (
    CompiledOutOfMemoryError,
    MeshplanTypeError,
    PlanError,
)
from meshplan.pure.xla._buffer_report import LiveBuffer, parse_buffer_report
from meshplan.pure.xla._compiled_memory import CompiledMemory
from meshplan.pure.specs._tree import flatten_with_path, path_str

__all__ = ["compile_with_memory", "compiled_memory", "jitted_step", "lower_step"]

_NO_PEAK = "argument + output - alias + temp (this backend reports no peak_memory_in_bytes)"
# XLA:CPU reports a peak_memory_in_bytes that leaves the temporaries out (it is below temp_size_in_bytes
# for every train step tried), so on CPU the peak is the bound with everything allocated at once.
_CPU_PEAK = "argument + output - alias + temp (XLA:CPU's peak_memory_in_bytes leaves temporaries out)"


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
    return compile_with_memory(step, *abstract_args, mesh=mesh, compiler_options=compiler_options,
                               top_buffers=top_buffers, **abstract_kwargs)[1]


def compile_with_memory(step: Any, *abstract_args: Any, mesh: Mesh | None = None,
                        compiler_options: Mapping[str, Any] | None = None, top_buffers: int = 10,
                        **abstract_kwargs: Any) -> tuple[Any, CompiledMemory]:
    """:func:`compiled_memory`, and the compiled program it read the figures from (for its schedule: one
    compile gives both the verification's peak and its step time).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> compiled, m = compile_with_memory(jax.jit(lambda a: a * 2), jax.ShapeDtypeStruct((8,), jnp.float32))
      >>> "HloModule" in compiled.as_text(), m.argument_bytes
      (True, 32)
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
    return compiled, CompiledMemory(
        argument_bytes=argument, output_bytes=output, alias_bytes=alias, temp_bytes=temp, peak_bytes=peak,
        peak_source=source, reported_peak_bytes=reported, generated_code_bytes=int(ma.generated_code_size_in_bytes),
        host_temp_bytes=int(getattr(ma, "host_temp_size_in_bytes", 0) or 0),
        platform=platform, device_kind=str(getattr(first, "device_kind", "unknown")),
        num_devices=len(devices), compile_seconds=seconds, largest=largest, largest_note=largest_note)
