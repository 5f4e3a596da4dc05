"""What one HLO instruction costs a device: its matmul FLOPs, its other FLOPs, the bytes it reads and writes.

Used by the schedule reader (:mod:`meshplan.pure.xla._schedule`) on each instruction a device's
stream runs. Shapes in a partitioned (SPMD) module are per device, so every figure is per device.

**FLOPs** (2 per multiply-add), counted as XLA's ``HloCostAnalysis`` counts them:

- ``dot``: ``2 x output elements x contracted size`` (``lhs_contracting_dims``);
- ``convolution`` (XLA:TPU writes its matmuls as convolutions): 2 per multiply-add over the window
  positions that land on the input (not on padding or base-dilation holes);
- a fusion: the sum over the instructions it fuses, nested fusions included (a Triton gemm fusion's
  ``dot``, XLA:TPU's convolution fusions);
- cuBLAS calls (``__cublas$gemm``, ``__cublas$lt$matmul``, their FP8 forms): ``2 x batch x M x N x K``
  from the operands' shapes and the call's ``dot_dimension_numbers``;
- cuDNN fused attention (``__cudnn$fmha*``): the two batched matmuls of the forward,
  ``2 x B x H x Sq x Sk x (d_qk + d_v)``, the five of the backward (``3 d_qk + 2 d_v``: the scores
  recomputed, then dV, dP, dQ, dK), halved under a causal mask (cuDNN skips the masked blocks);
- everything else: one FLOP per output element for arithmetic (``elementwise``; ``reduce``: one per
  reduced element per reducer op), the figure XLA's base cost analysis gives. These are reported apart
  from the matmul FLOPs: a device runs them at memory speed, not at its matmul peak.

**Bytes** (what the roofline prices memory-bound work by), as XLA's cost analysis reads a fusion:
operands plus result, except that a fusion parameter read only through ``slice`` /
``dynamic-slice`` counts the slices it reads, the buffer a ``dynamic-update-slice`` updates in place
counts only the update written (the scan over stacked layers reads one layer's weights per trip, not
the stack), a value passed straight through to the fusion's result counts nothing, and
``bitcast`` / ``get-tuple-element`` / ``tuple`` / ``parameter`` / ``constant`` move no data.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

from meshplan.pure.xla._hlo_text import HloInstruction, HloModuleText, array_types, type_bytes

__all__ = ["CUBLAS_TARGETS", "FREE_OPCODES", "InstructionCost", "instruction_cost", "shape_table"]

CUBLAS_TARGETS: tuple[str, ...] = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")
"""The cuBLAS custom-call targets whose FLOPs are read from their operands and dimension numbers."""

FREE_OPCODES: frozenset[str] = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "partition-id", "replica-id", "after-all",
    "add-dependency", "opt-barrier", "domain", "get-dimension-size", "set-dimension-size"})
"""Opcodes that move no data and run no kernel: the plumbing of a program."""

_ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "remainder", "atan2", "and", "or",
    "xor", "not", "negate", "abs", "sign", "exponential", "exponential-minus-one", "log", "log-plus-one",
    "sqrt", "rsqrt", "cbrt", "tanh", "logistic", "sine", "cosine", "tan", "erf", "floor", "ceil",
    "round-nearest-afz", "round-nearest-even", "is-finite", "compare", "select", "clamp", "convert",
    "shift-left", "shift-right-logical", "shift-right-arithmetic", "popcnt", "count-leading-zeros", "real",
    "imag", "complex", "reduce-precision", "stochastic-convert"})
_TRANSCENDENTAL = frozenset({"exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt", "rsqrt",
                             "cbrt", "tanh", "logistic", "sine", "cosine", "tan", "erf", "power", "atan2"})
_SLICES = frozenset({"slice", "dynamic-slice"})
_CONTRACT = re.compile(r"\blhs_contracting_dims=\{([\d,]*)\}")


class InstructionCost:
    """Matmul FLOPs, other FLOPs and bytes read / written of one instruction (mutable while it is summed).

    Attributes:
      matmul: FLOPs of dots, convolutions, cuBLAS and cuDNN calls.
      other: XLA-counted FLOPs of the rest (elementwise and reductions); transcendental ops included.
      read: bytes read from memory.
      written: bytes written.
      notes: what could not be read (an unknown custom call, a dot whose operands are unknown).
      attention: whether the FLOPs are a cuDNN fused attention's.
    """

    __slots__ = ("matmul", "other", "read", "written", "notes", "attention")

    def __init__(self) -> None:
        self.matmul = 0.0
        self.other = 0.0
        self.read = 0
        self.written = 0
        self.notes: list[str] = []
        self.attention = False


def shape_table(module: HloModuleText) -> dict[str, str]:
    """Every instruction's result type by name (names are unique in a module).

    Example:
      >>> from meshplan.pure.xla._hlo_text import parse_module
      >>> shape_table(parse_module('''ENTRY %e () -> f32[2] {
      ...   ROOT %c = f32[2]{0} constant({1, 2})
      ... }'''))
      {'c': 'f32[2]{0}'}
    """
    return {i.name: i.shape for instrs in module.computations.values() for i in instrs}


def _dims(shapes: Mapping[str, str], name: str) -> tuple[int, ...] | None:
    arrays = array_types(shapes.get(name, ""))
    return arrays[0][1] if arrays else None


def _elements(shape: str) -> int:
    arrays = array_types(shape)
    return math.prod(arrays[0][1]) if arrays else 0


def _dot_flops(instr: HloInstruction, shapes: Mapping[str, str]) -> float | None:
    lhs = _dims(shapes, instr.operands[0]) if instr.operands else None
    m = _CONTRACT.search(instr.attrs)
    if lhs is None or m is None:
        return None
    width = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d and int(d) < len(lhs))
    return 2.0 * _elements(instr.shape) * width


def _convolution_flops(instr: HloInstruction, shapes: Mapping[str, str]) -> float | None:
    if len(instr.operands) < 2:
        return None
    lhs, rhs = _dims(shapes, instr.operands[0]), _dims(shapes, instr.operands[1])
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instr.attrs)
    out_arrays = array_types(instr.shape)
    if lhs is None or rhs is None or labels is None or not out_arrays:
        return None
    out = out_arrays[0][1]
    lhs_l, rhs_l, out_l = labels.groups()
    if len(lhs_l) != len(lhs) or len(rhs_l) != len(rhs) or len(out_l) != len(out) or "i" not in rhs_l:
        return None
    window = re.search(r"window=\{([^}]*)\}", instr.attrs)
    fields = dict(kv.split("=", 1) for kv in window.group(1).split() if "=" in kv) if window else {}
    spatial = sum(c.isdigit() for c in out_l)

    def per_dim(key: str, default: int) -> list[int]:
        return [int(x) for x in fields[key].split("x")] if key in fields else [default] * spatial

    stride, base, dilate = per_dim("stride", 1), per_dim("lhs_dilate", 1), per_dim("rhs_dilate", 1)
    low = [int(p.split("_")[0]) for p in fields["pad"].split("x")] if "pad" in fields else [0] * spatial
    positions = 1
    for k in range(spatial):
        d = str(k)
        n, o, w = lhs[lhs_l.index(d)], out[out_l.index(d)], rhs[rhs_l.index(d)]
        span = (n - 1) * base[k]
        positions *= sum(1 for a in range(o) for b in range(w)
                         if 0 <= (p := a * stride[k] + b * dilate[k] - low[k]) <= span and p % base[k] == 0)
    rest = math.prod(size for size, label in zip(out, out_l, strict=True) if not label.isdigit())
    # Grouped convolutions: the input feature dimension of the kernel is per group already.
    return 2.0 * positions * rest * rhs[rhs_l.index("i")]


def _backend_config(attrs: str) -> dict[str, object]:
    """The instruction's ``backend_config`` JSON object ({} when absent or unreadable)."""
    k = attrs.find("backend_config=")
    if k < 0:
        return {}
    text = attrs[k + len("backend_config="):]
    if text.startswith('"'):  # an escaped JSON string
        end = re.match(r'"((?:[^"\\]|\\.)*)"', text)
        text = end.group(1).encode().decode("unicode_escape") if end else ""
    depth = 0
    for j, ch in enumerate(text):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            try:
                loaded = json.loads(text[:j + 1])
            except ValueError:
                return {}
            return loaded if isinstance(loaded, dict) else {}
    return {}


