"""One compile to run (:class:`CompileJob`), and the reference step a plan's recipe describes.

A job is everything that shapes the compiled program: the model, the cluster, the mesh, the plan's specs,
the reference step's configuration, batch and sequence, the target and, for a pipeline layout, its schedule.
It pickles (the workers get it through a file) and keys the compile cache
(:func:`~meshplan.facade.verify._cache.job_key`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meshplan.facade.verify._reference import ReferenceConfig
from meshplan.pure.cluster import Cluster
from meshplan.pure.cost import TrainingRecipe
from meshplan.pure.presets import ModelSpec

__all__ = ["CompileJob", "reference_config"]


def reference_config(recipe: TrainingRecipe, *, param_dtype: str | None = None) -> ReferenceConfig:
    """The :class:`~meshplan.ReferenceConfig` that compiles the step ``recipe`` prices: its remat, attention,
    optimizer, micro-batches and vocabulary tiles, layers scanned, parameters in ``param_dtype`` (default
    the recipe's weight dtype; a plan of mixed dtypes compiles bf16 weights).

    Example:
      >>> reference_config(TrainingRecipe(remat="dots", micro_batches=4)).text
      'remat=dots attention=dot_product adamw params=bfloat16 compute=bfloat16 optimizer_state=float32 micro_batches=4'
      >>> reference_config(TrainingRecipe(capacity_factor=1.0)).capacity_factor  # a run's own MoE capacity
      1.0
    """
    dtype = param_dtype if param_dtype is not None else recipe.weight_dtype
    return ReferenceConfig(remat=recipe.remat, attention=recipe.attention, optimizer=recipe.optimizer,
                           micro_batches=recipe.micro_batches, vocab_tiles=recipe.vocab_tiles,
                           param_dtype="bfloat16" if dtype == "mixed" else dtype, scan_layers=True,
                           capacity_factor=recipe.capacity_factor)


@dataclasses.dataclass(frozen=True, slots=True)
class CompileJob:
    """One reference step to compile: the model, the cluster, the mesh, the plan's specs and the recipe.

    Attributes:
      spec: the model's dims.
      cluster: the cluster it trains on.
      axis_names, axis_sizes, dcn_shape: the mesh (``dcn_shape`` each axis's part across hosts/slices).
      plan: the search candidate whose parameter specs and batch layout the step uses (``None``: the
        default rule's).
      batch, seq: the global batch in sequences, tokens per sequence.
      config: the :class:`~meshplan.ReferenceConfig`.
      target: ``"auto"`` (the cluster's own compiler) or ``"cpu"`` (XLA:CPU, as many devices).
      pipeline: ``(micro_batches, repeats)`` to compile the pipelined step
        (:func:`~meshplan.facade.verify._pipeline_step.pipeline_step`, the circular schedule) on a mesh whose
        first axis is ``pp``; ``None``: the unpipelined reference step.

    Example:
      >>> from meshplan.pure import get_preset, parse_cluster
      >>> job = CompileJob(get_preset("gpt2").spec, parse_cluster("1x8xH100"), ("fsdp",), (8,), None, None,
      ...                  batch=8, seq=64, config=ReferenceConfig())
      >>> job.mesh_text
      'fsdp=8'
    """

    spec: ModelSpec
    cluster: Cluster
    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    dcn_shape: tuple[int, ...] | None
    plan: Any  # a MeshCandidate, or None
    batch: int
    seq: int
    config: ReferenceConfig
    target: str = "auto"
    pipeline: tuple[int, int] | None = None

    @property
    def mesh_text(self) -> str:
        """``"fsdp=4,tp=2"`` (axes of size 1 left out; ``"single device"`` when none is left)."""
        return ",".join(f"{a}={s}" for a, s in zip(self.axis_names, self.axis_sizes, strict=True)
                        if s > 1) or "single device"
