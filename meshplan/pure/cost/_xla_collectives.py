"""The step's collectives as XLA emits them on each backend: the model's terms relowered, for the HLO check.

The cost model prices what a step needs (:mod:`~meshplan.pure.cost._param_collectives`,
:mod:`~meshplan.pure.cost._activation_collectives`, each backend's own tp lowering read into
:mod:`~meshplan.pure.cost._tp_lowering`); a compiled program shows a few of those collectives in another form
(XLA:CPU has no reduce-scatter and moves 16-bit floats as f32; XLA:TPU's windowed einsum splits a tp gather into
permutes). :func:`xla_collectives` says what the program contains, term for term, so the compiled HLO can be
compared against the model (``tests/facade/test_collectives_vs_xla.py``); it prices nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from meshplan.pure._check import as_choice, as_count, as_flag, as_sequence, canonical_axis_sizes
from meshplan.pure.errors import MeshplanTypeError, PlanError
from meshplan.pure.cost._estimates import CommTerm

__all__ = ["XLA_BACKENDS", "xla_collectives"]


XLA_BACKENDS: tuple[str, ...] = ("cpu", "gpu", "tpu")
"""Backends :func:`xla_collectives` knows how XLA lowers collectives for."""


def xla_collectives(terms: Sequence[CommTerm], *, backend: str, itemsize: int, collective_matmul: bool = False,
                    sizes: Mapping[str, int] | None = None, micro_batches: int = 1) -> tuple[CommTerm, ...]:
    """The step's collectives as XLA emits them on ``backend``: the textbook terms, relowered.

    The textbook terms (:func:`~meshplan.pure.cost._param_collectives.param_terms`,
    :func:`~meshplan.pure.cost._activation_collectives.activation_terms`) are what the step needs;
    a compiled program shows them as the backend lowers them, and the HLO check
    (``tests/facade/test_collectives_vs_xla.py``) compares against this:

    - ``"cpu"``: XLA:CPU has no reduce-scatter; the SPMD partitioner emits an all-reduce
      of the same buffer and a dynamic-slice, so reduce-scatters become all-reduces of
      ``B``. XLA:CPU also computes 16-bit floats in f32 and moves the convert ahead of
      the collective, so a term priced at ``itemsize == 2`` moves twice the bytes (except a term
      whose ``what`` ends in ``f32)``, already counted in f32). With gradient accumulation
      (``micro_batches > 1``, the terms already repeated per micro-batch by
      :func:`~meshplan.pure.cost._step_time.accumulate`) XLA:CPU hoists the loop-invariant
      parameter gathers out of the micro-batch loop: the layers' forward gathers, the
      embedding's and the head's run once per step (the backward's, under remat, stay in it).
      XLA:TPU does not (fsdp=8 with 2 micro-batches: every gather twice).
    - ``"tpu"`` with ``collective_matmul`` (XLA:TPU's windowed einsum, on by default for
      large enough matmuls): a tp all-gather or reduce-scatter that feeds a matmul runs as
      ``n - 1`` collective-permutes of ``B/n`` each, overlapped with the matmul's pieces;
      ``collective_matmul=False`` models ``--xla_tpu_enable_windowed_einsum_for_all_gather=false``
      (and ``..._reduce_scatter=false``), where they stay as they are.
    - ``"gpu"``: as the terms say (:func:`~meshplan.pure.cost._activation_collectives.activation_terms` already
      counts XLA:GPU's tp, sp and MLA collectives, and :func:`~meshplan.pure.cost._step_time.accumulate` its
      gradients' all-reduce once per step with gradient accumulation, after the micro-batch loop).

    Bytes and calls are per device per step; ``seconds`` keep the textbook price (this says
    what the program contains, not a second cost model).

    Args:
      terms: the priced :class:`CommTerm` records of a candidate (``MeshCandidate.comm``).
      backend: one of :data:`XLA_BACKENDS`.
      itemsize: bytes per element the terms were priced at (2 for bf16 weights and activations).
      collective_matmul: whether XLA:TPU's windowed einsum is on (TPU only).
      sizes: mesh axis sizes (the permutes' chunk count); needed with ``collective_matmul``.
      micro_batches: gradient-accumulation steps the terms were priced with.

    Returns:
      The terms as emitted, in the same order.

    Example:
      >>> t = CommTerm("fsdp reduce-scatter of grads", "reduce-scatter", ("fsdp",), 1000, 2, "intra", 0.0)
      >>> [(x.kind, x.nbytes, x.calls) for x in xla_collectives([t], backend="cpu", itemsize=2)]
      [('all-reduce', 2000, 2)]
    """
    backend = as_choice(backend, "backend", tuple(XLA_BACKENDS), error=PlanError)
    size = as_count(itemsize, "itemsize", error=PlanError)
    collective_matmul = as_flag(collective_matmul, "collective_matmul")
    m = as_count(micro_batches, "micro_batches", error=PlanError)
    mesh = {} if sizes is None else dict(canonical_axis_sizes(sizes, "sizes"))
    if collective_matmul and backend == "tpu" and not mesh:
        raise PlanError("xla_collectives(collective_matmul=True) needs sizes= (the mesh axis sizes).")
    out = []
    for t in as_sequence(terms, "terms"):
        if not isinstance(t, CommTerm):
            raise MeshplanTypeError(f"terms must hold CommTerm records, got {t!r:.80}.")
        kind, nbytes, calls, what = t.kind, t.nbytes, t.calls, t.what
        if backend == "cpu":
            if m > 1 and kind == "all-gather" and "all-gather of params (" in what:
                # Hoisted out of the micro-batch loop: all of a term gathered once per pass, the forward
                # half of the layers' (their backward gathers stay in the loop).
                layers = "(fwd + bwd)" in what and "head" not in what
                calls = calls * (m + 1) // (2 * m) if layers else calls // m
            if kind == "reduce-scatter":
                kind, what = "all-reduce", f"{what} (XLA:CPU: all-reduce + dynamic-slice)"
            if size == 2 and "f32)" not in what:  # a term named '... f32)' is priced in f32 already
                nbytes *= 2
        elif backend == "tpu" and collective_matmul and "tp" in t.axes and kind in ("all-gather", "reduce-scatter"):
            # Windowed einsum: n - 1 permutes of one B/n chunk each per original call.
            n = math.prod(mesh.get(a, 1) for a in t.axes)
            kind, what = "collective-permute", f"{what} (XLA:TPU collective matmul)"
            nbytes, calls = nbytes // max(n, 1), calls * max(n - 1, 1)
        out.append(CommTerm(what, kind, t.axes, int(nbytes), calls, t.link, t.seconds))
    return tuple(out)
