"""The search's shortcuts give what the plain functions give: ``step_seconds`` is ``step_time(...).step_s``,
``path_strs`` is ``path_str`` of every key path, the meshes a search skips pricing could not rank (each
shortcut skips work, never changes a value)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import get_preset, search_meshes
from meshplan.pure.cost import TrainingRecipe
from meshplan.pure.search import SearchRequest
from meshplan.pure.search._space import Placer
from meshplan.pure.cost._step_time import overlap_class, step_seconds, step_time
from meshplan.pure.specs._tree import _plain_paths, path_str, path_strs, tree_facts
from tests.pure.cost.test_step_time import inputs


@given(inputs(), st.floats(0.05, 1.0), st.sampled_from((None, 1e15)))
def test_step_seconds_is_step_time_step_s(case, efficiency, peak) -> None:
    flops, terms, layers = case
    # The search passes its unpriced terms (longer tuples) and their seconds apart.
    pending = [(what, kind, ("fsdp",), 1.0, 2, 8, 1) for what, kind, _ in terms]
    fast = step_seconds(flops, pending, [s for *_, s in terms], layers=layers, peak_flops=peak,
                        efficiency=efficiency)
    slow = step_time(flops, terms, layers=layers, tokens=1 << 20, devices=8, peak_flops=peak, efficiency=efficiency)
    assert fast == slow.step_s  # the same float, not an approximation: rankings compare them


_Pair = collections.namedtuple("_Pair", "left right")


@dataclasses.dataclass
class _Node:
    """A pytree node with attribute keys (jax's GetAttrKey)."""

    a: object
    b: object


jax.tree_util.register_dataclass(_Node, data_fields=["a", "b"], meta_fields=[])


class _Flat:
    """A pytree node registered without keys (jax's FlattenedIndexKey)."""

    def __init__(self, *children: object) -> None:
        self.children = children


jax.tree_util.register_pytree_node(_Flat, lambda n: (n.children, None), lambda _, c: _Flat(*c))

_leaves = st.sampled_from([1, 2.5, "x", None])
_keys = st.one_of(st.sampled_from(["w", "b", "0", "layers", "q_proj"]), st.integers(0, 3))


def _nodes(children: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.one_of(
        st.dictionaries(st.sampled_from(["w", "b", "0", "layers"]), children, max_size=3),
        st.dictionaries(st.integers(0, 3), children, max_size=3),
        st.lists(children, max_size=3), st.tuples(children, children),
        st.builds(_Pair, children, children), st.builds(_Node, children, children),
        st.builds(lambda c: _Flat(*c), st.lists(children, max_size=2)))


@given(st.recursive(_leaves, _nodes, max_leaves=12))
def test_path_strs_is_path_str_of_each_key_path(tree) -> None:
    keys = [k for k, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    assert path_strs(keys) == [path_str(k) for k in keys]


def test_path_strs_formats_an_unhashable_entry_whole() -> None:
    class Odd:
        __hash__ = None  # type: ignore[assignment]

        def __str__(self) -> str:
            return "odd"

    keys = [(jax.tree_util.DictKey("w"), Odd()), (jax.tree_util.SequenceKey(0),)]
    assert path_strs(keys) == [path_str(k) for k in keys] == ["w/odd", "0"]


_arrays = st.sampled_from([np.zeros(2, np.float32), jax.ShapeDtypeStruct((3, 2), np.float32), None])


def _plain_nodes(children: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.one_of(
        st.dictionaries(st.sampled_from(["w", "b", "0", "", "layers"]), children, max_size=3),
        st.dictionaries(st.integers(0, 11), children, max_size=3),
        st.lists(children, max_size=3), st.tuples(children, children))


@given(st.recursive(_arrays, _plain_nodes, max_leaves=12) | st.recursive(_leaves | _arrays, _nodes, max_leaves=8))
def test_tree_paths_are_the_key_paths_formatted(tree) -> None:
    # Plain containers with array leaves are walked without key paths; anything else (the second
    # strategy: named tuples, custom nodes, scalar leaves) falls back to them. Same paths either way.
    facts = tree_facts(tree)
    assert facts.paths() == [facts.path(i) for i in range(len(facts.infos))]


def test_preset_trees_are_walked_without_key_paths() -> None:
    for name in ("gpt2", "deepseek-v3"):
        facts = tree_facts(get_preset(name).params)
        assert _plain_paths(facts.source) is not None
        assert facts.paths() == path_strs(facts.keypaths)


@given(inputs(), st.floats(0.05, 1.0), st.sampled_from((None, 1e15)))
def test_a_step_is_no_faster_than_its_critical_collectives_alone(case, efficiency, peak) -> None:
    # The search skips a mesh whose step with its critical-path collectives alone is above the top_k-th
    # best step (_Search._contenders): the step with every collective must be no less, to the last bit
    # but for the search's slack of 1e-9.
    # It takes that step as the compute (the step with no collectives) plus their seconds.
    flops, terms, layers = case
    kw = {"layers": layers, "peak_flops": peak, "efficiency": efficiency}
    alone = step_seconds(flops, (), (), **kw) + sum(t[2] for t in terms if overlap_class(t[0], t[1]) == "critical")
    assert alone <= step_seconds(flops, terms, [t[2] for t in terms], **kw)


@pytest.mark.parametrize("model, cluster, options", [
    ("deepseek-v3", "64x8xH100", {}),
    ("llama3-8b", "512x8xH100", {}),
    ("mixtral-8x7b", "v5p-128", {"recipe": TrainingRecipe(remat="none", attention="flash")}),
    ("gpt2", "32x8xH100", {"micro_batches": 2}),
])
def test_the_top_k_are_the_first_k_when_every_mesh_is_priced(model, cluster, options) -> None:
    # With top_k at least the fitting meshes, every one is priced whole (no floor, no critical step skips
    # one); the shortcuts must leave the first k of that ranking as they are.
    few = search_meshes(model, cluster, top_k=3, **options)
    every = search_meshes(model, cluster, top_k=few.num_fitting, **options)
    assert len(every.candidates) == few.num_fitting > 3
    assert [c.text for c in few.candidates] == [c.text for c in every.candidates[:3]]
    assert [c.step for c in few.candidates] == [c.step for c in every.candidates[:3]]


@functools.cache
def _request(cluster: str) -> SearchRequest:
    return search_meshes("llama3-8b", cluster, top_k=1).request


@pytest.mark.parametrize("cluster", ["2x8xH100", "64x8xH100", "v5p-128", "2xv5p-256"])
@given(data=st.data())
def test_placer_split_stops_once_every_domain_is_placed(cluster, data) -> None:
    # Placer.split returns as soon as no domain is left: the axes after take 1, as the whole walk gives.
    req = _request(cluster)
    placer = Placer(req.axes, req)
    n = req.cluster.num_devices
    sizes, left = [], n
    for _ in req.axes[:-1]:
        sizes.append(data.draw(st.sampled_from([d for d in range(1, left + 1) if left % d == 0])))
        left //= sizes[-1]
    sizes.append(left)
    remaining, whole = req.cluster.num_ici_domains, []
    for size, movable in zip(sizes, placer.movable, strict=True):
        part = math.gcd(size, remaining) if movable else 1
        remaining //= part
        whole.append(part)
    assert placer.split(tuple(sizes)) == (tuple(whole) if remaining == 1 else None)
