"""``meshplan plan --params MODULE:ATTR``: the user's own parameter tree, loaded and built abstractly.

``MODULE`` is a dotted module name (imported with the working directory on
``sys.path``, as ``python -m`` would) or a ``path/to/file.py``. ``ATTR`` names
either a value (an nnx Module, a linen variables dict, an equinox module, any
pytree of arrays or ``jax.ShapeDtypeStruct``) or a function or class called
with no arguments that returns one. A call runs under ``jax.eval_shape`` (so a
Llama-3-8B allocates nothing), and the result becomes the tree the search
plans: ``nnx.state(model, nnx.Param)`` of an nnx Module, the array leaves of
an equinox module, everything else as it is.

Loading user code is the CLI's business; :mod:`meshplan.pure` only ever sees
the resulting shape tree.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any

import numpy as np


class ParamsError(Exception):
    """``--params`` names something that cannot be loaded or gives no parameter tree (exit 1)."""


def params_ref(text: str) -> tuple[str, str]:
    """argparse type of ``--params``: ``"pkg.mod:make"`` -> ``("pkg.mod", "make")`` (exit 2 on bad form).

    Example:
      >>> params_ref("my_pkg.model:make_model"), params_ref("./m.py:Llama")
      (('my_pkg.model', 'make_model'), ('./m.py', 'Llama'))
    """
    module, sep, attr = text.rpartition(":")
    if not sep or not module.strip() or not attr.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not MODULE:ATTR (e.g. my_pkg.model:make_model or path/to/model.py:make_model)")
    return module.strip(), attr.strip()


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _import(module: str) -> Any:
    """The module ``module`` names: a file path (``.py`` or containing a path separator) or a dotted name."""
    if module.endswith(".py") or os.sep in module or "/" in module:
        path = os.path.abspath(module)
        if not os.path.isfile(path):
            raise ParamsError(f"--params: no file {module!r}.")
        name = "_meshplan_params_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ParamsError(f"--params: {module!r} is not a Python file.")
        mod = importlib.util.module_from_spec(spec)
        # The file may import its siblings, as it would when run as a script.
        sys.path.insert(0, os.path.dirname(path))
        sys.modules[name] = mod  # dataclasses and pickling look the module up while it executes
        try:
            spec.loader.exec_module(mod)
        except (Exception, SystemExit) as err:  # noqa: BLE001 -- the user's code may raise anything
            sys.modules.pop(name, None)
            raise ParamsError(f"--params: running {module!r} raised {_describe(err)}") from None
        finally:
            sys.path.remove(os.path.dirname(path))
        return mod
    # The console script does not put the working directory on sys.path; `python -m` does. Be like -m.
    here = os.getcwd()
    sys.path.insert(0, here)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and (module == err.name or module.startswith(err.name + ".")):
            raise ParamsError(f"--params: no module named {err.name!r} (a dotted module on sys.path or the "
                              f"working directory, or a path/to/file.py).") from None
        raise ParamsError(f"--params: importing {module!r} raised {_describe(err)}") from None
    except (Exception, SystemExit) as err:  # noqa: BLE001 -- the user's code may raise anything
        raise ParamsError(f"--params: importing {module!r} raised {_describe(err)}") from None
    finally:
        sys.path.remove(here)


def _is_array(x: Any) -> bool:
    import jax

    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _as_tree(obj: Any) -> Any:
    """The parameter tree of what the user gave: nnx -> its Param state, equinox -> its array leaves."""
    if "flax.nnx" in sys.modules:  # an nnx Module exists only if its user imported flax.nnx
        nnx = sys.modules["flax.nnx"]
        if isinstance(obj, nnx.Module):
            return nnx.state(obj, nnx.Param)
    if "equinox" in sys.modules:
        eqx = sys.modules["equinox"]
        if isinstance(obj, eqx.Module):
            return eqx.filter(obj, eqx.is_array)
    return obj


def _should_call(obj: Any) -> bool:
    # nnx and equinox modules are callable values; only functions and classes are builders.
    return inspect.isroutine(obj) or inspect.isclass(obj) or isinstance(obj, functools.partial)


def _build_abstract(ref: str, fn: Any) -> Any:
    """``fn()``'s parameter tree as shapes: arrays become ShapeDtypeStructs without being allocated."""
    import jax

    kept: list[Any] = []  # the non-array leaves, which jax.eval_shape cannot return

    def arrays_only() -> Any:
        tree = _as_tree(fn())
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        kept[:] = [treedef, [None if _is_array(v) else v for v in leaves]]
        return [v for v in leaves if _is_array(v)]

    try:
        arrays = jax.eval_shape(arrays_only)
    except (Exception, SystemExit) as err:  # noqa: BLE001 -- the user's code may raise anything
        raise ParamsError(f"--params {ref}: calling it raised {_describe(err)}") from None
    treedef, leaves = kept
    it = iter(arrays)
    return jax.tree_util.tree_unflatten(treedef, [next(it) if v is None else v for v in leaves])


def _count_arrays(tree: Any) -> int:
    import jax

    leaves = jax.tree_util.tree_leaves(tree)
    return sum(1 for v in leaves if hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, type))


def load_params(ref: tuple[str, str]) -> Any:
    """The parameter tree ``--params MODULE:ATTR`` names, built abstractly where it is built.

    Raises:
      ParamsError: the module cannot be imported, has no such attribute, calling it raised
        (the user's exception text is in the message), or the result holds no array.

    Example:
      >>> load_params(("math", "pi"))
      Traceback (most recent call last):
      ...
      meshplan.cli._params.ParamsError: --params math:pi: gives float, which holds no array; ...
    """
    module, attr = ref
    text = f"{module}:{attr}"
    mod = _import(module)
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = sorted(n for n in dir(mod) if not n.startswith("_"))[:20]
            raise ParamsError(f"--params {text}: module {module!r} has no attribute {attr!r}; it has "
                              f"{names}.") from None
        except Exception as err:  # noqa: BLE001 -- a property of the user's own code raising
            raise ParamsError(f"--params {text}: reading {attr!r} raised {_describe(err)}") from None
    tree = _build_abstract(text, obj) if _should_call(obj) else _as_tree(obj)
    try:
        n = _count_arrays(tree)
    except Exception as err:  # noqa: BLE001 -- a user container that jax cannot flatten
        raise ParamsError(f"--params {text}: not a pytree jax can flatten ({_describe(err)}).") from None
    if n == 0:
        raise ParamsError(f"--params {text}: gives {type(tree).__name__}, which holds no array; expected an "
                          f"nnx Module, a linen variables dict, an equinox module or a pytree of arrays / "
                          f"jax.ShapeDtypeStruct (or a function returning one).")
    return tree
