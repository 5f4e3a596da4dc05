"""``--model``: a preset name or a model config file; and ``meshplan models`` (the presets and their counts).

``--model llama3-70b`` names a preset; ``--model path/to/config.json`` (or a model
directory holding one) reads a Hugging Face config, ``--model path/to/llama3.1-405b.yml``
a MaxText model yml (:func:`meshplan.load_model`). Either way the plan gets a
:class:`~meshplan.pure.ModelSpec` and its Hugging Face-named shape tree.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NamedTuple

from meshplan.facade._model_file import is_model_file, load_model, maxtext_model_name
from meshplan.pure.presets import (
    MODEL_SPECS,
    ModelSpec,
    build_params,
    count_params,
    get_preset,
    pricing_notes,
)

__all__ = ["LoadedModel", "add_parser", "load", "model_rows", "model_specs", "render_models", "run"]


class LoadedModel(NamedTuple):
    """What ``--model`` named: the spec, its shape tree, and MaxText's model name for a MaxText yml."""

    spec: ModelSpec
    params: Any
    maxtext_name: str | None


def load(text: str, *, dtype: Any = "bfloat16", unstack_experts: bool = False) -> LoadedModel:
    """The model ``--model text`` names (a preset, a ``config.json`` or a MaxText yml)."""
    if is_model_file(text):
        spec = load_model(text)
        return LoadedModel(spec, build_params(spec, dtype=dtype, unstack_experts=unstack_experts),
                           maxtext_model_name(text))
    preset = get_preset(text, dtype=dtype, unstack_experts=unstack_experts)
    return LoadedModel(preset.spec, preset.params, None)


def _traits(spec: ModelSpec) -> str:
    out = []
    if spec.is_moe:
        shared = f" + {spec.num_shared_experts} shared" if spec.num_shared_experts else ""
        out.append(f"MoE {spec.num_experts_per_tok} of {spec.num_experts}{shared}")
    if spec.mla is not None:
        out.append("MLA")
    if spec.mla is None and spec.num_heads * spec.head_dim != spec.hidden_size:
        out.append(f"head_dim {spec.head_dim}")
    if spec.qkv_bias:
        out.append("qkv bias")
    if spec.qk_norm:
        out.append("q/k norm")
    if spec.tied_embeddings:
        out.append("tied head")
    if spec.sliding_window:
        out.append(f"{spec.sliding_window_layers}/{spec.num_layers} layers window {spec.sliding_window}")
    return ", ".join(out)


def model_rows(specs: list[ModelSpec]) -> list[dict[str, Any]]:
    """One row per model: name, family, exact parameter count (from the shape tree) and its traits."""
    rows = []
    for spec in specs:
        counted = count_params(build_params(spec))
        rows.append({"name": spec.name, "family": spec.family, "params": counted,
                     "published": spec.num_params, "layers": spec.num_layers, "hidden": spec.hidden_size,
                     "heads": spec.num_heads, "kv_heads": spec.num_kv_heads, "traits": _traits(spec),
                     "notes": list(pricing_notes(spec))})
    return rows


def model_specs(files: list[str]) -> list[ModelSpec]:
    """The specs ``meshplan models`` lists: the given config files', else every preset's."""
    return [load_model(f) for f in files] if files else list(MODEL_SPECS.values())


def render_models(specs: list[ModelSpec], *, titled_files: bool, console: Any) -> None:
    """``meshplan models``: a table of ``specs`` with exact parameter counts, then the pricing notes."""
    from rich.table import Table

    rows = model_rows(specs)
    title = "Model files" if titled_files else "Model presets (--model NAME; or --model path/to/config.json or model.yml)"
    table = Table(title=title)
    for col in ("name", "family", "parameters (exact)", "layers", "hidden", "heads / kv", "what it has"):
        table.add_column(col, justify="right" if col in ("parameters (exact)", "layers", "hidden") else "left")
    for r in rows:
        table.add_row(r["name"], r["family"], f"{r['params']:,}", str(r["layers"]), str(r["hidden"]),
                      f"{r['heads']} / {r['kv_heads']}", r["traits"])
    console.print(table)
    for note in sorted({n for r in rows for n in r["notes"]}):
        console.print(f"note: {note}")


def add_parser(sub: Any) -> None:
    """Register ``meshplan models`` on the command line's subparsers."""
    models = sub.add_parser("models", help="list the model presets with exact parameter counts (or read config files)")
    models.add_argument("files", nargs="*", metavar="FILE",
                        help="Hugging Face config.json files or MaxText model ymls to read instead of the presets")
    models.add_argument("--json", action="store_true", help="print the rows as JSON")
    models.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``meshplan models``: the table (or ``--json`` rows) of the presets or of the given files."""
    from meshplan.cli._console import make_console

    specs = model_specs(list(args.files))
    if args.json:
        sys.stdout.write(json.dumps({"models": model_rows(specs)}, indent=2) + "\n")
        return 0
    render_models(specs, titled_files=bool(args.files), console=make_console())
    return 0
