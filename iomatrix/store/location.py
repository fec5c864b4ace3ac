"""Where the results live: an SQLite file (a path, the default) or a PostgreSQL database (a
``postgresql://`` URL, libpq's URI form). A URL may carry a password; it goes to libpq and to
nothing else: every text iomatrix shows names the database by ``PgUrl.shown``, which has none.
The password is better kept out of the URL anyway (``~/.pgpass`` or ``PGPASSWORD``), since a
command line is visible to every user of the host."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

SCHEMES = ("postgresql://", "postgres://")


@dataclass(frozen=True)
class PgUrl:
    """A PostgreSQL connection URL, as given (``url``) and as shown (``shown``)."""

    url: str = field(repr=False)

    @property
    def shown(self) -> str:
        """The URL without its password: the only form that is printed or stored."""
        return redact_url(self.url)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The password the URL carries (raw and percent-decoded), to be struck from any text
        a driver hands back."""
        parts = urlsplit(self.url)
        found = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "password"]
        if parts.password:
            found += [parts.password, unquote(parts.password)]
        return tuple(dict.fromkeys(s for s in found if s))

    def __str__(self) -> str:
        return self.shown


Location = Path | PgUrl


def parse_location(text: str | Path) -> Location:
    """``--db``'s value: a PostgreSQL URL, or else the path of an SQLite file."""
    if isinstance(text, str) and text.lower().startswith(SCHEMES):
        return PgUrl(text)
    return Path(text)


def shown(location: Location | str) -> str:
    """How a results database is named in output: a path as it is, a URL without password."""
    if isinstance(location, str):
        location = parse_location(location)
    return location.shown if isinstance(location, PgUrl) else str(location)


def redact_url(url: str) -> str:
    """``url`` with any password (``user:PASSWORD@``, ``?password=``) removed."""
    try:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if parts.password is None and all(k != "password" for k, _ in pairs):
            return url                      # nothing to strike: as given
        netloc = parts.netloc
        if "@" in netloc:
            user, _, hosts = netloc.rpartition("@")
            user = user.partition(":")[0]
            netloc = f"{user}@{hosts}" if user else hosts
        query = urlencode([(k, v) for k, v in pairs if k != "password"], safe="/",
                          quote_via=quote)
        # by hand: urlunsplit would drop the empty host of postgresql:///db
        return (f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
                + (f"#{parts.fragment}" if parts.fragment else ""))
    except ValueError:                      # not even a URL: show the scheme alone
        return re.split(r"(?<=//)", url, maxsplit=1)[0] + "..."


def strike(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
