"""A machine profile as plain data: what ``meshplan profile`` timed on live devices, and how.

A :class:`MachineProfile` holds the raw timings of short micro-benchmarks run on one machine (or one
multi-process jax job): matmuls (:class:`MatmulTiming`), collectives over each link kind
(:class:`CollectiveTiming`: ``"intra"``, the devices of one host or TPU slice; ``"inter"``, one device per
host or slice, over the network), HBM copies (:class:`MemoryTiming`) and, once a user has run ``meshplan
measure``, whole training steps (:class:`StepTiming`). It records the device kind and count, the software
versions and the date, and for each kind of figure how it was measured (``methods``). Nothing here is fitted:
the figures a plan is priced with (a :class:`~meshplan.pure.cluster.Link` per link kind, a matmul efficiency)
are derived from these timings by :mod:`meshplan.pure.cost._profile_fit`, so a profile can be refitted when
the fit improves, and the file keeps what was measured rather than what was concluded.

The JSON form is versioned (:data:`PROFILE_FORMAT`) and read strictly: an unknown or missing key, a value
of the wrong type or out of range, another format version or an ``id`` that no longer matches the timings
(a file edited after it was measured) is a :class:`~meshplan.pure.errors.ProfileError` that names the file
and the field.

Example:
  >>> p = MachineProfile(device_kind="cpu", platform="cpu", device_count=8, process_count=1,
  ...                    versions=(("jax", "0.10.2"),), measured_at="2026-01-02T03:04:05Z",
  ...                    memory=(MemoryTiming(2**20, 1e-4),))
  >>> MachineProfile.from_json(p.to_json()) == p
  True
  >>> p.memory[0].bandwidth / 1e9
  20.97152
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from meshplan.pure._check import as_choice, as_count, as_record, as_sequence
from meshplan.pure.cluster._measured import StepTiming
from meshplan.pure.cluster._profile_fields import (
    byte_count,
    checked,
    count,
    name,
    pairs,
    positive,
    record_fields,
    records,
    text,
)
from meshplan.pure.errors import MeshplanError, MeshplanTypeError, ProfileError

__all__ = ["LINK_KINDS", "MATMUL_DTYPES", "PROFILE_COLLECTIVES", "PROFILE_FORMAT", "CollectiveTiming",
           "MachineProfile", "MatmulTiming", "MemoryTiming", "StepTiming"]

T = TypeVar("T")

PROFILE_FORMAT = 1
"""The profile format this meshplan reads and writes; a file of another version is refused, naming both."""

LINK_KINDS: tuple[str, ...] = ("intra", "inter")
"""``"intra"``: inside one host (GPUs, CPUs) or TPU slice (NVLink, ICI); ``"inter"``: between them (InfiniBand,
DCN, TCP), as :class:`~meshplan.pure.cluster.DeviceSpec`'s ``intra_*`` and ``inter_*`` figures."""

PROFILE_COLLECTIVES: tuple[str, ...] = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
                                        "collective-permute")
"""The collectives a training step runs, as the cost model names them."""

MATMUL_DTYPES: tuple[str, ...] = ("bfloat16", "float8_e4m3fn")
"""Operand dtypes a profile times matmuls in (FP8 only where the device has FP8 units)."""

@dataclasses.dataclass(frozen=True, slots=True)
class MatmulTiming:
    """One timed matmul ``(m, k) @ (k, n)``.

    Attributes:
      label: which layer matmul it is (``"mlp up"``) or ``"sweep"``.
      hidden: the model hidden size the shape comes from (what the efficiency curve is a function of).
      tp: the tensor-parallel split it was cut at (1: the whole matmul).
      m, k, n: the shape.
      dtype: operand dtype, one of :data:`MATMUL_DTYPES`.
      seconds: the median time of one matmul.

    Example:
      >>> MatmulTiming("mlp up", 64, 1, 512, 64, 256, "bfloat16", 1e-4).rate / 1e9
      167.77216
    """

    label: str
    hidden: int
    tp: int
    m: int
    k: int
    n: int
    dtype: str
    seconds: float

    def __post_init__(self) -> None:
        checked(self, {"label": text, "hidden": count, "tp": count, "m": count, "k": count, "n": count,
                        "dtype": lambda v, w: as_choice(v, w, MATMUL_DTYPES, error=ProfileError),
                        "seconds": positive})

    @property
    def flops(self) -> int:
        """``2 m k n``."""
        return 2 * self.m * self.k * self.n

    @property
    def rate(self) -> float:
        """Achieved FLOP/s."""
        return self.flops / self.seconds


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveTiming:
    """One timed collective over a group of ``devices`` on one link kind.

    Attributes:
      link: ``"intra"`` or ``"inter"`` (:data:`LINK_KINDS`).
      kind: one of :data:`PROFILE_COLLECTIVES`.
      devices: the group size ``n``.
      nbytes: the full logical buffer, as :mod:`meshplan.pure.cost._collective_time` defines it (the gathered
        result of an all-gather, the input of a reduce-scatter or all-reduce, each device's send buffer of an
        all-to-all or a permute).
      seconds: the median time of one call.
    """

    link: str
    kind: str
    devices: int
    nbytes: int
    seconds: float

    def __post_init__(self) -> None:
        checked(self, {"link": lambda v, w: as_choice(v, w, LINK_KINDS, error=ProfileError),
                        "kind": lambda v, w: as_choice(v, w, PROFILE_COLLECTIVES, error=ProfileError),
                        "devices": count, "nbytes": byte_count, "seconds": positive})
        if self.devices < 2:
            raise ProfileError(f"CollectiveTiming: devices={self.devices} must be >= 2 (a group of one moves "
                               "nothing).")


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryTiming:
    """One timed HBM copy: read ``nbytes`` and write ``nbytes``.

    Attributes:
      nbytes: the array's size.
      seconds: the median time of one pass.
    """

    nbytes: int
    seconds: float

    def __post_init__(self) -> None:
        checked(self, {"nbytes": byte_count, "seconds": positive})

    @property
    def bandwidth(self) -> float:
        """Bytes per second read plus written."""
        return 2 * self.nbytes / self.seconds


