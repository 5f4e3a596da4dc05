"""A comparison's verdicts: options ranked by a criterion, the smallest that fits, and where scaling stops paying.

:func:`rank_options` orders options by ``"time"`` (cluster tokens per second,
highest first: the shortest time to train any token budget), ``"cost"`` (USD per
million tokens, lowest first; needs prices) or ``"tokens-per-device"`` (tokens per
second per device, highest first). Options where nothing fits come last, then
unpriced ones when ranking by cost; ties go to fewer devices, then the cluster
text, so every host ranks alike.

:func:`scaling_knees` walks each device kind's options in device order and reports,
between consecutive sizes that fit, the throughput gained against the device
ratio: its *scaling efficiency* ``(tokens_per_s_large / tokens_per_s_small) /
(devices_large / devices_small)``, the ratio of their costs per token at one price.
With one global batch for every option it is the step-time speedup over the device
ratio (strong scaling); with each option's own batch, the per-device throughput
kept (weak scaling). The *knee* is the last size before the first step whose
efficiency is below ``threshold`` (default 0.8: beyond it a token costs 25% more
for the extra speed): adding devices past it stops paying.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from meshplan.pure._check import as_count, as_real
from meshplan.pure.compare._option import CompareOption
from meshplan.pure.errors import CompareError, MeshplanTypeError

__all__ = ["CRITERIA", "DEFAULT_KNEE_THRESHOLD", "Comparison", "KindScaling", "ScalingStep", "build_comparison",
           "rank_options", "scaling_knees", "smallest_fitting"]

CRITERIA = ("time", "cost", "tokens-per-device")
"""What :func:`rank_options` ranks by."""

DEFAULT_KNEE_THRESHOLD = 0.8


def _options(options: Any) -> tuple[CompareOption, ...]:
    if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
        raise MeshplanTypeError(f"options={options!r:.60} must be a sequence of CompareOption.")
    out = tuple(options)
    bad = [o for o in out if not isinstance(o, CompareOption)]
    if bad:
        raise MeshplanTypeError(f"options hold {bad[0]!r:.60}; every item must be a CompareOption.")
    return out


def _key(option: CompareOption, by: str) -> tuple[Any, ...]:
    # Fewer devices, then the text; the rest only orders options a caller built twice for one cluster.
    tie = (option.devices, option.cluster, option.mesh, option.step_s, option.tokens_per_step,
           option.price_per_device_hour or 0.0, option.status, option.memory_bytes or 0)
    if not option.fits:
        return (2, 0.0, *tie)
    if by == "cost":
        cost = option.cost_per_million_tokens
        return (1, 0.0, *tie) if cost is None else (0, cost, *tie)
    score = option.tokens_per_s if by == "time" else option.tokens_per_s_per_device
    return (0, -score, *tie)


def rank_options(options: Sequence[CompareOption], by: str = "time") -> tuple[CompareOption, ...]:
    """``options`` best first by ``by`` (see the module docstring); those where nothing fits last.

    Args:
      options: the comparison's options.
      by: ``"time"``, ``"cost"`` or ``"tokens-per-device"``.

    Returns:
      The options reordered (a permutation: nothing dropped).

    Raises:
      CompareError: an unknown criterion, or ``"cost"`` with no option priced.
      MeshplanTypeError: ``options`` is not a sequence of CompareOption.

    Example:
      >>> a = CompareOption("1x8xH100", "H100", 8, True, "fsdp=8", "estimate", 1, 2, 2.0, 8192, 0.4)
      >>> b = CompareOption("2x8xH100", "H100", 16, True, "fsdp=16", "estimate", 1, 2, 1.2, 8192, 0.3)
      >>> [o.cluster for o in rank_options([a, b], "time")], [o.cluster for o in rank_options([a, b], "tokens-per-device")]
      (['2x8xH100', '1x8xH100'], ['1x8xH100', '2x8xH100'])
    """
    opts = _options(options)
    if not isinstance(by, str) or by not in CRITERIA:
        raise CompareError(f"--by {by!r:.40} must be one of {list(CRITERIA)}.")
    if by == "cost" and not any(o.price_per_device_hour is not None for o in opts):
        raise CompareError("--by cost needs prices: give --price KIND=USD_PER_DEVICE_HOUR for the kinds compared "
                           "(meshplan ships no price list).")
    return tuple(sorted(opts, key=lambda o: _key(o, by)))


def smallest_fitting(options: Sequence[CompareOption]) -> CompareOption | None:
    """The fitting option with the fewest devices (ties: the faster, then the cluster text); ``None`` if none fits.

    Example:
      >>> a = CompareOption("1x8xH100", "H100", 8, False, "", "none fits", None, 2, 0.0, 8192, 0.0)
      >>> b = CompareOption("2x8xH100", "H100", 16, True, "fsdp=16", "estimate", 1, 2, 1.2, 8192, 0.3)
      >>> smallest_fitting([a, b]).cluster
      '2x8xH100'
    """
    fitting = [o for o in _options(options) if o.fits]
    if not fitting:
        return None
    return min(fitting, key=lambda o: (o.devices, o.step_s, o.cluster))


@dataclasses.dataclass(frozen=True, slots=True)
class ScalingStep:
    """From one size of a device kind to the next that fits: the speedup against the device ratio.

    Attributes:
      small, large: the two clusters' texts.
      devices_small, devices_large: their device counts.
      speedup: ``tokens_per_s_large / tokens_per_s_small`` (``step_small / step_large`` at one global batch).
      efficiency: ``speedup / (devices_large / devices_small)``; also the cost per token of the small over the
        large option at one price per device-hour.
    """

    small: str
    large: str
    devices_small: int
    devices_large: int
    speedup: float
    efficiency: float

    @property
    def ratio(self) -> float:
        """``devices_large / devices_small``."""
        return self.devices_large / self.devices_small


@dataclasses.dataclass(frozen=True, slots=True)
class KindScaling:
    """One device kind's scaling across the compared sizes.

    Attributes:
      device: the catalogue device name.
      steps: consecutive fitting sizes, smallest first.
      knee: the cluster past which adding devices stops paying (``None``: every step paid, or fewer than two
        sizes fit).
      threshold: the efficiency below which a step does not pay.
    """

    device: str
    steps: tuple[ScalingStep, ...]
    knee: str | None
    threshold: float

    def describe(self) -> str:
        """One line: where the knee is and why, or that there is none."""
        if not self.steps:
            return f"{self.device}: fewer than two sizes fit; no scaling to read"
        if self.knee is None:
            worst = min(self.steps, key=lambda s: s.efficiency)
            return (f"{self.device}: every step pays (lowest scaling efficiency {worst.efficiency:.0%}, "
                    f"{worst.small} -> {worst.large}; threshold {self.threshold:.0%})")
        step = next(s for s in self.steps if s.small == self.knee)
        return (f"{self.device}: adding devices past {self.knee} stops paying: {step.small} -> {step.large} is "
                f"{step.speedup:.2f}x faster on {step.ratio:g}x the devices (scaling efficiency "
                f"{step.efficiency:.0%} < {self.threshold:.0%}; a token costs {1 / step.efficiency:.2f}x)")


def scaling_knees(options: Sequence[CompareOption], *,
                  threshold: float = DEFAULT_KNEE_THRESHOLD) -> tuple[KindScaling, ...]:
    """Per device kind (sorted by name), the scaling steps between fitting sizes and the knee.

    Args:
      options: the comparison's options (one global batch for all, so step times compare).
      threshold: the scaling efficiency in (0, 1] below which a step does not pay.

    Returns:
      One :class:`KindScaling` per device kind with at least one option.

    Raises:
      CompareError: ``threshold`` outside (0, 1].

    Example:
      >>> mk = lambda n, s: CompareOption(f"{n}x8xH100", "H100", 8 * n, True, "fsdp", "estimate", 1, 2, s, 8192, .4)
      >>> k = scaling_knees([mk(1, 8.0), mk(2, 4.1), mk(4, 3.0)])[0]
      >>> k.knee, [round(s.efficiency, 2) for s in k.steps]
      ('2x8xH100', [0.98, 0.68])
    """
    opts = _options(options)
    limit = as_real(threshold, "threshold", error=CompareError)
    if not 0 < limit <= 1:
        raise CompareError(f"threshold={threshold!r} must be a scaling efficiency in (0, 1].")
    out = []
    for device in sorted({o.device for o in opts}):
        sizes: dict[int, CompareOption] = {}
        for o in sorted((o for o in opts if o.device == device and o.fits),
                        key=lambda o: (o.devices, -o.tokens_per_s, o.cluster)):
            sizes.setdefault(o.devices, o)  # the faster option of a size (two shapes of one count)
        ordered = [sizes[n] for n in sorted(sizes)]
        steps = []
        for a, b in zip(ordered, ordered[1:]):
            speedup = b.tokens_per_s / a.tokens_per_s
            steps.append(ScalingStep(a.cluster, b.cluster, a.devices, b.devices, speedup,
                                     speedup / (b.devices / a.devices)))
        knee = next((s.small for s in steps if s.efficiency < limit), None)
        out.append(KindScaling(device, tuple(steps), knee, limit))
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class Comparison:
    """A finished comparison: the model, the ranked options and the verdicts the renderers show.

    Attributes:
      model: the model's name.
      batch: the one global batch in sequences every option runs (``None``: each option's own default, one
        sequence per device).
      seq: tokens per sequence.
      by: the ranking criterion.
      options: every option, ranked.
      smallest: the fitting option with the fewest devices (``None``: none fits).
      scaling: per device kind, the scaling steps and the knee.
      tokens: the token budget timed and priced (``None``: not asked).
      price_source: whose prices these are (``""``: none given).
      notes: lines every reader must see (what is estimated, what was not verified and why).
      seconds: wall time of the comparison (searches and compiles).
    """

    model: str
    batch: int | None
    seq: int
    by: str
    options: tuple[CompareOption, ...]
    smallest: CompareOption | None
    scaling: tuple[KindScaling, ...]
    tokens: int | None = None
    price_source: str = ""
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def best(self) -> CompareOption | None:
        """The top-ranked option that fits (``None``: none fits)."""
        return next((o for o in self.options if o.fits), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: one row per option (``rows``) and the verdicts."""
        return {"model": self.model, "batch": self.batch, "seq": self.seq, "by": self.by, "tokens": self.tokens,
                "price_source": self.price_source or None,
                "rows": [dict(o.to_dict(tokens=self.tokens), rank=i + 1) for i, o in enumerate(self.options)],
                "smallest_fitting": None if self.smallest is None else self.smallest.cluster,
                "best": None if self.best is None else self.best.cluster,
                "scaling": [{"device": k.device, "knee": k.knee, "threshold": k.threshold, "summary": k.describe(),
                             "steps": [dataclasses.asdict(s) for s in k.steps]} for k in self.scaling],
                "notes": list(self.notes), "seconds": self.seconds}



