"""Renderers of meshplan's answers as text and pictures (pure string building, no I/O): the comparison's
markdown (:func:`compare_markdown`), HTML page (:func:`compare_html`) and its inline-SVG plots
(:func:`compare_svgs`). The terminal renderer (rich) lives in ``meshplan.cli``; all of them lay out the same
facts (:func:`compare_rows`), so they cannot disagree.
"""

from meshplan.pure.report._compare_facts import COMPARE_COLUMNS, CompareColumn, compare_header, compare_rows
from meshplan.pure.report._compare_html import compare_html
from meshplan.pure.report._compare_markdown import compare_markdown
from meshplan.pure.report._compare_svg import compare_svgs

__all__ = ["COMPARE_COLUMNS", "CompareColumn", "compare_header", "compare_html", "compare_markdown",
           "compare_rows", "compare_svgs"]
