"""Progress on stderr: drawn on a terminal, silent on a pipe and with --json, never on stdout."""

from __future__ import annotations

import io

from meshplan import cli
from meshplan.cli._progress import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_on_a_terminal_and_counts() -> None:
    term = _Terminal()
    with progress("compiling 2 meshes", total=2, stream=term) as p:
        p.update("compiling dp=8")
        p.advance()
        p.advance()
    assert p.completed == 2
    assert "compiling" in term.getvalue() and "2/2" in term.getvalue()


def test_progress_is_silent_on_a_pipe_and_when_quiet() -> None:
    pipe, term = io.StringIO(), _Terminal()
    with progress("searching", stream=pipe) as p:
        p.advance()
    with progress("searching", stream=term, quiet=True):
        pass
    assert pipe.getvalue() == "" and term.getvalue() == ""


def test_plan_writes_no_progress_when_stderr_is_not_a_terminal(capsys) -> None:
    assert cli.main(["plan", "--model", "gpt2", "--cluster", "2x4xH100", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("{")
