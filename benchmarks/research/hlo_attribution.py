"""Attribute a compiled step's collectives to passes and source lines (how the XLA:GPU tp rules were read).

Reads an optimized HLO module's text (``jax.jit(f).lower(...).compile().as_text()``, unrolled layers,
``prevent_cse=True`` so the recompute is its own region), parses its collectives with
``meshplan.pure.xla.parse_hlo_collectives`` and names each by its instruction's metadata:

- pass: ``rec`` when its ``op_name`` lies in a ``rematted_computation``, ``bwd`` under ``transpose(``,
  else ``fwd``;
- source: the innermost frame in ``meshplan/facade/verify/_reference_model.py`` of its ``stack_frame_id`` (the
  HLO's ``FileNames`` / ``FunctionNames`` / ``FileLocations`` / ``StackFrames`` tables), e.g.
  ``rms_norm:61`` (a norm's output), ``_linear:49`` (a projection), ``chunk_loss:314`` (the LM head).

Usage::

    python benchmarks/research/hlo_attribution.py STEP.hlo.txt [--unit BYTES]   # e.g. --unit 33554432 (X = b*s*h*2)

prints one line per collective (kind, bytes per step, group size, dtype, pass, source), then the counts per
(kind, group, dtype, bytes / unit, pass, source) and the bytes per (kind, group). Recorded use:
docs/design-notes.md, "XLA:GPU".
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from meshplan.pure.xla import parse_hlo_collectives

MODEL_FILE = "_reference_model.py"


def _table(text: str, name: str) -> dict[int, str]:
    """One of the HLO text's id-keyed tables (``FileNames``, ``StackFrames``, ...), id -> rest of the line."""
    found = re.search(rf"^{name}\n(.*?)(?:\n\n|\Z)", text, re.S | re.M)
    rows = {}
    for line in found.group(1).splitlines() if found else []:
        key, _, rest = line.partition(" ")
        if key.isdigit():
            rows[int(key)] = rest
    return rows


def sources(text: str) -> dict[int, list[str]]:
    """Stack frame id -> its frames in the reference model, innermost first, as ``function:line``."""
    files = {k: v.strip('"').rsplit("/", 1)[-1] for k, v in _table(text, "FileNames").items()}
    funcs = {k: v.strip('"').rsplit(".", 1)[-1] for k, v in _table(text, "FunctionNames").items()}
    locations = {}
    for k, v in _table(text, "FileLocations").items():
        d = dict(re.findall(r"(\w+)=(\d+)", v))
        locations[k] = (files.get(int(d["file_name_id"]), ""), funcs.get(int(d["function_name_id"]), ""),
                        int(d["line"]))
    parents = {}
    for k, v in _table(text, "StackFrames").items():
        d = dict(re.findall(r"(\w+)=(\d+)", v))
        parents[k] = (int(d["file_location_id"]), int(d["parent_frame_id"]))
    out = {}
    for frame in parents:
        chain, seen, at = [], set(), frame
        while at in parents and at not in seen:
            seen.add(at)
            location, at = parents[at]
            file, func, line = locations.get(location, ("", "", 0))
            if file == MODEL_FILE:
                chain.append(f"{func}:{line}")
        out[frame] = chain
    return out


def attribute(text: str) -> list[tuple[str, int, int, str, str, str]]:
    """(kind, bytes per step, group size, dtype, pass, source) per collective, in program order."""
    frames = sources(text)
    lines = {}
    for line in text.splitlines():
        m = re.match(r"\s+(?:ROOT )?%?([\w.\-]+) = ", line)
        if m:
            lines[m.group(1)] = line
    rows = []
    for c in parse_hlo_collectives(text):
        line = lines.get(c.name, "")
        op = re.search(r'op_name="([^"]*)"', line)
        frame = re.search(r"stack_frame_id=(\d+)", line)
        op_name = op.group(1) if op else ""
        where = "rec" if "rematted_computation" in op_name else "bwd" if "transpose(" in op_name else "fwd"
        chain = frames.get(int(frame.group(1)), []) if frame else []
        source = chain[0] if chain else op_name.rsplit("/", 1)[-1][:32]
        rows.append((c.kind, c.nbytes * c.trips, c.group_size, "/".join(sorted(set(c.dtypes))), where, source))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("hlo", type=Path, help="the optimized HLO text of one compiled step")
    parser.add_argument("--unit", type=int, default=1, help="bytes to express each collective in (e.g. b*s*h*2)")
    args = parser.parse_args()
    rows = attribute(args.hlo.read_text())
    for kind, nbytes, group, dtype, where, source in rows:
        print(f"{kind:18s} {nbytes:>14,} g{group:<3d} {dtype:9s} {where} {source}")
    counts: collections.Counter[tuple[str, int, str, float, str, str]] = collections.Counter()
    totals: collections.Counter[tuple[str, int]] = collections.Counter()
    for kind, nbytes, group, dtype, where, source in rows:
        counts[(kind, group, dtype, round(nbytes / args.unit, 3), where, source)] += 1
        totals[(kind, group)] += nbytes
    print("\ncount  kind / group / dtype / bytes per unit / pass / source")
    for key, n in sorted(counts.items()):
        print(f"{n:5d}  {key}")
    print("\nbytes per step, per kind and group size")
    for (kind, group), nbytes in sorted(totals.items()):
        print(f"  {kind:18s} g{group:<3d} {nbytes:>14,}  ({nbytes / args.unit:.2f} units)")


if __name__ == "__main__":
    main()
