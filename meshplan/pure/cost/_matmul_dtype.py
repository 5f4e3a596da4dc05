"""FP8 GEMMs: which matmuls a ``matmul_dtype="float8"`` recipe runs in FP8, at what peak and efficiency.

A ``TrainingRecipe(matmul_dtype="float8")`` step runs the matmuls of the layers' **weights** in FP8
(:attr:`~meshplan.pure.cost._flops.StepFlops.weight_matmuls`: the attention and MLP projections, the MoE
experts, their recompute and tp repeats) and everything else at bf16, as the FP8 training recipes do:

- torchao's ``Float8Linear`` (torchtitan's ``float8`` converter) swaps ``nn.Linear`` modules, and torchtitan
  leaves its head out (``module_filter_fn=lambda mod, fqn: fqn != "output"``); attention (SDPA) is no Linear;
- DeepSeek-V3 (report sec. 3.3.1) runs the Linear GEMMs in FP8 and keeps "the embedding module, the output
  head, MoE gating modules, normalization operators, and attention operators" in BF16 or FP32;
- Transformer Engine's ``fp8_autocast`` covers its Linear modules; FP8 attention is opt-in (``fp8_dpa``);
- MaxText's ``quantization: "fp8"`` quantizes its dense layers; "We do not quantize the logits matmul."

So the attention core (``Q K^T``, ``P V``), the output head (the logits) and the MoE dispatch/combine einsums
stay at the bf16 peak. The MoE router (gating) is counted with the weight matmuls, though DeepSeek keeps it in
bf16: it is ``hidden x experts`` per token, 0.3% of a DeepSeek-V3 MoE layer's weight matmuls (Mixtral's:
0.01%), not worth a FLOPs term of its own.

The FP8 matmuls run at ``peak_fp8_flops x efficiency x`` :data:`FP8_EFFICIENCY_RATIO`, ``efficiency`` being the
bf16 one in effect (the default curve or ``--efficiency``). MFU stays defined against the bf16 peak (the
model's FLOPs over ``step x devices x peak_bf16_flops``), as torchtitan computes it for its Float8 runs too, so
an FP8 step can show an MFU above what bf16 could sustain.

**Saved activations are unchanged.** DeepSeek-V3 caches a Linear's input in FP8 for its weight gradient and
Transformer Engine does too, but torchao's ``Float8Linear`` (today's ``matmul_with_hp_or_float8_args``) saves
the high-precision input and casts it again in the backward. Either way the memory model does not hold those
inputs apart: remat ``full`` saves the layer's bf16 input (a norm's input, no matmul's), ``offload`` nothing,
and ``none`` / ``dots`` price their saved tensors as one fitted multiple of named pieces
(:func:`~meshplan.pure.cost._step_memory.activation_parts`). Charging 1 byte for the matmul inputs among them
would need those pieces split and the coefficients refitted on FP8 compiles.

Example:
  >>> from meshplan.pure.cluster import DEVICE_SPECS
  >>> fp8_peak(DEVICE_SPECS["H100"], "float8"), fp8_peak(DEVICE_SPECS["H100"], "bfloat16")
  (1979000000000000.0, None)
"""

from __future__ import annotations

from meshplan.pure._check import as_choice
from meshplan.pure.cluster._devices import DEVICE_SPECS, DeviceSpec
from meshplan.pure.errors import MeshplanTypeError, PlanError

__all__ = ["FP8_EFFICIENCY_RATIO", "MATMUL_DTYPES", "fp8_peak"]

MATMUL_DTYPES: tuple[str, ...] = ("bfloat16", "float8")
"""The dtypes a recipe's weight matmuls run in: ``"bfloat16"`` (every matmul at the bf16 peak) or
``"float8"`` (the weight matmuls at the FP8 peak; see the module docstring)."""

