"""Suites: the TOML a user writes (``load``), its typed model (``model``), fio job files read as
workloads (``jobfiles``), its expansion into configurations × workloads (``expand``), the order
trials run in (``plan``), and the built-in suites (``builtin/``)."""

from iomatrix.suite.expand import Expansion, expand
from iomatrix.suite.load import builtin_suites, load_suite, load_suite_text
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.model import Suite
from iomatrix.suite.workloads import Workload

__all__ = ["Configuration", "Expansion", "Suite", "Workload", "builtin_suites", "expand",
           "load_suite", "load_suite_text"]