def _ints(values: object) -> list[int]:
    return [int(v) for v in values] if isinstance(values, list) else []


def _cublas_flops(instr: HloInstruction, shapes: Mapping[str, str]) -> float | None:
    config = _backend_config(instr.attrs).get("gemm_backend_config")
    dnums = config.get("dot_dimension_numbers") if isinstance(config, dict) else None
    if not isinstance(dnums, dict) or len(instr.operands) < 2:
        return None
    lhs, rhs = _dims(shapes, instr.operands[0]), _dims(shapes, instr.operands[1])
    if lhs is None or rhs is None:
        return None
    lc, rc = _ints(dnums.get("lhs_contracting_dimensions")), _ints(dnums.get("rhs_contracting_dimensions"))
    lb, rb = _ints(dnums.get("lhs_batch_dimensions")), _ints(dnums.get("rhs_batch_dimensions"))
    if any(d >= len(lhs) for d in lc + lb) or any(d >= len(rhs) for d in rc + rb):
        return None
    batch = math.prod(lhs[d] for d in lb)
    k = math.prod(lhs[d] for d in lc)
    m = math.prod(s for d, s in enumerate(lhs) if d not in lc and d not in lb)
    n = math.prod(s for d, s in enumerate(rhs) if d not in rc and d not in rb)
    return 2.0 * batch * m * n * k


