"""The design card's rules, checked on the source: pure stays device-free, imports flow facade -> pure."""

import ast
import subprocess
import sys
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "meshplan"
PURE = sorted((ROOT / "pure").rglob("*.py"))

# jax entry points that touch devices, backends or the distributed runtime.
_LIVE = {
    "devices", "local_devices", "device_put", "distributed", "process_index", "process_count",
    "default_backend", "local_device_count", "device_count", "make_mesh", "set_mesh", "get_mesh",
    "default_device", "config",
}


def _jax_attributes(tree: ast.AST) -> set[str]:
    """Attributes read directly off the name ``jax`` (``jax.devices`` -> "devices")."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "jax"
    }


def _imported_modules(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_there_are_pure_modules_to_check() -> None:
    assert len(PURE) > 10


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_never_touches_devices_or_the_facade(path: pathlib.Path) -> None:
    tree = ast.parse(path.read_text())
    live = _jax_attributes(tree) & _LIVE
    assert not live, f"{path.name} uses jax.{sorted(live)}; pure code takes plain data only"
    bad = {m for m in _imported_modules(tree) if m.startswith("meshplan.facade") or m == "meshplan"}
    assert not bad, f"{path.name} imports {sorted(bad)}; imports flow facade -> pure, never back"


# --- layers inside pure: report -> compare -> search -> cost -> xla -> cluster -> presets -> rules -> specs -> mesh
# (xla, the compiler-text parsers, sits below cost so that both cost and search may read it; it reads neither.
# compare ranks the answers of several searches; report renders them, so it sits on top.)
# Shared helpers sit below them all.

# A module may import its own layer and any layer after it in this list, never one before it.
_LAYERS = ("report", "compare", "search", "cost", "xla", "cluster", "presets", "rules", "specs", "mesh")
_SHARED = {"meshplan.pure._types", "meshplan.pure._check", "meshplan.pure._format", "meshplan.pure._fields",
           "meshplan.pure.errors"}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["meshplan", "pure"] and parts[2] in _LAYERS else None


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


LAYERED = [p for p in PURE if _layer(_module_name(p))]


def test_every_pure_module_sits_in_a_layer_or_is_shared() -> None:
    loose = [
        _module_name(p) for p in PURE
        if not _layer(_module_name(p)) and _module_name(p) not in _SHARED | {"meshplan.pure"}
    ]
    assert not loose, f"{loose} sit in no layer; put them in one of meshplan/pure/{{{','.join(_LAYERS)}}}/"


@pytest.mark.parametrize("path", LAYERED, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_imports_only_go_down_the_layers(path: pathlib.Path) -> None:
    own = _LAYERS.index(_layer(_module_name(path)) or "")
    upward = sorted(
        m for m in _imported_modules(ast.parse(path.read_text()))
        if _layer(m) and _LAYERS.index(_layer(m) or "") < own
    )
    assert not upward, f"{path.name} ({_LAYERS[own]}) imports {upward} from a layer above it"


SHARED = [p for p in PURE if _module_name(p) in _SHARED]


@pytest.mark.parametrize("path", SHARED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shared_pure_modules_import_no_layer(path: pathlib.Path) -> None:
    layered = sorted(m for m in _imported_modules(ast.parse(path.read_text())) if _layer(m) or m == "meshplan.pure")
    assert not layered, f"{path.name} is shared by every layer and must not import {layered}"


@pytest.mark.parametrize("source, inside", [
    ("from meshplan.pure.rules._auto import AutoRule\n", "mesh"),
    ("from meshplan.pure.search._candidate import MeshCandidate\n", "cost"),
    ("from meshplan.pure.cost._step_memory import step_memory\n", "xla"),
    ("from meshplan.pure.cost._collective_time import collective_time\n", "cluster"),
    ("from meshplan.pure.compare._rank import rank_options\n", "search"),
    ("from meshplan.pure.report._compare_svg import compare_svgs\n", "compare"),
])
def test_the_layer_test_catches_an_upward_import(source: str, inside: str) -> None:
    # The check above must be able to fail: each of these imports points up from the layer ``inside``.
    found = {m for m in _imported_modules(ast.parse(source)) if _layer(m)}
    assert found and all(_LAYERS.index(_layer(m) or "") < _LAYERS.index(inside) for m in found)


def test_every_pure_subpackage_is_a_layer() -> None:
    # A new room under pure/ must take its place in the order, or the layer test would not look at it.
    rooms = sorted(p.name for p in (ROOT / "pure").iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(_LAYERS)


def test_importing_pure_loads_no_facade_module() -> None:
    # In a fresh interpreter: this test process has imported the facade already.
    code = (
        "import sys, meshplan.pure; "
        "bad = sorted(m for m in sys.modules if m.startswith(('meshplan.facade', 'meshplan.cli'))); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"import meshplan.pure loaded {run.stdout.strip()} {run.stderr[-500:]}"


def test_the_top_level_names_the_facade_lazily_and_all_of_them_resolve() -> None:
    code = (
        "import sys, meshplan; "
        "loaded = [m for m in sys.modules if m.startswith('meshplan.facade')]; "
        "missing = [n for n in meshplan.__all__ if not hasattr(meshplan, n)]; "
        "print(loaded, missing); sys.exit(1 if loaded or missing else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr[-500:]


@pytest.mark.parametrize("package", ["meshplan", "meshplan.pure", "meshplan.pure.mesh", "meshplan.pure.specs",
                                     "meshplan.pure.rules", "meshplan.pure.presets", "meshplan.pure.cluster",
                                     "meshplan.pure.xla", "meshplan.pure.cost", "meshplan.pure.search",
                                     "meshplan.pure.compare", "meshplan.pure.report", "meshplan.facade"])
def test_init_modules_only_re_export(package: str) -> None:
    # An __init__ holds imports, __all__ and (top level only) the lazy loader: no logic of its own.
    path = ROOT.parent / package.replace(".", "/") / "__init__.py"
    allowed = (ast.Import, ast.ImportFrom, ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.If)
    extra = [type(n).__name__ for n in ast.parse(path.read_text()).body if not isinstance(n, allowed)]
    if package == "meshplan":
        extra = [e for e in extra if e != "FunctionDef"]  # __getattr__ / __dir__
    assert not extra, f"{package}/__init__.py defines {extra}; put code in a module and re-export it"
