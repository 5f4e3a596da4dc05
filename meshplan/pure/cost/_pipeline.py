"""Pipeline parallelism priced: layers per stage, what each stage holds, the bubble and the stage-boundary sends.

A ``pp``-way pipeline splits the decoder layers into ``pp`` stages, one per
group of devices along the ``pp`` mesh axis; a batch is split into ``m``
micro-batches that flow through the stages. Everything here is shape
arithmetic over plain numbers; every figure is an **estimate** (the exact
memory of a pipelined step is the compiler's:
:func:`meshplan.facade.verify._pipeline_step.pipeline_step` compiles one).

**Layers per stage.** ``L`` layers over ``pp`` stages: ``L // pp`` each, and
the ``L % pp`` extra layers go to stages ``1, 2, ...`` in order, the first
stage last: stage 0 also holds the embedding and the last stage the head, so
the extras go first to the stages that hold neither (then the last, then the
first). Which stage is fullest is then read from the bytes, not assumed.

**Schedules** (``m`` micro-batches, ``v`` virtual stages per device):

- ``"gpipe"`` (Huang et al. 2019): all forwards, then all backwards; each
  stage keeps the activations of all ``m`` micro-batches. Bubble
  ``(pp-1)/(m+pp-1)``.
- ``"1f1b"`` (PipeDream-Flush; Narayanan et al. 2021, sec. 2.2.1): after a
  warm-up of ``pp - s - 1`` forwards stage ``s`` alternates one forward and one
  backward, so it keeps at most ``pp - s`` micro-batches (``pp`` on the first
  stage). Same bubble as GPipe.
- ``"interleaved"`` (Megatron-LM's interleaved 1F1B, sec. 2.2.2): each device
  runs ``v`` chunks of ``L/(pp*v)`` layers; bubble ``(pp-1)/(v*m+pp-1)``. Chunks
  in flight on stage ``s``: Megatron's warm-up ``(pp-s-1)*2 + (v-1)*pp`` plus
  one (``schedules.py``, ``forward_backward_pipelining_with_interleaving``),
  at most ``v*m``; each chunk is ``1/v`` of the stage's layers. With ``v = 1``
  it is plain 1F1B (Megatron interleaves only with ``v >= 2``).
- ``"circular"`` (MaxText's circular pipeline, the schedule the pipelined
  reference step runs): ``v`` repeats around the ring in GPipe order under
  autodiff, bubble ``(pp-1)/(v*m+pp-1)``. Needs ``m >= pp``. Its loop runs
  ``v*m + pp - 1`` iterations of ``1/v`` of the stage's layers and autodiff
  keeps every iteration's saved inputs, the bubble's included: ``m + (pp-1)/v``
  micro-batches of the stage's activations.
- ``"dualpipe"`` (DeepSeek-V3 report sec. 3.2.1; ``deepseek-ai/DualPipe``
  README): micro-batches enter from both ends, so device ``s`` holds stages
  ``s`` and ``pp-1-s`` (2x parameters) and keeps ``pp + 1`` micro-batches of a
  stage's activations. Published bubble ``(pp/2-1)(F&B + B - 3W)`` with ``F``
  a forward chunk, ``B`` a full backward, ``W`` its weight half and ``F&B`` an
  overlapped forward-and-backward pair. Priced with ``F = W = 1, B = 2``
  (backward twice the forward, split evenly between input and weight
  gradients) and ``F&B = F + B`` (the pair saves communication, not FLOPs):
  ``2(pp/2-1)`` units against ``3m`` of compute, fraction
  ``(pp-2)/(3m+pp-2)``. DualPipe needs ``pp`` even and ``m`` even and
  ``>= 2 pp`` (``dualpipe.py`` asserts both). Its F&B pairs run one
  micro-batch's communication under another's compute: :func:`pipeline_time`
  takes that communication as ``overlap`` and hides it.

**What a schedule keeps** (:func:`schedule_memory`, bytes per device on top of
one micro-batch's step). Megatron's schedules (gpipe, 1f1b, interleaved) and
DualPipe keep their :func:`in_flight` micro-batches of saved activations and
send one micro-batch at a time (DualPipe's second stage's state is
:func:`plan_stages`' and the search's, not a buffer). The circular step
(:func:`meshplan.facade.verify._pipeline_step.pipeline_step`) also keeps, read off its
code: three whole-batch ``(m, micro_batch, seq, hidden)`` buffers (the loop reads
the micro-batched input and carries the circular store and the output buffer
whole; the backward carries their three cotangents) and two micro-batches of
the ring (the backward's carried cotangent of ``incoming`` and the reverse
``ppermute``'s new one); the stage's weights as residuals: with ``v > 1`` each
iteration's slice (the repeat index is traced, so the slice is a per-iteration
residual), ``(v*m + pp - 1) / v`` copies of the stage's layer weights, with
``v = 1`` one (the static slice, hoisted out of the loop as one residual); and
the iteration the backward is differentiating: its saved inputs sliced out of
the stacked ones, ``1/v`` of a micro-batch's, and with ``v > 1`` its weight
slice too.

Every schedule here needs ``m >= pp`` (fewer micro-batches leave stages idle
for the whole step; MaxText and Megatron refuse them too). The circular one
needs ``pp * v`` to divide the layers; the interleaved one needs ``v`` to
divide the fullest stage's layers, so an uneven split whose lighter stages
hold a layer less in one chunk runs too (Llama 3 405B: 126 layers over 16
stages, 7 on the first and last, 8 elsewhere, Llama 3 paper sec. 3.3.2). Its
bubble is the even split's: the critical path is the fullest stage's chunks.

**Stage-boundary sends.** Each micro-batch crosses every boundary forward (its
activations, ``micro_batch x seq x hidden x itemsize`` bytes) and backward (the
same bytes of gradient), ``v*pp - 1`` boundaries with ``v`` chunks per device.
A send costs ``latency + bytes / bandwidth`` on the link it crosses (a point-to-
point transfer, no ring: :class:`~meshplan.pure.cluster.Link`'s one-direction
bandwidth). In the steady state a stage's sends overlap its compute; the fill
and the drain are not hidden, so ``2 * (pp - 1)`` sends are **exposed** (the
first micro-batch's forward into the last stage, the last one's backward back
to the first).

**Gradient sync** per stage: each stage reduces only its own layers'
gradients, over the data axes only (``pp`` holds different layers, so it takes
no part): a ring all-reduce of the stage's gradient bytes over ``data_ways``
devices, once per step, after the last backward (exposed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

from meshplan.pure._check import as_choice, as_count, as_real
from meshplan.pure.cluster._link import Link, check_link
from meshplan.pure.cost._collective_time import all_reduce_time
from meshplan.pure.errors import MeshplanTypeError, PlanError

__all__ = [
    "SCHEDULES",
    "PipelinePlan",
    "PipelineTime",
    "ScheduleMemory",
    "bubble_fraction",
    "in_flight",
    "pipeline_time",
    "plan_stages",
    "schedule_memory",
    "send_bytes",
    "send_time",
    "stage_layers",
]

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "circular", "dualpipe")
"""The schedules priced here, in a fixed order (see the module docstring)."""

_VIRTUAL = ("interleaved", "circular")
MAX_LAYERS = 1_000_000  # bounds absurd inputs before any arithmetic


def _schedule(schedule: object) -> str:
    return as_choice(schedule, "schedule", SCHEDULES, error=PlanError)


def _check_schedule(num_layers: int, stages: int, micro_batches: int, schedule: str, virtual: int) -> None:
    """Every reason ``(L, pp, m, schedule, v)`` cannot run, collected and raised once."""
    problems = []
    if stages > num_layers:
        problems.append(f"pp={stages} stages for num_layers={num_layers}: pp must be in [1, {num_layers}]")
    if micro_batches < stages:
        problems.append(f"micro_batches={micro_batches} must be >= pp={stages} (valid: {stages} or more)")
    if schedule not in _VIRTUAL and virtual != 1:
        problems.append(f"virtual={virtual} needs schedule 'interleaved' or 'circular', not {schedule!r}")
    if schedule == "circular" and stages <= num_layers and num_layers % (stages * virtual):
        valid = [d for d in range(1, num_layers // stages + 1) if num_layers % (stages * d) == 0]
        problems.append(f"num_layers={num_layers} must divide by pp={stages} x virtual={virtual} for "
                        f"{schedule!r}; virtual stages that divide: {valid or 'none'}")
    if schedule == "interleaved" and stages <= num_layers:
        fullest = max(stage_layers(num_layers, stages))
        if fullest % virtual:
            valid = [d for d in range(1, fullest + 1) if fullest % d == 0]
            problems.append(f"virtual={virtual} must divide the fullest stage's {fullest} layers (num_layers="
                            f"{num_layers} over pp={stages}) for 'interleaved'; virtual stages that divide: {valid}")
    problems += _dualpipe_problems(stages, micro_batches, schedule)
    if problems:
        raise PlanError("pipeline: " + "; ".join(problems) + ".")


def _dualpipe_problems(stages: int, micro_batches: int, schedule: str) -> list[str]:
    """DualPipe's own conditions (``dualpipe.py``: ``num_ranks % 2 == 0``, ``num_chunks % 2 == 0 and >= 2 ranks``)."""
    if schedule != "dualpipe":
        return []
    out = []
    if stages % 2:
        out.append(f"pp={stages} must be even for 'dualpipe' (its two directions pair stage s with pp-1-s)")
    if micro_batches % 2 or micro_batches < 2 * stages:
        out.append(f"micro_batches={micro_batches} must be even and >= 2 x pp={2 * stages} for 'dualpipe' "
                   f"(valid: {2 * stages}, {2 * stages + 2}, ...)")
    return out


