"""docs/pipeline.md: every ```python block runs as written and prints the ```text block after it."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "pipeline.md"
_BLOCK = re.compile(r"```python\n(.*?)```\s*(?:```text\n(.*?)```)?", re.S)


def _blocks() -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(DOC.read_text())]


def test_the_page_has_examples() -> None:
    assert len(_blocks()) >= 4


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_each_example_prints_what_the_page_says(index: int) -> None:
    code, expected = _blocks()[index]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{DOC.name}[{index}]", "exec"), {"__name__": "__doc_example__"})
    if expected is not None:
        assert out.getvalue() == expected
