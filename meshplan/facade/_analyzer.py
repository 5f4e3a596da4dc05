"""``ShardingAnalyzer`` and ``create_monitored_function``: the reference's names over pure checks.

The analyzer binds one mesh (given, else the one made current with
``jax.set_mesh``) and hands its axis sizes to :mod:`meshplan.pure`, which
does all the checking and counting. Differences from eformer's versions:

* every validation issue names the leaf path, and unknown/repeated axes,
  too-long specs, ``UNCONSTRAINED`` and tree mismatches are reported, not
  only indivisible dims;
* ``estimate_memory_usage`` is exact per device (``size_per_device`` is the
  fullest device's bytes) rather than total / device count;
* ``create_monitored_function`` waits for the result before stopping the
  clock and works when the described argument is passed by keyword.
"""

from __future__ import annotations

import functools
import inspect
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import AbstractMesh, Mesh

from meshplan.facade._context import require_mesh, x64_enabled
from meshplan.pure._check import as_flag
from meshplan.pure.errors import MeshplanError, MeshplanTypeError
from meshplan.pure.specs._memory import (
    MemoryEstimate,
    estimate_memory,
    validate_and_estimate,
)
from meshplan.pure.specs._validate import Finding, check_specs, validate_specs

__all__ = ["ShardingAnalyzer", "create_monitored_function"]


def _resolve_mesh(mesh: Mesh | AbstractMesh | None) -> Mesh | AbstractMesh:
    """The given mesh, else the current one (``jax.set_mesh``, or an abstract mesh in use)."""
    found = require_mesh(mesh, "ShardingAnalyzer")
    assert found is not None  # optional=False raises instead
    return found


class ShardingAnalyzer:
    """Validates partition specs and estimates per-device memory on one mesh.

    Args:
      mesh: a ``Mesh`` or ``AbstractMesh``; default the current mesh.
      packed_subbyte: count sub-byte dtypes packed (TPU storage) instead of
        what ``jax.Array.nbytes`` reports (one byte per element).

    Raises:
      MeshShapeError: no mesh given and none is current.

    Example:
      >>> import jax, numpy as np
      >>> from jax.sharding import PartitionSpec as P
      >>> analyzer = ShardingAnalyzer(jax.make_mesh((2, 4), ("dp", "tp")))
      >>> params = {"w": np.zeros((6, 8), np.float32)}
      >>> analyzer.validate_partition_specs(params, {"w": P("tp", "dp")})
      ["leaf 'w': dim 0 (size 6) of shape (6, 8) does not divide by 4 (mesh axes 'tp') ..."]
      >>> analyzer.estimate_memory_usage(params, {"w": P("dp", "tp")})["size_per_device"]
      24
    """

    def __init__(self, mesh: Mesh | AbstractMesh | None = None, *, packed_subbyte: bool = False) -> None:
        self.mesh = _resolve_mesh(mesh)
        self.packed_subbyte = as_flag(packed_subbyte, "packed_subbyte")
        self._axis_sizes = dict(self.mesh.shape)

    @property
    def axis_sizes(self) -> dict[str, int]:
        """Mesh axis name -> size, in mesh order."""
        return dict(self._axis_sizes)

    def __repr__(self) -> str:
        return f"ShardingAnalyzer(mesh={self._axis_sizes})"

    def findings(self, pytree: Any, partition_specs: Any, *, for_storage: bool = True) -> list[Finding]:
        """Structured findings (path, kind, message, severity); see :func:`meshplan.pure.validate_specs`."""
        return validate_specs(pytree, partition_specs, self._axis_sizes, for_storage=for_storage, x64=x64_enabled())

    def validate_partition_specs(
        self, pytree: Any, partition_specs: Any, *, for_storage: bool = True
    ) -> list[str]:
        """Every problem with ``partition_specs`` for ``pytree``, one message each (empty = fine).

        Args:
          pytree: arrays, ShapeDtypeStructs, boxed values ... (see :func:`meshplan.pure.tree_facts`).
          partition_specs: matching PartitionSpecs (same structure, or a prefix).
          for_storage: True (default) checks what ``jax.device_put`` accepts;
            False checks values inside ``jit``, where uneven dims are padded
            (reported as warnings).

        Example:
          >>> import jax, numpy as np
          >>> from jax.sharding import PartitionSpec as P
          >>> analyzer = ShardingAnalyzer(jax.make_mesh((2,), ("dp",)))
          >>> analyzer.validate_partition_specs({"b": np.zeros(8)}, {"b": P("tp")})
          ["leaf 'b': spec P('tp',) uses mesh axis 'tp' at dim 0, which is not in the mesh; mesh axes are ['dp']."]
        """
        return [str(f) for f in self.findings(pytree, partition_specs, for_storage=for_storage)]

    def check_partition_specs(self, pytree: Any, partition_specs: Any, *, for_storage: bool = True) -> None:
        """Strict validation: raise one SpecError listing every error."""
        check_specs(pytree, partition_specs, self._axis_sizes, for_storage=for_storage, x64=x64_enabled())

    def estimate_memory(self, pytree: Any, partition_specs: Any, *, padding: str = "padded") -> MemoryEstimate:
        """The full :class:`meshplan.pure.MemoryEstimate` (per device position, row-major).

        Raises:
          SpecError: specs that cannot be counted (unknown axis, wrong structure ...).
        """
        return estimate_memory(
            pytree, partition_specs, self._axis_sizes,
            packed_subbyte=self.packed_subbyte, padding=padding, x64=x64_enabled(),
        )

    def estimate_memory_usage(self, pytree: Any, partition_specs: Any) -> dict[str, Any]:
        """Bytes per device after sharding, as a dict.

        Keys: ``total_size`` (bytes unsharded) and ``size_per_device`` (bytes
        on the fullest device), plus ``per_device``, ``mean_per_device``,
        ``replicated_bytes`` ... (see :meth:`meshplan.pure.MemoryEstimate.to_dict`).

        Raises:
          SpecError: specs that cannot be counted (unknown axis, wrong structure ...).
        """
        return self.estimate_memory(pytree, partition_specs).to_dict()

    def _validate_and_estimate(self, pytree: Any, partition_specs: Any) -> tuple[list[str], dict[str, Any] | None]:
        """Issues and the memory dict (``None`` when uncountable) from one walk of the tree."""
        try:
            findings, estimate = validate_and_estimate(
                pytree, partition_specs, self._axis_sizes, packed_subbyte=self.packed_subbyte, x64=x64_enabled()
            )
        except MeshplanError as err:  # e.g. a string array leaf: report it, don't break the call
            return [str(err)], None
        return [str(f) for f in findings], None if estimate is None else estimate.to_dict()

    def bytes_by_device(self, pytree: Any, partition_specs: Any) -> dict[Any, int]:
        """Bytes each device of the mesh holds: ``{device: bytes}`` (needs a concrete Mesh).

        Example:
          >>> import jax, numpy as np
          >>> from jax.sharding import PartitionSpec as P
          >>> analyzer = ShardingAnalyzer(jax.make_mesh((2,), ("dp",)))
          >>> sorted(analyzer.bytes_by_device({"w": np.zeros(8, np.int8)}, {"w": P("dp")}).values())
          [4, 4]
        """
        if not isinstance(self.mesh, Mesh):
            raise MeshplanTypeError("bytes_by_device needs a concrete Mesh (this analyzer has an AbstractMesh).")
        per_position = self.estimate_memory(pytree, partition_specs).per_device
        return dict(zip(self.mesh.devices.flat, per_position, strict=True))


