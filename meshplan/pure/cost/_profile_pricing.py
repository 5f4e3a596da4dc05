"""A plan priced by a machine profile: the profile's fitted figures in place of the catalogue's, and a record of
which were replaced.

:func:`profile_figures` fits a :class:`~meshplan.pure.cluster.MachineProfile`'s timings
(:mod:`meshplan.pure.cost._profile_fit`); :func:`profiled_cluster` turns a cluster of that device kind and those
figures into the cluster and matmul efficiency the cost model prices with, for **any size of cluster**: a
64-node plan from one node's profile takes the profile's intra-node link and matmul efficiency and keeps the
catalogue's network where the profile measured no link between hosts (and says so). Exactly these figures
change, each only where the profile measured it:

===========================  ==============================================================================
the profile's                 replaces
===========================  ==============================================================================
``intra`` collectives         ``DeviceSpec.intra_bandwidth``, ``intra_latency_s`` (the joint fit of every kind)
``inter`` collectives         ``DeviceSpec.inter_bandwidth``, ``inter_latency_s``
bf16 matmuls (``tp = 1``)     the matmul efficiency at the model's hidden size (x the step factor once
                              ``steps`` are fitted); on a device with no catalogue peak, also
                              ``peak_bf16_flops`` (the fastest matmul timed)
HBM copies                    ``DeviceSpec.hbm_bandwidth`` (no training plan reads it: it changes nothing there)
===========================  ==============================================================================

Nothing else: HBM capacity, devices per node, the FP8 ratio and the memory model stay as they were. A profile
for another device kind is refused (:func:`~meshplan.pure.cluster.check_profile_device`). :class:`ProfilePricing`
is what the plan's request records, and what its header prints.

**The loop closed** (:func:`refine_profile`): ``meshplan measure`` rows are
:class:`~meshplan.pure.cluster.StepTiming` records; appended to the profile they fit one step factor (a *fit*, one
parameter, stated with its leave-one-out error as the *check*), so the next plan prices steps, not bare matmuls.

Example:
  >>> from meshplan.pure.cluster import CollectiveTiming, MachineProfile, parse_cluster
  >>> rows = tuple(CollectiveTiming("intra", "all-gather", 8, b, 7e-5 + 0.875 * b / 2e11) for b in (2**20, 2**26))
  >>> p = MachineProfile("NVIDIA H100 80GB HBM3", "gpu", 8, 1, (), "2026-01-02T03:04:05Z", collectives=rows)
  >>> cluster, efficiency, used = profiled_cluster(parse_cluster("64x8xH100"), p, hidden=8192)
  >>> round(cluster.device.intra_bandwidth / 1e9), cluster.device.inter_bandwidth == 50e9, efficiency
  (200, True, None)
  >>> print(used.kept[0])
  inter link: the catalogue's (the profile measured no link between hosts)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.pure._check import as_count, as_real, as_record, as_sequence, as_str
from meshplan.pure.cluster._cluster import Cluster
from meshplan.pure.cluster._devices import DeviceSpec
from meshplan.pure.cluster._machine import check_profile_device
from meshplan.pure.cluster._profile import MachineProfile, StepTiming
from meshplan.pure.cost._profile_fit import LinkFit, MatmulFit, StepFit, fit_link, fit_matmuls, fit_steps
from meshplan.pure.errors import MeshplanTypeError, PlanError, ProfileError

__all__ = ["ProfileFigures", "ProfilePricing", "profile_document", "profile_figures", "profiled_cluster",
           "profiled_device", "refine_profile"]


@dataclasses.dataclass(frozen=True, slots=True)
class ProfileFigures:
    """Every figure a profile's timings give (fits, see :mod:`meshplan.pure.cost._profile_fit`).

    Attributes:
      intra, inter: the joint link fits (``None``: no timings on that link).
      per_kind: a fit per link and collective kind (reported; the plan prices the joint fit).
      matmul: the bf16 matmul efficiency (``None``: none timed).
      hbm_bandwidth: bytes/s read plus written by the largest copy timed (``None``: none).
      steps: the step factor fitted to measured steps (``None``: none measured).
      unfitted: ``(link, why)`` for each link whose timings could not be fitted (its figure stays the
        catalogue's, and the plan says why).
    """

    intra: LinkFit | None
    inter: LinkFit | None
    per_kind: tuple[LinkFit, ...]
    matmul: MatmulFit | None
    hbm_bandwidth: float | None
    steps: StepFit | None
    unfitted: tuple[tuple[str, str], ...] = ()

    def efficiency_at(self, hidden: int) -> float | None:
        """The efficiency a model of this hidden size is priced at: the matmul figure x the step factor."""
        if self.matmul is None:
            return None
        scale = 1.0 if self.steps is None else self.steps.scale
        return min(self.matmul.at(hidden) * scale, 1.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what ``meshplan profile`` writes under ``figures``, for readers)."""
        return {"intra": None if self.intra is None else self.intra.to_dict(),
                "inter": None if self.inter is None else self.inter.to_dict(),
                "per_kind": [f.to_dict() for f in self.per_kind],
                "matmul": None if self.matmul is None else self.matmul.to_dict(),
                "hbm_bandwidth": self.hbm_bandwidth,
                "steps": None if self.steps is None else self.steps.to_dict(),
                "unfitted": {link: why for link, why in self.unfitted}}


def _check_profile(profile: Any) -> MachineProfile:
    if not isinstance(profile, MachineProfile):
        raise MeshplanTypeError(f"profile={profile!r:.60} must be a MachineProfile (meshplan.load_profile(path)).")
    return profile


def profile_figures(profile: MachineProfile, *, peak_bf16_flops: float | None = None) -> ProfileFigures:
    """Fit every figure of ``profile`` (efficiencies against ``peak_bf16_flops``, or the fastest matmul timed).

    A link whose timings cannot be fitted (one size, times that do not grow with the bytes) is left out and
    named in ``unfitted``; the rest still fit.

    Raises:
      MeshplanTypeError: not a :class:`~meshplan.pure.cluster.MachineProfile`.

    Example:
      >>> from meshplan.pure.cluster import MachineProfile, MemoryTiming
      >>> p = MachineProfile("cpu", "cpu", 8, 1, (), "2026-01-02T03:04:05Z", memory=(MemoryTiming(2**26, 0.01),))
      >>> round(profile_figures(p).hbm_bandwidth / 1e9, 2), profile_figures(p).intra
      (13.42, None)
    """
    profile = _check_profile(profile)
    links: dict[str, LinkFit | None] = {}
    unfitted = []
    for link in ("intra", "inter"):
        try:
            links[link] = fit_link(profile.collectives, link) if profile.has_link(link) else None
        except ProfileError as err:  # one size, or times that do not grow: this link keeps the catalogue's
            links[link] = None
            unfitted.append((link, str(err).removesuffix(".")))
    kinds = sorted({(c.link, c.kind) for c in profile.collectives})
    per_kind = []
    for link, kind in kinds:
        try:
            per_kind.append(fit_link(profile.collectives, link, kind))
        except ProfileError:  # one size of that kind: the joint fit still has it
            continue
    matmul = fit_matmuls(profile.matmuls, peak_bf16_flops)
    hbm = max(profile.memory, key=lambda m: (m.nbytes, -m.seconds)).bandwidth if profile.memory else None
    steps = fit_steps(profile.steps, matmul.at) if matmul is not None else None
    return ProfileFigures(links["intra"], links["inter"], tuple(per_kind), matmul, hbm, steps, tuple(unfitted))


def _texts(value: Any, what: str) -> tuple[str, ...]:
    return tuple(as_str(v, f"{what}[{i}]", error=PlanError) for i, v in enumerate(as_sequence(value, what)))


@dataclasses.dataclass(frozen=True, slots=True)
class ProfilePricing:
    """Which profile priced a plan, when it was measured, and which figures it replaced or left alone.

    Attributes:
      profile_id: :attr:`~meshplan.pure.cluster.MachineProfile.id`.
      device_kind: the kind it was measured on.
      device_count: how many devices it timed.
      measured_at: when (ISO 8601 UTC).
      replaced: one line per figure the profile gave (``"intra link 200 GB/s, 7 us (fit over 6 timings)"``).
      kept: one line per figure left at the catalogue's, with why.
      efficiency: the matmul efficiency priced (``None``: the catalogue's curve, or one given by the caller).
    """

    profile_id: str
    device_kind: str
    device_count: int
    measured_at: str
    replaced: tuple[str, ...]
    kept: tuple[str, ...]
    efficiency: float | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in ("profile_id", "device_kind", "measured_at"):
            if not isinstance(getattr(self, name), str):
                problems.append(f"{name}={getattr(self, name)!r:.40} must be a str")
        if problems:
            raise MeshplanTypeError("ProfilePricing: " + "; ".join(problems) + ".")
        object.__setattr__(self, "device_count", as_count(self.device_count, "device_count", error=PlanError))
        object.__setattr__(self, "replaced", _texts(self.replaced, "replaced"))
        object.__setattr__(self, "kept", _texts(self.kept, "kept"))
        if self.efficiency is not None:
            value = as_real(self.efficiency, "efficiency", error=PlanError)
            if value > 1:
                raise PlanError(f"efficiency={value!r} must be a fraction in (0, 1].")
            object.__setattr__(self, "efficiency", value)

    @property
    def text(self) -> str:
        """The plan header's line: the profile, when, what it priced and what it left at the catalogue's."""
        head = f"{self.profile_id} ({self.device_count} x {self.device_kind}, measured {self.measured_at})"
        parts = [f"from the profile: {'; '.join(self.replaced)}" if self.replaced else "the profile gave no figure"]
        if self.kept:
            parts.append("; ".join(self.kept))
        return f"{head}: " + ". ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; :meth:`from_dict` inverts it."""
        out = dataclasses.asdict(self)
        out["replaced"], out["kept"] = list(self.replaced), list(self.kept)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfilePricing:
        """Inverse of :meth:`to_dict`."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**as_record(data, "ProfilePricing", fields=names, required=names[:-1], error=PlanError))


def _link_text(name: str, fit: LinkFit) -> str:
    return (f"{name} link {fit.bandwidth / 1e9:.3g} GB/s, {fit.latency * 1e6:.3g} us (fit over {fit.rows} timings, "
            f"the worst {fit.max_error:.0%} off)")


def profiled_device(device: DeviceSpec, profile: MachineProfile, *, hidden: int,
                    efficiency: float | None = None) -> tuple[DeviceSpec, float | None, ProfilePricing]:
    """``device`` with the profile's figures, the efficiency to price with, and the record (module docstring).

    Args:
      device: the catalogue's device (or the XLA:CPU one).
      profile: a profile measured on that kind of device.
      hidden: the model's hidden size (the matmul efficiency is a function of it).
      efficiency: the caller's own efficiency, which wins over the profile's (and is said so).

    Raises:
      ProfileError: a profile for another device kind.
      MeshplanTypeError: wrong types.
    """
    profile = _check_profile(profile)
    if not isinstance(device, DeviceSpec):
        raise MeshplanTypeError(f"device={device!r:.60} must be a DeviceSpec.")
    check_profile_device(profile, device)
    h = as_count(hidden, "hidden", error=PlanError)
    figures = profile_figures(profile, peak_bf16_flops=device.peak_bf16_flops)
    changes: dict[str, Any] = {}
    replaced: list[str] = []
    kept: list[str] = []
    unfitted = dict(figures.unfitted)
    for name, fit in (("intra", figures.intra), ("inter", figures.inter)):
        if fit is None:
            why = ("the profile measured no link between hosts" if name == "inter" else
                   "the profile timed no collective")
            if name in unfitted:
                why = f"the profile's timings could not be fitted: {unfitted[name]}"
            kept.append(f"{name} link: the catalogue's ({why})")
            continue
        changes[f"{name}_bandwidth"], changes[f"{name}_latency_s"] = fit.bandwidth, fit.latency
        replaced.append(_link_text(name, fit))
    priced = None
    if figures.matmul is None:
        kept.append("matmul efficiency: the catalogue's curve (the profile timed no bf16 matmul)")
    else:
        if device.peak_bf16_flops is None:
            changes["peak_bf16_flops"] = figures.matmul.peak
            replaced.append(f"peak {figures.matmul.peak / 1e12:.3g} TFLOP/s bf16 (the fastest matmul timed: "
                            f"{device.name} has no datasheet peak)")
        priced = figures.efficiency_at(h)
        measured = any(p[0] == h for p in figures.matmul.points)
        how = f"measured at hidden {h}" if measured else f"on the profile's curve at hidden {h}"
        if figures.steps is not None:
            how += (f", x {figures.steps.scale:.3g} fitted to {figures.steps.rows} measured steps"
                    + (f" (leave-one-out within {figures.steps.loo_max_error:.0%})"
                       if figures.steps.loo_max_error is not None else ""))
        else:
            how += "; matmuls alone, no measured step refines it: an optimistic compute time"
        if efficiency is not None:
            kept.append(f"matmul efficiency: the {efficiency:.3g} given (the profile's {priced:.3g} {how})")
            priced = None
        else:
            replaced.append(f"matmul efficiency {priced:.3g} ({how})")
    if figures.hbm_bandwidth is not None:
        changes["hbm_bandwidth"] = figures.hbm_bandwidth
        replaced.append(f"HBM {figures.hbm_bandwidth / 1e9:.3g} GB/s read + write")
    used = ProfilePricing(profile.id, profile.device_kind, profile.device_count, profile.measured_at,
                          tuple(replaced), tuple(kept), priced)
    return dataclasses.replace(device, **changes), priced, used


def profiled_cluster(cluster: Cluster, profile: MachineProfile, *, hidden: int,
                     efficiency: float | None = None) -> tuple[Cluster, float | None, ProfilePricing]:
    """``cluster`` priced by ``profile``: :func:`profiled_device` on its device, the shape unchanged.

    Returns:
      ``(cluster, efficiency, pricing)``: the efficiency is the profile's (``None`` where it gives none, or the
      caller gave one: pass the caller's on).
    """
    if not isinstance(cluster, Cluster):
        raise MeshplanTypeError(f"cluster={cluster!r:.60} must be a Cluster.")
    device, priced, used = profiled_device(cluster.device, profile, hidden=hidden, efficiency=efficiency)
    return dataclasses.replace(cluster, device=device), priced, used


def refine_profile(profile: MachineProfile, steps: Sequence[StepTiming]) -> MachineProfile:
    """``profile`` with measured steps added (deduplicated by model, mesh, batch and seq: the newest wins).

    Rows must come from plans this profile priced (``meshplan measure --profile FILE``), so their exposed
    communication is the profile's; catalogue-priced rows are refused, naming both ids.

    Raises:
      ProfileError: a row priced by another profile or by the catalogue.
      MeshplanTypeError: not a profile / rows.

    Example:
      >>> from meshplan.pure.cluster import MachineProfile
      >>> p = MachineProfile("cpu", "cpu", 8, 1, (), "2026-01-02T03:04:05Z")
      >>> row = StepTiming("m", 64, "fsdp=8", 8, 32, 3, 0.2, 0.19, 0.21, None, "", 0.1, 0.1, 0.0, 0.5, 10, None,
      ...                  profile_id=p.id)
      >>> refined = refine_profile(p, [row])
      >>> len(refined.steps), refined.id == p.id
      (1, True)
    """
    profile = _check_profile(profile)
    rows = as_sequence(steps, "steps")
    for i, row in enumerate(rows):
        if not isinstance(row, StepTiming):
            raise MeshplanTypeError(f"steps[{i}]={row!r:.60} must be a StepTiming (a meshplan measure row).")
        if row.profile_id != profile.id:
            by = f"profile {row.profile_id}" if row.profile_id else "the catalogue's figures"
            raise ProfileError(f"steps[{i}] ({row.mesh}) was priced by {by}, not by this profile "
                               f"{profile.id}; measure with --profile so its communication is priced alike.")
    merged = {(s.model, s.mesh, s.batch, s.seq): s for s in (*profile.steps, *rows)}
    return dataclasses.replace(profile, steps=tuple(merged[k] for k in sorted(merged)))


def profile_document(profile: MachineProfile, *, peak_bf16_flops: float | None = None) -> dict[str, Any]:
    """The profile's JSON document with its fitted ``figures`` beside the timings (readers' copy; the reader
    ignores them and refits).

    Example:
      >>> from meshplan.pure.cluster import MachineProfile
      >>> sorted(profile_document(MachineProfile("cpu", "cpu", 8, 1, (), "2026-01-02T03:04:05Z"))["figures"])
      ['hbm_bandwidth', 'inter', 'intra', 'matmul', 'per_kind', 'steps', 'unfitted']
    """
    profile = _check_profile(profile)
    return {**profile.to_dict(), "figures": profile_figures(profile, peak_bf16_flops=peak_bf16_flops).to_dict()}
