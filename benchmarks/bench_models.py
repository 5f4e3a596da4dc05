"""Reading a model file and planning it, against planning the same model's preset, in one process.

Run: ``python benchmarks/bench_models.py`` from the repository root. Pure code plus the file read:
no devices. For every real config in ``tests/data/models/`` (Hugging Face ``config.json`` and MaxText
ymls) it times, as the least CPU time (``time.process_time``) of 5 runs:

- *read*: ``meshplan.load_model(path)`` (open, parse, check, build the ModelSpec);
- *tree*: ``build_params(spec)`` (the Hugging Face-named shape tree), with its exact parameter count;
- *search*: ``search_meshes(spec, "8x8xH100", top_k=1)``;

and, where a preset of the same model exists, *preset search* ``search_meshes(name, "8x8xH100", top_k=1)``
as the baseline: the ratio says what going through the file costs over naming the preset.
"""

from __future__ import annotations

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


def main() -> None:
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
