"""Reading a model file and planning it, against planning the same model's preset, in one process.

Run: ``python benchmarks/bench_models.py`` from the repository root. Pure code plus the file read:
no devices. For every real config in ``tests/data/models/`` (Hugging Face ``config.json`` and MaxText
ymls) it times, as the least CPU time (``time.process_time``) of 5 runs:

- *read*: ``meshplan.load_model(path)`` (open, parse, check, build the ModelSpec);
- *tree*: ``build_params(spec)`` (the Hugging Face-named shape tree), with its exact parameter count;
- *search*: ``search_meshes(spec, "8x8xH100", top_k=1)``;

and, where a preset of the same model exists, *preset search* ``search_meshes(name, "8x8xH100", top_k=1)``
as the baseline: the ratio says what going through the file costs over naming the preset.

``python benchmarks/bench_models.py --flops``: the analytic step FLOPs of each new layout (the cases of
``tests/facade/test_model_families_vs_xla.py``, plus each on the other mesh) over XLA:CPU's
``cost_analysis()`` of the compiled reference step, and the analytic matmul FLOPs over the HLO's dots,
on 8 simulated CPU devices.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan import load_model  # noqa: E402
from meshplan.pure import search_meshes  # noqa: E402
from meshplan.pure.errors import PlanError  # noqa: E402
from meshplan.pure.presets import build_params, count_params  # noqa: E402

DATA = ROOT / "tests" / "data" / "models"
SAME_PRESET = {"gpt2.json": "gpt2", "mixtral-8x7b.json": "mixtral-8x7b", "deepseek-v3.json": "deepseek-v3",
               "mistral-7b-v0.1.json": "mistral-7b", "deepseek-v2-lite.json": "deepseek-v2-lite",
               "gemma-3-27b.json": "gemma3-27b", "qwen2.5-72b.json": "qwen2.5-72b",
               "qwen3-235b-a22b.json": "qwen3-235b-a22b", "llama-3.1-405b.json": "llama3.1-405b"}


def _least(fn: Callable[[], Any], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def _search(model: Any) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return search_meshes(model, "8x8xH100", top_k=1)
        except PlanError:  # "does not fit; it fits on ...": the answer for 405B and DeepSeek-V3 on 64 H100s
            return None

    return run


def flops() -> None:
    import jax

    from meshplan.facade.verify._reference import ReferenceConfig, reference_step
    from meshplan.pure.cost._flops import step_flops
    from tests.facade.test_model_families_vs_xla import CASES, _matmul_flops

    meshes = (((2, 4), ("fsdp", "tp"), "full"), ((8,), ("fsdp",), "none"))
    print(f"{'layout':<28} {'mesh':<12} {'remat':<5} {'analytic / XLA':>15} {'matmuls / HLO dots':>19}")
    for case in sorted(CASES):
        spec = CASES[case][0]
        for shape, names, remat in meshes:
            mesh = jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
            ref = reference_step(spec, mesh, batch=8, seq=128,
                                 config=ReferenceConfig(remat=remat, attention="plain", scan_layers=False))
            compiled = ref.lower().compile()
            cost = compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, list) else cost
            f = step_flops(spec, dict(zip(names, shape)), batch=8, seq=128, remat=remat, attention="plain")
            text = ",".join(f"{n}={s}" for n, s in zip(names, shape))
            print(f"{spec.name:<28} {text:<12} {remat:<5} {f.per_device / cost['flops']:>15.4f} "
                  f"{(f.per_device - f.elementwise) / _matmul_flops(compiled.as_text()):>19.4f}", flush=True)


def main() -> None:
    if "--flops" in sys.argv[1:]:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
        flops()
        return
    files = sorted(DATA.glob("*.json")) + sorted((DATA / "maxtext").glob("*.yml"))
    print(f"{'file':<32} {'params':>17} {'read ms':>8} {'tree ms':>8} {'search ms':>10} {'preset ms':>10} "
          f"{'ratio':>6}")
    for path in files:
        spec = load_model(path)
        read = _least(lambda: load_model(path))
        tree = _least(lambda: build_params(spec))
        search = _least(_search(spec))
        label = str(path.relative_to(DATA))
        preset = SAME_PRESET.get(label)
        base = _least(_search(preset)) if preset else None
        ratio = f"{search / base:.2f}" if base else "-"
        print(f"{label:<32} {count_params(build_params(spec)):>17,} {read * 1e3:>8.2f} {tree * 1e3:>8.1f} "
              f"{search * 1e3:>10.1f} {'-' if base is None else f'{base * 1e3:.1f}':>10} {ratio:>6}")


if __name__ == "__main__":
    main()
