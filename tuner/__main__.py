"""``python -m tuner``: see :mod:`tuner.cli`."""
from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
