"""pipeline_axis: the stage axis by meshplan's, loadax's or MaxText's name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure.errors import MeshplanTypeError, MeshShapeError
from meshplan.pure.mesh import PIPELINE_AXIS_NAMES, pipeline_axis

others = st.lists(st.sampled_from(["dp", "fsdp", "tp", "sp", "ep", "data", "model", "expert"]), unique=True,
                  max_size=4)


@given(others, st.sampled_from(PIPELINE_AXIS_NAMES), st.integers(0, 4))
def test_the_one_pipeline_name_is_found_wherever_it_sits(names, stage, at):
    names = list(names)
    names.insert(min(at, len(names)), stage)
    assert pipeline_axis(tuple(names)) == stage


@given(others)
def test_a_mesh_without_one_has_none(names):
    assert pipeline_axis(tuple(names)) is None


def test_two_pipeline_names_are_ambiguous_and_non_strings_are_type_errors():
    with pytest.raises(MeshShapeError, match="several pipeline axes"):
        pipeline_axis(("pp", "stage"))
    with pytest.raises(MeshplanTypeError):
        pipeline_axis(("pp", 3))
    with pytest.raises(MeshplanTypeError):
        pipeline_axis(None)
