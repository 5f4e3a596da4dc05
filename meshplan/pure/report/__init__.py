"""A plan for people, and for the tools that take it: the report object, its facts and every renderer.

:class:`PlanReport` holds what ``meshplan plan`` gathers once (the ranked meshes, their verification, the
pipeline layouts and theirs); the terminal, :func:`plan_markdown`, :func:`plan_html` (with the pictures of
``_svg``) and ``--json`` (:meth:`PlanReport.to_json`) render that one object from the same facts
(``_summary``, ``_pipeline_summary``, ``_verified``), so they cannot disagree. :func:`show` displays a report in a
notebook. The exports turn the best mesh into a flax logical-axis table or MaxText settings
(:func:`export_plan`, :func:`logical_export`, :func:`maxtext_settings`). A serving plan
(:func:`meshplan.pure.serve.plan_serving`) has its own facts and renderers here too (:func:`serve_markdown`,
:func:`serve_html`), and :func:`show` displays it as well; so does a cluster comparison (:func:`compare_markdown`,
:func:`compare_html`, :func:`compare_svgs`).
"""

from meshplan.pure.report._compare_facts import COMPARE_COLUMNS, CompareColumn, compare_header, compare_rows
from meshplan.pure.report._compare_html import compare_html
from meshplan.pure.report._compare_markdown import compare_markdown
from meshplan.pure.report._compare_svg import compare_svgs
from meshplan.pure.report._export import (
    EXPORT_FORMATS,
    MAXTEXT_AXIS_MAP,
    MAXTEXT_MESH_AXES,
    LogicalExport,
    export_plan,
    logical_export,
    maxtext_settings,
)
from meshplan.pure.report._html import mesh_html, plan_html
from meshplan.pure.report._markdown import plan_markdown
from meshplan.pure.report._notebook import Shown, show
from meshplan.pure.report._report import PlanReport, as_report
from meshplan.pure.report._serve_html import serve_html
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

__all__ = ["PlanReport", "Shown", "as_report", "mesh_html", "plan_html", "plan_markdown", "show"]
# Exports of the best mesh: flax logical rules and MaxText settings.
__all__ += ["EXPORT_FORMATS", "MAXTEXT_AXIS_MAP", "MAXTEXT_MESH_AXES", "LogicalExport", "export_plan",
            "logical_export", "maxtext_settings"]
# A serving plan's facts and renderers.
__all__ += ["SERVE_COLUMNS", "ServeColumn", "serve_header", "serve_headline", "serve_html", "serve_markdown",
            "serve_notes", "serve_rows", "step_text"]
# A cluster comparison's facts, markdown, HTML and plots.
__all__ += ["COMPARE_COLUMNS", "CompareColumn", "compare_header", "compare_html", "compare_markdown", "compare_rows",
            "compare_svgs"]
