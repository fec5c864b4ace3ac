"""Issue 31 item 7: no input ends in a traceback. Every key of a suite, found by walking the
suite's models (``iomatrix.suite.model`` and its tables' modules beside it: [nodes], [guest],
[target] rbd and iscsi included), is given a NUL, a value of 1 MiB, bytes that are not UTF-8,
control and bidi characters, and values of every wrong TOML type, in an otherwise valid suite:
``load_suite`` returns a suite or raises iomatrix's one-line error, and ``iomatrix run SUITE
--plan`` prints a plan or one line with a documented exit status. ``iomatrix node ...`` (what a
cluster run starts over SSH) does the same with malformed requests on stdin.

Each test keeps going after a traceback, counts the cases and the tracebacks of its input kind
(``fuzz_count``: ``bench/attacks.py`` prints them), and fails at the end naming the first few.
The property tests of tests/attacks/test_untrusted_inputs.py (``test_any_*``) draw whole hostile
suites; these try every key with every kind of value."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import traceback
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import IomatrixError
from iomatrix.suite import load_suite
from iomatrix.suite.load import _INTERNAL as INTERNAL
from iomatrix.suite.model import Suite
from iomatrix.suite.scale import Scale
from tests.conftest import Fuzzed, cli_result
from tests.translate.test_translate import PVE_CONF
from tests.attacks.test_untrusted_inputs import DOCUMENTED, SEPARATORS

HUGE = "a" * (1 << 20)
VALUES: dict[str, dict[str, bytes]] = {
    "NUL": {"escaped": b'"a\\u0000b"', "in a list": b'["a\\u0000b"]'},
    "huge": {"string": f"'{HUGE}'".encode(), "list": f"['{HUGE}']".encode()},
    "non-UTF-8": {"string": b'"a\xff\xfeb"', "cut": b'"a\xe2\x80"', "surrogate": b'"\xed\xa0\x80"'},
    "control": {"ESC": b'"a\\u001b[2Jb"', "CR": b'"a\\rb"', "C1 CSI": b'"a\\u009b6nb"',
                "RLO": b'"a\\u202eb"', "line separator": b'"a\\u2028b"', "newline": b'"a\\nb"',
                "tab": b'"a\\tb"'},
    "wrong type": {"int": b"7", "negative": b"-1", "beyond 64 bits": b"99999999999999999999",
                   "float": b"1.5", "nan": b"nan", "inf": b"-inf", "bool": b"true",
                   "string": b'"x"', "empty string": b'""', "number as string": b'"12"',
                   "table": b"{}", "table with a key": b"{ a = 1 }", "list": b"[]",
                   "list of strings": b'["a", "b"]', "list of tables": b"[{ a = 1 }]",
                   "nested list": b"[[1]]", "datetime": b"1979-05-27T07:32:00Z",
                   "date": b"1979-05-27", "path": b'"/etc/shadow"', "relative": b'"../../x"'},
}
"""The values every key is given, by kind: TOML value text (bytes: some are not UTF-8)."""


def fuzz_count(fuzzed: Fuzzed, kind: str, counts: Counter[str], failures: list[str]) -> None:
    """Keep the cases of input ``kind`` tried and their tracebacks for ``bench/attacks.py``
    (``fuzzed``); then fail with the first tracebacks, if any."""
    fuzzed(kind, counts["cases"], len(failures))
    assert not failures, f"{len(failures)} of {counts['cases']} cases: " + "\n\n".join(failures[:3])


# -- the suite's keys ----------------------------------------------------------------------------

TABLES = {"Suite": "", "SuiteInfo": "[suite]", "Target": "[target]", "RbdTarget": "[target.rbd]",
          "IscsiTarget": "[target.iscsi]", "Matrix": "[matrix]", "Reference": "[matrix.reference]",
          "WorkloadGroup": "[[workloads]]", "Ioping": "[workloads.ioping]", "Method": "[method]",
          "Part": "[[part]]", "Finding": "[[finding]]", "FindingWorkloads": "[finding.workloads]",
          "NamedTarget": "[[targets]]", "OwnGuest": "[guest]", "Nodes": "[nodes]",
          "Scale": "[scale.big]", "LvmTarget": "[target.lvm]", "LvmThinTarget": "[target.lvmthin]",
          "ZfsTarget": "[target.zfs]", "BtrfsTarget": "[target.btrfs]",
          "PvesmTarget": "[target.pvesm]", "StorageOrigin": "[target.from_storage]"}
"""The table of a suite file each model reads (by class name); a model the walk finds that is
not here fails the test: a new table must be fuzzed too."""


def _models(annotation: object) -> Iterator[type[BaseModel]]:
    """The models in a field's type (through Optional, tuple, Annotated, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models(arg)


