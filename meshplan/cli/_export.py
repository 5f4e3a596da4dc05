"""``meshplan plan --rules FILE`` (path rules or a logical table) and ``--format json|flax|maxtext``.

A rules file is JSON in one of two forms, told apart by its top level:

* path rules: a list of ``[regex, spec]`` pairs, or ``{"rules": [...]}``;
* a logical table: ``{"logical_axis_rules": [[logical name, mesh axes], ...],
  "logical_names": [[regex, [name or null, ...]], ...]}`` (MaxText's key for
  the table; the names say which dims of which leaves carry which names).

Both fall back to the default per-axis-kind rule for leaves they do not
cover. The exports are :func:`meshplan.pure.export_plan`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from meshplan.pure import AxisKindRule, LogicalRule, ModelSpec, Rule, SearchResult
from meshplan.pure.report import export_plan
from meshplan.pure.rules import logical_rule_from_json, path_rule_from_json
from meshplan.pure.cost._placement import AXIS_ORDER

__all__ = ["RulesFileError", "load_rules", "render_export"]

_FORMS = ('path rules (a list of [regex, spec] pairs, or {"rules": [...]}) or a logical table '
          '({"logical_axis_rules": [[name, axes], ...], "logical_names": [[regex, [name, ...]], ...]})')


class RulesFileError(Exception):
    """A rules file that cannot be read or has neither form (the CLI exits 1 with this message)."""


def load_rules(path: str, model: ModelSpec) -> Rule:
    """The rule a ``--rules FILE`` describes, over the model's default rule.

    Raises:
      RulesFileError: the file cannot be read, is not JSON, or is neither form.
      MeshplanError: the form is right but an entry is not (the message names it).
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as err:
        raise RulesFileError(f"cannot read --rules {path!r}: {err.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RulesFileError(f"--rules {path!r} is not valid JSON: {err}") from None
    except RecursionError:
        raise RulesFileError(f"--rules {path!r} is JSON nested too deeply to read.") from None
    fallback = AxisKindRule.for_model(model)
    if isinstance(data, Mapping) and "logical_axis_rules" in data:
        # The table may name only the axes the search can build; a typo is caught here, not per mesh.
        return logical_rule_from_json(data, fallback=fallback, mesh_axes=AXIS_ORDER)
    if isinstance(data, list) or (isinstance(data, Mapping) and "rules" in data):
        return path_rule_from_json(data, fallback=fallback)
    if isinstance(data, Mapping):
        raise RulesFileError(
            f"--rules {path!r}: a rules object has exactly one key, 'rules' (path rules), or the keys "
            f"'logical_axis_rules' and 'logical_names' (a logical table); got keys {sorted(data)}. "
            f"Expected {_FORMS}.")
    raise RulesFileError(f"--rules {path!r} holds {type(data).__name__} {data!r}; expected {_FORMS}.")


def render_export(result: SearchResult, fmt: str, tree: Any, rule: Rule | None) -> str:
    """The text ``--format`` prints for a non-table format (the best mesh for flax / maxtext).

    MaxText's ``logical_axis_rules`` are written only for a logical rules file: names made
    up from mesh axes (what the flax export uses without one) mean nothing to MaxText's model.
    """
    names = rule if isinstance(rule, LogicalRule) else None
    if fmt == "maxtext" and names is None:
        tree = None
    return export_plan(result, fmt, tree=tree, names=names)
