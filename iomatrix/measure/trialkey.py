"""A trial's identity in its run: its configuration, its workload and its round (the sample
index), as the runner and a cluster run's controller tell measured trials from those left."""

from __future__ import annotations

from typing import NamedTuple, Protocol


class _Keyed(Protocol):
    @property
    def config_key(self) -> str: ...
    @property
    def workload_key(self) -> str: ...
    @property
    def sample_index(self) -> int: ...


class TrialKey(NamedTuple):
    config_key: str
    workload_key: str
    sample_index: int

    @classmethod
    def of(cls, trial: _Keyed) -> TrialKey:
        """The key of a stored or measured trial (``TrialRecord``, ``TrialResult``)."""
        return cls(trial.config_key, trial.workload_key, trial.sample_index)
