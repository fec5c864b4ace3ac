"""Where the results live: an SQLite file (a path, the default) or a PostgreSQL database (a
``postgresql://`` URL, libpq's URI form). A URL may carry a password; it goes to libpq and to
nothing else: every text iomatrix shows names the database by ``PgUrl.shown``, which has none.
The password is better kept out of the URL anyway (``~/.pgpass`` or ``PGPASSWORD``), since a
command line is visible to every user of the host."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, unquote_plus

from iomatrix.core.trust import ANYONE, Author, author_of

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
        """The password the URL carries (raw and percent-decoded; and of a malformed one,
        the pieces between the ``/ ? # @`` that end a URL's parts, which a driver may quote),
        to be struck from any text a driver hands back. Read by hand (``_passwords``), so that
        a URL neither libpq nor ``urlsplit`` can parse still has its password struck."""
        found = [value for password in _passwords(self.url)
                 for value in (password, unquote(password), unquote_plus(password),
                               *re.split(r"[/?#@]", password))]
        return tuple(sorted({s for s in found if s}, key=len, reverse=True))

    def __str__(self) -> str:
        return self.shown


Location = Path | PgUrl


def parse_location(text: str | Path) -> Location:
    """``--db``'s value: a PostgreSQL URL, or else the path of an SQLite file."""
    if isinstance(text, str) and text.lower().startswith(SCHEMES):
        return PgUrl(text)
    return Path(text)


def location_author(location: Location) -> Author:
    """Who could have written the results database at ``location`` (its rows are their input):
    an SQLite file's ``author_of``; anyone with the role, for a PostgreSQL store."""
    if isinstance(location, PgUrl):
        return Author(ANYONE, f"the shared store {location.shown}")
    return author_of(location, f"database {location}")


def shown(location: Location | str) -> str:
    """How a results database is named in output: a path as it is, a URL without password."""
    if isinstance(location, str):
        location = parse_location(location)
    return location.shown if isinstance(location, PgUrl) else str(location)


def redact_url(url: str) -> str:
    """``url`` with any password (``user:PASSWORD@``, ``?password=``) removed: what comes
    between ``//`` and the user info's last ``@`` but the user name (``_user_info``), and each
    query key naming a password (``password=``, ``sslpassword=``: ``_is_password``). Never raises: a malformed URL (one ``urlsplit`` refuses, one
    libpq refuses) is shown without its password too."""
    head, body, end = _user_info(url)
    if end < 0:
        return url
    if end > 0:
        user = body[:end].partition(":")[0]
        body = (f"{user}@" if user else "") + body[end + 1:]
    rest, question, query = body.partition("?")
    kept = [p for p in query.split("&") if not _is_password(p)]
    return head + rest + (question + "&".join(kept) if kept else "")


def _user_info(url: str) -> tuple[str, str, int]:
    """``url`` as (``scheme://``, the rest, where the user info ends in it: the last ``@``
    before the query's first ``=``; 0 when there is none, -1 for no ``//``). A password holding
    ``/``, ``?`` or ``@`` unescaped ends there too, where libpq and ``urlsplit`` would read it
    differently (libpq ends the user info at its first ``@`` before a ``/``)."""
    scheme, slashes, body = url.partition("//")
    if not slashes:
        return url, "", -1
    limit = body.find("=")
    return scheme + slashes, body, max(body.rfind("@", 0, len(body) if limit < 0 else limit), 0)


def _is_password(pair: str) -> bool:
    """Whether the query's ``key=value`` ``pair`` holds a secret: any key naming a password
    (``password``, ``sslpassword``: a client key's passphrase)."""
    return "password" in unquote_plus(pair.partition("=")[0]).strip().lower()


def _passwords(url: str) -> list[str]:
    """Each text a reader of ``url`` could take for its password: after the first ``:`` of
    the text before each ``@`` of the user info (``_user_info``), and the value of every query
    key naming a password (``_is_password``)."""
    _, body, end = _user_info(url)
    found = [body[:at].partition(":")[2] for at in range(end) if body[at] == "@"]
    found.append(body[:end].partition(":")[2] if end > 0 else "")
    query = body[end:].partition("?")[2]
    return found + [p.partition("=")[2] for p in query.split("&") if _is_password(p)]


def strike(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
