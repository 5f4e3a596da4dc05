"""use_cpu_devices: simulated CPU devices asked for through chex.set_n_cpu_devices, each case in a fresh process
(jax reads the device count once, when its backends start)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    environ.update(JAX_PLATFORMS="cpu", PYTHONPATH=_ROOT, **env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


PRELUDE = """
    import os, jax
    from meshplan.facade._cpu import use_cpu_devices
"""


def test_asks_chex_for_the_devices_before_jax_starts_and_changes_nothing_after() -> None:
    out = _run(PRELUDE + """
    asked = use_cpu_devices(4)
    print(asked, len(jax.devices()), os.environ["XLA_FLAGS"], use_cpu_devices(8), len(jax.devices()))
    """)
    assert out == "True 4 --xla_force_host_platform_device_count=4 False 4"


def test_enough_devices_asked_for_already_are_left_alone() -> None:
    out = _run(PRELUDE + """
    print(use_cpu_devices(4), len(jax.devices()))
    """, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    assert out == "False 8"


def test_a_jax_num_cpu_devices_setting_is_raised_where_it_is() -> None:
    # jax's own setting wins over XLA_FLAGS, so raising only the flag would leave 2 devices.
    out = _run(PRELUDE + """
    jax.config.update("jax_num_cpu_devices", 2)
    print(use_cpu_devices(4), len(jax.devices()))
    """)
    assert out == "True 4"


@pytest.mark.parametrize("n", [0, -1])
def test_a_count_below_one_is_a_typed_error(n: int) -> None:
    from meshplan.errors import MeshShapeError
    from meshplan.facade._cpu import use_cpu_devices

    with pytest.raises(MeshShapeError, match=f"n={n} must be >= 1"):
        use_cpu_devices(n)
