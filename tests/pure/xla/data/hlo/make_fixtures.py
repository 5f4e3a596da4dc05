"""Write the HLO fixtures of this directory: tiny reference steps compiled for XLA:CPU, XLA:GPU and XLA:TPU.

Run from the repository root (about a minute on 2 cores; needs libtpu and the jax CUDA plugin)::

    JAX_PLATFORMS=cpu python tests/pure/xla/data/hlo/make_fixtures.py

Each fixture is ``compiled.as_text()`` of ``meshplan.facade.verify._reference.reference_step`` (default
``ReferenceConfig``: scanned layers, full remat, AdamW, bf16) for a two-layer Llama of hidden 256, with the
instructions' ``metadata={...}`` and the module's source-location tables removed (they are most of the
text and the readers never look at them), gzipped. ``cost_analysis.json`` keeps XLA's own ``flops`` and
``optimal_seconds`` of each compile (XLA:GPU's deviceless ``cost_analysis()`` gives none).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import pathlib
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402

from meshplan.facade.verify._targets import gpu_topology_mesh, tpu_topology_mesh
from meshplan.facade.verify._reference import ReferenceConfig, reference_step  # noqa: E402
from meshplan.pure.presets import MODEL_SPECS  # noqa: E402

HERE = pathlib.Path(__file__).parent
TINY = dataclasses.replace(MODEL_SPECS["llama3-8b"], name="tiny", num_layers=2, hidden_size=256, num_heads=4,
                           num_kv_heads=2, head_dim=64, intermediate_size=512, vocab_size=512, num_params=None)


def strip(text: str) -> str:
    """The text without instruction metadata and without the source-location tables."""
    text = re.sub(r", metadata=\{[^{}]*\}", "", text)
    out, skip = [], False
    for line in text.split("\n"):
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            skip = True
            continue
        if skip and (line == "" or line[0].isdigit()):
            continue
        skip = False
        out.append(line)
    return "\n".join(out)


def cases() -> dict[str, tuple[object, int, int, dict[str, str]]]:
    """name -> (mesh, batch, seq, ReferenceConfig fields)."""
    auto = (jax.sharding.AxisType.Auto,) * 2
    return {
        "cpu_fsdp2_tp4": (jax.make_mesh((2, 4), ("fsdp", "tp"), axis_types=auto), 4, 64, {}),
        "gpu_h100_fsdp4_tp2": (gpu_topology_mesh("1x8xH100", ("fsdp", "tp"), (4, 2)), 8, 128, {}),
        "gpu_2x8_dp2_fsdp8": (gpu_topology_mesh("2x8xH100", ("dp", "fsdp"), (2, 8)), 16, 128, {}),
        "gpu_h100_single_flash": (gpu_topology_mesh("1x1xH100", ("fsdp",), (1,)), 4, 256, {"attention": "flash"}),
        "tpu_v5e8_fsdp4_tp2": (tpu_topology_mesh("v5e-8", ("fsdp", "tp"), (4, 2)), 8, 128, {}),
        "tpu_2xv5e4_dp2_fsdp4": (tpu_topology_mesh("2xv5e-4", ("dp", "fsdp"), (2, 4), dcn_shape=(2, 1)), 8, 128, {}),
    }


def main() -> None:
    costs = {}
    for name, (mesh, batch, seq, config) in cases().items():
        ref = reference_step(TINY, mesh, batch=batch, seq=seq, config=ReferenceConfig(**config))
        compiled = ref.fn.lower(*ref.args).compile()
        (HERE / f"{name}.hlo.gz").write_bytes(gzip.compress(strip(compiled.as_text()).encode(), mtime=0))
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        costs[name] = {k: cost[k] for k in ("flops", "optimal_seconds") if cost and k in cost}
    (HERE / "cost_analysis.json").write_text(json.dumps(costs, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
