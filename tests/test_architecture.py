"""The design card's rules, checked on the source: pure stays device-free, imports flow facade -> pure."""

import ast
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
