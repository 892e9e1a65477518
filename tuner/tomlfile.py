"""Reading the project's TOML files (search spaces, studies) with errors a person can act on."""
from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, Iterable

from . import UsageError


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the nearest valid option, or nothing when none is close."""
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_toml(path: Path, what: str, error: type[UsageError]) -> dict[str, Any]:
    """Parse ``path``; an unreadable or malformed file raises ``error`` naming the file."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from None
