"""fio's JSON output → :class:`~iomatrix.fio.models.FioResult`.

The one place that knows fio's JSON. It accepts what fio 2.1 and later print with
``--output-format=json`` or ``json+``, run locally (``jobs``) or as a client of ``fio --server``
(``client_stats``), and copes with the differences between releases (fio's own ``stat.c`` history):

- text before the JSON (client/server progress lines) is kept in ``prelude``; anything after the
  JSON object is ignored;
- latencies are ``slat_ns``/``clat_ns``/``lat_ns`` (fio 2.x wrote ``clat``/``lat`` in µs, also
  accepted and converted); ``N`` (sample count) exists only from fio 3.20;
- ``bw_bytes`` exists from fio 3.3, older releases only have ``bw`` in KiB/s;
  ``job_runtime`` exists from fio 3.9;
- ``io_bytes`` is in KiB before fio 2.21 (which added ``io_kbytes`` and made it bytes);
  ``total_ios`` exists from fio 2.1.14 (before, it is estimated from ``iops`` × ``runtime``);
  ``timestamp`` from fio 2.2.8 (before, ``FioResult.timestamp`` is None); ``job options`` from
  fio 2.3; a job's ``job_start`` (ms since 1970) from fio 3.36, also in each client's entry. Output of fio before 2.1 is refused, naming the version;
- percentile keys are ``"%f"`` of the percentile ("99.900000"); fio before 3.5 pads the dict with
  ``"0.00": 0`` entries, and omits it or writes it empty when percentiles are off;
- before fio 3.13, percentiles of the total latency (``lat_percentiles=1``, or
  ``clat_percentiles=0``, which then implied it) were written under ``clat_ns``; the job's options
  tell them apart;
- ``bins`` (json+ only) sit next to the percentiles they were computed from.

Percentiles: each ``Latency`` carries only the percentiles and bins fio computed of that
distribution (``lat`` those of the total latency, ``clat`` those of the completion latency);
``DirectionStats.percentile_source`` names the one fio computed ("lat" preferred when both), and
``DirectionStats.bins`` is its histogram. A direction that did no I/O has ``lat``/``clat`` None.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

from iomatrix.core.errors import FioParseError
from iomatrix.core.model import Frozen
from iomatrix.fio.depth import LEVELS
from iomatrix.fio.models import DirectionStats, FioResult, JobStats, Latency, Percentiles

__all__ = ["parse_fio_output", "parse_fio_json", "read_fio_output"]

AGGREGATE_NAME = "All clients"
_PERCENTILE_FIELDS = {50.0: "p50", 90.0: "p90", 99.0: "p99", 99.9: "p99_9", 99.99: "p99_99"}
_JSON_START = re.compile(r"^\{", re.MULTILINE)
# fio formats floats with "%f", so a NaN or infinity comes out as a bare nan/-nan/inf.
_BARE_NONFINITE = re.compile(r"(:\s*)(-?)(nan|inf)\b", re.IGNORECASE)
_TRUE = {"", "1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_VERSION = re.compile(r"fio-(\d+)\.(\d+)(?:\.(\d+))?")
OLDEST = (2, 1)
"""The oldest fio release whose JSON is read."""
_IO_BYTES_IN_BYTES = (2, 21)   # before: io_bytes in KiB
_TOTAL_IOS = (2, 1, 14)        # before: no total_ios
_LARGEST = 2**63 - 1
"""The largest integer a result may hold: fio counts in 64 bits, SQLite stores 64 signed."""
_LATEST = 253402300799
"""The last second of the year 9999: Python's datetime ends there."""


def parse_fio_output(text: str) -> FioResult:
    """Parse what fio printed (stdout or ``--output`` file) in a JSON output format.

    Raises :class:`FioParseError` when there is no usable result in ``text``."""
    if not isinstance(text, str):
        raise FioParseError(f"fio output must be text, got {type(text).__name__}")
    if not text.strip():
        raise FioParseError("fio printed no output (empty text where a JSON result was expected)")
    obj, prelude = decode_fio_output(text)
    return parse_fio_json(obj, prelude=prelude)


class JobSection(Frozen):
    """What fio's JSON says of one job beside its statistics: what an import of a result reads
    to tell its workloads apart (``iomatrix.store.ingest``)."""

    group: int = 0
    """Its "groupid"; 0 where fio wrote none, or not a whole number."""
    elapsed: int = 0
    """Its "elapsed" seconds; 0 (unknown) where not a whole number from 0 to 2³²."""
    options: dict[str, str] | None = None
    """Its "job options" as text; None where fio wrote none (before fio 2.3)."""


