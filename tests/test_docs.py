"""Every code block in README.md and docs/ runs: the manual cannot drift from the code.

Per page, in order, in one fresh working directory (so a ``meshplan plan ... --json > plan.json`` block feeds
the python block after it):

* ``python`` blocks run in one namespace per page (a page reads like a notebook);
* ``bash`` blocks of ``meshplan`` commands run (in-process, ``meshplan.cli.main``) and must exit 0, as must
  ``python NAME.py`` lines for a script the page gives in a python block that starts ``# NAME.py``; the README's two
  setup commands are the only other bash allowed, and the test command must be what ``.ci/run`` runs;
* ``json`` blocks must parse;
* ``text`` blocks are output or commands too costly to run here (compiles, several hosts), shown, not run.

A block with no language, or another one, fails: each block says which of these it is.
The 8 CPU devices of tests/conftest.py are in place, as for every test.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.DOTALL | re.MULTILINE)
# The README's two commands: they build a venv and run the whole suite, which CI does itself (.ci/run).
_SETUP = ("python3.11 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/meshplan demo",
          "python3.11 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest -q "
          "&& .venv/bin/python -m pytest -q -m slow")


def _blocks(page: Path) -> list[tuple[str, str, int]]:
    text = page.read_text()
    return [(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1) for m in _FENCE.finditer(text)]


def test_there_are_pages_and_blocks() -> None:
    assert len(PAGES) >= 8
    assert sum(len(_blocks(p)) for p in PAGES) > 20


def test_the_readme_is_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    for command in _SETUP:
        assert f"```bash\n{command}\n```" in readme, command
    # .ci/run runs the same command split where it times each tier: the install, then pytest -q with no
    # arguments (the default tier) and with -m slow (the second), each through its `tier` function.
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    install, default, slow = _SETUP[1].split(" && .venv/bin/python -m pytest -q")
    assert (default, slow) == ("", " -m slow")
    assert install in ci and "tier default" in ci and "tier slow -m slow" in ci
    assert '    .venv/bin/python -m pytest -q "$@"' in ci


def test_every_docs_link_resolves() -> None:
    missing = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                missing.append(f"{page.name} -> {target}")
    # The pages other engineers write (models, pipeline, verification, design notes) may land after this one.
    later = {"models.md", "pipeline.md", "verification.md", "design-notes.md"}
    assert [m for m in missing if m.rsplit("/", 1)[-1].split(" -> ")[-1] not in later] == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_script(line: str, cwd: Path, where: str) -> None:
    """``python NAME.py ...`` for a script the page wrote: in a shell, with this interpreter, on fresh CPU jax."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the script sets its own device count
    env |= {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    command = re.sub(r"(^|[&|;]\s*)python ", lambda m: f"{m.group(1)}{shlex.quote(sys.executable)} ", line)
    out = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=180,
                         check=False)
    assert out.returncode == 0, f"{where}: {line}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"


def _run_bash(code: str, cwd: Path, where: str) -> None:
    """Run each ``meshplan ...`` line in-process (``cli.main``; a ``> FILE`` redirect writes stdout there), and
    ``python NAME.py`` lines for the scripts the page wrote."""
    from meshplan import cli

    for line in code.splitlines():
        line = line.split("  #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        script = re.match(r"python (\w+\.py)", line)
        if script and (cwd / script.group(1)).exists():
            _run_script(line, cwd, where)
            continue
        assert line.startswith("meshplan "), f"{where}: a bash block runs meshplan commands only: {line!r}"
        command, _, target = line.removeprefix("meshplan ").partition(" > ")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
            code_ = cli.main(shlex.split(command))
        assert code_ == 0, f"{where}: {line}\n{err.getvalue()[-3000:]}"
        if target:
            (cwd / target.strip()).write_text(out.getvalue())


# Pages whose examples time steps on the CPU devices or compile pipelined steps: the second tier (pytest -m slow).
_SLOW_PAGES = ("measure.md", "pipeline.md")


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p.name in _SLOW_PAGES else p
                                  for p in PAGES], ids=lambda p: p.name)
def test_every_code_block_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A scratch directory (plan.json and friends land there) that sees the repository's data as the root does.
    for shared in ("tests", "benchmarks"):
        (tmp_path / shared).symlink_to(ROOT / shared, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # the pages' imports of tests.examples
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for lang, code, line in _blocks(page):
        where = f"{page.name}:{line}"
        file = re.match(r"# (\w+\.py)\n", code)
        if lang == "python" and file:  # a script the page runs next (``python NAME.py ...``): written, not exec'd
            (tmp_path / file.group(1)).write_text(code.replace("12355", str(_free_port())))
        elif lang == "python":
            exec(compile(code, where, "exec"), namespace)  # noqa: S102 - running the manual is the point
        elif lang == "bash":
            if code.strip() in _SETUP:
                continue  # checked against .ci/run above; CI runs them
            _run_bash(code, tmp_path, where)
        elif lang == "json":
            json.loads(code)
        else:
            assert lang == "text", f"{where}: label the block python, bash, json or text (got {lang!r})"
