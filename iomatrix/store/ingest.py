"""fio results made elsewhere — by bench-fio (fio-plot), pbench-fio or a shell loop — stored as
one iomatrix run, so that ``show``, ``report``, ``export`` and ``compare`` read them like a run of
iomatrix's own.

What is read: every regular file under the directory that holds ``"fio version"`` in its first
MiB, parsed by :mod:`iomatrix.fio.parse` (text before the JSON, json+, client/server output).
Symbolic links are not followed, so pbench's ``reference-result`` link never counts a sample
twice. Other JSON files, archives and unparsable fio output are skipped, each with its reason.

One fio result becomes one trial per job group (fio's ``groupid``: jobs separated by
``stonewall`` ran one after the other). The jobs of a group ran at once; they are summed as fio's
``group_reporting`` sums them, and must share one workload. The workload comes from the jobs'
options (``job options`` over ``global options``): rw, bs, iodepth, numjobs, rate_iops, and the
options that change what is measured (rwmixread, ioengine, direct=0, rate, fsync, fdatasync).
A synchronous engine runs at queue depth 1 whatever ``iodepth`` says (fio caps it), so such a
workload is stored at QD1.

The configuration is the directory a file lies in, less the parts of its path that name the
file's own workload or a repetition: bench-fio's ``<target>/<bs>/<rw>-<qd>-<nj>.json`` (with
``<rw><mix>/`` for mixed workloads and ``run-N/`` for repeated preconditioning) gives one
configuration per target; pbench-fio's ``<run>/<N>-<rw>-<bs>KiB/sample<M>/fio-result.txt`` gives
one per pbench run, its samples being samples. Where all configurations share leading
directories, those are left out of their names. File names never separate configurations: files
of one configuration with the same workload are samples of one point, in the order fio wrote them.
Nothing is left out or merged silently: the run's notes name the folders left out of names, and
folders that differ by more than a repetition never merge: where leaving out their names would
make two folders of the same workload one configuration, those names are kept.

Latency: every sample of a run is of one fio latency (``iomatrix.fio.samples``), recorded as
the run's ``host["latency"]``: the total latency ``lat`` where fio computed its percentiles for
every result (``lat_percentiles=1``), otherwise fio's default, the completion latency ``clat``.

fio 2.3 and later are read (``iomatrix.fio.parse`` reads back to 2.1, but fio before 2.3 writes
no job options, so its results name no workload and are skipped, saying so).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from iomatrix.core.errors import FioParseError, IomatrixError, NothingToImport
from iomatrix.core.trust import ANYONE
# The parser's own decoder (text before the JSON, fio's bare nan), so there is one copy of it.
from iomatrix.fio.parse import JobSection, read_fio_output, version_of
from iomatrix.fio.models import JobStats
from iomatrix.fio.samples import (DEFAULT_LATENCY, LATENCIES, DirectionSample, LatencyKind,
                                  has_percentiles, samples_of)
from iomatrix.store import Store
from iomatrix.store.jobgroups import Unsupported, group_samples, group_workload
from iomatrix.store.records import IMPORTED, StoredSuite, TrialResult
from iomatrix.suite.load import toml_table
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.core.units import parse_size
from iomatrix.vocab.words import Mode, RunStatus, TrialStatus

ImportMode = Literal["host", "blocklayer", "guest", "imported"]
MODES: tuple[str, ...] = ImportMode.__args__  # type: ignore[attr-defined]

HEAD_BYTES = 1 << 20
"""How much of each file is searched for ``"fio version"`` before the file is read whole."""
MAX_BYTES = 256 << 20
ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".zip", ".gz",
            ".xz", ".bz2", ".zst")

_REPEAT = re.compile(r"^(?:(?:sample|run|rep|repeat|iter|iteration|loop|pass|round|trial)"
                     r"[-_]?\d+|\d{1,3})$", re.IGNORECASE)
_PBENCH_ITERATION = re.compile(r"^\d+-(?P<rw>[a-z]+)-(?P<kib>\d+)KiB$", re.IGNORECASE)
_PBENCH_FAILED = re.compile(r"^\d+-[a-z]+-\d+KiB-fail\d+$", re.IGNORECASE)
_TOKEN_SPLIT = re.compile(r"[-_.,+=\s]+")
_PREFIXED = re.compile(r"^(qd|iodepth|depth|nj|numjobs|jobs|bs|mix|rwmixread)(\d+[kmgt]?i?b?)$")
_FILLER = frozenset({"qd", "iodepth", "depth", "nj", "numjobs", "jobs", "bs", "mix", "rwmixread"})
JOB_OPTIONS = (2, 3)
"""The first fio release that writes its jobs' options (the workload) into its JSON."""
LATENCY_KEY = "latency"
"""The key of ``host`` that records which fio latency the run's samples are of (as
``iomatrix.analysis.metrics`` reads it)."""


