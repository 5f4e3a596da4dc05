"""slice_reshard (XLA's halo exchange for a slice of a split dimension) and GPT-2's fused c_attn terms.

The permute widths are pinned to what jax 0.10.2's XLA:CPU emitted for GPT-2 (hidden 128) at tp = 2, 4, 8
(read from the HLO, one permute per width); the properties hold for any even split. The whole-step check
against compiled programs is tests/facade/test_collectives_vs_xla.py and benchmarks/bench_collectives.py.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import parse_cluster
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.presets import MODEL_SPECS
from meshplan.pure.cost._slice_reshard import SliceReshard, slice_reshard
from meshplan.pure.cost._activation_collectives import activation_terms
from meshplan.pure.cost._placement import AxisPlacement, group_time


@st.composite
def even_slices(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(dim, start, size, shards) with the dimension and the slice split evenly; shrinks to small ones."""
    n = draw(st.integers(1, 16))
    shard = draw(st.integers(1, 24))
    out = draw(st.integers(1, shard))
    dim, size = shard * n, out * n
    start = draw(st.integers(0, dim - size))
    return dim, start, size, n


def _lacking(dim: int, start: int, size: int, n: int) -> int:
    """The most elements any one device needs from others (its window less its own block)."""
    shard, out = dim // n, size // n
    return max(out - max(0, min(start + (i + 1) * out, (i + 1) * shard) - max(start + i * out, i * shard))
               for i in range(n))


@pytest.mark.parametrize("tp,expected", [
    (2, [(128,), (), (128,)]),
    (4, [(64, 32), (64, 64), (32, 32, 32)]),
    (8, [(32, 32, 16), (48, 16, 32), (32, 32, 16)]),
])
def test_gpt2_q_k_v_permutes_are_the_ones_xla_cpu_emitted(tp, expected):
    # Read from the compiled HLO of GPT-2 (hidden 128, 3h = 384) forward: e.g. tp=8's k slice is one
    # f32[.., 48] permute with pairs {2,0},{4,5},{5,7}, one of 16 ({3,1}) and one of 32 ({3,2},{4,6}).
    got = [slice_reshard(384, k * 128, 128, tp) for k in range(3)]
    assert [r.permutes for r in got] == expected
    assert not any(r.gathered for r in got)


@given(even_slices())
def test_a_slice_each_device_already_holds_moves_nothing(case):
    dim, start, size, n = case
    if _lacking(dim, start, size, n) == 0:
        assert slice_reshard(dim, start, size, n) == SliceReshard((), False)


@given(st.integers(1, 64), st.data())
def test_two_halves_that_lie_inside_their_blocks_move_nothing(shard, data):
    # The slice straddles the middle: device 0 reads the end of its block, device 1 the start of its own.
    out = data.draw(st.integers(1, shard))
    assert slice_reshard(2 * shard, shard - out, 2 * out, 2) == SliceReshard((), False)


@given(st.integers(1, 16), st.integers(1, 24))
def test_the_whole_dimension_is_never_resharded(n, shard):
    assert slice_reshard(shard * n, 0, shard * n, n) == SliceReshard((), False)


