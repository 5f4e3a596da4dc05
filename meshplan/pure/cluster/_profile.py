"""A machine profile as plain data: what ``meshplan profile`` timed on live devices, and how.

A :class:`MachineProfile` holds the raw timings of short micro-benchmarks run on one machine (or one
``jax.distributed`` job): matmuls (:class:`MatmulTiming`), collectives over each link kind
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
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from meshplan.pure._check import as_choice, as_count, as_real, as_record, as_sequence, as_str, collect
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

_MAX_BYTES = 2**50  # a PiB: beyond any buffer a benchmark moves
_MAX_DIM = 2**40


def _fail(what: str, type_errors: list[str], value_errors: list[str]) -> None:
    if type_errors:
        raise MeshplanTypeError(f"{what}: " + "; ".join(type_errors + value_errors) + ".")
    if value_errors:
        raise ProfileError(f"{what}: " + "; ".join(value_errors) + ".")


def _checked(obj: Any, checks: Mapping[str, Callable[[Any, str], Any]]) -> None:
    """Check and canonicalize ``obj``'s fields, every problem listed at once."""
    types: list[str] = []
    values: list[str] = []
    out = {}
    for field, check in checks.items():
        before = len(types) + len(values)
        value = collect(types, values, check, getattr(obj, field), field)
        if len(types) + len(values) == before:
            out[field] = value
    _fail(type(obj).__name__, types, values)
    for field, value in out.items():
        object.__setattr__(obj, field, value)


def _text(value: Any, what: str) -> str:
    return as_str(value, what, error=ProfileError)


def _name(value: Any, what: str) -> str:
    return as_str(value, what, nonempty=True, error=ProfileError)


def _count(value: Any, what: str) -> int:
    return as_count(value, what, maximum=_MAX_DIM, error=ProfileError)


def _bytes(value: Any, what: str) -> int:
    return as_count(value, what, maximum=_MAX_BYTES, error=ProfileError)


def _positive(value: Any, what: str) -> float:
    return as_real(value, what, error=ProfileError)


def _seconds(value: Any, what: str) -> float:
    return as_real(value, what, allow_zero=True, error=ProfileError)


