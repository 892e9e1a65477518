"""What every stage kind shares."""
from __future__ import annotations


class WorkloadError(ValueError):
    """A workload name or size the user gave is not usable."""
