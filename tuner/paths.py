"""Where the project's data folders live: the repository root, or ``$TUNER_HOME``."""
from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """Root holding kernel_templates/, search_spaces/ and studies/."""
    env = os.environ.get("TUNER_HOME")
    return Path(env) if env else Path(__file__).resolve().parent.parent


def templates_dir() -> Path:
    return home() / "kernel_templates"