def _counts(num_layers: object, stages: object, micro_batches: object, virtual: object) -> tuple[int, int, int, int]:
    return (as_count(num_layers, "num_layers", maximum=MAX_LAYERS, error=PlanError),
            as_count(stages, "pp", maximum=MAX_LAYERS, error=PlanError),
            as_count(micro_batches, "micro_batches", maximum=10**12, error=PlanError),
            as_count(virtual, "virtual", maximum=MAX_LAYERS, error=PlanError))


def stage_layers(num_layers: int, stages: int) -> tuple[int, ...]:
    """Decoder layers on each of ``stages`` stages; the extras to stages 1, 2, ... and the first stage last.

    Args:
      num_layers: the model's decoder layers (>= 1).
      stages: ``pp``, in ``[1, num_layers]``.

    Returns:
      One count per stage, summing to ``num_layers``, differing by at most one.

    Raises:
      PlanError: more stages than layers, or a count < 1.
      MeshplanTypeError: a count that is not an int.

    Example:
      >>> stage_layers(10, 4)
      (2, 3, 3, 2)
    """
    n = as_count(num_layers, "num_layers", maximum=MAX_LAYERS, error=PlanError)
    pp = as_count(stages, "pp", maximum=MAX_LAYERS, error=PlanError)
    if pp > n:
        raise PlanError(f"pp={pp} stages for num_layers={n}: pp must be in [1, {n}].")
    base, extra = divmod(n, pp)
    order = [*range(1, pp), 0]  # who gets an extra layer first: neither embedding nor head, then the head
    gets = set(order[:extra])
    return tuple(base + (s in gets) for s in range(pp))


