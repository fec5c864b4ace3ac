"""A run's spec: the suite as it was measured, resolved once (``measure.prepare``), stored as
JSON beside the user's untouched suite text (``runs.spec_json``, schema 12) and loaded back into
the ``Suite`` that made it.

The spec holds the suite's tables as they were validated (``Suite.tables``): the file's, a scale
applied, its job files carried, and what prepare resolved (the VM's disk, the Proxmox host, a
storage id, ``--target``). Loading one (``RunSpec.suite``) runs every check a suite file's
tables get (``suite.load.suite_of_tables``): a spec read from a database is as untrusted as
the text beside it, and its suite is anyone's until its loader says whose (``with_author``).

Format history (``SPEC_VERSION``): 1, the first.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import JsonValue, ValidationError

from iomatrix.core.errors import SuiteError
from iomatrix.core.model import Frozen
from iomatrix.suite.load import suite_of_tables, tables_text
from iomatrix.suite.model import Suite

SPEC_VERSION = 1
"""The version of the spec's JSON: raised when a key is renamed or removed or changes meaning."""


class RunSpec(Frozen):
    """The suite a run measures, resolved: what the run stores and ``--resume`` measures."""

    version: Literal[1] = SPEC_VERSION
    tables: dict[str, JsonValue]
    """The suite's tables as validated (``Suite.tables``)."""

    @classmethod
    def of(cls, suite: Suite) -> "RunSpec":
        """The spec of ``suite`` as prepared; SuiteError for tables JSON cannot hold (a TOML
        date or time, which no suite key takes)."""
        try:
            return cls(tables=suite.tables)
        except ValidationError as exc:
            raise SuiteError(f"{suite.source_path}: {exc.errors()[0]['msg']}") from None

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        """A spec from its JSON; ValueError when it is not one."""
        return cls.model_validate_json(text)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    def suite(self, *, text: str, source: str) -> Suite:
        """The suite this spec makes, ``text`` its source text (the run's stored suite text) and
        ``source`` where it came from; SuiteError as a suite file's tables would give it."""
        return suite_of_tables(self.tables, text=text, source=source)

    def toml(self, source: str) -> str:
        """The spec as a suite file that runs again (``export --format suite``)."""
        return tables_text(self.tables, source)
