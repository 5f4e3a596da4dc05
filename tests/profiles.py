"""Example counts for properties that are slower than the profile's default.

A slow property may run fewer examples in the quick default profile, but
``HYPOTHESIS_PROFILE=deep`` must still give every property the deep count
(>= 1000), so a pinned ``max_examples=12`` would silently opt out of it.
"""

from hypothesis import settings


def examples(quick: int) -> int:
    """``quick`` in the default profile; the profile's own count under a deep one (>= 1000).

    Example:
      >>> examples(12) in (12, settings.default.max_examples)
      True
    """
    deep = settings.default.max_examples
    return deep if deep >= 1000 else quick
