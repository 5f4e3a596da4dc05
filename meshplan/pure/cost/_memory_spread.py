"""How far the compiler's peak has run from the analytic one: the spread an estimate is stated with.

The step-memory model (:mod:`meshplan.pure.cost._step_memory`) prices parameters, gradients and
optimizer state exactly and the rest (activations, or the update's temporaries) with coefficients fitted
to XLA's ``memory_analysis()``. The calibrated part is where it misses, and how far depends on what XLA's
scheduler keeps live together, which shapes do not show (two meshes that give every device the same shapes
can peak 2x apart: ``benchmarks/research/bench_memory_ceiling.py``). So an estimate is stated with the range of
``(exact peak - exact state) / calibrated part`` seen on the recorded compiles priced by the same
coefficients, remat policy and kind of attention (flash, or a form that materialises the scores), and a
peak with its bounds (:func:`peak_bounds`).

:data:`SPREADS` is measured, not chosen: ``benchmarks/bench_memory_spread.py --python`` prints it from
the rows in ``benchmarks/data/`` re-priced with today's model, and a test holds the two equal.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

from meshplan.pure._check import as_real
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.cost._estimates import MemoryBreakdown
from meshplan.pure.cost._recipe import ATTENTION_KINDS, TrainingRecipe
from meshplan.pure.cost._step_memory import CALIBRATIONS, calibration_key

__all__ = ["SPREADS", "Spread", "attention_class", "calibration_spread", "describe_spread", "outside_recorded",
           "peak_bounds"]


class Spread(NamedTuple):
    """What XLA's peak held beyond the exact state, over the calibrated part the model priced, on the
    recorded compiles of one calibration, remat policy and :func:`attention_class`.

    Attributes:
      low, high: the lowest and highest ratio, rounded outwards to hundredths.
      rows: how many recorded compiles.
    """

    low: float
    high: float
    rows: int


# benchmarks/bench_memory_spread.py --python, 2026-11-23 (the reference steps of
# bench_memory_calibration.py: GPT-2, Llama and Mixtral, scaled down and full size, AdamW, one micro-batch;
# the 16 x 256 TPU rows left out, see the script). No recorded compile uses remat "dots".
SPREADS: dict[tuple[str, str, str], Spread] = {
    ("cpu", "full", "scores"): Spread(0.36, 1.24, 27),
    ("cpu", "none", "scores"): Spread(0.58, 1.09, 25),
    ("gpu", "full", "scores"): Spread(0.76, 1.47, 63),
    ("gpu", "none", "scores"): Spread(0.88, 1.11, 63),
    ("tpu-v5p", "full", "flash"): Spread(0.55, 1.63, 39),
    ("tpu-v5p", "full", "scores"): Spread(0.8, 1.33, 38),
    ("tpu-v5p", "none", "flash"): Spread(0.82, 1.13, 32),
    ("tpu-v5p", "none", "scores"): Spread(0.79, 1.08, 33),
    ("tpu-v5p", "offload", "flash"): Spread(1.01, 1.02, 1),
    ("tpu-v6e", "full", "flash"): Spread(0.43, 1.98, 34),
    ("tpu-v6e", "full", "scores"): Spread(0.66, 1.46, 32),
    ("tpu-v6e", "none", "flash"): Spread(0.84, 1.12, 32),
    ("tpu-v6e", "none", "scores"): Spread(0.81, 1.09, 32),
    ("tpu-v6e", "offload", "flash"): Spread(1.01, 1.78, 3),
    ("tpu-v6e", "offload", "scores"): Spread(1.11, 1.66, 2),
}


# The accelerator each calibration's recorded compiles ran on or were compiled for (XLA:CPU: simulated devices).
_MEASURED_ON = {"tpu-v6e": "v6e", "tpu-v5p": "v5p", "gpu": "H200"}


def attention_class(attention: str) -> str:
    """``"flash"`` for the fused kernels, ``"scores"`` for the forms that materialise fp32 scores (plain and
    XLA's ``dot_product_attention``, which compile to the same peak): what a spread is kept apart by.

    Example:
      >>> attention_class("flash"), attention_class("dot_product")
      ('flash', 'scores')
    """
    if not isinstance(attention, str) or attention not in ATTENTION_KINDS:
        raise PlanError(f"attention={attention!r:.60}: use one of {list(ATTENTION_KINDS)}.")
    return "flash" if attention == "flash" else "scores"


def _check_recipe(recipe: object) -> None:
    """Refuse anything but a :class:`TrainingRecipe` with a typed error (its fields are read next)."""
    if not isinstance(recipe, TrainingRecipe):
        raise MeshplanTypeError(f"recipe={recipe!r:.80} must be a TrainingRecipe, not {type(recipe).__name__}.")


def _measured_key(key: str) -> str:
    """The calibration whose recorded compiles measure ``key``'s coefficients: ``"tpu"`` (v4, v5e and a TPU
    recipe without a device) is priced with v6e's coefficients, so v6e's compiles are what say how they miss.
    """
    for other in sorted(CALIBRATIONS):
        if other != key and CALIBRATIONS[other] is CALIBRATIONS[key] and any(k == other for k, _, _ in SPREADS):
            return other
    return key


def calibration_spread(recipe: TrainingRecipe) -> tuple[str, Spread] | None:
    """The recorded :class:`Spread` for the coefficients, remat policy and attention class ``recipe`` is
    priced with, and the calibration it was measured on; ``None`` where no recorded compile used them.

    Example:
      >>> calibration_spread(TrainingRecipe(remat="full", attention="flash", device="v6e"))
      ('tpu-v6e', Spread(low=0.43, high=1.98, rows=34))
      >>> calibration_spread(TrainingRecipe(remat="full", device="v5e"))[0]  # v6e's coefficients, v6e's compiles
      'tpu-v6e'
      >>> calibration_spread(TrainingRecipe(remat="dots")) is None
      True
    """
    _check_recipe(recipe)
    key, kind = calibration_key(recipe), attention_class(recipe.attention)
    if (key, recipe.remat, kind) not in SPREADS:
        key = _measured_key(key)
    found = SPREADS.get((key, recipe.remat, kind))
    return None if found is None else (key, found)


def outside_recorded(recipe: TrainingRecipe) -> tuple[str, ...]:
    """What ``recipe`` prices that no recorded compile of :data:`SPREADS` ran: they all used AdamW with fp32
    moments, bf16 weights, compute and gradients, no master weights, one micro-batch and the loss in one
    piece, so a spread says nothing about those choices.

    Example:
      >>> outside_recorded(TrainingRecipe(optimizer="lion", micro_batches=4))
      ('optimizer lion', '4 micro-batches')
      >>> outside_recorded(TrainingRecipe(remat="none", attention="flash"))
      ()
    """
    _check_recipe(recipe)
    grads = recipe.grad_dtype or recipe.weight_dtype
    checks = ((recipe.optimizer != "adamw", f"optimizer {recipe.optimizer}"),
              (recipe.optimizer_dtype != "float32", f"optimizer state {recipe.optimizer_dtype}"),
              (recipe.weight_dtype != "bfloat16", f"weights {recipe.weight_dtype}"),
              (recipe.compute_dtype != "bfloat16", f"compute {recipe.compute_dtype}"),
              (grads != "bfloat16", f"grads {grads}"),
              (recipe.master_weights, "master weights"),
              (recipe.micro_batches > 1, f"{recipe.micro_batches} micro-batches"),
              (recipe.vocab_tiles > 1, f"{recipe.vocab_tiles} vocab tiles"))
    return tuple(text for differs, text in checks if differs)


def describe_spread(recipe: TrainingRecipe) -> str:
    """One sentence saying how far the compiler's peak has run from the estimate for ``recipe``.

    Example:
      >>> where, held = describe_spread(TrainingRecipe(remat="full", device="v6e")).split(", ")
      >>> where
      'on 32 recorded XLA:TPU v6e compiles with remat full and fp32 scores (plain or dot_product attention)'
      >>> held
      'the peak held 0.66-1.46x the calibrated part beyond the exact state'
      >>> describe_spread(TrainingRecipe(remat="none", device="v5e")).split("state ")[1]
      "(v5e has no compiled grid: it is priced with v6e's coefficients)"
      >>> describe_spread(TrainingRecipe(remat="dots", attention="flash"))
      'no recorded compile with remat dots and flash attention checks these coefficients'
    """
    _check_recipe(recipe)
    kind = ("flash attention" if attention_class(recipe.attention) == "flash" else
            "fp32 scores (plain or dot_product attention)")
    found = calibration_spread(recipe)
    if found is None:
        return f"no recorded compile with remat {recipe.remat} and {kind} checks these coefficients"
    key, s = found
    compiler = key.partition("-")[0]
    device = _MEASURED_ON.get(key, "")
    where = f"XLA:{compiler.upper()}" + (f" {device}" if device else "")
    compiles = "compile" if s.rows == 1 else "compiles"
    text = (f"on {s.rows} recorded {where} {compiles} with remat {recipe.remat} and {kind}, the peak held "
            f"{s.low:.2f}-{s.high:.2f}x the calibrated part beyond the exact state")
    if device and recipe.device is not None and recipe.device != device:
        text += f" ({recipe.device} has no compiled grid: it is priced with {device}'s coefficients)"
    outside = outside_recorded(recipe)
    if outside:
        text += (f" (all with AdamW, bf16 weights and one micro-batch; this recipe's {', '.join(outside)} "
                 f"{'is' if len(outside) == 1 else 'are'} outside them)")
    return text


def peak_bounds(memory: MemoryBreakdown, spread: Spread) -> tuple[int, int]:
    """``memory``'s peak with its calibrated part (activations, or the update's temporaries) scaled by the
    lowest and the highest recorded ratio: the range the recorded compiles put the compiler's peak in.

    Example:
      >>> m = MemoryBreakdown(params=10, grads=10, optimizer=40, activations=100, budget=200)
      >>> peak_bounds(m, Spread(0.5, 1.5, 3)), m.total
      ((110, 210), 160)
    """
    if not isinstance(memory, MemoryBreakdown):
        raise MeshplanTypeError(f"memory={memory!r:.80} must be a MemoryBreakdown (a candidate's .memory), not "
                                f"{type(memory).__name__}.")
    if not isinstance(spread, Spread):
        raise MeshplanTypeError(f"spread={spread!r:.80} must be a Spread (calibration_spread(recipe)[1]), not "
                                f"{type(spread).__name__}.")
    low, high = (as_real(v, f"spread.{n}", allow_zero=True, error=PlanError) for n, v in (("low", spread.low),
                                                                                      ("high", spread.high)))
    if low > high:
        raise PlanError(f"spread={spread!r} has low > high; a spread runs from its lowest ratio to its highest.")
    state = memory.total - memory.activations
    # Exact rational products: a float product of a huge ratio and a huge byte count overflows, and
    # rounding in floats could put a bound one byte inside the range it states.
    return (state + math.floor(Fraction(low) * memory.activations),
            state + math.ceil(Fraction(high) * memory.activations))