def bubble_fraction(stages: int, micro_batches: int, *, schedule: str = "1f1b", virtual: int = 1) -> float:
    """The idle share of the step: ``(pp-1)/(m+pp-1)``, ``(pp-1)/(v*m+pp-1)`` interleaved / circular, or
    ``(pp-2)/(3m+pp-2)`` DualPipe (see the module docstring for its F, B, W reading).

    Example:
      >>> bubble_fraction(4, 8), bubble_fraction(4, 8, schedule="interleaved", virtual=2)
      (0.2727272727272727, 0.15789473684210525)
      >>> bubble_fraction(4, 8, schedule="dualpipe")
      0.07692307692307693
    """
    pp = as_count(stages, "pp", maximum=MAX_LAYERS, error=PlanError)
    m = as_count(micro_batches, "micro_batches", maximum=10**12, error=PlanError)
    v = as_count(virtual, "virtual", maximum=MAX_LAYERS, error=PlanError)
    sched = _schedule(schedule)
    if m < pp:
        raise PlanError(f"micro_batches={m} must be >= pp={pp} (valid: {pp} or more).")
    if sched not in _VIRTUAL and v != 1:
        raise PlanError(f"virtual={v} needs schedule 'interleaved' or 'circular', not {sched!r}.")
    problems = _dualpipe_problems(pp, m, sched)
    if problems:
        raise PlanError("pipeline: " + "; ".join(problems) + ".")
    if sched == "dualpipe":  # (pp/2-1)(F&B + B - 3W) with F = W = 1, B = 2, F&B = F + B: 2(pp/2-1) of 3m
        return (pp - 2) / (3 * m + pp - 2)
    return (pp - 1) / (v * m + pp - 1)


