"""Names the tests need from meshplan.pure, wherever the refactor currently keeps them public."""

import importlib

import meshplan.pure as _top


def public(name: str, home: str):
    return getattr(_top, name) if hasattr(_top, name) else getattr(importlib.import_module(f"meshplan.pure.{home}"), name)