def _optional(check: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    def inner(value: Any, what: str) -> T | None:
        return None if value is None else check(value, what)
    return inner


def _records(cls: type[T]) -> Callable[[Any, str], tuple[T, ...]]:
    def check(value: Any, what: str) -> tuple[T, ...]:
        items = as_sequence(value, what)
        bad = [i for i, v in enumerate(items) if not isinstance(v, cls)]
        if bad:
            raise MeshplanTypeError(f"{what}[{bad[0]}]={items[bad[0]]!r:.60} must be a {cls.__name__}")
        return tuple(items)
    return check


def _pairs(value: Any, what: str) -> tuple[tuple[str, str], ...]:
    """``(name, text)`` pairs, names unique, kept sorted (a mapping in JSON)."""
    if isinstance(value, Mapping):
        value = tuple(value.items())
    items = as_sequence(value, what)
    out = []
    for i, item in enumerate(items):
        pair = as_sequence(item, f"{what}[{i}]")
        if len(pair) != 2:
            raise ProfileError(f"{what}[{i}]={item!r:.60} must be a (name, text) pair")
        out.append((_name(pair[0], f"{what}[{i}] name"), _text(pair[1], f"{what}[{i}] text")))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ProfileError(f"{what} names {sorted(n for n in set(names) if names.count(n) > 1)} more than once")
    return tuple(sorted(out))


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
        _checked(self, {"label": _text, "hidden": _count, "tp": _count, "m": _count, "k": _count, "n": _count,
                        "dtype": lambda v, w: as_choice(v, w, MATMUL_DTYPES, error=ProfileError),
                        "seconds": _positive})

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
        _checked(self, {"link": lambda v, w: as_choice(v, w, LINK_KINDS, error=ProfileError),
                        "kind": lambda v, w: as_choice(v, w, PROFILE_COLLECTIVES, error=ProfileError),
                        "devices": _count, "nbytes": _bytes, "seconds": _positive})
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
        _checked(self, {"nbytes": _bytes, "seconds": _positive})

    @property
    def bandwidth(self) -> float:
        """Bytes per second read plus written."""
        return 2 * self.nbytes / self.seconds


@dataclasses.dataclass(frozen=True, slots=True)
class StepTiming:
    """One layout's measured training step beside what the plan predicted (a row of ``meshplan measure``).

    Attributes:
      model: the model's name.
      hidden: its hidden size.
      mesh: the mesh text (``"dp=2,fsdp=4"``).
      batch, seq: the global batch (sequences) and tokens per sequence.
      steps: timed steps (after the warm-up); 0 when the layout did not run.
      measured_step_s: the median step (``None``: it did not run; ``error`` says why).
      measured_min_s, measured_max_s: the fastest and slowest timed step.
      measured_peak_bytes: the device's peak bytes in use during the steps (``None``: the backend reports
        none, as XLA:CPU, or it could not be read; ``peak_note`` says which).
      peak_note: where ``measured_peak_bytes`` comes from, or why there is none.
      predicted_step_s: the plan's step (compute + exposed communication).
      predicted_compute_s, predicted_exposed_s: its two parts.
      efficiency: the matmul efficiency the compute was priced at; ``predicted_compute_s x efficiency`` is the
        compute at the peak, what a refit rescales.
      predicted_memory_bytes: the plan's estimate of the peak per device.
      compiled_peak_bytes: XLA's compiled peak for this device (``None``: not compiled).
      profile_id: the :attr:`MachineProfile.id` that priced the prediction (``""``: the catalogue's figures).
      error: why the layout has no measurement (``""``: it ran).
      predicted_rank: its rank in the plan.
    """

    model: str
    hidden: int
    mesh: str
    batch: int
    seq: int
    steps: int
    measured_step_s: float | None
    measured_min_s: float | None
    measured_max_s: float | None
    measured_peak_bytes: int | None
    peak_note: str
    predicted_step_s: float | None
    predicted_compute_s: float | None
    predicted_exposed_s: float | None
    efficiency: float | None
    predicted_memory_bytes: int | None
    compiled_peak_bytes: int | None
    profile_id: str = ""
    error: str = ""
    predicted_rank: int | None = None

    def __post_init__(self) -> None:
        opt_s = _optional(_seconds)
        opt_b = _optional(lambda v, w: as_count(v, w, minimum=0, maximum=_MAX_BYTES, error=ProfileError))
        _checked(self, {
            "model": _name, "hidden": _count, "mesh": _name, "batch": _count, "seq": _count,
            "steps": lambda v, w: as_count(v, w, minimum=0, maximum=_MAX_DIM, error=ProfileError),
            "measured_step_s": opt_s, "measured_min_s": opt_s, "measured_max_s": opt_s,
            "measured_peak_bytes": opt_b, "peak_note": _text, "predicted_step_s": opt_s,
            "predicted_compute_s": opt_s, "predicted_exposed_s": opt_s,
            "efficiency": _optional(_positive), "predicted_memory_bytes": opt_b, "compiled_peak_bytes": opt_b,
            "profile_id": _text, "error": _text, "predicted_rank": _optional(_count)})
        ran = self.measured_step_s is not None
        if ran == bool(self.error):
            raise ProfileError(f"StepTiming {self.mesh!r}: a row has a measured step or an error, not both or "
                               f"neither (measured_step_s={self.measured_step_s}, error={self.error!r:.60}).")
        low, mid, high = self.measured_min_s, self.measured_step_s, self.measured_max_s
        if mid is not None and not (low is not None and high is not None and low <= mid <= high and self.steps):
            raise ProfileError(f"StepTiming {self.mesh!r}: measured_min_s <= measured_step_s <= measured_max_s "
                               f"must hold over steps >= 1 (got {self.measured_min_s}, {self.measured_step_s}, "
                               f"{self.measured_max_s} over {self.steps}).")

    @property
    def step_ratio(self) -> float | None:
        """Measured over predicted step (``None`` where either is missing or the prediction is 0)."""
        if self.measured_step_s is None or not self.predicted_step_s:
            return None
        return self.measured_step_s / self.predicted_step_s

    @property
    def memory_ratio(self) -> float | None:
        """Measured peak over the plan's estimate."""
        if self.measured_peak_bytes is None or not self.predicted_memory_bytes:
            return None
        return self.measured_peak_bytes / self.predicted_memory_bytes

    @property
    def compiled_ratio(self) -> float | None:
        """Measured peak over XLA's compiled peak."""
        if self.measured_peak_bytes is None or not self.compiled_peak_bytes:
            return None
        return self.measured_peak_bytes / self.compiled_peak_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the three ratios for readers (ignored by :meth:`from_dict`)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update(step_ratio=self.step_ratio, memory_ratio=self.memory_ratio, compiled_ratio=self.compiled_ratio)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepTiming:
        """Inverse of :meth:`to_dict`."""
        return cls(**_fields(cls, data, ignore=("step_ratio", "memory_ratio", "compiled_ratio")))


def _fields(cls: type, data: Any, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    fields = dataclasses.fields(cls)
    required = [f.name for f in fields if f.default is dataclasses.MISSING]
    return as_record(data, cls.__name__, fields=[f.name for f in fields], required=required, ignore=ignore,
                     error=ProfileError)


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
    return lambda data: cls(**_fields(cls, data))


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
        _checked(self, {
            "device_kind": _name, "platform": lambda v, w: as_choice(v, w, ("cpu", "gpu", "tpu"), error=ProfileError),
            "device_count": _count, "process_count": _count, "versions": _pairs, "measured_at": _timestamp,
            "matmuls": _records(MatmulTiming), "collectives": _records(CollectiveTiming),
            "memory": _records(MemoryTiming), "steps": _records(StepTiming), "methods": _pairs,
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
    text = _name(value, what)
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
            fields[name] = _at(name, functools.partial(_pairs, fields[name], name))
    try:
        made = cls(**fields)
    except MeshplanError as err:  # the message names the field (MachineProfile: device_count=0 ...)
        raise ProfileError(str(err)) from None
    if stamp is not None and stamp != made.id:
        raise ProfileError(f"field id: {stamp!r:.40} does not match the timings (their id is {made.id!r}): the "
                           "file was edited after it was measured; delete the id to accept the edit.")
    return made
