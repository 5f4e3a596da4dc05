"""How to choose a mesh: the search space of axis sizes over a cluster, parameter groups and their specs, the
search itself (:func:`search_meshes`), the pipeline layouts (:func:`search_pipelines`) and the JSON-ready
result (:class:`SearchResult`, :class:`MeshCandidate`). It prices meshes with :mod:`meshplan.pure.cost` on
the machines of :mod:`meshplan.pure.cluster`; :mod:`meshplan.pure.report` shows a result to people and
exports it to flax and MaxText.
"""

from meshplan.pure.search._candidate import MeshCandidate, ParamGroup
from meshplan.pure.search._pipeline_search import PipelineSearch, price_pipeline, search_pipelines
from meshplan.pure.search._result import RANK_BY, Rejection, SearchRequest, SearchResult
from meshplan.pure.search._search import search_meshes
from meshplan.pure.search._ties import dcn_bytes, order_ties, tied_count

__all__ = ["RANK_BY", "MeshCandidate", "ParamGroup", "Rejection", "SearchRequest", "SearchResult", "search_meshes"]
# Pipeline layouts (a pp axis outermost, each stage searched as a smaller model).
__all__ += ["PipelineSearch", "price_pipeline", "search_pipelines"]
# Layouts the step-time model cannot tell apart: tied with the best, in a stated order.
__all__ += ["dcn_bytes", "order_ties", "tied_count"]
