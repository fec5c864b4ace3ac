#!/usr/bin/env python3
"""Behaviour snapshots of iomatrix, and their comparison (issue 32: "behaviour unchanged, shown
by a before/after comparison over a corpus").

    .venv/bin/python bench/behaviour.py snapshot OUT_DIR [--tree PATH | --ref REV] [--only GLOB]
    .venv/bin/python bench/behaviour.py diff A_DIR B_DIR [--changes-only] [--lines N]
    .venv/bin/python bench/behaviour.py compare --ref REV [--to REV] [--out DIR]

A snapshot runs one tree's iomatrix over a fixed corpus and writes one file per item: the
command, its exit status, its stdout and its stderr, normalized (below). Only the command line
is used (``python -m iomatrix`` with PYTHONPATH=the tree, in a subprocess), so snapshots of two
trees compare however the modules inside are rearranged. The one exception is the synthetic
runs, which no command can make: a small script (``SYNTH_SCRIPT``) writes them with the tree's
own ``iomatrix.testing.synthetic.write_run``, as the tests do; if the redesign moves it, the
script's imports are the one place to follow it.

The corpus (item names are files under OUT_DIR; the first folder is the item's kind):
  suites/     ``iomatrix suites`` and ``iomatrix suites NAME`` of every built-in suite
  plan/       ``iomatrix run SUITE --plan --seed 1 [--scale S]``: every built-in suite, without
              --scale and at each of its scales ([scale.NAME] tables of ``suites NAME``)
  translate/  ``iomatrix translate``: every qemu-server fixture of tests/fixtures/cfg2cmd (its
              ``--- config`` section) with that storage.cfg, for Proxmox VE 8 and 9; the VM
              definitions of tests/translate/test_translate.py (PVE_CONF, LIBVIRT_XML) and the
              domains of tests/scenarios/test_libvirt.py (DOMAINS), each for several libvirt/QEMU versions
  stored/     databases made afresh by the tree (``iomatrix import`` of fio results of
              tests/fixtures/fio; the synthetic runs of SYNTH_SCRIPT) and the tests' stored
              database tests/fixtures/store/schema-v1.db, read back with runs, show (--command),
              effect (several axes and options), findings, recommend (each --for, --explain),
              scores, compare (two runs, a fleet, across databases), export (json, csv, suite)
              and report: the report's data (the page's embedded JSON view model, unpacked,
              keys sorted) and the page itself with each embedded script replaced by its hash
  errors/     commands that must fail (missing run, damaged database, bad options...): the
              exit status and the message are behaviour too

The corpus's input files are taken from this checkout's tests/ (``--corpus``), not from the tree
under test, and copied into a work directory, so both sides of a comparison read the same
inputs; the built-in suites are the tree's own (a suite one tree lacks shows as missing). Each
command runs in a clean environment: HOME, TMPDIR and the working directory inside the work
directory, COLUMNS=200, TZ=UTC, NO_COLOR, no IOMATRIX_DB. Snapshots compare only when made on the
same machine (plans name the host's RAM, recommend the QEMU installed, translate's defaults the
libvirt installed).

Normalization (``NORMALIZERS``; applied to every output):
  the work directory              -> <WORK>   (a temporary directory, same length each time)
  the tree's directory            -> <TREE>
  ISO-8601 dates and date-times within a day of the snapshot's clock -> <NOW> / <TODAY>
                                  (when a run was created or finished; the fixed dates of the
                                  fixtures, days or years away, are kept)
  Unix times (10 or 13 digits) within a day of the snapshot's clock -> <EPOCH>
  UUIDs not in the corpus's inputs -> <UUID>  (none appear today; a VM's uuid or a Ceph fsid
                                  from a fixture is kept)
  free space ("77.0 GiB free")    -> <SIZE> free  (a guest image's overlay check in --plan)
  JSON printed by a command (export --format json) and embedded in the report has its keys
  sorted (json.dumps(sort_keys=True, indent=1)): an object's key order is no behaviour.
  Nothing else is normalized: --plan's estimates are computed from the suite (no wall clock) and
  two snapshots of one tree are identical without touching them (tests/test_behaviour_corpus.py).

Items run two at a time (two processes at most). An item that fails records its exit status and
stderr like any other, so a change in an error shows as a difference.
"""

from __future__ import annotations

import argparse
import ast
import base64
import concurrent.futures
import dataclasses
import datetime as dt
import difflib
import fnmatch
import gzip
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED = "1"
WORKERS = 2
TIMEOUT = 300
"""Seconds one command may take (a report of the largest run takes a few)."""
WORK_PREFIX = "iomx-behaviour-"
"""tempfile.mkdtemp's suffix is 8 characters: the work directory's path has the same length in
every snapshot, so a line that names it wraps the same way."""

# -- the corpus's fixed choices -----------------------------------------------------------------

PVE_VERSIONS = ("8", "9")
LIBVIRT_VERSIONS = (("9.0", "7.2"), ("10.1", "9.0"), ("11.3", "10.0"))
"""(libvirt, QEMU) pairs translate is asked for: Debian 12's, the first where a raw disk loses its
format node, Debian 13's."""

IMPORTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # database name, fixture under tests/fixtures/fio, import's options
    ("fio-3.33", "3.33", ()),
    ("bench-fio", "3.1/bench-fio", ("--name", "old-nvme")),
    ("import-3.33", "3.33/import", ()),
    ("import-3.41", "3.41/import", ("--mode", "blocklayer")),
    ("pbench", "3.25/pbench", ()),
    ("failed", "3.33/failed", ("--mode", "imported")),
    ("fio-2.20", "2.20", ("--mode", "guest")),
    ("one-file", "3.16/randread.json", ()),
)

SYNTH_SCRIPT = r'''
"""Synthetic runs for bench/behaviour.py: made-up figures (seeded, deterministic) written with
the tree's own synthetic-run maker, as the tests write theirs. Argument: the database file."""
import random
import sqlite3
import sys

try:
    from iomatrix.testing import synthetic as syn
except ImportError as e:
    sys.exit(f"no synthetic-run maker: {e}")
Store = getattr(syn, "Store", None)
Configuration = getattr(syn, "Configuration", None)
Workload = getattr(syn, "Workload", None)
if Store is None:
    from iomatrix.store import Store
if Configuration is None or Workload is None:
    try:
        from iomatrix.suite.configuration import Configuration
        from iomatrix.suite.workloads import Workload
    except ImportError:         # a tree before suite/model.py was split
        from iomatrix.suite.model import Configuration, Workload

DB = sys.argv[1]
WORKLOADS = [Workload(rw="randread", bs=bs, iodepth=qd) for bs in (4096, 65536) for qd in (1, 8, 32)]
READS = [Workload(rw="randread", bs=4096, iodepth=1), Workload(rw="randread", bs=4096, iodepth=32),
         Workload(rw="randread", bs=131072, iodepth=1), Workload(rw="randwrite", bs=4096, iodepth=32)]
SEED_000 = {"controller": ["virtio-scsi-single"], "aio": ["native", "io_uring"],
            "iothread": [True, False], "cache": ["none"], "format": ["raw"]}
FINDINGS = """[suite]
name = "s"
[target]
directory = "/var/tmp/iomatrix"
size = "1GiB"

[[finding]]
id = "t-io_uring"
study = "seed test §2"
claim = "io_uring beats native"
published = "+20 %"
kind = "effect"
axis = "aio"
level = "io_uring"
reference = "native"
expect = "better"

[[finding]]
id = "t-threads"
study = "seed test §3"
claim = "threads is slow"
published = "-50 %"
kind = "effect"
axis = "aio"
level = "threads"
reference = "native"
expect = "worse"
"""


def figures(effect, scale=1.0, failed=lambda c, w, i: False):
    def gen(c, w, i):
        if failed(c, w, i):
            return None
        rng = random.Random(f"{c.key}|{w.key}|{i}|{scale}")
        base = 20000 * 4096 / w.bs * (1 + w.iodepth / 8)
        value = base * effect(c) * scale * (1 + rng.gauss(0, 0.02))
        lat = w.iodepth * (getattr(c, "vms", None) or 1) / value * 1e9
        return syn.Figures(value, value * w.bs, lat, 2.1 * lat)
    return gen


def seed_000(c):
    if c.mode == "host":
        return 1.2
    return (1.15 if c.iothread else 1.0) * (1.03 if c.aio == "native" else 1.0)


def aio(c):
    return {"io_uring": 1.2, "native": 1.0, "threads": 0.6}.get(c.aio, 1.0)


def scaling(c):
    return (c.vms or 1) ** 0.8 * (1.05 if c.aio == "native" else 1.0)


def libvirt(c):
    return (1.1 if c.iothread else 1.0) * (1.3 if c.cache == "writeback" else 1.0)


guests = syn.configurations("guest", SEED_000)
with Store(DB) as store:
    runs = [
        syn.write_run(store, [Configuration(mode="host"), *guests], WORKLOADS, figures(seed_000)),
        syn.write_run(store, guests, WORKLOADS, figures(seed_000),
                      method={"platform": "proxmox"}),
        syn.write_run(store, guests, WORKLOADS, figures(seed_000, 0.9), accelerator="tcg"),
        syn.write_run(store, syn.configurations("blocklayer", {
            "aio": ["native", "io_uring", "threads"], "cache": ["none"]}), READS,
            figures(aio, failed=lambda c, w, i: c.aio == "threads" and i == 2)),
        syn.write_run(store, syn.configurations("guest", {
            "controller": ["virtio-blk"], "aio": ["native", "io_uring"], "iothread": [True],
            "vms": [1, 2, 4]}), WORKLOADS[:3], figures(scaling), accelerator="kvm", samples=2),
        syn.write_run(store, syn.configurations("guest", {
            "controller": ["virtio-blk"], "aio": ["threads"], "iothread": [True, False],
            "cache": ["none", "writeback"]}), WORKLOADS[::2], figures(libvirt),
            method={"platform": "libvirt"}),
    ]
print("runs", *runs)
try:
    with sqlite3.connect(DB) as db:      # the tests' way to give a run claims (test_findings)
        db.execute("UPDATE runs SET suite_text = ? WHERE id = ?", (FINDINGS, runs[3]))
except sqlite3.Error as e:
    print(f"no findings for run {runs[3]}: {e}")
'''
SYNTH_RUNS = 6