class ImportedConfiguration(Configuration):
    """A configuration known only by where its files were. iomatrix applied none of the disk
    settings, so none is claimed: ``source`` names the directory, ``clients`` how many fio
    clients ran the jobs at once (client/server output)."""

    mode: ImportMode  # type: ignore[assignment]
    source: str
    clients: int | None = None

    def params(self) -> dict[str, str]:
        out = {"source": self.source}
        if self.clients:
            out["clients"] = str(self.clients)
        return out

    @property
    def label(self) -> str:
        text = self.source if self.mode == "imported" else f"{self.mode}: {self.source}"
        if self.clients == 1:
            text += " via a fio client"
        elif self.clients:
            text += f" ×{self.clients} fio clients"
        return text


@dataclass(frozen=True)
class Skipped:
    """A file (or one job group of a file) not imported, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class FoundTrial:
    """One job group of one fio result, ready to be stored."""

    path: str
    """Relative to the imported directory."""
    location: tuple[str, ...]
    """The directories that name its configuration (before common leading ones are dropped):
    ``_location`` of its path, then ``configuration_locations`` of the whole scan."""
    clients: int | None
    workload: Workload
    group: int
    timestamp: int
    started_at: str
    wall_seconds: float | None
    fio_version: str
    samples: tuple[DirectionSample, ...]
    """Of the scan's latency (``Scan.latency``; ``variants`` holds both)."""
    failure: str | None
    usr_cpu: float
    sys_cpu: float
    ctx: int
    raw: str
    variants: Mapping[str, tuple[DirectionSample, ...]] = field(default_factory=dict)
    """The samples of each fio latency ("lat", "clat"), with that latency's mean and
    percentiles."""
    percentiles: frozenset[str] = frozenset()
    """The fio latencies that have percentiles in every direction of these samples."""
    parts: tuple[str, ...] = ()
    """The directories of its path (relative to the imported directory)."""
    names_workload: tuple[bool, ...] = ()
    """For each of ``parts``, whether it names the file's workload (``4k``, ``randrw70``)."""

    def samples_of(self, latency: LatencyKind) -> tuple[DirectionSample, ...]:
        return self.variants.get(latency, self.samples)


@dataclass(frozen=True)
class Scan:
    """What a directory holds: its fio results as trials, and what was not imported."""

    path: Path
    """What was asked for: a directory, or one file."""
    root: Path
    files: tuple[str, ...]
    """The fio result files read (relative paths)."""
    trials: tuple[FoundTrial, ...]
    skipped: tuple[Skipped, ...]
    warnings: tuple[str, ...]
    other_files: int
    """Files that are not fio output (job files, logs, tool data), not listed one by one."""
    hosts: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    disks: tuple[str, ...] = ()
    latency: LatencyKind = "lat"
    """The fio latency every trial's samples are of (``choose_latency``)."""
    notes: tuple[str, ...] = ()
    """What the run's notes must say about how the results were read (latency, names)."""


@dataclass(frozen=True)
class ImportSummary:
    """What ``import_results`` stored."""

    run_id: int
    files: int
    skipped: tuple[Skipped, ...]
    warnings: tuple[str, ...]
    other_files: int
    configurations: tuple[str, ...]
    """Their labels."""
    workloads: tuple[str, ...]
    trials_ok: int
    trials_failed: int
    notes: tuple[str, ...] = field(default=())


# --- the walk ----------------------------------------------------------------------------------


