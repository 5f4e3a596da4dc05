"""Public home of meshplan's exceptions (defined in :mod:`meshplan.pure.errors`)."""

from meshplan.pure.errors import *  # noqa: F401,F403
from meshplan.pure.errors import __all__ as __all__
