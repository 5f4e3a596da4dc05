"""The pipeline layouts' summary as plain text facts: what the terminal, markdown and HTML reports all show.

:func:`~meshplan.pure.search.search_pipelines` ranks layouts with ``pp`` outermost; a report shows them next
to the unpipelined ranking of :func:`~meshplan.pure.search_meshes`. This module builds their table's cells
(:data:`PIPELINE_COLUMNS`, :func:`pipeline_rows`), the one sentence that sets the fastest against the
unpipelined meshes (:func:`pipeline_headline`) and the left-out lines, once, so ``meshplan plan``'s terminal
table (:mod:`meshplan.cli._pipeline`), ``--format markdown`` and ``--html`` cannot drift apart. Every figure
is the search's estimate; nothing here decides anything.

Example:
  >>> from meshplan.pure import search_meshes
  >>> from meshplan.pure.search import search_pipelines
  >>> result = search_meshes("llama3-8b", "4x8xH100", batch=64, seq=4096, top_k=1)
  >>> found = search_pipelines("llama3-8b", "4x8xH100", batch=64, seq=4096, top_k=1)
  >>> row = pipeline_rows(found, result)[0]
  >>> row["schedule"] in ("1f1b", "interleaved v=2"), row["bubble"].endswith("%"), row["versus"].endswith("x")
  (True, True, True)
"""

from __future__ import annotations

from meshplan.pure._format import fmt_bytes
from meshplan.pure.errors import MeshplanTypeError
from meshplan.pure.search._candidate import MeshCandidate
from meshplan.pure.search._pipeline_search import PipelineSearch
from meshplan.pure.search._result import SearchResult
from meshplan.pure.report._summary import Column, seconds

__all__ = ["PIPELINE_COLUMNS", "best_unpipelined_s", "check_pipelines", "pipeline_headline", "pipeline_layouts",
           "pipeline_rows", "pipelines_intro"]

PIPELINE_COLUMNS: tuple[Column, ...] = (
    Column("rank", "#", 1, True),
    Column("mesh", "mesh", 1),
    Column("over", "pp over", 1),
    Column("schedule", "schedule", 1),
    Column("micro", "micro-batches", 1, True),
    Column("bubble", "bubble", 1, True),
    Column("layers", "layers/stage", 1),
    Column("memory", "memory/device", 1, True),
    Column("step", "step time", 1, True),
    Column("versus", "vs best unpipelined", 1, True),
)
"""The pipeline table's columns in display order (every one always shown: the table is narrow)."""


def check_pipelines(pipelines: object) -> PipelineSearch:
    """``pipelines`` itself, or a :class:`~meshplan.pure.errors.MeshplanTypeError` saying what it must be."""
    if not isinstance(pipelines, PipelineSearch):
        raise MeshplanTypeError(f"pipelines={pipelines!r:.80} must be a PipelineSearch (search_pipelines(...)) "
                                f"or None, not {type(pipelines).__name__}.")
    return pipelines


def best_unpipelined_s(result: SearchResult) -> float | None:
    """The best unpipelined mesh's predicted step in seconds (the one the layouts are compared with), or
    ``None`` where it has no step time."""
    step = result.best.step if result.candidates else None
    return None if step is None else step.step_s


def pipeline_layouts(found: PipelineSearch) -> tuple[MeshCandidate, ...]:
    """The layouts shown, in rank order: those that carry a pipeline plan and a step time (every one the
    search returns does; a hand-made result may not)."""
    return tuple(c for c in check_pipelines(found).candidates if c.pipeline is not None and c.step is not None)


def pipeline_rows(found: PipelineSearch, result: SearchResult) -> tuple[dict[str, str], ...]:
    """One dict of cell texts per layout of :func:`pipeline_layouts`, keyed by :data:`PIPELINE_COLUMNS`' keys.

    ``over`` says where the stage boundaries run (``network``: each stage a block of whole nodes; ``node``:
    inside every node, over NVLink); ``versus`` is the layout's step over the best unpipelined mesh's step
    (``1.16x``), empty where that has no step time.
    """
    best = best_unpipelined_s(result)
    rows = []
    for c in pipeline_layouts(found):
        pipe, step = c.pipeline, c.step
        assert pipe is not None and step is not None  # pipeline_layouts keeps only these
        rows.append({
            "rank": str(c.rank), "mesh": c.text,
            "over": "network" if c.dcn_shape[0] == c.axis_sizes[0] else "node",
            "schedule": pipe.schedule + (f" v={pipe.virtual}" if pipe.virtual > 1 else ""),
            "micro": str(pipe.micro_batches), "bubble": f"{pipe.bubble:.1%}",
            "layers": "/".join(map(str, sorted(set(pipe.layers)))),
            "memory": fmt_bytes(c.memory.total), "step": seconds(step.step_s),
            "versus": "" if best is None else f"{step.step_s / best:.2f}x",
        })
    return tuple(rows)


def pipeline_headline(found: PipelineSearch, result: SearchResult) -> str | None:
    """The fastest layout set against the unpipelined meshes shown, and why it won; ``None`` where there is
    no layout or no unpipelined step to compare with."""
    layouts = pipeline_layouts(found)
    best = best_unpipelined_s(result)
    if not layouts or best is None:
        return None
    top = layouts[0]
    assert top.step is not None
    ahead = sum(1 for c in result.candidates if c.step is not None and c.step.step_s < top.step.step_s)
    where = (f"would rank #{ahead + 1} among" if ahead < len(result.candidates)
             else f"is slower than all {ahead} of")
    return (f"best pipeline layout {top.text} ({seconds(top.step.step_s)}, estimated) {where} the unpipelined "
            f"meshes shown; why: {top.verdict}")


def pipelines_intro(found: PipelineSearch, result: SearchResult) -> str:
    """The reports' sentence above the pipeline table: how many layouts, what they are, how they compare.

    Example:
      >>> from meshplan.pure import search_meshes
      >>> result = search_meshes("gpt2", "2x4xH100", batch=8, seq=1024, top_k=1)
      >>> pipelines_intro(PipelineSearch((), ()), result)
      'No pipeline layout (pp outermost) to price: no pp >= 2 divides the nodes or the devices per node.'
    """
    layouts, left = pipeline_layouts(found), len(found.left_out)
    if not layouts:
        return ("No pipeline layout (pp outermost) fits; the left-out lines say why." if left else
                "No pipeline layout (pp outermost) to price: no pp >= 2 divides the nodes or the devices per node.")
    best, top = best_unpipelined_s(result), layouts[0].step
    assert top is not None
    versus = "" if best is None else f"; the fastest's step is {top.step_s / best:.2f}x the best unpipelined mesh's"
    return (f"{len(layouts)} layout{'s' if len(layouts) != 1 else ''} with pp outermost, the fastest that fits "
            f"per pp and placement{versus}. Every figure is an estimate: bubble is the schedule's idle share of "
            "the step, memory/device the fullest stage's.")
