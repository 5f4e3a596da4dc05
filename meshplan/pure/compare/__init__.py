"""Which cluster to rent: one model against several clusters or sizes, ranked by time, cost or per-device
throughput (:func:`build_comparison`), with the smallest option that fits and where scaling stops paying
(:func:`scaling_knees`). The text people type is read here too: cluster lists and brace ranges
(:func:`parse_cluster_list`, ``"v5p-{32..512}"``), node counts of one kind (:func:`node_range`), prices
(:func:`parse_prices`) and token budgets (:func:`parse_tokens`). Plain figures only: the searches and
compiles that fill a :class:`CompareOption` run in the facade (``meshplan.compare_clusters``).

Example:
  >>> [c.text for c in parse_cluster_list("v5p-{64..128},2xH200")]
  ['v5p-64', 'v5p-128', '2x8xH200']
"""

from meshplan.pure.compare._option import (
    CompareOption,
    Verified,
    cost_per_million_tokens,
    option_from_search,
    train_figures,
    unfit_option,
)
from meshplan.pure.compare._parse import (
    MAX_OPTIONS,
    MAX_TOKENS,
    check_prices,
    expand_braces,
    node_range,
    parse_cluster_list,
    parse_prices,
    parse_tokens,
    price_key,
)
from meshplan.pure.compare._rank import (
    CRITERIA,
    DEFAULT_KNEE_THRESHOLD,
    Comparison,
    KindScaling,
    ScalingStep,
    build_comparison,
    rank_options,
    scaling_knees,
    smallest_fitting,
)

__all__ = ["CRITERIA", "DEFAULT_KNEE_THRESHOLD", "MAX_OPTIONS", "MAX_TOKENS", "CompareOption", "Comparison",
           "KindScaling", "ScalingStep", "Verified", "build_comparison", "check_prices", "cost_per_million_tokens",
           "expand_braces", "node_range", "option_from_search", "parse_cluster_list", "parse_prices",
           "parse_tokens", "price_key", "rank_options", "scaling_knees", "smallest_fitting", "train_figures",
           "unfit_option"]
