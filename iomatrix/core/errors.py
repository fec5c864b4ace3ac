"""The exceptions iomatrix raises. Library code raises these; only ``iomatrix.cli`` turns them into
an exit code and one line on stderr.

    IomatrixError                  every error iomatrix raises on purpose
     ├── SuiteError                a suite file is malformed or asks for something invalid
     │    ├── UntrustedFile        input names a file another user could have chosen or written
     │    └── InvalidCombination   a configuration QEMU would refuse, with QEMU's reason
     ├── EnvironmentProblem        a tool or kernel feature is missing (see ``iomatrix doctor``)
     │    └── GuestFioUnavailable  the guests' static, patched fio cannot be built here
     │         └── FioSourceUnavailable  the apt archive serves no source for the installed fio
     ├── TargetError               the storage under test is unsafe or unusable
     │    ├── NotEnoughSpace       free space is below what the images need
     │    ├── UnsafeDirectory      another user controls a directory iomatrix would write in
     │    └── TargetUnreachable    network storage did not answer, refused the key, or lacks the pool
     ├── ToolFailed                an external command failed (carries argv, exit code, output)
     │    └── FioFailed            fio failed or printed no result
     ├── FioParseError             fio's output could not be parsed
     ├── TrialFailed               one trial failed; the run records it and goes on
     ├── StoreError                the results database is unusable
     │    ├── SchemaTooNew         the database was written by a newer iomatrix
     │    └── DamagedStore         a row holds what iomatrix never writes there
     ├── RunNotFound               no run has that id
     ├── RunBusy                   another live process is measuring that run
     ├── AnalysisError             an analysis asks for an axis, level or metric the run lacks
     ├── NothingToImport           a directory to import holds no fio result iomatrix can read
     ├── NodesError                cluster nodes cannot be used as named (inventory, SSH, preflight)
     └── OutputRefused             a file to write (--out, --report) cannot be written there
"""

from __future__ import annotations

from collections.abc import Sequence


class IomatrixError(Exception):
    """Base of every error iomatrix raises on purpose; ``hint`` says how to recover."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class SuiteError(IomatrixError):
    """A suite is malformed: names the file, the key and the bad value."""


class UntrustedFile(SuiteError):
    """A file named by untrusted input (a suite, an inventory, a database row, an image header)
    that another user could have chosen or written (``iomatrix.core.trust``)."""

    hint = ("name a file that only root (or you) can write, in directories only root (or you) "
            "can write to, or give it on the command line")


class InvalidCombination(SuiteError):
    """A configuration that QEMU refuses; the message carries QEMU's own reason."""


class EnvironmentProblem(IomatrixError):
    """A tool or kernel feature that iomatrix needs is missing or unusable."""

    hint = "run `iomatrix doctor` to see what is missing and what to install"


class GuestFioUnavailable(EnvironmentProblem):
    """The static, patched fio cannot be had here; the message says why (the appliance then
    carries the host's fio)."""


class FioSourceUnavailable(GuestFioUnavailable):
    """No apt source serves the installed fio's Debian source (the archive does not have it, or
    apt cannot reach it): a fact of this host's archive, not of the build."""


class TargetError(IomatrixError):
    """The storage under test cannot be used safely."""


class NotEnoughSpace(TargetError):
    """The target directory has less free space than the images need."""


class UnsafeDirectory(TargetError):
    """A directory on the way to where iomatrix writes is another user's, or writable by
    others (``iomatrix.core.dirs``): they could redirect what iomatrix writes there."""

    hint = ("use a directory that only root (or you) can write to, and whose parents are so "
            "too: remove the other user's directory, or make it root's and not writable by others")


class TargetUnreachable(TargetError):
    """Network storage (a Ceph cluster, an iSCSI portal) cannot be used as the suite names it:
    no answer within the connect timeout, credentials refused, no such pool or LUN. Raised
    before anything is created or stored."""


class ToolFailed(IomatrixError):
    """An external command failed; keeps argv, exit code and the tail of its output."""

    def __init__(self, message: str, *, argv: Sequence[str], returncode: int | None,
                 output: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output


class FioFailed(ToolFailed):
    """fio exited with an error or printed no JSON result."""


class FioParseError(IomatrixError):
    """fio's output is not the JSON iomatrix expects."""


class TrialFailed(IomatrixError):
    """One trial could not be measured; the run records the reason and continues."""


class StoreError(IomatrixError):
    """The results database cannot be used."""


class SchemaTooNew(StoreError):
    """The database schema is newer than this iomatrix understands."""

    hint = "upgrade iomatrix, or pass --db with another file"


class DamagedStore(StoreError):
    """A row of the results database that does not fit what iomatrix writes there (a crafted
    database, a row of a shared store someone changed): ``database damaged: TABLE.COLUMN row
    N: why``, in one line (``iomatrix.store.rows``)."""

    hint = ("iomatrix did not write that row: another program or person changed the "
            "database; copy the runs you trust into a new one (`iomatrix db copy SRC DST "
            "--run N`)")


class RunNotFound(IomatrixError):
    """No stored run matches the given id."""

    hint = "list the stored runs with `iomatrix runs`"


class RunBusy(IomatrixError):
    """The run is being measured by another process that still lives: one line naming it."""


class AnalysisError(IomatrixError):
    """An analysis asked of a run that it cannot answer: no such axis, level or metric."""


class NothingToImport(IomatrixError):
    """The directory given to import holds no fio result that iomatrix can read."""

    hint = "give the directory that holds fio's --output-format=json (or json+) files"


class NodesError(IomatrixError):
    """The nodes of a cluster run cannot be used: an inventory that does not parse, a node SSH
    does not reach or that refuses the key, or one unlike the controller (iomatrix, fio or QEMU
    version, KVM, free space). Raised before anything runs; the message has one line per node."""


class OutputRefused(IomatrixError):
    """Where a command was asked to write (``--out``, ``--report``) holds something that is not
    a regular file (a directory, FIFO, device...), has no directory, or cannot be written."""
