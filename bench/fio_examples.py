#!/usr/bin/env python3
"""How many of fio's own example job files iomatrix loads as workloads, and why it refuses the
others: each refusal a SAFETY refusal (it could reach beyond the target as root: files, commands,
root's environment) or OUTSIDE what iomatrix measures (another engine, buffered I/O, jobs that
run together...), as ``iomatrix.suite.jobfiles`` says at the end of every refusal.

Each file is read as a suite would read it (``jobfiles.workloads``) with the [method] engine the
file names where iomatrix offers it (a suite would set that engine), else libaio, and no
[fio_vars]: a file refused only for a ``${NAME}`` a suite could define is counted apart.

    .venv/bin/python bench/fio_examples.py                       # Debian's fio-examples
    .venv/bin/python bench/fio_examples.py DIR --reasons         # every refusal's reason
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from iomatrix.suite.fiooptions import SAFETY, SCOPE  # noqa: E402
from iomatrix.suite.jobfiles import ENGINES, JobFileError, workloads  # noqa: E402

EXAMPLES = Path("/usr/share/doc/fio/examples")
"""Debian's fio-examples (``setup.sh --dev`` installs it)."""
LOADED = "loaded"
UNDEFINED = "not in the suite's [fio_vars] table"


def engine_of(text: str) -> str:
    """The engine a suite for this file would choose: the file's own where iomatrix offers it."""
    named = re.findall(r"^[ \t]*ioengine=([a-z_0-9]+)", text, re.M)
    return next((e for e in named if e in ENGINES), "libaio")


def verdict(path: Path) -> tuple[str, str]:
    """("loaded", "") or (SAFETY or SCOPE, the reason without its line number)."""
    text = path.read_text(errors="replace")
    try:
        workloads(text, engine=engine_of(text))
    except JobFileError as exc:
        reason = re.sub(r"^line \d+: ", "", str(exc)).removesuffix(f" ({exc.kind})")
        return exc.kind, reason
    return LOADED, ""


def count(directory: Path) -> dict[str, tuple[str, str]]:
    """Every ``*.fio`` of ``directory``: its verdict."""
    return {p.name: verdict(p) for p in sorted(directory.glob("*.fio"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", type=Path, default=EXAMPLES)
    parser.add_argument("--reasons", action="store_true", help="print every file's verdict")
    args = parser.parse_args()
    verdicts = count(args.directory)
    if not verdicts:
        print(f"no *.fio in {args.directory}", file=sys.stderr)
        return 1
    kinds = Counter(kind for kind, _ in verdicts.values())
    undefined = sum(1 for kind, why in verdicts.values() if UNDEFINED in why)
    print(f"{args.directory}: {len(verdicts)} job files: {kinds[LOADED]} loaded, "
          f"{kinds[SAFETY]} refused for safety ({undefined} only for a ${{NAME}} a suite's "
          f"[fio_vars] could define), {kinds[SCOPE]} refused as outside what iomatrix measures")
    for kind in (SAFETY, SCOPE):
        reasons = Counter(re.sub(r"^\[[^]]*\] ", "", why)[:110] for k, why in verdicts.values()
                          if k == kind)
        print(f"\n{kind}:")
        for why, n in reasons.most_common():
            print(f"  {n:3d}  {why}")
    if args.reasons:
        print()
        for name, (kind, why) in verdicts.items():
            print(f"{name}: {kind}{': ' + why if why else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
