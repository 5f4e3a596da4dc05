"""The shared HLO text reader: instructions, replica groups in every form, trip counts."""

from __future__ import annotations

import gzip
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.xla._hlo_text import (
    array_types,
    computation_runs,
    group_size,
    parse_module,
    replica_groups,
    type_bytes,
    while_trips,
)

DATA = pathlib.Path(__file__).parent / "data" / "hlo"
FIXTURES = sorted(p.name.removesuffix(".hlo.gz") for p in DATA.glob("*.hlo.gz"))


def fixture(name: str) -> str:
    return gzip.decompress((DATA / f"{name}.hlo.gz").read_bytes()).decode()


@st.composite
def iota_forms(draw: st.DrawFn) -> tuple[list[int], list[int] | None, int]:
    """``(reshape dims, transpose perm or None, group size)`` of an iota replica-group form."""
    dims = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    perm = draw(st.permutations(range(len(dims)))) if draw(st.booleans()) else None
    n = math.prod(dims)
    size = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    return dims, (list(perm) if perm is not None else None), size


@given(iota_forms())
def test_iota_groups_are_numpy_iota_reshaped_and_transposed(form: tuple[list[int], list[int] | None, int]) -> None:
    dims, perm, size = form
    n = math.prod(dims)
    text = f"replica_groups=[{n // size},{size}]<=[{','.join(map(str, dims))}]"
    text += f"T({','.join(map(str, perm))})" if perm is not None else ""
    ids = np.arange(n).reshape(dims)
    ids = ids.transpose(perm) if perm is not None else ids
    expected = tuple(tuple(int(x) for x in row) for row in ids.reshape(n // size, size))
    assert replica_groups(text) == expected
    assert group_size(text) == size


@st.composite
def mesh_forms(draw: st.DrawFn) -> tuple[list[int], list[int], list[int] | None]:
    """``(axis sizes, chosen axes, device-id transpose or None)`` of a mesh replica-group form."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    chosen = sorted(draw(st.sets(st.integers(0, len(sizes) - 1), min_size=1)))
    perm = list(draw(st.permutations(range(len(sizes))))) if draw(st.booleans()) else None
    return sizes, chosen, perm


@given(mesh_forms())
def test_mesh_groups_are_the_devices_along_the_named_axes(form: tuple[list[int], list[int], list[int] | None]) -> None:
    sizes, chosen, perm = form
    n = math.prod(sizes)
    axes = ",".join(f"'a{k}'={s}" for k, s in enumerate(sizes))
    names = ",".join(f"'a{k}'" for k in chosen)
    devices = np.arange(n)
    text = f"replica_groups=mesh[{axes}]"
    if perm is not None:
        base = [sizes[p] for p in np.argsort(perm)]  # device ids iota(base) transposed by perm: shape `sizes`
        devices = np.arange(n).reshape(base).transpose(perm).reshape(-1)
        text += f", device_ids=([{','.join(map(str, base))}]T({','.join(map(str, perm))}))"
    text += f" {{{names}}}"
    grid = devices.reshape(sizes)
    rest = [k for k in range(len(sizes)) if k not in chosen]
    moved = grid.transpose(rest + chosen).reshape(-1, math.prod(sizes[k] for k in chosen))
    assert replica_groups(text) == tuple(tuple(int(x) for x in row) for row in moved)


def test_list_groups_pairs_and_the_empty_form() -> None:
    assert replica_groups("replica_groups={{0,1},{2,3}}, dimensions={0}") == ((0, 1), (2, 3))
    assert replica_groups("replica_groups={}", 4) == ((0, 1, 2, 3),)
    assert replica_groups("replica_groups={}") is None
    assert replica_groups("source_target_pairs={{0,1},{1,2}}") == ((0, 1), (1, 2))
    assert replica_groups("source_target_pairs={{0,1}}", pairs=False) is None
    assert group_size("channel_id=3") == 0


@pytest.mark.parametrize("name", FIXTURES)
def test_every_group_of_a_fixture_splits_its_devices(name: str) -> None:
    module = parse_module(fixture(name))
    seen = 0
    for instrs in module.computations.values():
        for instr in instrs:
            if "replica_groups=" not in instr.attrs:
                continue
            groups = replica_groups(instr.attrs, module.num_partitions)
            assert groups is not None, instr.attrs[:200]
            assert sorted(d for g in groups for d in g) == list(range(module.num_partitions))
            seen += 1
    assert seen > 0 or "single" in name


def test_array_types_and_bytes() -> None:
    assert array_types("(bf16[2,3]{1,0:T(8,128)(2,1)S(1)}, s32[], token[], u8[0]{0})") == (
        ("bf16", (2, 3)), ("s32", ()), ("u8", (0,)))
    assert type_bytes("f32[4,4]{1,0}") == 64


def test_trip_counts_stated_read_from_the_condition_or_unknown() -> None:
    text = """HloModule m
%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(12)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
%cond2 (p: (s32[], f32[4])) -> pred[] {
  %p2 = (s32[], f32[4]) parameter(0)
  %i2 = s32[] get-tuple-element(%p2), index=0
  %m = s32[] get-tuple-element(%p2), index=0
  ROOT %ne = pred[] compare(%i2, %m), direction=NE
}
%body (q: (s32[], f32[4])) -> (s32[], f32[4]) {
  ROOT %q = (s32[], f32[4]) parameter(0)
}
ENTRY %main (x: (s32[], f32[4])) -> (s32[], f32[4]) {
  %x = (s32[], f32[4]) parameter(0)
  %w1 = (s32[], f32[4]) while(%x), condition=%cond, body=%body
  %w2 = (s32[], f32[4]) while(%w1), condition=%cond2, body=%body
  ROOT %w3 = (s32[], f32[4]) while(%w2), condition=%cond2, body=%body, backend_config={"known_trip_count":{"n":"5"}}
}"""
    module = parse_module(text)
    w1, w2, w3 = module.computations["main"][1:]
    assert (while_trips(module, w1), while_trips(module, w2), while_trips(module, w3)) == (12, None, 5)
    assert computation_runs(module)["body"] == 12 + 1 + 5  # summed over its three call sites


@given(st.text(max_size=400))
def test_any_text_parses_without_an_exception(text: str) -> None:
    module = parse_module(text)
    for instrs in module.computations.values():
        for instr in instrs:
            replica_groups(instr.attrs)
            group_size(instr.attrs)
    computation_runs(module)


def test_a_non_string_is_a_typed_error() -> None:
    with pytest.raises(MeshplanTypeError, match="HLO module's text"):
        parse_module(b"HloModule m")  # type: ignore[arg-type]