def in_flight(stages: int, micro_batches: int, *, schedule: str = "1f1b", virtual: int = 1) -> tuple[float, ...]:
    """Micro-batches of each stage's activations live at its peak, in units of the whole stage's layers.

    Circular: every one of the ``v*m + pp - 1`` loop iterations keeps ``1/v`` of the stage's layers'
    saved inputs, the bubble's iterations too (they compute on placeholders): ``m + (pp-1)/v``.

    Example:
      >>> in_flight(4, 8, schedule="gpipe"), in_flight(4, 8)
      ((8.0, 8.0, 8.0, 8.0), (4.0, 3.0, 2.0, 1.0))
      >>> in_flight(4, 8, schedule="interleaved", virtual=2), in_flight(4, 8, schedule="circular", virtual=2)
      ((5.5, 4.5, 3.5, 2.5), (9.5, 9.5, 9.5, 9.5))
    """
    pp = as_count(stages, "pp", maximum=MAX_LAYERS, error=PlanError)
    m = as_count(micro_batches, "micro_batches", maximum=10**12, error=PlanError)
    v = as_count(virtual, "virtual", maximum=MAX_LAYERS, error=PlanError)
    sched = _schedule(schedule)
    bubble_fraction(pp, m, schedule=sched, virtual=v)  # the same refusals
    if sched == "gpipe":
        return tuple(float(m) for _ in range(pp))
    if sched == "dualpipe":  # the README's "Activation Per Device: PP+1", on every device (an upper bound)
        return tuple(float(min(pp + 1, m)) for _ in range(pp))
    if sched == "circular":
        return tuple((v * m + pp - 1) / v for _ in range(pp))
    if sched == "1f1b" or v == 1:  # Megatron interleaves only with v >= 2; one chunk is plain 1F1B
        return tuple(float(min(pp - s, m)) for s in range(pp))
    return tuple(min((pp - s - 1) * 2 + (v - 1) * pp + 1, v * m) / v for s in range(pp))


FRAMEWORKS = {"gpipe": "GPipe", "1f1b": "Megatron-LM", "interleaved": "Megatron-LM",
              "circular": "MaxText, meshplan's step", "dualpipe": "DeepSeek's DualPipe"}
"""Who runs each schedule: the label a priced layout's verdict carries."""

WHOLE_BATCH_BUFFERS = {"gpipe": 0, "1f1b": 0, "interleaved": 0, "circular": 3, "dualpipe": 0}
"""Whole-batch ``(m, micro_batch, seq, hidden)`` buffers a stage keeps: the circular step's micro-batched
input, circular store and output buffer (their cotangents in the backward); Megatron's none."""

RING_BUFFERS = {"gpipe": 0, "1f1b": 0, "interleaved": 0, "circular": 2, "dualpipe": 0}
"""Micro-batch-sized buffers of the circular loop's ring in the backward (the carried cotangent of
``incoming`` and the reverse ``ppermute``'s); Megatron's are not priced (0)."""