def synth_reads(db: str) -> list[tuple[str, list[str]]]:
    """The reads of the synthetic database beyond each run's own (``run_reads``)."""
    d = ["--db", db]
    return [
        ("run1.effect-aio", ["effect", "1", "--axis", "aio", *d]),
        ("run1.effect-iothread-hold-aio", ["effect", "1", "--axis", "iothread", "--hold", "aio", *d]),
        ("run1.effect-aio-by-workload-lat", ["effect", "1", "--axis", "aio", "--by", "workload",
                                             "--metric", "lat", *d]),
        ("run1.effect-iothread-none-p99", ["effect", "1", "--axis", "iothread", "--by", "none",
                                           "--metric", "p99", *d]),
        ("run1.recommend-proxmox", ["recommend", "1", "--for", "proxmox", *d]),
        ("run1.recommend-proxmox-lvm-explain", ["recommend", "1", "--for", "proxmox", "--storage-type",
                                                "lvm", "--vmid", "101", "--volume",
                                                "local-lvm:vm-101-disk-0", "--explain", *d]),
        ("run1.recommend-libvirt", ["recommend", "1", "--for", "libvirt", "--image",
                                    "/var/lib/libvirt/images/a.raw", *d]),
        ("run1.recommend-qemu-explain", ["recommend", "1", "--for", "qemu", "--explain", *d]),
        ("run1.scores-host", ["scores", "1", "--host", *d]),
        ("run1.scores-metrics", ["scores", "1", "--metrics", "iops,qd1_p99,lat_p99_ns@randread/4k/qd8/nj1",
                                 *d]),
        ("run2.recommend-libvirt-explain", ["recommend", "2", "--for", "libvirt", "--explain", *d]),
        ("run3.recommend-proxmox", ["recommend", "3", "--for", "proxmox", *d]),
        ("run4.effect-aio-reference-io_uring", ["effect", "4", "--axis", "aio", "--reference",
                                                "io_uring", *d]),
        ("run4.recommend-qemu-explain", ["recommend", "4", "--for", "qemu", "--explain", *d]),
        ("run5.effect-aio", ["effect", "5", "--axis", "aio", *d]),
        ("run5.effect-vms", ["effect", "5", "--axis", "vms", *d]),
        ("run6.effect-cache", ["effect", "6", "--axis", "cache", "--hold", "iothread", *d]),
        ("compare-1-3", ["compare", "1", "3", *d]),
        ("compare-1-2-lat", ["compare", "1", "2", "--metric", "lat", *d]),
        ("compare-2-3-match-workload", ["compare", "2", "3", "--match", "workload", *d]),
        ("compare-fleet-1-2-3", ["compare", "1", "2", "3", *d]),
        ("compare-4-1", ["compare", "4", "1", *d]),
        ("runs", ["runs", *d]),
        ("runs-suite-s", ["runs", "--suite", "s", *d]),
        ("runs-host", ["runs", "--host", "synthetic", "--since", "2026-01-01", *d]),
    ]


RUN_READS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("show", ("show",)),
    ("show-command", ("show", "--command")),
    ("effect", ("effect",)),
    ("findings", ("findings",)),
    ("recommend", ("recommend",)),
    ("recommend-explain", ("recommend", "--explain")),
    ("scores", ("scores",)),
    ("export-json", ("export", "--format", "json")),
    ("export-csv", ("export", "--format", "csv")),
    ("export-suite", ("export", "--format", "suite")),
)
"""What is read of every stored run (``iomatrix COMMAND RUN OPTIONS --db DB``), and its report."""

# -- normalization -------------------------------------------------------------------------------

ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::\d{2}(?:\.\d+)?)?"
                 r"(?:Z|[+-]\d{2}:?\d{2})?)?\b")
EPOCH = re.compile(r"(?<![\d.])(1\d{9}(?:\d{3})?)(?:\.\d+)?(?![\d])")
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
FREE = re.compile(r"\b\d+(?:\.\d+)? [KMGTP]?i?B free\b")
WINDOW = dt.timedelta(days=1)


@dataclass
class Normalizer:
    """What legitimately differs between two snapshots, replaced by a placeholder (see the module
    docstring, "Normalization")."""

    work: Path
    tree: Path
    clock: dt.datetime
    inputs: frozenset[str] = frozenset()
    """UUIDs of the corpus's input files (a VM's, a Ceph fsid): kept, they are no accident."""

    def _iso(self, m: re.Match[str]) -> str:
        try:
            day = dt.date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        except ValueError:
            return m.group(0)
        if abs(day - self.clock.date()) > WINDOW:
            return m.group(0)
        return "<NOW>" if m.group(4) is not None else "<TODAY>"

    def _epoch(self, m: re.Match[str]) -> str:
        digits = m.group(1)
        seconds = int(digits) / (1000 if len(digits) == 13 else 1)
        near = abs(seconds - self.clock.timestamp()) <= WINDOW.total_seconds()
        return "<EPOCH>" if near else m.group(0)

    def __call__(self, text: str) -> str:
        for path, name in ((self.work, "<WORK>"), (self.tree, "<TREE>")):
            for form in {str(path), str(path.resolve())}:
                text = text.replace(form, name)
        text = ISO.sub(self._iso, text)
        text = EPOCH.sub(self._epoch, text)
        text = FREE.sub(r"<SIZE> free", text)
        return UUID.sub(lambda m: m.group(0) if m.group(0).lower() in self.inputs else "<UUID>",
                        text)


