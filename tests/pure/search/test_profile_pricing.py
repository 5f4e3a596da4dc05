"""Plans priced by a machine profile: they differ from the catalogue's exactly where the profile's figures do."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import ProfileError
from meshplan.pure import SearchResult, get_preset, parse_cluster, search_meshes
from meshplan.pure.cluster import DEVICE_SPECS, CollectiveTiming, MachineProfile, MatmulTiming, MemoryTiming, StepTiming
from meshplan.pure.cost import profile_figures, profiled_cluster, refine_profile, ring_terms
from meshplan.pure.report._summary import header_facts

TINY = dataclasses.replace(get_preset("llama3-8b").spec, name="tiny", num_layers=2, hidden_size=256, num_heads=4,
                           num_kv_heads=2, head_dim=64, intermediate_size=512, vocab_size=1024, num_params=None)
H100 = "NVIDIA H100 80GB HBM3"
_KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all")


def _links(link: str, bw: float, lat: float, n: int) -> tuple[CollectiveTiming, ...]:
    out = []
    for kind in _KINDS:
        a, b = ring_terms(kind, n)
        out += [CollectiveTiming(link, kind, n, s, a * lat + b * s / bw) for s in (2**16, 2**22, 2**26)]
    return tuple(out)


def _profile(*, intra: tuple[float, float] | None = None, inter: tuple[float, float] | None = None,
             efficiency: float | None = None, hbm: float | None = None) -> MachineProfile:
    peak = DEVICE_SPECS["H100"].peak_bf16_flops
    rows: tuple[CollectiveTiming, ...] = ()
    if intra:
        rows += _links("intra", *intra, 8)
    if inter:
        rows += _links("inter", *inter, 2)
    matmuls = () if efficiency is None else tuple(
        MatmulTiming("sweep up", h, 1, 8192, h, 4 * h, "bfloat16", 2 * 8192 * h * 4 * h / (peak * efficiency))
        for h in (256, 1024))
    memory = () if hbm is None else (MemoryTiming(2**30, 2 * 2**30 / hbm),)
    return MachineProfile(H100, "gpu", 16, 2, (("jax", "0.10.2"),), "2026-03-04T05:06:07Z", matmuls=matmuls,
                          collectives=rows, memory=memory)


def _same_but_the_record(priced: SearchResult, by_hand: SearchResult) -> bool:
    return (priced.candidates == by_hand.candidates and priced.rejected == by_hand.rejected
            and priced.rejections == by_hand.rejections
            and dataclasses.replace(priced.request, profile=None) == by_hand.request)


_LINK = st.tuples(st.floats(1e9, 1e12), st.floats(0, 1e-4))


@settings(max_examples=12)
@given(st.none() | _LINK, st.none() | _LINK, st.none() | st.floats(0.05, 0.95), st.none() | st.floats(1e11, 5e12))
def test_a_plan_priced_by_a_profile_is_the_plan_of_a_cluster_with_its_figures(intra, inter, eff, hbm) -> None:
    p = _profile(intra=intra, inter=inter, efficiency=eff, hbm=hbm)
    cluster = parse_cluster("2x8xH100")
    priced = search_meshes(TINY, cluster, batch=16, seq=256, top_k=50, profile=p)
    figures = profile_figures(p, peak_bf16_flops=cluster.device.peak_bf16_flops)
    changes = {}
    for name, fit in (("intra", figures.intra), ("inter", figures.inter)):
        if fit is not None:
            changes |= {f"{name}_bandwidth": fit.bandwidth, f"{name}_latency_s": fit.latency}
    if figures.hbm_bandwidth is not None:
        changes["hbm_bandwidth"] = figures.hbm_bandwidth
    by_hand = search_meshes(TINY, dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, **changes)),
                            batch=16, seq=256, top_k=50, efficiency=figures.efficiency_at(TINY.hidden_size))
    assert _same_but_the_record(priced, by_hand)
    assert priced.request.profile is not None and priced.request.profile.profile_id == p.id


def _terms(result: SearchResult) -> dict[tuple[str, str], tuple[str, float]]:
    return {(c.text, t.what): (t.link, t.seconds) for c in result.candidates for t in c.comm}


@settings(max_examples=8)
@given(st.floats(2e10, 2e11), st.booleans())
def test_only_the_collectives_on_the_profiled_link_and_nothing_else_change(bandwidth: float, intra: bool) -> None:
    link = (bandwidth, 3e-6)
    p = _profile(intra=link if intra else None, inter=None if intra else link)
    catalogue = search_meshes(TINY, "2x8xH100", batch=16, seq=256, top_k=50)
    priced = search_meshes(TINY, "2x8xH100", batch=16, seq=256, top_k=50, profile=p)
    before, after = _terms(catalogue), _terms(priced)
    assert before.keys() == after.keys()
    changed = {k for k in before if before[k][1] != after[k][1]}
    touched = "intra" if intra else "inter"
    assert changed  # the profile's link is slower than the catalogue's: something moved
    for key in before:
        link_name, seconds = before[key]
        if seconds > 0 and touched not in link_name:
            assert key not in changed, key  # a collective off the profiled link is priced as before
    by_mesh = {c.text: c for c in catalogue.candidates}
    for c in priced.candidates:  # no matmul timing: the compute and the memory are the catalogue's
        assert c.step.compute_s == by_mesh[c.text].step.compute_s and c.memory == by_mesh[c.text].memory


def test_a_profile_with_the_catalogues_own_figures_changes_nothing_but_the_record() -> None:
    h100 = DEVICE_SPECS["H100"]
    p = _profile(intra=(h100.intra_bandwidth, h100.intra_latency_s), inter=(h100.inter_bandwidth, h100.inter_latency_s))
    catalogue = search_meshes(TINY, "2x8xH100", batch=16, seq=256, top_k=50)
    priced = search_meshes(TINY, "2x8xH100", batch=16, seq=256, top_k=50, profile=p)
    assert [c.text for c in priced.candidates] == [c.text for c in catalogue.candidates]
    for a, b in zip(priced.candidates, catalogue.candidates, strict=True):
        assert a.step.step_s == pytest.approx(b.step.step_s, rel=1e-9)


def test_64_nodes_priced_from_one_nodes_profile_keep_the_catalogues_network_and_say_so() -> None:
    one_node = dataclasses.replace(_profile(intra=(2e11, 5e-6), efficiency=0.6), device_count=8, process_count=1)
    result = search_meshes(TINY, "64x8xH100", batch=512, seq=256, top_k=3, profile=one_node)
    device = result.request.cluster.device
    assert device.inter_bandwidth == DEVICE_SPECS["H100"].inter_bandwidth
    assert device.intra_bandwidth == pytest.approx(2e11)
    facts = dict(header_facts(result))
    assert facts["profile"].startswith(f"{one_node.id} (8 x {H100}, measured 2026-03-04T05:06:07Z)")
    assert "inter link: the catalogue's (the profile measured no link between hosts)" in facts["profile"]
    assert "matmul efficiency 0.6" in facts["profile"] and "at 60% of peak bf16" in facts["time"]
    assert SearchResult.from_json(result.to_json()) == result  # the record travels with the plan


def test_an_efficiency_given_wins_over_the_profiles_and_is_said_so() -> None:
    p = _profile(efficiency=0.6)
    result = search_meshes(TINY, "2x8xH100", batch=16, seq=256, top_k=2, profile=p, efficiency=0.3)
    assert result.best.step.efficiency == 0.3
    assert "matmul efficiency: the 0.3 given (the profile's 0.6" in result.request.profile.text


def test_a_profile_of_another_device_kind_is_refused_by_the_search() -> None:
    with pytest.raises(ProfileError, match="not on the cluster's device H200"):
        search_meshes(TINY, "2x8xH200", batch=16, seq=256, profile=_profile(intra=(2e11, 5e-6)))


def test_measured_steps_refine_the_efficiency_the_next_plan_prices() -> None:
    p = _profile(efficiency=0.8)
    cluster, eff, _ = profiled_cluster(parse_cluster("2x8xH100"), p, hidden=TINY.hidden_size)
    row = StepTiming("tiny", TINY.hidden_size, "fsdp=16", 16, 256, 3, 2.0, 1.9, 2.1, None, "", 1.0, 1.0, 0.0, eff,
                     10, None, profile_id=p.id)
    refined = refine_profile(p, [row])
    _, refit, used = profiled_cluster(parse_cluster("2x8xH100"), refined, hidden=TINY.hidden_size)
    assert refit == pytest.approx(eff / 2, rel=1e-3)  # twice as slow as the matmuls alone: half the efficiency
    assert "fitted to 1 measured steps" in used.text
    with pytest.raises(ProfileError, match="priced by the catalogue's figures"):
        refine_profile(p, [dataclasses.replace(row, profile_id="")])


def test_link_timings_that_cannot_be_fitted_keep_the_catalogues_link_and_say_why() -> None:
    flat = tuple(CollectiveTiming("intra", "all-reduce", 8, s, 1e-3) for s in (2**12, 2**16))  # no growth
    p = dataclasses.replace(_profile(inter=(1e10, 1e-5), efficiency=0.5), collectives=flat + _links("inter", 1e10, 1e-5, 2))
    result = search_meshes(TINY, "2x8xH100", batch=16, seq=256, top_k=2, profile=p)
    device = result.request.cluster.device
    assert device.intra_bandwidth == DEVICE_SPECS["H100"].intra_bandwidth and device.inter_bandwidth == pytest.approx(1e10)
    assert ("intra link: the catalogue's (the profile's timings could not be fitted: the intra link's timings do not "
            "grow with the bytes moved") in result.request.profile.text
