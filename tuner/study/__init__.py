"""The study: one Optuna study per (workload, size, device), tuned by a search strategy.

- :mod:`.spec`: study files (what to tune).
- :mod:`.loop`: the tuning loop (:func:`~.loop.run_study`).
- :mod:`.final`: the final rounds that pick the winner of each kind of sync.
- :mod:`.outcome`: how a run ended, and the progress, lines and tables it shows.
- :mod:`.workers`: one worker process per GPU on one study.
"""