def input_uuids(directory: Path) -> frozenset[str]:
    found = set()
    for path in directory.rglob("*"):
        if path.is_file():
            found.update(u.lower() for u in UUID.findall(path.read_text(errors="replace")))
    return frozenset(found)


# -- running the tree's iomatrix -------------------------------------------------------------------


@dataclass
class Done:
    args: list[str]
    returncode: int | str
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Tree:
    """One tree's iomatrix, run as ``python -m iomatrix`` with PYTHONPATH=path in ``work``."""

    path: Path
    python: str
    work: Path

    def env(self) -> dict[str, str]:
        keep = {k: os.environ[k] for k in ("PATH", "USER", "LOGNAME", "LANG") if k in os.environ}
        return {**keep, "HOME": str(self.work / "home"), "TMPDIR": str(self.work / "tmp"),
                "PYTHONPATH": str(self.path), "COLUMNS": "200", "LINES": "60", "TERM": "dumb",
                "NO_COLOR": "1", "TZ": "UTC", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0"}

    def python_run(self, args: list[str], timeout: float = TIMEOUT) -> Done:
        start = time.monotonic()
        try:
            done = subprocess.run([self.python, *args], cwd=self.work / "cwd", env=self.env(),
                                  capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, errors="replace")
            code: int | str = done.returncode
            out, err = done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:
            code = f"timeout after {timeout:.0f} s"
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return Done(args, code, out, err, time.monotonic() - start)

    def iomatrix(self, args: list[str]) -> Done:
        done = self.python_run(["-m", "iomatrix", *args])
        done.args = args
        return done

    def check(self) -> None:
        """The tree's iomatrix is the one imported (not the venv's installed one)."""
        done = self.python_run(["-c", "import iomatrix; print(iomatrix.__file__)"], timeout=60)
        where = Path(done.stdout.strip() or "/nonexistent")
        if done.returncode != 0 or self.path.resolve() not in where.resolve().parents:
            raise SystemExit(f"behaviour: {self.path}: python imports iomatrix from "
                             f"{done.stdout.strip() or done.stderr.strip()!r}, not from the tree")


# -- items ---------------------------------------------------------------------------------------

Post = Callable[["Context", Done], dict[str, str]]


@dataclass
class Item:
    name: str
    """Its file under the snapshot, without the suffix: KIND/..."""
    args: list[str]
    needs: str | None = None
    """The database (a build step's name) it reads."""
    post: Post | None = None
    """Further files made from what the command wrote (the report's data and page)."""
    python: bool = False
    """``args`` are the python interpreter's, not iomatrix's."""


@dataclass
class Context:
    tree: Tree
    out: Path
    normalize: Normalizer
    inputs: Path
    """This checkout's tests/ (or --corpus): the corpus's input files."""
    results: dict[str, str] = field(default_factory=dict)
    """Item name → its status: "ok", "exit N" (a command that failed records that too)."""

    @property
    def work(self) -> Path:
        return self.tree.work


def record(ctx: Context, item: Item, done: Done) -> None:
    norm = ctx.normalize
    shown = ("python " if item.python else "iomatrix ") + shlex.join(
        ["<script>" if item.python and i == 0 else a for i, a in enumerate(item.args)])
    text = [f"$ {norm(shown)}", f"exit {done.returncode}", "--- stdout",
            norm(json_sorted(done.stdout)).rstrip("\n")]
    if done.stderr.strip():
        text += ["--- stderr", norm(done.stderr).rstrip("\n")]
    write(ctx.out / f"{item.name}.txt", "\n".join(text) + "\n")
    if item.post is not None:
        try:
            extra = item.post(ctx, done)
        except Exception as e:                      # a page we cannot read is an output too
            extra = {".post-error.txt": f"{type(e).__name__}: {e}\n"}
        for suffix, content in extra.items():
            write(ctx.out / f"{item.name}{suffix}", norm(content))
    ctx.results[item.name] = "ok" if done.returncode == 0 else f"exit {done.returncode}"


def json_sorted(text: str) -> str:
    """A JSON document (export --format json) with its keys sorted and indented alike: the order
    of an object's keys is no behaviour. Any other text as it is."""
    if not text.lstrip().startswith(("{", "[")):
        return text
    try:
        return canonical_json(text)
    except ValueError:
        return text


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


def execute(ctx: Context, item: Item) -> None:
    done = ctx.tree.python_run(item.args) if item.python else ctx.tree.iomatrix(item.args)
    record(ctx, item, done)


# -- the report page -------------------------------------------------------------------------

SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S | re.I)
ATTR = re.compile(r'([\w-]+)="([^"]*)"')


def unpacked(blob: str) -> str:
    """What iomatrix.report.html.packed wrote: gzip, base85 (RFC 1924) with "." for "<"."""
    return gzip.decompress(base64.b85decode(blob.strip().replace(".", "<"))).decode("utf-8")


