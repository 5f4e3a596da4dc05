"""A cache of compiled reference steps' figures, so a re-plan of the same request is instant.

An entry is keyed by everything that changes the compiled program: the model's
dims, the cluster, the mesh and its DCN split, the plan's parameter and batch
specs, the reference config (remat, attention, optimizer, micro-batches, ...),
batch and sequence, the target, the compiler versions (jax, jaxlib, libtpu, the
CUDA plugin), for a GPU with no GPU the target description's text, and a
digest of meshplan's own source (which builds the step). The key is the
SHA-256 of that JSON; the entry is JSON (no pickles: the directory is
the user's, and a file there must never run code).

Where: ``$MESHPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/meshplan``, else
``~/.cache/meshplan``. Writes go to a temporary file in the same directory and
are renamed into place (atomic on POSIX), so concurrent writers cannot leave a
half-written entry; one that is corrupt anyway (a crash, a hand edit) is
ignored and rewritten by the next compile.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from meshplan.facade.verify._compilers import installed_versions
from meshplan.facade.verify._gpu_targets import gpu_target_config, known_gpu_targets
from meshplan.facade.verify._jobs import CompileJob
from meshplan.pure.verify import CompiledStep, CompileOutcome
from meshplan.pure.xla import CompiledMemory, LiveBuffer

__all__ = ["CacheInfo", "cache_dir", "cache_info", "clear_cache", "job_key", "load_outcome", "store_outcome"]

_VERSION = 3  # the entry format; a change makes old entries misses
_SUFFIX = ".json"


def cache_dir() -> Path:
    """The cache directory: ``$MESHPLAN_CACHE_DIR``, ``$XDG_CACHE_HOME/meshplan`` or ``~/.cache/meshplan``.

    Example:
      >>> cache_dir().name in ("meshplan", os.path.basename(os.environ.get("MESHPLAN_CACHE_DIR", "")))
      True
    """
    given = os.environ.get("MESHPLAN_CACHE_DIR")
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "meshplan"


def _plan_facts(plan: Any) -> Any:
    """The candidate's parts that shape the program (specs and layout), not its priced figures."""
    if plan is None:
        return None
    data = dict(plan.to_dict())
    for priced in ("memory", "comm", "verdict", "rank", "step"):
        data.pop(priced, None)
    return data


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """SHA-256 of meshplan's own Python source: the step a job compiles is built by it (the reference and
    pipelined steps, the rules that lay out its parameters), so a changed meshplan never reads figures
    compiled by another. Read once per process (about 150 files)."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def job_key(job: CompileJob) -> str:
    """The SHA-256 (hex) of everything in ``job`` and the installed compilers that changes the program.

    Example:
      >>> from meshplan.pure import get_preset, parse_cluster
      >>> from meshplan.facade.verify._reference import ReferenceConfig
      >>> job = CompileJob(get_preset("gpt2").spec, parse_cluster("1x8xH100"), ("dp",), (8,), None, None,
      ...                  batch=8, seq=64, config=ReferenceConfig())
      >>> job_key(job) == job_key(job) != job_key(dataclasses.replace(job, seq=128))
      True
    """
    target_text = None
    if job.target != "cpu" and job.cluster.device.ici_scope != "slice":
        if job.cluster.device.name in known_gpu_targets():
            target_text = gpu_target_config(job.cluster.device)
    facts = {
        "format": _VERSION,
        "model": dataclasses.asdict(job.spec),
        # The cluster's shape and device kind; not its priced figures (HBM, bandwidths), which the program
        # does not depend on: the target description (GPU) or libtpu's topology (TPU) is what XLA reads.
        "cluster": [job.cluster.device.name, job.cluster.device.ici_scope, job.cluster.num_nodes,
                    job.cluster.devices_per_node, job.cluster.text],
        "mesh": [list(job.axis_names), list(job.axis_sizes), None if job.dcn_shape is None else list(job.dcn_shape)],
        "plan": _plan_facts(job.plan),
        "batch": job.batch, "seq": job.seq,
        "config": dataclasses.asdict(job.config),
        "target": job.target, "target_description": target_text,
        "compilers": installed_versions(),
        "meshplan": _source_digest(),
    }
    if job.pipeline is not None:  # the pipelined step (m, v); unpipelined jobs keep the keys they had
        facts["pipeline"] = list(job.pipeline)
    text = json.dumps(facts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _outcome_dict(outcome: CompileOutcome) -> dict[str, Any]:
    mem = None
    if outcome.memory is not None:
        mem = {f.name: getattr(outcome.memory, f.name) for f in dataclasses.fields(outcome.memory)}
        mem["largest"] = [dataclasses.asdict(b) for b in outcome.memory.largest]
    return {"format": _VERSION, "target": outcome.target, "memory": mem, "oom": outcome.oom,
            "oom_required_bytes": outcome.oom_required_bytes, "oom_available_bytes": outcome.oom_available_bytes,
            "error": outcome.error, "seconds": outcome.seconds, "deviceless": outcome.deviceless,
            "step": None if outcome.step is None else outcome.step.to_dict(), "step_note": outcome.step_note}


def _outcome_from(data: Any) -> CompileOutcome | None:
    """The outcome an entry holds, or None for anything that is not a well-formed entry."""
    try:
        if data["format"] != _VERSION:
            return None
        mem = data["memory"]
        memory = None
        if mem is not None:
            largest = tuple(LiveBuffer(**b) for b in mem["largest"])
            memory = CompiledMemory(**{**mem, "largest": largest})
        return CompileOutcome(str(data["target"]), memory, oom=bool(data["oom"]),
                              oom_required_bytes=data["oom_required_bytes"],
                              oom_available_bytes=data["oom_available_bytes"], error=str(data["error"]),
                              seconds=float(data["seconds"]), deviceless=bool(data["deviceless"]),
                              step=None if data["step"] is None else CompiledStep.from_dict(data["step"]),
                              step_note=str(data["step_note"]))
    except (KeyError, TypeError, ValueError):  # a hand-edited or foreign file: a miss, rewritten later
        return None


def load_outcome(key: str, directory: Path | None = None) -> CompileOutcome | None:
    """The cached outcome for ``key``, or None (absent, unreadable, corrupt or from another format).

    Example:
      >>> load_outcome("0" * 64, Path("/nonexistent")) is None
      True
    """
    path = (directory or cache_dir()) / f"{key}{_SUFFIX}"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return _outcome_from(data)


def store_outcome(key: str, outcome: CompileOutcome, directory: Path | None = None) -> bool:
    """Write ``outcome`` under ``key`` atomically; only figures from the compiler are kept (a crash or a
    timeout is worth retrying). Returns whether it was written (an unwritable directory is no error).

    Example:
      >>> store_outcome("0" * 64, CompileOutcome("cpu", None, error="timed out"), Path("/nonexistent"))
      False
    """
    if not outcome.ok and not outcome.oom:
        return False
    where = directory or cache_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}-", suffix=".tmp", dir=where)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_outcome_dict(outcome), f)
        os.replace(tmp, where / f"{key}{_SUFFIX}")  # atomic: readers see the old entry or the whole new one
    except OSError:
        return False
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class CacheInfo:
    """What the cache holds: its directory, the number of entries and their bytes.

    Example:
      >>> CacheInfo(Path("/tmp/c"), 2, 3 << 20).describe()
      '/tmp/c: 2 compiled steps, 3.0 MiB'
    """

    directory: Path
    entries: int
    bytes: int

    def describe(self) -> str:
        """One line for ``meshplan cache info``."""
        from meshplan.pure._format import fmt_bytes

        noun = "compiled step" if self.entries == 1 else "compiled steps"
        return f"{self.directory}: {self.entries} {noun}, {fmt_bytes(self.bytes)}"


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.suffix == _SUFFIX or p.suffix == ".tmp")
    except OSError:
        return []


def cache_info(directory: Path | None = None) -> CacheInfo:
    """How many entries the cache holds and their size.

    Example:
      >>> cache_info(Path("/nonexistent")).entries
      0
    """
    where = directory or cache_dir()
    found = [p for p in _entries(where) if p.suffix == _SUFFIX]
    size = 0
    for p in found:
        try:
            size += p.stat().st_size
        except OSError:  # removed meanwhile by another process
            continue
    return CacheInfo(where, len(found), size)


def clear_cache(directory: Path | None = None) -> int:
    """Remove every entry (and leftover temporary file); returns how many entries were removed.

    Example:
      >>> clear_cache(Path("/nonexistent"))
      0
    """
    removed = 0
    for p in _entries(directory or cache_dir()):
        try:
            p.unlink()
            removed += p.suffix == _SUFFIX
        except OSError:
            continue
    return removed
