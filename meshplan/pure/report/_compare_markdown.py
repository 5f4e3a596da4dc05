"""A comparison as markdown (for a pull request or an issue): the header facts, the ranked table, the verdicts.

The same facts as the terminal and the HTML page (:mod:`meshplan.pure.report._compare_facts`).

Example:
  >>> from meshplan.pure.compare import CompareOption, build_comparison
  >>> a = CompareOption("1x8xH100", "H100", 8, True, "fsdp=8", "estimate", 2**30, 2**31, 2.0, 8192, .4)
  >>> print(compare_markdown(build_comparison("gpt2", 8, 1024, [a])).splitlines()[0])
  ### meshplan compare: gpt2 on 1 option
"""

from __future__ import annotations

from meshplan.pure.compare import Comparison
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.report._compare_facts import compare_header, compare_rows, compare_verdicts, shown_columns

__all__ = ["compare_markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def compare_markdown(comparison: Comparison) -> str:
    """The comparison as a markdown section (a heading, facts, one table, the verdict lines).

    Raises:
      MeshplanTypeError: ``comparison`` is not a Comparison.
    """
    if not isinstance(comparison, Comparison):
        raise MeshplanTypeError(f"comparison={comparison!r:.60} must be a Comparison.")
    c = comparison
    n = len(c.options)
    out = [f"### meshplan compare: {c.model} on {n} option{'s' if n != 1 else ''}", ""]
    out += [f"- **{label}**: {_cell(text)}" for label, text in compare_header(c)]
    cols = shown_columns(c)
    out += ["", "| " + " | ".join(col.title for col in cols) + " |",
            "|" + "|".join("---:" if col.right else "---" for col in cols) + "|"]
    out += ["| " + " | ".join(_cell(row[col.key]) for col in cols) + " |" for row in compare_rows(c)]
    out += [""] + [f"- {_cell(line)}" for line in compare_verdicts(c)]
    return "\n".join(out) + "\n"
