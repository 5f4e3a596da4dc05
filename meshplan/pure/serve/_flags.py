"""The command a plan's layout is served with, for each engine: every flag the plan depends on, spelled out.

The values are the plan's (the context, the sequences, the memory fraction it priced the KV cache at), so the
engine sizes its cache the way the plan did; nothing is left to a default that may differ between versions.
Replicas beyond the first are more servers of the same command, behind a load balancer.

Example:
  >>> from meshplan.pure.serve import ServeLayout, WeightQuant
  >>> lines = engine_command("vllm", "llama3.1-70b", ServeLayout(1, 8), context=32768, sequences=64,
  ...                        fraction=0.9, quant=WeightQuant(), kv_dtype="bfloat16", prompt_tokens=2048)
  >>> lines[0]
  'vllm serve meta-llama/Llama-3.1-70B \\\\'
"""

from __future__ import annotations

from meshplan.pure.serve._context import HF_REPOS, MAXTEXT_NAMES
from meshplan.pure.serve._engines import VLLM_MAX_NUM_BATCHED_TOKENS, Engine, engine
from meshplan.pure.serve._layout import ServeLayout
from meshplan.pure._check import as_count
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.serve._quant import WeightQuant
from meshplan.pure.serve._quant import kv_dtype as canonical_kv

__all__ = ["engine_command"]


def _vllm_quant(quant: WeightQuant, tpu: bool) -> list[str]:
    if quant.dtype == "float8":
        return (["--quantization fp8"] if quant.scales == "tensor"
                else ["# an FP8 checkpoint (per-channel scales, e.g. FP8-Dynamic): vLLM reads its quantization"])
    if quant.dtype == "int8":
        return ["--quantization tpu_int8"] if tpu else [
            "# an int8 checkpoint (compressed-tensors W8A8 / W8A16): vLLM reads its quantization"]
    return []


def _lines(head: str, flags: list[str]) -> tuple[str, ...]:
    real = [f for f in flags if not f.startswith("#")]
    notes = [f for f in flags if f.startswith("#")]
    body = [head] + [f"  {f}" for f in real]
    return tuple([line + " \\" for line in body[:-1]] + body[-1:] + notes)


def engine_command(eng: Engine | str, model: str, layout: ServeLayout, *, context: int, sequences: int,
                   fraction: float | None, quant: WeightQuant, kv_dtype: str, prompt_tokens: int) -> tuple[str, ...]:
    """The command that serves one replica of ``layout`` as the plan priced it (one line per flag).

    Args:
      eng: the engine (or its name).
      model: the serving name (its Hugging Face repository or MaxText model name is looked up).
      layout: the layout; one replica's command.
      context, sequences: the longest context and the concurrent sequences per replica.
      fraction: the memory fraction the plan priced (``None``: MaxText, which has none).
      quant, kv_dtype: the weight and cache dtypes.
      prompt_tokens: MaxText's ``max_prefill_predict_length``.

    Returns:
      Lines of a shell command, continued with ``\\``; a comment line where a flag depends on a checkpoint.
    """
    eng = engine(eng)
    if not isinstance(model, str):
        raise MeshplanTypeError(f"model={model!r:.60} must be a serving name (a str).")
    if not isinstance(layout, ServeLayout):
        raise MeshplanTypeError(f"layout={layout!r:.60} must be a ServeLayout.")
    if not isinstance(quant, WeightQuant):
        raise MeshplanTypeError(f"quant={quant!r:.60} must be a WeightQuant.")
    context = as_count(context, "context", maximum=10**12, error=PlanError)
    sequences = as_count(sequences, "sequences", maximum=10**9, error=PlanError)
    prompt_tokens = as_count(prompt_tokens, "prompt_tokens", maximum=10**12, error=PlanError)
    kv_dtype = canonical_kv(kv_dtype)
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                 or not 0 < fraction <= 1):
        raise PlanError(f"fraction={fraction!r:.40} must be a number in (0, 1] or None.")
    if fraction is None and eng.name != "maxtext":
        raise PlanError(f"{eng.label}'s command needs the memory fraction the plan priced (fraction=None is MaxText's).")
    repo = HF_REPOS.get(model, f"<the Hugging Face repository of {model}>")
    per = layout.devices_per_replica
    if eng.name in ("vllm", "vllm-tpu"):
        flags = [f"--tensor-parallel-size {layout.tp}"]
        if layout.ep > 1:
            flags += [f"--data-parallel-size {layout.ep}", "--enable-expert-parallel"]
        flags += [f"--max-model-len {context}", f"--max-num-seqs {-(-sequences // layout.ep)}",
                  f"--gpu-memory-utilization {fraction:g}"]
        if eng.name == "vllm":
            flags.append(f"--max-num-batched-tokens {VLLM_MAX_NUM_BATCHED_TOKENS}")
        if kv_dtype == "float8":
            flags.append("--kv-cache-dtype fp8")
        return _lines(f"vllm serve {repo}", flags + _vllm_quant(quant, eng.name == "vllm-tpu"))
    if eng.name == "sglang":
        flags = [f"--model-path {repo}", f"--tp {per}"]
        if layout.ep > 1:
            flags += [f"--dp {layout.ep}", "--enable-dp-attention", f"--ep-size {per}"]
        flags += [f"--context-length {context}", f"--max-running-requests {sequences}",
                  f"--mem-fraction-static {fraction:g}"]
        if kv_dtype == "float8":
            flags.append("--kv-cache-dtype fp8_e4m3")
        if quant.dtype != "bfloat16":
            flags.append("--quantization fp8" if quant.dtype == "float8" else "--quantization w8a8_int8")
        return _lines("python -m sglang.launch_server", flags)
    name = MAXTEXT_NAMES.get(model, f"<MaxText's model_name for {model}>")
    batch = sequences / per
    flags = [f"model_name={name}", f"ici_tensor_parallelism={layout.tp}"]
    if layout.ep > 1:
        flags.append(f"ici_expert_parallelism={layout.ep}")
    flags += [f"per_device_batch_size={batch:g}", f"max_prefill_predict_length={min(prompt_tokens, context)}",
              f"max_target_length={context}", "weight_dtype=bfloat16", "scan_layers=false"]
    if quant.dtype != "bfloat16":
        flags.append(f"quantization={'int8' if quant.dtype == 'int8' else 'fp8'}")
    if kv_dtype != "bfloat16":
        flags += ["quantize_kvcache=True", f"kv_quant_dtype={'int8' if kv_dtype == 'int8' else 'fp8'}"]
    return _lines("python -m MaxText.maxengine_server MaxText/configs/base.yml", flags)