def suite_keys() -> dict[str, list[str]]:
    """Each table of a suite (its header) → its keys, walked from ``Suite`` and ``Scale``."""
    found: dict[type[BaseModel], list[str]] = {}

    def visit(model: type[BaseModel]) -> None:
        if model not in found:
            found[model] = [f.alias or name for name, f in model.model_fields.items()]
            for name, f in model.model_fields.items():
                for inner in () if name in INTERNAL else _models(f.annotation):
                    visit(inner)
    visit(Suite)
    visit(Scale)
    unknown = sorted(m.__name__ for m in found if m.__name__ not in TABLES)
    assert not unknown, f"tables the fuzz does not know: {unknown}"
    return {TABLES[m.__name__]: keys for m, keys in found.items()}


def base_tables(header: str, where: Path) -> dict[str, dict[str, str]]:
    """A valid suite (tables → key → TOML value) in which ``header``'s table means something."""
    target = {"directory": f'"{where / "target"}"', "size": '"64MiB"'}
    tables: dict[str, dict[str, str]] = {
        "": {}, "[suite]": {"name": '"fuzz"'}, "[target]": target,
        "[method]": {"mode": '"host"', "runtime": '"1s"', "ramp": '"0s"'}, "[matrix]": {},
        "[[workloads]]": {"rw": '"randread"'}}
    if header in ("[target.rbd]", "[target.iscsi]", "[[targets]]", "[target.lvm]",
                  "[target.lvmthin]", "[target.zfs]", "[target.btrfs]", "[target.pvesm]"):
        del target["directory"]
    extra: dict[str, dict[str, str]] = {
        "[target.rbd]": {"pool": '"rbd"', "monitors": '["192.0.2.1"]'},
        "[target.iscsi]": {"portal": '"192.0.2.1"', "target": '"iqn.2003-01.org.example:t"'},
        "[target.lvm]": {"vg": '"pve"'},
        "[target.lvmthin]": {"vg": '"pve"', "pool": '"data"'},
        "[target.zfs]": {"pool": '"rpool/data"'},
        "[target.btrfs]": {"path": f'"{where / "btrfs"}"'},
        "[target.pvesm]": {"storage": '"local-lvm"'},
        "[target.from_storage]": {"id": '"local"', "type": '"dir"'},
        "[matrix.reference]": {"platform": '"proxmox"', "disk": '"scsi0"', "cache": '"none"',
                               "format": '"raw"'},
        "[workloads.ioping]": {},
        "[[part]]": {"mode": '"blocklayer"'},
        "[[finding]]": {"id": '"f1"', "study": '"s"', "claim": '"c"', "published": '"p"',
                        "kind": '"effect"', "axis": '"aio"', "level": '"io_uring"',
                        "reference": '"native"', "expect": '"better"'},
        "[finding.workloads]": {"iodepth": "[1]"},
        "[[targets]]": {"name": '"a"', "directory": f'"{where / "a"}"'},
        "[guest]": {"image": f'"{where / "disk.img"}"'},
        "[nodes]": {"hosts": '["node1"]'},
        "[scale.big]": {"description": '"bigger"'},
    }
    if header == "[target.iscsi]":
        target["allow_destroy"] = "true"
    if header in ("[[finding]]", "[finding.workloads]"):
        tables["[method]"]["mode"] = '"blocklayer"'
        tables["[matrix]"]["aio"] = '["native", "io_uring"]'
        tables["[[finding]]"] = extra["[[finding]]"]
    if header == "[guest]":
        tables["[method]"]["mode"] = '"guest"'
    if header == "[matrix.reference]":
        tables["[method]"]["mode"] = '"blocklayer"'
        tables["[matrix]"].update({"from_vm": '"100.conf"', "disk": '"scsi0"'})
    if header in extra:
        tables[header] = extra[header]
    return tables


def beside(where: Path) -> None:
    """The files the suites of ``base_tables`` name: a guest image, a Proxmox VM's configuration."""
    (where / "disk.img").write_bytes(b"\0" * (1 << 20))
    (where / "100.conf").write_text(PVE_CONF)


def suite_bytes(tables: dict[str, dict[str, str]], header: str, key: str, value: bytes) -> bytes:
    """The suite ``tables`` with ``key`` of ``header`` set to ``value`` (TOML text)."""
    lines: list[bytes] = []
    for head, items in tables.items():
        if header == "" and head.strip("[]").split(".")[0] == key:
            continue                             # a top-level key given in place of its table
        if head:
            lines.append(head.encode())
        lines += [f"{k} = {v}".encode() for k, v in items.items() if not (head == header
                                                                             and k == key)]
        if head == header:
            lines.append(f'"{key}" = '.encode() + value)
    return b"\n".join(lines) + b"\n"


