"""Run a script under two Python hash seeds: here, and in one child process with another seed.

Plans must not depend on set or dict-hash order, which changes with
``PYTHONHASHSEED``. This process is one of the two runs, so each check
starts one child (and one jax import) instead of two.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys


def outputs_under_two_hash_seeds(script: str) -> tuple[str, str]:
    """``script``'s stdout when run in this process and in a child under a different ``PYTHONHASHSEED``."""
    here = io.StringIO()
    with contextlib.redirect_stdout(here):
        exec(compile(script, "<hash-seed script>", "exec"), {"__name__": "__hash_seed__"})
    # Unset means a random seed here, so any fixed one differs (but for 1 in 2**32).
    other = "54321" if os.environ.get("PYTHONHASHSEED") == "12345" else "12345"
    env = dict(os.environ, PYTHONHASHSEED=other, JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr
    return here.getvalue(), run.stdout