class ScheduleMemory(NamedTuple):
    """What one stage's schedule keeps on top of one micro-batch's step (bytes per device; estimates).

    Attributes:
      saved: every micro-batch's saved activations the schedule keeps (``in_flight x`` one micro-batch's).
      buffers: whole-batch and ring buffers (``WHOLE_BATCH_BUFFERS x m + RING_BUFFERS`` one micro-batch's
        stage inputs).
      weights: weight copies kept for the backward (circular: one slice per iteration with ``v > 1``, the
        hoisted static slice with ``v = 1``).
      current: the circular backward's copy of the iteration it differentiates, sliced out of ``saved``
        (``1/v`` of a micro-batch's) and, with ``v > 1``, of ``weights`` (``1/v`` of the stage's layers);
        Megatron's :func:`in_flight` counts the current micro-batch: 0.
    """

    saved: int
    buffers: int
    weights: int
    current: int = 0

    @property
    def total(self) -> int:
        """``saved + buffers + weights + current``."""
        return self.saved + self.buffers + self.weights + self.current


def schedule_memory(stages: int, micro_batches: int, *, saved_bytes: int, input_bytes: int, weight_bytes: int,
                    schedule: str = "1f1b", virtual: int = 1) -> tuple[ScheduleMemory, ...]:
    """Each stage's activation, buffer and weight-copy bytes under ``schedule`` (see the module docstring).

    Args:
      stages, micro_batches, schedule, virtual: the schedule (as :func:`in_flight`).
      saved_bytes: one micro-batch's saved activations of all the stage's layers (per device).
      input_bytes: one micro-batch's stage input, ``micro_batch x seq x hidden x itemsize`` (per device).
      weight_bytes: the stage's layer weights in the compute dtype (per device).

    Returns:
      One :class:`ScheduleMemory` per stage.

    Raises:
      PlanError: a schedule that cannot run, or negative byte counts.
      MeshplanTypeError: values of the wrong type.

    Example:
      >>> [tuple(s) for s in schedule_memory(4, 4, saved_bytes=32, input_bytes=16, weight_bytes=64,
      ...                                    schedule="circular", virtual=2)][:1]
      [(176, 224, 352, 48)]
      >>> schedule_memory(4, 8, saved_bytes=32, input_bytes=16, weight_bytes=64)[0]
      ScheduleMemory(saved=128, buffers=0, weights=0, current=0)
    """
    flight = in_flight(stages, micro_batches, schedule=schedule, virtual=virtual)
    saved, inp, weights = (as_count(x, name, minimum=0, maximum=10**18, error=PlanError)
                           for x, name in ((saved_bytes, "saved_bytes"), (input_bytes, "input_bytes"),
                                           (weight_bytes, "weight_bytes")))
    sched, m, v = _schedule(schedule), int(micro_batches), int(virtual)
    buffers = (WHOLE_BATCH_BUFFERS[sched] * m + RING_BUFFERS[sched]) * inp
    copies, current = 0.0, 0
    if sched == "circular":
        # The traced repeat index makes each iteration's weight slice (1/v of the stage's layers) a
        # residual; with v = 1 the slice is static, hoisted out of the loop: one residual copy.
        copies = (v * m + stages - 1) / v if v > 1 else 1.0
        current = round(saved / v + (weights / v if v > 1 else 0))
    return tuple(ScheduleMemory(round(f * saved), buffers, round(copies * weights), current) for f in flight)


def send_bytes(micro_batch: int, seq: int, hidden: int, itemsize: int) -> int:
    """Bytes one micro-batch's activations take across one stage boundary (one direction).

    Example:
      >>> send_bytes(1, 4096, 8192, 2)
      67108864
    """
    dims = [as_count(x, name, maximum=10**12, error=PlanError)
            for x, name in ((micro_batch, "micro_batch"), (seq, "seq"), (hidden, "hidden"), (itemsize, "itemsize"))]
    return dims[0] * dims[1] * dims[2] * dims[3]


def send_time(nbytes: float, link: Link) -> float:
    """One point-to-point send: ``latency + bytes / bandwidth`` (seconds).

    Example:
      >>> send_time(1e9, Link(bandwidth=50e9, latency=1e-5))
      0.02001
    """
    b = as_real(nbytes, "nbytes", allow_zero=True, error=PlanError)
    ln = check_link(link)
    return ln.latency + b / ln.bandwidth


