"""Gradient accumulation in the search: the chosen micro-batch count per mesh, and how it is priced."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from meshplan.pure import PlanError, search_meshes
from meshplan.pure.cost import TrainingRecipe
from meshplan.pure.search import SearchResult
from meshplan.pure.search._space import divisors
from meshplan.pure.cost._placement import Pending, price
from meshplan.pure.cost._step_time import accumulate, overlap_class
from meshplan.pure.cluster._cluster import parse_cluster
from tests.profiles import examples

BATCH_AXES = ("dp", "fsdp", "ep")

# Tight enough that some meshes need accumulation, small enough to search in ~0.1 s.
CASES = st.tuples(st.sampled_from(("llama3-8b", "llama3-70b")), st.sampled_from(("8xH100", "2x8xH100")),
                  st.sampled_from((16, 32, 64, 128)), st.sampled_from((2048, 4096)))


def _search(model, cluster, batch, seq, **kw):
    try:
        return search_meshes(model, cluster, batch=batch, seq=seq, top_k=4, **kw)
    except PlanError:
        return None


def _per_replica(cand, batch):
    ways = 1
    for name, size in zip(cand.axis_names, cand.axis_sizes):
        ways *= size if name in BATCH_AXES else 1
    return batch // ways


@settings(max_examples=examples(6), deadline=None)
@given(CASES)
@example(("llama3-8b", "2x8xH100", 128, 4096))  # fsdp=16 at 1, dp=4,fsdp=4 at 2 micro-batches
@example(("llama3-70b", "8x8xH100", 256, 4096))  # every fitting mesh accumulates
def test_chosen_count_is_the_fewest_that_fits(case):
    model, cluster, batch, seq = case
    result = _search(model, cluster, batch, seq)
    if result is None:
        return
    for cand in result.candidates:
        m = cand.step.micro_batches
        per_replica = _per_replica(cand, batch)
        assert per_replica % m == 0
        fixed = dict(zip(cand.axis_names, cand.axis_sizes))
        # The same mesh with the chosen count fixed: the same memory.
        again = search_meshes(model, cluster, batch=batch, seq=seq, axes=cand.axis_names, fixed=fixed,
                              micro_batches=m)
        assert again.best.memory.total == cand.memory.total
        # Every smaller dividing count does not fit.
        for fewer in (d for d in divisors(per_replica) if d < m):
            with pytest.raises(PlanError):
                search_meshes(model, cluster, batch=batch, seq=seq, axes=cand.axis_names, fixed=fixed,
                              micro_batches=fewer)


@settings(max_examples=examples(4), deadline=None)
@given(CASES, st.sampled_from((1, 2, 4)))
def test_fixed_count_is_respected(case, m):
    model, cluster, batch, seq = case
    result = _search(model, cluster, batch, seq, micro_batches=m)
    if result is None:
        return
    assert not result.request.choose_micro_batches and result.request.recipe.micro_batches == m
    for cand in result.candidates:
        assert cand.step.micro_batches == m
        assert _per_replica(cand, batch) % m == 0


def test_llama70b_needs_accumulation_and_round_trips():
    result = search_meshes("llama3-70b", "8x8xH100", batch=256, seq=4096)
    counts = [c.step.micro_batches for c in result.candidates]
    # At one micro-batch (per-replica batch 4 on fsdp=64) no mesh fits; with accumulation some do.
    assert min(counts) > 1
    with pytest.raises(PlanError):
        search_meshes("llama3-70b", "8x8xH100", batch=256, seq=4096, micro_batches=1)
    assert "micro-batches" in result.best.verdict
    back = SearchResult.from_json(result.to_json())
    assert back == result
    assert search_meshes("llama3-70b", "8x8xH100", batch=256, seq=4096).to_json() == result.to_json()


@pytest.mark.parametrize("bad", [0, -2, 2.5, "2"])
def test_bad_micro_batches(bad):
    with pytest.raises((PlanError, TypeError)):
        search_meshes("llama3-8b", "8xH100", batch=16, micro_batches=bad)


WHATS = (("fsdp all-gather of params (fwd + bwd)", "all-gather", ("fsdp",)),
         ("fsdp reduce-scatter of grads", "reduce-scatter", ("fsdp",)),
         ("dp all-reduce of grads", "all-reduce", ("dp",)), ("tp all-reduce of activations", "all-reduce", ("tp",)),
         ("ep all-to-all of tokens", "all-to-all", ("ep",)))


@given(st.lists(st.tuples(st.sampled_from(WHATS), st.integers(1, 1 << 30), st.integers(1, 200)), max_size=5),
       st.integers(1, 64))
def test_accumulate_keeps_activation_bytes_and_repeats_calls(rows, m):
    pending = [Pending(w, k, a, nbytes, calls, 8, 1) for (w, k, a), nbytes, calls in rows]
    out = accumulate(pending, m)
    assert accumulate(pending, 1) == pending
    for before, after in zip(pending, out, strict=True):
        where = overlap_class(before.what, before.kind)
        if where == "critical":  # m calls of 1/m the bytes: the same bytes moved
            assert after.calls == before.calls * m
            assert after.nbytes * after.calls == pytest.approx(before.nbytes * before.calls)
        else:  # weights gathered and gradients synced again in every micro-batch (as XLA emits them)
            assert after.nbytes == before.nbytes and after.calls == before.calls * m
    # More micro-batches never make the communication cheaper (latency per call, gathers repeated).
    cluster = parse_cluster("2x8xH100")
    assert price(out, cluster).sum() >= price(pending, cluster).sum() * (1 - 1e-9)


@given(st.lists(st.tuples(st.sampled_from(WHATS), st.integers(1, 1 << 30), st.integers(1, 200)), max_size=5),
       st.integers(1, 64))
def test_xla_gpu_all_reduces_the_accumulated_gradients_once(rows, m):
    # XLA:GPU (1x8xH200 compiled ahead of time) all-reduces the gradients once, after the micro-batch loop;
    # its gathers, reduce-scatters and activation collectives are XLA:TPU's.
    pending = [Pending(w, k, a, nbytes, calls, 8, 1) for (w, k, a), nbytes, calls in rows]
    gpu, tpu = accumulate(pending, m, backend="gpu"), accumulate(pending, m, backend="tpu")
    for before, g, t in zip(pending, gpu, tpu, strict=True):
        if before.kind == "all-reduce" and overlap_class(before.what, before.kind) == "grads":
            assert g == before
        else:
            assert g == t
    assert accumulate(pending, m, backend="cpu") == tpu  # XLA:CPU's hoisting is xla_collectives' to say
    with pytest.raises(PlanError, match="backend"):
        accumulate(pending, m, backend="rocm")


def test_a_gpu_search_with_accumulation_prices_the_gradient_all_reduce_once():
    one, four = (search_meshes("llama3-8b", "2x8xH100", axes=("dp", "fsdp"), fixed={"dp": 2, "fsdp": 8},
                               batch=64, seq=2048, recipe=TrainingRecipe(backend="gpu", micro_batches=m)).best
                 for m in (1, 4))
    dp_sync = [[t for t in c.comm if t.what.startswith("dp all-reduce of grads")] for c in (one, four)]
    assert dp_sync[0] and [(t.nbytes, t.calls) for t in dp_sync[0]] == [(t.nbytes, t.calls) for t in dp_sync[1]]
