"""Renderers: a plan's facts laid out for people, as pure string building (markdown, self-contained HTML with
inline SVG). The serving plan's renderers; the training plan's move here too."""

from meshplan.pure.report._serve_html import SERVE_CSS, serve_html
from meshplan.pure.report._serve_markdown import serve_markdown
from meshplan.pure.report._serve_summary import (
    SERVE_COLUMNS,
    ServeColumn,
    serve_header,
    serve_headline,
    serve_notes,
    serve_rows,
    step_text,
)
from meshplan.pure.report._serve_svg import SERVE_MEMORY_COLORS, SERVE_STEP_COLORS, memory_bar, step_bar

__all__ = ["SERVE_COLUMNS", "SERVE_CSS", "SERVE_MEMORY_COLORS", "SERVE_STEP_COLORS", "ServeColumn", "memory_bar",
           "serve_header", "serve_headline", "serve_html", "serve_markdown", "serve_notes", "serve_rows",
           "step_bar", "step_text"]
