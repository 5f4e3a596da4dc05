"""Test-wide setup: 8 real XLA CPU devices and hypothesis profiles.

The device count must be fixed before jax initialises its backend, so it is
set here, at import time of the first conftest, before any test module
imports jax.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# `meshplan plan` compiles its top meshes by default wherever the target's compiler is installed (CI installs
# libtpu and the CUDA plugin): tests that render or export a plan must not compile 70B steps as a side effect.
# The tests of verification ask for it with --verify K, or unset this (tests/cli/test_verify.py).
os.environ.setdefault("MESHPLAN_VERIFY", "0")

import chex  # noqa: E402

chex.set_n_cpu_devices(8)

from hypothesis import HealthCheck, settings  # noqa: E402

# default: quick enough for the ~10 minute CI budget on 2 cores.
settings.register_profile(
    "default",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# ci: same budget, derandomized so a red CI is reproducible from its log.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
# deep: long runs, opt-in with HYPOTHESIS_PROFILE=deep.
settings.register_profile("deep", parent=settings.get_profile("default"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
