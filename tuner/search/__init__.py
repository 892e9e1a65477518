"""The search: which configs can run, and which to try first.

- :mod:`.space`: search-space files (TOML), the candidate values per knob.
- :mod:`.constraints` and :mod:`.feasible`: the hard constraints, solved into the feasible set.
- :mod:`.cases`: hand-picked configs that cover every policy, order, dispatch and launch mode.
- :mod:`.cost_model`: a coarse time model that ranks tilings (fitted in ``cost_fit.json``).
- :mod:`.strategies`: the search strategies (``staged``, ``tpe``, ``random``, ``grid``).
"""
from .feasible import FeasibleSet
from .space import SearchSpace, SpaceError, load_space, parse_space

__all__ = ["FeasibleSet", "SearchSpace", "SpaceError", "load_space", "parse_space"]
