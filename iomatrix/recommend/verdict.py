"""A recommendation as a person reads it (pure): the verdict first, one line per parameter (set,
keep, not measured; the gain and its 95 % CI; a caveat mark), then, behind ``--explain``, the
evidence behind each line. Every line fits ``width`` columns (``iomatrix recommend`` gives at
most 100); what is pasted is wrapped where the shell (or QEMU's JSON) allows, so it still
pastes as it is.

``made_for`` says which platform a run answers for when ``--for`` is not given.
"""

from __future__ import annotations

import textwrap

from iomatrix.core.text import printable
from iomatrix.platform.settings import Pasted
from iomatrix.recommend.decide import RULE, Decision, Evidence, Recommendation, _figure
from iomatrix.recommend.defaults import TITLES
from iomatrix.vocab.axes import Platform
from iomatrix.store.records import StoredRun

MARK = "⚠"
VERBS = {"change": "set", "choose": "set", "keep": "keep", "not measured": "not measured",
         "not evaluated": "not evaluated"}
"""What each decision's status tells the user to do."""
PVE_KERNEL = "-pve"
"""How a Proxmox VE kernel's release ends (``6.8.12-4-pve``)."""


def made_for(run: StoredRun) -> tuple[Platform, str]:
    """The platform a run was made for, and why: measured with Proxmox VE's block graph
    (``[method] platform = "proxmox"``, which a run on a Proxmox VE host gets by default) or on
    a Proxmox VE host → Proxmox VE; with libvirt's graph → libvirt; else QEMU."""
    platform = run.suite.method.platform
    if platform == "proxmox":
        return "proxmox", ('the run measured Proxmox VE\'s block graph ([method] platform = '
                           '"proxmox")')
    kernel = run.host.get("kernel", "")
    if kernel.endswith(PVE_KERNEL) or any("this host runs Proxmox VE" in n for n in run.notes):
        return "proxmox", f"the run was made on a Proxmox VE host (kernel {kernel})"
    if platform == "libvirt":
        return "libvirt", 'the run measured libvirt\'s block graph ([method] platform = "libvirt")'
    return "qemu", ("the run measured iomatrix's own QEMU graph, on a host that is not Proxmox "
                    "VE")


def _wrap(text: str, width: int, first: str = "", rest: str | None = None) -> list[str]:
    """``text`` in lines of at most ``width`` columns, the first led by ``first``, the others
    by ``rest`` (blanks as wide as ``first`` by default)."""
    rest = " " * len(first) if rest is None else rest
    text = printable(text)          # escaped before it is measured (a stored string, a note)
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first.rstrip()]


def header(rec: Recommendation, width: int, why: str | None = None) -> list[str]:
    """Which run, for which platform (and, when ``--for`` was not given, ``why``), the warnings
    and the answer relative to the user's VM."""
    storage = f" (storage type {rec.storage})" if rec.platform == "proxmox" else ""
    lines = [f"run {rec.run_id} · suite {printable(rec.suite_name)} · recommendation for "
             f"{TITLES[rec.platform]}{storage}"]
    if rec.measured_on:
        lines += _wrap(f"evidence measured on {rec.measured_on}", width)
    if why:
        others = " or ".join(p for p in TITLES if p != rec.platform)
        lines += _wrap(f"({why}; --for {others} for another)", width)
    for warning in rec.warnings:
        lines += _wrap(warning, width, f"{MARK} ")
    if rec.yours is not None:
        lines += _wrap(rec.yours.text, width)
    return lines


def _setting(d: Decision) -> str:
    return f"{d.axis}={d.value}" if d.value is not None else f"{d.axis}: QEMU's default"


def _strongest(d: Decision) -> Evidence | None:
    """The other level with the largest IOPS change, compared."""
    compared = [e for e in d.evidence if e.iops.relative is not None]
    return max(compared, key=lambda e: e.iops.relative or 0.0, default=None)


def _evidence(d: Decision) -> tuple[str, str]:
    """(what the line says after the setting, the footnote it needs or "")."""
    verb = VERBS[d.status]
    if verb == "set" and d.gain is not None:
        chosen = next(e for e in d.evidence if e.level == d.value)
        cost = f", {chosen.cpu.short()}" if chosen.cpu is not None and chosen.cpu.pairs else ""
        return f"{_figure(chosen.iops, 'IOPS')} over {chosen.iops.reference}{cost}", d.caveat
    if d.status in ("not measured", "not evaluated"):
        text = d.reason.removeprefix(f"{d.status}: ").replace("; keep the default", "")
        for lead in (f"{d.value} (", "keep the default ("):
            if text.startswith(lead) and text.endswith(")"):
                text = text[len(lead):-1]     # "raw (no platform default; ...)"
        return ("" if text == "keep the default" else text), d.caveat
    best = _strongest(d)
    note = _note(d)
    if best is None:
        return d.reason.split(": ", 1)[-1], note
    verdict = {None: "not significant", False: "significantly fewer IOPS",
               True: "more IOPS, but see below"}[best.iops.better]
    return f"{best.level}: {_figure(best.iops, 'IOPS')}, {verdict}", note


def _note(d: Decision) -> str:
    """A kept value's footnote: why a level that measured better is not recommended, and any
    caveat."""
    why = d.reason.split(": ", 1)[-1] if " but " in d.reason else ""
    return "; ".join(p for p in (why, d.caveat) if p)