def _one_line(done: subprocess.CompletedProcess[str]) -> str | None:
    """What is wrong with ``done`` as a refusal (a documented status, lines of iomatrix's own:
    one per problem, maybe a hint; no traceback), or None."""
    if done.returncode not in DOCUMENTED or done.returncode == ExitStatus.ERROR:
        return f"exit {done.returncode}"
    if "Traceback" in done.stdout + done.stderr:
        return "a traceback"
    if done.returncode == 0:
        return None
    lines = done.stderr.rstrip("\n").split("\n")
    if done.returncode == ExitStatus.USAGE and "Usage:" in done.stderr:
        return None                                      # Typer's box
    if not all(line.startswith("iomatrix: ") for line in lines) or \
            any(c in done.stderr for c in SEPARATORS):
        return "not lines of iomatrix's own"
    return None


def _try(failures: list[str], what: str, action: Callable[[], str | None]) -> None:
    try:
        wrong = action()
    except Exception:                               # the traceback the test is looking for
        wrong = traceback.format_exc(limit=-6)
    if wrong:
        failures.append(f"{what}: {wrong}")


@pytest.mark.slow
def test_every_suite_key_takes_any_value_or_refuses_it_in_one_line(
        tmp_path: Path, fuzzed: Fuzzed) -> None:
    beside(tmp_path)
    counts: Counter[str] = Counter()
    failures: list[str] = []
    path = tmp_path / "s.toml"

    def loaded() -> str | None:
        try:
            load_suite(path)
        except IomatrixError:
            pass
        return None

    def planned() -> str | None:
        return _one_line(cli_result("run", str(path), "--plan", cwd=tmp_path))

    for header, keys in suite_keys().items():
        tables = base_tables(header, tmp_path)
        for key in keys:
            for kind, values in VALUES.items():
                for name, value in values.items():
                    path.write_bytes(suite_bytes(tables, header, key, value))
                    what = f"{header or 'top level'} {key} = {kind} ({name})"
                    counts["cases"] += 1
                    counts[kind] += 1
                    _try(failures, f"load_suite: {what}", loaded)
                    _try(failures, f"run --plan: {what}", planned)
    fuzz_count(fuzzed, "suite keys", counts, failures)


def test_each_base_suite_is_planned(tmp_path: Path) -> None:
    """The fuzz reaches every table: each suite it starts from is valid as it is."""
    beside(tmp_path)
    refused = {}
    for header in suite_keys():
        path = tmp_path / "s.toml"
        path.write_bytes(suite_bytes(base_tables(header, tmp_path), "-", "-", b""))
        done = cli_result("run", str(path), "--plan", cwd=tmp_path)
        if done.returncode:
            refused[header] = done.stderr
    assert not refused, refused


# -- what a cluster run's nodes read on stdin ----------------------------------------------------

FORKS = r"""
import json, os, signal, sys, threading, time, traceback
from iomatrix.cli.app import main
import iomatrix.cli.run, iomatrix.drivers.cluster, iomatrix.measure.cluster     # noqa: F401
import iomatrix.translate.fromvm, iomatrix.measure.nodeguests, iomatrix.measure.runner  # noqa: F401

def case(command, data, hold, outs):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(w)
            os.dup2(r, 0)
            for fd, name in zip((1, 2), outs):
                os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
            sys.stdin = open(0, closefd=False)
            main(["node", command])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    os.close(r)
    def write():
        try:
            os.write(w, data) if len(data) < 4096 else open(w, "wb", closefd=False).write(data)
        except OSError:                          # the node stopped reading: its answer says why
            pass
        if not hold:
            os.close(w)
    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        done = os.waitpid(pid, 0)
    writer.join()
    if hold:
        os.close(w)
    return os.waitstatus_to_exitcode(done[1])

results = []
outs = [os.path.join(sys.argv[1], n) for n in ("out", "err")]
for command, data, hold in json.load(sys.stdin):
    status = case(command, bytes.fromhex(data), hold, outs)
    out, err = (open(n, errors="replace").read() for n in outs)
    results.append({"code": status, "stdout": out[:2000],
                    "stderr": "\n".join(line[:300] for line in err.split("\n"))})
json.dump(results, sys.stdout)
"""
"""Runs ``iomatrix node COMMAND`` (``main``) once per request, each in a process of its own
forked from one that imported iomatrix once, the request written to its stdin: the real entry
point, in a fraction of a second per case instead of a new interpreter's import. A whole
request's stdin stays open until the node ends, as the controller's SSH session does (stdin
ending stops a node as Ctrl-C does); a line that is no request is followed by the end of stdin.
A node that does not end within a minute is killed (exit -9)."""

