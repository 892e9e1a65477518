"""Storage: one database URL (SQLite or PostgreSQL) holds everything.

- :mod:`.database`: opening a URL, read-only where the command only reads.
- :mod:`.trials`: Optuna trials: names, writing, reading back and summing up.
- :mod:`.measurements`: the measurement cache beside Optuna's tables.
- :mod:`.claims`: which worker measures which config.
"""
