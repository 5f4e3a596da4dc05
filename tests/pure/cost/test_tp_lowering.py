"""The per-backend tp lowering table (meshplan.pure.cost._tp_lowering): every row is there, names the program its
counts were read from, and gives the counts read."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from meshplan.pure.cost._activation_collectives import _layer_counts
from meshplan.pure.cost._tp_lowering import ATTENTIONS, LOWERINGS, TP_BACKENDS, Passes, lowering
from meshplan.pure.errors import PlanError


def _model(**kw: object) -> SimpleNamespace:
    base = dict(family="llama", num_layers=2, num_moe_layers=0, num_kv_heads=8, num_shared_experts=0, mla=None)
    return SimpleNamespace(**{**base, **kw})


def test_every_backend_and_attention_kind_has_one_row_that_names_its_program() -> None:
    assert sorted(LOWERINGS) == sorted((b, a) for b in TP_BACKENDS for a in ATTENTIONS)
    for (backend, attention), row in LOWERINGS.items():
        assert (row.backend, row.attention) == (backend, attention)
        layers = [row.dense, row.moe] + ([row.shared_moe] if row.shared_moe is not None else [])
        assert row.read_from and all(layer.read_from for layer in layers)
        assert row.label == f"XLA:{backend.upper()}"
        with pytest.raises(dataclasses.FrozenInstanceError):
            row.head_gathers = 0  # type: ignore[misc]


def test_rows_not_read_say_so() -> None:
    # MLA on XLA:TPU was never compiled: it keeps Megatron's schedule and says it was not read.
    row = lowering("tpu", mla=True)
    assert "not read" in row.read_from and "not read" in row.dense.read_from
    assert row.dense.sums == Passes(2, 1, 2) and row.dense.gathers == Passes(2, 2, 2)


@pytest.mark.parametrize("alone, r, expected", [(False, 1, 20), (True, 1, 14), (False, 0, 15)])
def test_xla_gpu_gathers_the_counts_read_from_1x8xh200(alone: bool, r: int, expected: int) -> None:
    # Llama fsdp=2 x tp=4 (20 per 2 layers), tp=8 (14), dp=2 x tp=4 without remat (15): XLA:GPU's HLO by op_name.
    _, gathers = _layer_counts(lowering("gpu", mla=False), _model(), 4, r, alone=alone, kv_part=False,
                               fused_bwd=False)
    assert gathers == expected


def test_xla_tpu_gathers_one_fewer_per_step_than_its_layers() -> None:
    _, gathers = _layer_counts(lowering("tpu", mla=False), _model(num_layers=3), 4, 1, alone=False, kv_part=False,
                               fused_bwd=False)
    assert gathers == 3 * (2 + 2 + 6) - 1


def test_xla_cpu_sums_each_column_projection_apart() -> None:
    # Llama: q, k, v, gate, up in the backward (5); GPT-2: c_attn and c_fc (2); on top of 2 forward and 1 recompute.
    sums, _ = _layer_counts(lowering("cpu", mla=False), _model(num_layers=1), 4, 1, alone=False, kv_part=False,
                            fused_bwd=False)
    gpt2, _ = _layer_counts(lowering("cpu", mla=False), _model(num_layers=1, family="gpt2"), 4, 1, alone=False,
                            kv_part=False, fused_bwd=False)
    assert (sums, gpt2) == (3 + 5, 3 + 2)


def test_a_shared_expert_is_lowered_apart_only_with_mla() -> None:
    for (_, attention), row in LOWERINGS.items():
        assert (row.shared_moe is not None) == (attention == "mla" and row.backend != "tpu")
        assert row.layer("shared_moe") is (row.shared_moe or row.moe)


def test_an_unknown_backend_is_refused_by_name() -> None:
    with pytest.raises(PlanError, match="rocm"):
        lowering("rocm", mla=False)
