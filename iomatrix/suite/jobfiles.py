"""fio job files as workloads: ``[[workloads]] jobfile = "read-rand-bs4096-qd32.fio"``.

Every refusal ends by saying whether it is ``SAFETY`` (the line could reach beyond the target as
root: a file, a command, root's environment, an option not known to be harmless) or ``SCOPE``
(outside what iomatrix measures: another engine, buffered I/O, jobs run together, a line fio
would read otherwise than it looks): ``JobFileError.kind``.

Studies publish their workloads as fio job files (seed 000 names its 56 that way, each a
``[global]`` section and one job on ``/dev/sdb``). A [[workloads]] table that names a job file
measures its jobs: each job section, with the ``[global]`` sections before it merged in as fio
merges them, becomes one workload (rw, bs, iodepth, numjobs, rate_iops and the extra options a
[[workloads]] table may set). What the file says that iomatrix decides itself (the file or
device, the run time, the engine, buffered I/O) is replaced and noted in the run's notes and in
``iomatrix run --plan``; what iomatrix cannot honour is refused when the suite loads, in one
line naming the job file, its line, the option and the reason. A refusal that says what fio
does is true of fio 3.33 and 3.39 (tests/fio/test_jobfile_workloads.py loads every job file of
fio's examples/ and asks ``fio --parse-only`` about each such refusal).

**Where the file may be.** Its name is relative to the suite file's directory and must stay
within it: an absolute path, a ``..`` component, or a symbolic link that leads out is refused
(the path is checked again on the open file, through /proc/self/fd, so a link swapped in
between does not escape either). It must be a regular file of at most 256 KiB of UTF-8. A
built-in suite, or a suite given as text, has no directory to read from.

**Stored with the run.** The loader keeps every job file's text, byte for byte, in the suite's
``[jobfiles]`` table (job file name → text), appended to the suite text a run stores; so
``--resume``, ``iomatrix export RUN --format suite`` and every later reader have the job files
without the files. A suite that has a ``[jobfiles]`` table reads nothing from disk: each job file
it names must be in it (a suite may carry its job files so itself).

**Syntax, as fio reads a job file** (init.c ``__parse_jobs_ini``, parse.c): a line whose first
non-blank character is ``;`` or ``#`` is a comment; elsewhere a ``;`` or ``#`` ends the line
(``bs=4k ; comment``), so settings written after one (``stonewall;rw=read;bs=1M``) are not read,
and a note says so; ``[name]`` starts a job (fio takes all but the last character after ``[``
as its name, so ``[a] stonewall`` is refused: it names a job "a] stonewal"), and a section
whose name begins with ``global`` sets defaults for the jobs after it; ``key=value`` or a bare
``key``; blanks before ``=`` are dropped. Option names are case-sensitive. Refused because fio
itself would not read the line as it looks: a blank after ``=`` (fio keeps it in the value: it
refuses ``rw = randread`` and reads ``bs = 4k`` as 4 bytes), a bare option fio requires a value
for (``direct``: fio says "Option direct requires an argument"; fio's flag options, BARE_FLAGS,
may stand alone; a bare option iomatrix does not take is refused for what it is), an option
before the first section, the same option twice in one section, a fraction as a number (fio
reads ``bs=1.5k`` as 1 byte). Sizes are read as fio reads them with its default
``kb_base=1024`` (iomatrix.core.units.fio_size): ``4k``, ``4kb``, ``4K`` and ``4096`` are 4096
bytes, ``0x1000`` too, and ``4KiB`` is 4000 (fio swaps the IEC prefixes), which is then refused
as no multiple of 512.

**One job at a time.** iomatrix measures one workload at a time, so a file's jobs must be ones
fio runs one after the other. fio (backend.c ``run_threads``) starts a job with ``stonewall``
once every job before it has finished, and starts no later job before it; a job with
``wait_for=NAME`` once the job fio calls NAME (its section's ``name=``, else the section name)
has finished, and meanwhile starts the jobs after it. A pair of jobs neither rule keeps apart is
refused, naming both; so is a job whose ``startdelay`` a later ``stonewall`` does not wait for.

**Options** (aliases as fio has them):

=================================  ===========================================================
option                             what iomatrix does with it
=================================  ===========================================================
rw, readwrite                      the workload's rw: read, write, randread, randwrite, rw
                                   (readwrite is rw), randrw; fio's default is read. Trim
                                   patterns and an ``rw=randread:8`` offset modifier are refused
bs, blocksize                      the workload's bs: one size, a multiple of 512 (fio's default
                                   4k); ``bs=4k,8k`` (sizes per direction) is refused
iodepth, numjobs, rate_iops        the workload's: whole numbers; ``rate_iops=500,100`` refused
rwmixread, rwmixwrite, and every   the workload's fio options, checked as a [[workloads]]
option on WORKLOAD_FIO_OPTIONS     table's ``options`` are (suite.fiooptions.fio_option_problem);
                                   a ``bssplit`` or ``bsrange`` labels the workload by its split
ioengine                           must be the suite's [method] engine: iomatrix runs every
                                   workload with one engine (and fio's nbd engine on NBD
                                   exports, libaio in guests: noted where the suite has those
                                   modes); another is refused, with how to choose it
direct=1, buffered=0               accepted: iomatrix measures direct I/O only; direct=0 and
                                   buffered=1 are refused. A job with neither is measured with
                                   direct=1 and noted: fio's default is buffered I/O, but a job
                                   file that does not say so is most often a workload's shape
                                   (rw, bs, depth) written without thought of the page cache,
                                   and direct I/O is what iomatrix compares disk settings with
filename, directory                replaced by the run's target (noted): iomatrix never opens a
                                   file or device a job file names
size                               replaced by the images iomatrix creates ([target] size; noted)
runtime, timeout, ramp_time,       replaced by [method] runtime and ramp (noted): the method
time_based                         decides how long every trial runs, repeats, steady state
name, description,                 not used (noted): iomatrix names its jobs and sets its own
group_reporting, lat_percentiles,  reporting options (``name=`` still names the job for
percentile_list, gtod_reduce       ``wait_for``, as in fio; gtod_reduce would turn off the
                                   latencies iomatrix reports)
stonewall, wait_for_previous,      the order of the jobs (above); new_group only groups fio's
wait_for, new_group                report
write_lat_log, write_bw_log,       the workload's, its path never used (a file root's fio would
write_iops_log, log_avg_msec       create): the log is written into the trial's own directory,
                                   averaged over 250 ms, and stored with the run (noted;
                                   ``iomatrix.fio.logs``)
kb_base                            1024 (fio's default) only: the options iomatrix passes on keep
                                   their units and fio reads them with its default
include                            refused: it makes fio read another file
``${NAME}``                        the suite's [fio_vars] ``NAME``, written into the line before
                                   it is read (fio would read root's environment); a name the
                                   table lacks is refused
any other ``$``                    refused: fio expands ``$ncpus``, ``$mb_memory``, ``$jobnum``...
every other option                 refused with fio_option_problem's reason (exec_* runs a
                                   command, write_*_log and read_iolog name files, cgroup, ...)
=================================  ===========================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, get_args

from pydantic import ValidationError

from iomatrix.core.errors import SuiteError
from iomatrix.core.files import read_beside
from iomatrix.core.model import Frozen
from iomatrix.core.units import fio_size
from iomatrix.suite.fiooptions import (ENGINE_FIO_OPTIONS, FIO_VAR, LOG_OPTIONS, SAFETY, SCOPE,
                                      WORKLOAD_FIO_OPTIONS, fio_option_problem, refusal_kind)
from iomatrix.suite.method import Method
from iomatrix.suite.model import Suite
from iomatrix.suite.workloads import Workload, WorkloadGroup
from iomatrix.vocab.words import Mode

MAX_BYTES = 256 * 1024
"""The largest job file read (seed 000's are 150 bytes)."""
TABLE = "jobfiles"
"""The suite table that carries job files: name → text."""
BARE_FLAGS = frozenset({"bs_unaligned", "blocksize_unaligned", "norandommap", "time_based",
                        "stonewall", "wait_for_previous", "new_group", "thread",
                        "group_reporting", "zero_buffers", "refill_buffers", "verify_only",
                        "exitall", "exitall_on_error"})
"""fio's options of type "empty or boolean value" (FIO_OPT_STR_SET; ``fio --cmdhelp=NAME``)
that iomatrix takes without ``=value`` (tests/fio/test_jobfile_workloads.py asks fio)."""

ENGINES: tuple[str, ...] = get_args(Method.model_fields["engine"].annotation)
"""[method] engine's choices."""
ALIASES = {"readwrite": "rw", "blocksize": "bs", "timeout": "runtime",
           "wait_for_previous": "stonewall"}
RW = {"read": "read", "write": "write", "randread": "randread", "randwrite": "randwrite",
      "rw": "rw", "readwrite": "rw", "randrw": "randrw"}
"""fio's rw values iomatrix measures → the name iomatrix stores (readwrite is fio's alias of rw)."""
FIELDS = ("rw", "bs", "iodepth", "numjobs", "rate_iops")
"""Options that are the workload's own fields (by canonical name)."""
REPLACED = {
    "filename": "the run's target",
    "directory": "the run's target",
    "size": "the images iomatrix creates ([target] size)",
    "runtime": "[method] runtime and ramp", "ramp_time": "[method] runtime and ramp",
    "time_based": "[method] runtime and ramp",
}
"""Options whose job is iomatrix's: replaced, and the run's notes say by what."""
NOT_USED = ("name", "description", "group_reporting", "lat_percentiles", "percentile_list",
            "new_group", "gtod_reduce")
"""Options that only name or report jobs: iomatrix names its own and sets its own reporting
(gtod_reduce would turn off the latencies it reports)."""
ORDER = ("stonewall", "wait_for")
"""Options that order the jobs (checked across the file, not passed on)."""
TAKES_VALUE = frozenset({*FIELDS, *REPLACED, *NOT_USED, *ORDER, "ioengine", "direct",
                         "buffered", "kb_base", *WORKLOAD_FIO_OPTIONS}
                        - BARE_FLAGS - ENGINE_FIO_OPTIONS - LOG_OPTIONS
                        - {"buffer_pattern", "numa_cpu_nodes"})
"""Options iomatrix reads whose bare name fio refuses (canonical names; fio's engine options
are known to fio only beside their engine, fio 3.33 crashes on a bare buffer_pattern and takes
a bare numa_cpu_nodes or write_*_log)."""
LOGGED = "a log in the trial's own directory, stored with the run"
"""What replaces a job file's log path (``iomatrix.fio.logs``)."""
FIO_SAYS = ("direct", "buffered", "bs", "iodepth", "numjobs", "rate_iops")
"""Those whose bare name fio refuses with "Option NAME requires an argument", quoted."""
_KEY = re.compile(r"[a-z][a-z0-9_]*")
_SETTING = re.compile(r"(?:^|[\s;#])[a-z][a-z0-9_]*=\S")
"""A setting in comment text (``rw=read``), which fio does not read."""
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]|\r(?![\r\t ]*$)")
"""Control characters and line separators but tab, a CR among a line's last blanks (fio strips
it: CRLF files) and the line break: none belongs in a job file, fio reads a CR or U+2028 inside a
line as part of a value, and its names and values reach the terminal in notes and errors."""
_BLANKS = " \t\r\v\f"


