#!/usr/bin/env python3
"""fio.exe's build (iomatrix.appliance.winfio), twice from nothing, in two new caches: the time
each took, its cache key, and whether both gave the same bytes (reproducible: the same key gives
the same fio.exe whatever the build directory and the time of the build).

    PYTHONPATH=$PWD .venv/bin/python bench/winfio_build.py [--builds 2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from iomatrix.appliance.winfio import windows_fio, windows_key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--builds", type=int, default=2)
    args = parser.parse_args()
    digests = []
    for n in range(args.builds):
        cache = Path(tempfile.mkdtemp(prefix=f"winfio-build{n}-", dir="/var/tmp"))
        try:
            started = time.monotonic()
            built = windows_fio(cache)
            print(f"build {n + 1}: {time.monotonic() - started:.1f} s wall "
                  f"(its manifest: {built.build_seconds} s), key {windows_key(cache)}, "
                  f"{built.source}, {built.toolchain}, SOURCE_DATE_EPOCH "
                  f"{built.source_date_epoch}, DLLs {list(built.dlls) or 'none'}, "
                  f"fio.exe sha256 {built.sha256}")
            digests.append(built.sha256)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    same = len(set(digests)) == 1
    print("reproducible: the builds gave the same fio.exe" if same
          else "NOT reproducible: the builds differ")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