def _attention_flops(instr: HloInstruction, shapes: Mapping[str, str], target: str) -> float | None:
    config = _backend_config(instr.attrs).get("cudnn_fmha_backend_config")
    inter = config.get("intermediate_tensor_shape") if isinstance(config, dict) else None
    dims = _ints(inter.get("dimensions")) if isinstance(inter, dict) else []
    if len(dims) != 4 or len(instr.operands) < 3 or not isinstance(config, dict):
        return None
    q, v = _dims(shapes, instr.operands[0]), _dims(shapes, instr.operands[2])
    if not q or not v:
        return None
    b, h, sq, sk = dims
    causal = 0.5 if str(config.get("mask_type", "")).upper() == "CAUSAL" else 1.0
    per_dim = (3 * q[-1] + 2 * v[-1]) if "Backward" in target else (q[-1] + v[-1])
    return 2.0 * b * h * sq * sk * per_dim * causal


def _custom_call(instr: HloInstruction, shapes: Mapping[str, str], cost: InstructionCost) -> None:
    target = re.search(r'custom_call_target="([^"]*)"', instr.attrs)
    name = target.group(1) if target else "?"
    if name in CUBLAS_TARGETS:
        flops = _cublas_flops(instr, shapes)
    elif name.startswith("__cudnn$fmha"):
        flops = _attention_flops(instr, shapes, name)
        cost.attention = flops is not None
    else:
        return
    if flops is None:
        cost.notes.append(f"custom call {name} ({instr.name}): dimensions not readable, no FLOPs counted")
    else:
        cost.matmul += flops


def _fused_flops(module: HloModuleText, computation: str, shapes: Mapping[str, str], cost: InstructionCost,
                 depth: int = 0) -> None:
    """Add the FLOPs of every instruction of a fused computation (nested fusions included) to ``cost``."""
    for instr in module.computations.get(computation, ()):
        _flops(module, instr, shapes, cost, depth + 1)


def _reducer_ops(module: HloModuleText, instr: HloInstruction) -> int:
    m = re.search(r"\bto_apply=%?([\w.\-]+)", instr.attrs)
    body = module.computations.get(m.group(1), ()) if m else ()
    return max(sum(1 for i in body if i.opcode in _ELEMENTWISE), 1)


def _flops(module: HloModuleText, instr: HloInstruction, shapes: Mapping[str, str], cost: InstructionCost,
           depth: int) -> None:
    op = instr.opcode
    if op == "dot" or op == "convolution":
        flops = _dot_flops(instr, shapes) if op == "dot" else _convolution_flops(instr, shapes)
        if flops is None:
            cost.notes.append(f"{op} {instr.name}: operand shapes or dimension numbers not readable")
        else:
            cost.matmul += flops
    elif op == "fusion" and depth < 8:
        m = re.search(r"\bcalls=%?([\w.\-]+)", instr.attrs)
        if m:
            _fused_flops(module, m.group(1), shapes, cost, depth)
    elif op == "custom-call":
        _custom_call(instr, shapes, cost)
    elif op in _ELEMENTWISE:
        cost.other += _elements(instr.shape)
    elif op == "reduce" and instr.operands:
        src = _dims(shapes, instr.operands[0])
        if src is not None:
            cost.other += max(math.prod(src) - _elements(instr.shape), 0) * _reducer_ops(module, instr)


