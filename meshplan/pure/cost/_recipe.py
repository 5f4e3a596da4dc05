"""The training recipe a memory estimate prices: dtypes, optimizer, remat, attention, micro-batches.

Planners disagree with compilers mostly because they price a different step
than the one that runs. A :class:`TrainingRecipe` names every choice that
moves the peak, with defaults of a MaxText-style bf16 step:

- **dtypes**: ``weight_dtype`` (how parameters are stored; MaxText keeps
  fp32 weights and computes in bf16), ``compute_dtype`` (activations),
  ``grad_dtype`` (``None``: the weight dtype), ``optimizer_dtype`` (moments),
  and ``master_weights`` (an extra fp32 copy of the weights);
- **optimizer**: how many parameter-shaped state copies it keeps
  (:data:`OPTIMIZER_COPIES`: AdamW 2, Lion and SGD with momentum 1,
  Adafactor 0 -- its factored row/column statistics are ``O(rows + cols)``,
  below a percent of the weights, and not counted);
- **remat** (:data:`REMAT_POLICIES`): what the forward pass keeps per layer for
  the backward pass. ``"none"`` keeps every intermediate, ``"dots"`` the
  matmul outputs without batch dims (``jax.checkpoint_policies.
  dots_with_no_batch_dims_saveable``), ``"full"`` the layer input only,
  ``"offload"`` moves the layer inputs to host memory (nothing per layer
  stays in HBM);
- **attention** (:data:`ATTENTION_KINDS`): ``"plain"`` materialises fp32
  ``b x heads x s x s`` scores; ``"dot_product"`` is ``jax.nn.dot_product_attention``
  with its default (XLA) implementation, which keeps the same fp32 scores (measured
  on XLA:CPU, XLA:TPU and an H200); ``"flash"`` (Pallas flash/splash on TPU, cuDNN's
  fused kernel on GPU) never materialises them;
- ``residual_split``: the residual stream is stored split over ``tp`` (the
  plan's activation specs; Megatron's sequence parallelism); ``False`` for a
  step that constrains only the batch, so every tp shard holds it whole;
- ``micro_batches`` (gradient accumulation: activations scale with
  ``batch / micro_batches``, an fp32 accumulator joins the gradients) and
  ``vocab_tiles`` (the loss computed in vocabulary chunks divides the
  logits buffers);
- ``backend``: which compiler's buffer assignment and collectives the
  figures follow (``"tpu"``, ``"gpu"`` or ``"cpu"``; see
  :mod:`meshplan.pure.cost._step_memory`); ``None`` (the default): the
  cluster's, which the search fills in (XLA:TPU for a TPU slice, XLA:GPU
  otherwise), so a recipe written for one cluster prices another's compiler
  correctly; priced as XLA:TPU where no cluster says (:attr:`TrainingRecipe.compiler`).
  And ``device``: the accelerator
  (a :data:`~meshplan.pure.cluster._devices.DEVICE_SPECS` name). XLA:TPU
  schedules the same step differently per generation (v5p keeps more at once in
  a remat-full backward than v6e), so a device with coefficients of its own
  (``CALIBRATIONS["tpu-v5p"]``) selects them; ``None`` (or a device without its
  own) takes the backend's. The search fills ``device`` from the cluster when it
  is ``None``.
- ``matmul_dtype`` (:data:`~meshplan.pure.cost._matmul_dtype.MATMUL_DTYPES`): ``"bfloat16"`` (every
  matmul at the device's bf16 peak) or ``"float8"``: the weight matmuls (projections, MLP, MoE experts) at
  its FP8 peak, the attention core and the output head still at bf16, as torchao's ``Float8Linear``,
  DeepSeek-V3 and Transformer Engine run them (:mod:`meshplan.pure.cost._matmul_dtype`). It moves the step
  time only; a device with no FP8 peak refuses it where the device is known (the search).
- ``moe_dispatch`` (:data:`~meshplan.pure.cost._moe_dispatch.MOE_DISPATCHES`): how an MoE layer reaches its
  experts. ``"einsum"`` (the default) is GShard's capacity dispatch, the reference step's and MaxText's
  ``sparse_matmul: False``: padded capacity slots, one-hot dispatch/combine einsums, fp32 ``s x s`` routing
  tensors. ``"dropless"`` is grouped GEMMs over exactly the routed tokens (DeepSeek-V3, MaxText's
  ``sparse_matmul: True``, Megatron-LM, MegaBlocks): none of those, priced at the mean expert load. It moves
  the FLOPs, the activation memory and the expert collectives of MoE models (dense ones are unchanged);
  :mod:`meshplan.pure.cost._moe_dispatch` says what each costs. The memory coefficients were fitted on einsum
  compiles: a dropless figure is the same model with the routing terms removed, not a dropless fit.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from meshplan.pure._check import as_count, as_real, as_record
from meshplan.pure.errors import PlanError
from meshplan.pure.cluster._devices import DEVICE_SPECS
from meshplan.pure.cost._matmul_dtype import MATMUL_DTYPES
from meshplan.pure.cost._moe_dispatch import CAPACITY_FACTOR, MOE_DISPATCHES
from meshplan.pure.specs._dtypes import canonical_dtype, dtype_storage_bytes

__all__ = ["ATTENTION_KINDS", "BACKENDS", "MATMUL_DTYPES", "MOE_DISPATCHES", "OPTIMIZER_COPIES", "REMAT_POLICIES",
           "TrainingRecipe"]

REMAT_POLICIES: tuple[str, ...] = ("none", "dots", "full", "offload")
"""Remat policies, from most to least HBM kept per layer."""

ATTENTION_KINDS: tuple[str, ...] = ("plain", "dot_product", "flash")
"""Attention kinds: fp32 scores (``plain``), ``jax.nn.dot_product_attention``, none kept (``flash``)."""

BACKENDS: tuple[str, ...] = ("tpu", "gpu", "cpu")
"""Compilers the calibration knows."""

OPTIMIZER_COPIES: dict[str, int] = {"adamw": 2, "adam": 2, "lion": 1, "sgd": 1, "adafactor": 0}
"""Parameter-shaped state copies each optimizer keeps (in ``optimizer_dtype``); ``sgd`` is with momentum."""

_MAX_CAPACITY_FACTOR = 64.0  # bounds a typo; a factor of experts / top_k already gives each expert every token


def _choice(value: Any, what: str, valid: tuple[str, ...]) -> str | None:
    if isinstance(value, str) and value in valid:  # `in` on an array would compare element-wise
        return None
    return f"{what}={value!r}: use one of {list(valid)}"


# A search reads a recipe's item sizes ~10k times (price_step, per mesh and micro-batch count); resolving the
# dtype name each time was a few percent of it. Pure in the (canonical) name and bounded: an lru_cache is safe.
@functools.lru_cache(maxsize=64)
def _itemsize(name: str) -> int:
    return dtype_storage_bytes(canonical_dtype(name))


@dataclasses.dataclass(frozen=True, slots=True)
class TrainingRecipe:
    """One training step's memory-relevant choices (see the module docstring).

    Dtypes are stored as names (``"bfloat16"``), so the recipe is plain data.

    Example:
      >>> r = TrainingRecipe(weight_dtype="float32", remat="offload", attention="flash")
      >>> r.optimizer_copies, r.compute_itemsize, r.grad_itemsize
      (2, 2, 4)
      >>> r.describe()
      'weights float32, compute bfloat16, grads float32, adamw (2 x float32), remat offload, flash attention'
      >>> TrainingRecipe(matmul_dtype="float8").describe().split(", ")[-1]
      'fp8 weight matmuls'
      >>> TrainingRecipe(moe_dispatch="dropless").describe().split(", ")[-1]
      'dropless MoE dispatch'
      >>> TrainingRecipe(capacity_factor=1.0).describe().split(", ")[-1]
      'MoE capacity factor 1'
    """

    weight_dtype: str = "bfloat16"
    compute_dtype: str = "bfloat16"
    grad_dtype: str | None = None
    optimizer: str = "adamw"
    optimizer_dtype: str = "float32"
    master_weights: bool = False
    remat: str = "full"
    # What jax.nn.dot_product_attention gives on TPU and CPU (and the CLI's default): fp32 scores.
    attention: str = "dot_product"
    micro_batches: int = 1
    vocab_tiles: int = 1
    residual_split: bool = True
    backend: str | None = None
    # Last, so positional construction of the fields above keeps working.
    device: str | None = None
    matmul_dtype: str = "bfloat16"
    moe_dispatch: str = "einsum"
    # GShard's expert capacity over the even share of tokens (the einsum dispatch; MaxText's
    # capacity_factor, >= 1): a published run's own figure, priced and compiled as given.
    capacity_factor: float = CAPACITY_FACTOR

    def __post_init__(self) -> None:
        problems = [p for p in (
            _choice(self.remat, "remat", REMAT_POLICIES),
            _choice(self.attention, "attention", ATTENTION_KINDS),
            None if self.backend is None else _choice(self.backend, "backend", BACKENDS),
            None if self.device is None or isinstance(self.device, str) and self.device in DEVICE_SPECS else
            f"device={self.device!r}: use one of {list(DEVICE_SPECS)} or None",
            _choice(self.optimizer, "optimizer", tuple(sorted(OPTIMIZER_COPIES))),
            _choice(self.matmul_dtype, "matmul_dtype", MATMUL_DTYPES),
            _choice(self.moe_dispatch, "moe_dispatch", MOE_DISPATCHES)) if p]
        for name in ("weight_dtype", "compute_dtype", "grad_dtype", "optimizer_dtype"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, str(canonical_dtype(value, what=name)))
        for name in ("master_weights", "residual_split"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name}={getattr(self, name)!r}: use True or False")
        for name in ("micro_batches", "vocab_tiles"):
            object.__setattr__(self, name, as_count(getattr(self, name), name, error=PlanError))
        factor = as_real(self.capacity_factor, "capacity_factor", error=PlanError)
        if not 1 <= factor <= _MAX_CAPACITY_FACTOR:  # below 1 an even load drops tokens: FLOPs under the model's
            problems.append(f"capacity_factor={self.capacity_factor!r}: use a factor in [1, {_MAX_CAPACITY_FACTOR:g}]")
        object.__setattr__(self, "capacity_factor", float(factor))
        if problems:
            raise PlanError("TrainingRecipe: " + "; ".join(problems) + ".")

    @property
    def optimizer_copies(self) -> int:
        """Parameter-shaped optimizer copies, the fp32 master weights included."""
        return OPTIMIZER_COPIES[self.optimizer] + int(self.master_weights)

    @property
    def compute_itemsize(self) -> int:
        """Bytes per activation element."""
        return _itemsize(self.compute_dtype)

    @property
    def grad_itemsize(self) -> int:
        """Bytes per gradient element."""
        return _itemsize(self.grad_dtype or self.weight_dtype)

    @property
    def weight_itemsize(self) -> int:
        """Bytes per stored weight element."""
        return _itemsize(self.weight_dtype)

    @property
    def compiler(self) -> str:
        """The backend priced: ``backend``, or ``"tpu"`` where neither the recipe nor a cluster says.

        Example:
          >>> TrainingRecipe().compiler, TrainingRecipe(backend="gpu").compiler
          ('tpu', 'gpu')
        """
        return "tpu" if self.backend is None else self.backend

    def describe(self) -> str:
        """One line of the assumptions priced."""
        opt = OPTIMIZER_COPIES[self.optimizer]
        state = f"{self.optimizer} ({opt} x {self.optimizer_dtype})" if opt else self.optimizer
        extra = [f"{self.micro_batches} micro-batches"] if self.micro_batches > 1 else []
        extra += [f"{self.vocab_tiles} vocab tiles"] if self.vocab_tiles > 1 else []
        extra += ["fp32 master weights"] if self.master_weights else []
        extra += [f"calibrated for {self.compiler}"] if self.compiler != "tpu" else []
        extra += ["fp8 weight matmuls"] if self.matmul_dtype == "float8" else []
        extra += ["dropless MoE dispatch"] if self.moe_dispatch == "dropless" else []
        extra += [f"MoE capacity factor {self.capacity_factor:g}"] if self.capacity_factor != CAPACITY_FACTOR else []
        return ", ".join([f"weights {self.weight_dtype}", f"compute {self.compute_dtype}",
                          f"grads {self.grad_dtype or self.weight_dtype}", state, f"remat {self.remat}",
                          f"{self.attention} attention", *extra])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingRecipe:
        """Inverse of :meth:`to_dict`."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**as_record(data, "TrainingRecipe.from_dict", fields=names, required=(), error=PlanError))
