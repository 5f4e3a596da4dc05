"""The compile cache: keyed by what changes the program, atomic, corrupt entries ignored and rewritten."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import cli
from meshplan.facade.verify import _cache as cc
from meshplan.pure.xla import CompiledMemory
from meshplan.facade.verify._reference import ReferenceConfig
from meshplan.facade.verify._jobs import CompileJob
from meshplan.pure.verify import CompileOutcome
from meshplan.pure import get_preset, parse_cluster
from meshplan.pure.xla._buffer_report import LiveBuffer

JOB = CompileJob(get_preset("gpt2").spec, parse_cluster("1x8xH100"), ("dp", "tp"), (4, 2), None, None,
                 batch=8, seq=64, config=ReferenceConfig())
MEM = CompiledMemory(argument_bytes=10, output_bytes=10, alias_bytes=10, temp_bytes=5, peak_bytes=15,
                     peak_source="peak_memory_in_bytes", reported_peak_bytes=15, generated_code_bytes=0,
                     host_temp_bytes=0, platform="gpu", device_kind="NVIDIA H100 80GB HBM3", num_devices=8,
                     compile_seconds=1.5, largest=(LiveBuffer("param", 10, "f32[2]", "f32", "parameter", "a"),),
                     largest_note="XLA's buffer assignment")
OUTCOME = CompileOutcome("8 x NVIDIA H100 80GB HBM3", MEM, seconds=3.0)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["batch", "seq", "axis_sizes", "target", "remat", "num_layers", "dcn_shape", "cluster"]))
def test_every_fact_that_changes_the_program_changes_the_key(field):
    changed = {
        "batch": lambda j: dataclasses.replace(j, batch=16),
        "seq": lambda j: dataclasses.replace(j, seq=128),
        "axis_sizes": lambda j: dataclasses.replace(j, axis_sizes=(2, 4)),
        "target": lambda j: dataclasses.replace(j, target="cpu"),
        "remat": lambda j: dataclasses.replace(j, config=ReferenceConfig(remat="none")),
        "num_layers": lambda j: dataclasses.replace(j, spec=dataclasses.replace(j.spec, num_layers=3,
                                                                                num_params=None)),
        "dcn_shape": lambda j: dataclasses.replace(j, dcn_shape=(1, 1)),
        "cluster": lambda j: dataclasses.replace(j, cluster=parse_cluster("1x8xH200")),
    }[field](JOB)
    assert cc.job_key(JOB) == cc.job_key(dataclasses.replace(JOB)) != cc.job_key(changed)


def test_a_changed_meshplan_never_reads_figures_compiled_by_another(monkeypatch, tmp_path):
    # meshplan builds the step it compiles: its own source is a fact of the key (a fix to the pipelined step's
    # shardings once changed a 70B peak from 140 GiB to 42 GiB under the same job).
    before = cc.job_key(JOB)
    assert cc._source_digest() == cc._source_digest()  # read once, the same within a process
    monkeypatch.setattr(cc, "_source_digest", lambda: "another meshplan")
    assert cc.job_key(JOB) != before


def test_an_entry_round_trips_and_a_corrupt_one_is_a_miss_then_rewritten(tmp_path):
    key = cc.job_key(JOB)
    assert cc.load_outcome(key, tmp_path) is None
    assert cc.store_outcome(key, OUTCOME, tmp_path)
    assert cc.load_outcome(key, tmp_path) == OUTCOME
    path = tmp_path / f"{key}.json"
    for junk in ("", "{", "[1, 2]", json.dumps({"format": 1, "memory": {"peak_bytes": "x"}}), "\x00\xff"):
        path.write_text(junk, encoding="latin-1")
        assert cc.load_outcome(key, tmp_path) is None, junk
    assert cc.store_outcome(key, OUTCOME, tmp_path) and cc.load_outcome(key, tmp_path) == OUTCOME


def test_failures_are_not_cached_so_the_next_plan_retries(tmp_path):
    assert not cc.store_outcome("k" * 64, CompileOutcome("t", None, error="timed out after 600 s"), tmp_path)
    assert cc.cache_info(tmp_path).entries == 0


def test_concurrent_writers_leave_one_whole_entry(tmp_path):
    key = cc.job_key(JOB)
    outcomes = [dataclasses.replace(OUTCOME, seconds=float(i)) for i in range(8)]
    threads = [threading.Thread(target=lambda o=o: [cc.store_outcome(key, o, tmp_path) for _ in range(20)])
               for o in outcomes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cc.load_outcome(key, tmp_path) in outcomes
    assert [p.name for p in tmp_path.iterdir()] == [f"{key}.json"]  # no temporary file left behind


def test_the_cache_directory_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("MESHPLAN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.cache_dir() == tmp_path / "xdg" / "meshplan"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cc.cache_dir() == tmp_path / "home" / ".cache" / "meshplan"
    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path / "mine"))
    assert cc.cache_dir() == tmp_path / "mine"


def test_cache_info_and_clear_on_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path))
    cc.store_outcome(cc.job_key(JOB), OUTCOME)
    cc.store_outcome(cc.job_key(dataclasses.replace(JOB, seq=32)), OUTCOME)
    assert cli.main(["cache", "info"]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path}: 2 compiled steps, ")
    assert cli.main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"removed 2 compiled steps from {tmp_path}\n"
    assert cc.cache_info().entries == 0
    with pytest.raises(SystemExit):
        cli.main(["cache", "drop"])
