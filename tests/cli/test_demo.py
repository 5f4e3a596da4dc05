"""``meshplan demo``: the README's first command must run and its estimate must match live bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root: `python -m meshplan` runs this checkout


def test_demo_estimate_equals_the_live_bytes_on_every_device() -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", COLUMNS="200")
    env.pop("XLA_FLAGS", None)  # the demo asks for its own 8 devices, as on a fresh machine
    out = subprocess.run([sys.executable, "-m", "meshplan", "demo"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "on 8 cpu devices" in out.stdout
    assert "estimate == live bytes on every device" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.rstrip().endswith("yes │")]
    assert len(rows) == 8  # one matching row per device
    assert "NO" not in out.stdout


def test_demo_model_is_a_tiny_llama() -> None:
    from meshplan.cli._demo import tiny_llama
    from meshplan.pure.presets import build_params, count_params

    spec = tiny_llama()
    assert spec.num_kv_heads < spec.num_heads and not spec.tied_embeddings
    assert count_params(build_params(spec)) == 7_096_576