class FioOutput(Frozen):
    """fio's output as an import reads it: the typed result and what fio wrote beside it."""

    result: FioResult
    client: bool
    """Output of fio's client (``client_stats``), not of a local run (``jobs``)."""
    global_options: dict[str, str] | None
    """fio's "global options" as text; None where it wrote none."""
    sections: tuple[JobSection, ...]
    """One per job of ``result.jobs``, in its order."""
    disks: tuple[str, ...]
    """The names in fio's "disk_util"."""


def read_fio_output(text: str) -> FioOutput:
    """What fio printed, parsed as ``parse_fio_output`` does, with what it says of its jobs
    beside their statistics. Raises :class:`FioParseError` when there is no usable result."""
    obj, prelude = decode_fio_output(text)
    result = parse_fio_json(obj, prelude=prelude)
    client = "client_stats" in obj
    entries = [e for e in obj["client_stats" if client else "jobs"]
               if not (client and e.get("jobname") == AGGREGATE_NAME)]
    disk_util = obj.get("disk_util")
    disks = [d["name"] for d in disk_util if isinstance(d, dict) and isinstance(d.get("name"), str)
             ] if isinstance(disk_util, list) else []       # fio's, unless made by hand
    return FioOutput(
        result=result, client=client, global_options=_text_options(obj.get("global options")),
        sections=tuple(JobSection(group=_int_or(e.get("groupid"), 0),
                                  elapsed=_seconds(e.get("elapsed")),
                                  options=_text_options(e.get("job options"))) for e in entries),
        disks=tuple(disks))


def _text_options(options: object) -> dict[str, str] | None:
    return {str(k): str(v) for k, v in options.items()} if isinstance(options, dict) else None


def _seconds(value: object) -> int:
    seconds = _int_or(value, 0)
    return seconds if 0 <= seconds <= 2**32 else 0


