#!/usr/bin/env python3
"""The table of attacks of issues 20 and 31, from running them: tests/attacks/test_adversary.py,
the cache and ``--out`` tests of tests/attacks/test_untrusted_inputs.py,
tests/attacks/test_attacks_*.py and tests/attacks/test_store_untrusted.py, as root, each attack as
a user the tests make. Each test names its attack and how it must end (``tests.conftest.attack``):
"refused" (one line, or what the user planted is not believed) or "harmless" (the run goes on and
nothing it should not changes). A row counts the tests of that attack that ran (tried) and, of
those that passed, each as its outcome; a failed test counts as tried only. The attacker's own
loops (the F1 swap) add what they tried, by operation, and what the kernel let them do.

A second table counts the fuzz of issue 31 (item 7) by input kind (suite keys, node requests,
store columns, PostgreSQL URLs...): the cases tried and how many ended in a traceback, as each
fuzz test recorded them (``tests.conftest.fuzzed``).

    .venv/bin/python bench/attacks.py              # about 5 minutes on 2 busy cores
    .venv/bin/python bench/attacks.py -- -k F1     # more pytest arguments after --
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = ("tests/attacks/test_adversary.py", "tests/attacks/test_untrusted_inputs.py",
         "tests/attacks/test_attacks_*.py", "tests/attacks/test_store_untrusted.py")
SELECTED = "(adversary or cache or out_refuses or guest_fio or attacks_ or store_untrusted) " \
           "and not (untrusted_inputs and test_any_)"
"""The attacks: all of test_adversary, of test_attacks_* and of test_store_untrusted, and
test_untrusted_inputs' tests of items 3 and 5 (its property tests, ``test_any_*``, are counted
by their own settings, not here; test_store_untrusted's ``test_any_*`` record fuzz counts)."""


def tests() -> list[str]:
    """pytest's arguments: the files of FILES that exist (by glob) and SELECTED."""
    return [str(p.relative_to(REPO)) for pattern in FILES for p in sorted(REPO.glob(pattern))] \
        + ["-k", SELECTED]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pytest_args", nargs="*", help="more arguments for pytest (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="iomatrix-attacks-") as tmp:
        xml = Path(tmp) / "junit.xml"
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-o", "junit_family=legacy", f"--junitxml={xml}", *tests(),
                               *args.pytest_args], cwd=REPO,
                              timeout=3600)
        if not xml.exists():
            print(f"pytest wrote no results (exit {done.returncode})", file=sys.stderr)
            return 1
        cases = ET.parse(xml).getroot().iter("testcase")
        rows: dict[str, Counter[str]] = defaultdict(Counter)
        loops: dict[str, Counter[str]] = defaultdict(Counter)
        fuzz: dict[str, Counter[str]] = defaultdict(Counter)
        failed = []
        for case in cases:
            if case.find("skipped") is not None:
                continue
            for p in case.iter("property"):
                if p.get("name") == "fuzz":
                    counted = json.loads(str(p.get("value")))
                    fuzz[counted["input"]].update(cases=counted["cases"],
                                                  tracebacks=counted["tracebacks"])
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            if "attack" not in props:
                if "fuzz" in props and (case.find("failure") is not None
                                        or case.find("error") is not None):
                    failed.append(case.get("name"))
                continue
            row = rows[str(props["attack"])]
            row["tried"] += 1
            if case.find("failure") is None and case.find("error") is None:
                row[str(props["outcome"])] += 1
            else:
                failed.append(case.get("name"))
            if "attempts" in props:
                loops[str(props["attack"])].update(json.loads(str(props["attempts"])))
    print("| attack | tried | refused | harmless |\n|---|---:|---:|---:|")
    for name in sorted(rows):
        r = rows[name]
        print(f"| {name} | {r['tried']} | {r['refused']} | {r['harmless']} |")
    total = sum(rows.values(), Counter())
    print(f"| **all** | {total['tried']} | {total['refused']} | {total['harmless']} |")
    if loops:
        print("\nThe attacker's loops, by operation (done: the kernel let the user do it):")
        for name in sorted(loops):
            ops = loops[name]
            rounds = ops.pop("rounds", 0)
            print(f"  {name}: {rounds} rounds; " + (", ".join(
                f"{op} {ops[op]}" for op in sorted(ops)) or "nothing of root's there to act on"))
    print_fuzz(fuzz)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 0 if done.returncode == 0 else 1


def print_fuzz(fuzz: dict[str, Counter[str]]) -> None:
    """The fuzz counts: cases and tracebacks per input kind."""
    if not fuzz:
        return
    print("\n| fuzzed input | cases | tracebacks |\n|---|---:|---:|")
    for kind in sorted(fuzz):
        print(f"| {kind} | {fuzz[kind]['cases']} | {fuzz[kind]['tracebacks']} |")
    total = sum(fuzz.values(), Counter())
    print(f"| **all** | {total['cases']} | {total['tracebacks']} |")


if __name__ == "__main__":
    sys.exit(main())
