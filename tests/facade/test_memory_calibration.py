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
from meshplan.facade.verify._compilers import libtpu_available
from meshplan.facade.verify._targets import tpu_topology_mesh
from meshplan.facade.verify._reference import ReferenceConfig, reference_step
from meshplan.pure import search_meshes
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.cost import TrainingRecipe

LLAMA = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="llama-small4", num_layers=4, hidden_size=512,
                            num_heads=8, num_kv_heads=4, head_dim=64, intermediate_size=1408, vocab_size=4096,
                            num_params=None)
BAND = (0.95, 1.10)
"""analytic / exact on XLA:CPU (jax 0.10.2): the issue's band, which these cases meet (1.03 and 1.05 when fitted)."""


def _ratio(sizes: dict[str, int], remat: str, attention: str, backend: str = "cpu", batch: int = 16,
           seq: int = 256) -> float:
    axes = tuple(sizes)
    # Compiled for a v6e-8 slice: its generation's coefficients (the search's v5p-16 would pick v5p's).
    recipe = TrainingRecipe(remat=remat, attention=attention, backend=backend, residual_split=False,
                            device="v6e" if backend == "tpu" else None)
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


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
@pytest.mark.parametrize("sizes, remat, attention", [
    ({"fsdp": 8}, "full", "dot_product"),
    ({"dp": 2, "fsdp": 2, "tp": 2}, "none", "plain"),
])
def test_the_analytic_peak_is_within_the_cpu_band_of_xla(sizes: dict[str, int], remat: str, attention: str) -> None:
    ratio = _ratio(sizes, remat, attention)
    assert BAND[0] <= ratio <= BAND[1], f"analytic / exact = {ratio:.3f} outside {BAND}"


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
@pytest.mark.skipif(not libtpu_available(), reason="TPU ahead-of-time compiles need libtpu (pip install 'meshplan[tpu]')")
@pytest.mark.parametrize("sizes, remat, attention", [
    ({"fsdp": 8}, "full", "flash"),
])
def test_the_analytic_peak_is_within_the_tpu_band_of_xla(sizes: dict[str, int], remat: str, attention: str) -> None:
    # TPU_SHAPES of the benchmark: at 16 x 256 XLA:TPU's peak is mostly on-chip scratch, not the step.
    ratio = _ratio(sizes, remat, attention, backend="tpu", batch=32, seq=1024)
    assert BAND[0] <= ratio <= BAND[1], f"analytic / exact = {ratio:.3f} outside {BAND}"


def _repriced(pattern: str) -> dict[str, list[float]]:
    """analytic / exact of every recorded row in ``benchmarks/data/<pattern>``, re-priced with the current model
    (no compiling), by group: the target and, for the TPU grid, the remat policy."""
    import json
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(root))
    try:
        import bench_memory_calibration as bench
    finally:
        sys.path.remove(str(root))
    groups: dict[str, list[float]] = {}
    for path in sorted(root.glob(f"data/{pattern}")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = bench._reprice(json.loads(line))
                key = f"{path.stem} {row.get('cluster', row['backend'])} {row['remat']}"
                groups.setdefault(key, []).append(float(row["ratio"]))
    return groups


def _inside(ratios: list[float]) -> int:
    return sum(BAND[0] <= r <= BAND[1] for r in ratios)


def test_the_recorded_tpu_grid_stays_in_band_per_generation() -> None:
    # The recorded XLA:TPU rows (benchmarks/data/memory_calibration_tpu.jsonl: 3 families x 4 meshes x
    # plain/flash at 32 x 1024 and Llama/Mixtral at 32 x 2048, on v6e-8 and v5p-16) re-priced: the counts
    # in the band that benchmarks/RESULTS.md reports; a model change that loses rows fails here.
    g = _repriced("memory_calibration_tpu.jsonl")
    counts = {k: (_inside(v), len(v)) for k, v in g.items()}
    assert counts == {"memory_calibration_tpu v5p-16 full": (12, 40), "memory_calibration_tpu v5p-16 none": (35, 40),
                      "memory_calibration_tpu v6e-8 full": (16, 40), "memory_calibration_tpu v6e-8 none": (32, 40)}
    # v5p's own coefficients: its remat-full rows no longer reach 1.5x (1.53 with v6e's).
    assert max(g["memory_calibration_tpu v5p-16 full"]) < 1.25


def test_the_recorded_full_size_tpu_rows_stay_in_band() -> None:
    # The full-width TPU steps (memory_calibration_tpu_fullsize.jsonl, memory_calibration_tpu_offload.jsonl):
    # 10 of 17 and 1 of 6 in band before the loss phase read which operand XLA gathers for the head's matmul
    # (session 5), 14 and 3 since; the Llama-3-8B fsdp-alone steps (1.22-1.29 before) are what moved. Three
    # held-out steps compiled after the change: dp=2,fsdp=4 in band on v5p-16 and v6e-8 (1.03), fsdp=8 at
    # 32 x 8192 not (0.80).
    full = [r for v in _repriced("memory_calibration_tpu_fullsize.jsonl").values() for r in v]
    offload = _repriced("memory_calibration_tpu_offload.jsonl")
    assert (_inside(full), len(full)) == (16, 20)
    assert {k: _inside(v) for k, v in offload.items()} == {"memory_calibration_tpu_offload v6e-8 offload": 2,
                                                          "memory_calibration_tpu_offload v5p-16 offload": 1}
    assert max(full) < 1.07


def test_the_full_width_grid_stays_where_it_was_recorded() -> None:
    # The full-width grid (memory_calibration_tpu_wide.jsonl, every row held out: Llama-3-8B and Mixtral-8x7B
    # cut to 2 layers at 16 x 2048, GPT-2 cut to 4 layers at 32 x 1024, the grid's 4 meshes, remat full / none,
    # flash / plain), on v5p-16 (session 6: 43 rows, 5 more in memory_calibration_tpu_fullsize.jsonl) and v6e-8
    # (session 8: 47 rows, the 48th there): benchmarks/RESULTS.md. The misses are Mixtral (without ep XLA
    # gathers the dispatched tokens, not the experts' weights; with tp its remat-none steps are over-priced),
    # GPT-2's loss phase, and v6e's fsdp x tp remat-full steps, which peak up to 18% above v5p's.
    g = _repriced("memory_calibration_tpu_wide.jsonl")
    counts = {k: (_inside(v), len(v)) for k, v in g.items()}
    assert counts == {"memory_calibration_tpu_wide v5p-16 full": (8, 19),
                      "memory_calibration_tpu_wide v5p-16 none": (18, 24),
                      "memory_calibration_tpu_wide v6e-8 full": (12, 23),
                      "memory_calibration_tpu_wide v6e-8 none": (20, 24)}
    ratios = [r for v in g.values() for r in v]
    assert 0.82 < min(ratios) and max(ratios) < 1.19
