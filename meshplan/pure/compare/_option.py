"""One option of a comparison: a cluster, the best layout found on it, and what a run there costs.

:class:`CompareOption` is plain figures: the search's best mesh (or why none fits),
its memory (the compiler's peak where a compile verified it, else the estimate), the
predicted step, throughput and MFU, and with a price the cost per million tokens
and the time and cost of a token budget. :func:`option_from_search` builds one from
a :class:`~meshplan.pure.search.SearchResult` and a :class:`Verified` (what the
facade's compiles said, as plain data), so the figures are computed in one place.

Which figures are exact: ``memory_source`` is ``"exact"`` only for a compiled peak
(``compiler`` names the compiler and versions); ``"estimate"`` rows carry the
calibrated range. The step time is always the planner's estimate (FLOPs at the
assumed efficiency plus the collectives not hidden under compute); ``step_source``
says so. Cost = price x devices x hours, at the user's price: meshplan ships none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meshplan.pure._check import as_count, as_real, as_str
from meshplan.pure.errors import CompareError, MeshplanTypeError
from meshplan.pure.cluster import Cluster
from meshplan.pure.cost import calibration_spread, peak_bounds
from meshplan.pure.search import SearchResult

__all__ = ["CompareOption", "Verified", "cost_per_million_tokens", "option_from_search", "train_figures",
           "unfit_option"]

_STATUSES = ("exact", "estimate", "not verified", "over budget", "none fits")


@dataclasses.dataclass(frozen=True, slots=True)
class Verified:
    """What compiling the chosen mesh said, as plain data (the facade fills it from its verification rows).

    Attributes:
      mesh: the mesh text the figures belong to (``"fsdp=64"``).
      status: ``"exact"`` (a compiled peak within the budget), ``"estimate"`` (not compiled: ``note`` says
        why), ``"not verified"`` (the compile failed or timed out: ``note``), ``"over budget"``.
      peak_bytes: the compiled peak per device (``None`` when not compiled).
      compiler: the compiler and versions (``""`` when not compiled).
      note: why the row is not exact, or which shortcut gave the figure.
      run_high_bytes: a deviceless GPU compile's stated bound for a run on the GPU, where given.
      range_low_bytes, range_high_bytes: the estimate's calibrated range, where recorded.

    Example:
      >>> Verified("fsdp=8", "exact", peak_bytes=40 * 2**30, compiler="XLA:TPU (libtpu 0.0.42.1)").status
      'exact'
    """

    mesh: str
    status: str
    peak_bytes: int | None = None
    compiler: str = ""
    note: str = ""
    run_high_bytes: int | None = None
    range_low_bytes: int | None = None
    range_high_bytes: int | None = None

    def __post_init__(self) -> None:
        as_str(self.mesh, "Verified.mesh", error=CompareError)
        if self.status not in _STATUSES[:4]:
            raise CompareError(f"Verified.status={self.status!r:.40} must be one of {list(_STATUSES[:4])}.")
        for name in ("peak_bytes", "run_high_bytes", "range_low_bytes", "range_high_bytes"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_count(value, f"Verified.{name}", error=CompareError))
        if self.status in ("exact", "over budget") and self.peak_bytes is None:
            raise CompareError(f"Verified status {self.status!r} needs peak_bytes (the compiled peak).")
        as_str(self.compiler, "Verified.compiler", error=CompareError)
        as_str(self.note, "Verified.note", error=CompareError)


@dataclasses.dataclass(frozen=True, slots=True)
class CompareOption:
    """One cluster of a comparison, its best layout and what it costs (see the module docstring).

    Attributes:
      cluster: the cluster text (``"8x8xH100"``).
      device: the catalogue device name.
      devices: devices in the cluster.
      fits: whether any layout fits the memory budget (for a verified row: the compiled peak does).
      mesh: the best layout's mesh text (``""`` when none fits).
      status: ``"exact"``, ``"estimate"``, ``"not verified"``, ``"over budget"`` or ``"none fits"``.
      memory_bytes: the chosen layout's bytes per device (compiled peak when exact, else the estimate).
      budget_bytes: the memory budget per device.
      step_s: predicted seconds per step (estimate; 0 when nothing fits).
      tokens_per_step: global tokens per step (batch x seq).
      mfu: predicted model FLOPs utilisation (0 when unknown).
      compiler: the compiler behind an exact figure (``""`` otherwise).
      note: what a reader must know about the row (why not verified, why nothing fits).
      price_per_device_hour: the user's price (``None``: not priced).
      micro_batches: gradient-accumulation steps of the chosen layout.
      memory_low_bytes, memory_high_bytes: the estimate's calibrated range (``None``: exact or none recorded).

    Example:
      >>> o = CompareOption("1x8xH100", "H100", 8, True, "fsdp=8", "estimate", 40 * 2**30, 60 * 2**30, 2.0,
      ...                   8 * 4096, 0.4, price_per_device_hour=2.0)
      >>> round(o.tokens_per_s), round(o.tokens_per_s_per_device), round(o.cost_per_million_tokens, 3)
      (16384, 2048, 0.271)
    """

    cluster: str
    device: str
    devices: int
    fits: bool
    mesh: str
    status: str
    memory_bytes: int | None
    budget_bytes: int
    step_s: float
    tokens_per_step: int
    mfu: float
    compiler: str = ""
    note: str = ""
    price_per_device_hour: float | None = None
    micro_batches: int = 1
    memory_low_bytes: int | None = None
    memory_high_bytes: int | None = None

    def __post_init__(self) -> None:
        as_str(self.cluster, "CompareOption.cluster", nonempty=True, error=CompareError)
        as_str(self.device, "CompareOption.device", nonempty=True, error=CompareError)
        object.__setattr__(self, "devices", as_count(self.devices, "CompareOption.devices", error=CompareError))
        if not isinstance(self.fits, bool):
            raise MeshplanTypeError(f"CompareOption.fits={self.fits!r:.40} must be True or False.")
        if self.status not in _STATUSES:
            raise CompareError(f"CompareOption.status={self.status!r:.40} must be one of {list(_STATUSES)}.")
        object.__setattr__(self, "budget_bytes", as_count(self.budget_bytes, "budget_bytes", error=CompareError))
        object.__setattr__(self, "tokens_per_step", as_count(self.tokens_per_step, "tokens_per_step",
                                                             error=CompareError))
        object.__setattr__(self, "step_s", as_real(self.step_s, "step_s", allow_zero=True, error=CompareError))
        object.__setattr__(self, "mfu", as_real(self.mfu, "mfu", allow_zero=True, error=CompareError))
        if self.fits and self.step_s <= 0:
            raise CompareError(f"option {self.cluster}: a fitting option needs a step time > 0.")
        if self.price_per_device_hour is not None:
            object.__setattr__(self, "price_per_device_hour",
                               as_real(self.price_per_device_hour, "price_per_device_hour", error=CompareError))
        for name in ("memory_bytes", "memory_low_bytes", "memory_high_bytes"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_count(value, name, error=CompareError))
        for name in ("mesh", "compiler", "note"):
            as_str(getattr(self, name), f"CompareOption.{name}", error=CompareError)
        object.__setattr__(self, "micro_batches", as_count(self.micro_batches, "micro_batches", error=CompareError))

    @property
    def tokens_per_s(self) -> float:
        """Cluster tokens per second at the predicted step (0 when nothing fits)."""
        return self.tokens_per_step / self.step_s if self.fits else 0.0

    @property
    def tokens_per_s_per_device(self) -> float:
        """Tokens per second per device."""
        return self.tokens_per_s / self.devices

    @property
    def headroom_bytes(self) -> int | None:
        """The budget left over by the chosen layout (negative when over; ``None`` when no layout)."""
        return None if self.memory_bytes is None else self.budget_bytes - self.memory_bytes

    @property
    def cost_per_million_tokens(self) -> float | None:
        """USD per million tokens at the user's price (``None``: unpriced or nothing fits)."""
        if self.price_per_device_hour is None or not self.fits:
            return None
        return cost_per_million_tokens(self.price_per_device_hour, self.devices, self.tokens_per_s)

    def train(self, tokens: int) -> tuple[float, float | None] | None:
        """(hours, USD) to train ``tokens`` tokens here (USD ``None`` when unpriced; ``None`` when nothing fits)."""
        tokens = as_count(tokens, "tokens", maximum=10**18, error=CompareError)
        if not self.fits:
            return None
        return train_figures(tokens, self.tokens_per_s, self.devices, self.price_per_device_hour)

    def to_dict(self, *, tokens: int | None = None) -> dict[str, Any]:
        """One JSON row: the fields, the derived figures, and with ``tokens`` the time and cost to train."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update(tokens_per_s=self.tokens_per_s, tokens_per_s_per_device=self.tokens_per_s_per_device,
                   headroom_bytes=self.headroom_bytes, verified=self.status == "exact",
                   cost_per_million_tokens=self.cost_per_million_tokens)
        if tokens is not None:
            tokens = as_count(tokens, "tokens", maximum=10**18, error=CompareError)
            trained = self.train(tokens)
            out["train_tokens"] = tokens
            out["train_hours"] = None if trained is None else trained[0]
            out["train_cost"] = None if trained is None else trained[1]
        return out


def cost_per_million_tokens(price_per_device_hour: float, devices: int, tokens_per_s: float) -> float:
    """USD per million tokens: ``price x devices`` per hour over ``tokens_per_s x 3600`` tokens an hour.

    Example:
      >>> cost_per_million_tokens(2.0, 8, 16384.0)  # 16 USD an hour for 59M tokens
      0.2712673611111111
    """
    price = as_real(price_per_device_hour, "price_per_device_hour", error=CompareError)
    count = as_count(devices, "devices", error=CompareError)
    rate = as_real(tokens_per_s, "tokens_per_s", error=CompareError)
    return price * count / (rate * 3600.0) * 1e6


def train_figures(tokens: int, tokens_per_s: float, devices: int,
                  price_per_device_hour: float | None) -> tuple[float, float | None]:
    """(hours, USD or ``None``) to train ``tokens`` tokens at ``tokens_per_s`` on ``devices`` devices.

    Example:
      >>> train_figures(10**12, 1e6, 64, 2.0)  # 1e6 s = 277.8 h on 64 devices at 2 USD
      (277.77777777777777, 35555.555555555555)
    """
    count = as_count(tokens, "tokens", maximum=10**18, error=CompareError)
    rate = as_real(tokens_per_s, "tokens_per_s", error=CompareError)
    n = as_count(devices, "devices", error=CompareError)
    price = None if price_per_device_hour is None else as_real(price_per_device_hour, "price_per_device_hour",
                                                                   error=CompareError)
    hours = count / rate / 3600.0
    return hours, None if price is None else hours * n * price


def option_from_search(result: SearchResult, verified: Verified | None = None, *,
                       price_per_device_hour: float | None = None) -> CompareOption:
    """The option a search (and the compile of its chosen mesh) gives: the best fitting layout's figures.

    Args:
      result: :func:`~meshplan.pure.search.search_meshes`' answer for this cluster.
      verified: what compiling the chosen mesh said (``None``: not compiled; the row is an estimate).
        Its ``mesh`` must be one of the result's ranked meshes.
      price_per_device_hour: the user's price for this device kind (``None``: unpriced).

    Returns:
      A :class:`CompareOption`; ``fits=False`` with a note when no mesh fits the budget, or when the
      compiled peak is over it.

    Raises:
      MeshplanTypeError: ``result`` is not a SearchResult, ``verified`` not a Verified.
      CompareError: ``verified.mesh`` is not a ranked mesh of ``result``.

    Example:
      >>> from meshplan.pure import get_preset, search_meshes
      >>> found = search_meshes(get_preset("gpt2").spec, "1x8xH100", batch=8, seq=256, top_k=2)
      >>> o = option_from_search(found)
      >>> o.fits, o.status, o.devices, o.mesh == found.best.text
      (True, 'estimate', 8, True)
    """
    if not isinstance(result, SearchResult):
        raise MeshplanTypeError(f"result={result!r:.60} must be a SearchResult (what search_meshes returns).")
    if verified is not None and not isinstance(verified, Verified):
        raise MeshplanTypeError(f"verified={verified!r:.60} must be a Verified or None.")
    if price_per_device_hour is not None:
        price_per_device_hour = as_real(price_per_device_hour, "price_per_device_hour", error=CompareError)
    req = result.request
    cluster = req.cluster
    common: dict[str, Any] = dict(cluster=cluster.text, device=cluster.device.name, devices=cluster.num_devices,
                                  budget_bytes=req.budget, tokens_per_step=req.batch * req.seq,
                                  price_per_device_hour=price_per_device_hour)
    if not result.candidates:
        why = _none_fits(result)
        return CompareOption(fits=False, mesh="", status="none fits", memory_bytes=None, step_s=0.0, mfu=0.0,
                             note=why, **common)
    by_text = {c.text: c for c in result.candidates}
    if verified is not None and verified.mesh not in by_text:
        raise CompareError(f"verified mesh {verified.mesh!r} is not a ranked mesh of {cluster.text} "
                           f"({sorted(by_text)}).")
    cand = by_text[verified.mesh] if verified is not None else result.best
    step = cand.step
    step_s = 0.0 if step is None else step.step_s
    mfu = 0.0 if step is None else step.mfu
    micro = 1 if step is None else step.micro_batches
    spread = calibration_spread(req.recipe)
    low, high = (None, None) if spread is None else peak_bounds(cand.memory, spread[1])
    if verified is None or verified.status in ("estimate", "not verified"):
        note = "" if verified is None else verified.note
        return CompareOption(fits=True, mesh=cand.text, status="estimate" if verified is None else verified.status,
                             memory_bytes=cand.memory.total, step_s=step_s, mfu=mfu, note=note,
                             micro_batches=micro, memory_low_bytes=low, memory_high_bytes=high, **common)
    assert verified.peak_bytes is not None  # Verified checks exact / over budget carry a peak
    fits = verified.status == "exact"
    note = verified.note if fits else (verified.note or f"the compiled peak of every verified layout is over the "
                                       f"{req.budget / 2**30:.1f} GiB budget")
    return CompareOption(fits=fits, mesh=cand.text, status=verified.status, memory_bytes=verified.peak_bytes,
                         step_s=step_s if fits else 0.0, mfu=mfu if fits else 0.0, compiler=verified.compiler,
                         note=note, micro_batches=micro, **common)


def unfit_option(cluster: Cluster, *, budget_bytes: int, tokens_per_step: int, note: str,
                 price_per_device_hour: float | None = None) -> CompareOption:
    """The option of a cluster where the search found nothing that fits (``note``: its reason, e.g. the
    search's own message).

    Example:
      >>> from meshplan.pure.cluster import parse_cluster
      >>> unfit_option(parse_cluster("H100"), budget_bytes=60 * 2**30, tokens_per_step=8192, note="too big").status
      'none fits'
    """
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.60} must be a Cluster.")
    if price_per_device_hour is not None:
        price_per_device_hour = as_real(price_per_device_hour, "price_per_device_hour", error=CompareError)
    return CompareOption(cluster.text, cluster.device.name, cluster.num_devices, False, "", "none fits", None,
                         budget_bytes, 0.0, tokens_per_step, 0.0, note=note,
                         price_per_device_hour=price_per_device_hour)


def _none_fits(result: SearchResult) -> str:
    """Why no mesh of ``result`` fits, in one line: the leanest mesh's bytes against the budget."""
    req = result.request
    budget = f"{req.budget / 2**30:.1f} GiB"
    if result.rejected:
        lean = result.rejected[0]
        return (f"nothing fits: the leanest mesh ({lean.text}) needs {lean.memory.total / 2**30:.1f} GiB per "
                f"device, over the {budget} budget")
    reasons = "; ".join(f"{r.kind} ({r.count})" for r in result.rejections[:3])
    return f"nothing fits the {budget} budget" + (f": {reasons}" if reasons else "")

