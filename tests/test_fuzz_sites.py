"""One bad call per site the fuzz of every public room found (issue 35, item 6): the exact typed error now raised.

Each row raised a raw ``AttributeError``, ``TypeError``, ``IndexError``, ``KeyError``, ``ValueError``,
``OverflowError`` or ``MemoryError`` before its callable checked the argument, or was accepted and failed (or
answered nonsense) later: the row's name says which, as read on the tree before the checks. ``type(err) is
expected`` is checked exactly, and the message must name the bad value, as in tests/test_bad_input.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import meshplan
from meshplan import errors as E
from meshplan.pure import cluster, cost, report, rules, search, specs, verify
from meshplan.pure.presets import MODEL_SPECS

GPT2, MIXTRAL = MODEL_SPECS["gpt2"], MODEL_SPECS["mixtral-8x7b"]
LINK = cluster.Link(1e11, 1e-6)
TERM = ("fsdp all-gather of params (fwd + bwd)", "all-gather", 0.2)


def _flops() -> cost.StepFlops:
    return cost.step_flops(GPT2, {"dp": 8}, batch=8, seq=128)


def _time(**kw: Any) -> Any:
    args = dict(layers=12, tokens=1024, devices=8, peak_flops=1e15, efficiency=0.5) | kw
    flops, terms = args.pop("flops", _flops()), args.pop("terms", [TERM])
    return cost.step_time(flops, terms, **args)


def _layer(**kw: Any) -> Any:
    return cost.layer_flops(kw.pop("model", GPT2), **(dict(moe_layer=False, batch=8, seq=128) | kw))


def _plan() -> cost.PipelinePlan:
    return cost.plan_stages(12, 2, micro_batches=4, layer_param_bytes=1 << 20, embed_param_bytes=1 << 20,
                            head_param_bytes=1 << 20, layer_activation_bytes=1 << 16)


def _row() -> verify.VerifyRow:
    return verify.VerifyRow("fsdp=8", 1, 100, 200, "8 x XLA:CPU")


def _result() -> Any:
    return search.search_meshes("gpt2", "1x8xH100", batch=8, seq=128, top_k=1)


def _best() -> Any:
    return _result().best


ROWS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # cost.layer_flops: nothing was checked; every argument now goes through its kind's validator.
    ("layer_flops model None (AttributeError)", lambda: _layer(model=None), E.MeshplanTypeError, "model=None"),
    ("layer_flops batch None (TypeError)", lambda: _layer(batch=None, seq=None), E.MeshplanTypeError, "batch=None"),
    ("layer_flops shards None (TypeError)", lambda: _layer(shards=None), E.MeshplanTypeError, "shards=None"),
    ("layer_flops MLA tp str (TypeError in tp_replicated_splits)",
     lambda: _layer(model=MODEL_SPECS["deepseek-v3"], tp="x"), E.MeshplanTypeError, "tp='x'"),
    ("layer_flops gpt2 tp str (accepted)", lambda: _layer(tp="x"), E.MeshplanTypeError, "tp='x'"),
    ("layer_flops kv heads tp float (TypeError in math.gcd)", lambda: _layer(model=MIXTRAL, tp=2.0),
     E.MeshplanTypeError, "tp=2.0"),
    ("layer_flops str batch x huge seq (MemoryError)", lambda: _layer(batch="x" * 300, seq=2**40),
     E.MeshplanTypeError, "batch='xxx"),
    ("layer_flops batch 10**400 (OverflowError)", lambda: _layer(batch=10**400), E.PlanError, "batch=1000"),
    ("layer_flops attention unknown (accepted as non-flash)", lambda: _layer(attention="splash"), E.PlanError,
     "attention='splash'"),
    ("layer_flops moe_layer of a dense model (PlanError naming top_k)", lambda: _layer(moe_layer=True),
     E.PlanError, "moe_layer=True, but 'gpt2' has no routed experts"),
    # cost.step_flops
    ("step_flops model None (AttributeError)", lambda: cost.step_flops(None, {}, batch=8, seq=8),
     E.MeshplanTypeError, "model=None"),
    ("step_flops remat dict (TypeError: unhashable)", lambda: cost.step_flops(GPT2, {}, batch=8, seq=8, remat={}),
     E.MeshplanTypeError, "remat={}"),
    ("step_flops sizes list (AttributeError)", lambda: cost.step_flops(GPT2, ["dp"], batch=8, seq=8),
     E.MeshplanTypeError, "sizes=['dp']"),
    ("step_flops sizes 10**400 (OverflowError)", lambda: cost.step_flops(GPT2, {"dp": 10**400}, batch=8, seq=8),
     E.PlanError, "sizes['dp']=1000"),
    ("step_flops sizes multiplying to 10**48 devices (accepted)",
     lambda: cost.step_flops(GPT2, dict.fromkeys(("dp", "fsdp", "tp", "ep"), 10**12), batch=8, seq=8),
     E.PlanError, "more than 1000000000000 devices"),
    # cost.step_time
    ("step_time flops None (AttributeError)", lambda: _time(flops=None), E.MeshplanTypeError, "flops=None"),
    ("step_time terms None (TypeError)", lambda: _time(terms=None), E.MeshplanTypeError, "terms=None"),
    ("step_time term too short (IndexError)", lambda: _time(terms=[("a", "all-gather")]), E.PlanError,
     "terms[0]=('a', 'all-gather')"),
    ("step_time term a dict (KeyError)", lambda: _time(terms=[{0: "a", 1: "b"}]), E.MeshplanTypeError,
     "terms[0]={0: 'a', 1: 'b'}"),
    ("step_time term seconds str (TypeError)", lambda: _time(terms=[("a", "all-gather", "2")]),
     E.MeshplanTypeError, "terms[0][2]='2'"),
    ("step_time layers None (TypeError)", lambda: _time(layers=None), E.MeshplanTypeError, "layers=None"),
    ("step_time devices tuple (TypeError)", lambda: _time(devices=(1, 2)), E.MeshplanTypeError, "devices=(1, 2)"),
    ("step_time tokens str (TypeError)", lambda: _time(tokens="1024"), E.MeshplanTypeError, "tokens='1024'"),
    ("step_time peak_flops str (TypeError)", lambda: _time(peak_flops="1e15"), E.MeshplanTypeError,
     "peak_flops='1e15'"),
    ("step_time efficiency None (TypeError)", lambda: _time(efficiency=None), E.MeshplanTypeError,
     "efficiency=None"),
    ("step_time efficiency 2 (accepted)", lambda: _time(efficiency=2.0), E.PlanError, "efficiency=2.0"),
    ("StepFlops model str (accepted; TypeError in step_time)",
     lambda: cost.StepFlops("x", 0.0, 0.0, 1.0, 1.0, 1.0, 1.0), E.MeshplanTypeError, "StepFlops.model='x'"),
    # methods of cost records, and xla_collectives
    ("MoeDispatch.routing None (TypeError)", lambda: cost.MoeDispatch().routing(None), E.MeshplanTypeError,
     "top_k=None"),
    ("MoeDispatch.routing array (numpy UFuncTypeError)", lambda: cost.MoeDispatch().routing(np.array(["a"])),
     E.MeshplanTypeError, "top_k=array"),
    ("MoeDispatch.rows top_k 10**400 (OverflowError)", lambda: cost.MoeDispatch().rows(top_k=10**400, seq=8, experts=8),
     E.PlanError, "top_k=1000"),
    ("PipelinePlan.total_bytes None (TypeError)", lambda: _plan().total_bytes(None), E.MeshplanTypeError,
     "stage=None"),
    ("PipelinePlan.total_bytes 2**63 (IndexError)", lambda: _plan().total_bytes(2**63), E.PlanError,
     "stage=9223372036854775808"),
    ("PipelinePlan.total_bytes 5 of 2 stages (IndexError)", lambda: _plan().total_bytes(5), E.PlanError,
     "the stages are 0 to 1"),
    ("xla_collectives terms None (TypeError)", lambda: cost.xla_collectives(None, backend="gpu", itemsize=2),
     E.MeshplanTypeError, "terms=None"),
    # pure.verify: the verification's decisions
    ("compiled_fit None (TypeError)", lambda: verify.compiled_fit(None, None, deviceless=False),
     E.MeshplanTypeError, "peak_bytes=None"),
    ("compiled_fit array (ValueError: truth value)", lambda: verify.compiled_fit(10, 20, deviceless=np.array([])),
     E.MeshplanTypeError, "deviceless=array"),
    ("compiled_fit dtype (TypeError)",
     lambda: verify.compiled_fit(10, np.dtype("O"), deviceless=False), E.MeshplanTypeError, "budget_bytes=dtype"),
    ("uncompiled_dispatch None (AttributeError)", lambda: verify.uncompiled_dispatch(None, cost.TrainingRecipe()),
     E.MeshplanTypeError, "model=None"),
    ("uncompiled_dispatch recipe None (AttributeError)", lambda: verify.uncompiled_dispatch(MIXTRAL, None),
     E.MeshplanTypeError, "recipe=None"),
    ("estimate_range cand None (AttributeError)", lambda: verify.estimate_range(None, cost.TrainingRecipe()),
     E.MeshplanTypeError, "cand=None"),
    ("estimate_row unknown field (TypeError: unexpected keyword)",
     lambda: verify.estimate_row(_best(), 100, cost.TrainingRecipe(), peak=3), E.MeshplanTypeError, "['peak']"),
    ("outcome_row outcome None (AttributeError)", lambda: verify.outcome_row(_row(), None, compiler="c", cached=False),
     E.MeshplanTypeError, "outcome=None"),
    ("outcome_row base None (TypeError in dataclasses.replace)",
     lambda: verify.outcome_row(None, verify.CompileOutcome("t", None), compiler="c", cached=False),
     E.MeshplanTypeError, "base=None"),
    ("CompileOutcome memory str (accepted; AttributeError in outcome_row)", lambda: verify.CompileOutcome("t", "peak"),
     E.MeshplanTypeError, "CompileOutcome.memory='peak'"),
    ("next_to_compile decided None (AttributeError)",
     lambda: verify.next_to_compile([10], 20, None, top=1, start=0), E.MeshplanTypeError, "decided=None"),
    ("next_to_compile range_highs None (TypeError)",
     lambda: verify.next_to_compile(None, 20, {}, top=1, start=0), E.MeshplanTypeError, "range_highs=None"),
    ("next_to_compile budget None (TypeError)", lambda: verify.next_to_compile([10], None, {}, top=1, start=0),
     E.MeshplanTypeError, "budget_bytes=None"),
    ("next_to_compile range_highs array (ValueError: truth value)",
     lambda: verify.next_to_compile([np.array([1, 2])], 20, {}, top=1, start=0), E.MeshplanTypeError,
     "range_highs[0]=array"),
    # rules.AxisKindRule's dims overrides
    ("AxisKindRule dims int (TypeError)", lambda: rules.AxisKindRule(dims=3), E.MeshplanTypeError, "dims=3"),
    ("AxisKindRule dims pattern int (TypeError in re.compile)", lambda: rules.AxisKindRule(dims=[(1, ("in",))]),
     E.ShardingRuleError, "dims #0 (1, ('in',)) is not a (regex str, kinds) pair"),
    ("AxisKindRule dims pattern bytes (TypeError at the first leaf)",
     lambda: rules.AxisKindRule(dims=[(b"mlp", ("in", "out"))]).layout("mlp/kernel", (4, 8)), E.ShardingRuleError,
     "dims #0 (b'mlp'"),
    ("AxisKindRule dims pattern list (TypeError: unhashable)", lambda: rules.AxisKindRule(dims=[(["x"], ("in",))]),
     E.ShardingRuleError, "dims #0 (['x']"),
    ("AxisKindRule dims one-element pair (ValueError: unpack)", lambda: rules.AxisKindRule(dims=[("x",)]),
     E.ShardingRuleError, "dims #0 ('x',)"),
    ("AxisKindRule dims kinds int (TypeError)", lambda: rules.AxisKindRule(dims=[("x", 3)]), E.ShardingRuleError,
     "kinds=3"),
    ("AxisKindRule.for_model unknown option (TypeError: unexpected keyword)",
     lambda: rules.AxisKindRule.for_model(GPT2, bogus=1), E.MeshplanTypeError, "unknown options ['bogus']"),
    ("AxisKindRule.for_model num_heads too (TypeError: multiple values)",
     lambda: rules.AxisKindRule.for_model(GPT2, num_heads=3), E.MeshplanTypeError, "unknown options ['num_heads']"),
    ("plan_tree rule a class (TypeError from int(ctx))", lambda: rules.plan_tree({"w": np.zeros((4, 4))}, int, {}),
     E.MeshplanTypeError, "rule=int is a class, not a rule"),
    ("CompositeRule of a rule class (accepted; at the first leaf an error naming axis_names)",
     lambda: rules.CompositeRule((rules.AutoRule,)), E.MeshplanTypeError, "rules[0]=AutoRule is a class"),
    # pure.specs and pure.report
    ("canonical_entries rank 2**31 (MemoryError: a 16 GB tuple of padding)",
     lambda: specs.canonical_entries(P("dp", "tp"), 2**31), E.SpecError, "rank=2147483648 must be <= 65536"),
    ("plan_html fragment a ShapeDtypeStruct (ValueError from its truth value)",
     lambda: report.plan_html(_result(), fragment=jax.ShapeDtypeStruct((-1, 4), np.float32)), E.MeshplanTypeError,
     "fragment=ShapeDtypeStruct"),
    # the facade, through meshplan's MeshConfig and load_model
    ("load_model a 300-character name (OSError: file name too long)", lambda: meshplan.load_model("a" * 300),
     E.ModelConfigError, "File name too long"),
    ("MeshConfig.create_device_mesh ragged devices (ValueError: could not broadcast)",
     lambda: meshplan.MeshConfig((2, 4), ("data", "model")).create_device_mesh([np.zeros((2, 2)), [1, 2]]),
     E.MeshplanTypeError, "nests sequences of unequal shapes"),
]


def test_every_row_expects_a_typed_meshplan_error() -> None:
    for name, _, cls, _ in ROWS:
        assert issubclass(cls, E.MeshplanError) and issubclass(cls, (ValueError, TypeError)), name


@pytest.mark.parametrize("call,cls,needle", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_each_site_the_fuzz_found_raises_its_typed_error(call: Callable[[], Any], cls: type[Exception],
                                                         needle: str) -> None:
    with pytest.raises(cls) as info:
        call()
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    assert needle in str(info.value), str(info.value)


def test_valid_calls_of_the_fixed_sites_answer_as_before() -> None:
    """The checks at the top change no answer: the docstrings' figures, and the search's own calls."""
    assert round(cost.layer_flops(MODEL_SPECS["llama3-8b"], moe_layer=False, batch=1, seq=4096).weights
                 / (2 * 4096) / 1e6) == 218
    f = cost.step_flops(MODEL_SPECS["llama3-70b"], {"fsdp": 8, "tp": 8}, batch=64, seq=4096)
    assert (f"{f.model:.2e}", f"{f.per_device:.2e}") == ("1.14e+17", "2.21e+15")
    t = _time(flops=cost.StepFlops(6e15, 0.0, 0.0, 1e15, 4e12, 8e12, 4e13), layers=80, tokens=2**20,
              terms=[TERM, ("tp all-reduce of activations", "all-reduce", 0.1)])
    assert (round(t.compute_s, 3), round(t.exposed_s, 4)) == (2.0, 0.1025)
    assert _plan().total_bytes(1) == _plan().state_bytes[1] + _plan().activation_bytes[1]
    assert verify.next_to_compile([10, 30, 10, 10], 20, {0: "exact", 1: "over budget"}, top=2, start=2) == ((2,), 3)
    assert rules.AxisKindRule(dims=[["mlp/wi", ["in", "out"]]]).dims == (("mlp/wi", ("in", "out")),)
    assert rules.AxisKindRule.for_model(MIXTRAL, tp_axis="model").num_experts == 8