def scan(path: Path) -> Scan:
    """Every fio result under ``path`` (a directory, or one file) as trials; nothing is stored.
    Raises :class:`NothingToImport` when there is none."""
    path = Path(path)
    if path.is_file():
        root, candidates = path.parent, [path]
    elif path.is_dir():
        root, candidates = path, None
    else:
        raise NothingToImport(f"{path}: no such file or directory")
    skipped: list[Skipped] = []
    warnings: list[str] = []
    trials: list[FoundTrial] = []
    files: list[str] = []
    hosts: set[str] = set()
    targets: set[str] = set()
    disks: set[str] = set()
    other = looked = 0
    for file in candidates if candidates is not None else _walk(root, skipped):
        looked += 1
        rel = file.relative_to(root).as_posix()
        parts = file.relative_to(root).parts[:-1]
        failed_attempt = next((p for p in parts if _PBENCH_FAILED.match(p)), None)
        before = len(skipped)
        text = _fio_text(file, rel, skipped)
        if text is None:
            other += len(skipped) == before  # not listed: job files, logs, tool data
            continue
        if failed_attempt is not None:
            skipped.append(Skipped(rel, f"under {failed_attempt}: an attempt pbench rejected "
                                        "and ran again"))
            continue
        try:
            found = _read_result(text, rel, parts, mtime=_mtime(file))
        except FioParseError as exc:
            skipped.append(Skipped(rel, str(exc)))
            continue
        if found.trials:   # a file whose every job group was skipped is not imported
            files.append(rel)
        trials += found.trials
        skipped += found.skipped
        warnings += found.warnings
        hosts |= found.hosts
        targets |= found.targets
        disks |= found.disks
    if not trials:
        looked += sum(1 for s in skipped if s.reason.startswith("symbolic link"))
        detail = (f"; skipped {len(skipped)}, e.g. {skipped[0].path}: {skipped[0].reason}"
                  if skipped else "")
        raise NothingToImport(f"{path}: no fio result to import ({looked} files looked at{detail})")
    latency, latency_notes = choose_latency(trials)
    locations, location_notes = configuration_locations(trials)
    trials = [replace(t, location=locations[i], samples=t.samples_of(latency))
              for i, t in enumerate(trials)]
    return Scan(path=path, root=root, files=tuple(files), trials=tuple(trials),
                skipped=tuple(skipped), warnings=tuple(warnings + latency_notes + location_notes),
                other_files=other, hosts=tuple(sorted(hosts)),
                targets=tuple(sorted(targets)), disks=tuple(sorted(disks)), latency=latency,
                notes=tuple(latency_notes + location_notes))


def _mtime(file: Path) -> int | None:
    try:
        return int(file.stat().st_mtime)
    except OSError:
        return None


def _walk(root: Path, skipped: list[Skipped]) -> Iterable[Path]:
    """Regular files under ``root`` in a stable order; symbolic links are listed, not followed."""
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        dirnames.sort()
        for name in list(dirnames):
            if (base / name).is_symlink():
                dirnames.remove(name)
                skipped.append(Skipped((base / name).relative_to(root).as_posix(),
                                       "symbolic link: not followed, so no result counts twice"))
        for name in sorted(filenames):
            file = base / name
            if file.is_symlink():
                skipped.append(Skipped(file.relative_to(root).as_posix(),
                                       "symbolic link: not followed, so no result counts twice"))
            elif file.is_file():
                yield file


def _fio_text(file: Path, rel: str, skipped: list[Skipped]) -> str | None:
    """The file's text when it may hold fio output; None (and a reason where one is due)
    when it does not."""
    name = file.name.lower()
    if name.endswith(ARCHIVES):
        skipped.append(Skipped(rel, "an archive: unpack it to import what it holds"))
        return None
    try:
        size = file.stat().st_size
        with file.open("rb") as handle:
            head = handle.read(HEAD_BYTES)
            if b'"fio version"' not in head:
                if name.endswith(".json"):
                    skipped.append(Skipped(rel, _not_fio(head, size)))
                return None
            if size > MAX_BYTES:
                skipped.append(Skipped(rel, f"larger than {MAX_BYTES >> 20} MiB"))
                return None
            data = head + handle.read()
    except OSError as exc:
        skipped.append(Skipped(rel, f"cannot read: {exc.strerror or exc}"))
        return None
    return data.decode("utf-8", errors="replace")


