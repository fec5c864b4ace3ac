"""Exit codes: a contract with scripts that call iomatrix. Documented in the README and --help."""

from __future__ import annotations

from enum import IntEnum

from iomatrix.core import errors


class ExitStatus(IntEnum):
    OK = 0
    ERROR = 1                 # an unexpected error (rerun with --traceback)
    USAGE = 2                 # bad command line
    SUITE_INVALID = 3         # the suite file is malformed or asks for invalid combinations
    ENVIRONMENT = 4           # a tool or kernel feature is missing (see `iomatrix doctor`)
    TARGET = 5                # the target is unsafe, unusable or too small
    TRIALS_FAILED = 6         # the run finished but some trials failed (they are stored)
    NOT_FOUND = 7             # no such run
    STORE = 8                 # the results database cannot be used
    BUSY = 9                  # another live process is measuring that run
    UNREACHABLE = 10          # network storage did not answer, refused the credentials, or lacks the pool/LUN
    NODES = 11                # a cluster node is unreachable, unlike the controller, or ended with an error (one line per node)
    INTERRUPTED = 130         # Ctrl-C; what was measured is stored and the run marked interrupted


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
