"""Profile the machine this runs on: short micro-benchmarks on the live devices, written as a versioned JSON file.

:func:`profile_machine` times matmuls (a hidden-size sweep, and a model's own layer shapes at each tp split
when a model is named; bf16, and FP8 where the catalogue gives the device an FP8 peak), an HBM copy, and the
collectives a training step runs over each link kind of the local topology (``intra``: inside a host or TPU
slice; ``inter``: one device per host or slice, measured only under ``jax.distributed`` with several
processes), as :mod:`meshplan.facade._profile_bench` describes. The result is plain data
(:class:`~meshplan.pure.cluster.MachineProfile`); the fits a plan prices with are pure
(:mod:`meshplan.pure.cost._profile_fit`). Under ``jax.distributed`` every process runs every benchmark (the
collectives need them all) and process 0 alone writes the file.

:func:`save_profile` writes the document atomically (a temporary file in the same directory, then a rename),
so an interrupted or failed write never leaves a truncated profile over a good one; :func:`load_profile` reads
one strictly, naming the file and the field of anything wrong.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from meshplan.facade import _profile_bench as bench
from meshplan.facade._machine import live_devices, software_versions, utc_now
from meshplan.facade._model_file import resolve_model
from meshplan.pure._check import as_choice, as_count, as_sequence
from meshplan.pure.cluster._machine import device_for_kind, link_grid
from meshplan.pure.cluster._profile import PROFILE_COLLECTIVES, MachineProfile
from meshplan.pure.cost._profile_pricing import profile_document
from meshplan.pure.cost._profile_shapes import matmul_shapes, sweep_shapes
from meshplan.pure.errors import ClusterError, MeshplanTypeError, PlanError, ProfileError
from meshplan.pure.mesh import DeviceInfo
from meshplan.pure.presets import ModelSpec

__all__ = ["ProfileSettings", "load_profile", "profile_machine", "save_profile"]

_MiB = 2**20


@dataclasses.dataclass(frozen=True, slots=True)
class ProfileSettings:
    """What :func:`profile_machine` times and how often (:meth:`for_platform` gives the defaults).

    Attributes:
      hidden_sizes: the sweep's hidden sizes (MLP up and down at each).
      tokens: rows ``m`` of every matmul (a device's tokens per step).
      collective_bytes: buffer sizes each collective is timed at (bytes, as the cost model counts them).
      hbm_bytes: array sizes the HBM copy is timed at.
      repeats: timed runs per figure (the median is kept).
      inner: operations per run (one dispatch spread over them).
      kinds: the collectives timed.
      tp_splits: tp splits a named model's layer shapes are timed at (those above the local device count are
        skipped).

    Example:
      >>> ProfileSettings.for_platform("cpu", quick=True).tokens
      64
    """

    hidden_sizes: tuple[int, ...]
    tokens: int
    collective_bytes: tuple[int, ...]
    hbm_bytes: tuple[int, ...]
    repeats: int = 5
    inner: int = 10
    kinds: tuple[str, ...] = PROFILE_COLLECTIVES
    tp_splits: tuple[int, ...] = (1, 2, 4, 8)

    def __post_init__(self) -> None:
        for name in ("hidden_sizes", "collective_bytes", "hbm_bytes", "tp_splits"):
            values = as_sequence(getattr(self, name), name)
            if not values:
                raise PlanError(f"ProfileSettings.{name} must not be empty.")
            limit = 2**40 if name.endswith("bytes") else 2**20
            object.__setattr__(self, name, tuple(as_count(v, f"{name}[{i}]", maximum=limit, error=PlanError)
                                                 for i, v in enumerate(values)))
        for name, limit in (("tokens", 2**24), ("repeats", 1000), ("inner", 1000)):
            object.__setattr__(self, name, as_count(getattr(self, name), name, maximum=limit, error=PlanError))
        kinds = as_sequence(self.kinds, "kinds")
        bad = [k for k in kinds if not isinstance(k, str) or k not in PROFILE_COLLECTIVES]
        if bad or not kinds:
            raise PlanError(f"ProfileSettings.kinds={list(kinds)!r:.80} must be a non-empty subset of "
                            f"{list(PROFILE_COLLECTIVES)}.")
        object.__setattr__(self, "kinds", tuple(kinds))

    @classmethod
    def for_platform(cls, platform: str, *, quick: bool = False) -> ProfileSettings:
        """The defaults: accelerator-sized on GPU and TPU (about a minute), small on CPU; ``quick`` for a
        smoke run (seconds)."""
        platform = as_choice(platform, "platform", ("cpu", "gpu", "tpu"), error=PlanError)
        if platform == "cpu":
            if quick:
                return cls((32, 64), 64, (2**12, 2**16), (_MiB,), repeats=2, inner=2)
            return cls((64, 128, 256), 256, (2**14, 2**18, 2**20), (16 * _MiB,), repeats=3, inner=4)
        if quick:
            return cls((1024, 4096), 4096, (_MiB, 16 * _MiB), (256 * _MiB,), repeats=3, inner=4)
        return cls((1024, 2048, 4096, 8192), 8192, tuple(_MiB * 4**i for i in range(6)), (256 * _MiB, 1024 * _MiB))


def _infos(devices: Sequence[Any]) -> list[DeviceInfo]:
    return [DeviceInfo(d.id, process_index=d.process_index, slice_index=getattr(d, "slice_index", None),
                       platform=d.platform) for d in devices]


def profile_machine(*, model: str | ModelSpec | None = None, settings: ProfileSettings | None = None,
                    quick: bool = False, devices: Sequence[Any] | None = None,
                    out: str | os.PathLike[str] | None = None) -> MachineProfile:
    """Time the live devices (see the module docstring) and return the profile; write it to ``out`` (process 0).

    Args:
      model: a preset, model file or :class:`~meshplan.pure.ModelSpec` whose layer shapes are timed too.
      settings: what to time (default :meth:`ProfileSettings.for_platform` of the devices' platform).
      quick: the small defaults (a smoke run), when ``settings`` is not given.
      devices: the devices (default every device of every process).
      out: a path to write the JSON document to (process 0 only; atomically).

    Returns:
      The :class:`~meshplan.pure.cluster.MachineProfile`.

    Raises:
      ProfileError: ``out`` cannot be written. PlanError, ClusterError, MeshplanTypeError: bad arguments.

    Example:
      >>> p = profile_machine(settings=ProfileSettings((16,), 16, (2**10, 2**12), (2**16,), repeats=1, inner=1,
      ...                                              kinds=("all-reduce",), tp_splits=(1,)))
      >>> p.device_count, p.platform, sorted({c.link for c in p.collectives})
      (8, 'cpu', ['intra'])
    """
    found = live_devices(devices)
    first = found[0]
    if settings is not None and not isinstance(settings, ProfileSettings):
        raise MeshplanTypeError(f"settings={settings!r:.60} must be a ProfileSettings or None.")
    if not isinstance(quick, bool):
        raise MeshplanTypeError(f"quick={quick!r:.40} must be True or False.")
    chosen = settings if settings is not None else ProfileSettings.for_platform(first.platform, quick=quick)
    spec = None if model is None else resolve_model(model)
    try:
        catalogue = device_for_kind(first.device_kind, first.platform)
    except ClusterError:
        catalogue = None  # a device meshplan does not know can still be profiled
    dtypes = ["bfloat16"] + (["float8_e4m3fn"] if catalogue is not None and catalogue.peak_fp8_flops else [])
    me = jax.process_index()
    local = [d for d in found if d.process_index == me]
    shapes = [(h, 1, *shape) for h, shape in sweep_shapes(chosen.hidden_sizes, tokens=chosen.tokens)]
    if spec is not None:
        for tp in chosen.tp_splits:
            if tp <= len(local):
                shapes += [(spec.hidden_size, tp, f"{spec.name} {s[0]}", *s[1:])
                           for s in matmul_shapes(spec, tokens=chosen.tokens, tp=tp)]
    matmuls = bench.time_matmuls(shapes, device=local[0], dtypes=dtypes, repeats=chosen.repeats, inner=chosen.inner)
    memory = bench.time_memory(chosen.hbm_bytes, device=local[0], repeats=chosen.repeats, inner=chosen.inner)
    by_id = {d.id: d for d in found}
    grid = [[by_id[i] for i in row] for row in link_grid(_infos(found))]
    collectives = bench.time_collectives(grid, kinds=chosen.kinds, sizes=chosen.collective_bytes,
                                         repeats=chosen.repeats, inner=chosen.inner)
    methods = {**bench.METHODS, "settings": json.dumps(dataclasses.asdict(chosen), sort_keys=True)}
    profile = MachineProfile(first.device_kind, first.platform, len(found), len({d.process_index for d in found}),
                             software_versions(), utc_now(), matmuls=matmuls, collectives=collectives,
                             memory=memory, methods=tuple(methods.items()))
    if out is not None and me == 0:
        save_profile(profile, out)
    return profile


def save_profile(profile: MachineProfile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile``'s document (its timings, and the fitted figures for readers) to ``path`` atomically.

    Raises:
      ProfileError: the directory cannot be written (nothing is left at ``path`` but what was there).
      MeshplanTypeError: not a profile or a path.
    """
    if not isinstance(profile, MachineProfile):
        raise MeshplanTypeError(f"profile={profile!r:.60} must be a MachineProfile.")
    if not isinstance(path, (str, os.PathLike)):
        raise MeshplanTypeError(f"path={path!r:.60} must be a file path.")
    target = Path(path)
    try:
        catalogue = device_for_kind(profile.device_kind, profile.platform)
    except ClusterError:
        catalogue = None
    try:
        document = profile_document(profile, peak_bf16_flops=None if catalogue is None else catalogue.peak_bf16_flops)
    except ProfileError as err:  # timings that cannot be fitted are still what was measured: keep them
        document = {**profile.to_dict(), "figures": {"error": str(err)}}
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or Path("."))
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as err:
        raise ProfileError(f"cannot write the profile to {str(target)!r}: {err.strerror or err}.") from None
    return target


def load_profile(path: str | os.PathLike[str]) -> MachineProfile:
    """Read a profile file (``meshplan profile --out FILE``).

    Raises:
      ProfileError: the file cannot be read, is not a complete JSON document, is of another format version, or
        has a bad field (the message names the file and the field).
      MeshplanTypeError: ``path`` is not a path.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise MeshplanTypeError(f"path={path!r:.60} must be a file path.")
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ProfileError(f"cannot read the profile {str(path)!r}: {err.strerror or err}.") from None
    return MachineProfile.from_json(data, source=str(path))
