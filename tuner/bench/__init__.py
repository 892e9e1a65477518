"""``python -m tuner bench``: our best chains against what a user gets without us.

- :mod:`.runs`: the bench command: search, final rounds, ablations, summaries.
- :mod:`.baselines`: PyTorch's and CuPy's chains, and the floor, timed in the same process.
"""
from .runs import main, run_bench

__all__ = ["main", "run_bench"]