@given(even_slices())
def test_permutes_are_bounded_by_a_shard_and_carry_what_a_device_lacks(case):
    dim, start, size, n = case
    r = slice_reshard(dim, start, size, n)
    if r.gathered:
        assert r.permutes == ()
        return
    assert all(0 < w <= dim // n for w in r.permutes)  # a permute sends part of one block
    # A device receives at most one piece per permute: together they cover what it does not hold.
    assert r.width >= _lacking(dim, start, size, n)
    assert r.width <= len(r.permutes) * dim // n


@given(even_slices(), st.integers(2, 5))
def test_scaling_every_length_scales_every_permute(case, c):
    # XLA's halo arithmetic is homogeneous in the lengths: the same schedule at c times the widths.
    dim, start, size, n = case
    small, big = slice_reshard(dim, start, size, n), slice_reshard(c * dim, c * start, c * size, n)
    assert big.gathered == small.gathered and big.permutes == tuple(c * w for w in small.permutes)


@given(st.integers(2, 64), st.integers(1, 40))
def test_the_fused_thirds_are_never_gathered(n, heads_per_shard):
    h = n * heads_per_shard
    assert not any(slice_reshard(3 * h, k * h, h, n).gathered for k in range(3))


@pytest.mark.parametrize("args,names", [((0, 0, 1, 1), "dim=0"), ((8, -1, 4, 2), "start=-1"),
                                        ((8, 6, 4, 2), "start + size=10"), ((9, 0, 3, 2), "dim=9"),
                                        ((8, 0, 3, 2), "size=3"), ((8, 0, 4, 0), "shards=0")])
def test_bad_slices_are_refused_naming_the_value(args, names):
    with pytest.raises(PlanError, match=re.escape(names)):
        slice_reshard(*args)


def test_a_non_integer_length_is_a_type_error():
    with pytest.raises(MeshplanTypeError, match="dim=8.5"):
        slice_reshard(8.5, 0, 4, 2)


GPT2 = dataclasses.replace(MODEL_SPECS["gpt2"], name="tiny-gpt2", num_layers=2, hidden_size=128, num_heads=8,
                           num_kv_heads=8, head_dim=16, intermediate_size=512, vocab_size=512,
                           max_position_embeddings=512, num_params=None)


def _terms(model, sizes, backend="cpu", remat="full"):
    placement = AxisPlacement(tuple(sizes), tuple(sizes.values()), (1,) * len(sizes), parse_cluster("H100"))
    return activation_terms(model, sizes, placement, batch=16, seq=512, itemsize=2, remat=remat, backend=backend)


@pytest.mark.parametrize("sizes,remat", [({"tp": 8}, "full"), ({"dp": 2, "tp": 4}, "full"), ({"tp": 8}, "none"),
                                         ({"dp": 4, "tp": 2}, "full"), ({"dp": 2, "tp": 4}, "dots")])
def test_gpt2_on_xla_cpu_prices_the_reshard_per_layer_and_pass(sizes, remat):
    tp, b = sizes["tp"], 16 // sizes.get("dp", 1)
    x = b * 512 * 128 * 2
    terms = _terms(GPT2, sizes, remat=remat)
    permutes = sum(t.nbytes * t.calls for t in terms if t.kind == "collective-permute")
    widths = sum(slice_reshard(384, k * 128, 128, tp).width for k in range(3))
    passes = 1 if remat == "none" else 2  # "dots" saves the matmul's output, not its slices: they rerun
    assert permutes == passes * 2 * widths * b * 512 * 2
    # Backward: each of q, k, v's gradients and their concatenation moved off / back to the split dim.
    assert sum(t.nbytes * t.calls for t in terms if t.kind == "all-to-all") == 2 * 6 * x // tp
    fused = [t for t in terms if "fused qkv gradient" in t.what]
    assert len(fused) == 1 and fused[0][3] == 3 * x and fused[0][4] == 2


def test_xla_tpu_reshards_as_xla_cpu_without_the_fused_gradient_gather_and_gpu_and_llama_do_not():
    # Read on v5e-8 (GPT-2 hidden 1024, dp=2 x tp=4): the same permutes and all-to-alls, exactly; its
    # all-gathers are XLA:TPU's usual ones (no gather of the fused gradient). XLA:GPU: not read.
    sizes = {"dp": 2, "tp": 4}
    cpu, tpu = _terms(GPT2, sizes), _terms(GPT2, sizes, backend="tpu")
    for kind in ("collective-permute", "all-to-all"):
        assert (sum(t.nbytes * t.calls for t in tpu if t.kind == kind) == sum(t.nbytes * t.calls for t in cpu if t.kind == kind) > 0)
    assert not [t for t in tpu if "fused qkv gradient" in t.what]
    assert not [t for t in _terms(GPT2, sizes, backend="gpu") if t.kind == "collective-permute" or "fused" in t.what]
    llama = dataclasses.replace(MODEL_SPECS["llama3-8b"], num_layers=2, hidden_size=128, num_heads=8,
                                num_kv_heads=8, head_dim=16, intermediate_size=256, vocab_size=512, num_params=None)
    assert not [t for t in _terms(llama, sizes) if t.kind == "collective-permute" or "fused" in t.what]


def test_gpt2_with_dp_gathers_one_residual_buffer_fewer_per_layer_than_llama():
    # The fused gradient is gathered for c_attn's weight gradient instead of c_attn's input (read from HLO).
    llama = dataclasses.replace(GPT2, family="llama")
    gathers = {name: sum(t.calls for t in _terms(m, {"dp": 2, "tp": 4})
                         if t.kind == "all-gather" and t.what.startswith("tp all-gather of activations"))
               for name, m in (("gpt2", GPT2), ("llama", llama))}
    assert gathers["llama"] - gathers["gpt2"] == GPT2.num_layers


@given(st.floats(0, 1e10), st.sampled_from([("tp",), ("dp", "tp")]))
def test_a_permute_costs_one_send_of_its_buffer(nbytes, axes):
    cluster = parse_cluster("2x8xH100")
    placement = AxisPlacement(("dp", "tp"), (1, 8), (2, 1), cluster)
    seconds, link = group_time("collective-permute", nbytes, axes, placement)
    used = cluster.inter_link if link == "intra+inter" else cluster.intra_link
    assert seconds == pytest.approx(used.latency + nbytes / used.bandwidth)
    single = AxisPlacement(("tp",), (1,), (1,), cluster)
    assert group_time("collective-permute", nbytes, ("tp",), single) == (0.0, "none")