def canonical_json(text: str) -> str:
    return json.dumps(json.loads(text), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def report_files(out_dir: Path) -> Post:
    """The report page's embedded data (each data script, unpacked; JSON with sorted keys: the
    order of an object's keys is no behaviour) and the page with each script replaced by its
    length and the hash of its normalized text (plotly.js, the page's code and its data)."""

    def post(ctx: Context, done: Done) -> dict[str, str]:
        page_path = out_dir / "index.html"
        if not page_path.exists():
            return {}
        page = page_path.read_text(errors="replace")
        data: list[str] = []

        def hashed(m: re.Match[str]) -> str:
            attrs = dict(ATTR.findall(m.group(1)))
            body = m.group(2)
            ident = attrs.get("id", "")
            if attrs.get("data-encoding") == "gzip+base85":
                body = unpacked(body)
            if ident and ident != "plotly-js" and attrs.get("type", "").startswith("application/"):
                try:
                    content = canonical_json(body)
                except ValueError:
                    content = body if body.endswith("\n") else body + "\n"
                data.append(f"--- {ident}\n{ctx.normalize(content)}")
            digest = hashlib.sha256(ctx.normalize(body).encode()).hexdigest()[:16]
            return f"<script{m.group(1)}>[{len(body)} characters, sha256 {digest}]</script>"

        stripped = SCRIPT.sub(hashed, page)
        return {".data.txt": "".join(data), ".page.html": stripped}

    return post


# -- the corpus ------------------------------------------------------------------------------------


def corpus_file(tests: Path, name: str) -> Path:
    """The test file ``name`` wherever it sits under ``tests`` (whose folders mirror iomatrix/'s;
    an older checkout's tests/ holds it at the top)."""
    return next(iter(sorted(tests.rglob(name))), tests / name)


def literal_constants(path: Path, names: Iterable[str]) -> dict[str, object]:
    """Module-level constants of a test file, read without importing it."""
    wanted, found = set(names), {}
    if not path.exists():
        return {}
    for node in ast.parse(path.read_text()).body:
        target = (node.targets[0] if isinstance(node, ast.Assign) else
                  node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and target.id in wanted and node.value is not None:
            try:
                found[target.id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return found


def cfg2cmd_config(text: str) -> str:
    """The ``--- config`` section of a tests/fixtures/cfg2cmd file (its comments left out)."""
    lines, inside = [], False
    for line in text.splitlines():
        if re.match(r"^--- [\w-]+$", line):
            inside = line == "--- config"
        elif inside and not line.startswith("#"):
            lines.append(line)
    return "\n".join(lines) + "\n"


def suite_names(text: str) -> list[str]:
    """The built-in suites of ``iomatrix suites``'s table (its first column, after the header)."""
    names, header = [], False
    for line in text.splitlines():
        m = re.match(r"^\s*([a-z0-9][\w.-]*)\s{2,}", line)
        if not header:
            header = bool(re.match(r"^\s*suite\s", line))
            continue
        if m:
            names.append(m.group(1))
    return names


def translate_items(ctx: Context) -> list[Item]:
    inp, items = ctx.work / "in", []
    cfg2cmd = ctx.inputs / "fixtures" / "cfg2cmd"
    storage_cfg = inp / "cfg2cmd" / "storage.cfg"
    if (cfg2cmd / "storage.cfg").exists():
        write(storage_cfg, (cfg2cmd / "storage.cfg").read_text())
    for folder in sorted(p for p in cfg2cmd.glob("qemu-server-*") if p.is_dir()):
        for fixture in sorted(folder.glob("*.txt")):
            conf = inp / "cfg2cmd" / folder.name / f"{fixture.stem}.conf"
            write(conf, cfg2cmd_config(fixture.read_text()))
            for version in PVE_VERSIONS:
                items.append(Item(f"translate/cfg2cmd/{folder.name}/{fixture.stem}@pve{version}",
                                  ["translate", str(conf), "--storage-cfg", str(storage_cfg),
                                   "--pve-version", version]))
    consts = literal_constants(corpus_file(ctx.inputs, "test_translate.py"),
                               ("PVE_CONF", "LIBVIRT_XML"))
    domains = literal_constants(corpus_file(ctx.inputs, "test_libvirt.py"),
                                ("DOMAINS",)).get("DOMAINS", {})
    if isinstance(consts.get("PVE_CONF"), str):
        conf = inp / "translate" / "100.conf"
        write(conf, consts["PVE_CONF"])  # type: ignore[arg-type]
        for version in PVE_VERSIONS:
            items.append(Item(f"translate/tests/pve-conf@pve{version}",
                              ["translate", str(conf), "--pve-version", version]))
        items.append(Item("translate/tests/pve-conf@pve9-storage-cfg",
                          ["translate", str(conf), "--storage-cfg", str(storage_cfg)]))
        items.append(Item("translate/tests/pve-conf@pve9-storage-lvm",
                          ["translate", str(conf), "--storage", "local-lvm=lvm"]))
    xmls = {}
    if isinstance(consts.get("LIBVIRT_XML"), str):
        xmls["libvirt-xml"] = consts["LIBVIRT_XML"]
    if isinstance(domains, dict):
        disks = inp / "libvirt-disks"
        xmls.update({f"domain-{k}": v.replace("{dir}", str(disks)) for k, v in domains.items()
                     if isinstance(v, str)})
    for name, xml in xmls.items():
        path = inp / "translate" / f"{name}.xml"
        write(path, str(xml))
        for libvirt, qemu in LIBVIRT_VERSIONS:
            items.append(Item(f"translate/tests/{name}@libvirt-{libvirt}-qemu-{qemu}",
                              ["translate", str(path), "--libvirt-version", libvirt,
                               "--qemu-version", qemu]))
    return items


def build_items(ctx: Context) -> list[Item]:
    """The steps that make the databases: each an item too (its output, its exit status)."""
    inp, db = ctx.work / "in", ctx.work / "db"
    items = []
    for name, fixture, options in IMPORTS:
        source = ctx.inputs / "fixtures" / "fio" / fixture
        target = inp / "fio" / fixture
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        elif source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        items.append(Item(f"stored/{name}/import", ["import", str(target), *options,
                                                    "--db", str(db / f"{name}.db")]))
    script = inp / "synthetic.py"
    write(script, SYNTH_SCRIPT)
    items.append(Item("stored/synthetic/build", [str(script), str(db / "synthetic.db")],
                      python=True))
    return items


def run_reads(ctx: Context, db_name: str, run: str) -> list[Item]:
    db = str(ctx.work / "db" / f"{db_name}.db")
    items = [Item(f"stored/{db_name}/run{run}.{name}", [command[0], run, *command[1:], "--db", db],
                  needs=db_name) for name, command in RUN_READS]
    out = ctx.work / "reports" / db_name / f"run{run}"
    items.append(Item(f"stored/{db_name}/run{run}.report", ["report", run, "--out", str(out), "--db", db],
                      needs=db_name, post=report_files(out)))
    return items


def stored_items(ctx: Context) -> list[Item]:
    db = ctx.work / "db"
    items: list[Item] = []
    for name, _, _ in IMPORTS:
        items += [Item(f"stored/{name}/runs", ["runs", "--db", str(db / f"{name}.db")], needs=name),
                  *run_reads(ctx, name, "1")]
    a, b = str(db / "import-3.33.db"), str(db / "import-3.41.db")
    items += [Item("stored/import-3.33/compare-import-3.41", ["compare", "1", "1", "--db", a,
                                                              "--db-b", b], needs="import-3.33+3.41"),
              Item("stored/import-3.33/compare-import-3.41-lat", ["compare", "1", "last", "--db", a,
                                                                  "--db-b", b, "--metric", "lat"],
                   needs="import-3.33+3.41")]
    for run in range(1, SYNTH_RUNS + 1):
        items += run_reads(ctx, "synthetic", str(run))
    synth = str(db / "synthetic.db")
    items += [Item(f"stored/synthetic/{name}", args, needs="synthetic")
              for name, args in synth_reads(synth)]
    out = ctx.work / "reports" / "synthetic" / "fleet"
    items.append(Item("stored/synthetic/report-fleet-1-2-3", ["report", "1", "2", "3", "--out", str(out),
                                                              "--db", synth],
                      needs="synthetic", post=report_files(out)))
    # the tests' own stored database: an old schema, read (and migrated) from a copy
    v1 = ctx.inputs / "fixtures" / "store" / "schema-v1.db"
    if v1.exists():
        (db / "schema-v1.db").parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(v1, db / "schema-v1.db")
        items += [Item("stored/schema-v1/runs", ["runs", "--db", str(db / "schema-v1.db")]),
                  *(dataclasses.replace(i, needs=None) for i in run_reads(ctx, "schema-v1", "1"))]
    return items


def error_items(ctx: Context) -> list[Item]:
    inp, db = ctx.work / "in", ctx.work / "db"
    (inp / "empty").mkdir(parents=True, exist_ok=True)
    write(inp / "not-a-database.db", "this is not an SQLite file\n")
    synth = str(db / "synthetic.db")
    conf = str(inp / "translate" / "100.conf")
    return [
        Item("errors/show-missing-run", ["show", "99", "--db", synth], needs="synthetic"),
        Item("errors/show-no-database", ["show", "1", "--db", str(db / "nowhere.db")]),
        Item("errors/show-not-a-database", ["show", "1", "--db", str(inp / "not-a-database.db")]),
        Item("errors/export-format-xml", ["export", "1", "--format", "xml", "--db", synth],
             needs="synthetic"),
        Item("errors/effect-axis-unknown", ["effect", "1", "--axis", "speed", "--db", synth],
             needs="synthetic"),
        Item("errors/recommend-for-unknown", ["recommend", "1", "--for", "vmware", "--db", synth],
             needs="synthetic"),
        Item("errors/compare-missing-run", ["compare", "1", "99", "--db", synth], needs="synthetic"),
        Item("errors/run-unknown-suite", ["run", "no-such-suite", "--plan", "--seed", SEED]),
        Item("errors/run-unknown-scale", ["run", "quick", "--plan", "--seed", SEED, "--scale", "huge"]),
        Item("errors/run-plan-accel-unknown", ["run", "quick", "--plan", "--seed", SEED,
                                               "--accel", "xen"]),
        Item("errors/translate-missing-file", ["translate", str(inp / "missing.conf")]),
        Item("errors/translate-pve7", ["translate", conf, "--pve-version", "7"]),
        Item("errors/import-empty", ["import", str(inp / "empty"), "--db", str(db / "empty.db")]),
        Item("errors/import-mode-vm", ["import", str(inp / "fio" / "3.33" / "failed"), "--mode", "vm",
                                       "--db", str(db / "vm.db")]),
    ]


# -- snapshot --------------------------------------------------------------------------------------


def selected(name: str, only: list[str]) -> bool:
    return not only or any(fnmatch.fnmatchcase(name, pattern) for pattern in only)


def snapshot(tree_path: Path, out: Path, *, python: str, only: list[str], inputs: Path,
             quiet: bool = False) -> dict[str, object]:
    """Write ``tree_path``'s behaviour over the corpus into ``out`` (replaced)."""
    started = time.monotonic()
    clock = dt.datetime.now(dt.timezone.utc)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX))
    try:
        for sub in ("home", "tmp", "cwd", "in", "db", "reports"):
            (work / sub).mkdir()
        tree = Tree(tree_path.resolve(), python, work)
        tree.check()
        ctx = Context(tree, out, Normalizer(work, tree.path, clock), inputs)

        def log(msg: str) -> None:
            if not quiet:
                print(f"[{time.monotonic() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

        # the suites first: the plans depend on them
        listing = Item("suites/list", ["suites"])
        listing_done = tree.iomatrix(listing.args)
        names = suite_names(listing_done.stdout) if listing_done.returncode == 0 else []
        first: list[Item] = [listing]
        plans: list[Item] = []
        for name in names:
            first.append(Item(f"suites/{name}", ["suites", name]))
        done_first = {listing.name: listing_done}
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            for item, done in zip(first[1:], pool.map(lambda i: tree.iomatrix(i.args), first[1:])):
                done_first[item.name] = done
        for item in first:
            if selected(item.name, only):
                record(ctx, item, done_first[item.name])
        for name in names:
            text = done_first[f"suites/{name}"].stdout
            scales = sorted(set(re.findall(r"^\[scale\.([\w-]+)\]\s*$", text, re.M)))
            plans.append(Item(f"plan/{name}", ["run", name, "--plan", "--seed", SEED]))
            plans += [Item(f"plan/{name}@{scale}", ["run", name, "--plan", "--seed", SEED,
                                                    "--scale", scale]) for scale in scales]

        builds = build_items(ctx)
        reads = stored_items(ctx) + error_items(ctx)
        others = [i for i in plans + translate_items(ctx) if selected(i.name, only)]
        reads = [i for i in reads if selected(i.name, only)]
        ctx.normalize.inputs = input_uuids(work / "in")
        needed = {part for i in reads if i.needs for part in db_parts(i.needs)}
        builds = [b for b in builds if selected(b.name, only) or b.name.split("/")[1] in needed]
        log(f"{tree.path}: {len(builds)} databases to make, {len(others)} plans and translations, "
            f"{len(reads)} reads")
        # phase 1: the databases (the imports one after another, the synthetic runs beside them),
        # with the plans and translations filling the two workers
        imports = [b for b in builds if b.name.endswith("/import")]
        rest = [b for b in builds if not b.name.endswith("/import")]
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            futures = [pool.submit(lambda: [execute(ctx, b) for b in imports])]
            futures += [pool.submit(execute, ctx, i) for i in rest + others]
            for f in concurrent.futures.as_completed(futures):
                f.result()
        log(f"phase 1 done: {len(ctx.results)} items")
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            for f in concurrent.futures.as_completed([pool.submit(execute, ctx, i) for i in reads]):
                f.result()
        seconds = time.monotonic() - started
        kinds = Counter(name.split("/")[0] for name in ctx.results)
        failed = Counter(name.split("/")[0] for name, status in ctx.results.items() if status != "ok")
        meta = {"tree": str(tree.path), "revision": revision(tree.path), "python": python,
                "made": clock.isoformat(timespec="seconds"), "seconds": round(seconds, 1),
                "items": dict(sorted(kinds.items())), "failing": dict(sorted(failed.items())),
                "only": only}
        write(out / "_meta.json", json.dumps(meta, indent=1))
        log(f"{sum(kinds.values())} items ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}) "
            f"in {seconds:.0f} s; of them ending in an error: {sum(failed.values())}")
        return meta
    finally:
        shutil.rmtree(work, ignore_errors=True)


def db_parts(needs: str) -> list[str]:
    if needs.startswith("import-3.33+"):
        return ["import-3.33", "import-3.41"]
    return [needs]


def revision(path: Path) -> str:
    """The tree's commit, and whether its tracked files differ from it ("" without git)."""
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True)
    except OSError:
        return ""
    if head.returncode != 0:
        return ""
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


class Worktree:
    """``git worktree add --detach`` of REV in a temporary directory, removed on exit."""

    def __init__(self, rev: str) -> None:
        self.rev = rev
        self.path = Path(tempfile.mkdtemp(prefix="iomx-tree-")) / "tree"

    def __enter__(self) -> Path:
        done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet",
                               str(self.path), self.rev], capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(self.path.parent, ignore_errors=True)
            raise SystemExit(f"behaviour: git worktree add {self.rev}: {done.stderr.strip()}")
        return self.path

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(self.path)],
                       capture_output=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True)
        shutil.rmtree(self.path.parent, ignore_errors=True)


