"""``meshplan plan --params MODULE:ATTR``: the user's own flax nnx / linen / equinox tree, planned by the CLI."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from meshplan import cli
from meshplan.pure import SearchResult, get_preset, search_meshes

_NNX_LLAMA = '''
import jax.numpy as jnp
from flax import nnx

D, F, V, H, KV, HD = 64, 256, 512, 4, 2, 16


class Block(nnx.Module):
    def __init__(self, rngs):
        lin = lambda i, o: nnx.Linear(i, o, use_bias=False, param_dtype=jnp.bfloat16, rngs=rngs)
        self.input_layernorm = nnx.RMSNorm(D, param_dtype=jnp.bfloat16, rngs=rngs)
        self.q_proj, self.k_proj, self.v_proj = lin(D, H * HD), lin(D, KV * HD), lin(D, KV * HD)
        self.o_proj = lin(H * HD, D)
        self.gate_proj, self.up_proj, self.down_proj = lin(D, F), lin(D, F), lin(F, D)


class Llama(nnx.Module):
    def __init__(self, rngs=None):
        rngs = rngs or nnx.Rngs(0)
        self.embed_tokens = nnx.Embed(V, D, param_dtype=jnp.bfloat16, rngs=rngs)
        self.layers = nnx.List([Block(rngs) for _ in range(2)])
        self.norm = nnx.RMSNorm(D, param_dtype=jnp.bfloat16, rngs=rngs)
        self.lm_head = nnx.Linear(D, V, use_bias=False, param_dtype=jnp.bfloat16, rngs=rngs)


def make_model():
    return nnx.eval_shape(lambda: Llama(nnx.Rngs(0)))

def boom():
    raise ValueError("the config file is missing")

NOT_A_TREE = "hello"
INSTANCE = Llama()  # a value, not a builder: planned as it is
'''

_LINEN = '''
import jax, jax.numpy as jnp
import flax.linen as nn

class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(256, use_bias=False, name="up_proj")(x)
        return nn.Dense(64, use_bias=False, name="down_proj")(x)

def variables():
    return Mlp().init(jax.random.key(0), jnp.ones((1, 64)))
'''

_EQX = '''
import jax, equinox as eqx

def make():
    return eqx.nn.MLP(64, 64, 256, depth=2, key=jax.random.key(0))
'''

_ARGS = ("--model", "llama3-8b", "--cluster", "8xH100", "--batch", "8", "--seq", "256")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _cli_json(capsys: pytest.CaptureFixture[str], params: str, *extra: str) -> SearchResult:
    assert cli.main(["plan", *_ARGS, "--params", params, "--json", *extra]) == 0
    return SearchResult.from_json(capsys.readouterr().out)


def _same_plan(got: SearchResult, tree: Any, fixed: dict[str, int] | None = None) -> None:
    """The CLI's plan equals search_meshes' on the live tree: the same ranking and the same specs."""
    want = search_meshes(get_preset("llama3-8b").spec, "8xH100", params=tree, batch=8, seq=256, top_k=5,
                         fixed=fixed)
    assert [c.axis_sizes for c in got.candidates] == [c.axis_sizes for c in want.candidates]
    assert [c.axis_names for c in got.candidates] == [c.axis_names for c in want.candidates]
    def specs(candidate: Any) -> list[Any]:
        return jax.tree.leaves(candidate.specs_for(tree), is_leaf=lambda x: isinstance(x, PartitionSpec))

    got_specs, want_specs = [specs(c) for c in got.candidates], [specs(c) for c in want.candidates]
    assert got_specs == want_specs
    # Planned, not all replicated: some candidate splits the tree (the best may replicate a tree this small,
    # e.g. dp x sp on GPUs, where tp's collectives are priced as XLA:GPU emits them).
    assert any(any(e is not None for e in s) for c in got_specs for s in c)


def _load(path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_h12_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_nnx_llama_file_plans_like_search_meshes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "llama.py", _NNX_LLAMA)
    got = _cli_json(capsys, f"{path}:make_model")
    _same_plan(got, nnx.state(_load(path).Llama(nnx.Rngs(0)), nnx.Param))
    # A class is a builder too (called with no arguments, abstractly), a module instance a value: the same plan.
    assert _cli_json(capsys, f"{path}:Llama").to_json() == got.to_json()
    assert _cli_json(capsys, f"{path}:INSTANCE").to_json() == got.to_json()


def test_builders_run_abstractly(tmp_path: Path) -> None:
    from meshplan.cli._params import load_params

    path = _write(tmp_path, "llama.py", _NNX_LLAMA)
    for attr in ("Llama", "make_model"):
        tree = load_params((str(path), attr))
        leaves = jax.tree.leaves(tree)
        assert leaves and all(isinstance(v, jax.ShapeDtypeStruct) for v in leaves), attr
    # A value keeps its arrays (already allocated by the user); the paths are nnx.state's.
    value = load_params((str(path), "INSTANCE"))
    assert all(isinstance(v, jax.Array) for v in jax.tree.leaves(value))
    assert jax.tree.structure(value) == jax.tree.structure(tree)


def test_dotted_module_on_the_working_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "h12_user_model.py", _NNX_LLAMA)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "h12_user_model", raising=False)
    got = _cli_json(capsys, "h12_user_model:make_model")
    assert got.to_json() == _cli_json(capsys, f"{tmp_path / 'h12_user_model.py'}:make_model").to_json()
    sys.modules.pop("h12_user_model", None)


def test_shape_tree_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "shapes.py", """
        import jax, jax.numpy as jnp
        S = jax.ShapeDtypeStruct
        TREE = {"q_proj": {"kernel": S((64, 256), jnp.bfloat16)}, "o_proj": {"kernel": S((256, 64), jnp.bfloat16)},
                "step": 3}
        """)
    tree = {"q_proj": {"kernel": jax.ShapeDtypeStruct((64, 256), "bfloat16")},
            "o_proj": {"kernel": jax.ShapeDtypeStruct((256, 64), "bfloat16")}, "step": 3}
    _same_plan(_cli_json(capsys, f"{path}:TREE", "--fix", "tp=8"), tree, {"tp": 8})


def test_linen_and_equinox_trees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    linen = _write(tmp_path, "linen_mlp.py", _LINEN)
    # Trees this small fit replicated; fsdp=8 makes the plan shard them, so the specs say something.
    fix = {"fsdp": 8}
    _same_plan(_cli_json(capsys, f"{linen}:variables", "--fix", "fsdp=8"), _load(linen).variables(), fix)
    eqx_path = _write(tmp_path, "eqx_mlp.py", _EQX)
    _same_plan(_cli_json(capsys, f"{eqx_path}:make", "--fix", "fsdp=8"),
               eqx.filter(_load(eqx_path).make(), eqx.is_array), fix)


def test_flax_format_uses_the_user_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "llama.py", _NNX_LLAMA)
    assert cli.main(["plan", *_ARGS, "--params", f"{path}:make_model", "--format", "flax"]) == 0
    out = capsys.readouterr().out
    assert "q_proj" in out and "embed_tokens" in out


@pytest.mark.parametrize(("attr", "needle"), [
    ("boom", "ValueError: the config file is missing"),
    ("NOT_A_TREE", "holds no array"),
    ("nope", "has no attribute 'nope'"),
])
def test_errors_in_the_user_module(tmp_path: Path, capsys: pytest.CaptureFixture[str], attr: str,
                                   needle: str) -> None:
    path = _write(tmp_path, "llama.py", _NNX_LLAMA)
    assert cli.main(["plan", *_ARGS, "--params", f"{path}:{attr}", "--json"]) == 1
    captured = capsys.readouterr()
    assert needle in captured.err and "Traceback" not in captured.err
    assert needle in json.loads(captured.out)["error"]["message"]


def test_errors_in_the_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", *_ARGS, "--params", "h12_no_such_module:make"]) == 1
    assert "no module named 'h12_no_such_module'" in capsys.readouterr().err
    assert cli.main(["plan", *_ARGS, "--params", str(tmp_path / "missing.py") + ":make"]) == 1
    assert "no file" in capsys.readouterr().err
    broken = _write(tmp_path, "broken.py", "import h12_not_installed\n")
    assert cli.main(["plan", *_ARGS, "--params", f"{broken}:make"]) == 1
    assert "ModuleNotFoundError" in capsys.readouterr().err
    path = _write(tmp_path, "llama.py", _NNX_LLAMA)
    assert cli.main(["plan", *_ARGS, "--params", f"{path}:make_model", "--verify", "1"]) == 1
    assert "--verify" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # not MODULE:ATTR: usage error
        cli.main(["plan", *_ARGS, "--params", "no_colon_here"])
    assert exc.value.code == 2
    assert "MODULE:ATTR" in capsys.readouterr().err
