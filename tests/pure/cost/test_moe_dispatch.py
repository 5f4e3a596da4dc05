"""MoE dispatch (meshplan.pure.cost._moe_dispatch): GShard's capacity einsums, the default and priced as before,
against dropless grouped GEMMs, through the FLOPs, the activation memory, the collectives and the searches."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.pure import parse_cluster, search_meshes
from meshplan.pure.cost import (
    CAPACITY_FACTOR,
    MOE_DISPATCHES,
    MoeDispatch,
    TrainingRecipe,
    layer_dims,
    step_flops,
    step_memory,
)
from meshplan.pure.cost._flops import RECOMPUTE, layer_flops
from meshplan.pure.cost._gathered_operand import gathers_tokens
from meshplan.pure.cost._activation_collectives import activation_terms
from meshplan.pure.cost._placement import AxisPlacement
from meshplan.pure.cost._tpu_terms import expert_token_terms
from meshplan.pure.cost._step_memory import activation_parts
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.search import price_pipeline
from meshplan.testing import model_specs
from tests.profiles import examples

REMAT = st.sampled_from(tuple(RECOMPUTE))
ATTENTION = st.sampled_from(("plain", "dot_product", "flash"))
BACKEND = st.sampled_from(("tpu", "gpu", "cpu"))
MOE = ("mixtral", "deepseek_v3")


@st.composite
def cases(draw, family=None):
    """(spec, axis sizes, batch, seq): tp divides the heads, ep the experts, the batch axes the batch."""
    spec = draw(model_specs(family=family))
    tp = draw(st.sampled_from([d for d in (1, 2, 4) if spec.num_heads % d == 0]))
    sizes = {a: draw(st.sampled_from((1, 2))) for a in ("dp", "fsdp", "sp")}
    if spec.is_moe:
        sizes["ep"] = draw(st.sampled_from([d for d in (1, 2, 4) if spec.num_experts % d == 0]))
    sizes["tp"] = tp
    ways = sizes["dp"] * sizes["fsdp"] * sizes.get("ep", 1)
    return spec, sizes, ways * draw(st.integers(1, 4)), sizes["sp"] * draw(st.sampled_from((8, 16, 64, 128)))


def _placement(sizes: dict[str, int]) -> AxisPlacement:
    return AxisPlacement(tuple(sizes), tuple(sizes.values()), (1,) * len(sizes), parse_cluster("1x8xH100"))


def _moved(terms: list, kind: str) -> float:
    """Bytes the terms of ``kind`` move per device per step (bytes per call x calls)."""
    return sum(t.nbytes * t.calls for t in terms if t.kind == kind)


# --- the dispatch itself ----------------------------------------------------------------------------------------

@given(st.integers(1, 16), st.integers(1, 8192), st.integers(1, 512), st.floats(1.0, 4.0))
def test_dropless_rows_are_the_routed_tokens_and_never_more_than_the_capacity_slots(k: int, s: int, e: int,
                                                                                   cf: float) -> None:
    einsum, dropless = MoeDispatch("einsum", cf), MoeDispatch("dropless", cf)
    assert dropless.rows(top_k=k, seq=s, experts=e) == k * s
    slots = einsum.rows(top_k=k, seq=s, experts=e)
    assert slots % e == 0 and slots >= k * s * cf * (1 - 1e-12)  # whole slots per expert, at least cf x routed
    assert dropless.rows(top_k=k, seq=s, experts=e) <= slots
    assert (dropless.einsums, dropless.width_factor, dropless.routing(k)) == (0, 1.0, 0.0)
    assert (einsum.einsums, einsum.width_factor, einsum.routing(k)) == (1, cf, k * cf)


def test_the_einsum_capacity_is_the_reference_steps() -> None:
    # meshplan.facade.verify._reference_model.moe: capacity = max(1, ceil(k x s x 1.25 / e)); 1 slot at the least.
    assert CAPACITY_FACTOR == 1.25
    assert MoeDispatch().rows(top_k=2, seq=4096, experts=8) == 8 * 1280
    assert MoeDispatch().rows(top_k=1, seq=1, experts=64) == 64
    assert MoeDispatch("dropless").rows(top_k=1, seq=1, experts=64) == 1


@pytest.mark.parametrize("bad", ["sparse", "Dropless", "", "megablox"])
def test_an_unknown_dispatch_names_the_valid_ones(bad: str) -> None:
    valid = r"\('einsum', 'dropless'\)"
    with pytest.raises(PlanError, match=f"moe_dispatch={bad!r}.*{valid}"):
        MoeDispatch(bad)
    with pytest.raises(PlanError, match=rf"moe_dispatch={bad!r}: use one of \['einsum', 'dropless'\]"):
        TrainingRecipe(moe_dispatch=bad)
    # Refused by name wherever it is passed, for a dense model too (it has no MoE layer to read it).
    for model in ("llama3-8b", "mixtral-8x7b"):
        with pytest.raises(PlanError, match=f"moe_dispatch={bad!r}"):
            step_flops(MODEL_SPECS[model], {"fsdp": 8}, batch=8, seq=128, moe_dispatch=bad)
        with pytest.raises(PlanError, match=f"moe_dispatch={bad!r}"):
            activation_terms(MODEL_SPECS[model], {"tp": 2}, _placement({"tp": 2}), batch=8, seq=128, itemsize=2,
                             moe_dispatch=bad)
    with pytest.raises(PlanError, match=f"moe_dispatch={bad!r}"):
        gathers_tokens(batch=8, seq=128, top_k=2, experts=8, width=1024, moe_dispatch=bad)


@pytest.mark.parametrize("bad", [None, 1, ["dropless"], b"dropless"])
def test_a_dispatch_that_is_no_string_is_a_type_error(bad: object) -> None:
    with pytest.raises(MeshplanTypeError, match="moe_dispatch="):
        MoeDispatch(bad)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"moe_dispatch=.*\['einsum', 'dropless'\]"):
        TrainingRecipe(moe_dispatch=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_a_capacity_factor_must_be_a_finite_positive_number(bad: float) -> None:
    with pytest.raises(PlanError, match="capacity_factor="):
        MoeDispatch("einsum", bad)


def test_the_recipe_round_trips_and_says_dropless() -> None:
    r = TrainingRecipe(moe_dispatch="dropless")
    assert TrainingRecipe.from_dict(r.to_dict()) == r
    assert "dropless MoE dispatch" in r.describe()
    assert "dispatch" not in TrainingRecipe().describe()
    # A recipe written before the field existed reads back as the einsum dispatch.
    old = {k: v for k, v in TrainingRecipe().to_dict().items() if k != "moe_dispatch"}
    assert TrainingRecipe.from_dict(old).moe_dispatch == "einsum" == MOE_DISPATCHES[0]


# --- einsum: today's figures, bit for bit -----------------------------------------------------------------------

@given(cases(family=MOE), st.integers(1, 8), st.sampled_from((1, 3, 64, 4096)))
def test_einsum_prices_gshard_capacity_exactly_as_before(case, b: int, s: int) -> None:
    # The formulas the cost model had before it had a dispatch (written out again: a check, not a copy).
    spec = case[0]
    e, k, h = spec.num_experts, spec.num_experts_per_tok, spec.hidden_size
    capacity = max(1, math.ceil(k * s * 1.25 / e))
    f = layer_flops(spec, moe_layer=True, batch=b, seq=s)
    assert f.padding == 2.0 * 3 * h * spec.moe_intermediate_size * (b * e * capacity - b * s * k)
    assert f.einsum == 2.0 * (b * s) * e * capacity * h
    widths = layer_dims(spec).moe_widths(MoeDispatch())
    n, layers = spec.num_moe_layers, max(spec.num_layers, 1)
    assert widths == (n * ((k * 1.25 + spec.num_shared_experts) * spec.moe_intermediate_size) / layers,
                      k * 1.25 * n / layers)


# Figures of the code before moe_dispatch existed (same calls, float.hex() where floats): the default must not move.
PINNED_FLOPS = {"mixtral-8x7b": ("0x1.33e58dc6379abp+53", "0x1.2000000000000p+55", "0x1.cc10000000000p+52"),
                "deepseek-v3": ("0x1.1f2847f984ba5p+52", "0x1.c8c0000000000p+57", "0x1.2db5600000000p+51")}
PINNED_PEAKS = {("mixtral-8x7b", "tpu"): 3881005393797, ("mixtral-8x7b", "gpu"): 4619696819036,
                ("mixtral-8x7b", "cpu"): 6598742587105, ("deepseek-v3", "tpu"): 2870676578134,
                ("deepseek-v3", "gpu"): 2691118478901, ("deepseek-v3", "cpu"): 3601313096949}
PINNED_SIZES = {"mixtral-8x7b": {"fsdp": 4, "ep": 2, "tp": 2}, "deepseek-v3": {"dp": 2, "ep": 64}}


@pytest.mark.parametrize("name", sorted(PINNED_FLOPS))
def test_the_default_dispatch_keeps_the_figures_pinned_before_it_existed(name: str) -> None:
    m, sizes = MODEL_SPECS[name], PINNED_SIZES[name]
    for f in (step_flops(m, sizes, batch=256, seq=4096, remat="full", attention="dot_product"),
              step_flops(m, sizes, batch=256, seq=4096, remat="full", attention="dot_product", moe_dispatch="einsum")):
        assert (f.per_device.hex(), f.overhead.hex(), f.weight_matmuls.hex()) == PINNED_FLOPS[name]
    for backend in ("tpu", "gpu", "cpu"):
        r = TrainingRecipe(remat="none", attention="dot_product", backend=backend)
        sm = step_memory(layer_dims(m), sizes, r, batch=256, seq=4096, params=10**9, grads=10**9,
                         optimizer=4 * 10**9)
        assert sm.peak == PINNED_PEAKS[(name, backend)]
    terms = activation_terms(m, sizes, _placement(sizes), batch=256, seq=4096, itemsize=2, backend="tpu")
    assert [(t.kind, t.nbytes, t.calls) for t in terms if t.kind == "all-to-all"] == [
        ("all-to-all", 2684354560 if name == "mixtral-8x7b" else 1174405120, 192 if name == "mixtral-8x7b" else 348)]


def test_the_default_search_keeps_its_pinned_ranking() -> None:
    # Mixtral on v5p-64, fsdp and dp only (XLA:TPU's expert-token gathers decide) and with ep=4 fixed.
    found = search_meshes("mixtral-8x7b", "v5p-64", batch=64, seq=4096, top_k=3)
    assert [(c.text, c.memory.total, c.step.step_s.hex()) for c in found.candidates] == [
        ("dp=4,fsdp=8", 82074629952, "0x1.57757f1318f89p+2"), ("dp=2,fsdp=16", 47047535424, "0x1.57c7a5b545dcdp+2"),
        ("fsdp=32", 29533988160, "0x1.586dbc88335f8p+2")]
    found = search_meshes("mixtral-8x7b", "v5p-64", batch=64, seq=4096, top_k=3, fixed={"ep": 4})
    assert [(c.text, c.memory.total, c.step.step_s.hex()) for c in found.candidates] == [
        ("dp=4,fsdp=2,ep=4", 87534258953, "0x1.5d2d7bb429d7fp+2"),
        ("dp=2,fsdp=4,ep=4", 48894483209, "0x1.5d38e5d333ff9p+2"),
        ("fsdp=8,ep=4", 29574595337, "0x1.5d3ece00f3911p+2")]


# --- dropless never costs more; a dense model does not see it ---------------------------------------------------

@given(cases(), REMAT, ATTENTION)
def test_dropless_never_has_more_flops_and_a_dense_model_the_same(case, remat: str, attention: str) -> None:
    spec, sizes, b, s = case
    einsum = step_flops(spec, sizes, batch=b, seq=s, remat=remat, attention=attention)
    dropless = step_flops(spec, sizes, batch=b, seq=s, remat=remat, attention=attention, moe_dispatch="dropless")
    if not spec.num_moe_layers:  # a dense model (or a DeepSeek cut to its dense layers) has nothing to dispatch
        assert dropless == einsum
        return
    assert dropless.overhead == 0.0 <= einsum.overhead
    assert (dropless.model, dropless.recompute, dropless.head, dropless.elementwise) == (
        einsum.model, einsum.recompute, einsum.head, einsum.elementwise)
    for name in ("per_device", "layer_forward", "layer_backward", "weight_matmuls", "weight_forward"):
        assert getattr(dropless, name) <= getattr(einsum, name) * (1 + 1e-12), name
    # What is left of a dropless step is the model's work: executed == model + recompute.
    assert dropless.executed == dropless.model + dropless.recompute


@given(cases(), REMAT, ATTENTION, BACKEND, st.sampled_from((1, 2)))
def test_dropless_never_has_more_activation_bytes_and_a_dense_model_the_same(case, remat: str, attention: str,
                                                                             backend: str, micro: int) -> None:
    spec, sizes, b, s = case
    dims = layer_dims(spec)
    kw = dict(tp=sizes["tp"], sp=sizes["sp"], ways=sizes["dp"] * sizes["fsdp"] * sizes.get("ep", 1), batch=b,
              seq=s)
    recipe = TrainingRecipe(remat=remat, attention=attention, backend=backend, micro_batches=micro)
    einsum = activation_parts(dims, recipe, **kw)
    dropless = activation_parts(dims, dataclasses.replace(recipe, moe_dispatch="dropless"), **kw)
    if not spec.num_moe_layers:  # a dense model (or a DeepSeek cut to its dense layers) has nothing to dispatch
        assert dropless == einsum
        return
    for name in ("saved", "logits", "head", "work"):
        assert getattr(dropless, name) <= getattr(einsum, name) * (1 + 1e-12), name
    # The working set holds one layer's expert intermediates (top_k rows per token, not top_k x 1.25) and, with
    # the einsum dispatch, its fp32 routing tensors: under every policy and compiler it shrinks.
    assert dropless.work < einsum.work


@given(cases(family=MOE), REMAT, BACKEND, st.booleans())
def test_dropless_never_moves_more_all_to_all_bytes(case, remat: str, backend: str, split: bool) -> None:
    spec, sizes, b, s = case
    kw = dict(batch=b, seq=s, itemsize=2, remat=remat, backend=backend, residual_split=split)
    einsum = activation_terms(spec, sizes, _placement(sizes), **kw)
    dropless = activation_terms(spec, sizes, _placement(sizes), moe_dispatch="dropless", **kw)
    assert _moved(dropless, "all-to-all") <= _moved(einsum, "all-to-all")
    # Term for term (the same collectives, each moving no more): the expert buffers shrink to the routed tokens.
    assert [t._replace(nbytes=0) for t in dropless] == [t._replace(nbytes=0) for t in einsum]
    assert all(d.nbytes <= e.nbytes for d, e in zip(dropless, einsum, strict=True))
    if sizes.get("ep", 1) > 1 and spec.num_moe_layers:
        rows = b // (sizes["dp"] * sizes["fsdp"] * sizes["ep"]) * (s // sizes["sp"]) * spec.num_experts_per_tok
        a2a = [t for t in dropless if t.kind == "all-to-all"]
        assert [t.nbytes for t in a2a] == [rows * spec.hidden_size * 2]  # exactly the routed tokens, hidden wide


@given(cases(family=MOE), st.sampled_from(("none", "full")))
def test_dropless_expert_token_gathers_move_no_more(case, remat: str) -> None:
    spec, sizes, b, s = case
    kw = dict(batch=b, seq=s, itemsize=2, axes=("fsdp",), remat=remat)
    sizes = {**sizes, "fsdp": 2}
    einsum = expert_token_terms(spec, sizes, _placement(sizes), **kw)
    dropless = expert_token_terms(spec, sizes, _placement(sizes), moe_dispatch="dropless", **kw)
    assert [t._replace(nbytes=0) for t in dropless] == [t._replace(nbytes=0) for t in einsum]
    assert all(d.nbytes <= e.nbytes for d, e in zip(dropless, einsum, strict=True))


@given(st.integers(1, 64), st.integers(1, 4096), st.integers(1, 8), st.integers(2, 64), st.integers(1, 20000))
def test_dropless_gathers_the_tokens_wherever_einsum_does(batch: int, seq: int, k: int, e: int, width: int) -> None:
    # Its routed tokens are never a larger tensor than the capacity slots, so the smaller operand stays theirs.
    kw = dict(batch=batch, seq=seq, top_k=k, experts=e, width=width)
    if gathers_tokens(**kw):
        assert gathers_tokens(**kw, moe_dispatch="dropless")
    assert gathers_tokens(**kw, moe_dispatch="dropless") == (batch * seq * k < width * e)


# --- the searches -----------------------------------------------------------------------------------------------

def _fitting(model, cluster: str, recipe: TrainingRecipe, **kw) -> dict:
    """The meshes that fit, by text (none where nothing does)."""
    try:
        return {c.text: c for c in search_meshes(model, cluster, recipe=recipe, **kw).candidates}
    except PlanError as err:
        assert "does not fit" in str(err)
        return {}


SEARCHED = {"mixtral-8x7b": MODEL_SPECS["mixtral-8x7b"],
            "deepseek-v3/6": dataclasses.replace(MODEL_SPECS["deepseek-v3"], num_layers=6, num_params=None)}


@settings(max_examples=examples(8), deadline=None)
@given(st.sampled_from(sorted(SEARCHED)), st.sampled_from(("4x8xH100", "v5p-32")),
       st.sampled_from(("full", "dots")), st.sampled_from((1, 2, 4, 8)))
def test_a_dropless_mesh_never_prices_slower_or_fuller(name: str, cluster: str, remat: str, ep: int) -> None:
    # The same mesh, micro-batch count and rule: no more FLOPs, memory or expert bytes.
    model = SEARCHED[name]
    kw = dict(batch=64, seq=2048, fixed={"ep": ep, "tp": 1, "sp": 1}, top_k=200, micro_batches=1)
    recipe = TrainingRecipe(remat=remat, attention="flash")
    einsum, dropless = (_fitting(model, cluster, dataclasses.replace(recipe, moe_dispatch=d), **kw)
                        for d in MOE_DISPATCHES)
    assert set(einsum) <= set(dropless)  # every mesh the einsum step fits, the dropless one fits
    for text, e in einsum.items():
        d = dropless[text]
        assert d.memory.total <= e.memory.total, text  # the peak phase may be the update, which has no routing
        assert d.step.flops < e.step.flops, text
        assert d.step.compute_s < e.step.compute_s, text
        a2a = [sum(t.nbytes * t.calls for t in c.comm if t.kind == "all-to-all") for c in (d, e)]
        assert a2a[0] <= a2a[1] and (a2a[0] < a2a[1] or ep == 1), text


def test_a_dense_search_does_not_see_the_dispatch() -> None:
    for model, cluster in (("llama3-8b", "2x8xH100"), ("gpt2", "v5e-8")):
        einsum = search_meshes(model, cluster, batch=16, seq=1024, top_k=5)
        dropless = search_meshes(model, cluster, batch=16, seq=1024, top_k=5,
                                 recipe=dataclasses.replace(einsum.request.recipe, moe_dispatch="dropless"))
        assert dropless.candidates == einsum.candidates


def test_deepseek_v3_dropless_drops_the_overhead_and_its_routing_tensors() -> None:
    # The task's case: 256 experts, top-8, seq 4096; the einsum overhead is 80% of the model's FLOPs.
    ds = MODEL_SPECS["deepseek-v3"]
    einsum = step_flops(ds, {"dp": 2, "ep": 64}, batch=960, seq=4096, remat="dots")
    dropless = step_flops(ds, {"dp": 2, "ep": 64}, batch=960, seq=4096, remat="dots", moe_dispatch="dropless")
    assert einsum.overhead / einsum.model == pytest.approx(0.80, abs=0.01) and dropless.overhead == 0
    assert dropless.per_device < 0.6 * einsum.per_device
    # The fp32 s x s routing tensors: a third of the remat-full working set on XLA:GPU's coefficients, most of it
    # on XLA:TPU's (GShard's one-hot slot tensor, top_k of them), most of the remat-none activations there.
    work = {}
    for backend, remat in (("gpu", "full"), ("tpu", "full"), ("tpu", "none")):
        recipe = TrainingRecipe(remat=remat, attention="flash", backend=backend)
        work[backend, remat] = [activation_parts(layer_dims(ds), dataclasses.replace(recipe, moe_dispatch=d), tp=1,
                                                 sp=1, ways=128, batch=960, seq=4096) for d in MOE_DISPATCHES]
    assert work["gpu", "full"][1].work < 0.7 * work["gpu", "full"][0].work
    assert work["tpu", "full"][1].work < 0.2 * work["tpu", "full"][0].work
    assert work["tpu", "none"][1].saved < 0.4 * work["tpu", "none"][0].saved


def test_a_dropless_pipeline_stage_prices_below_the_einsum_one() -> None:
    # price_pipeline reads the recipe through the stage search and step_memory: both drop the routing.
    ds = dataclasses.replace(MODEL_SPECS["deepseek-v3"], num_layers=4, num_dense_layers=0, num_params=None)
    kw = dict(pp=2, stage_layout={"ep": 16}, batch=64, seq=4096, schedule="1f1b", micro_batches=2)
    found = {d: price_pipeline(ds, "4x8xH100", recipe=TrainingRecipe(remat="dots", attention="flash",
                                                                     moe_dispatch=d), **kw)
             for d in MOE_DISPATCHES}
    einsum, dropless = found["einsum"], found["dropless"]
    assert dropless.step.flops < einsum.step.flops
    assert dropless.step.step_s < einsum.step.step_s
    assert dropless.memory.total < einsum.memory.total
    assert all(d < e for d, e in zip(dropless.pipeline.activation_bytes, einsum.pipeline.activation_bytes,
                                     strict=True))


# --- The recipe's capacity factor: what a run sets is what the search prices and the reference step compiles ---

@settings(max_examples=examples(12), deadline=None)
@given(st.sampled_from(("mixtral-8x7b", "llama3-8b")), st.floats(1.0, 4.0), st.floats(1.0, 4.0))
def test_a_larger_capacity_factor_never_prices_an_moe_step_cheaper_and_leaves_a_dense_one_alone(
        model: str, low: float, high: float) -> None:
    low, high = sorted((low, high))
    mesh = {"fsdp": 4, "ep": 8} if model.startswith("mixtral") else {"fsdp": 32}

    def best(cf: float):  # one mesh, fixed: the same layout priced at two factors
        r = search_meshes(model, "4x8xH100", batch=64, seq=2048, fixed=mesh, headroom=0.1,
                          recipe=TrainingRecipe(capacity_factor=cf))
        return r.best

    a, b = best(low), best(high)
    assert a.step is not None and b.step is not None
    if model.startswith("mixtral"):
        assert b.step.step_s >= a.step.step_s and b.memory.total >= a.memory.total
        assert b.step.flops >= a.step.flops
    else:
        assert (a.step, a.memory, a.comm) == (b.step, b.memory, b.comm)


def test_the_capacity_factor_is_the_recipes_default_gshards_and_round_trips() -> None:
    assert TrainingRecipe().capacity_factor == CAPACITY_FACTOR
    r = TrainingRecipe(capacity_factor=1.0)
    assert TrainingRecipe.from_dict(r.to_dict()) == r and "MoE capacity factor 1" in r.describe()
    assert "capacity" not in TrainingRecipe().describe()


@pytest.mark.parametrize("bad", [0, 0.5, -1.0, float("nan"), float("inf"), 65.0, "1.25", True])
def test_a_capacity_factor_that_is_no_positive_bounded_number_is_refused(bad: object) -> None:
    with pytest.raises((PlanError, MeshplanTypeError), match="capacity_factor"):
        TrainingRecipe(capacity_factor=bad)  # type: ignore[arg-type]
