"""Properties of the overlap model (meshplan.pure.cost._step_time) and the search's ranking by it."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import search_meshes
from meshplan.pure.cost._flops import StepFlops
from meshplan.pure.cost._step_time import overlap_class, step_time

WHATS = (("fsdp all-gather of params (fwd + bwd)", "all-gather"), ("fsdp reduce-scatter of grads", "reduce-scatter"),
         ("dp all-reduce of grads", "all-reduce"), ("tp all-reduce of activations", "all-reduce"),
         ("ep all-to-all of tokens", "all-to-all"), ("sp all-gather of K,V (fwd)", "all-gather"))
seconds = st.floats(0, 10, allow_nan=False)


@st.composite
def inputs(draw):
    fwd, bwd = draw(st.floats(1e9, 1e15)), draw(st.floats(1e9, 3e15))
    layers = draw(st.integers(1, 96))
    head = draw(st.floats(0, 1e14))
    flops = StepFlops(draw(st.floats(1e9, 1e18)), 0.0, 0.0, (fwd + bwd) * layers + head, fwd, bwd, head)
    terms = [(w, k, draw(seconds)) for w, k in draw(st.lists(st.sampled_from(WHATS), max_size=6, unique=True))]
    return flops, terms, layers


@given(inputs(), st.floats(0.05, 1.0), st.sampled_from((None, 1e15)))
def test_exposed_is_bounded(case, efficiency, peak):
    flops, terms, layers = case
    t = step_time(flops, terms, layers=layers, tokens=1 << 20, devices=8, peak_flops=peak, efficiency=efficiency)
    for (what, kind, s), e in zip(terms, t.terms, strict=True):
        assert e.what == what
        assert 0 <= e.exposed <= s * (1 + 1e-12)
        assert e.hidden + e.exposed == pytest.approx(s)
        if overlap_class(what, kind) == "critical" or peak is None:
            assert e.exposed == pytest.approx(s)  # on the critical path, or no compute to hide under
    total = sum(s for *_, s in terms)
    assert t.compute_s <= t.step_s <= t.compute_s + total + 1e-9
    assert t.step_s == pytest.approx(t.compute_s + t.exposed_s)
    assert 0 <= t.mfu


@given(inputs(), st.floats(0.05, 0.5))
def test_slower_compute_hides_more(case, efficiency):
    flops, terms, layers = case
    kw = dict(layers=layers, tokens=1 << 20, devices=8, peak_flops=1e15)
    fast = step_time(flops, terms, efficiency=2 * efficiency, **kw)
    slow = step_time(flops, terms, efficiency=efficiency, **kw)
    assert slow.exposed_s <= fast.exposed_s + 1e-12
    assert slow.compute_s == pytest.approx(2 * fast.compute_s)


def test_fsdp8_leads_llama3_8b_on_one_node():
    """The issue's case: practitioners train Llama-3-8B on one 8-GPU node with fsdp=8."""
    by_time = search_meshes("llama3-8b", "1x8xH100", batch=8, seq=4096, top_k=3)
    by_comm = search_meshes("llama3-8b", "1x8xH100", batch=8, seq=4096, top_k=10, rank="comm")
    top = [c.text for c in by_time.candidates]
    # dp=4,fsdp=2 and dp=2,fsdp=4 fit too since the update phase prices the largest leaf (not 0.74 x the
    # state); all three are predicted within 0.03% of each other.
    assert "fsdp=8" in top[:3]
    assert "fsdp=8" not in [c.text for c in by_comm.candidates][:3]  # communication alone ranked it low
    best = by_time.best
    assert best.step is not None and best.step.step_s >= best.step.compute_s > 0
    assert 0 < best.step.mfu < best.step.efficiency
    steps = [c.step.step_s for c in by_time.candidates]
    assert steps == sorted(steps)


def test_plan_json_round_trip_keeps_step_times():
    r = search_meshes("gpt2", "8xH100", batch=64, seq=1024, top_k=2)
    again = type(r).from_json(r.to_json())
    assert again == r
    assert again.best.step == r.best.step and again.best.comm[0].exposed is not None


def test_a_device_without_a_peak_prices_no_compute_and_claims_no_mfu():
    # The demo's simulated CPU has no peak FLOP/s: the verdict must not print "compute 0 s, MFU 0%".
    from meshplan.pure.search import Cluster, DeviceSpec

    device = DeviceSpec("no-peak", hbm_bytes=80 * 2**30, intra_bandwidth=100e9, inter_bandwidth=10e9,
                        intra_latency_s=5e-6, inter_latency_s=2e-5, devices_per_node=8)
    result = search_meshes("gpt2", Cluster(device, num_nodes=1, devices_per_node=8), batch=8, seq=256)
    best = result.best
    assert best.step is not None and best.step.compute_s == 0.0
    assert "compute not priced" in best.verdict and "MFU" not in best.verdict
    with_peak = search_meshes("gpt2", "1x8xH100", batch=8, seq=256).best
    assert "MFU" in with_peak.verdict and "not priced" not in with_peak.verdict