def _at(where: str, make: Callable[[], T]) -> T:
    """``make()``, any meshplan error re-raised as a :class:`ProfileError` naming the field ``where``."""
    try:
        return make()
    except MeshplanError as err:
        raise ProfileError(f"field {where}: {err}") from None


def _list_of(where: str, from_dict: Callable[[Any], T], items: Any) -> tuple[T, ...]:
    seq = _at(where, lambda: as_sequence(items, where))
    return tuple(_at(f"{where}[{i}]", functools.partial(from_dict, item)) for i, item in enumerate(seq))


def _reader(cls: type[T]) -> Callable[[Any], T]:
    return lambda data: cls(**record_fields(cls, data))


@dataclasses.dataclass(frozen=True, slots=True)
class MachineProfile:
    """What ``meshplan profile`` timed on one machine (see the module docstring).

    Attributes:
      device_kind: jax's ``device_kind`` (``"NVIDIA H100 80GB HBM3"``, ``"TPU v5 lite"``, ``"cpu"``).
      platform: ``"gpu"``, ``"tpu"`` or ``"cpu"``.
      device_count: devices profiled, all processes together.
      process_count: jax processes (hosts); ``"inter"`` timings need two or more.
      versions: ``(package, version)`` pairs: jax, jaxlib, the CUDA plugin, libtpu, Python.
      measured_at: when, ISO 8601 in UTC (``"2026-01-02T03:04:05Z"``).
      matmuls, collectives, memory: the timings.
      steps: measured training steps (:class:`StepTiming`, from ``meshplan measure``).
      methods: ``(figure, how it was measured)`` pairs.
      format: :data:`PROFILE_FORMAT`.

    Raises:
      ProfileError: a value out of range, or two processes' worth of devices that do not divide.
      MeshplanTypeError: a value of the wrong type.
    """

    device_kind: str
    platform: str
    device_count: int
    process_count: int
    versions: tuple[tuple[str, str], ...]
    measured_at: str
    matmuls: tuple[MatmulTiming, ...] = ()
    collectives: tuple[CollectiveTiming, ...] = ()
    memory: tuple[MemoryTiming, ...] = ()
    steps: tuple[StepTiming, ...] = ()
    methods: tuple[tuple[str, str], ...] = ()
    format: int = PROFILE_FORMAT

    def __post_init__(self) -> None:
        checked(self, {
            "device_kind": name, "platform": lambda v, w: as_choice(v, w, ("cpu", "gpu", "tpu"), error=ProfileError),
            "device_count": count, "process_count": count, "versions": pairs, "measured_at": _timestamp,
            "matmuls": records(MatmulTiming), "collectives": records(CollectiveTiming),
            "memory": records(MemoryTiming), "steps": records(StepTiming), "methods": pairs,
            "format": lambda v, w: as_count(v, w, error=ProfileError)})
        if self.format != PROFILE_FORMAT:
            raise ProfileError(f"profile format {self.format}: this meshplan reads format {PROFILE_FORMAT} only; "
                               "profile the machine again with this meshplan (meshplan profile --out FILE).")
        if self.device_count % self.process_count:
            raise ProfileError(f"device_count={self.device_count} does not split evenly over "
                               f"process_count={self.process_count}.")
        inter = [c for c in self.collectives if c.link == "inter"]
        if inter and self.process_count < 2 and self.platform != "tpu":
            raise ProfileError("inter-host collectives need process_count >= 2 (one process per host); this "
                               f"profile has {self.process_count}.")

    @property
    def devices_per_process(self) -> int:
        """Devices each process drives."""
        return self.device_count // self.process_count

    @property
    def id(self) -> str:
        """12 hex digits of a SHA-256 over everything measured except ``steps`` (a refit adds steps and keeps
        the id, so rows measured under either version price alike)."""
        data = self._data()
        del data["steps"]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]

    def has_link(self, link: str) -> bool:
        """Whether collectives were timed on ``link`` (``"intra"`` / ``"inter"``)."""
        link = as_choice(link, "link", ("intra", "inter"), error=ProfileError)
        return any(c.link == link for c in self.collectives)

    def _data(self) -> dict[str, Any]:
        return {
            "format": self.format, "device_kind": self.device_kind, "platform": self.platform,
            "device_count": self.device_count, "process_count": self.process_count,
            "versions": dict(self.versions), "measured_at": self.measured_at, "methods": dict(self.methods),
            "matmuls": [dataclasses.asdict(m) for m in self.matmuls],
            "collectives": [dataclasses.asdict(c) for c in self.collectives],
            "memory": [dataclasses.asdict(m) for m in self.memory],
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict, with :attr:`id`; :meth:`from_dict` inverts it."""
        return {"id": self.id, **self._data()}

    def to_json(self) -> str:
        """Indented JSON text; :meth:`from_json` reads it back."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "profile") -> MachineProfile:
        """Rebuild from :meth:`to_dict` output (a readers' ``figures`` key is ignored).

        Args:
          data: the decoded JSON.
          source: what to call the document in errors (the file name).

        Raises:
          ProfileError: naming ``source`` and the field: a bad or missing field, another format version, or an
            ``id`` that does not match the timings (edited after measuring: delete the ``id`` to accept it).
        """
        try:
            return _from_dict(cls, data)
        except ProfileError as err:
            raise ProfileError(f"{source}: {err}") from None

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "profile") -> MachineProfile:
        """Read :meth:`to_json` text; a truncated or non-JSON document is a :class:`ProfileError` naming
        ``source`` and where the text stops making sense."""
        if not isinstance(text, (str, bytes)):
            raise MeshplanTypeError(f"text={text!r:.60} must be the profile's JSON text (str or bytes).")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError
            where = f" (line {err.lineno}, column {err.colno})" if isinstance(err, json.JSONDecodeError) else ""
            raise ProfileError(f"{source}: not a complete JSON document{where}: {err}; profile again with "
                               "meshplan profile --out FILE.") from None
        return cls.from_dict(data, source=source)

    def __repr__(self) -> str:
        return (f"MachineProfile({self.device_count} x {self.device_kind!r}, {self.process_count} process"
                f"{'es' if self.process_count != 1 else ''}, {self.measured_at}, {len(self.matmuls)} matmuls, "
                f"{len(self.collectives)} collectives, {len(self.steps)} steps)")