class JobFileError(ValueError):
    """What is wrong with a job file, at which line (0: the file as a whole), and whether it is
    refused for safety or as outside what iomatrix measures (``kind``: SAFETY or SCOPE), which
    the message ends with."""

    def __init__(self, line: int, message: str, kind: str = SCOPE) -> None:
        super().__init__((f"line {line}: {message}" if line else message) + f" ({kind})")
        self.line = line
        self.kind = kind


class Option(Frozen):
    """One ``key=value`` line of a job file (value None: a bare flag)."""

    key: str
    value: str | None
    line: int

    @property
    def text(self) -> str:
        return self.key if self.value is None else f"{self.key}={self.value}"


class Job(Frozen):
    """One job section with the [global] options before it merged in, as fio runs it."""

    name: str
    line: int
    options: tuple[Option, ...]
    """The section's options after the globals' (by canonical name, the job's own win)."""
    called: str
    """The name fio gives the job, which wait_for names: the section's own ``name=``, else the
    section name (fio names a job after its section before it reads the section, so a
    ``name=`` in [global] names no job)."""

    def get(self, key: str) -> Option | None:
        return next((o for o in self.options if ALIASES.get(o.key, o.key) == key), None)

    def on(self, key: str) -> bool:
        """Whether a flag option (stonewall...) is set: bare or =1."""
        option = self.get(key)
        return option is not None and option.value != "0"


