"""What listing the buffers live at the peak costs a compile: ``compiled_memory`` with and without the dump.

Run: ``python benchmarks/research/bench_buffer_report.py [--backend cpu|tpu|both] [--reps N]``.

For each case the same reference train step (a scaled-down Llama, scanned layers, donated state,
AdamW) is compiled twice per repetition, in alternating order: once with ``top_buffers=0`` (the
baseline: no dump, XLA's figures only) and once with ``top_buffers=10`` (XLA writes its
buffer-assignment reports into a temporary directory, meshplan reads and parses them, the
directory is removed). Both runs compile: jax's in-memory compile cache is keyed on the options,
and a fresh step (a different vocabulary size) is built per repetition. Printed per case: the
median process CPU time of each (all threads; wall time on a shared machine measures the
neighbours), their ratio, the dump's size, and the time spent reading and parsing
(included in the "with" column). CPU: 8 XLA:CPU devices with the ``xla_backend_optimization_level=0``
the CLI uses; TPU: ahead of time for a v5e-8 slice (libtpu).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax
from jax.sharding import AxisType

import meshplan
from meshplan.facade.verify import _compiled
from meshplan.facade.verify._compilers import libtpu_available
from meshplan.facade.verify._targets import tpu_topology_mesh
from meshplan.pure.presets import MODEL_SPECS


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))


SIZES = ((256, 2), (512, 4))


def _spec(hidden: int, layers: int, vocab: int) -> object:
    return dataclasses.replace(MODEL_SPECS["llama3-8b"], name=f"llama-{hidden}x{layers}", num_layers=layers,
                               hidden_size=hidden, num_heads=8, num_kv_heads=4, head_dim=hidden // 8,
                               intermediate_size=4 * hidden, vocab_size=vocab, num_params=None)


def _mesh(backend: str) -> jax.sharding.Mesh:
    if backend == "tpu":
        return tpu_topology_mesh("v5e-8", ("fsdp", "tp"), (4, 2))
    return jax.make_mesh((4, 2), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2)


def _time_reading() -> list[float]:
    """Wrap the facade's dump reader to time it (the benchmark's own instrument, not a change of behaviour)."""
    spent: list[float] = []
    original = _compiled._largest

    def timed(*args: object, **kwargs: object) -> object:
        start = time.process_time()
        try:
            return original(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            spent.append(time.process_time() - start)

    _compiled._largest = timed  # type: ignore[assignment]
    return spent


def _dump_bytes(spec: object, mesh: jax.sharding.Mesh, options: dict[str, object]) -> int:
    import tempfile

    ref = meshplan.reference_step(spec, mesh, batch=8, seq=128)
    with tempfile.TemporaryDirectory() as d:
        meshplan.compiled_memory(ref.fn, *ref.args, compiler_options={**options, "xla_dump_to": d,
                                                                       "xla_dump_hlo_as_text": True})
        return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cpu", "tpu", "both"), default="both")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", type=int, default=len(SIZES), help="how many of the model sizes to run")
    args = parser.parse_args()
    backends = ["cpu", "tpu"] if args.backend == "both" else [args.backend]
    if "tpu" in backends and not libtpu_available():
        print("libtpu is not installed: TPU cases skipped")
        backends.remove("tpu")
    reading = _time_reading()
    rows = []
    for backend in backends:
        mesh = _mesh(backend)
        options = {"xla_backend_optimization_level": 0} if backend == "cpu" else {}
        for hidden, layers in SIZES[: args.sizes]:
            base, dump, parse = [], [], []
            for rep in range(args.reps):
                spec = _spec(hidden, layers, 4096 + 128 * rep + (0 if backend == "cpu" else 64))
                ref = meshplan.reference_step(spec, mesh, batch=8, seq=128)
                order = (0, 10) if rep % 2 == 0 else (10, 0)
                for top in order:
                    # CPU time of this process (all its threads): on a shared, loaded machine wall time
                    # mostly measures the neighbours.
                    start = time.process_time()
                    mem = meshplan.compiled_memory(ref.fn, *ref.args, compiler_options=options or None,
                                                   top_buffers=top)
                    seconds = time.process_time() - start
                    (dump if top else base).append(seconds)
                    if top:
                        parse.append(reading[-1])
                        assert len(mem.largest) == 10, mem.largest_note
            size = _dump_bytes(_spec(hidden, layers, 4000), mesh, options)
            b, d = statistics.median(base), statistics.median(dump)
            rows.append([backend, f"hidden {hidden} x {layers} layers", f"{b:.2f}", f"{d:.2f}", f"{d / b:.2f}",
                         f"{min(base):.2f}", f"{min(dump):.2f}", f"{min(dump) / min(base):.2f}",
                         f"{statistics.median(parse) * 1000:.0f}", f"{size / 2**20:.1f}"])
    print_table(["backend", "model (scanned Llama)", "off (median)", "on (median)", "ratio", "off (min)",
                 "on (min)", "ratio (min)", "read+parse ms", "dump MiB"], rows)
    print(f"process CPU seconds (all threads) per compile, top_buffers=0 (off) and 10 (on), {args.reps} "
          f"repetitions each, alternating order; load: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
