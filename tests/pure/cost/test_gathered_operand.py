"""Which operand of the head's matmul XLA:TPU gathers (meshplan.pure.cost._gathered_operand), and what the comm
model prices for each choice (``param_tables``' ``hidden_head`` / ``hidden_embed``, ``hidden_state_terms``).

The rule was read from and checked on XLA:TPU's HLO of full-width Llama-3-8B/2L steps:
tests/pure/cost/test_tpu_full_width_collectives.py holds the comm model to those compiles.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.pure import parse_cluster
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.cost._gathered_operand import (
    HeadLayout,
    gathers_hidden,
    gathers_tokens,
    head_layout,
    vocab_batch_axes,
)
from meshplan.pure.cost._param_collectives import ParamTraffic, param_tables
from meshplan.pure.cost._placement import AxisPlacement
from meshplan.pure.cost._tpu_terms import TOKEN_REMATS, expert_token_terms, hidden_state_terms

AXES = ("dp", "fsdp", "ep", "sp", "tp")
entries = st.one_of(st.none(), st.sampled_from(AXES),
                    st.lists(st.sampled_from(AXES), min_size=1, max_size=3, unique=True).map(tuple))


@st.composite
def head_specs(draw: st.DrawFn) -> tuple[tuple[object, object], tuple[int, int], dict[str, int]]:
    """A 2-D head's spec (no axis twice), its shape (vocab 1000 first or second) and the mesh's sizes."""
    first, second = draw(entries), draw(entries)
    named = lambda e: () if e is None else (e,) if isinstance(e, str) else e
    if set(named(first)) & set(named(second)):
        second = None
    shape = draw(st.sampled_from([(1000, 64), (64, 1000)]))
    sizes = {a: draw(st.integers(1, 8)) for a in AXES}
    return (first, second), shape, sizes


@given(head_specs())
def test_the_vocab_batch_axes_are_the_axes_head_layout_counts_as_vocab_batch(case: tuple) -> None:
    spec, shape, sizes = case
    axes = vocab_batch_axes(P(*spec), shape, vocab=1000)
    assert math.prod(sizes[a] for a in axes) == head_layout(P(*spec), shape, sizes, vocab=1000).vocab_batch
    assert set(axes) <= {"dp", "fsdp", "ep"}


@given(st.integers(1, 16), st.integers(1, 8), st.integers(1, 8), st.integers(1, 10**7), st.integers(1, 10**6))
def test_the_hidden_states_are_gathered_only_when_they_are_the_smaller_tensor(vb: int, vo: int, hid: int,
                                                                             tokens: int, vocab: int) -> None:
    layout = HeadLayout(vb, vo, hid)
    gathered = gathers_hidden(layout, tokens=tokens, vocab=vocab)
    # Shardy keeps the larger tensor's split (whole sizes, hidden cancels); a tie keeps the hidden states'.
    assert gathered == (vb > 1 and tokens < vocab)
    if gathered:  # fewer tokens never turn the choice back to the table
        assert gathers_hidden(layout, tokens=max(tokens // 2, 1), vocab=vocab)
    assert not gathers_hidden(None, tokens=tokens, vocab=vocab)


def _traffic(embed: int, head: int, layers: int, replicated: bool) -> ParamTraffic:
    """A plan's traffic on dp x fsdp: layers', embedding's and head's bytes stored over fsdp (the embedding
    also replicated over dp when ``replicated``)."""
    fs, dp = ("fsdp",), ("dp",)
    return ParamTraffic(
        gather=((fs, layers + embed + head),), scatter=((fs, (layers + embed + head)),),
        reduce=((dp, (layers + embed + head) // 4),) if replicated else (),
        embed=((fs, embed),), head=((fs, head),), head_scatter=((fs, head),), head_grad_f32=((fs, 2 * head),),
        embed_whole=((fs, dp, embed, embed // 4),) if replicated else (),
        embed_table=((fs, dp if replicated else (), embed, embed),))


def _rows(tables: tuple) -> dict[str, dict[tuple[str, ...], int]]:
    out: dict[str, dict[tuple[str, ...], int]] = {}
    for _, what, table, _, _, _ in tables:
        for axes, nbytes in table:
            if nbytes:
                out.setdefault(what, {})[axes] = out.get(what, {}).get(axes, 0) + nbytes
    return out


@given(st.integers(1, 10**9), st.integers(1, 10**9), st.integers(0, 10**10), st.booleans(), st.booleans(),
       st.booleans())
def test_gathered_hidden_states_take_exactly_the_tables_gathers_and_storage_sums_out(
        embed: int, head: int, layers: int, replicated: bool, hidden_head: bool, hidden_embed: bool) -> None:
    traffic = _traffic(embed, head, layers, replicated)
    axes = ("dp", "fsdp")
    before = _rows(param_tables(traffic, axes, backend="tpu"))
    after = _rows(param_tables(traffic, axes, backend="tpu", hidden_head=hidden_head, hidden_embed=hidden_embed))
    fs = ("fsdp",)
    once = "all-gather of params (embedding, head: once)"
    assert after.get(once, {}).get(fs, 0) == (before[once][fs] - hidden_head * head - hidden_embed * embed)
    assert after.get("reduce-scatter of grads (head, f32)", {}) == ({} if hidden_head else {fs: 2 * head})
    # The embedding's gradient leaves the storage group's sums; its shard is still summed over its replicas.
    scattered = before.get("reduce-scatter of grads", {}).get(fs, 0)
    assert after.get("reduce-scatter of grads", {}).get(fs, 0) == scattered - (
        embed if hidden_embed and not replicated else 0)
    if replicated and hidden_embed:
        assert "all-reduce of grads (input embedding, whole)" not in after
        summed = before.get("all-reduce of grads", {}).get(("dp",), 0)
        assert after.get("all-reduce of grads", {}).get(("dp",), 0) == summed + embed // 4
    # The layers' rows do not move.
    for what in ("all-gather of params (fwd + bwd)", "all-gather of params (attention, again in the bwd: XLA:TPU)"):
        assert after.get(what) == before.get(what)


@given(st.integers(1, 10**9), st.integers(1, 10**9), st.sampled_from(["cpu", "gpu"]), st.booleans())
def test_other_compilers_and_tied_tables_ignore_the_hidden_state_flags(embed: int, head: int, backend: str,
                                                                       tied: bool) -> None:
    import dataclasses

    traffic = _traffic(embed, head, 10**6, False)
    for b, t in ((backend, traffic), ("tpu", dataclasses.replace(traffic, tied=True))):
        if b == "tpu" and not tied:
            continue
        assert param_tables(t, ("dp", "fsdp"), backend=b, hidden_head=True, hidden_embed=True) == param_tables(
            t, ("dp", "fsdp"), backend=b)


@given(st.sampled_from([(1, 8), (2, 4), (4, 2), (8, 1)]), st.sampled_from([8, 16, 32, 64]),
       st.sampled_from([512, 2048]), st.booleans(), st.booleans())
def test_hidden_state_terms_move_the_gathered_batch_over_the_tables_axes(mesh: tuple[int, int], batch: int, seq: int,
                                                                         head: bool, embed: bool) -> None:
    dp, fsdp = mesh
    sizes = {"dp": dp, "fsdp": fsdp}
    model = MODEL_SPECS["llama3-8b"]
    p = AxisPlacement(("dp", "fsdp"), (dp, fsdp), (1, 1), parse_cluster("1x8xH100"))
    terms = hidden_state_terms(model, sizes, p, batch=batch, seq=seq, itemsize=2,
                               head_axes=("fsdp",) if head else (), embed_axes=("fsdp",) if embed else ())
    if fsdp == 1 or not (head or embed):
        assert terms == []
        return
    # The tokens of the fsdp group (this device's batch x fsdp), whole hidden dim.
    group_tokens = batch // (dp * fsdp) * seq * fsdp
    moved = {(t.kind, t.what.split(" (")[0]): t.nbytes * t.calls for t in terms}
    h = model.hidden_size
    assert sum(v for (k, _), v in moved.items() if k == "all-gather") == (
        head * 2 * group_tokens * h * 2 + embed * (group_tokens * 4 + group_tokens * h * 2))
    assert sum(v for (k, _), v in moved.items() if k == "reduce-scatter") == (
        head * group_tokens * h * 4 + embed * group_tokens * h * 2)
    assert all(t.axes == ("fsdp",) for t in terms)


@given(st.integers(1, 512), st.sampled_from([512, 2048, 4096]), st.integers(1, 8), st.sampled_from([8, 64, 256]),
       st.integers(128, 20000))
def test_the_dispatched_tokens_are_gathered_only_when_they_are_the_smaller_tensor(
        batch: int, seq: int, top_k: int, experts: int, width: int) -> None:
    gathered = gathers_tokens(batch=batch, seq=seq, top_k=top_k, experts=experts, width=width)
    capacity = max(1, math.ceil(top_k * seq * 1.25 / experts))
    # The two whole tensors (hidden cancels): experts x batch x capacity against experts x width.
    assert gathered == (experts * batch * capacity < experts * width)
    if gathered and batch > 1:  # a smaller batch never turns the choice back to the weights
        assert gathers_tokens(batch=batch - 1, seq=seq, top_k=top_k, experts=experts, width=width)


def _moe_traffic(experts: int, rest: int, narrow: bool) -> ParamTraffic:
    """A plan's traffic on fsdp whose routed experts move ``experts`` bytes (their gradients summed whole over
    fsdp when ``narrow``), the other layers ``rest``."""
    fs = ("fsdp",)
    return ParamTraffic(gather=((fs, experts + rest),), scatter=((fs, experts + rest),), reduce=(),
                        experts=((fs, experts, experts),),
                        grad_whole=((fs, (), experts, 0),) if narrow else ())


@given(st.integers(1, 10**9), st.integers(0, 10**9), st.booleans(), st.sampled_from(["none", "dots", "full", "offload"]),
       st.sampled_from(["cpu", "gpu", "tpu"]))
def test_gathered_tokens_take_exactly_the_experts_gathers_and_sums_out(experts: int, rest: int, narrow: bool,
                                                                      remat: str, backend: str) -> None:
    traffic = _moe_traffic(experts, rest, narrow)
    before = _rows(param_tables(traffic, ("fsdp",), backend=backend, remat=remat))
    after = _rows(param_tables(traffic, ("fsdp",), backend=backend, remat=remat, tokens_experts=True))
    if backend != "tpu" or remat not in TOKEN_REMATS:  # read on XLA:TPU under these policies only
        assert after == before
        return
    fs = ("fsdp",)
    gathered = sum(t.get(fs, 0) for what, t in after.items() if what.startswith("all-gather of params (fwd + bwd"))
    assert gathered == rest
    assert after.get("reduce-scatter of grads", {}).get(fs, 0) == rest
    assert "all-reduce of grads (narrow last-dim splits, whole: XLA:TPU)" not in after


@given(st.sampled_from([(1, 8), (2, 4), (8, 1)]), st.sampled_from([8, 16, 32]), st.integers(1, 4))
def test_expert_token_terms_move_the_groups_dispatched_buffer(mesh: tuple[int, int], batch: int, layers: int) -> None:
    import dataclasses

    dp, fsdp = mesh
    sizes = {"dp": dp, "fsdp": fsdp}
    model = dataclasses.replace(MODEL_SPECS["mixtral-8x7b"], num_layers=layers, num_params=None)
    p = AxisPlacement(("dp", "fsdp"), (dp, fsdp), (1, 1), parse_cluster("1x8xH100"))
    terms = expert_token_terms(model, sizes, p, batch=batch, seq=2048, itemsize=2, axes=("fsdp",))
    if fsdp == 1:
        assert terms == []
        return
    capacity = math.ceil(2 * 2048 * 1.25 / 8)
    group_rows = batch // (dp * fsdp) * fsdp
    buffer = group_rows * 8 * capacity * model.hidden_size * 2
    assert [(t.kind, t.nbytes, t.calls) for t in terms] == [("all-gather", buffer, 6 * layers - 3),
                                                   ("reduce-scatter", buffer, 3 * layers)]
    none = expert_token_terms(model, sizes, p, batch=batch, seq=2048, itemsize=2, axes=("fsdp",), remat="none")
    assert [(t.kind, t.nbytes, t.calls) for t in none] == [("all-gather", buffer, 5 * layers - 1),
                                                  ("all-reduce", buffer, layers), ("reduce-scatter", buffer, layers)]
    assert expert_token_terms(model, sizes, p, batch=batch, seq=2048, itemsize=2, axes=("fsdp",), remat="dots") == []
    dense = dataclasses.replace(MODEL_SPECS["llama3-8b"], num_layers=layers, num_params=None)
    assert expert_token_terms(dense, sizes, p, batch=batch, seq=2048, itemsize=2, axes=("fsdp",)) == []


@given(st.integers(1, 10**9), st.integers(1, 10**9), st.integers(0, 10**10), st.sampled_from(["cpu", "gpu", "tpu"]))
def test_an_embedding_looked_up_on_its_shard_is_not_gathered_and_still_summed(embed: int, head: int, layers: int,
                                                                           backend: str) -> None:
    traffic = _traffic(embed, head, layers, False)
    before = _rows(param_tables(traffic, ("dp", "fsdp"), backend=backend))
    after = _rows(param_tables(traffic, ("dp", "fsdp"), backend=backend, embed_on_shard=True))
    if backend != "tpu":  # read on XLA:TPU only
        assert after == before
        return
    once = "all-gather of params (embedding, head: once)"
    assert after[once][("fsdp",)] == before[once][("fsdp",)] - embed
    assert {w: t for w, t in after.items() if w != once} == {w: t for w, t in before.items() if w != once}
