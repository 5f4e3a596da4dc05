"""profile_machine on the suite's 8 real CPU devices: every benchmark timed, the file written safely and read back."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import meshplan
from meshplan.errors import MeshplanTypeError, PlanError, ProfileError
from meshplan.pure.cluster import PROFILE_COLLECTIVES
from meshplan.pure.cost import profile_figures

SMALL = meshplan.ProfileSettings((16, 32), 32, (2**12, 2**16), (2**18,), repeats=2, inner=2, tp_splits=(1, 2))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("profile") / "cpu.json"
    return meshplan.profile_machine(settings=SMALL, out=out), out


def test_every_collective_is_timed_at_every_size_on_the_one_host_link(profiled) -> None:
    p, _ = profiled
    assert (p.device_kind, p.platform, p.device_count, p.process_count) == ("cpu", "cpu", 8, 1)
    timed = sorted((c.kind, c.nbytes) for c in p.collectives)
    assert {c.link for c in p.collectives} == {"intra"} and {c.devices for c in p.collectives} == {8}
    assert sorted({k for k, _ in timed}) == sorted(PROFILE_COLLECTIVES) and len(timed) == 2 * len(PROFILE_COLLECTIVES)
    assert all(c.seconds > 0 for c in p.collectives)


def test_the_matmul_sweep_and_the_hbm_copy_are_timed_and_fitted(profiled) -> None:
    p, _ = profiled
    assert sorted({(m.hidden, m.label) for m in p.matmuls}) == [
        (16, "sweep down"), (16, "sweep up"), (32, "sweep down"), (32, "sweep up")]
    assert {m.dtype for m in p.matmuls} == {"bfloat16"}  # XLA:CPU has no FP8 units: bf16 only
    figures = profile_figures(p)
    assert figures.intra is not None and figures.inter is None and figures.intra.bandwidth > 0
    assert figures.matmul.peak_source == "fastest matmul timed" and 0 < figures.matmul.at(24) <= 1
    assert figures.hbm_bandwidth > 0


def test_the_file_names_the_device_the_versions_and_how_each_figure_was_measured(profiled) -> None:
    p, out = profiled
    doc = json.loads(out.read_text())
    assert doc["device_kind"] == "cpu" and doc["device_count"] == 8 and doc["format"] == 1
    assert {"jax", "jaxlib", "python"} <= set(doc["versions"]) and doc["measured_at"].endswith("Z")
    assert {"matmul", "hbm", "collectives", "settings"} <= set(doc["methods"])
    assert doc["figures"]["intra"]["kind"] == "all" and doc["id"] == p.id
    assert meshplan.load_profile(out) == p


def test_a_models_layer_shapes_are_timed_at_each_tp_split(tmp_path: Path) -> None:
    import dataclasses

    from meshplan.pure import get_preset

    tiny = dataclasses.replace(get_preset("llama3-8b").spec, name="tiny", num_layers=1, hidden_size=32,
                               num_heads=2, num_kv_heads=2, head_dim=16, intermediate_size=64, vocab_size=64,
                               num_params=None)
    settings = dataclasses.replace(SMALL, hidden_sizes=(16,), kinds=("all-reduce",), tp_splits=(1, 2))
    p = meshplan.profile_machine(model=tiny, settings=settings)
    mine = [m for m in p.matmuls if m.label.startswith("tiny ")]
    assert sorted({m.tp for m in mine}) == [1, 2] and {m.hidden for m in mine} == {32}
    assert {m.label for m in mine} == {f"tiny {x}" for x in ("q", "k", "v", "o", "gate", "up", "down", "head")}


def test_a_truncated_profile_is_refused_naming_the_file_and_nothing_overwrites_it(profiled, tmp_path: Path) -> None:
    _, out = profiled
    broken = tmp_path / "broken.json"
    broken.write_text(out.read_text()[:300])
    before = broken.read_bytes()
    with pytest.raises(ProfileError, match=f"^{broken}: not a complete JSON document"):
        meshplan.load_profile(broken)
    with pytest.raises(ProfileError, match="cannot read the profile"):
        meshplan.load_profile(tmp_path / "missing.json")
    assert broken.read_bytes() == before


def test_a_failed_write_leaves_the_old_profile_in_place(profiled, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    p, _ = profiled
    target = tmp_path / "keep.json"
    target.write_text("the old profile")

    def full_disk(src, dst):  # the rename that would publish the new file fails, as on a full or read-only disk
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(ProfileError, match="cannot write the profile .*No space left on device"):
        meshplan.save_profile(p, target)
    assert target.read_text() == "the old profile" and sorted(tmp_path.iterdir()) == [target]  # no temporary left
    with pytest.raises(ProfileError, match="cannot write the profile"):
        meshplan.save_profile(p, tmp_path / "no" / "such" / "dir.json")


def test_bad_settings_and_arguments_are_typed_errors() -> None:
    with pytest.raises(PlanError, match="kinds"):
        meshplan.ProfileSettings((16,), 16, (2**10,), (2**10,), kinds=("all-sum",))
    with pytest.raises(PlanError, match="must not be empty"):
        meshplan.ProfileSettings((), 16, (2**10,), (2**10,))
    with pytest.raises(MeshplanTypeError):
        meshplan.profile_machine(settings="fast")
    with pytest.raises(PlanError):
        meshplan.ProfileSettings.for_platform("abacus")
