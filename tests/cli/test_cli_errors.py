"""The command line never prints a traceback for bad input: exit 2 for usage, 1 for a plan that cannot be made.

``--json`` runs also print ``{"error": {"type": ..., "message": ...}}`` on stdout, so a script that reads
stdout always gets JSON. Most rows call ``main()`` in-process (fast); a few run the real console command
in a subprocess, where a traceback would show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan import cli
from meshplan.pure import search_meshes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("cli_errors")
    good = search_meshes("gpt2", "1x8xH100", batch=8, seq=128).to_dict()
    bad_fixed = dict(good, request=dict(good["request"], fixed=[[1]]))
    bad_memory = json.loads(json.dumps(good))
    bad_memory["candidates"][0]["memory"]["params"] = "x"
    out = {
        "latin1": b"\xff\xfe[[\"norm\", []]]",
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "fixed": json.dumps(bad_fixed).encode(),
        "memory": json.dumps(bad_memory).encode(),
        "number": b"3",
    }
    paths = {}
    for name, data in out.items():
        path = d / f"{name}.json"
        path.write_bytes(data)
        paths[name] = str(path)
    paths["missing"] = str(d / "missing.json")
    return paths


# (args with {file} placeholders, exit code, substring of stderr)
CASES = [
    (["plan", "--model", "gpt2", "--cluster", "1xH100", "--rules", "{latin1}"], 1, "is not valid JSON"),
    (["plan", "--model", "gpt2", "--cluster", "1xH100", "--rules", "{deep}"], 1, "nested too deeply"),
    (["plan", "--model", "gpt2", "--cluster", "1xH100", "--rules", "{missing}"], 1, "cannot read --rules"),
    (["plan", "--model", "gpt2", "--cluster", "1xH100", "--rules", "{number}"], 1, "--rules"),
    (["show-mesh", "--plan", "{latin1}"], 1, "invalid JSON"),
    (["show-mesh", "--plan", "{deep}"], 1, "nested too deeply"),
    (["show-mesh", "--plan", "{fixed}"], 1, "SearchRequest.fixed[0]=[1]"),
    (["show-mesh", "--plan", "{memory}"], 1, "candidates[0].memory: MemoryBreakdown.params='x'"),
    (["show-mesh", "--plan", "{number}"], 1, "not a meshplan search result"),
    (["show-mesh", "--plan", "{missing}"], 1, "cannot read --plan"),
    (["plan", "--model", "gpt2", "--cluster", "99999999999999999999x8xH100"], 1, "at most 4194304"),
    (["show-mesh", "--cluster", "99999999999999999999x8xH100", "--mesh", "dp=2"], 1, "at most 4194304"),
    (["plan", "--model", "gpt2", "--cluster", "1xH100", "--batch", "9" * 5000], 2, "is not an integer"),
    (["plan", "--model", "gpt2", "--cluster", "1xH100", "--batch", "²"], 2, "is not an integer"),
    (["plan", "--model", "gpt2", "--cluster", "1xH100", "--axes", "dp,dp"], 1, "repeated ['dp']"),
    (["demo", "--devices", "99999999"], 2, "at most 1024"),
]


def _fill(args: list[str], files: dict[str, str]) -> list[str]:
    return [a.format(**files) if a.startswith("{") else a for a in args]


@pytest.mark.parametrize("args,code,needle", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_exits_with_a_message_not_a_traceback(args: list[str], code: int, needle: str,
                                                        files: dict[str, str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    if code == 2:
        with pytest.raises(SystemExit) as info:
            cli.main(_fill(args, files))
        got = info.value.code
    else:
        got = cli.main(_fill(args, files))
    out = capsys.readouterr()
    assert got == code, out.err
    assert needle in out.err and "Traceback" not in out.err
    assert out.out == ""  # table/plain runs keep stdout for results only


def test_json_runs_print_an_error_object_on_stdout_for_plans_that_cannot_be_made(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "--model", "gpt2", "--cluster", "99999999999999999999x8xH100", "--json"])
    out = capsys.readouterr()
    assert code == 1
    error = json.loads(out.out)["error"]
    assert error["type"] == "ClusterError" and "99999999999999999999" in error["message"]
    assert "at most 4194304" in out.err


def test_json_runs_print_an_error_object_on_stdout_for_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", "--model", "gpt2", "--cluster", "1xH100", "--format", "json", "--batch", "x"])
    out = capsys.readouterr()
    assert info.value.code == 2
    error = json.loads(out.out)["error"]
    assert error["type"] == "UsageError" and "--batch" in error["message"]


def test_a_run_without_json_prints_no_error_object(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["plan", "--model", "gpt2", "--cluster", "1xH100", "--batch", "x"])
    assert capsys.readouterr().out == ""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_the_console_command_prints_no_traceback_and_answers_json(files: dict[str, str]) -> None:
    # One real process (each costs a jax import): a --json run whose plan file is not UTF-8.
    out = _run("plan", "--model", "gpt2", "--cluster", "1xH100", "--rules", files["latin1"], "--json")
    assert out.returncode == 1 and "Traceback" not in out.stderr and "is not valid JSON" in out.stderr
    assert json.loads(out.stdout)["error"]["type"] == "UserError"
