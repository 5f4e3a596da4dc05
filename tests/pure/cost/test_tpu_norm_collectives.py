"""XLA:TPU's row statistics over the hidden-split stream and its tied table split over tp.

Read from compiled HLO (v5e-8, windowed einsum off): GPT-2 (hidden 1024, 2 layers) fsdp=2 x tp=4 for the
LayerNorm counts and the tied table, Llama / Mixtral steps for RMSNorm's (the XLA:GPU rule). The whole-step
check against compiled programs is ``benchmarks/bench_collectives.py --tpu`` (benchmarks/RESULTS.md,
"Collectives"; how the rule was read: docs/design-notes.md).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import parse_cluster
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.cost import TrainingRecipe, xla_collectives
from meshplan.pure.search import search_meshes
from meshplan.pure.xla import collective_totals
from meshplan.pure.cost._activation_collectives import activation_terms
from meshplan.pure.cost._param_collectives import ParamTraffic, param_tables
from meshplan.pure.cost._placement import AxisPlacement

ROW = "row statistics"


def _gpt2_1k(layers: int = 2):  # bench_collectives' TPU-sized GPT-2
    return dataclasses.replace(MODEL_SPECS["gpt2"], name="gpt2-1k", num_layers=layers, hidden_size=1024,
                               num_heads=8, num_kv_heads=8, head_dim=128, intermediate_size=4096, vocab_size=8192,
                               max_position_embeddings=2048, num_params=None)


def _rows(model, sizes, backend="tpu", remat="full", split=True, batch=16, seq=2048):
    p = AxisPlacement(tuple(sizes), tuple(sizes.values()), (1,) * len(sizes), parse_cluster("H100"))
    return [t for t in activation_terms(model, sizes, p, batch=batch, seq=seq, itemsize=2, remat=remat,
                                        residual_split=split, backend=backend) if ROW in t.what]


def test_gpt2_layer_norm_row_statistics_are_the_36_read_from_xla_tpu():
    # layer_norm:67-69 and chunk_loss:316 in GPT-2 fsdp=2 x tp=4's HLO: 5 norms x (2 fwd + 3 bwd), the 4
    # layers' norms 2 each in the recompute, the loss's 3; each an f32 value per token of the local batch.
    (row,) = _rows(_gpt2_1k(), {"fsdp": 2, "tp": 4})
    assert (row[1], row[2], row[3], row[4]) == ("all-reduce", ("tp",), 8 * 2048 * 4, 36)


@given(st.sampled_from(["gpt2", "llama3-8b", "mixtral-8x7b"]), st.integers(1, 6), st.sampled_from([2, 4, 8]),
       st.sampled_from(["none", "dots", "full", "offload"]), st.sampled_from([{}, {"dp": 2}, {"fsdp": 2}]))
def test_row_statistics_per_norm_and_pass(name, layers, tp, remat, other):
    model = dataclasses.replace(_gpt2_1k(layers) if name == "gpt2" else MODEL_SPECS[name], num_layers=layers)
    sizes = {**other, "tp": tp}
    r = 1 if remat in ("full", "offload") else 0
    norms = 2 * layers + 1
    (row,) = _rows(model, sizes, remat=remat)
    b = 16 // (sizes.get("dp", 1) * sizes.get("fsdp", 1))
    assert row[3] == b * 2048 * 4 and row[1] == "all-reduce" and row[2] == ("tp",)
    # LayerNorm: mean and variance (fwd, recompute), three row sums bwd; RMSNorm one each; the loss's 3.
    per = (2, 2, 3) if name == "gpt2" else (1, 1, 1)
    assert row[4] == per[0] * norms + per[1] * r * (norms - 1) + per[2] * norms + 3
    # One more layer adds its two norms in every pass.
    (more,) = _rows(dataclasses.replace(model, num_layers=layers + 1), sizes, remat=remat)
    assert more[4] - row[4] == 2 * sum(per) - 2 * per[1] * (1 - r)
    if name != "gpt2":  # RMSNorm: XLA:TPU sums what XLA:GPU sums
        assert [t[3:5] for t in _rows(model, sizes, "gpu", remat)] == [row[3:5]]
    else:  # GPT-2 on XLA:GPU was not read: the loss's only
        assert [t.calls for t in _rows(model, sizes, "gpu", remat)] == [3]


@given(st.sampled_from(["gpt2", "llama3-8b"]), st.sampled_from(["tpu", "gpu", "cpu"]))
def test_no_row_statistics_without_a_hidden_split_stream(name, backend):
    model = _gpt2_1k() if name == "gpt2" else MODEL_SPECS[name]
    assert _rows(model, {"fsdp": 2, "tp": 4}, backend, split=False) == []
    assert _rows(model, {"fsdp": 8}, backend) == []
    assert _rows(model, {"fsdp": 2, "tp": 4}, "cpu") == []  # XLA:CPU: not read


groups = st.sampled_from([("fsdp",), ("fsdp", "ep"), ("dp", "fsdp")])
nbytes = st.integers(1, 10**9)


@st.composite
def tied_traffic(draw: st.DrawFn) -> ParamTraffic:
    """A plan's traffic with a tied head stored split over one group (grad dtype 2 bytes: fp32 is twice)."""
    storage = draw(groups)
    head = draw(nbytes)
    layers = draw(nbytes)
    return ParamTraffic(gather=((storage, head + layers),), scatter=((storage, head + layers),), reduce=(),
                        head=((storage, head),), head_scatter=((storage, head),),
                        head_grad_f32=((storage, 2 * head),), tied=True, head_tp=draw(st.booleans()))


