"""What the store reads back is untrusted input (issue 31): a database may come from anyone (a
file handed over, a row in a shared PostgreSQL store that every host with the role writes), so
each value is read into the type iomatrix wrote it as, and a value that does not fit stops the
command in one line, ``database damaged: TABLE.COLUMN row N: why`` (``DamagedStore``, exit
status 8), never a traceback and never a guess.

Every JSON column of the schema (``iomatrix.store.schema``) is read through ``decode``, typed by
``COLUMNS``: a model that refuses keys it does not declare, or a map whose keys are on an
allow-list (the host's metadata, a configuration's axes) or of a name's shape (a fio option, a
QEMU property). The other columns are typed by the record they are read into (``typed``), and a
compressed blob (fio's output) is decompressed within a bound (``inflate``). Values that reach a
program (a node's SSH settings, an RBD connection) are typed here and checked again, by the
code that hands them over, as a suite's are."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, TypeAdapter, ValidationError

from iomatrix.cluster.ssh import Node
from iomatrix.core.errors import DamagedStore
from iomatrix.core.model import Frozen
from iomatrix.core.text import printable
from iomatrix.fio.logs import LOG_NAME
from iomatrix.fio.persecond import StallCheck
from iomatrix.store.records import CpuRecord, DepthRecord, SteadyRecord, TrialRecord
from iomatrix.suite.fields import NODE_AXIS, TARGET_AXIS
from iomatrix.vocab.axes import CONFIG_AXES
from iomatrix.suite.fiooptions import WORKLOAD_FIO_OPTIONS
from iomatrix.targets import registry
from iomatrix.targets.kind import Resource
from iomatrix.telemetry import irq
from iomatrix.suite.spec import RunSpec
from iomatrix.telemetry.host import HostSeries
from iomatrix.telemetry.steady import SteadyState


def damaged(table: str, column: str, row: object, reason: str = "") -> DamagedStore:
    """The one-line refusal of ``table.column`` of row ``row`` (its id, or its key)."""
    return DamagedStore(f"database damaged: {table}.{column} row {row}"
                        + (f": {reason}" if reason else ""))


def _short(value: object, limit: int = 40) -> str:
    text = printable(repr(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _allowed(keys: frozenset[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def check(value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - keys)
        if unknown:
            raise ValueError(f"unknown key {_short(unknown[0])}")
        return value
    return check


HOST_KEYS = frozenset({
    # telemetry.hostinfo.host_metadata
    "hostname", "kernel", "os", "cpu", "cores", "memory_bytes", "qemu", "qemu_storage_daemon",
    "fio", "accelerator", "iomatrix", "target", "target_fs", "target_mount", "target_device",
    "target_model", "machine", "zfs", "ceph",
    # targets.zfs: the dataset a run's zvols were made in, and the ZFS that made them
    "zfs_compression", "zfs_sync", "zfs_primarycache", "zfs_volblocksize", "zfs_version",
    # measure.runner, measure.cluster: several targets, a cluster's nodes; the target
    # device's IRQs and their affinity (telemetry.irq.report)
    "targets", "nodes", "target_irqs",
    # store.ingest: imported results
    "imported_from", "first_result", "last_result", "latency", "disks",
    # testing.synthetic: the trial order of a run made up for the tests
    "trial_order"})
"""The keys of a run's (and a node's) host metadata, as each writer of it names them."""

PARAM_KEYS = frozenset({*CONFIG_AXES, NODE_AXIS, TARGET_AXIS, "aa", "source", "clients"})
"""A configuration's axes (``Configuration.params``; an imported one's ``source`` and
``clients``)."""

OPTION_KEYS = frozenset({*WORKLOAD_FIO_OPTIONS, "ioengine", "direct", "rate", "fsync",
                         "fdatasync"})
"""A workload's fio options: those a suite may set (``WORKLOAD_FIO_OPTIONS``), and those an
imported result keeps of what fio ran (``iomatrix.store.ingest``)."""
Property = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]{1,200}$")]
"""A key QEMU (or iomatrix) names what it applied by: ``fmt0.cache.direct`` (a node name of
QEMU's own may start with ``#``), ``blockstats.rd_operations``, ``cluster.nodes``."""

HostMeta = Annotated[dict[str, str], AfterValidator(_allowed(HOST_KEYS))]
Params = Annotated[dict[str, str], AfterValidator(_allowed(PARAM_KEYS))]
Options = Annotated[dict[str, str], AfterValidator(_allowed(OPTION_KEYS))]
Applied = dict[Property, str]
Notes = tuple[str, ...]

STEADY_KEYS = frozenset({*SteadyState.model_fields, "checked", "source", "reason"})


def _steady(stored: Any) -> Any:
    """A trial's steady state as stored since schema v4 (``runs._stored_steady``): flat, the
    verdict's fields beside "checked" and "source" (or "checked": false and "reason"); {} for a
    failed trial. The first runs of schema v4 stored a verdict without "checked": a verdict
    means it was checked."""
    if not isinstance(stored, dict):
        return stored
    if not stored:
        return None
    _allowed(STEADY_KEYS)(stored)
    verdict = ({k: v for k, v in stored.items() if k in SteadyState.model_fields}
               if "reached" in stored else None)
    return {"checked": stored.get("checked", verdict is not None), "source": stored.get("source"),
            "reason": stored.get("reason"), "verdict": verdict}


def _none_if_empty(value: Any) -> Any:
    return None if value == {} else value


Steady = Annotated[SteadyRecord | None, BeforeValidator(_steady)]
Cpu = Annotated[CpuRecord | None, BeforeValidator(_none_if_empty)]
Depth = Annotated[DepthRecord | None, BeforeValidator(_none_if_empty)]
Telemetry = Annotated[HostSeries | None, BeforeValidator(_none_if_empty)]
Stall = Annotated[StallCheck | None, BeforeValidator(_none_if_empty)]
TrialLogs = dict[Annotated[str, Field(pattern=LOG_NAME)], str]

NODE_KEYS = frozenset(f.name for f in fields(Node))
_NODE = TypeAdapter(Node)


def _node_fields(value: dict[str, Any]) -> dict[str, Any]:
    _allowed(NODE_KEYS)(value)
    try:
        _NODE.validate_python(value)
    except ValidationError as exc:
        raise ValueError(_why(exc)) from None
    return value


StoredNode = Annotated[dict[str, Any], AfterValidator(_node_fields)]
"""How SSH reached a node of a cluster run: ``iomatrix.cluster.ssh.Node``'s fields, of their
types; ``--resume`` reads them as an inventory's (``iomatrix.cluster.ssh.stored_node``)."""


class PlanChoice(Frozen):
    """The trial length and rounds a pilot chose (``analysis.trialplan.Choice``, which says
    why), as a run stores them and a resumed run reads them back."""

    runtime: float = Field(gt=0, allow_inf_nan=False)
    rounds: int = Field(ge=1)
    seconds: float
    """Planned wall time of the R rounds."""
    half_width: float
    """Expected widest 95 % CI half-width (log units ≈ fraction) at that choice."""
    target: float
    optimum: float | None
    """The continuous optimum √(a·c/b) of the binding class, where drift > 0."""
    reached: bool
    """False: no T within bounds reaches the target in max rounds; the widest reachable."""
    fixed_runtime: bool = False
    fixed_rounds: bool = False


class StoredPlan(Frozen):
    """A run's trial plan (``trial_plans.plan_json``): the pilot's time, its noise per class
    (``analysis.trialplan.Noise``, shown only) and its choice."""

    pilot_seconds: float
    noise: tuple[dict[Annotated[str, Field(pattern=r"^[a-z_]{1,40}$")],
                      str | int | float | bool | None], ...] = ()
    choice: PlanChoice | None = None


COLUMNS: dict[tuple[str, str], Any] = {
    ("runs", "host_json"): HostMeta,
    ("runs", "notes_json"): Notes,
    ("configurations", "params_json"): Params,
    ("workloads", "options_json"): Options,
    ("trials", "applied_json"): Applied,
    ("trials", "steady_json"): Steady,
    ("trials", "cpu_json"): Cpu,
    ("trials", "depth_json"): Depth,
    ("trials", "logs_json"): TrialLogs,
    ("trials", "telemetry_json"): Telemetry,
    ("trials", "stall_json"): Stall,
    ("trial_history", "trial_json"): TrialRecord,
    ("trial_history", "telemetry_json"): Telemetry,
    ("trial_plans", "plan_json"): StoredPlan,
    ("run_nodes", "node_json"): StoredNode,
    ("run_nodes", "host_json"): HostMeta,
    ("runs", "spec_json"): RunSpec,
}
"""Every JSON column of the schema, and the type its value is read as."""
NULLABLE = frozenset({("runs", "spec_json")})
"""JSON columns that may be NULL: none stored yet (a run made before the column)."""

_ADAPTERS = {key: TypeAdapter(kind) for key, kind in COLUMNS.items()}


def decode(table: str, column: str, row: object, text: Any) -> Any:
    """The value of JSON column ``table.column`` of row ``row``, typed by ``COLUMNS``;
    ``DamagedStore`` when it is not JSON or not of that type."""
    if isinstance(text, (bytes, memoryview)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise damaged(table, column, row, f"not JSON text but {type(text).__name__}")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise damaged(table, column, row, f"not JSON ({type(exc).__name__})") from None
    try:
        return _ADAPTERS[table, column].validate_python(value)
    except ValidationError as exc:
        raise damaged(table, column, row, _why(exc)) from None
    except RecursionError:
        raise damaged(table, column, row, "nested too deeply") from None


RESOURCES: dict[str, Resource] = {**registry.RESOURCES, irq.KIND: irq.RESOURCE}
"""Record kind → how ``iomatrix.measure.reclaim`` removes, or puts back, what a killed run left
besides directories: what a target kind makes on its storage (``iomatrix.targets.registry``),
and an IRQ a run steered (``iomatrix.telemetry.irq``)."""
KINDS = ("scratch", "workspace", "parent", *RESOURCES)
"""What a process records making or changing (``iomatrix.measure.reclaim``)."""

_WITHIN = {kind: TypeAdapter(Annotated[dict[str, str | float | bool | list[str] | None],
                                       AfterValidator(_allowed(resource.within_keys))])
           for kind, resource in RESOURCES.items()}
"""A kind's resource: its connection's keys (``Resource.within_keys``)."""


def within(kind: Any, row: object, text: Any) -> str:
    """``resources.within`` of a resource of ``kind`` (``KINDS``): the absolute path of the
    directory it was made in, or for what a target kind makes on its storage (an RBD image) the
    connection it recorded (a JSON object of its keys, ``Resource.within_keys``, which the kind
    checks again before it reaches the storage: ``rbd.stored_location`` as a suite's [target]
    rbd)."""
    if kind not in KINDS:
        raise damaged("resources", "kind", row, f"not one of {', '.join(KINDS)}")
    if not isinstance(text, str) or "\0" in text:
        raise damaged("resources", "within", row, "not a path")
    if kind not in RESOURCES:
        if not text.startswith("/"):
            raise damaged("resources", "within", row, "not an absolute path")
        return text
    longest = RESOURCES[kind].within_max
    if len(text) > longest:
        raise damaged("resources", "within", row, f"longer than {longest} characters")
    try:
        _WITHIN[kind].validate_json(text)
    except ValidationError as exc:
        raise damaged("resources", "within", row, _why(exc)) from None
    return text


M = TypeVar("M", bound=BaseModel)


def typed(model: type[M], table: str, row: object, columns: Mapping[str, str] | None = None,
          **values: Any) -> M:
    """``model(**values)`` read from a row of ``table``; ``DamagedStore`` naming the column
    (``columns`` maps a field to its column where their names differ) that does not fit."""
    try:
        return model(**values)
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        field = str(loc[0]) if loc else "?"
        raise damaged(table, (columns or {}).get(field, field), row, _why(exc)) from None


def _why(exc: ValidationError) -> str:
    """The first problem pydantic found (an unknown key before any other), short and on one
    line, with where in the value it is."""
    errors = exc.errors()
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    if error["type"] == "extra_forbidden":
        return f"unknown key {_short(error['loc'][-1])}"
    if error["loc"][-1:] == ("[key]",):
        return f"bad key {_short(error['loc'][-2])}: {error['msg']}"
    message = error["msg"].removeprefix("Value error, ")
    where = printable(".".join(str(p) for p in error["loc"]))
    where = where if len(where) <= 60 else where[:57] + "..."
    return f"{where}: {message}" if where else message


MAX_INFLATED = 256 << 20
"""The most fio's stored output may grow to when decompressed (256 MiB; a trial's is some
kilobytes): a few kilobytes of crafted blob must not take the memory of the host that reads
it."""


def inflate(table: str, column: str, row: object, blob: Any) -> str | None:
    """A column of fio's output compressed (zlib: ``trials.fio_json``,
    ``trial_history.fio_json``) as text; None for none."""
    if blob is None:
        return None
    if not isinstance(blob, (bytes, memoryview)):
        raise damaged(table, column, row, f"not compressed data but {type(blob).__name__}")
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(bytes(blob), MAX_INFLATED)
        if inflater.unconsumed_tail:
            raise damaged(table, column, row, f"more than {MAX_INFLATED >> 20} MiB decompressed")
        return data.decode()
    except (zlib.error, UnicodeDecodeError) as exc:
        raise damaged(table, column, row, f"not zlib-compressed UTF-8 ({exc})") from None


def check_row(table: str, row: Mapping[str, Any], key: object) -> None:
    """Every JSON column of one row of ``table`` (as ``SELECT *`` read it) read as ``decode``
    reads it: what a copy of a run carries into another store (``Store.copy_run``) is checked
    as what is read from it. (fio's compressed output is checked when it is read, ``inflate``:
    decompressing every trial's would double a large copy's time.)"""
    for (t, column) in COLUMNS:
        if t == table and column in row and not (row[column] is None
                                                 and (t, column) in NULLABLE):
            decode(table, column, key, row[column])