def _not_fio(head: bytes, size: int) -> str:
    """Why a .json file whose first MiB holds no ``"fio version"`` is not fio output."""
    if size == 0:
        return "empty file (0 bytes)"
    if b"\x00" in head:
        return f"binary data ({size} bytes), not JSON text"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if size <= len(head) or exc.start < len(head) - 4:   # not a character cut at 1 MiB
            return f"binary data ({size} bytes), not UTF-8 text"
        text = head[:exc.start].decode("utf-8")
    if not text.strip():
        return f"only blank space ({size} bytes), no fio output"
    if size <= len(head):
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            return f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        except (ValueError, RecursionError):   # a number of 4300+ digits, or deep nesting
            return "JSON that no fio writes (nested too deeply, or a number too long)"
        return 'JSON without "fio version": not fio output'
    return f'no "fio version" in its first {HEAD_BYTES >> 20} MiB: not fio output'


# --- one fio result ------------------------------------------------------------------------------


@dataclass
class _Found:
    trials: list[FoundTrial] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)
    targets: set[str] = field(default_factory=set)
    disks: set[str] = field(default_factory=set)


def _read_result(text: str, rel: str, parts: Sequence[str], *, mtime: int | None = None) -> _Found:
    output = read_fio_output(text)
    result = output.result
    found = _Found()
    client = output.client
    if output.global_options is None and all(j.options is None for j in output.sections):
        found.skipped.append(Skipped(rel, _no_options(result.fio_version)))
        return found
    results = text.count('"fio version"')
    if results > 1:
        found.warnings.append(f"{rel}: holds {results} fio results; only the first was imported")
    timestamp = result.timestamp
    if timestamp is None:   # fio before 2.2.8
        if mtime is None:
            found.skipped.append(Skipped(rel, f"{result.fio_version} output has no timestamp "
                                              "and the file's time cannot be read"))
            return found
        timestamp = mtime
        found.warnings.append(f"{rel}: {result.fio_version} wrote no timestamp; the file's "
                              "modification time stands for when fio finished")
    global_options = output.global_options or {}
    entries = list(zip(output.sections, result.jobs))  # parse keeps fio's order
    hostnames = sorted({j.hostname for j in result.jobs if j.hostname})
    found.hosts.update(hostnames)
    found.disks.update(output.disks)
    clients = len({(j.hostname, j.port) for j in result.jobs}) if client else None

    groups: dict[int, list[tuple[JobSection, JobStats]]] = {}
    for section, job in entries:
        groups.setdefault(section.group, []).append((section, job))
    elapsed = {g: max(section.elapsed for section, _ in members)
               for g, members in groups.items()}
    order = sorted(groups)
    for index, gid in enumerate(order):
        members = groups[gid]
        where = rel if len(order) == 1 else f"{rel} (job group {gid})"
        options = [{**global_options, **(section.options or {})} for section, _ in members]
        for opts in options:
            for key in ("filename", "directory"):
                if opts.get(key):
                    found.targets.add(opts[key])
        jobs = [job for _, job in members]
        try:
            workload, asked, notes = group_workload(members, options, clients_per_host=client)
            variants = {kind: group_samples(result, jobs, client, len(order), kind)
                        for kind in LATENCIES}
        except Unsupported as exc:
            found.skipped.append(Skipped(where, str(exc)))
            continue
        found.warnings += [f"{where}: {n}" for n in notes]
        targets = sorted({o.get("filename") or o.get("directory") or "" for o in options} - {""})
        if len(jobs) > 1 and len(targets) > 1:
            found.warnings.append(
                f"{where}: its {len(jobs)} jobs ran at once on different files or devices "
                f"({', '.join(targets[:4])}{', …' if len(targets) > 4 else ''}); stored summed "
                "as one trial, as fio's group_reporting sums them")
        errors = [f"fio job {job.name} ended with error {job.error}"
                  for _, job in members if job.error]
        samples = variants[DEFAULT_LATENCY]
        if not samples and not errors:
            found.skipped.append(Skipped(where, "no reads or writes measured (trim workloads "
                                                "are not stored)"))
            continue
        started = max(0, timestamp - sum(elapsed[g] for g in order[index:]))   # 1970 at most
        cpu_source = [result.aggregate] if client and result.aggregate and len(order) == 1 else jobs
        directions = [s for job in cpu_source for s in (job.read, job.write) if s.active]
        found.trials.append(FoundTrial(
            path=rel, location=_location(parts, asked), clients=clients, workload=workload,
            group=index, timestamp=timestamp, started_at=_iso(started),
            wall_seconds=float(elapsed[gid]) if elapsed[gid] else None,
            fio_version=result.fio_version, samples=() if errors else samples,
            failure="; ".join(errors) or None,
            usr_cpu=sum(j.usr_cpu for j in cpu_source), sys_cpu=sum(j.sys_cpu for j in cpu_source),
            ctx=sum(j.ctx for j in cpu_source), raw=text,
            variants={k: () if errors else v for k, v in variants.items()},
            percentiles=frozenset(k for k in LATENCIES
                                  if directions and all(has_percentiles(d, k) for d in directions)),
            parts=tuple(parts), names_workload=tuple(_names_workload(p, asked) for p in parts)))
    return found


