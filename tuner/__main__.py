"""``python -m tuner``: see :mod:`tuner.cli`."""
from .cli import main

raise SystemExit(main())
