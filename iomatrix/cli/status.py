"""Exit codes: a contract with scripts that call iomatrix. Documented in --help and on the
documentation site's exit status page, which is written from the comments in ``ExitStatus``."""

from __future__ import annotations

from enum import IntEnum

from iomatrix.core import errors


class ExitStatus(IntEnum):
    """What each code means: the comment beside each member, and the lines under it, are its
    documentation (docs/reference/exit-status.md is written from them)."""

    OK = 0                    # success
    ERROR = 1                 # an unexpected error (rerun with `--traceback`)
    USAGE = 2                 # bad command line, or an `--out`/`--report` where only a regular
    #                           file or a directory may be
    SUITE_INVALID = 3         # the suite is malformed or asks for a combination QEMU refuses
    ENVIRONMENT = 4           # a tool or kernel feature is missing (`iomatrix doctor` says which)
    TARGET = 5                # the target is unsafe, unusable or has too little free space
    TRIALS_FAILED = 6         # the run finished but some trials failed (they are stored, with
    #                           their reasons)
    NOT_FOUND = 7             # no such run
    STORE = 8                 # the results database cannot be used: written by a newer iomatrix,
    #                           or damaged (a row that does not fit: `database damaged:
    #                           TABLE.COLUMN row N: why`); with PostgreSQL also a refused login
    #                           (wrong password), a missing database, or a connection lost mid-run
    #                           (what was stored is kept; `run --resume` finishes it)
    BUSY = 9                  # the run is being measured by another live process (`--resume`
    #                           names its pid and since when)
    UNREACHABLE = 10          # network storage did not answer within its connect timeout, refused
    #                           the credentials, or has no such pool or LUN (nothing is stored)
    NODES = 11                # a cluster node cannot be used: SSH did not reach it or refused the
    #                           key, or it differs from the controller (iomatrix, fio, QEMU, KVM,
    #                           free space), or it ended with an error; one line per node, before
    #                           anything runs
    INTERRUPTED = 130         # interrupted (Ctrl-C, SIGTERM or SIGHUP): what was measured is
    #                           stored and the run is marked interrupted


def status_for(exc: errors.IomatrixError) -> ExitStatus:
    """The exit status of an error."""
    for kind, status in (
        (errors.SuiteError, ExitStatus.SUITE_INVALID),
        (errors.EnvironmentProblem, ExitStatus.ENVIRONMENT),
        (errors.TargetUnreachable, ExitStatus.UNREACHABLE),
        (errors.TargetError, ExitStatus.TARGET),
        (errors.RunNotFound, ExitStatus.NOT_FOUND),
        (errors.RunBusy, ExitStatus.BUSY),
        (errors.NodesError, ExitStatus.NODES),
        (errors.StoreError, ExitStatus.STORE),
        (errors.AnalysisError, ExitStatus.USAGE),
        (errors.NothingToImport, ExitStatus.USAGE),
        (errors.OutputRefused, ExitStatus.USAGE),
    ):
        if isinstance(exc, kind):
            return status
    return ExitStatus.ERROR


EPILOG = ("Exit status: " + ", ".join(f"{s.value} {s.name.lower().replace('_', ' ')}"
                                       for s in ExitStatus) + ".")
