"""Tests for device and cluster descriptions (meshplan.pure.cluster._devices, _cluster)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.cluster._cluster import Cluster, parse_cluster
from meshplan.pure.cluster._link import Link
from meshplan.pure.cluster._devices import DEVICE_SPECS, DeviceSpec
from meshplan.pure.errors import ClusterError, MeshplanTypeError

GB, GIB = 10**9, 2**30
GPUS = ("H100", "H200", "H800", "H20", "A100-80GB", "B200", "MI300X", "MI325X")  # NVLink / fabric ends at the node
RACKS = ("GB200",)  # NVLink joins a rack of hosts
TPUS = ("v4", "v5e", "v5p", "v6e", "tpu7x")


def _custom(**overrides: object) -> DeviceSpec:
    fields = dict(name="X", hbm_bytes=24 * GB, intra_bandwidth=100e9, inter_bandwidth=10e9,
                  intra_latency_s=1e-6, inter_latency_s=1e-5)
    fields.update(overrides)
    return DeviceSpec(**fields)  # type: ignore[arg-type]


# --- the device table ----------------------------------------------------------------------------


def test_device_table_has_the_published_hbm_sizes() -> None:
    assert DEVICE_SPECS["H100"].hbm_bytes == 80 * GB
    assert DEVICE_SPECS["H200"].hbm_bytes == 141 * GB
    assert DEVICE_SPECS["A100-80GB"].hbm_bytes == 80 * GB
    assert DEVICE_SPECS["B200"].hbm_bytes == 1440 * GB // 8  # DGX B200: 1,440 GB over 8 GPUs
    # TPUs: what libtpu lets a program use (tests/facade/test_tpu_hbm.py compiles it), under the docs' capacity.
    assert DEVICE_SPECS["v4"].hbm_bytes < 32 * GIB
    assert DEVICE_SPECS["v5e"].hbm_bytes < 16 * GIB
    assert DEVICE_SPECS["v5p"].hbm_bytes > 95 * GIB
    assert 32 * GB < DEVICE_SPECS["v6e"].hbm_bytes < 32 * GIB


def test_nvlink_figures_are_one_direction_halves_of_the_bidirectional_totals() -> None:
    assert DEVICE_SPECS["H100"].intra_bandwidth == 900e9 / 2
    assert DEVICE_SPECS["H200"].intra_bandwidth == 900e9 / 2
    assert DEVICE_SPECS["A100-80GB"].intra_bandwidth == 600e9 / 2
    # One 400 Gb/s NDR port per H100 / H200, one 200 Gb/s HDR port per A100.
    assert DEVICE_SPECS["H100"].inter_bandwidth == 400e9 / 8
    assert DEVICE_SPECS["A100-80GB"].inter_bandwidth == 200e9 / 8


def test_fp8_peaks_are_the_dense_halves_of_the_sparse_datasheet_figures() -> None:
    # H100 / H200 SXM: "3,958 TFLOPS" FP8 with sparsity, so 1,979 dense.
    for name in ("H100", "H200"):
        assert DEVICE_SPECS[name].peak_fp8_flops == 3958e12 / 2
    # A100 has no FP8 tensor cores; the TPU datasheets before TPU7x give int8, not fp8.
    assert {DEVICE_SPECS[t].peak_fp8_flops for t in ("A100-80GB", *TPUS) if t != "tpu7x"} == {None}


@given(st.floats(1e9, 1e18), st.floats(1e9, 1e18))
def test_a_device_keeps_its_fp8_peak_through_a_dict(bf16: float, fp8: float) -> None:
    spec = _custom(peak_bf16_flops=bf16, peak_fp8_flops=fp8)
    assert spec.peak_fp8_flops == fp8
    assert DeviceSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_a_device_dict_from_before_fp8_peaks_still_loads() -> None:
    data = DEVICE_SPECS["H100"].to_dict()
    del data["peak_fp8_flops"]
    assert DeviceSpec.from_dict(data).peak_fp8_flops is None


def test_hbm_bandwidths_are_the_datasheet_peaks() -> None:
    # NVIDIA datasheets (SXM parts) and the Cloud TPU system-architecture tables, bytes per second.
    expected = {"H100": 3.35e12, "H200": 4.8e12, "H800": 3.35e12, "H20": 4.0e12, "A100-80GB": 2.039e12,
                "B200": 8e12, "GB200": 8e12, "MI300X": 5.3e12, "MI325X": 6e12, "v4": 1.2e12, "v5e": 819e9,
                "v5p": 2.765e12, "v6e": 1.64e12, "tpu7x": 7.38e12 / 2}
    assert {name: spec.hbm_bandwidth for name, spec in DEVICE_SPECS.items()} == expected


@given(st.floats(1e9, 1e15))
def test_a_device_keeps_its_hbm_bandwidth_through_a_dict(bandwidth: float) -> None:
    spec = _custom(hbm_bandwidth=bandwidth)
    assert DeviceSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    data = spec.to_dict()
    del data["hbm_bandwidth"]
    assert DeviceSpec.from_dict(data).hbm_bandwidth is None


def test_every_device_has_a_faster_fast_link_than_network() -> None:
    for spec in DEVICE_SPECS.values():
        assert spec.intra_bandwidth > spec.inter_bandwidth
        assert spec.intra_latency_s <= spec.inter_latency_s


def test_gpus_end_ici_at_the_node_and_tpus_at_the_slice() -> None:
    assert {DEVICE_SPECS[g].ici_scope for g in GPUS} == {"node"}
    assert {DEVICE_SPECS[r].ici_scope for r in RACKS} == {"rack"}
    assert {DEVICE_SPECS[t].ici_scope for t in TPUS} == {"slice"}
    assert set(GPUS) | set(RACKS) | set(TPUS) == set(DEVICE_SPECS)


def test_device_table_keys_match_names_and_cannot_be_mutated() -> None:
    assert all(key == spec.name for key, spec in DEVICE_SPECS.items())
    with pytest.raises(TypeError):
        DEVICE_SPECS["H100"] = DEVICE_SPECS["H200"]  # type: ignore[index]


def test_device_links_are_cost_model_links() -> None:
    spec = DEVICE_SPECS["H100"]
    assert spec.intra_link == Link(450e9, spec.intra_latency_s)
    assert spec.inter_link == Link(50e9, spec.inter_latency_s)


@pytest.mark.parametrize(
    ("overrides", "error", "fragment"),
    [
        ({"hbm_bytes": 0}, ClusterError, "hbm_bytes=0"),
        ({"hbm_bytes": 1.5e9}, MeshplanTypeError, "hbm_bytes"),
        ({"intra_bandwidth": 0.0}, ClusterError, "intra_bandwidth"),
        ({"inter_bandwidth": -1.0}, ClusterError, "inter_bandwidth"),
        ({"intra_latency_s": float("nan")}, ClusterError, "intra_latency_s"),
        ({"devices_per_node": 0}, ClusterError, "devices_per_node"),
        ({"devices_per_node": True}, MeshplanTypeError, "devices_per_node"),
        ({"peak_bf16_flops": 0.0}, ClusterError, "peak_bf16_flops"),
        ({"peak_bf16_flops": 1e15, "peak_fp8_flops": -1.0}, ClusterError, "peak_fp8_flops=-1.0"),
        ({"peak_bf16_flops": 1e15, "peak_fp8_flops": "2e15"}, MeshplanTypeError, "peak_fp8_flops"),
        ({"peak_fp8_flops": 2e15}, ClusterError, "peak_fp8_flops=2e\\+15 needs peak_bf16_flops"),
        ({"hbm_bandwidth": 0.0}, ClusterError, "hbm_bandwidth"),
        ({"hbm_bandwidth": "3e12"}, MeshplanTypeError, "hbm_bandwidth"),
        ({"ici_scope": "pod"}, ClusterError, "ici_scope"),
        ({"ici_scope": "rack"}, ClusterError, "needs domain_nodes"),
        ({"domain_nodes": 18}, ClusterError, "only read with ici_scope='rack'"),
        ({"name": ""}, ClusterError, "name"),
        ({"name": 3}, MeshplanTypeError, "name"),
    ],
)
def test_device_spec_rejects_bad_figures(overrides: dict, error: type, fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        _custom(**overrides)


def test_device_spec_collects_every_problem_in_one_error() -> None:
    with pytest.raises(ClusterError) as info:
        _custom(hbm_bytes=0, intra_bandwidth=-1.0, devices_per_node=0)
    message = str(info.value)
    assert "hbm_bytes" in message and "intra_bandwidth" in message and "devices_per_node" in message


def test_zero_latency_is_allowed() -> None:
    assert _custom(intra_latency_s=0, inter_latency_s=0).intra_latency_s == 0.0


# --- Cluster ----------------------------------------------------------------------------------------


def test_gpu_cluster_counts() -> None:
    c = Cluster(DEVICE_SPECS["H100"], num_nodes=8, devices_per_node=8)
    assert (c.num_devices, c.hbm_bytes, c.total_hbm_bytes) == (64, 80 * GB, 64 * 80 * GB)
    assert (c.ici_domain_size, c.num_ici_domains) == (8, 8)
    assert c.intra_link == DEVICE_SPECS["H100"].intra_link
    assert c.link(spans_domains=True) == c.inter_link
    assert c.link(spans_domains=False) == c.intra_link


def test_tpu_ici_domain_is_the_whole_slice_across_hosts() -> None:
    c = parse_cluster("2xv5p-256")
    assert (c.num_slices, c.nodes_per_slice, c.devices_per_node) == (2, 32, 4)
    assert (c.devices_per_slice, c.ici_domain_size, c.num_ici_domains) == (128, 128, 2)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_nodes": 0, "devices_per_node": 8}, ClusterError),
        ({"num_nodes": 2, "devices_per_node": -1}, ClusterError),
        ({"num_nodes": 3, "devices_per_node": 8, "num_slices": 2}, ClusterError),
        ({"num_nodes": 2.0, "devices_per_node": 8}, MeshplanTypeError),
        ({"num_nodes": 2, "devices_per_node": "8"}, MeshplanTypeError),
    ],
)
def test_cluster_rejects_bad_counts(kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        Cluster(DEVICE_SPECS["H100"], **kwargs)


def test_cluster_needs_a_device_spec() -> None:
    with pytest.raises(MeshplanTypeError, match="DeviceSpec"):
        Cluster("H100", num_nodes=1, devices_per_node=8)  # type: ignore[arg-type]


def test_cluster_is_frozen() -> None:
    c = parse_cluster("8x8xH100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.num_nodes = 4  # type: ignore[misc]


# --- parse_cluster --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "device", "nodes", "per_node", "slices"),
    [
        ("8x8xH100", "H100", 8, 8, 1),
        ("2xH200", "H200", 2, 8, 1),
        ("H100", "H100", 1, 8, 1),
        ("4x4xa100", "A100-80GB", 4, 4, 1),
        (" 2 x 8 x h100-sxm ", "H100", 2, 8, 1),
        # v4/v5p names count TensorCores (2 per chip), 4 chips per host.
        ("v5p-256", "v5p", 32, 4, 1),
        ("v5p-8", "v5p", 1, 4, 1),
        ("v4-128", "v4", 16, 4, 1),
        ("v4-8", "v4", 1, 4, 1),
        # v5e/v6e names count chips, 8 chips per host; smaller slices sit on one host.
        ("v5e-256", "v5e", 32, 8, 1),
        ("v5litepod-16", "v5e", 2, 8, 1),
        ("v5e-4", "v5e", 1, 4, 1),
        ("v5e-1", "v5e", 1, 1, 1),
        ("v6e-64", "v6e", 8, 8, 1),
        ("V6E-256", "v6e", 32, 8, 1),
        ("2xv5p-256", "v5p", 64, 4, 2),
        ("4xv6e-8", "v6e", 4, 8, 4),
    ],
)
def test_parse_cluster_decodes_every_form(text: str, device: str, nodes: int, per_node: int,
                                          slices: int) -> None:
    c = parse_cluster(text)
    assert c.device is DEVICE_SPECS[device]
    assert (c.num_nodes, c.devices_per_node, c.num_slices) == (nodes, per_node, slices)


def test_v5p_256_is_128_chips_on_32_hosts_and_v5e_256_is_256_chips() -> None:
    assert parse_cluster("v5p-256").num_devices == 128
    assert parse_cluster("v5e-256").num_devices == 256
    assert parse_cluster("v4-128").num_devices == 64


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("8x8", "valid forms"),
        ("", "valid forms"),
        ("8x8x8xH100", "valid forms"),
        ("H100x8", "Did you mean .H100."),
        ("0x8xH100", "nodes=0"),
        ("2x0xH100", "devices_per_node=0"),
        ("0xv5p-256", "slices=0"),
        ("v5p-257", "even"),
        ("v5p-6", "3 chips"),
        ("v5p-0", ">= 1"),
        ("v5e-24", "24 chips"),
        ("v5e-512", "256 chips"),
        ("v6e-2", "1, 4, 8"),
        ("v4-16384", "4096"),
        ("2xv5p", "slice name"),
        ("8x8xB300", "known devices"),
        ("8x8xh10", "H100"),
        ("20x4xGB200", "whole NVLink racks"),
        ("GB200-NVL36", "holds 72 GPUs"),
        ("H100-NVL8", "no multi-host NVLink domain"),
        ("tpu7x-6", "3 chips"),
    ],
)
def test_parse_cluster_rejects_bad_text_with_a_helpful_message(text: str, fragment: str) -> None:
    with pytest.raises(ClusterError, match=fragment):
        parse_cluster(text)


def test_unknown_device_error_lists_every_known_device() -> None:
    with pytest.raises(ClusterError) as info:
        parse_cluster("2xMI400X")
    for name in DEVICE_SPECS:
        assert name in str(info.value)


def test_parse_cluster_rejects_non_strings() -> None:
    with pytest.raises(MeshplanTypeError):
        parse_cluster(64)  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError):
        parse_cluster("8xH100", devices=["H100"])  # type: ignore[arg-type]


def test_parse_cluster_reads_names_from_a_custom_device_table() -> None:
    mine = _custom(name="MI300X", hbm_bytes=192 * GB, devices_per_node=8)
    c = parse_cluster("4xmi300x", devices={"MI300X": mine})
    assert (c.device, c.num_devices) == (mine, 32)
    with pytest.raises(ClusterError, match="MI300X"):
        parse_cluster("4xH100", devices={"MI300X": mine})


tpu_slices = st.one_of(
    st.tuples(st.sampled_from(["v4", "v5p"]),
              st.sampled_from([4, 8, 16, 32]) | st.integers(1, 64).map(lambda k: 64 * k)
              ).map(lambda t: (t[0], 2 * t[1])),
    st.tuples(st.sampled_from(["v5e", "v6e"]), st.sampled_from([1, 4, 8, 16, 32, 64, 128, 256])),
)


@given(tpu_slices, st.integers(1, 8))
def test_tpu_slice_names_round_trip_and_count_whole_hosts(slice_: tuple[str, int], slices: int) -> None:
    gen, count = slice_
    text = f"{gen}-{count}" if slices == 1 else f"{slices}x{gen}-{count}"
    c = parse_cluster(text)
    chips = count // 2 if gen in ("v4", "v5p") else count
    assert c.num_devices == chips * slices
    assert c.devices_per_node <= DEVICE_SPECS[gen].devices_per_node
    assert c.nodes_per_slice * c.devices_per_node == chips
    assert c.ici_domain_size == chips and c.num_ici_domains == slices
    assert c.text == text
    assert parse_cluster(c.text) == c


@given(st.sampled_from(GPUS), st.integers(1, 512), st.integers(1, 16))
def test_gpu_cluster_text_round_trips(device: str, nodes: int, per_node: int) -> None:
    c = Cluster(DEVICE_SPECS[device], num_nodes=nodes, devices_per_node=per_node)
    assert parse_cluster(c.text) == c
    assert c.num_devices == nodes * per_node
    assert c.ici_domain_size * c.num_ici_domains == c.num_devices


@given(st.sampled_from(sorted(DEVICE_SPECS)), st.integers(1, 64), st.integers(1, 8))
def test_cluster_survives_a_json_round_trip(device: str, nodes: int, slices: int) -> None:
    rack = DEVICE_SPECS[device].domain_nodes
    nodes = nodes if rack is None else min(nodes, rack)  # an NVLink domain holds at most its rack's hosts
    c = Cluster(DEVICE_SPECS[device], num_nodes=nodes * slices, devices_per_node=4, num_slices=slices)
    again = Cluster.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c


def test_from_dict_rejects_unknown_keys() -> None:
    data = parse_cluster("v5p-8").to_dict()
    data["racks"] = 2
    with pytest.raises(ClusterError, match="racks"):
        Cluster.from_dict(data)


def test_repr_is_short_and_names_the_shape() -> None:
    assert repr(parse_cluster("8x8xH100")) == "Cluster('8x8xH100': 64 devices, 8 nodes x 8, 80 GB HBM each)"
    assert "2 slices" in repr(parse_cluster("2xv5e-16"))


def test_text_uses_the_node_form_for_custom_specs_and_irregular_tpu_clusters() -> None:
    lookalike = dataclasses.replace(DEVICE_SPECS["v5p"], hbm_bytes=80 * GB)
    assert Cluster(lookalike, num_nodes=32, devices_per_node=4).text == "32x4xv5p"
    assert Cluster(DEVICE_SPECS["v5p"], num_nodes=3, devices_per_node=4).text == "3x4xv5p"
    with pytest.raises(ClusterError, match="slice name"):
        parse_cluster("3x4xv5p")


def test_numpy_numbers_are_accepted_and_canonicalized() -> None:
    spec = _custom(hbm_bytes=np.int64(24 * GB), intra_bandwidth=np.float32(1e11),
                   devices_per_node=np.int32(4))
    assert type(spec.hbm_bytes) is int and type(spec.intra_bandwidth) is float
    c = Cluster(spec, num_nodes=np.int64(2), devices_per_node=np.int64(4))
    assert type(c.num_nodes) is int and c.num_devices == 8
    assert json.loads(json.dumps(c.to_dict()))["num_nodes"] == 2


_MODELS = sorted({name.split("-")[0] for name in DEVICE_SPECS})


@given(st.sampled_from(sorted(DEVICE_SPECS)), st.sampled_from(_MODELS), st.sampled_from(["NVIDIA ", "", "TPU "]),
       st.text("abcdefgh0123456789 -", max_size=12), st.booleans())
def test_a_device_kind_matches_the_spec_of_its_model_only(name: str, model: str, vendor: str, suffix: str,
                                                          upper: bool) -> None:
    # jax's device_kind names the model with a vendor prefix and a variant suffix ("NVIDIA H100 80GB HBM3");
    # a spec matches the kinds of its model (the name before any "-", any case) and no other model's.
    kind = f"{vendor}{model} {suffix}"
    kind = kind.upper() if upper else kind
    mine = name.split("-")[0]
    if model == mine:
        assert DEVICE_SPECS[name].matches_kind(kind)
    elif mine.lower() not in model.lower() and mine.lower() not in suffix.lower():
        assert not DEVICE_SPECS[name].matches_kind(kind)