def _target_argument(sig: inspect.Signature | None, arg: int | str, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
    """The value of argument ``arg`` (a position or a name) in one call."""
    if isinstance(arg, int) and arg < len(args):
        return args[arg]
    if isinstance(arg, str) and arg in kwargs:
        return kwargs[arg]
    if sig is not None:
        bound = sig.bind(*args, **kwargs)  # a bad call fails here as it would in fn
        bound.apply_defaults()
        params = list(sig.parameters)
        name = arg if isinstance(arg, str) else (params[arg] if arg < len(params) else None)
        if name in bound.arguments:
            return bound.arguments[name]
    raise MeshplanTypeError(
        f"create_monitored_function: the call has no argument {arg!r} for the partition specs to "
        "describe; pass it, or choose another with arg=<position or name>."
    )


def create_monitored_function(
    fn: Callable[..., Any],
    partition_specs: Any,
    analyzer: ShardingAnalyzer,
    *,
    arg: int | str = 0,
) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """Wrap ``fn`` to return ``(result, metrics)`` with validation, timing and memory.

    ``partition_specs`` describe ONE argument of ``fn``: by default the first
    (``arg=0``), whether it is passed by position or by keyword; pass
    ``arg="params"`` or another position to pick a different one. Each call
    validates that argument (a ``UserWarning`` lists the issues; the call
    still runs, as in the reference), estimates its memory, then times
    ``fn`` alone, waiting for the result with ``jax.block_until_ready``.

    Args:
      fn: the function to monitor.
      partition_specs: specs for the chosen argument.
      analyzer: a :class:`ShardingAnalyzer` giving the mesh.
      arg: position or name of the argument the specs describe.

    Returns:
      A function with ``fn``'s signature returning ``(result, metrics)``;
      ``metrics`` has ``execution_time`` (seconds, ``time.perf_counter``),
      ``memory_usage`` (:meth:`ShardingAnalyzer.estimate_memory_usage`'s dict,
      or ``None`` when the specs cannot be counted) and ``validation_issues``
      (list of str).

    Raises:
      MeshplanTypeError: ``analyzer`` is not a ShardingAnalyzer or ``fn`` is not callable.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import PartitionSpec as P
      >>> analyzer = ShardingAnalyzer(jax.make_mesh((2,), ("dp",)))
      >>> step = create_monitored_function(lambda params, lr: params * lr, P("dp"), analyzer)
      >>> out, metrics = step(params=jnp.ones(4), lr=0.5)
      >>> metrics["memory_usage"]["size_per_device"], metrics["validation_issues"]
      (8, [])
    """
    if not callable(fn):
        raise MeshplanTypeError(f"fn={fn!r} is not callable.")
    if not isinstance(analyzer, ShardingAnalyzer):
        raise MeshplanTypeError(f"analyzer={analyzer!r} must be a ShardingAnalyzer.")
    if isinstance(arg, bool) or not isinstance(arg, int | str) or (isinstance(arg, int) and arg < 0):
        raise MeshplanTypeError(f"arg={arg!r} must be a position (int >= 0) or a parameter name (str).")
    try:
        sig: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        sig = None

    @functools.wraps(fn)
    def monitored(*args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        target = _target_argument(sig, arg, args, kwargs)
        issues, memory = analyzer._validate_and_estimate(target, partition_specs)
        if issues:
            warnings.warn(
                f"{getattr(fn, '__name__', 'fn')}: {len(issues)} sharding issue(s): " + "; ".join(issues),
                UserWarning,
                stacklevel=2,
            )
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        jax.block_until_ready(result)  # type: ignore[no-untyped-call]  # jax leaves it unannotated
        elapsed = time.perf_counter() - start
        return result, {"execution_time": elapsed, "memory_usage": memory, "validation_issues": issues}

    return monitored
