"""How to read the compiler's own output: pure parsers of the text XLA writes. The collectives of an optimized
HLO module with their bytes (:func:`parse_hlo_collectives`, :func:`collective_totals`) and the buffer
assignment's live buffers at the peak (:func:`parse_buffer_report`). Text in, plain records out; the facade
asks the compiler for the text. XLA's memory figures for a compiled step as a record (:class:`CompiledMemory`),
and what a compiled figure means for a run: a deviceless XLA:GPU peak's measured range on the GPU
(:func:`deviceless_gpu_run_range`). The scheduled program a device runs, with its ops' FLOPs and bytes, its
async collectives and loops (:func:`read_schedule`), and XLA's own step floor (:func:`xla_floor`).

Example:
  >>> hlo = '''ENTRY %main (p: bf16[4,8]) -> bf16[32,8] {
  ...   %p = bf16[4,8]{1,0} parameter(0)
  ...   ROOT %ag = bf16[32,8]{1,0} all-gather(%p), replica_groups=[1,8]<=[8], dimensions={0}
  ... }'''
  >>> [(c.kind, c.nbytes, c.group_size) for c in parse_hlo_collectives(hlo)]
  [('all-gather', 512, 8)]
"""

from meshplan.pure.xla._buffer_report import BUFFER_KINDS, BufferReport, LiveBuffer, parse_buffer_report
from meshplan.pure.xla._compiled_memory import CompiledMemory
from meshplan.pure.xla._hlo_collectives import (
    HLO_COLLECTIVE_KINDS,
    HloCollective,
    collective_shares,
    collective_totals,
    parse_hlo_collectives,
    ratio_table,
)
from meshplan.pure.xla._run_range import DEVICELESS_GPU_RUN_RATIO, deviceless_gpu_run_range
from meshplan.pure.xla._schedule import read_schedule
from meshplan.pure.xla._schedule_records import (
    OP_KINDS,
    ProgramTotals,
    ScheduledCollective,
    ScheduledComputation,
    ScheduledOp,
    ScheduledProgram,
)
from meshplan.pure.xla._xla_floor import XLA_TPU_UNPRICED, xla_floor

__all__ = ["BUFFER_KINDS", "DEVICELESS_GPU_RUN_RATIO", "BufferReport", "CompiledMemory", "HLO_COLLECTIVE_KINDS",
           "HloCollective", "LiveBuffer", "collective_shares", "collective_totals", "deviceless_gpu_run_range", "parse_buffer_report",
           "parse_hlo_collectives", "ratio_table"]
# the scheduled program: ops in order with FLOPs and bytes, async collectives, loops; XLA's own floor
__all__ += ["OP_KINDS", "ProgramTotals", "ScheduledCollective", "ScheduledComputation", "ScheduledOp",
            "ScheduledProgram", "XLA_TPU_UNPRICED", "read_schedule", "xla_floor"]
