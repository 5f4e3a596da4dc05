"""Scenarios of ``meshplan profile`` under ``jax.distributed``: every process times, process 0 writes.

Run by :mod:`tests.multihost.worker` in each process (``"tests.multihost.profile_scenarios:NAME"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

import meshplan

# Small enough for two processes on a shared 2-core machine: each collective at two sizes, twice each; the sizes
# 256x apart, so the bandwidth term shows through a loaded machine's noise.
_SETTINGS = dict(hidden_sizes=(16,), tokens=16, collective_bytes=(2**12, 2**20), hbm_bytes=(2**16,), repeats=2,
                 inner=2, tp_splits=(1,))


def profile_link(out_dir: str) -> dict[str, Any]:
    """Profile with every process; each asks for its own file, so a process other than 0 writing would show."""
    me = jax.process_index()
    p = meshplan.profile_machine(settings=meshplan.ProfileSettings(**_SETTINGS),
                                 out=Path(out_dir) / f"from-{me}.json")
    return {
        "id": p.id,
        "process_count": p.process_count,
        "device_count": p.device_count,
        "links": sorted({(c.link, c.devices) for c in p.collectives}),
        "kinds": sorted({c.kind for c in p.collectives if c.link == "inter"}),
    }