class JobFile(Frozen):
    """A job file as fio reads it: its jobs, and the settings it holds in comments."""

    jobs: tuple[Job, ...]
    commented: tuple[tuple[int, str], ...] = ()
    """(line, comment) where a comment after other text holds settings (``stonewall;rw=read``
    gives ``;rw=read``): fio reads none of them."""


class JobWorkload(Frozen):
    """A job as iomatrix measures it, and what of the job file it did not use."""

    job: str
    group: WorkloadGroup
    replaced: tuple[tuple[str, str], ...] = ()
    """(option text, what replaced it)."""
    unused: tuple[str, ...] = ()
    engine: str | None = None
    """The ioengine the job named (the run's [method] engine)."""
    buffered: bool = False
    """The job says neither direct= nor buffered=: fio would run it buffered, iomatrix direct."""


# -- reading ----------------------------------------------------------------------------------

def parse(text: str, variables: Mapping[str, str] | None = None) -> tuple[Job, ...]:
    """A job file's jobs, [global] merged in; raises JobFileError for anything fio would read
    otherwise than it looks, or that cannot be a workload."""
    return read(text, variables).jobs


def read(text: str, variables: Mapping[str, str] | None = None) -> JobFile:
    """A job file's jobs and commented-out settings, each ``${NAME}`` written as ``variables``
    (the suite's [fio_vars]) has it; raises JobFileError as ``parse``."""
    sections: list[tuple[str, int, dict[str, Option]]] = []
    commented: list[tuple[int, str]] = []
    for number, raw in enumerate(text.split("\n"), 1):
        if _CONTROL.search(raw):
            raise JobFileError(number, "a control character or line separator (not text fio "
                                       "reads as it looks)", SAFETY)
        line = raw.strip(_BLANKS)
        if not line or line[0] in ";#":
            continue
        cut = re.search(r"[;#]", line)
        if cut:
            if _SETTING.search(line[cut.start():]):
                commented.append((number, line[cut.start():]))
            line = line[:cut.start()].rstrip(_BLANKS)
        if line.startswith("["):
            if len(line) < 3:
                raise JobFileError(number, f"{line!r} is not a [section] header")
            if not line.endswith("]"):
                raise JobFileError(number, f"{line!r}: fio names the job after all but the last "
                                           f"character after '[' ({line[1:-1]!r}) and reads "
                                           "nothing else on the line; write [name] alone on it")
            sections.append((line[1:-1], number, {}))
            continue
        if line.startswith("include"):
            raise JobFileError(number, f"{line!r}: include makes fio read another file; put its "
                                       "options in this job file", SAFETY)
        if "$" in line:
            line = _expanded(line, number, variables or {})
        option = _option(line, number)
        if not sections:
            raise JobFileError(number, f"{option.text!r} comes before any [section] (fio "
                                       "refuses it too)")
        own = sections[-1][2]
        canonical = ALIASES.get(option.key, option.key)
        if canonical in own:
            raise JobFileError(number, f"{option.key} is set twice in [{sections[-1][0]}] "
                                       f"(line {own[canonical].line} too)")
        own[canonical] = option
    jobs: list[Job] = []
    defaults: dict[str, Option] = {}
    for name, number, own in sections:
        if name.startswith("global"):          # fio: any section whose name begins so
            defaults.update(own)
        else:
            called = own["name"].value if "name" in own and own["name"].value else name
            jobs.append(Job(name=name, line=number, called=called,
                            options=tuple({**defaults, **own}.values())))
    if not jobs:
        raise JobFileError(0, "no job section (only [global], or nothing at all)")
    return JobFile(jobs=tuple(jobs), commented=tuple(commented))


