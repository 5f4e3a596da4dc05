"""How finely the step-time estimate can tell two layouts apart: its measured error against published runs.

The estimate is checked, not fitted, against the published training runs in ``benchmarks/bench_published.py``
and ``benchmarks/bench_megatron_table2.py`` (torchtitan, MaxText, Megatron-LM, DeepSpeed ZeRO-3, Llama 3,
DeepSeek-V3: each run's own layout, recipe and hardware). The median of ``|ln(predicted / published)|`` over
those runs is the estimate's resolution: two layouts whose predicted steps differ by less than it are not told
apart by the model, so a plan shows them as tied with the best rather than ranked to a tenth of a percent
(:func:`~meshplan.pure.search.order_ties`). The ratios behind the figure are recorded in
``benchmarks/data/published_step_ratios.jsonl`` (``python benchmarks/bench_published.py --record``), and a test
holds this constant to their median.

Example:
  >>> round(resolution_percent(), 1)
  8.7
"""

from __future__ import annotations

import math

from meshplan.pure._check import as_real
from meshplan.pure.errors import PlanError

__all__ = ["STEP_TIME_RESOLUTION", "resolution_percent"]

STEP_TIME_RESOLUTION = 0.083
"""The median ``|ln(predicted / published step)|`` over the 24 published runs recorded (8 unpipelined and 4
pipelined in ``bench_published.py``, the 12 rows of Megatron-LM's Table 2, DeepSpeed ZeRO-3's included): the
estimate's resolution in log space, about 9% (0.097 before the XLA:GPU overlap rule was fitted to compiled
programs, :mod:`meshplan.pure.cost._overlap`)."""


def resolution_percent(resolution: float = STEP_TIME_RESOLUTION) -> float:
    """The resolution as the percent a reader reads (``exp(r) - 1``, in percent).

    Example:
      >>> round(resolution_percent(0.2), 1)
      22.1

    Raises:
      PlanError: a resolution that is negative, not finite or past 10 (a factor of e**10: no resolution).
    """
    r = as_real(resolution, "resolution", allow_zero=True, error=PlanError)
    if r > 10:
        raise PlanError(f"resolution={resolution!r} must be a log ratio in [0, 10].")
    return (math.exp(r) - 1) * 100