def snapshot_of(ref: str | None, tree: Path | None, out: Path, args: argparse.Namespace) -> dict[str, object]:
    kw = dict(python=args.python, only=args.only or [], inputs=args.corpus, quiet=args.quiet)
    if ref is not None:
        with Worktree(ref) as path:
            meta = snapshot(path, out, **kw)  # type: ignore[arg-type]
            meta["revision"] = f"{ref} ({meta['revision']})"
            write(out / "_meta.json", json.dumps(meta, indent=1))
            return meta
    return snapshot(tree or REPO, out, **kw)  # type: ignore[arg-type]


# -- diff --------------------------------------------------------------------------------------------


def items_of(directory: Path) -> dict[str, Path]:
    return {str(p.relative_to(directory)): p for p in sorted(directory.rglob("*"))
            if p.is_file() and not p.relative_to(directory).parts[0].startswith("_")}


def diff(a: Path, b: Path, *, lines: int = 30, changes_only: bool = False,
         stream=sys.stdout) -> int:
    """Print each item as same, differs (a unified diff of at most ``lines`` lines) or missing,
    then the counts; 1 when anything differs or is missing."""
    for d in (a, b):
        if not d.is_dir():
            print(f"behaviour: {d}: no such snapshot", file=sys.stderr)
            return 2
    left, right = items_of(a), items_of(b)
    counts: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = {}
    for name in sorted(set(left) | set(right)):
        kind = name.split("/")[0]
        if name not in left or name not in right:
            status = f"missing in {'A' if name not in left else 'B'}"
            key = "missing"
        else:
            old = left[name].read_text(errors="replace")
            new = right[name].read_text(errors="replace")
            key = status = "same" if old == new else "differs"
        counts[key] += 1
        by_kind.setdefault(kind, Counter())[key] += 1
        if key == "same" and changes_only:
            continue
        print(f"{status:10} {name}", file=stream)
        if key == "differs":
            udiff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), f"A/{name}",
                                              f"B/{name}", n=1, lineterm=""))
            for line in udiff[:lines]:
                print(f"    {line[:300]}", file=stream)
            if len(udiff) > lines:
                print(f"    ... {len(udiff) - lines} more diff lines", file=stream)
    total = sum(counts.values())
    print(f"{total} items: {counts['same']} same, {counts['differs']} differ, "
          f"{counts['missing']} missing", file=stream)
    for kind, c in sorted(by_kind.items()):
        print(f"  {kind:10} {sum(c.values()):4} items: {c['same']} same, {c['differs']} differ, "
              f"{c['missing']} missing", file=stream)
    return 0 if counts["differs"] == counts["missing"] == 0 else 1


