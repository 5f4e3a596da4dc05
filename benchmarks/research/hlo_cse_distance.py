"""Which weight all-gathers XLA:TPU's schedule-aware CSE merges: the distances it compares, read off a dump.

XLA:TPU's SPMD partitioner gathers a weight once for each use (forward and backward); the pass
``schedule-aware-collective-cse`` (``xla/service/spmd/schedule_aware_collective_ops_cse.cc``) then replaces a
later gather with an earlier identical one (same operand, same shape) unless the earlier one's lowest user
lies more than a threshold above the later one, heights counted in the dataflow graph towards the root
(libtpu's flag ``xla_tpu_spmd_threshold_for_allgather_cse``). This script recomputes those heights as the pass
does, on the HLO module dumped just before it, and prints every pair of identical gathers with its distance;
the dump just after it shows which were merged. How the remat-none rule for XLA:TPU in
``meshplan/pure/cost/_param_collectives.py`` (``param_tables``) was read: docs/design-notes.md, "XLA:TPU without remat".

Make the dump by compiling with (libtpu reads ``XLA_FLAGS`` too)::

    XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_pass_re=.*[cC][sS][eE].* --xla_dump_hlo_as_text"

Usage::

    python benchmarks/research/hlo_cse_distance.py DIR/*before_schedule-aware-collective-cse.txt

(the first such file: the pass runs twice, the second time after the duplicates are gone).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path


def entry_graph(text: str) -> tuple[list[str], dict[str, list[str]], dict[str, str]]:
    """The ENTRY computation's instructions in text order (a post order), their operands and their lines."""
    found = re.search(r"^ENTRY .*?\{\n(.*?)\n\}", text, re.S | re.M)
    names: list[str] = []
    operands: dict[str, list[str]] = {}
    lines: dict[str, str] = {}
    for line in (found.group(1) if found else "").splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (.*)", line)
        if m:
            names.append(m.group(1))
            operands[m.group(1)] = re.findall(r"%([\w.\-]+)", m.group(2).split(", metadata=")[0])
            lines[m.group(1)] = m.group(2)
    return names, operands, lines


def heights(names: list[str], operands: dict[str, list[str]]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Each instruction's height as the pass computes it (from the root down, ``max(h, user) + 1`` per user)."""
    users: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for o in operands[n]:
            if o in users and n not in users[o]:
                users[o].append(n)
    height: dict[str, int] = {}
    for n in reversed(names):
        h = 0
        for u in users[n]:
            h = max(h, height[u]) + 1
        height[n] = h
    return height, users


def distances(text: str) -> list[tuple[str, str, str, str, int]]:
    """``(operand, shape, earlier gather, later gather, distance)`` for each later gather with an identical
    earlier one; the pass merges the later one when the distance is within its threshold."""
    names, operands, lines = entry_graph(text)
    height, users = heights(names, operands)
    earlier: dict[tuple[str, str], str] = {}
    out = []
    for n in names:
        if not re.search(r"\ball-gather\(", lines[n]):
            continue
        key = (operands[n][0], lines[n].split(" all-gather(")[0])
        if key not in earlier:
            earlier[key] = n
            continue
        first = earlier[key]
        lowest = min([height[first]] + [height[u] for u in users[first]])
        out.append((key[0], key[1], first, n, lowest - height[n]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("hlo", type=Path, help="the HLO text dumped before schedule-aware-collective-cse")
    args = parser.parse_args()
    for operand, shape, first, later, distance in distances(args.hlo.read_text()):
        print(f"{operand:16s} {shape:26s} {first:16s} {later:16s} distance {distance}")


if __name__ == "__main__":
    main()
