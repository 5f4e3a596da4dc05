"""Model presets: Hugging Face-named ``ShapeDtypeStruct`` trees, no weights.

``get_preset("llama3-70b")`` returns the model's :class:`ModelSpec` (heads,
experts, sizes: what a mesh search constrains on) and its parameter shapes.
The tree layout (nested dicts, ``"0"``-style layer keys, HF weight shapes,
stacked or per-expert leaves) is documented in ``presets._spec``.
"""

from meshplan.pure.presets._deepseek import deepseek_v3_params
from meshplan.pure.presets._gpt2 import gpt2_params
from meshplan.pure.presets._hf_config import (
    HF_DEFAULTS,
    HF_MODEL_TYPES,
    model_spec_from_hf_config,
)
from meshplan.pure.presets._llama import llama_params
from meshplan.pure.presets._maxtext_config import (
    MAXTEXT_DECODER_BLOCKS,
    model_spec_from_maxtext,
    parse_maxtext_yml,
)
from meshplan.pure.presets._scaled import scaled_model
from meshplan.pure.presets._registry import (
    MODEL_PRESETS,
    MODEL_SPECS,
    Preset,
    build_params,
    deepseek_v3,
    get_preset,
    gpt2_small,
    llama3_8b,
    llama3_70b,
    mixtral_8x7b,
    preset_names,
    resolve_preset_name,
)
from meshplan.pure.presets._spec import (
    FAMILIES,
    MLADims,
    ModelSpec,
    count_params,
    pricing_notes,
)

__all__ = [
    "FAMILIES",
    "HF_DEFAULTS",
    "HF_MODEL_TYPES",
    "MAXTEXT_DECODER_BLOCKS",
    "MLADims",
    "MODEL_PRESETS",
    "MODEL_SPECS",
    "ModelSpec",
    "Preset",
    "build_params",
    "count_params",
    "deepseek_v3",
    "deepseek_v3_params",
    "get_preset",
    "gpt2_params",
    "gpt2_small",
    "llama3_70b",
    "llama3_8b",
    "llama_params",
    "mixtral_8x7b",
    "model_spec_from_hf_config",
    "model_spec_from_maxtext",
    "parse_maxtext_yml",
    "preset_names",
    "pricing_notes",
    "resolve_preset_name",
    "scaled_model",
]