def build_comparison(model: str, batch: int | None, seq: int, options: Sequence[CompareOption], *,
                     by: str = "time",
                     tokens: int | None = None, price_source: str = "", notes: Sequence[str] = (),
                     seconds: float = 0.0, threshold: float = DEFAULT_KNEE_THRESHOLD) -> Comparison:
    """The :class:`Comparison` of ``options``: ranked by ``by``, the smallest that fits, the knees.

    Raises:
      CompareError: an unknown criterion, ``"cost"`` without prices, a bad threshold.

    Example:
      >>> a = CompareOption("1x8xH100", "H100", 8, True, "fsdp=8", "estimate", 1, 2, 2.0, 8192, 0.4)
      >>> build_comparison("gpt2", 8, 1024, [a]).smallest.cluster
      '1x8xH100'
    """
    if not isinstance(model, str):
        raise MeshplanTypeError(f"model={model!r:.60} must be the model's name (a str).")
    batch = None if batch is None else as_count(batch, "batch", error=CompareError)
    seq = as_count(seq, "seq", error=CompareError)
    tokens = None if tokens is None else as_count(tokens, "tokens", maximum=10**18, error=CompareError)
    if not isinstance(price_source, str):
        raise MeshplanTypeError(f"price_source={price_source!r:.40} must be a str.")
    if isinstance(notes, str) or not isinstance(notes, Sequence) or not all(isinstance(n, str) for n in notes):
        raise MeshplanTypeError(f"notes={notes!r:.60} must be a sequence of str.")
    seconds = as_real(seconds, "seconds", allow_zero=True, error=CompareError)
    ranked = rank_options(options, by)
    return Comparison(model, batch, seq, by, ranked, smallest_fitting(ranked),
                      scaling_knees(ranked, threshold=threshold), tokens, price_source, tuple(notes), seconds)