def _timestamp(value: Any, what: str) -> str:
    text = name(value, what)
    # ISO 8601 UTC, seconds resolution: what the facade writes, and sorts as it reads.
    ok = len(text) == 20 and text[4] == text[7] == "-" and text[10] == "T" and text[13] == text[16] == ":" \
        and text[19] == "Z" and (text[:4] + text[5:7] + text[8:10] + text[11:13] + text[14:16] + text[17:19]).isdigit()
    if not ok:
        raise ProfileError(f"{what}={text!r:.40} must be an ISO 8601 UTC time such as '2026-01-02T03:04:05Z'")
    return text


def _from_dict(cls: type[MachineProfile], data: Any) -> MachineProfile:
    names = [f.name for f in dataclasses.fields(cls)]
    fields = as_record(data, "profile", fields=names + ["id"], required=[
        "format", "device_kind", "platform", "device_count", "process_count", "versions", "measured_at"],
        ignore=("figures",), error=ProfileError)
    version = fields["format"]
    if version != PROFILE_FORMAT:
        raise ProfileError(f"field format: this file is format {version!r:.20}; this meshplan reads format "
                           f"{PROFILE_FORMAT}; profile again with this meshplan (meshplan profile --out FILE).")
    stamp = fields.pop("id", None)
    readers: dict[str, Callable[[Any], Any]] = {
        "matmuls": _reader(MatmulTiming), "collectives": _reader(CollectiveTiming),
        "memory": _reader(MemoryTiming), "steps": StepTiming.from_dict}
    for name, read in readers.items():
        if name in fields:
            fields[name] = _list_of(name, read, fields[name])
    for name in ("versions", "methods"):
        if name in fields:
            fields[name] = _at(name, functools.partial(pairs, fields[name], name))
    try:
        made = cls(**fields)
    except MeshplanError as err:  # the message names the field (MachineProfile: device_count=0 ...)
        raise ProfileError(str(err)) from None
    if stamp is not None and stamp != made.id:
        raise ProfileError(f"field id: {stamp!r:.40} does not match the timings (their id is {made.id!r}): the "
                           "file was edited after it was measured; delete the id to accept the edit.")
    return made