def _param_reads(module: HloModuleText, computation: str, shapes: Mapping[str, str]) -> tuple[dict[int, int], int]:
    """Per fused parameter index, the bytes the fusion reads of it; and the bytes its root writes.

    Bitcasts are seen through (a layout-free view of the same buffer): a parameter read through a
    bitcast and then sliced reads the slice; a ``dynamic-update-slice`` into a bitcast of a parameter
    updates that parameter in place."""
    instrs = module.computations.get(computation, ())
    by_name = {i.name: i for i in instrs}
    users: dict[str, list[HloInstruction]] = {}
    for i in instrs:
        for o in i.operands:
            users.setdefault(o, []).append(i)

    def source(name: str) -> HloInstruction | None:
        found = by_name.get(name)
        for _ in range(64):
            if found is None or found.opcode != "bitcast" or not found.operands:
                break
            found = by_name.get(found.operands[0])
        return found

    def reads_of(name: str) -> list[HloInstruction]:
        # The users of a value, bitcasts replaced by their own users.
        out: list[HloInstruction] = []
        for u in users.get(name, []):
            out.extend(reads_of(u.name) if u.opcode == "bitcast" else [u])
        return out

    root = next((i for i in reversed(instrs) if i.root), instrs[-1] if instrs else None)
    root = source(root.name) if root is not None else None
    outputs = ([root] if root is None or root.opcode != "tuple" else [source(o) for o in root.operands])
    aliased = {s.name for o in outputs if o is not None and o.opcode == "dynamic-update-slice" and o.operands
               for s in [source(o.operands[0])] if s is not None}
    passed = {o.name for o in outputs if o is not None and o.opcode == "parameter"}
    reads: dict[int, int] = {}
    for i in instrs:
        if i.opcode != "parameter" or not re.fullmatch(r"\d+", i.args):
            continue
        uses = reads_of(i.name)
        if i.name in aliased or (i.name in passed and all(u.opcode == "tuple" for u in uses)):
            reads[int(i.args)] = 0
        elif uses and all(u.opcode in _SLICES and source(u.operands[0]) is i for u in uses if u.operands):
            reads[int(i.args)] = sum(type_bytes(u.shape) for u in uses)
        else:
            reads[int(i.args)] = type_bytes(i.shape)
    written = 0
    for out in outputs:
        if out is None or out.opcode == "parameter":
            continue
        if out.opcode == "dynamic-update-slice" and len(out.operands) > 1:
            written += type_bytes(shapes.get(out.operands[1], ""))
        else:
            written += type_bytes(out.shape)
    return reads, written


def instruction_cost(module: HloModuleText, instr: HloInstruction, shapes: Mapping[str, str]) -> InstructionCost:
    """FLOPs and bytes of one instruction (see the module docstring).

    Args:
      module: the parsed module (for the computations a fusion calls).
      instr: the instruction.
      shapes: :func:`shape_table` of the module.

    Returns:
      An :class:`InstructionCost`.

    Example:
      >>> from meshplan.pure.xla._hlo_text import parse_module
      >>> m = parse_module('''ENTRY %e (a: bf16[64,128], b: bf16[128,32]) -> bf16[64,32] {
      ...   %a = bf16[64,128]{1,0} parameter(0)
      ...   %b = bf16[128,32]{1,0} parameter(1)
      ...   ROOT %d = bf16[64,32]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
      ... }''')
      >>> c = instruction_cost(m, m.computations["e"][-1], shape_table(m))
      >>> c.matmul, c.read, c.written
      (524288.0, 24576, 4096)
    """
    cost = InstructionCost()
    op = instr.opcode
    if op in FREE_OPCODES:
        return cost
    _flops(module, instr, shapes, cost, 0)
    if op in ("while", "call", "conditional", "async-start", "async-update", "async-done"):
        return cost  # their work is in the computations they call, priced there
    if op == "fusion":
        m = re.search(r"\bcalls=%?([\w.\-]+)", instr.attrs)
        if m and m.group(1) in module.computations:
            reads, written = _param_reads(module, m.group(1), shapes)
            cost.read = sum(reads.get(k, type_bytes(shapes.get(o, ""))) for k, o in enumerate(instr.operands))
            cost.written = written
            return cost
    if op in _SLICES:
        cost.read = cost.written = type_bytes(instr.shape)
    elif op == "dynamic-update-slice" and len(instr.operands) > 1:
        cost.read = cost.written = type_bytes(shapes.get(instr.operands[1], ""))
    else:
        cost.read = sum(type_bytes(shapes.get(o, "")) for o in instr.operands)
        cost.written = type_bytes(instr.shape)
    return cost