def _no_options(version: str) -> str:
    """Why a result without job options is not imported: what fio ``version`` writes."""
    release = version_of(version)
    old = release is not None and release[:2] < JOB_OPTIONS
    return ((f"{version} output: fio before {'.'.join(map(str, JOB_OPTIONS))} writes "
             if old else f"{version} output: it holds ")
            + "no job options, so the workload (rw, bs, iodepth) of its results is unknown")


# --- where a file lies ----------------------------------------------------------------------------


def _location(parts: Sequence[str], workload: Workload) -> tuple[str, ...]:
    """The directories of a file's path that name its configuration: those that do not just
    repeat its workload (``4k``, ``randrw70``, ``1-randread-4KiB``) or count repetitions
    (``sample3``, ``run-2``, ``7``; a number of four digits or more, like a year, is a name)."""
    return tuple(p for p in parts if not (_REPEAT.match(p) or _names_workload(p, workload)))


def _names_workload(part: str, w: Workload) -> bool:
    m = _PBENCH_ITERATION.match(part)
    if m:
        return m.group("rw").lower() == w.rw and int(m.group("kib")) * 1024 == w.bs
    tokens = [t for t in _TOKEN_SPLIT.split(part.lower()) if t]
    # a word alone ("mix", "qd") says what kind of value follows, not the workload's own value
    return (any(t not in _FILLER for t in tokens)
            and all(_token_names(t, w) for t in tokens))


def _token_names(token: str, w: Workload) -> bool:
    options = dict(w.options)
    mix = int(options["rwmixread"]) if "rwmixread" in options else None
    numbers = {w.iodepth, w.numjobs} | ({mix, 100 - mix} if mix is not None else set())
    if token in _FILLER or token == w.rw or (w.rw == "rw" and token == "readwrite"):
        return True
    if mix is not None and token in (f"{w.rw}{mix}", f"{w.rw}{mix}{100 - mix}"):
        return True
    if token.isdigit():
        return int(token) in numbers or int(token) == w.bs
    m = _PREFIXED.match(token)
    if m:
        kind, value = m.groups()
        if kind == "bs":
            return _size_or_none(value) == w.bs
        if not value.isdigit():
            return False
        return int(value) == {"qd": w.iodepth, "iodepth": w.iodepth, "depth": w.iodepth,
                              "nj": w.numjobs, "numjobs": w.numjobs, "jobs": w.numjobs,
                              "mix": mix, "rwmixread": mix}[kind]
    return _size_or_none(token) == w.bs


def _size_or_none(text: str) -> int | None:
    """A folder name's size: people's words, not fio's, so binary (pbench's 4KiB is 4096)."""
    try:
        return parse_size(text)
    except ValueError:
        return None