@dataclasses.dataclass(frozen=True, slots=True)
class PipelinePlan:
    """What each stage holds (estimates; exact per-stage memory is a compile away).

    Attributes:
      schedule, micro_batches, virtual: the schedule priced.
      layers: decoder layers per stage.
      param_bytes: parameter bytes per stage (its layers, plus the embedding on
        the first stage and the head on the last), before any other axis splits them;
        with ``"dualpipe"`` per device: stages ``s`` and ``pp-1-s`` together.
      state_bytes: params + grads + optimizer state per stage (``state_factor x param_bytes``).
      activation_bytes: activations live at the stage's peak (``in_flight x`` its layers' bytes).
      fullest: the stage with the most state plus activation bytes (the lowest index on a tie).
      bubble: the idle share of the step.
    """

    schedule: str
    micro_batches: int
    virtual: int
    layers: tuple[int, ...]
    param_bytes: tuple[int, ...]
    state_bytes: tuple[int, ...]
    activation_bytes: tuple[int, ...]
    fullest: int
    bubble: float

    @property
    def stages(self) -> int:
        """``pp``."""
        return len(self.layers)

    def total_bytes(self, stage: int) -> int:
        """State plus activation bytes of ``stage`` (``0 <= stage < stages``).

        Raises:
          PlanError: no such stage; MeshplanTypeError: ``stage`` is not an int.
        """
        stage = as_count(stage, "stage", minimum=0, maximum=self.stages - 1, error=PlanError,
                         hint=f"the stages are 0 to {self.stages - 1}")
        return self.state_bytes[stage] + self.activation_bytes[stage]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; :meth:`from_dict` inverts it exactly."""
        return {f.name: (list(v) if isinstance(v, tuple) else v)
                for f in dataclasses.fields(self) for v in (getattr(self, f.name),)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PipelinePlan:
        """Inverse of :meth:`to_dict` (a saved plan read back).

        Example:
          >>> p = plan_stages(4, 2, micro_batches=2, layer_param_bytes=1, embed_param_bytes=1,
          ...                 head_param_bytes=1, layer_activation_bytes=1)
          >>> PipelinePlan.from_dict(p.to_dict()) == p
          True
        """
        if not isinstance(data, Mapping):
            raise MeshplanTypeError(f"pipeline={data!r:.80} must be a mapping (PipelinePlan.to_dict()).")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise PlanError(f"pipeline plan {dict(data)!r:.80} lacks {missing}.")
        try:
            return cls(schedule=as_choice(data["schedule"], "schedule", SCHEDULES, error=PlanError),
                       micro_batches=as_count(data["micro_batches"], "micro_batches", error=PlanError),
                       virtual=as_count(data["virtual"], "virtual", error=PlanError),
                       layers=tuple(as_count(x, "layers", error=PlanError) for x in data["layers"]),
                       param_bytes=tuple(as_count(x, "param_bytes", minimum=0, error=PlanError)
                                         for x in data["param_bytes"]),
                       state_bytes=tuple(as_count(x, "state_bytes", minimum=0, error=PlanError)
                                         for x in data["state_bytes"]),
                       activation_bytes=tuple(as_count(x, "activation_bytes", minimum=0, error=PlanError)
                                              for x in data["activation_bytes"]),
                       fullest=as_count(data["fullest"], "fullest", minimum=0, error=PlanError),
                       bubble=as_real(data["bubble"], "bubble", allow_zero=True, error=PlanError))
        except TypeError as err:  # a number where a list belongs: not iterable
            raise MeshplanTypeError(f"pipeline plan {dict(data)!r:.80}: {err}.") from None

    @property
    def text(self) -> str:
        """One line: ``'pp=4 1f1b m=8 bubble 27% layers 2/3/3/2'``."""
        v = f" v={self.virtual}" if self.virtual > 1 else ""
        return (f"pp={self.stages} {self.schedule}{v} m={self.micro_batches} bubble {self.bubble:.0%} "
                f"layers {'/'.join(map(str, self.layers))}")


def plan_stages(num_layers: int, stages: int, *, micro_batches: int, layer_param_bytes: int,
                embed_param_bytes: int, head_param_bytes: int, layer_activation_bytes: int,
                state_factor: float = 1.0, schedule: str = "1f1b", virtual: int = 1) -> PipelinePlan:
    """The per-stage plan of a ``pp``-stage pipeline (see the module docstring).

    Args:
      num_layers: decoder layers.
      stages: ``pp`` (1 is the unpipelined step: one stage holding everything).
      micro_batches: ``m``, at least ``pp``.
      layer_param_bytes: one decoder layer's parameter bytes.
      embed_param_bytes: the embedding's (first stage); head_param_bytes: the
        final norm and output head's (last stage; 0 when tied and not duplicated).
      layer_activation_bytes: one micro-batch's activations kept by one layer for the backward.
      state_factor: state bytes per parameter byte (bf16 params + bf16 grads + two fp32 Adam moments: 6).
      schedule: one of :data:`SCHEDULES`.
      virtual: ``v``, chunks per device (interleaved / circular only).

    Returns:
      A :class:`PipelinePlan`.

    Raises:
      PlanError: more stages than layers, fewer micro-batches than stages, an
        unknown schedule, or ``v`` that does not fit, naming the values and the valid range.
      MeshplanTypeError: values of the wrong type.

    Example:
      >>> p = plan_stages(10, 4, micro_batches=8, layer_param_bytes=100, embed_param_bytes=150,
      ...                 head_param_bytes=150, layer_activation_bytes=10)
      >>> p.layers, p.param_bytes, p.fullest, p.text
      ((2, 3, 3, 2), (350, 300, 300, 350), 0, 'pp=4 1f1b m=8 bubble 27% layers 2/3/3/2')
    """
    n, pp, m, v = _counts(num_layers, stages, micro_batches, virtual)
    sched = _schedule(schedule)
    _check_schedule(n, pp, m, sched, v)
    layer_b, embed_b, head_b, act_b = (
        as_count(x, name, minimum=0, maximum=10**18, error=PlanError)
        for x, name in ((layer_param_bytes, "layer_param_bytes"), (embed_param_bytes, "embed_param_bytes"),
                        (head_param_bytes, "head_param_bytes"), (layer_activation_bytes, "layer_activation_bytes")))
    factor = as_real(state_factor, "state_factor", error=PlanError)
    layers = stage_layers(n, pp)
    params = tuple(k * layer_b + (embed_b if s == 0 else 0) + (head_b if s == pp - 1 else 0)
                   for s, k in enumerate(layers))
    if sched == "dualpipe":  # device s runs stage s one way and stage pp-1-s the other: both stages' parameters
        params = tuple(params[s] + params[pp - 1 - s] for s in range(pp))
    state = tuple(round(p * factor) for p in params)
    flight = in_flight(pp, m, schedule=sched, virtual=v)
    acts = tuple(round(f * k * act_b) for f, k in zip(flight, layers, strict=True))
    totals = [a + b for a, b in zip(state, acts, strict=True)]
    fullest = totals.index(max(totals))  # the first of the fullest: deterministic
    return PipelinePlan(sched, m, v, layers, params, state, acts, fullest,
                        bubble_fraction(pp, m, schedule=sched, virtual=v))


@dataclasses.dataclass(frozen=True, slots=True)
class PipelineTime:
    """A pipelined step's time, split into its parts (seconds; estimates).

    Attributes:
      compute: the fullest stage's compute for all its micro-batches (forward and backward), less
        the communication the schedule overlaps (``overlap`` of :func:`pipeline_time`).
      bubble: idle time at fill and drain: ``compute x bubble / (1 - bubble)``.
      sends: the exposed stage-boundary sends (fill and drain: ``2 * (pp - 1)``).
      sends_total: every send one stage makes in a step (overlapped with compute in the steady state).
      grad_sync: the fullest stage's gradient all-reduce over the data axes.
      total: ``compute + bubble + sends + grad_sync``.
    """

    compute: float
    bubble: float
    sends: float
    sends_total: float
    grad_sync: float

    @property
    def total(self) -> float:
        """The step: compute, bubble, exposed sends and the gradient sync."""
        return self.compute + self.bubble + self.sends + self.grad_sync


def pipeline_time(stage_compute: float, stages: int, micro_batches: int, *, boundary_bytes: int,
                  boundary_link: Link, stage_grad_bytes: int, data_ways: int, data_link: Link,
                  schedule: str = "1f1b", virtual: int = 1, overlap: float = 0.0) -> PipelineTime:
    """Price a pipelined step from its fullest stage's compute (see the module docstring).

    Args:
      stage_compute: seconds the fullest stage computes for the whole batch (all ``m`` micro-batches).
      stages, micro_batches, schedule, virtual: the schedule.
      boundary_bytes: one micro-batch's activation bytes across one boundary (:func:`send_bytes`).
      boundary_link: the link a stage boundary crosses (the network when ``pp`` spans nodes).
      stage_grad_bytes: the fullest stage's gradient bytes per device before the sync.
      data_ways: devices the gradients are reduced over (the data axes; 1: no sync).
      data_link: the link the data axes' ring runs at.
      overlap: seconds of ``stage_compute`` that are communication on the critical path of an
        unpipelined step which the schedule runs under another micro-batch's compute (``"dualpipe"``
        only: its overlapped forward-and-backward pairs hide the expert all-to-alls). At most half of
        ``stage_compute``: the pair hides one chunk's communication under the other's compute, so it
        cannot hide more than the compute that is left.

    Returns:
      A :class:`PipelineTime`.

    Raises:
      PlanError: a schedule that cannot run, or negative or non-finite figures.
      MeshplanTypeError: values of the wrong type.

    Example:
      >>> from meshplan.pure.cluster import Link
      >>> t = pipeline_time(1.0, 4, 8, boundary_bytes=10**8, boundary_link=Link(50e9, 0.0),
      ...                   stage_grad_bytes=10**9, data_ways=2, data_link=Link(50e9, 0.0))
      >>> round(t.bubble, 3), round(t.sends, 3), round(t.grad_sync, 3), round(t.total, 3)
      (0.375, 0.012, 0.02, 1.407)
      >>> t = pipeline_time(1.5, 4, 8, boundary_bytes=0, boundary_link=Link(50e9, 0.0), stage_grad_bytes=0,
      ...                   data_ways=1, data_link=Link(50e9, 0.0), schedule="dualpipe", overlap=0.5)
      >>> round(t.compute, 3), round(t.bubble, 3)
      (1.0, 0.083)
    """
    pp = as_count(stages, "pp", maximum=MAX_LAYERS, error=PlanError)
    m = as_count(micro_batches, "micro_batches", maximum=10**12, error=PlanError)
    v = as_count(virtual, "virtual", maximum=MAX_LAYERS, error=PlanError)
    compute = as_real(stage_compute, "stage_compute", allow_zero=True, error=PlanError)
    nbytes = as_count(boundary_bytes, "boundary_bytes", minimum=0, maximum=10**18, error=PlanError)
    grads = as_count(stage_grad_bytes, "stage_grad_bytes", minimum=0, maximum=10**18, error=PlanError)
    ways = as_count(data_ways, "data_ways", maximum=10**9, error=PlanError)
    hidden = as_real(overlap, "overlap", allow_zero=True, error=PlanError)
    frac = bubble_fraction(pp, m, schedule=schedule, virtual=v)
    if hidden and schedule != "dualpipe":
        raise PlanError(f"overlap={hidden!r} needs schedule 'dualpipe' (the only one priced with overlapped "
                        f"forward-and-backward pairs), not {schedule!r}; pass overlap=0.")
    if hidden > compute / 2:
        raise PlanError(f"overlap={hidden!r} s is more than half of stage_compute={compute!r} s: a pair can hide "
                        f"one chunk's communication only under the other's compute; cap it at {compute / 2!r}.")
    compute -= hidden
    one = send_time(nbytes, boundary_link) if pp > 1 else 0.0
    sync = float(all_reduce_time(grads, ways, check_link(data_link)))
    return PipelineTime(compute=compute, bubble=compute * frac / (1.0 - frac), sends=2 * (pp - 1) * one,
                        sends_total=2 * v * m * one, grad_sync=sync)