def _int_or(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def decode_fio_output(text: str) -> tuple[dict[str, Any], str]:
    """The first JSON object fio printed in ``text`` (bare nan/inf repaired) and the text before
    it (fio's warnings). Raises :class:`FioParseError` when no line starts an object."""
    match = _JSON_START.search(text)
    if match is None:
        raise FioParseError("no JSON object in fio output (no line starts with '{'): "
                            f"{_excerpt(text, 0)}")
    return decode_json(text, match.start()), text[:match.start()]


def parse_fio_json(obj: object, prelude: str = "") -> FioResult:
    """Build a :class:`FioResult` from fio's already decoded JSON object."""
    if not isinstance(obj, dict):
        raise FioParseError(f"fio JSON must be an object, got {type(obj).__name__}")
    version = obj.get("fio version")
    if not isinstance(version, str) or not version:
        raise FioParseError(f"fio JSON has no 'fio version' string (keys: {_keys(obj)})")
    release = version_of(version)
    if release is not None and release[:2] < OLDEST:
        raise FioParseError(f"{version} output: fio older than {'.'.join(map(str, OLDEST))} "
                            "is not supported")
    timestamp = _int(obj, "timestamp", "top level") if "timestamp" in obj else None  # fio >= 2.2.8
    if timestamp is not None and not 0 <= timestamp <= _LATEST:
        raise FioParseError(f"fio top level 'timestamp' is {timestamp}: not a time fio writes "
                            "(seconds since 1970, before the year 10000)")

    if "client_stats" in obj:
        key = "client_stats"
    elif "jobs" in obj:
        key = "jobs"
    else:
        raise FioParseError(f"fio JSON has neither 'jobs' nor 'client_stats' (keys: {_keys(obj)})")
    entries = obj[key]
    if not isinstance(entries, list):
        raise FioParseError(f"fio JSON '{key}' is {type(entries).__name__}, expected a list")
    if not entries:
        raise FioParseError(f"fio JSON '{key}' is empty: fio reported no job")

    global_options = obj.get("global options")
    global_options = global_options if isinstance(global_options, dict) else {}
    jobs: list[JobStats] = []
    aggregate: JobStats | None = None
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise FioParseError(f"fio job #{index} in '{key}' is {type(entry).__name__}, "
                                "expected an object")
        is_aggregate = key == "client_stats" and entry.get("jobname") == AGGREGATE_NAME
        stats = _job(entry, index, global_options, client=key == "client_stats",
                     aggregate=is_aggregate, release=release)
        if is_aggregate:
            aggregate = stats
        else:
            jobs.append(stats)
    if not jobs:
        raise FioParseError(f"fio JSON '{key}' has only the '{AGGREGATE_NAME}' entry, no job")
    return FioResult(fio_version=version, timestamp=timestamp, jobs=tuple(jobs),
                     aggregate=aggregate, prelude=prelude)


def version_of(version: str) -> tuple[int, int, int] | None:
    """fio's version string as (major, minor, patch): "fio-2.1.10" → (2, 1, 10), "fio-3.33" →
    (3, 33, 0); None when it does not look like a release."""
    m = _VERSION.match(version.strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


# --- decoding ------------------------------------------------------------------------------------


def decode_json(text: str, start: int) -> dict[str, Any]:
    decoder = json.JSONDecoder()
    try:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            # Retry with fio's bare nan/inf spelled the way Python's json reads them.
            fixed = _BARE_NONFINITE.sub(_nonfinite, text[start:])
            try:
                obj, _ = decoder.raw_decode(fixed)
            except json.JSONDecodeError:
                raise FioParseError(f"invalid JSON in fio output at line {exc.lineno} column "
                                    f"{exc.colno}: {exc.msg}; near {_excerpt(text, exc.pos)}"
                                    ) from None
    except RecursionError:
        raise FioParseError("JSON nested too deeply: not fio output") from None
    except ValueError:     # not a JSONDecodeError: Python's int() digit limit
        raise FioParseError(f"a number of more than {sys.get_int_max_str_digits()} digits: "
                            "not fio output") from None
    if not isinstance(obj, dict):  # pragma: no cover - a '{' always decodes to a dict
        raise FioParseError(f"fio JSON must be an object, got {type(obj).__name__}")
    return obj


def _nonfinite(m: re.Match[str]) -> str:
    word = "NaN" if m.group(3).lower() == "nan" else m.group(2) + "Infinity"
    return m.group(1) + word


# --- one job ---------------------------------------------------------------------------------------


def _job(entry: dict[str, Any], index: int, global_options: Mapping[str, Any], *, client: bool,
         aggregate: bool, release: tuple[int, int, int] | None = None) -> JobStats:
    name = entry.get("jobname")
    if not isinstance(name, str):
        raise FioParseError(f"fio job #{index} has no 'jobname' (keys: {_keys(entry)})")
    where = f"job #{index} '{name}'"
    if "read" not in entry and "write" not in entry and "mixed" in entry:
        raise FioParseError(f"fio {where} has only a 'mixed' section "
                            "(unified_rw_reporting=mixed), which iomatrix does not read")
    options = dict(global_options)
    job_options = entry.get("job options")
    if isinstance(job_options, dict):
        options.update(job_options)

    read = _direction(_section(entry, "read", where), f"{where} read", options, release)
    write = _direction(_section(entry, "write", where), f"{where} write", options, release)
    if "job_runtime" in entry:  # fio >= 3.9
        job_runtime = _int(entry, "job_runtime", where)
    else:
        trim = entry.get("trim")
        trim_runtime = _int(trim, "runtime", f"{where} trim") if isinstance(trim, dict) else 0
        job_runtime = max(read.runtime_ms, write.runtime_ms, trim_runtime)

    hostname: str | None = None
    port: int | None = None
    if client and not aggregate:
        # fio copies the last client's hostname/port onto the aggregate; they describe no host.
        hostname = entry.get("hostname") if isinstance(entry.get("hostname"), str) else None
        port = _int(entry, "port", where) if "port" in entry else None
    return JobStats(
        name=name, hostname=hostname, port=port,
        error=_int(entry, "error", where, default=0),
        job_runtime_ms=job_runtime,
        read=read, write=write,
        usr_cpu=_float(entry, "usr_cpu", where),
        sys_cpu=_float(entry, "sys_cpu", where),
        ctx=_int(entry, "ctx", where),
        majf=_int(entry, "majf", where, default=0),
        minf=_int(entry, "minf", where, default=0),
        job_start_ms=(_int(entry, "job_start", where) or None) if "job_start" in entry else None,
        depth_levels=_depth_levels(entry, where),
    )


def _depth_levels(entry: Mapping[str, Any], where: str) -> tuple[tuple[int, float], ...]:
    """fio's ``iodepth_level`` of a job (``iomatrix.fio.depth``), () when it wrote none."""
    levels = entry.get("iodepth_level")
    if not isinstance(levels, dict):
        return ()
    return tuple((depth, _float(levels, key, f"{where} iodepth_level"))
                 for key, depth in LEVELS if key in levels)


def _section(entry: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = entry.get(key)
    if value is None:
        raise FioParseError(f"fio {where}: missing '{key}' section (keys: {_keys(entry)})")
    if not isinstance(value, dict):
        raise FioParseError(f"fio {where}: '{key}' is {type(value).__name__}, expected an object")
    return value


def _direction(d: dict[str, Any], where: str, options: Mapping[str, Any],
               release: tuple[int, int, int] | None = None) -> DirectionStats:
    io_bytes = _int(d, "io_bytes", where)
    if release is not None and release < _IO_BYTES_IN_BYTES:
        io_bytes *= 1024  # KiB before fio 2.21
    runtime = _int(d, "runtime", where)
    iops = _rate(d, "iops", where)
    if "total_ios" not in d and release is not None and release < _TOTAL_IOS:
        total_ios = round(iops * runtime / 1000)  # fio < 2.1.14: iops = 1000 × ios / runtime
    else:
        total_ios = _int(d, "total_ios", where)
    if "bw_bytes" in d:  # fio >= 3.3
        bw_bytes = _rate(d, "bw_bytes", where)
    elif "bw" in d:
        bw_bytes = _rate(d, "bw", where) * 1024.0  # KiB/s
    else:
        bw_bytes = io_bytes * 1000.0 / runtime if runtime > 0 else 0.0

    lat_obj, lat_scale = _lat_object(d, "lat", where)
    clat_obj, clat_scale = _lat_object(d, "clat", where)
    if total_ios == 0:
        return DirectionStats(io_bytes=io_bytes, total_ios=0, runtime_ms=runtime, iops=iops,
                              bw_bytes=bw_bytes, lat=None, clat=None)

    lat_pct = _percentiles(lat_obj, lat_scale, f"{where} lat")
    clat_pct = _percentiles(clat_obj, clat_scale, f"{where} clat")
    lat_bins = _bins(lat_obj, lat_scale, f"{where} lat")
    clat_bins = _bins(clat_obj, clat_scale, f"{where} clat")
    if lat_pct is None and clat_pct is not None and _wants_lat_percentiles(options):
        # fio < 3.13 wrote total-latency percentiles (and their bins) under clat.
        lat_pct, clat_pct = clat_pct, None
        lat_bins, clat_bins = clat_bins, None

    if lat_pct is not None:
        source, bins = "lat", lat_bins
    elif clat_pct is not None:
        source, bins = "clat", clat_bins
    else:
        source, bins = None, lat_bins if lat_bins is not None else clat_bins
    lat = _latency(lat_obj, lat_scale, lat_pct, lat_bins, f"{where} lat")
    clat = _latency(clat_obj, clat_scale, clat_pct, clat_bins, f"{where} clat")
    return DirectionStats(io_bytes=io_bytes, total_ios=total_ios, runtime_ms=runtime, iops=iops,
                          bw_bytes=bw_bytes, lat=lat, clat=clat, percentile_source=source,
                          bins=bins)


def _lat_object(d: dict[str, Any], kind: str, where: str) -> tuple[dict[str, Any] | None, float]:
    """fio's ``<kind>_ns`` object (scale 1), or the µs ``<kind>`` of fio 2.x (scale 1000)."""
    for key, scale in ((f"{kind}_ns", 1.0), (kind, 1000.0)):
        if key in d:
            value = d[key]
            if not isinstance(value, dict):
                raise FioParseError(f"fio {where}: '{key}' is {type(value).__name__}, "
                                    "expected an object")
            return value, scale
    return None, 1.0


def _latency(obj: dict[str, Any] | None, scale: float, percentiles: Percentiles | None,
             bins: tuple[tuple[int, int], ...] | None, where: str) -> Latency | None:
    if obj is None:
        return None
    if "N" in obj:  # fio >= 3.20 counts samples
        if _int(obj, "N", where) == 0:
            return None
    elif _float(obj, "max", where) == 0 and _float(obj, "mean", where) == 0:
        return None  # fio writes zeros for a latency it did not measure (e.g. disable_lat=1)
    return Latency(
        min_ns=_float(obj, "min", where) * scale,
        max_ns=_float(obj, "max", where) * scale,
        mean_ns=_float(obj, "mean", where) * scale,
        stdev_ns=_float(obj, "stddev", where) * scale,
        percentiles=percentiles or Percentiles(),
        bins=bins,
    )


def _percentiles(obj: dict[str, Any] | None, scale: float, where: str) -> Percentiles | None:
    """The five percentiles iomatrix keeps; None when fio wrote no (non-padding) percentile."""
    if obj is None:
        return None
    raw = obj.get("percentile")
    if not isinstance(raw, dict):
        return None
    found: dict[str, float] = {}
    any_real = False
    for key, value in raw.items():
        try:
            point = float(key)
        except ValueError:
            continue
        if point <= 0.0:  # fio < 3.5 pads the list with "0.00": 0
            continue
        any_real = True
        for target, field in _PERCENTILE_FIELDS.items():
            if math.isclose(point, target, rel_tol=0, abs_tol=1e-6):
                found[field] = _number(value, f"{where} percentile {key}") * scale
    if not any_real:
        return None
    return Percentiles(**found)


def _bins(obj: dict[str, Any] | None, scale: float, where: str) -> tuple[tuple[int, int], ...] | None:
    if obj is None or "bins" not in obj:
        return None
    raw = obj["bins"]
    if not isinstance(raw, dict):
        raise FioParseError(f"fio {where}: 'bins' is {type(raw).__name__}, expected an object")
    pairs = []
    for key, count in raw.items():
        if not re.fullmatch(r"[0-9]{1,18}", key):      # fio's bounds are 64-bit
            raise FioParseError(f"fio {where}: bin bound {_short(key)} is not an integer")
        pairs.append((round(int(key) * scale), _whole(count, f"{where} bin {key}")))
    return tuple(sorted(pairs))


def _wants_lat_percentiles(options: Mapping[str, Any]) -> bool:
    """Whether the job asked for total-latency percentiles (directly, or, before fio 3.18, by
    turning completion-latency percentiles off)."""
    lat = _bool_option(options.get("lat_percentiles"))
    clat = _bool_option(options.get("clat_percentiles"))
    return lat is True or clat is False


def _bool_option(value: Any) -> bool | None:
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return None


# --- small helpers ---------------------------------------------------------------------------------


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FioParseError(f"fio {where} is {_short(value)}, expected a number")
    try:
        return float(value)
    except OverflowError:
        raise FioParseError(f"fio {where} is {_short(value)}, beyond any number fio "
                            "writes") from None


def _float(obj: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    if key not in obj:
        if default is not None:
            return default
        raise FioParseError(f"fio {where}: missing '{key}' (keys: {_keys(obj)})")
    return _number(obj[key], f"{where} '{key}'")


def _rate(obj: Mapping[str, Any], key: str, where: str) -> float:
    """A direction's IOPS or bandwidth: a finite number (what is stored and compared)."""
    value = _float(obj, key, where)
    if not math.isfinite(value):
        raise FioParseError(f"fio {where} '{key}' is {value}: not a rate fio measured")
    return value


def _int(obj: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    if key not in obj:
        if default is not None:
            return default
        raise FioParseError(f"fio {where}: missing '{key}' (keys: {_keys(obj)})")
    return _whole(obj[key], f"{where} '{key}'")


def _whole(value: Any, where: str) -> int:
    number = _number(value, where)
    if not number.is_integer():
        raise FioParseError(f"fio {where} is {_short(value)}, expected an integer")
    if abs(number) > _LARGEST:
        raise FioParseError(f"fio {where} is {_short(value)}, larger than any count fio keeps "
                            "(64 bits)")
    return int(value)


def _keys(obj: Mapping[str, Any]) -> str:
    keys = list(obj)
    shown = ", ".join(str(k) for k in keys[:8])
    return shown + (", …" if len(keys) > 8 else "") if keys else "none"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _excerpt(text: str, pos: int, width: int = 60) -> str:
    """A one-line excerpt of ``text`` around ``pos``, quoted."""
    lo = max(0, pos - width // 3)
    piece = text[lo:lo + width]
    piece = " ".join(piece.split())  # one line, whitespace collapsed
    return repr(("…" if lo > 0 else "") + piece + ("…" if lo + width < len(text) else ""))