def configuration_locations(trials: Sequence[FoundTrial]) -> tuple[dict[int, tuple[str, ...]],
                                                                   list[str]]:
    """Each trial's configuration directories (by its index), and what the run's notes say about
    them. A trial's configuration leaves out the directories that count repetitions and those that
    name its workload, but only where every folder beside it does too (``<target>/4k/`` and
    ``<target>/1m/``, not ``randrw/`` beside ``mix/``); where that still makes files of one workload
    from folders that differ by more than a repetition samples of one point (``ssd/4k/`` and
    ``ssd/4096/``), the directories that tell those folders apart are kept in their names."""
    like: dict[tuple[tuple[str, ...], str], bool] = {}   # (parent, folder) → names every workload
    children: dict[tuple[str, ...], set[str]] = {}
    for t in trials:
        for i, (part, named) in enumerate(zip(t.parts, t.names_workload)):
            key = (t.parts[:i], part)
            like[key] = like.get(key, True) and (named or bool(_REPEAT.match(part)))
            children.setdefault(t.parts[:i], set()).add(part)

    def short(t: FoundTrial) -> tuple[str, ...]:
        out = []
        for i, (part, named) in enumerate(zip(t.parts, t.names_workload)):
            if _REPEAT.match(part):
                continue
            if named and all(like[(t.parts[:i], c)] for c in children[t.parts[:i]]):
                continue
            out.append(part)
        return tuple(out)

    def kept(t: FoundTrial) -> tuple[str, ...]:
        return tuple(p for p in t.parts if not _REPEAT.match(p))

    shorts = [short(t) if len(t.names_workload) == len(t.parts) else t.location for t in trials]
    groups: dict[tuple[Any, ...], set[tuple[str, ...]]] = {}
    for t, loc in zip(trials, shorts):
        groups.setdefault((loc, t.clients, t.workload), set()).add(kept(t))
    restore: dict[tuple[str, ...], tuple[str, ...]] = {}   # kept path → its location
    notes: list[str] = []
    for (loc, _, workload), variants in groups.items():
        if len(variants) < 2:
            continue
        shared = set.intersection(*(set(v) for v in variants))
        named = {v: tuple(p for p in v if p in loc or p not in shared) for v in variants}
        if len(set(named.values())) < len(variants):
            named = {v: v for v in variants}
        restore.update(named)
        folders = sorted("/".join(v) or "." for v in variants)
        notes.append(f"{' and '.join(folders)} hold the same workload ({workload.label}) and would "
                     f"be one configuration ({'/'.join(loc) or '.'}): kept apart as "
                     + ", ".join(sorted("/".join(n) or "." for n in set(named.values()))))
    locations = {i: restore.get(kept(t), shorts[i]) for i, t in enumerate(trials)}
    dropped = sorted({p for i, t in enumerate(trials) for p in t.parts
                      if p not in locations[i] and not _REPEAT.match(p)})
    repeats = sorted({p for t in trials for p in t.parts if _REPEAT.match(p)})
    if dropped:
        notes.append("configuration names leave out the folders that name each file's workload: "
                     + _listed(dropped))
    if repeats:
        notes.append("folders taken as repetitions (their files are samples of one point): "
                     + _listed(repeats))
    return locations, notes


def _listed(names: Sequence[str], shown: int = 8) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def choose_latency(trials: Sequence[FoundTrial]) -> tuple[LatencyKind, list[str]]:
    """The one fio latency a run's samples are of, and the notes that say so: the total latency
    ``lat`` where fio computed its percentiles for every result with percentiles, else the
    completion latency ``clat`` (fio's default), else the one more results have percentiles of
    (the others' percentiles are left out, never mixed in)."""
    measured = [t for t in trials if t.failure is None and t.samples]
    with_pct = [t for t in measured if t.percentiles]
    if not with_pct:
        return "lat", ["latency: fio's total latency (lat: submission + completion); "
                       "no result has percentiles"]
    covered = {k: sum(k in t.percentiles for t in with_pct) for k in LATENCIES}
    kind: LatencyKind = ("lat" if covered["lat"] == len(with_pct)
                         else "clat" if covered["clat"] == len(with_pct)
                         else max(LATENCIES, key=lambda k: covered[k]))
    notes = []
    if kind == "lat":
        notes.append("latency: fio's total latency (lat: submission + completion), mean and "
                     "percentiles")
    else:
        notes.append("latency: fio's completion latency (clat), mean and percentiles: fio computes "
                     "percentiles of the total latency only with lat_percentiles=1")
    left = len(with_pct) - covered[kind]
    if left:
        notes.append(f"{left} of {len(with_pct)} results have percentiles of the other latency "
                     f"only: their percentiles are left out (one latency per run)")
    return kind, notes


def _names(locations: Iterable[tuple[str, ...]], root: Path) -> dict[tuple[str, ...], str]:
    """Each location's configuration name: the directories where the locations differ (never
    the same name for two locations)."""
    unique = sorted(set(locations))
    common = 0
    if len(unique) > 1:
        shortest = min(len(loc) for loc in unique)
        while common < shortest and len({loc[common] for loc in unique}) == 1:
            common += 1
    top = root.resolve().name or str(root)
    names = {loc: "/".join(loc[common:]) or top for loc in unique}
    if () in names and list(names.values()).count(names[()]) > 1:
        names[()] = f"{top} (top level)"
    return names


# --- storing --------------------------------------------------------------------------------------