def _table(tables, what):
    (row,) = [t for t in tables if t[1] == what]
    return dict(row[2])


@given(tied_traffic(), st.sampled_from(["none", "dots", "full", "offload"]))
def test_a_tp_split_tied_table_is_summed_whole_then_scattered_and_never_gathered_again(traffic, remat):
    axes = ("dp", "fsdp", "ep", "tp")
    tpu = param_tables(traffic, axes, backend="tpu", remat=remat)
    (storage, head), = traffic.head
    f32 = dict(traffic.head_grad_f32)[storage]
    again = _table(tpu, "all-gather of params (tied embedding, again for the head fwd + bwd: XLA:TPU)")
    grads = _table(tpu, "all-gather of grads (the tied head's, for the lookup's scatter-add: XLA:TPU)")
    summed = _table(tpu, "all-reduce of grads (the tied head's, f32, whole before the lookup's scatter-add: XLA:TPU)")
    scattered = _table(tpu, "reduce-scatter of grads")
    head_f32 = _table(tpu, "reduce-scatter of grads (head, f32)")
    if traffic.head_tp:
        assert again == grads == head_f32 == {}
        assert summed == {storage: f32}
        assert scattered == dict(traffic.scatter)  # the sum, the head's included, in its grad dtype
    else:  # the fsdp-only table (GPT-2 fsdp=8): gathered 4 times, its fp32 gradient reduce-scattered
        assert again == {storage: head} and grads == {storage: head} and summed == {}
        assert head_f32 == {storage: f32}
        assert scattered[storage] == dict(traffic.scatter)[storage] - head
    # Only XLA:TPU was read: the other backends' tables do not depend on it.
    for backend in ("cpu", "gpu"):
        assert (param_tables(traffic, axes, backend=backend, remat=remat)
                == param_tables(dataclasses.replace(traffic, head_tp=not traffic.head_tp), axes, backend=backend,
                                remat=remat))


@pytest.mark.parametrize("sizes,head_tp", [({"fsdp": 2, "tp": 4}, True), ({"fsdp": 4, "tp": 2}, True),
                                           ({"fsdp": 8}, False), ({"dp": 2, "tp": 4}, False)])
def test_the_plan_says_when_the_tied_table_is_split_over_tp(sizes, head_tp):
    # GPT-2's plan stores wte P('tp', 'fsdp') with tp and fsdp, P('fsdp',) without tp, P('tp',) without fsdp
    # (no storage group: nothing to scatter, the head's gradient is all-reduced over dp as before).
    best = search_meshes(_gpt2_1k(), "1x8xH100", axes=tuple(sizes), fixed=sizes, batch=16, seq=2048,
                         recipe=TrainingRecipe(backend="tpu")).best
    whats = [t.what for t in best.comm]
    assert any("whole before the lookup's scatter-add" in w for w in whats) == (head_tp and "fsdp" in sizes)
    assert any("again for the head" in w for w in whats) == (not head_tp and "fsdp" in sizes)


def test_gpt2_fsdp2_tp4_all_reduce_bytes_match_the_compiled_program_in_sample():
    # In-sample (the HLO these rules were read from): compiled 44,319,236 B; the 16,900 B left are the
    # small bias gradients' fsdp sums.
    sizes = {"fsdp": 2, "tp": 4}
    best = search_meshes(_gpt2_1k(), "1x8xH100", axes=tuple(sizes), fixed=sizes, batch=16, seq=2048,
                         recipe=TrainingRecipe(backend="tpu")).best
    analytic = collective_totals(xla_collectives(best.comm, backend="tpu", itemsize=2))["all-reduce"][0]
    assert analytic == 33_554_432 + 8_388_608 + 36 * 65_536
    assert abs(analytic / 44_319_236 - 1) < 0.001
