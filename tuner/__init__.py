"""tuner: an auto-tuner for chains of dependent tiled CUDA kernels that synchronize tile by tile."""
from __future__ import annotations

__version__ = "0.1.0"


class UsageError(Exception):
    """Something the user asked for cannot be done as asked.

    The CLI prints it as one ``tuner: error: ...`` line and exits with status 2, so
    the message must say what is wrong and what would be accepted instead.
    """


def shown(value, most: int = 40) -> str:
    """``repr(value)``, cut to ``most`` characters: a value read from outside (a tampered storage, a
    file) goes into an error line whole only when it is short."""
    text = repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def shortlist(items, most: int = 8) -> str:
    """``a, b, c`` for a few items; the first ``most`` and a count of the rest for many, so an
    error stays one readable line."""
    items = list(items)
    shown = ", ".join(str(i) for i in items[:most])
    return shown if len(items) <= most else f"{shown} and {len(items) - most} more"