def _expanded(line: str, number: int, variables: Mapping[str, str]) -> str:
    """``line`` with each ``${NAME}`` written as the suite's [fio_vars] table has it; raises
    JobFileError for a name the table lacks and for any other ``$``: fio would expand them from
    root's environment or from this host ($ncpus, $mb_memory, $jobnum...)."""
    def value(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in variables:
            raise JobFileError(number, f"{line!r}: ${{{name}}} is not in the suite's [fio_vars] "
                                       "table, and fio would read it from root's environment; "
                                       f"define it there ({name} = \"VALUE\")", SAFETY)
        return variables[name]
    done = re.sub(rf"\$\{{({FIO_VAR})\}}", value, line)
    if "$" in done:
        raise JobFileError(number, f"{line!r}: fio expands '$' ($ncpus, $mb_memory, $jobnum...) "
                                   "to what this host or job has, and ${VAR} from root's "
                                   "environment; write the value, or ${NAME} with NAME in the "
                                   "suite's [fio_vars] table", SAFETY)
    return done


def _option(line: str, number: int) -> Option:
    key, equals, value = line.partition("=")
    key = key.rstrip(" \t")
    if not _KEY.fullmatch(key):
        raise JobFileError(number, f"{key!r} is not a fio option name (fio's names are "
                                   "lower-case letters, digits and _)")
    if not equals:
        return Option(key=key, value=None, line=number)
    if value != value.lstrip(" \t"):
        raise JobFileError(number, f"{line!r}: a blank after '=' stays in fio's value (fio "
                                   "refuses 'rw = randread' and reads 'bs = 4k' as 4 bytes); "
                                   f"write {key}={value.strip()}")
    if not value:
        raise JobFileError(number, f"{key}= has no value")
    return Option(key=key, value=value, line=number)


# -- jobs as workloads ------------------------------------------------------------------------

def workload(job: Job, *, engine: str) -> JobWorkload:
    """What iomatrix measures for ``job`` with the suite's [method] ``engine``."""
    fields: dict[str, Any] = {"rw": "read", "bs": 4096, "iodepth": 1, "numjobs": 1,
                              "rate_iops": 0}
    options: dict[str, str] = {}
    replaced: list[tuple[str, str]] = []
    unused: list[str] = []
    where: dict[str, Option] = {}
    named_engine = None
    for option in job.options:
        key = ALIASES.get(option.key, option.key)
        value = option.value
        if value is None and key not in BARE_FLAGS | LOG_OPTIONS:
            raise JobFileError(option.line, f"[{job.name}] {_bare(option.key)}",
                               _bare_kind(option.key))
        try:
            if key in FIELDS:
                fields[key] = _field(key, value or "")
                where[key] = option
            elif key in REPLACED:
                replaced.append((option.text, REPLACED[key]))
            elif key in NOT_USED:
                unused.append(option.key)
            elif key in LOG_OPTIONS:     # the path is never used: iomatrix names the log
                if value != "0":
                    options[key] = "1"
                    replaced.append((option.text, LOGGED))
            elif key == "log_avg_msec":
                replaced.append((option.text, f"{LOGGED}, averaged as iomatrix averages it"))
            elif key in ORDER:                             # checked in ``_one_at_a_time``
                if key == "stonewall" and value not in (None, "0", "1"):
                    raise ValueError("write stonewall, stonewall=1 or stonewall=0")
            elif key == "ioengine":
                _engine(value or "", engine)
                named_engine = value
            elif key == "direct" or key == "buffered":
                if value != ("1" if key == "direct" else "0"):
                    raise ValueError("iomatrix measures direct I/O only (direct=1, buffered=0); "
                                     "a benchmark through the host's page cache is not one of "
                                     "its workloads")
            elif key == "kb_base":
                if value != "1024":
                    raise ValueError("only fio's default, 1024, is honoured: iomatrix passes "
                                     "the job's sizes on to fio as written, where they would be "
                                     "read with kb_base=1024; write them for it (4k = 4096)")
            else:
                problem = fio_option_problem(option.key, "1" if value is None else value)
                if problem:
                    raise JobFileError(option.line, f"[{job.name}] {option.text}: {problem}",
                                       refusal_kind(option.key, value or "1"))
                options[option.key] = "1" if value is None else value
                where[option.key] = option
        except JobFileError:
            raise
        except ValueError as exc:
            raise JobFileError(option.line, f"[{job.name}] {option.text}: {exc}") from None
    try:
        group = WorkloadGroup(options=options, **fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "rw"
        culprit = where.get(field) or where.get(str(err["loc"][-1]))
        message = str(err["msg"]).removeprefix("Value error, ")
        raise JobFileError(culprit.line if culprit else job.line,
                           f"[{job.name}] {culprit.text if culprit else field}: {message}") from None
    return JobWorkload(job=job.name, group=group, replaced=tuple(replaced),
                       unused=tuple(unused), engine=named_engine,
                       buffered=job.get("direct") is None and job.get("buffered") is None)


def _bare(key: str) -> str:
    """Why a bare ``key`` (no ``=value``, not a flag iomatrix takes so) is refused."""
    canonical = ALIASES.get(key, key)
    if canonical in TAKES_VALUE:
        says = f' ("Option {key} requires an argument")' if key in FIO_SAYS else ""
        return f"{key} without a value: fio refuses it too{says}; write {key}=VALUE"
    problem = None if key in WORKLOAD_FIO_OPTIONS else fio_option_problem(key, "1")
    return f"{key}: {problem}" if problem else (f"{key} without a value: iomatrix passes it to "
                                                f"fio only with one; write {key}=VALUE")


def _bare_kind(key: str) -> str:
    """``_bare``'s refusal as SAFETY or SCOPE."""
    if ALIASES.get(key, key) in TAKES_VALUE or key in WORKLOAD_FIO_OPTIONS:
        return SCOPE
    return refusal_kind(key, "1") if fio_option_problem(key, "1") else SCOPE


def _field(key: str, value: str) -> str | int:
    if key == "rw":
        if value not in RW:
            if ":" in value:
                raise ValueError("an offset modifier (rw=...:N) is not something iomatrix "
                                 "measures; write the pattern alone")
            raise ValueError("iomatrix measures " + ", ".join(RW) + " (trim patterns and "
                             "others are not among its workloads)")
        return RW[value]
    if key == "bs":
        if "," in value or ":" in value:
            raise ValueError("a workload has one block size for reads and writes; for a mix of "
                             "sizes use bssplit")
        return fio_size(value)
    if "," in value:
        raise ValueError("a workload has one value for reads and writes")
    if not re.fullmatch(r"[0-9]{1,10}", value):
        raise ValueError("write a whole number")
    return int(value)


def _engine(value: str, engine: str) -> None:
    if value == engine:
        return
    how = (f'set [method] engine = "{value}"' if value in ENGINES else
           f"iomatrix offers {', '.join(ENGINES)}: drop ioengine from the job file")
    raise ValueError(f'the run\'s engine is [method] engine = "{engine}", one for every '
                     f"workload; {how}")


def _one_at_a_time(jobs: tuple[Job, ...]) -> None:
    """Raises JobFileError naming two jobs fio may run at the same time, or a wait_for fio
    refuses or iomatrix cannot follow (module docstring; fio's backend.c ``run_threads``)."""
    finished: list[set[int]] = []    # per job: the jobs fio has finished when it starts
    late: list[bool] = []            # per job: may start after a later stonewall job starts
    wall: int | None = None          # the last stonewall job: no later job starts before it
    for j, job in enumerate(jobs):
        before = set(finished[wall]) if wall is not None else set()
        waitee = _waitee(jobs, j)
        if waitee is not None:
            before |= {waitee, *finished[waitee]}
        if job.on("stonewall") and j:
            before |= {i for i in range(j) if not late[i]}
            wall = j
        finished.append(before)
        late.append(_delayed(job) or (waitee is not None and late[waitee]))
        earlier = next((i for i in range(j) if i not in before), None)
        if earlier is None:
            continue
        if late[earlier] and wall is not None and earlier < wall:
            why = (f"[{jobs[earlier].name}] has startdelay, and fio starts a stonewall job "
                   "without waiting for a job still in its delay")
        elif waitee is not None:
            why = f"no stonewall, and its wait_for waits for [{jobs[waitee].name}] only"
        else:
            why = "no stonewall"
        raise JobFileError(job.line, f"[{job.name}] runs at the same time as "
                                     f"[{jobs[earlier].name}] in fio ({why}): iomatrix measures "
                                     "one workload at a time; put stonewall in each job after "
                                     "the first (fio then runs them one after the other too), "
                                     "or give each job a file of its own")


def _waitee(jobs: tuple[Job, ...], j: int) -> int | None:
    """The job ``jobs[j]`` waits for (wait_for=NAME), or None; raises JobFileError where fio
    refuses to run it (init.c ``wait_for_ok``, which ``--parse-only`` skips) or waits otherwise
    than for that one job."""
    job = jobs[j]
    option = job.get("wait_for")
    if option is None or option.value is None:
        return None
    name = option.value
    where = f"[{job.name}] {option.text}"
    if name == job.name:
        raise JobFileError(option.line, f"{where}: a job cannot wait for itself")
    earlier = [k for k in range(j) if jobs[k].called == name]
    count = len(earlier) + (job.called == name)
    if count != 1:
        raise JobFileError(option.line, f"{where}: " + (
            f"no job before [{job.name}] is called {name} (a job's name= or section name)"
            if not count else f"{count} jobs up to [{job.name}] are called {name}; wait_for "
                              "must name one"))
    if not earlier:
        raise JobFileError(option.line, f"{where}: its own name= is {name}, so fio would not "
                                         "wait at all; name the job it should wait for")
    later = next((m for m in range(j + 1, len(jobs)) if jobs[m].called == name), None)
    if later is not None:
        raise JobFileError(option.line, f"{where}: [{jobs[later].name}] after it is called "
                                         f"{name} too, and fio waits for every job so called; "
                                         "give the jobs names of their own")
    return earlier[0]


def _delayed(job: Job) -> bool:
    delay = job.get("startdelay")
    return delay is not None and delay.value != "0"


def workloads(text: str, *, engine: str, variables: Mapping[str, str] | None = None,
              ) -> tuple[tuple[JobWorkload, ...], tuple[str, ...]]:
    """Every job of job file ``text`` as a workload (its ``${NAME}`` from ``variables``, the
    suite's [fio_vars]), and what the file itself needs said: the settings its comments hold,
    jobs that are one workload. Raises JobFileError."""
    jobfile = read(text, variables)
    measured = tuple(workload(job, engine=engine) for job in jobfile.jobs)
    _one_at_a_time(jobfile.jobs)
    notes = []
    if jobfile.commented:
        (line, comment), more = jobfile.commented[0], len(jobfile.commented) - 1
        notes.append(f"line {line}: fio reads {comment!r} as a comment, so neither fio nor "
                     "iomatrix uses the settings in it" + (f" ({more} more lines like it)"
                                                            if more else "")
                     + "; put each option on a line of its own")
    alike: dict[str, list[str]] = {}
    for job in measured:
        alike.setdefault(_as_workload(job.group).key, []).append(job.job)
    for names in alike.values():
        if len(names) > 1:
            shown = f"[{names[0]}], [{names[1]}]" + (f" and {len(names) - 2} more"
                                                     if len(names) > 2 else "")
            label = next(_as_workload(j.group).label for j in measured if j.job == names[0])
            notes.append(f"{shown} are one workload ({label}): measured once")
    return measured, tuple(notes)


def _as_workload(group: WorkloadGroup) -> Workload:
    """The one workload a job's group holds."""
    return Workload(rw=group.rw[0], bs=group.bs[0], iodepth=group.iodepth[0],
                    numjobs=group.numjobs[0], rate_iops=group.rate_iops[0],
                    options=tuple(sorted(group.options.items())))


# -- a suite's job files ----------------------------------------------------------------------

def workload_groups(suite: Suite, *, where: str = "",
                    ) -> tuple[tuple[WorkloadGroup, ...], tuple[str, ...]]:
    """The suite's [[workloads]] tables with each jobfile table replaced by its jobs, and the
    notes saying what of the job files iomatrix replaced or did not use. Raises SuiteError
    naming the table (after ``where``: a scale), the job file, its line, the option and the
    reason."""
    groups: list[WorkloadGroup] = []
    said: dict[str, list[str]] = {}
    modes = {suite.method.mode, *(p.mode for p in suite.part)}
    for index, group in enumerate(suite.workloads):
        if group.jobfile is None:
            groups.append(group)
            continue
        table = (f"{suite.source_path}: {where}[[workloads]] #{index + 1} "
                 f"jobfile = {group.jobfile!r}")
        text = suite.jobfiles.get(group.jobfile)
        if text is None:
            raise SuiteError(f"{table}: not in the suite's [{TABLE}] table")
        try:
            jobs, own = workloads(text, engine=suite.method.engine, variables=suite.fio_vars)
        except JobFileError as exc:
            raise SuiteError(f"{table}: {exc}") from None
        for note in own:
            said.setdefault(note, []).append(group.jobfile)
        for job in jobs:
            groups.append(job.group)
            by_what: dict[str, list[str]] = {}
            for option, by in job.replaced:
                by_what.setdefault(by, []).append(option)
            for by, options in by_what.items():
                said.setdefault(f"{', '.join(options)} replaced by {by}", []).append(group.jobfile)
            if job.engine is not None and modes - {Mode.HOST}:
                said.setdefault(f"ioengine={job.engine} is [method] engine: fio's in host mode "
                                "and on FUSE exports; NBD exports (blocklayer, iothread off) use "
                                "fio's nbd engine, guests libaio", []).append(group.jobfile)
            if Mode.GUEST in modes and LOG_OPTIONS & set(job.group.options):
                said.setdefault("in guest mode the logs are not written: a remote fio's logs "
                                "would be written under names the guest chooses", []).append(
                                    group.jobfile)
            if job.unused:
                said.setdefault(f"{', '.join(job.unused)} not used (iomatrix names and reports "
                                "its jobs itself)", []).append(group.jobfile)
            if job.buffered:
                said.setdefault("no direct= (fio's default: buffered I/O, through the page "
                                "cache) replaced by direct=1: iomatrix measures direct I/O only",
                                []).append(group.jobfile)
    return tuple(groups), tuple(_note(what, files) for what, files in said.items())


def _note(what: str, files: list[str]) -> str:
    names = list(dict.fromkeys(files))
    if len(names) == 1:
        return f"job file {names[0]}: {what}"
    shown = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    return f"job files {shown}: {what}"


def carry(raw: dict[str, Any], *, source: str, directory: Path | None) -> dict[str, str]:
    """The job files a suite's raw tables name, read from ``directory`` (the suite file's), for
    ``load`` to carry in the suite ([jobfiles]); nothing when the suite carries them already
    (each it names must then be there) or names none. Raises SuiteError in one line."""
    names = _named(raw, source)
    carried = raw.get(TABLE)
    if carried is not None:
        if not isinstance(carried, dict) or not all(isinstance(v, str) for v in carried.values()):
            raise SuiteError(f"{source}: [{TABLE}]: a table of job file name = its text")
        sizes = {n: len(t.encode(errors="surrogatepass")) for n, t in carried.items()}
        large = next((n for n, size in sizes.items() if size > MAX_BYTES), None)
        if large is not None:     # as a file read from disk would be
            raise SuiteError(f"{source}: [{TABLE}] {large!r}: {sizes[large]} bytes; job files "
                             f"may have {MAX_BYTES // 1024} KiB at most ({SAFETY})")
        missing = next((n for n in names if n not in carried), None)
        if missing is not None:
            raise SuiteError(f"{source}: jobfile = {missing!r} is not in the suite's [{TABLE}] "
                             "table (a suite that carries its job files reads none from disk)")
        return {}
    read = {}
    for name in names:
        where = f"{source}: jobfile = {name!r}"
        if directory is None:
            kind = ("a built-in suite" if source.startswith("builtin:")
                    else "a suite given as text")
            raise SuiteError(f"{where}: {kind} has no directory to read job files from; put the "
                             f"suite in a file beside the job file, or carry it in a [{TABLE}] "
                             "table")
        try:
            read[name] = read_beside(directory, name, where, max_bytes=MAX_BYTES,
                                     what="job files")
        except SuiteError as exc:     # a link out, not a file, too large: never followed
            raise SuiteError(f"{exc} ({SAFETY})") from None
    return read


def _named(raw: Mapping[str, Any], source: str) -> list[str]:
    """The job files named by the suite's [[workloads]] and its scales', checked for shape."""
    lists = [raw.get("workloads")]
    scales = raw.get("scale")
    if isinstance(scales, dict):
        lists += [s.get("workloads") for s in scales.values() if isinstance(s, dict)]
    names: list[str] = []
    for tables in lists:
        # not a table or a list of them: the suite's validation says so
        for table in [tables] if isinstance(tables, dict) else \
                tables if isinstance(tables, list) else []:
            name = table.get("jobfile") if isinstance(table, dict) else None
            if name is None:
                continue
            problem = name_problem(name)
            if problem:
                raise SuiteError(f"{source}: jobfile = {name!r}: {problem} ({SAFETY})")
            if name not in names:
                names.append(name)
    return names


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a job file beside the suite file, or None."""
    if not isinstance(name, str) or not 0 < len(name) <= 255 \
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "write the job file's name relative to the suite file's directory, as text"
    path = PurePosixPath(name)
    if path.is_absolute():
        return ("an absolute path: a job file is named relative to the suite file's directory "
                "and must lie within it")
    if ".." in path.parts:
        return "'..' leads out of the suite file's directory, where job files must lie"
    return None
