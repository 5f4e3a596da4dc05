"""The collectives a compiled step runs, read from XLA's optimized HLO.

Compiles (or takes) a program, hands ``compiled.as_text()`` to the pure parser
:func:`meshplan.pure.xla.parse_hlo_collectives` and returns its records:
per device, per collective instruction, bytes defined as the cost model
defines a collective's buffer. Instructions inside ``while`` loops are listed
once (compare on unrolled steps: ``ReferenceConfig(scan_layers=False)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshplan.facade.verify._compiled import jitted_step, lower_step
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.xla._hlo_collectives import HloCollective, parse_hlo_collectives

__all__ = ["compiled_collectives"]


def compiled_collectives(step: Any, *abstract_args: Any, compiler_options: Mapping[str, Any] | None = None,
                         **abstract_kwargs: Any) -> tuple[HloCollective, ...]:
    """The collective instructions of ``step`` as compiled for its (abstract) arguments.

    Args:
      step: a compiled program (anything with ``as_text()``), or a function
        (ideally ``jax.jit``-ed) to compile for ``abstract_args``.
      *abstract_args: ``jax.ShapeDtypeStruct`` trees with shardings (or arrays).
      compiler_options: XLA options for ``compile()``.
      **abstract_kwargs: keyword arguments, likewise abstract.

    Returns:
      The :class:`~meshplan.pure.xla.HloCollective` records, in program order;
      :func:`~meshplan.pure.xla.collective_totals` sums them per kind.

    Raises:
      MeshplanTypeError: ``step`` is neither compiled nor callable.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((len(jax.devices()),), ("dp",))
      >>> x = jax.ShapeDtypeStruct((8 * len(jax.devices()),), jnp.float32, sharding=NamedSharding(mesh, P("dp")))
      >>> [c.kind for c in compiled_collectives(jax.jit(lambda a: a.sum()), x)][:1] in ([], ["all-reduce"])
      True
    """
    if hasattr(step, "as_text") and not hasattr(step, "lower"):
        return parse_hlo_collectives(step.as_text())
    if not callable(step):
        raise MeshplanTypeError(f"step={step!r:.80} must be a compiled program or a function (ideally jax.jit-ed).")
    jitted = jitted_step(step, (abstract_args, abstract_kwargs), compiler_options)
    compiled = lower_step(jitted, *abstract_args, **abstract_kwargs).compile(
        dict(compiler_options) if compiler_options else None)
    text = compiled.as_text()
    if not isinstance(text, str):
        raise PlanError("the backend returned no HLO text for the compiled program; its collectives cannot be read.")
    return parse_hlo_collectives(text)
