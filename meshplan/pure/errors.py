"""meshplan's exceptions: one base class, typed subclasses.

Every subclass also derives from the builtin a caller would catch without
knowing meshplan (``ValueError`` for bad values, ``TypeError`` for bad types,
``TimeoutError`` for barriers), so code written against the reference
libraries keeps working. Messages name the offending value and say what
would be valid.
"""

from __future__ import annotations

__all__ = [
    "MeshplanError",
    "MeshplanTypeError",
    "MeshShapeError",
    "MeshStringError",
    "DeviceLayoutError",
    "MeshRuleError",
    "SpecError",
    "ShardingRuleError",
    "MemoryBudgetError",
    "CompiledOutOfMemoryError",
    "ClusterError",
    "PlanError",
    "NothingFitsError",
    "ModelConfigError",
    "NoMeshError",
    "RuleValidationError",
    "DistributedError",
    "DistributedArgumentError",
    "BarrierTimeoutError",
    "ProfileError",
    "DeviceMismatchError",
    "CompareError",
    "ExecutorError",
]


class MeshplanError(Exception):
    """Base class of every error meshplan raises on purpose."""


class MeshplanTypeError(MeshplanError, TypeError):
    """An argument has the wrong type (e.g. a float where an axis size goes)."""


class MeshShapeError(MeshplanError, ValueError):
    """Axis dims/names are inconsistent, or do not fit the device count."""


class MeshStringError(MeshShapeError):
    """A mesh string such as ``"dp:2,tp:4"`` is malformed."""


class DeviceLayoutError(MeshplanError, ValueError):
    """Devices cannot be laid out as asked (uneven granules, ICI/DCN mismatch)."""


class MeshRuleError(MeshplanError, ValueError):
    """A ``mesh_rules`` entry is malformed or selects "no mesh" for a platform."""


class SpecError(MeshplanError, ValueError):
    """A PartitionSpec does not fit an array's shape or the mesh."""


class ShardingRuleError(MeshplanError, ValueError):
    """A sharding rule is misconfigured, or its answer would not be valid."""


class MemoryBudgetError(MeshplanError, ValueError):
    """A leaf or a model cannot fit the per-device memory budget."""


class CompiledOutOfMemoryError(MemoryBudgetError):
    """XLA refused to compile a step: it does not fit the target's device memory.

    ``xla_message`` is the compiler's own text ("Ran out of memory ..."),
    ``required_bytes`` / ``available_bytes`` its figures where it gives them.
    """

    def __init__(self, message: str, *, xla_message: str = "", required_bytes: int | None = None,
                 available_bytes: int | None = None) -> None:
        super().__init__(message)
        self.xla_message = xla_message
        self.required_bytes = required_bytes
        self.available_bytes = available_bytes


class ClusterError(MeshplanError, ValueError):
    """A cluster description is malformed or names an unknown device."""


class PlanError(MeshplanError, ValueError):
    """The planner cannot answer the request (nothing fits, bad constraints)."""


class NothingFitsError(PlanError, MemoryBudgetError):
    """No mesh of the search fits the memory budget by the estimate (the message names the leanest and what it
    needs); a plan that verifies compiles a pinned layout before it refuses it (``meshplan plan --fix``)."""


class ModelConfigError(PlanError):
    """A model config (a Hugging Face ``config.json``, a MaxText model yml) is malformed, inconsistent or
    names an architecture meshplan does not know; the message names the file, the key and what is valid."""


class RuleValidationError(ShardingRuleError, PlanError):
    """Rules given to the planner do not fit the model tree (checked before any mesh is searched).

    Names the rule, the leaf and what would be valid: an unknown mesh axis, a
    spec longer than the leaf's rank, a pattern that matches no leaf. Both a
    :class:`ShardingRuleError` and a :class:`PlanError` (the search raised the
    latter for these mistakes before they were checked up front).
    """


class NoMeshError(MeshShapeError, ShardingRuleError):
    """A call needs a mesh, none was given and none is current (``jax.set_mesh``).

    Both a :class:`MeshShapeError` and a :class:`ShardingRuleError`, because
    the analyzer and host helpers (mesh callers) and the sharding rules
    raised those for this mistake before it had a class of its own.
    """


class DistributedError(MeshplanError, RuntimeError):
    """The jax distributed runtime is missing or misbehaving."""


class DistributedArgumentError(DistributedError, ValueError):
    """A bad argument to a multi-host call (``barrier_sync(timeout=-5)``).

    A :class:`DistributedError` (what those calls raised before it had a class
    of its own) and a ``ValueError``, like every other bad value.
    """


class BarrierTimeoutError(DistributedError, TimeoutError):
    """Not every process reached a barrier in time."""


class ProfileError(MeshplanError, ValueError):
    """A machine profile (``meshplan profile``'s JSON) cannot be used: malformed, truncated, edited after it was
    measured, of another format version, or for another device kind than the cluster it would price. The
    message names the file (where there is one), the field and what is valid, or both kinds / both versions."""


class DeviceMismatchError(MeshplanError, ValueError):
    """The live devices are not the ones a plan was made for (``measure`` on another machine): the message
    says what was found and what the plan expects."""
class CompareError(PlanError):
    """A cluster comparison's input is malformed: a cluster list item, a price, a token count, a ranking
    criterion. The message names the bad item and what would be valid."""


class ExecutorError(MeshplanError, RuntimeError):
    """The compile executor (a Dask cluster given by address) cannot be reached or used; the message names
    the address and the engine's own error."""
