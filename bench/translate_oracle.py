"""translate against the real libvirtd, over generated domains (issue 36's oracle).

usage: PYTHONPATH=$PWD .venv/bin/python bench/translate_oracle.py [--count 1000] [--seed 36]
       [--examples 3] [--uri qemu:///system] [--show "differs with a note"]
Debian 13 (libvirt 11.3): IOMATRIX_ORACLE_BENCH=1000 .ci/debian13 -n 0 -s -p no:randomly \
       tests/translate/test_libvirt_oracle.py -k bench

Generates ``--count`` domains (seeded: the same seed gives the same domains;
iomatrix/testing/libvirt_domains.py), gets libvirt's ``virsh domxml-to-native qemu-argv`` for
each (batched: one virsh process per 200) and ``iomatrix translate``'s disk arguments, and
prints the count of each outcome (iomatrix/testing/libvirt_oracle.py) with examples of the
faults: each SILENT DIFFERENCE (the disk's arguments from both) and each domain libvirt refuses
that translate gave arguments. Exit status 1 when there is a fault.
"""

from __future__ import annotations

import argparse

from iomatrix.drivers import libvirt as lvd
from iomatrix.testing.libvirt_oracle import bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--examples", type=int, default=3, help="shown per fault kind")
    parser.add_argument("--uri", default=lvd.DEFAULT_URI)
    parser.add_argument("--show", default=None, help="also show examples of this outcome")
    args = parser.parse_args()
    report, counts = bench(args.count, seed=args.seed, uri=args.uri, examples=args.examples,
                           show=args.show)
    print(report)
    raise SystemExit(1 if any(o.fault for o in counts) else 0)


if __name__ == "__main__":
    main()