FP8_EFFICIENCY_RATIO: float = 0.75
"""The fraction of its peak an FP8 weight matmul sustains, over the fraction a bf16 one does: an FP8 step's weight
matmuls run at ``peak_fp8_flops x FP8_EFFICIENCY_RATIO x`` the bf16 efficiency.

Measured: the median over nine projection shapes of real models (Llama 3 8B/70B/405B, DeepSeek-V3, GPT 145B; 8k-16k
tokens) of an FP8 GEMM with per-tensor dynamic scaling of both bf16 operands (amax, scale, cast to e4m3, cuBLASLt
FP8, unscale) against the bf16 GEMM, each as a fraction of its dense peak (1979 / 989 TFLOP/s): 0.752, range
0.47-0.90 (small ``n``, e.g. a 2048-wide expert, at the low end); the GEMM alone, operands already FP8: 0.66-0.89.
One H100 SXM, jax 0.11.2, ``benchmarks/bench_fp8_gemm.py``, rows in ``benchmarks/data/fp8_gemm_h100.jsonl``.

What it predicts, held out: the published FP8 runs (torchtitan Float8 70B, trainy 8B Float8, DeepSeek-V3) at 0.97-1.09
of their measured speed where the layout is unpipelined (``benchmarks/bench_published.py``). A plain-JAX step is
slower than that: the reference step with its linears swapped for FP8 ones (``benchmarks/bench_fp8_step.py``: the
same scaling, remat full) ran at 0.92-0.95 of its bf16 step on the H100 where this ratio predicts 0.74-0.79 -- the
casts, amax reductions and FP8 transposes XLA leaves unfused cost what the GEMMs save. The figure is a tuned FP8
stack's (Transformer Engine, torchao with ``torch.compile``, DeepGEMM)."""


def fp8_peak(device: DeviceSpec, matmul_dtype: str) -> float | None:
    """The peak FLOP/s the weight matmuls of a ``matmul_dtype`` step run at on ``device``: its
    ``peak_fp8_flops`` for ``"float8"``, ``None`` for ``"bfloat16"`` (they run at the bf16 peak).

    Args:
      device: the accelerator (:class:`~meshplan.pure.cluster.DeviceSpec`).
      matmul_dtype: one of :data:`MATMUL_DTYPES`.

    Returns:
      The FP8 peak, or ``None`` for bf16 matmuls.

    Raises:
      PlanError: ``"float8"`` on a device with no FP8 peak (naming the devices that have one), or an unknown
        ``matmul_dtype``.
      MeshplanTypeError: ``device`` is not a DeviceSpec.

    Example:
      >>> from meshplan.pure.cluster import DEVICE_SPECS
      >>> fp8_peak(DEVICE_SPECS["H200"], "float8") / 1e12
      1979.0
      >>> fp8_peak(DEVICE_SPECS["v5p"], "float8")
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.PlanError: matmul_dtype='float8' needs a device with FP8 matmul units: 'v5p' has no \
peak_fp8_flops. Devices with one: ['B200', 'GB200', 'H100', 'H20', 'H200', 'H800', 'MI300X', 'MI325X', 'tpu7x']; \
use matmul_dtype='bfloat16' there, or give the device its dense FP8 peak (DeviceSpec(..., peak_fp8_flops=...)).
    """
    if not isinstance(device, DeviceSpec):
        raise MeshplanTypeError(f"device={device!r:.80} must be a DeviceSpec, not {type(device).__name__}.")
    dtype = as_choice(matmul_dtype, "matmul_dtype", MATMUL_DTYPES, error=PlanError)
    if dtype == "bfloat16":
        return None
    if device.peak_fp8_flops is None:
        raise PlanError(f"matmul_dtype='float8' needs a device with FP8 matmul units: {device.name!r} has no "
                        f"peak_fp8_flops. Devices with one: {_fp8_devices()}; use matmul_dtype='bfloat16' there, "
                        "or give the device its dense FP8 peak (DeviceSpec(..., peak_fp8_flops=...)).")
    return device.peak_fp8_flops


def _fp8_devices() -> list[str]:
    """The names in :data:`DEVICE_SPECS` with an FP8 peak, sorted."""
    return sorted(name for name, spec in DEVICE_SPECS.items() if spec.peak_fp8_flops is not None)
