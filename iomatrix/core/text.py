"""Text on its way to a terminal: what a store, a guest, fio or a suite wrote is shown, never
obeyed.

A string read from a database, a guest's console, fio's output or a suite file was written by
whoever wrote that input. Printed raw, an ESC or C1 CSI (``\\x9b``) moves the cursor, clears the
screen or sets the clipboard (OSC 52) of whoever reads it, often root; a bidi override
(U+202E) makes a line read as something it is not. ``printable`` writes each such character as a
visible Python escape (``\\x1b``, ``\\x9b``, ``\\u202e``) so that the text reads as it is."""

from __future__ import annotations

import re

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}

_UNSHOWN = (r"\x00-\x08\x0b-\x1f\x7f-\x9f"  # C0 (tab and line break aside), DEL, C1
            r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidi marks, embeddings, isolates
            r"\u2028\u2029\ufeff"  # line and paragraph separators, the zero-width no-break space
            r"\ud800-\udfff")  # lone surrogates (undecodable bytes kept by surrogateescape)
_MULTILINE = re.compile(f"[{_UNSHOWN}]")
_ONE_LINE = re.compile(f"[\t\n{_UNSHOWN}]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character a terminal would obey rather than show (C0 controls, ESC,
    DEL, C1, bidi and format characters, lone surrogates) written as a visible escape. Line
    breaks and tabs are escaped too unless ``lines`` (text shown as several lines)."""
    return (_MULTILINE if lines else _ONE_LINE).sub(_escaped, text)


def quoted(value: object, limit: int = 60) -> str:
    """``value`` as a message quotes it (``repr``), cut to about ``limit`` characters: a value
    of a megabyte named in a one-line error is still one short line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