def import_results(store: Store, path: Path, *, name: str | None = None,
                   mode: str | None = None) -> ImportSummary:
    """Store the fio results under ``path`` as one complete run; what was stored and skipped."""
    return store_scan(store, scan(path), name=name, mode=mode)


def store_scan(store: Store, found: Scan, *, name: str | None = None,
               mode: str | None = None) -> ImportSummary:
    """Store a scan as one complete run. ``mode`` says how fio reached the storage; without it,
    host (fio on the storage directly) is assumed, and the run's notes say so."""
    mode_given = mode is not None
    mode = mode or Mode.HOST
    if mode not in MODES:
        raise IomatrixError(f"mode {mode!r}: choose one of {', '.join(MODES)}")
    path = found.path
    names = _names((t.location for t in found.trials), found.root)
    configs: dict[tuple[tuple[str, ...], int | None], ImportedConfiguration] = {}
    for t in found.trials:
        configs.setdefault((t.location, t.clients), ImportedConfiguration(
            mode=mode, source=names[t.location], clients=t.clients))  # type: ignore[arg-type]
    workloads = list(dict.fromkeys(t.workload for t in
                                   sorted(found.trials, key=lambda t: _workload_order(t.workload))))
    source = str(Path(path).resolve())
    versions = sorted({t.fio_version for t in found.trials})
    times = sorted(t.timestamp for t in found.trials)
    host = {
        "hostname": ", ".join(found.hosts) if found.hosts else "unknown (imported)",
        "target": ", ".join(found.targets[:4]) + (", …" if len(found.targets) > 4 else "")
                  if found.targets else "unknown (imported)",
        "target_fs": "unknown",
        "fio": ", ".join(versions),
        "imported_from": source,
        "first_result": _iso(times[0]),
        "last_result": _iso(times[-1]),
        "accelerator": "none",
        LATENCY_KEY: found.latency,
    }
    if found.disks:
        host["disks"] = ", ".join(found.disks)
    notes = [f"imported from {source} ({len(found.files)} files)",
             "iomatrix ran none of these trials: each configuration is the directory its files "
             "were in, not disk settings iomatrix applied, and no host telemetry was recorded",
             *found.notes,
             (f"mode {mode}: as stated when imported" if mode_given else
              f"mode {mode}: assumed (fio ran on the storage directly); import with --mode to "
              "say otherwise")]
    suite_name = name or Path(path).resolve().name or "imported"
    # the path JSON-quoted: a directory's name holding a line break ends no comment here
    suite_text = (f"# imported from {json.dumps(source)} ({len(found.files)} files); "
                  "not a suite iomatrix can run\n" + toml_table("suite", {"name": suite_name}))
    run_id = store.create_run(
        suite=StoredSuite(name=suite_name, source=IMPORTED + source, text=suite_text,
                          author=ANYONE), host=host,
        accelerator="none", notes=notes, configs=list(configs.values()), workloads=workloads,
        seed=None)
    index: dict[tuple[str, str], int] = {}
    ok = failed = 0
    for t in sorted(found.trials, key=lambda t: (t.timestamp, t.path, t.group)):
        config = configs[(t.location, t.clients)]
        point = (config.key, t.workload.key)
        k = index[point] = index.get(point, -1) + 1
        store.record_trial(run_id, TrialResult(
            config_key=config.key, workload_key=t.workload.key, sample_index=k,
            status=TrialStatus.FAILED if t.failure else TrialStatus.OK, reason=t.failure,
            started_at=t.started_at,
            samples=t.samples, wall_seconds=t.wall_seconds, fio_version=t.fio_version,
            usr_cpu=t.usr_cpu, sys_cpu=t.sys_cpu, ctx=t.ctx, fio_json=t.raw, accelerator="none"))
        failed += bool(t.failure)
        ok += not t.failure
    store.finish_run(run_id, RunStatus.COMPLETE)
    return ImportSummary(run_id=run_id, files=len(found.files), skipped=found.skipped,
                         warnings=found.warnings, other_files=found.other_files,
                         configurations=tuple(c.label for c in configs.values()),
                         workloads=tuple(w.label for w in workloads), trials_ok=ok,
                         trials_failed=failed, notes=tuple(notes))


def _workload_order(w: Workload) -> tuple[Any, ...]:
    return (w.rw, w.bs, w.iodepth, w.numjobs, w.rate_iops, w.options)


# --- small helpers --------------------------------------------------------------------------------


def _iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")
