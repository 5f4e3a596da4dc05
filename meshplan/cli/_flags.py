"""The flags ``plan`` and ``check`` share: how the reference step is written, where it compiles, the budget.

``--remat``, ``--attention``, ``--optimizer``, ``--micro-batches`` and ``--vocab-tiles`` describe the training
step both price (:func:`training_recipe`) and compile (:func:`reference_config`); ``--target`` says where it
compiles; ``--mem-fraction`` / ``--headroom`` say how much of each device the step gets (:func:`headroom_for`,
whose defaults are :func:`meshplan.pure.cluster.default_headroom`'s, the library's own).
"""

from __future__ import annotations

import os
from typing import Any

from meshplan.cli._args import fraction
from meshplan.pure.cluster import Cluster, default_headroom
from meshplan.pure.cost import CAPACITY_FACTOR, MOE_DISPATCHES, TrainingRecipe
from meshplan.pure.errors import PlanError

__all__ = ["add_mem_fraction", "add_moe_dispatch", "add_reference_flags", "headroom_for", "reference_config",
           "training_recipe", "verification_wanted"]


def training_recipe(args: Any, *, backend: str | None = None) -> TrainingRecipe:
    """The :class:`~meshplan.pure.cost.TrainingRecipe` the reference-step flags describe (``--remat``,
    ``--attention``, ...): what ``plan`` prices, and what ``check`` prices next to the step it compiles.
    ``backend`` ``None``: the cluster's compiler, which the search fills in."""
    # --matmul-dtype is plan's alone: check compiles the reference step, whose matmuls are bf16. check takes
    # --moe-dispatch only to refuse dropless for an MoE model.
    return TrainingRecipe(weight_dtype=args.dtype, optimizer=args.optimizer,
                          master_weights=getattr(args, "master_weights", False), remat=args.remat,
                          attention=args.attention, micro_batches=args.micro_batches or 1,
                          vocab_tiles=args.vocab_tiles, backend=backend,
                          matmul_dtype=getattr(args, "matmul_dtype", "bfloat16"),
                          moe_dispatch=getattr(args, "moe_dispatch", "einsum"),
                          capacity_factor=_given(getattr(args, "capacity_factor", None), CAPACITY_FACTOR))


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def reference_config(args: Any, param_dtype: str) -> Any:
    """The :class:`~meshplan.ReferenceConfig` the command-line flags describe."""
    from meshplan.facade.verify import reference_config as from_recipe  # lazily: the facade imports jax

    return from_recipe(training_recipe(args), param_dtype=param_dtype)


def add_reference_flags(parser: Any) -> None:
    """The flags that say how the reference step is written and where it compiles."""
    parser.add_argument("--target", choices=("auto", "cpu"), default="auto",
                        help="auto: the cluster's own compiler (a TPU topology with libtpu, a GPU cluster with "
                             "the CUDA plugin; no TPU or GPU needed); cpu: simulated XLA:CPU devices, as many "
                             "as the cluster has")
    parser.add_argument("--remat", choices=("none", "full", "dots", "offload"), default="full",
                        help="reference step's remat policy (default full)")
    parser.add_argument("--attention", choices=("plain", "dot_product", "flash"), default="dot_product",
                        help="reference step's attention (default jax.nn.dot_product_attention; flash: the "
                             "Pallas kernel on TPU, cuDNN's fused attention on GPU)")
    parser.add_argument("--optimizer", choices=("adamw", "adafactor", "lion", "sgd"), default="adamw",
                        help="reference step's optax optimizer, state in fp32 (default adamw)")
    parser.add_argument("--micro-batches", type=int, default=None, metavar="M",
                        help="gradient accumulation steps (plan: default the fewest that fit, chosen per mesh; "
                             "check: default 1)")
    parser.add_argument("--vocab-tiles", type=int, default=1, metavar="T",
                        help="loss computed in T sequence chunks (default 1)")


def add_moe_dispatch(parser: Any) -> None:
    """``--moe-dispatch einsum|dropless``: how an MoE model's layers reach their experts (the recipe's
    ``moe_dispatch``)."""
    parser.add_argument("--moe-dispatch", default="einsum", choices=MOE_DISPATCHES,
                        help="how MoE layers reach their experts: einsum (default: GShard's capacity dispatch, as "
                             "meshplan's reference step and MaxText's sparse_matmul: False run it) or dropless "
                             "(grouped GEMMs over the routed tokens, as DeepSeek-V3, MaxText's sparse_matmul: True "
                             "and Megatron-LM run them; priced at the mean expert load); the reference step runs "
                             "einsum only, so a dropless MoE plan is not compiled (check refuses it)")
    parser.add_argument("--capacity-factor", type=float, default=None, metavar="F",
                        help=f"einsum dispatch: each expert's capacity over the even share of tokens (default "
                             f"{CAPACITY_FACTOR}, MaxText's capacity_factor; at least 1); priced and compiled as given")


def add_mem_fraction(parser: Any) -> None:
    """``--mem-fraction F``: the share of each GPU jax's allocator takes, which is a GPU plan's budget."""
    parser.add_argument("--mem-fraction", type=fraction("GPU memory"), metavar="F",
                        help="GPU: the fraction of each GPU's memory jax preallocates, the budget (default "
                             "$XLA_PYTHON_CLIENT_MEM_FRACTION, else jax's 0.75)")


def headroom_for(args: Any, cluster: Cluster) -> tuple[float, str]:
    """The headroom a plan or check uses, and where it comes from, as the plan's header says it.

    On a GPU the memory a jax process has is what its allocator preallocates: ``--mem-fraction``, else
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` when set, else jax's default (the library's default too:
    :func:`~meshplan.pure.cluster.default_headroom`). ``--headroom`` still wins when given; TPUs keep the 10%
    headroom.
    """
    if args.headroom is not None:
        return args.headroom, "--headroom"
    given, env = getattr(args, "mem_fraction", None), os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if cluster.device.ici_scope == "slice" or (given is None and not env):
        return default_headroom(cluster)
    if given is not None:
        return default_headroom(cluster, mem_fraction=given, source="--mem-fraction")
    try:
        fraction_ = float(env or "")
    except ValueError:
        fraction_ = -1.0
    if not 0 < fraction_ <= 1:
        raise PlanError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={env!r:.40} must be a fraction in (0, 1]; unset it "
                        "or pass --mem-fraction.")
    return default_headroom(cluster, mem_fraction=fraction_, source="XLA_PYTHON_CLIENT_MEM_FRACTION")


# MESHPLAN_VERIFY=0 (or off / no / false) makes --no-verify the default, e.g. in a test suite or on a laptop
# where the compiler is installed but a plan should stay instant; --verify K still asks for it.
_VERIFY_OFF = ("0", "off", "no", "false")


def verification_wanted(args: Any) -> bool:
    """Whether ``plan`` verifies: by default, for every format that shows the plan (not the flax / MaxText
    exports), unless ``--no-verify`` or ``MESHPLAN_VERIFY=0``; ``--verify K`` asks for it."""
    if args.no_verify or args.format in ("flax", "maxtext") or args.params is not None:
        return False
    return bool(args.verify) or os.environ.get("MESHPLAN_VERIFY", "").strip().lower() not in _VERIFY_OFF
