"""compare_clusters verified by the compilers installed here: a TPU7x slice through libtpu, a B200 through the
CUDA plugin's sm_100 target, an AMD GPU as an estimate that says why; a small model, so it stays quick."""

from __future__ import annotations

import dataclasses
import io

import pytest

import meshplan
from meshplan.facade.verify._compilers import cuda_plugin_problem, libtpu_available
from meshplan.pure import get_preset

TINY = dataclasses.replace(get_preset("llama3-8b").spec, name="tiny-llama", num_layers=2, hidden_size=256,
                           intermediate_size=512, num_heads=4, num_kv_heads=4, head_dim=64, vocab_size=1024,
                           num_params=None)


@pytest.mark.slow  # a heavy compile: the second tier (pytest -m slow)
@pytest.mark.skipif(not libtpu_available() or cuda_plugin_problem() is not None,
                    reason="needs libtpu and the jax CUDA plugin (meshplan[tpu], meshplan[gpu])")
def test_each_row_is_exact_where_its_compiler_is_installed_and_says_why_not_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path))
    progress = io.StringIO()
    c = meshplan.compare_clusters(TINY, "tpu7x-8,1x8xB200,1x8xMI300X", seq=256, verify=True, top=1,
                                  prices="B200=5,tpu7x=4", stream=progress)
    rows = {o.cluster: o for o in c.options}
    assert rows["tpu7x-8"].status == "exact" and rows["tpu7x-8"].compiler.startswith("XLA:TPU (libtpu")
    assert rows["1x8xB200"].status == "exact" and rows["1x8xB200"].compiler.startswith("XLA:GPU")
    assert "a run on the GPU may peak up to" in rows["1x8xB200"].note  # deviceless: no autotuning, said
    mi = rows["1x8xMI300X"]
    assert mi.status == "estimate" and "ROCm plugin" in mi.note and mi.fits
    assert all(0 < o.memory_bytes < o.budget_bytes for o in c.options)
    assert "compiling the reference step of tiny-llama" in progress.getvalue()
    assert c.to_dict()["rows"][0]["verified"] is (c.options[0].status == "exact")