def verdict(rec: Recommendation, width: int) -> list[str]:
    """One line per parameter, then the footnotes its caveat marks point to."""
    rows = [(VERBS[d.status], _setting(d), *_evidence(d)) for d in rec.decisions]
    verb_w = max(len(r[0]) for r in rows)
    setting_w = min(max(len(r[1]) for r in rows), 32)
    lines = ["verdict (IOPS against the reference, with its 95 % CI):"]
    notes: list[tuple[str, str]] = []
    for (verb, setting, evidence, note), d in zip(rows, rec.decisions):
        mark = ""
        if note:
            notes.append((d.axis, note))
            mark = f" {MARK}{len(notes)}"
        lead = f"  {verb:<{verb_w}}  {setting:<{setting_w}}  "
        if len(lead) > width // 2:
            lines.append(lead.rstrip())
            lead = " " * (4 + verb_w)
        lines += _wrap(evidence + mark, width, lead, " " * len(lead))
    for number, (axis, note) in enumerate(notes, 1):
        lines += _wrap(f"{axis}: {note}", width, f"{MARK}{number} ", "    ")
    return lines


def explain(rec: Recommendation, width: int) -> list[str]:
    """The evidence behind each line: per parameter what it does, the platform's default, the
    recommendation, why, and each level's IOPS and latency against the reference; then what
    every configuration shared, the notes and the rule."""
    title = TITLES[rec.platform]
    lines: list[str] = ["evidence:"]
    for mode, fixed in rec.fixed.items():
        if fixed:
            shown = ", ".join(f"{k}={v}" for k, v in fixed.items())
            lines += _wrap(f"{mode} configurations all have {shown}", width)
    for d in rec.decisions:
        if d.value is None:
            recommended = "not set (QEMU's default)"
        else:
            recommended = d.value + (" (default)" if d.default.level and d.status in (
                "keep", "not measured", "not evaluated") else "")
        lines += ["", *_wrap(f"{d.name}: {recommended}" + (f" {MARK}" if d.caveat else ""),
                             width)]
        lines += _wrap(d.what, width, "  what it does: ")
        default = d.default.shown + (f" ({d.default.note})" if d.default.note else "")
        lines += _wrap(default, width, f"  {title} default: ")
        lines += _wrap(d.reason, width, "  why: ")
        if d.mode:
            lines += _wrap(f"{d.mode} mode; levels {', '.join(d.levels)}", width, "  measured in: ")
        for e in d.evidence:
            lines += _wrap(e.text() + (f" ({e.barred})" if e.barred else ""), width, "  · ")
        if d.caveat:
            lines += _wrap(d.caveat, width, f"  {MARK} caveat: ")
    lines.append("")
    for note in rec.notes:
        lines += _wrap(note, width, "note: ")
    lines += _wrap(RULE, width, "rule: ", "  ")
    return lines


def _shell_lines(words: list[str], width: int) -> list[str]:
    """``words`` as one shell command, continued with `` \\`` where a line would pass
    ``width``."""
    lines, line = [], ""
    for word in words:
        if line and len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


def _json_breaks(line: str, width: int) -> list[str]:
    """A QEMU argument line holding a JSON object in single quotes, broken after commas
    between its members (whitespace JSON allows, kept inside the quotes) where it would pass
    ``width``."""
    cuts, depth, quoted = [], 0, False
    for i, ch in enumerate(line):
        if ch == '"' and line[i - 1] != "\\":
            quoted = not quoted
        elif not quoted and ch in "{[":
            depth += 1
        elif not quoted and ch in "}]":
            depth -= 1
        elif not quoted and ch == "," and depth == 1:
            cuts.append(i + 1)
    out, start, indent = [], 0, ""
    while len(indent) + len(line) - start > width:
        later = [c for c in cuts if start < c]
        fitting = [c for c in later if len(indent) + c - start <= width] or later[:1]
        if not fitting:
            break                   # one member longer than the line: as it is
        out.append(indent + line[start:fitting[-1]])
        start, indent = fitting[-1], "    "
    return [*out, indent + line[start:]]


def _option_breaks(line: str, width: int) -> list[str]:
    """A QEMU argument line (``-device virtio-scsi-pci,id=…,iothread=…``) broken after commas
    with a backslash, the next line starting at its first column: the shell joins the two
    into one word again."""
    out, start = [], 0
    while len(line) - start > width:
        cut = line.rfind(",", start, start + width - 1)
        if cut < start:
            cut = line.find(",", start)
        if cut < start:
            break                   # one option longer than the line: as it is
        out.append(line[start:cut + 1] + "\\")
        start = cut + 1
    return [*out, line[start:]]


def pasted_lines(platform: Platform, pasted: Pasted, width: int) -> list[str]:
    """What to paste, wrapped so that it still pastes: a ``qm set`` line continued with
    `` \\``; a QEMU argument's JSON broken between its members, its other options after a
    comma; XML as it is (it is short)."""
    if platform == "proxmox" and pasted.argv:
        return _shell_lines(list(pasted.argv), width)
    lines = []
    for line in pasted.text.splitlines():
        if len(line) <= width:
            lines.append(line)
        else:
            lines += _json_breaks(line, width) if "'{" in line else _option_breaks(line, width)
    return lines


def paste_block(platform: Platform, pasted: Pasted, width: int) -> list[str]:
    """The block to paste, under a comment naming the platform, with its notes."""
    lines = [f"# ready to paste ({TITLES[platform]}):", *pasted_lines(platform, pasted, width)]
    for note in pasted.notes:
        lines += _wrap(note, width, "# note: ", "#   ")
    return lines
