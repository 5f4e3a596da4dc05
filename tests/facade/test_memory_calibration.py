"""The analytic step memory against XLA's, for a few reference train steps compiled here.

Each case asks the search for one mesh (the analytic peak: ``memory.total``) and
compiles the reference step with that candidate's specs on the 8 CPU devices, or
ahead of time for a TPU v6e-8 slice when libtpu is installed (the exact peak:
:func:`meshplan.compiled_memory`). The band asserted is the issue's, which the
calibration achieves on these cases (see benchmarks/RESULTS.md for the whole
grid); a change to the model or the reference step that moves a case out of it
fails here.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest

from meshplan import compiled_memory
from meshplan.facade._compiled import libtpu_available, tpu_topology_mesh
from meshplan.facade._reference import ReferenceConfig, reference_step
from meshplan.pure import search_meshes
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.search import TrainingRecipe

LLAMA = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-small4", num_layers=4, hidden_size=512,
                            num_heads=8, num_kv_heads=4, head_dim=64, intermediate_size=1408, vocab_size=4096,
                            num_params=None)
BAND = (0.95, 1.10)
"""analytic / exact on XLA:CPU (jax 0.10.2): the issue's band, which these cases meet (1.03 and 1.05 when fitted)."""


def _ratio(sizes: dict[str, int], remat: str, attention: str, backend: str = "cpu", batch: int = 16,
           seq: int = 256) -> float:
    axes = tuple(sizes)
    recipe = TrainingRecipe(remat=remat, attention=attention, backend=backend, residual_split=False)
    cand = search_meshes(LLAMA, "v5p-16", axes=axes, fixed=sizes, batch=batch, seq=seq, recipe=recipe,
                         headroom=0.0, top_k=1).best
    if backend == "tpu":
        mesh = tpu_topology_mesh("v6e-8", axes, tuple(sizes.values()))
    else:
        mesh = jax.make_mesh(tuple(sizes.values()), axes, axis_types=(jax.sharding.AxisType.Auto,) * len(axes))
    ref = reference_step(LLAMA, mesh, batch=batch, seq=seq, plan=cand,
                         config=ReferenceConfig(remat=remat, attention=attention))
    exact = compiled_memory(ref.fn, *ref.args)
    # The exact parts agree byte for byte: arguments = params + optimizer state (+ step counter and batch).
    assert exact.argument_bytes - (cand.memory.params + cand.memory.optimizer) < 2**16
    return cand.memory.total / exact.peak_bytes


@pytest.mark.parametrize("sizes, remat, attention", [
    ({"fsdp": 8}, "full", "dot_product"),
    ({"dp": 2, "fsdp": 2, "tp": 2}, "none", "plain"),
])
def test_the_analytic_peak_is_within_the_cpu_band_of_xla(sizes: dict[str, int], remat: str, attention: str) -> None:
    ratio = _ratio(sizes, remat, attention)
    assert BAND[0] <= ratio <= BAND[1], f"analytic / exact = {ratio:.3f} outside {BAND}"


@pytest.mark.skipif(not libtpu_available(), reason="TPU ahead-of-time compiles need libtpu (pip install 'meshplan[tpu]')")
@pytest.mark.parametrize("sizes, remat, attention", [
    ({"fsdp": 8}, "full", "flash"),
])
def test_the_analytic_peak_is_within_the_tpu_band_of_xla(sizes: dict[str, int], remat: str, attention: str) -> None:
    # TPU_SHAPES of the benchmark: at 16 x 256 XLA:TPU's peak is mostly on-chip scratch, not the step.
    ratio = _ratio(sizes, remat, attention, backend="tpu", batch=32, seq=1024)
    assert BAND[0] <= ratio <= BAND[1], f"analytic / exact = {ratio:.3f} outside {BAND}"
