"""iomatrix: which virtual-disk settings should this QEMU/KVM host use, and how sure are we.

The names a script needs are importable from here (``from iomatrix import load_suite, run_suite,
Store``); each is loaded on first use, so ``import iomatrix`` stays cheap for the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "IomatrixError": "iomatrix.core.errors",
    "Suite": "iomatrix.suite",
    "Configuration": "iomatrix.suite",
    "Workload": "iomatrix.suite",
    "load_suite": "iomatrix.suite",
    "load_suite_text": "iomatrix.suite",
    "builtin_suites": "iomatrix.suite",
    "expand": "iomatrix.suite",
    "prepare": "iomatrix.measure.prepare",
    "PreparedRun": "iomatrix.measure.prepare",
    "run_suite": "iomatrix.measure.runner",
    "Store": "iomatrix.store",
    "StoredRun": "iomatrix.store.records",
    "StoredSuite": "iomatrix.store.records",
    "TrialRecord": "iomatrix.store.records",
    "points": "iomatrix.analysis.points",
    "build_report_data": "iomatrix.report.data",
    "write_report": "iomatrix.report.html",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'iomatrix' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
