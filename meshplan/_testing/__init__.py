"""Private home of :mod:`meshplan.testing`; import from there, not from here."""