# -- command line ------------------------------------------------------------------------------------


def default_python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--python", default=default_python(),
                       help="interpreter that runs each tree (default: this checkout's .venv)")
        p.add_argument("--corpus", type=Path, default=REPO / "tests",
                       help="the tests/ folder whose fixtures are the corpus (default: this checkout's)")
        p.add_argument("--only", action="append", metavar="GLOB",
                       help="only the items whose name matches (repeatable), e.g. 'plan/*'")
        p.add_argument("--quiet", action="store_true", help="no progress on stderr")

    snap = sub.add_parser("snapshot", help="write a tree's behaviour into OUT_DIR")
    snap.add_argument("out", type=Path, metavar="OUT_DIR")
    where = snap.add_mutually_exclusive_group()
    where.add_argument("--tree", type=Path, help="the tree to run (default: this checkout)")
    where.add_argument("--ref", help="a commit, checked out in a temporary git worktree")
    common(snap)

    dif = sub.add_parser("diff", help="compare two snapshots")
    dif.add_argument("a", type=Path, metavar="A_DIR")
    dif.add_argument("b", type=Path, metavar="B_DIR")
    dif.add_argument("--lines", type=int, default=30, help="diff lines shown per item")
    dif.add_argument("--changes-only", action="store_true", help="leave out the items that are the same")

    cmp_ = sub.add_parser("compare", help="snapshot REV and this checkout, and diff them")
    cmp_.add_argument("--ref", required=True, help="the commit before (A)")
    cmp_.add_argument("--to", help="the commit after (B; default: this checkout as it is, "
                                   "uncommitted changes included)")
    cmp_.add_argument("--out", type=Path, help="keep the snapshots here (A/ and B/); default: a "
                                               "temporary directory, kept only when they differ")
    cmp_.add_argument("--lines", type=int, default=30, help="diff lines shown per item")
    cmp_.add_argument("--changes-only", action="store_true", help="leave out the items that are the same")
    common(cmp_)

    args = parser.parse_args(argv)
    if args.command == "snapshot":
        snapshot_of(args.ref, args.tree, args.out, args)
        return 0
    if args.command == "diff":
        return diff(args.a, args.b, lines=args.lines, changes_only=args.changes_only)
    base = args.out or Path(tempfile.mkdtemp(prefix="iomx-behaviour-compare-"))
    a, b = base / "A", base / "B"
    meta_a = snapshot_of(args.ref, None, a, args)
    meta_b = snapshot_of(args.to, None, b, args)
    print(f"A: {meta_a['revision']} ({meta_a['seconds']} s)   B: {meta_b['revision']} "
          f"({meta_b['seconds']} s)")
    status = diff(a, b, lines=args.lines, changes_only=args.changes_only)
    if status == 0 and args.out is None:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"snapshots: {a} {b}")
    return status


if __name__ == "__main__":
    sys.exit(main())
