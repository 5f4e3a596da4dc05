"""XLA's memory figures for one compiled step (:class:`CompiledMemory`): plain data, no compiler.

:func:`meshplan.compiled_memory` fills one from ``compiled.memory_analysis()`` and the buffer-assignment
report; the verification's rows, the compile cache and the renderers read it without starting a compiler.
"""

from __future__ import annotations

import dataclasses

from meshplan.pure._format import fmt_bytes
from meshplan.pure.xla._buffer_report import LiveBuffer

__all__ = ["CompiledMemory"]


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledMemory:
    """XLA's memory figures for one compiled step, per device.

    Attributes:
      argument_bytes: inputs (parameters, optimizer state, batch) on one device.
      output_bytes: outputs on one device.
      alias_bytes: outputs that reuse donated input buffers (counted in both above).
      temp_bytes: temporaries of the program (activations, gradients, collectives' buffers).
      peak_bytes: the most live at once; see ``peak_source``.
      peak_source: ``"peak_memory_in_bytes"`` when XLA's figure is used, else how it was derived.
      reported_peak_bytes: XLA's ``peak_memory_in_bytes`` as reported (0 where absent).
      generated_code_bytes: the compiled program's size.
      host_temp_bytes: temporaries in host memory (host-offloaded remat), 0 without.
      platform: ``"cpu"``, ``"tpu"``, ``"gpu"``.
      device_kind: e.g. ``"TPU v5 lite"``.
      num_devices: devices the step runs on.
      compile_seconds: lowering plus compilation time.
      largest: the biggest buffers in device memory live at the step where it is
        fullest (the moment ``peak_bytes`` reports), biggest first
        (:class:`~meshplan.pure.xla.LiveBuffer`: name, bytes, shape, dtype,
        kind, source), read from XLA's buffer-assignment dump; ``()`` where there
        is none, and ``largest_note`` says why.
      largest_note: where ``largest`` comes from, or why it is empty.

    Example:
      >>> gib = 2**30
      >>> m = CompiledMemory(argument_bytes=4 * gib, output_bytes=4 * gib, alias_bytes=4 * gib, temp_bytes=gib,
      ...                    peak_bytes=5 * gib, peak_source="peak_memory_in_bytes", reported_peak_bytes=5 * gib,
      ...                    generated_code_bytes=0, host_temp_bytes=0, platform="cpu", device_kind="cpu",
      ...                    num_devices=1, compile_seconds=0.1)
      >>> m.resident_bytes == 4 * gib
      True
      >>> m.describe()
      'peak 5.0 GiB (arguments 4.0 GiB, temp 1.0 GiB, outputs 4.0 GiB, aliased 4.0 GiB) on 1 x cpu'
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    peak_bytes: int
    peak_source: str
    reported_peak_bytes: int
    generated_code_bytes: int
    host_temp_bytes: int
    platform: str
    device_kind: str
    num_devices: int
    compile_seconds: float
    largest: tuple[LiveBuffer, ...] = ()
    largest_note: str = ""

    @property
    def resident_bytes(self) -> int:
        """Arguments plus outputs that do not reuse them: what stays allocated around the step."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes

    def describe(self) -> str:
        """``'peak 12.1 GiB (arguments 4.0 GiB, temp 8.1 GiB, outputs 4.0 GiB, aliased 4.0 GiB) on 4 x TPU v5 lite'``."""
        return (f"peak {fmt_bytes(self.peak_bytes)} (arguments {fmt_bytes(self.argument_bytes)}, temp "
                f"{fmt_bytes(self.temp_bytes)}, outputs {fmt_bytes(self.output_bytes)}, aliased "
                f"{fmt_bytes(self.alias_bytes)}) on {self.num_devices} x {self.device_kind}")
