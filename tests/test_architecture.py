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


# --- layers inside pure: report -> compare -> verify -> search -> serve -> cost -> xla -> cluster -> presets -> rules -> specs
# -> mesh. (xla, the compiler-text parsers, sits below cost so that both cost and search may read it; it reads
# neither. serve, the serving plans, reads cost's collective model; verify holds what a compiled plan is made of,
# report everything a reader sees: both sit above the search; compare ranks several searches' answers.) Shared
# helpers sit below them all.

# A module may import its own layer and any layer after it in this list, never one before it.
_LAYERS = ("report", "compare", "verify", "search", "serve", "cost", "xla", "cluster", "presets", "rules", "specs",
           "mesh")
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
    ("from meshplan.pure.serve._plan import plan_serving\n", "cost"),
    ("from meshplan.pure.report import serve_html\n", "serve"),
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


PACKAGES = sorted(".".join(p.parent.relative_to(ROOT.parent).parts) for p in ROOT.rglob("__init__.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_init_modules_only_re_export(package: str) -> None:
    # An __init__ holds imports, __all__ and (top level only) the lazy loader: no logic of its own. The command
    # line's keeps its entry point, main (the console script's target); each command is a module of its own.
    path = ROOT.parent / package.replace(".", "/") / "__init__.py"
    allowed = (ast.Import, ast.ImportFrom, ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.If)
    body = ast.parse(path.read_text()).body
    own = {"meshplan": {"__getattr__", "__dir__"}, "meshplan.cli": {"main"}}.get(package, set())
    extra = [type(n).__name__ for n in body if not isinstance(n, allowed)
             and not (isinstance(n, ast.FunctionDef) and n.name in own)]
    assert not extra, f"{package}/__init__.py defines {extra}; put code in a module and re-export it"


# --- no import circle anywhere in the package ------------------------------------------------------------------
# Every import statement counts, at module level or inside a function: a circle that only closes at call time
# still ties two modules into one idea (and breaks the day someone moves the import up).

MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports_of(module: str, tree: ast.AST, is_package: bool, known: set[str]) -> set[str]:
    """The meshplan modules ``module`` imports: ``from pkg import sub`` is the submodule, ``from pkg import
    name`` the package (whose ``__init__`` runs), relative imports resolved."""
    found = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules it imports, for ``{module: (source text, is a package)}``."""
    known = set(sources)
    return {m: _imports_of(m, ast.parse(text), pkg, known) for m, (text, pkg) in sorted(sources.items())}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_anywhere_in_meshplan() -> None:
    graph = import_graph({m: (p.read_text(), p.name == "__init__.py") for m, p in MODULES.items()})
    circles = import_circles(graph)
    assert not circles, f"modules that import each other (function-level imports count): {circles}"


def test_the_circle_test_catches_a_function_level_circle() -> None:
    # The check above must be able to fail: a renderer imported inside a method of the record it renders.
    sources = {
        "pkg": ("", True),
        "pkg._result": ("class R:\n    def html(self):\n        from pkg._html import render\n", False),
        "pkg._html": ("from pkg._result import R\ndef render(r): ...\n", False),
        "pkg._other": ("from pkg import _result\n", False),
    }
    assert import_circles(import_graph(sources)) == [["pkg._html", "pkg._result"]]


# --- each public name has one home ------------------------------------------------------------------------------
# A room's __init__ re-exports its own modules' names, never another room's: one public path per name. The front
# doors (meshplan, meshplan.pure, meshplan.facade) re-export the headline names of the rooms below them.
_FRONT_DOORS = {"meshplan", "meshplan.pure", "meshplan.facade"}
ROOMS = [p for p in PACKAGES if p not in _FRONT_DOORS and p != "meshplan.cli"]


@pytest.mark.parametrize("package", ROOMS)
def test_a_room_re_exports_only_its_own_names(package: str) -> None:
    path = ROOT.parent / package.replace(".", "/") / "__init__.py"
    foreign = sorted(
        f"{node.module}: {', '.join(a.name for a in node.names)}"
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith(package + ".")
    )
    assert not foreign, f"{package} re-exports another room's names ({foreign}); import them from their home"