SUITE_TEXT = ('[suite]\nname = "n"\n[target]\ndirectory = "/dev/null/x"\nsize = "64MiB"\n'
              '[method]\nmode = "host"\nruntime = "1s"\nramp = 0\n[[workloads]]\nrw = "randread"\n')
"""A valid suite whose target cannot be made (a request that passes every check, and whose
stdin has ended, is interrupted at once; were it not, it would stop there)."""

REQUESTS: dict[str, dict[str, object]] = {
    "check": {"suite_text": SUITE_TEXT},
    "run": {"suite_text": SUITE_TEXT, "suite_source": "s.toml", "node": "n1",
            "run_uuid": "abc123", "seed": 1, "db": "postgresql://iomatrix@127.0.0.1:1/none",
            "accel": "tcg", "keep": False, "retry_failed": False},
    "export": {"run_uuid": "abc123", "node": "n1"},
    "forget": {"run_uuid": "abc123", "node": "n1"},
    "serve-guests": {"suite_text": SUITE_TEXT, "suite_source": "s.toml", "config": "none",
                     "accel": "tcg", "directory": "(node_cases: a fresh one)",
                     "images": [{"path": "/dev/null/x.raw", "format": "raw",
                                 "preallocation": "off", "size": 67108864}]},
}
"""Each command's request, valid but harmless: every case changes one thing in it. (``forget``
reads its request as ``export`` does: only its lines are tried.)"""

LINES = {"empty": b"", "blank": b"\n", "cut": b'{"suite_text": "', "not UTF-8": b"\xff\xfe\n",
         "NUL": b"\x00\n", "null": b"null\n", "list": b"[]\n", "number": b"1\n",
         "string": b'"s"\n', "empty object": b"{}\n", "deep": b"[" * 100_000 + b"\n",
         "no newline": b"{}"}
"""Lines that are no request; and, for ``run`` (each command reads its line alike, a byte at a
time: what follows the line stays unread), one of 1 MiB."""

FIELD_VALUES: dict[str, object] = {
    "missing": ..., "null": None, "int": 7, "beyond 64 bits": 10**30, "list": [1, "a"],
    "object": {"a": 1}, "string": "x", "empty": "", "NUL": "a\x00b", "long": "a" * 8192,
    "line break": "n1\n", "lone surrogate": "\ud800", "ESC": "a\x1b[2J\u202eb",
    "dots": "../../../etc/x"}
"""What each field of a request is given instead of its value (``...``: left out); 8 KiB is
beyond any name or path."""

MORE_VALUES: dict[str, dict[str, object]] = {
    "suite_text": {"TOML": "[suite\nname = ", "deep": "[" * 5000, "float": 1.5},
    "db": {"PostgreSQL URL": "postgresql://u:PW@[::1/db", "path": "/etc/shadow",
           "PostgreSQL port": "postgresql://u:PW@h:99999999/db"},
    "seed": {"float": 1.5, "bool": True}}
"""Values for one field only."""


def node_cases(guests: str) -> list[tuple[str, str, bytes, bool]]:
    """(command, what, stdin, whether stdin stays open) for every command: each line of LINES,
    and its request with each field given each of FIELD_VALUES; ``guests``: serve-guests'
    directory (fresh: the node refuses one that exists)."""
    cases = [("run", "line huge", b'{"x": "' + HUGE.encode() + b'"}\n', False)]
    for command, request in REQUESTS.items():
        if command == "serve-guests":
            request = {**request, "directory": guests}
        cases += [(command, f"line {name}", line, False) for name, line in LINES.items()]
        for field in request if command != "forget" else ():
            for name, value in {**FIELD_VALUES, **MORE_VALUES.get(field, {})}.items():
                changed = {k: v for k, v in request.items() if k != field}
                if value is not ...:
                    changed[field] = value
                cases.append((command, f"{field} {name}",
                              json.dumps(changed).encode("utf-8", "surrogatepass") + b"\n", True))
    return cases


@pytest.mark.slow
def test_node_commands_refuse_any_malformed_request_in_one_line(
        tmp_path: Path, fuzzed: Fuzzed) -> None:
    guests = Path(f"/tmp/iomatrix-guests-{secrets.token_hex(8)}")
    cases = node_cases(str(guests))
    batch = json.dumps([[command, data.hex(), hold] for command, _, data, hold in cases])
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-c", FORKS, str(tmp_path)], input=batch,
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not guests.exists()
    counts: Counter[str] = Counter(cases=len(cases))
    failures = []
    for (command, what, _, _), result in zip(cases, json.loads(done.stdout), strict=True):
        wrong = _one_line(subprocess.CompletedProcess([], result["code"], result["stdout"],
                                                      result["stderr"]))
        if wrong:
            failures.append(f"node {command} ({what}): {wrong}: {result['stderr']}")
    fuzz_count(fuzzed, "node requests", counts, failures)
