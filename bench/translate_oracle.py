"""translate against the real libvirtd, over generated domains (issue 36's oracle).

usage: PYTHONPATH=$PWD .venv/bin/python bench/translate_oracle.py [--count 1000] [--seed 36]
       [--examples 3] [--uri qemu:///system] [--show KIND]

Generates ``--count`` domains (seeded: the same seed gives the same domains;
iomatrix/testing/libvirt_domains.py), gets libvirt's ``virsh domxml-to-native qemu-argv`` for
each (batched: one virsh process per 200) and ``iomatrix translate``'s disk arguments, and
prints the count of each outcome (iomatrix/testing/libvirt_oracle.py) with examples of the
faults: each SILENT DIFFERENCE (the disk's arguments from both) and each domain libvirt refuses
that translate gave arguments. In the Debian 13 root (libvirt 11.3): the test
tests/translate/test_libvirt_oracle.py with IOMATRIX_ORACLE_EXAMPLES=1000 runs as many.
"""

from __future__ import annotations

import argparse
import collections
import time

from iomatrix.drivers import libvirt as lvd
from iomatrix.testing.libvirt_domains import RandomPicker, domain
from iomatrix.testing.libvirt_oracle import Outcome, compare, native


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--examples", type=int, default=3, help="shown per fault kind")
    parser.add_argument("--uri", default=lvd.DEFAULT_URI)
    parser.add_argument("--show", default=None, help="also show examples of this outcome")
    args = parser.parse_args()
    versions = lvd.daemon_versions(args.uri)
    domains = [domain(RandomPicker(args.seed * 1_000_003 + i), name=f"oracle{i}").xml
               for i in range(args.count)]
    started = time.monotonic()
    real = native(domains, args.uri, timeout=lvd.PROBE_TIMEOUT)
    virsh_s = time.monotonic() - started
    started = time.monotonic()
    results = [compare(xml, out, versions) for xml, out in zip(domains, real)]
    translate_s = time.monotonic() - started
    counts = collections.Counter(r.outcome for r in results)
    print(f"{versions.label}: {args.count} domains (seed {args.seed}); virsh {virsh_s:.1f} s "
          f"({1000 * virsh_s / args.count:.1f} ms a domain), translate and compare "
          f"{translate_s:.1f} s")
    for outcome in Outcome:
        print(f"  {outcome.value:40} {counts.get(outcome, 0):5}")
    for outcome in Outcome:
        if not (outcome.fault or outcome.value == args.show):
            continue
        shown = [(i, r) for i, r in enumerate(results) if r.outcome == outcome][:args.examples]
        for i, result in shown:
            print(f"\n== {outcome.value}: domain {i} ==\n{domains[i]}\n{result.detail}")
    raise SystemExit(1 if any(o.fault for o in counts) else 0)


if __name__ == "__main__":
    main()
