"""Read a model config file (Hugging Face ``config.json``, MaxText model yml) into a :class:`ModelSpec`.

The one place meshplan opens a model file: the pure readers
(:func:`~meshplan.pure.presets.model_spec_from_hf_config`,
:func:`~meshplan.pure.presets.parse_maxtext_yml`) take its parsed contents.
``--model`` in ``meshplan plan`` / ``check`` / ``models``, :func:`load_model`,
:func:`~meshplan.pure.search_meshes` (through the spec it returns) and
:func:`~meshplan.reference_step` (a path as ``model``) all come here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from meshplan.pure.errors import MeshplanTypeError, ModelConfigError
from meshplan.pure.presets import (
    MODEL_SPECS,
    ModelSpec,
    model_spec_from_hf_config,
    model_spec_from_maxtext,
    parse_maxtext_yml,
    resolve_preset_name,
)
from meshplan.pure.presets._show import show_value

__all__ = ["MODEL_FILE_SUFFIXES", "is_model_file", "load_model", "maxtext_model_name", "resolve_model"]

MODEL_FILE_SUFFIXES = (".json", ".yml", ".yaml")
"""File name endings ``--model`` reads as a config file rather than a preset name."""

_MAX_BYTES = 16 * 2**20  # a config is a few KiB; refuse to slurp a checkpoint given by mistake


def is_model_file(text: str) -> bool:
    """Whether ``--model text`` names a config file (or a directory holding ``config.json``), not a preset.

    Example:
      >>> is_model_file("llama3-70b"), is_model_file("path/to/config.json"), is_model_file("x/llama3.1-405b.yml")
      (False, True, True)
    """
    return (text.lower().endswith(MODEL_FILE_SUFFIXES) or os.sep in text or "/" in text
            or os.path.isfile(os.path.join(text, "config.json")))


def maxtext_model_name(path: str | os.PathLike[str]) -> str | None:
    """MaxText's ``model_name`` for a model yml (its file name without ``.yml``), else ``None``.

    Example:
      >>> maxtext_model_name("configs/models/llama3.1-405b.yml"), maxtext_model_name("config.json")
      ('llama3.1-405b', None)
    """
    p = Path(path)
    return p.stem if p.suffix.lower() in (".yml", ".yaml") else None


def _read(path: Path) -> str:
    if "\x00" in str(path):  # the OS refuses such a path with a bare ValueError
        raise ModelConfigError(f"path={str(path)!r:.80} holds a NUL byte; give the path of a Hugging Face "
                               "config.json, a directory holding one, or a MaxText model yml.")
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise ModelConfigError(f"{path}: {path.stat().st_size:,} bytes is not a model config (a config.json "
                                   f"or model yml is a few KiB); give the config file, not the weights.")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ModelConfigError(f"{path}: not UTF-8 text; give a Hugging Face config.json or a MaxText model "
                               f"yml.") from None
    except OSError as err:
        raise ModelConfigError(f"{path}: cannot read the model file ({err.strerror or err}); give a Hugging Face "
                               f"config.json, a directory holding one, or a MaxText model yml.") from None


def load_model(path: str | os.PathLike[str], *, name: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` a model config file describes.

    Args:
      path: a Hugging Face ``config.json`` (or a model directory holding one) or a MaxText model yml
        (``.yml`` / ``.yaml``: ``configs/models/llama3.1-405b.yml``).
      name: the spec's name (default: the model directory's name for a ``config.json``, the file
        name without ``.yml`` for a MaxText yml, which is MaxText's ``model_name``).

    Returns:
      The spec; pass it to :func:`~meshplan.pure.search_meshes` or :func:`~meshplan.reference_step`.

    Raises:
      ModelConfigError: the file is missing, unreadable, not JSON / flat YAML, or describes a model
        meshplan cannot read (each message names the file and the key).
      MeshplanTypeError: ``path`` is not a str or path.

    Example:
      >>> import json, pathlib, tempfile
      >>> d = pathlib.Path(tempfile.mkdtemp()) / "tiny-llama"
      >>> d.mkdir()
      >>> _ = (d / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 1000,
      ...     "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}))
      >>> spec = load_model(d)
      >>> spec.name, spec.head_dim
      ('tiny-llama', 16)
    """
    if not isinstance(path, (str, os.PathLike)):
        raise MeshplanTypeError(f"path={show_value(path)} must be a file path (str or os.PathLike).")
    p = Path(path)
    try:
        is_dir = p.is_dir()
    except OSError as err:  # is_dir answers False for a missing path but raises a name too long (ENAMETOOLONG)
        raise ModelConfigError(f"{str(p)!r:.80}: cannot read the model file ({err.strerror or err}); give a Hugging "
                               "Face config.json, a directory holding one, or a MaxText model yml.") from None
    if is_dir:
        p = p / "config.json"
    text = _read(p)
    if p.suffix.lower() in (".yml", ".yaml"):
        stem = maxtext_model_name(p) or p.stem
        return model_spec_from_maxtext(parse_maxtext_yml(text, source=str(p)), name=name or stem, source=str(p))
    try:
        config: Any = json.loads(text)
    except json.JSONDecodeError as err:
        raise ModelConfigError(f"{p}: not JSON ({err.msg} at line {err.lineno}, column {err.colno}); give a "
                               f"Hugging Face config.json or a MaxText model yml (.yml).") from None
    except (ValueError, RecursionError) as err:  # an int past Python's 4,300-digit limit; absurd nesting
        raise ModelConfigError(f"{p}: not a model config ({type(err).__name__}: {str(err)[:80]}); give a "
                               f"Hugging Face config.json or a MaxText model yml (.yml).") from None
    if name is None and p.name == "config.json" and p.parent.name:
        name = p.parent.name
    return model_spec_from_hf_config(config, name=name or p.stem, source=str(p))


def resolve_model(model: str | os.PathLike[str] | ModelSpec) -> ModelSpec:
    """A preset name, a model file path or a :class:`ModelSpec`, as a spec (what ``--model`` and
    :func:`~meshplan.reference_step` accept).

    Example:
      >>> resolve_model("mistral-7b").num_params
      7241732096
    """
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, os.PathLike) or (isinstance(model, str) and is_model_file(model)):
        return load_model(model)
    if isinstance(model, str):
        return MODEL_SPECS[resolve_preset_name(model)]
    raise MeshplanTypeError(f"model={show_value(model)} must be a preset name, a model config path or a ModelSpec.")
