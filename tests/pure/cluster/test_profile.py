"""MachineProfile: plain data that round-trips, and a reader that refuses a bad file by file and field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import ClusterError, MeshplanTypeError, ProfileError
from meshplan.pure.cluster import (
    DEVICE_SPECS,
    PROFILE_FORMAT,
    CollectiveTiming,
    MachineProfile,
    MatmulTiming,
    MemoryTiming,
    StepTiming,
    check_profile_device,
    cpu_device,
    link_grid,
    machine_cluster,
    measure_document,
    rank_measured,
    read_measure,
)
from meshplan.pure.mesh import DeviceInfo

_SECONDS = st.floats(1e-7, 10.0, allow_nan=False)
_STAMP = st.builds(lambda d, h: f"2026-{d:02d}-01T{h:02d}:00:00Z", st.integers(1, 12), st.integers(0, 23))

matmuls = st.builds(MatmulTiming, st.sampled_from(["sweep up", "q", "head"]), st.integers(1, 8192),
                    st.sampled_from([1, 2, 4]), st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096),
                    st.sampled_from(["bfloat16", "float8_e4m3fn"]), _SECONDS)
intra = st.builds(CollectiveTiming, st.just("intra"),
                  st.sampled_from(["all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute"]),
                  st.integers(2, 8), st.integers(1, 2**30), _SECONDS)
memories = st.builds(MemoryTiming, st.integers(1, 2**32), _SECONDS)


@st.composite
def steps(draw: st.DrawFn) -> StepTiming:
    ran = draw(st.booleans())
    median = draw(_SECONDS)
    return StepTiming("tiny", 64, draw(st.sampled_from(["dp=8", "fsdp=8", "dp=2,tp=4"])), 8, 32,
                      draw(st.integers(1, 9)) if ran else 0, median if ran else None, median * 0.9 if ran else None,
                      median * 1.1 if ran else None, draw(st.none() | st.integers(0, 2**40)), "note",
                      draw(st.none() | _SECONDS), draw(st.none() | _SECONDS), draw(st.none() | _SECONDS),
                      draw(st.none() | st.floats(0.01, 1.0)), draw(st.none() | st.integers(0, 2**40)),
                      draw(st.none() | st.integers(0, 2**40)), error="" if ran else "out of memory",
                      predicted_rank=draw(st.none() | st.integers(1, 9)))


profiles = st.builds(
    MachineProfile, st.sampled_from(["cpu", "NVIDIA H100 80GB HBM3"]), st.just("cpu"), st.just(8), st.just(1),
    st.lists(st.tuples(st.sampled_from(["jax", "jaxlib", "python"]), st.text(max_size=8)), unique_by=lambda p: p[0]
             ).map(tuple), _STAMP, matmuls=st.lists(matmuls, max_size=4).map(tuple),
    collectives=st.lists(intra, max_size=4).map(tuple), memory=st.lists(memories, max_size=2).map(tuple),
    steps=st.lists(steps(), max_size=3).map(tuple))


@given(profiles)
def test_a_profile_round_trips_through_json_with_its_id(p: MachineProfile) -> None:
    back = MachineProfile.from_json(p.to_json())
    assert back == p and back.id == p.id
    assert json.loads(p.to_json())["id"] == p.id


@given(profiles, st.lists(steps(), min_size=1, max_size=2).map(tuple))
def test_the_id_covers_the_timings_and_not_the_measured_steps(p: MachineProfile, more: tuple) -> None:
    import dataclasses

    assert dataclasses.replace(p, steps=more).id == p.id
    bumped = dataclasses.replace(p, memory=(*p.memory, MemoryTiming(123, 1.0)))
    assert bumped.id != p.id


def _doc() -> dict:
    p = MachineProfile("cpu", "cpu", 8, 1, (("jax", "0.10.2"),), "2026-01-02T03:04:05Z",
                       memory=(MemoryTiming(2**20, 1e-4),),
                       collectives=(CollectiveTiming("intra", "all-reduce", 8, 2**20, 1e-4),))
    return json.loads(p.to_json())


def test_another_format_version_is_refused_naming_both_versions() -> None:
    doc = _doc() | {"format": PROFILE_FORMAT + 1}
    with pytest.raises(ProfileError, match=rf"prof\.json: field format: this file is format {PROFILE_FORMAT + 1}; "
                                           rf"this meshplan reads format {PROFILE_FORMAT}"):
        MachineProfile.from_json(json.dumps(doc), source="prof.json")


@pytest.mark.parametrize("cut", [1, 10, 100, -2])
def test_a_truncated_file_is_a_profile_error_naming_the_file_and_where(cut: int) -> None:
    text = json.dumps(_doc())[:cut]
    with pytest.raises(ProfileError, match=r"^p\.json: not a complete JSON document"):
        MachineProfile.from_json(text, source="p.json")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["collectives"][0].update(seconds=-1.0), "collectives[0]"),
    (lambda d: d["collectives"][0].update(kind="all-sum"), "collectives[0]"),
    (lambda d: d["memory"][0].pop("nbytes"), "memory[0]"),
    (lambda d: d.update(matmuls="lots"), "matmuls"),
    (lambda d: d.update(versions=[["jax"]]), "versions"),
    (lambda d: d.update(surprise=1), "unknown keys ['surprise']"),
    (lambda d: d.pop("device_kind"), "missing keys ['device_kind']"),
    (lambda d: d.update(measured_at="yesterday"), "measured_at"),
    (lambda d: d.update(device_count=0), "device_count"),
])
def test_a_bad_field_is_a_profile_error_naming_the_file_and_the_field(edit, field: str) -> None:
    doc = _doc()
    doc.pop("id")  # a hand edit that keeps the id is refused for the id (below), not for the field
    edit(doc)
    with pytest.raises(ProfileError) as err:
        MachineProfile.from_json(json.dumps(doc), source="edited.json")
    assert str(err.value).startswith("edited.json: ") and field in str(err.value)


def test_a_file_edited_after_measuring_is_refused_for_its_id() -> None:
    doc = _doc()
    doc["memory"][0]["seconds"] = 1.0
    with pytest.raises(ProfileError, match=r"field id: .* does not match the timings"):
        MachineProfile.from_dict(doc)
    del doc["id"]
    assert MachineProfile.from_dict(doc).memory[0].seconds == 1.0


def test_a_profile_for_another_device_kind_is_refused_naming_both() -> None:
    h100 = MachineProfile("NVIDIA H100 80GB HBM3", "gpu", 8, 1, (), "2026-01-02T03:04:05Z")
    check_profile_device(h100, DEVICE_SPECS["H100"])
    with pytest.raises(ProfileError, match=r"measured on 'NVIDIA H100 80GB HBM3' .*not on the cluster's device H200"):
        check_profile_device(h100, DEVICE_SPECS["H200"])
    with pytest.raises(ProfileError, match="XLA:CPU"):
        check_profile_device(h100, cpu_device(8))


def test_inter_host_timings_need_several_processes() -> None:
    with pytest.raises(ProfileError, match="process_count >= 2"):
        MachineProfile("cpu", "cpu", 8, 1, (), "2026-01-02T03:04:05Z",
                       collectives=(CollectiveTiming("inter", "all-reduce", 2, 2**20, 1e-3),))


def test_records_refuse_wrong_types_with_typed_errors() -> None:
    with pytest.raises(MeshplanTypeError):
        MatmulTiming("x", "64", 1, 1, 1, 1, "bfloat16", 1.0)
    with pytest.raises(ProfileError):
        CollectiveTiming("intra", "all-reduce", 1, 10, 1.0)  # a group of one moves nothing
    with pytest.raises(ProfileError, match="measured step or an error"):
        StepTiming("m", 64, "dp=8", 8, 32, 0, None, None, None, None, "", None, None, None, None, None, None)


@pytest.mark.parametrize("kind, platform, n, procs, name, text", [
    ("NVIDIA H100 80GB HBM3", "gpu", 8, 1, "H100", "1x8xH100"),
    ("NVIDIA H200", "gpu", 16, 2, "H200", "2x8xH200"),
    ("NVIDIA A100-SXM4-80GB", "gpu", 8, 1, "A100-80GB", "1x8xA100-80GB"),
    ("TPU v5 lite", "tpu", 8, 1, "v5e", "v5e-8"),
    ("TPU v4", "tpu", 8, 2, "v4", "v4-16"),
    ("cpu", "cpu", 8, 1, "XLA:CPU", "1x8xXLA:CPU"),
    ("cpu", "cpu", 8, 2, "XLA:CPU", "2x4xXLA:CPU"),
])
def test_live_device_facts_map_to_the_catalogue_cluster(kind, platform, n, procs, name, text) -> None:
    c = machine_cluster(kind, platform, n, process_count=procs)
    assert (c.device.name, c.text, c.num_devices) == (name, text, n)


def test_an_unknown_accelerator_kind_is_refused_naming_the_catalogue() -> None:
    with pytest.raises(ClusterError, match=r"'Intel Gaudi 3' \(gpu\) is no catalogue device"):
        machine_cluster("Intel Gaudi 3", "gpu", 8)
    assert machine_cluster("AMD Instinct MI300X", "gpu", 8).device.name == "MI300X"  # the catalogue grew it
    with pytest.raises(ClusterError, match="does not split evenly"):
        machine_cluster("cpu", "cpu", 8, process_count=3)


@given(st.integers(1, 64), st.integers(1, 8))
def test_a_cpu_device_shares_the_host_memory_and_has_no_peak(per_node: int, procs: int) -> None:
    c = machine_cluster("cpu", "cpu", per_node * procs, process_count=procs, host_memory_bytes=2**34)
    assert c.device.hbm_bytes == 2**34 // per_node and c.device.peak_bf16_flops is None
    assert (c.num_nodes, c.devices_per_node) == (procs, per_node)


@given(st.integers(1, 4), st.integers(1, 8), st.randoms())
def test_the_link_grid_puts_one_host_per_row_whatever_the_order(hosts: int, per: int, rnd) -> None:
    infos = [DeviceInfo(i, process_index=i // per) for i in range(hosts * per)]
    rnd.shuffle(infos)
    grid = link_grid(infos)
    assert grid == tuple(tuple(range(h * per, (h + 1) * per)) for h in range(hosts))


def test_the_link_grid_refuses_unequal_hosts() -> None:
    with pytest.raises(ClusterError, match="different device counts"):
        link_grid([DeviceInfo(0), DeviceInfo(1), DeviceInfo(2, process_index=1)])


@given(st.lists(steps(), max_size=6))
def test_measured_rows_rank_by_their_medians_then_the_failed_and_round_trip(rows: list) -> None:
    ranked = rank_measured(rows)
    medians = [r.measured_step_s for r in ranked if r.measured_step_s is not None]
    assert medians == sorted(medians)
    assert all(r.measured_step_s is None for r in ranked[len(medians):])
    doc = measure_document(rows, machine="1x8xXLA:CPU", device_kind="cpu", platform="cpu")
    assert read_measure(json.dumps(doc)) == ranked


def test_a_bad_measure_document_names_the_file_and_the_row() -> None:
    doc = measure_document([], machine="m", device_kind="cpu", platform="cpu")
    doc["rows"] = [{"mesh": "dp=8"}]
    with pytest.raises(ProfileError, match=r"^m\.json: field rows\[0\]: StepTiming: unknown keys"):
        read_measure(json.dumps(doc), source="m.json")
    with pytest.raises(ProfileError, match="is not a 'meshplan measure' document"):
        read_measure(json.dumps(doc | {"format": 9}), source="m.json")
