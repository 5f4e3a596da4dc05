"""What a GPU run peaks at, given the peak XLA:GPU compiled for a described GPU with no GPU present.

A deviceless compile (the jax CUDA plugin and a ``GpuTargetConfigProto``, no device) is the compiler's
own figure, to the byte; but it cannot autotune, and on the GPU the autotuner may pick gemm algorithms
with bigger workspaces, and the allocator rounds and fragments. Measured on a lent H100 (jax 0.11.2,
six reference steps from 35 to 64 GiB, ``benchmarks/bench_deviceless_gpu.py``; RESULTS.md, "The
deviceless figure against the GPU itself"): the allocator's real peak was 1.000-1.058x the deviceless
peak. :data:`DEVICELESS_GPU_RUN_RATIO` rounds that up to 1.06; a verified plan checks the top of the
range against the budget, so a mesh it keeps does not run out of memory on a gemm workspace.

Example:
  >>> deviceless_gpu_run_range(50 * 2**30)
  (53687091200, 56908316672)
"""

from __future__ import annotations

from meshplan.pure._check import as_count
from meshplan.pure.errors import PlanError

__all__ = ["DEVICELESS_GPU_RUN_RATIO", "deviceless_gpu_run_range"]

_PERCENT = (100, 106)  # integer percentages: exact arithmetic on byte counts of any size
DEVICELESS_GPU_RUN_RATIO: tuple[float, float] = (_PERCENT[0] / 100, _PERCENT[1] / 100)
"""(least, most) real allocator peak over the deviceless compiled peak, as measured (1.000-1.058), rounded out."""


def deviceless_gpu_run_range(peak_bytes: int) -> tuple[int, int]:
    """The bytes a run on the GPU peaks at, from a deviceless XLA:GPU compile's peak.

    Args:
      peak_bytes: the compiled peak per device (>= 0).

    Returns:
      ``(low, high)``: ``peak_bytes`` and ``ceil(peak_bytes x 1.06)``.

    Raises:
      PlanError: a negative peak; MeshplanTypeError: not an int.

    Example:
      >>> deviceless_gpu_run_range(0), deviceless_gpu_run_range(100)
      ((0, 0), (100, 106))
    """
    peak = as_count(peak_bytes, "peak_bytes", minimum=0, maximum=10**18, error=PlanError)
    low, high = _PERCENT
    return -(-peak * low // 100), -(-peak * high // 100)  # ceil of each, in integers
