"""The model checker for the tile-synchronization protocol, run on every config before it compiles.

- :mod:`.model`: the formulas evaluated as arrays; which producer tiles each consumer chunk reads.
- :mod:`.soundness`: every chunk is read only after waits that cover its producer tiles (exhaustive).
- :mod:`.simulator`: deadlock freedom and epochs, under adversarial and random schedules.
- :mod:`.checks`: all of them for one chain and config (:func:`check`), and what they model.
"""
from .checks import check, check_protocol, clear_caches
from .model import PairModel, Protocol, evaluate, pair_model, tile_order, wait_columns
from .simulator import Schedule, check_deadlock, check_epochs, make_schedules, simulate
from .soundness import check_order, check_soundness

__all__ = ["PairModel", "Protocol", "Schedule", "check", "check_deadlock", "check_epochs", "check_order",
           "check_protocol", "check_soundness", "clear_caches", "evaluate", "make_schedules", "pair_model", "simulate", "tile_order", "wait_columns"]
