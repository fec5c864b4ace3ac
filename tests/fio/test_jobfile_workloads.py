"""fio job files as workloads (``[[workloads]] jobfile = ...``, iomatrix.suite.jobfiles): seed 000's
job files load as it publishes them, sizes and syntax are read as fio 3.33 reads them (checked
against fio itself), what iomatrix cannot honour is refused in one line naming the option, every
refusal that speaks for fio is true of the installed fio (fio's own examples/ and crafted files,
asked of ``fio --parse-only``; the order of jobs, of fio running them), job files stay within the
suite's directory, and a run keeps their text: it resumes, and shows them, after the files are
gone."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from iomatrix.cli.status import ExitStatus
from iomatrix.core.errors import SuiteError
from iomatrix.core.proc import require
from iomatrix.measure.runner import SilentProgress, run_suite
from iomatrix.store import Store
from iomatrix.suite import expand, load_suite, load_suite_text
from iomatrix.suite.spec import RunSpec
from iomatrix.core.units import parse_size
from iomatrix.store.ingest import import_results
from iomatrix.suite.jobfiles import (BARE_FLAGS, TAKES_VALUE, JobFileError, fio_size, parse,
                                     workloads)
from iomatrix.suite.workloads import block_sizes
from bench import fio_examples
from iomatrix.fio.jobfile import job_text
from iomatrix.suite.fiooptions import SAFETY, SCOPE
from tests.conftest import cli, write_suite

SEED_000 = """[global]
rw=randread
direct=1
ioengine=libaio
time_based=1
runtime=1200
ramp_time=60
numjobs=1

[sdb]
filename=/dev/sdb
bs=4096
iodepth=32
"""
"""seed 000's sample workload description (``cat read-rand-bs4096-qd32.fio``), byte for byte."""
SEED_000_BS = (512, 4096, 8192, 16384, 32768, 65536, 131072)
SEED_000_QD = (1, 2, 4, 8, 16, 32, 64, 128)
"""Its 56 workloads: .5K to 128K × QD 1 to 128 (seed 000 §ENVIRONMENT, §BENCHMARKS)."""


def seed_000_file(bs: int, qd: int) -> str:
    return SEED_000.replace("bs=4096", f"bs={bs}").replace("iodepth=32", f"iodepth={qd}")


def jobfile_suite(directory: Path, jobs: dict[str, str], *, method: str = "",
                  extra: str = "") -> Path:
    """A host-mode suite in ``directory`` with one [[workloads]] table per job file written."""
    for name, text in jobs.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    tables = "".join(f'[[workloads]]\njobfile = "{name}"\n' for name in jobs)
    return write_suite(directory, tables + '[method]\nmode = "host"\n' + method + extra,
                       size="4MiB")


def refusal(tmp_path: Path, text: str, **kwargs: str) -> str:
    with pytest.raises(SuiteError) as caught:
        load_suite(jobfile_suite(tmp_path, {"j.fio": text}, **kwargs))
    message = str(caught.value)
    assert "\n" not in message
    return message


# -- seed 000 ---------------------------------------------------------------------------------

def test_seed_000s_56_job_files_load_as_published(tmp_path: Path) -> None:
    files = {f"read-rand-bs{bs}-qd{qd}.fio": seed_000_file(bs, qd)
             for bs in SEED_000_BS for qd in SEED_000_QD}
    assert files["read-rand-bs4096-qd32.fio"] == SEED_000
    suite = load_suite(jobfile_suite(tmp_path, files))
    expansion = expand(suite)
    measured = {(w.rw, w.bs, w.iodepth, w.numjobs, w.rate_iops, w.options)
                for w in expansion.workloads}
    assert measured == {("randread", bs, qd, 1, 0, ()) for bs in SEED_000_BS for qd in SEED_000_QD}
    assert len(expansion.workloads) == 56
    notes = [n for n in expansion.notes if n.startswith("job file")]
    assert notes == [
        "job files read-rand-bs512-qd1.fio, read-rand-bs512-qd2.fio and 54 more: time_based=1, "
        "runtime=1200, ramp_time=60 replaced by [method] runtime and ramp",
        "job files read-rand-bs512-qd1.fio, read-rand-bs512-qd2.fio and 54 more: "
        "filename=/dev/sdb replaced by the run's target"]
    (job,) = parse(SEED_000)
    assert job.name == "sdb" and job.line == 10
    assert [o.text for o in job.options] == [
        "rw=randread", "direct=1", "ioengine=libaio", "time_based=1", "runtime=1200",
        "ramp_time=60", "numjobs=1", "filename=/dev/sdb", "bs=4096", "iodepth=32"]


def test_a_job_files_engine_must_be_the_runs(tmp_path: Path) -> None:
    message = refusal(tmp_path, SEED_000, method='engine = "io_uring"\n')
    assert message.endswith("[[workloads]] #1 jobfile = 'j.fio': line 4: [sdb] ioengine=libaio: "
                            "the run's engine is [method] engine = \"io_uring\", one for every "
                            "workload; set [method] engine = \"libaio\" (outside what iomatrix "
                            "measures)")
    message = refusal(tmp_path, SEED_000.replace("libaio", "sync"))
    assert "ioengine=sync" in message and "offers libaio, io_uring, psync" in message


# -- fio's syntax, as fio reads it ------------------------------------------------------------

def test_syntax_comments_globals_aliases_and_flags(tmp_path: Path) -> None:
    text = ("; a comment\n  # another\n[global]\nreadwrite=randrw  ; fio ends the line here\n"
            "rwmixread=70# and here\nblocksize =64k\n\n[mixed]\niodepth=8\nnumjobs=2\n"
            "rate_iops=500\nnorandommap\r\n[global-later]\nbs=16k\n"
            "[seq]\nstonewall\nrw=readwrite\n[defaults]\nwait_for_previous\nrw=read\nbs=4k\n")
    suite = load_suite(jobfile_suite(tmp_path, {"mix.fio": text}))
    got = [(w.rw, w.bs, w.iodepth, w.numjobs, w.rate_iops, w.options)
           for w in expand(suite).workloads]
    assert got == [
        ("randrw", 65536, 8, 2, 500, (("norandommap", "1"), ("rwmixread", "70"))),
        ("rw", 16384, 1, 1, 0, (("rwmixread", "70"),)),   # [global-later] reaches later jobs only
        ("read", 4096, 1, 1, 0, (("rwmixread", "70"),)),
    ]
    bare = load_suite(jobfile_suite(tmp_path, {"d.fio": "[d]\n"}))
    assert [(w.rw, w.bs, w.iodepth) for w in expand(bare).workloads] == [("read", 4096, 1)]


@pytest.mark.slow
def test_sizes_and_bare_flags_are_what_fio_reads(tmp_path: Path) -> None:
    """fio itself, with the null engine: the block size it used for each spelling is ours, and
    what fio reads otherwise than it looks is not read as it looks."""
    fio = require("fio")
    spellings = ["4k", "4K", "4kb", "4KiB", "0x1000", "4096", "4096b", "64k", "1m", "8KB"]
    misread = {"blank": "bs= 4k", "fraction": "bs=1.5k"}
    jobs = "".join(f"[s{i}]\nbs={s}\n" for i, s in enumerate(spellings))
    jobs += "".join(f"[{name}]\n{line}\nsize=8k\n" for name, line in misread.items())
    (tmp_path / "sizes.fio").write_text(f"[global]\nioengine=null\nsize=4m\nrw=read\n{jobs}")
    done = subprocess.run([fio, "--output-format=json", str(tmp_path / "sizes.fio")],
                          capture_output=True, text=True, timeout=60, check=True)
    used = {j["jobname"]: j["read"]["io_bytes"] // j["read"]["total_ios"]
            for j in json.loads(done.stdout)["jobs"]}
    assert {s: used[f"s{i}"] for i, s in enumerate(spellings)} == {s: fio_size(s) for s in spellings}
    assert fio_size("4KiB") == 4000 and fio_size("4k") == 4096
    assert used["blank"] != 4096 and used["fraction"] != 1536
    for name, line in misread.items():
        message = refusal(tmp_path, f"[j]\n{line}\n")
        assert "line 2" in message and line in message
    # fio's flags that may stand alone (the only ones), and one it refuses alone
    flags = "".join(f"{name}\n" for name in sorted(BARE_FLAGS))
    (tmp_path / "flags.fio").write_text(f"[global]\nioengine=null\nsize=1m\n[f]\n{flags}")
    assert subprocess.run([fio, "--parse-only", str(tmp_path / "flags.fio")],
                          capture_output=True, timeout=60).returncode == 0
    (tmp_path / "direct.fio").write_text("[global]\nioengine=null\nsize=1m\n[f]\ndirect\n")
    alone = subprocess.run([fio, "--parse-only", str(tmp_path / "direct.fio")],
                           capture_output=True, text=True, timeout=60)
    assert alone.returncode != 0 and "Option direct requires an argument" in alone.stderr
    assert "Option direct requires an argument" in refusal(tmp_path, "[j]\ndirect\n")


# -- what iomatrix cannot honour ------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("[j]\nexec_prerun=/bin/true\n", "line 2: [j] exec_prerun=/bin/true: fio option "
                                     "'exec_prerun' is refused: it runs a command"),
    ("[j]\nwrite_lat_log=lat\nread_iolog=trace\n", "line 3: [j] read_iolog=trace: fio option "
                                                 "'read_iolog' is refused: it names, creates or "
                                                 "reads files"),
    ("[j]\ndirect=0\n", "line 2: [j] direct=0: iomatrix measures direct I/O only"),
    ("[j]\nbs=4KiB\n", "line 2: [j] bs=4KiB: block size 4000 is not a multiple of 512"),
    ("[j]\nbs=4k,64k\n", "[j] bs=4k,64k: a workload has one block size"),
    ("[j]\nrw=trim\n", "[j] rw=trim: iomatrix measures read, write"),
    ("[j]\niodepth=0\n", "[j] iodepth=0: Input should be greater than or equal to 1"),
    ("[j]\nkb_base=1000\n", "[j] kb_base=1000: only fio's default, 1024"),
    ("[j]\nbs=4k\nbs=8k\n", "line 3: bs is set twice in [j] (line 2 too)"),
    ("rw=read\n[j]\n", "line 1: 'rw=read' comes before any [section]"),
    ("[global]\nrw=read\n", "no job section"),
    ("[a]\n[b]\n", "line 2: [b] runs at the same time as [a] in fio (no stonewall)"),
    ("[j]\ninclude other.fio\n", "line 2: 'include other.fio': include makes fio read another"),
    ("[j]\nsize=${SIZE}\n", "line 2: 'size=${SIZE}': ${SIZE} is not in the suite's [fio_vars] "
                          "table, and fio would read it from root's environment"),
    ("[j]\nbs=$pagesize\n", "line 2: 'bs=$pagesize': fio expands '$'"),
    ("[j]\nbs = 4k\n", "line 2: 'bs = 4k': a blank after '=' stays in fio's value"),
    ("[j]\nstonewall=yes\n", "[j] stonewall=yes: write stonewall"),
])
def test_options_iomatrix_cannot_honour_are_refused_by_name(tmp_path: Path, text: str,
                                                           expected: str) -> None:
    message = refusal(tmp_path, text)
    assert message.startswith(f"{tmp_path / 't.toml'}: [[workloads]] #1 jobfile = 'j.fio': ")
    assert expected in message


def test_a_refusal_is_one_line_and_a_suite_errors_exit(tmp_path: Path) -> None:
    suite = jobfile_suite(tmp_path, {"j.fio": SEED_000.replace("numjobs=1", "exec_postrun=rm")})
    code, output = cli("run", str(suite), "--plan")
    assert code == ExitStatus.SUITE_INVALID
    assert output.strip().count("\n") == 0 and "exec_postrun" in output and "line 8" in output
    beside = write_suite(tmp_path, '[[workloads]]\njobfile = "j.fio"\niodepth = 4\n', name="b")
    with pytest.raises(SuiteError, match=r"\[\[workloads\]\] #1: a table with jobfile takes its "
                                         "workloads from the job file; write iodepth there"):
        load_suite(beside)


# -- what iomatrix says of fio is true of fio ------------------------------------------------

FIO_EXAMPLES = Path("/usr/share/doc/fio/examples")
"""fio's examples/ of the installed fio, as Debian's fio-examples installs them (setup.sh --dev)."""
SPEAKS_FOR_FIO = re.compile(r"fio refuses it too|does not have the form fio expects")
"""Refusals that say fio itself refuses the line: ``fio --parse-only`` must refuse the file."""
TOGETHER = re.compile(r"\[(?P<later>[^]]+)\] runs at the same time as \[(?P<earlier>[^]]+)\] in fio")


def fio_parse_only(fio: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([fio, "--parse-only", path.name], cwd=path.parent,
                          capture_output=True, text=True, timeout=60)


def verdict(fio: str, path: Path) -> str:
    """How iomatrix reads job file ``path``: "loaded", "refused" or "refused as fio does",
    asserting that what it says of fio is true of the installed fio: a file it loads fio
    parses; a line it says fio refuses, fio refuses, naming it (and in the words quoted); two
    jobs it says fio runs together are jobs of the file, the later one at the line named."""
    text = path.read_text()
    lines = text.split("\n")
    try:
        workloads(text, engine="libaio")
    except JobFileError as exc:
        message = str(exc)
        assert "\n" not in message and 0 <= exc.line <= len(lines), (path.name, message)
        together = TOGETHER.search(message)
        if together:
            sections = re.findall(r"^[ \t]*\[([^]\n]+)\]", text, re.M)
            assert {together["later"], together["earlier"]} <= set(sections), message
            assert lines[exc.line - 1].strip().startswith(f"[{together['later']}]"), message
        if not SPEAKS_FOR_FIO.search(message):
            return "refused"
        done = fio_parse_only(fio, path)
        assert done.returncode != 0, f"{path.name}: {message}: but fio --parse-only accepts it"
        key, _, value = re.split(r"[;#]", lines[exc.line - 1])[0].strip().partition("=")
        assert key in done.stderr or (value and value in done.stderr), (message, done.stderr)
        quoted = re.search(r'\("([^"]+)"\)', message)
        assert quoted is None or quoted[1] in done.stderr, (message, done.stderr)
        return "refused as fio does"
    done = fio_parse_only(fio, path)
    assert done.returncode == 0, f"{path.name}: iomatrix loads it, fio refuses: {done.stderr}"
    return "loaded"


@pytest.mark.slow
def test_fios_own_examples_are_read_as_fio_reads_them() -> None:
    """Every job file of fio's examples/: what iomatrix loads fio parses, and each refusal that
    speaks for fio (none, since 12 were false) is checked against fio --parse-only."""
    fio = require("fio")
    files = sorted(FIO_EXAMPLES.glob("*.fio"))
    assert files, f"no job files in {FIO_EXAMPLES}: ./setup.sh --dev installs Debian's fio-examples"
    verdicts = {path.name: verdict(fio, path) for path in files}
    assert {"loaded", "refused"} <= set(verdicts.values())
    # bench/fio_examples.py's count (each refusal's kind), shown with -s: fio 3.33 and 3.39
    kinds = {name: kind for name, (kind, _) in fio_examples.count(FIO_EXAMPLES).items()}
    assert set(kinds) == set(verdicts) and set(kinds.values()) <= {"loaded", SAFETY, SCOPE}
    # what loads with libaio loads in the count too (which may choose the file's own engine)
    assert {n for n, v in verdicts.items() if v == "loaded"} <= \
        {n for n, k in kinds.items() if k == "loaded"}
    version = subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"\nfio examples ({version}): " + ", ".join(f"{k}: {list(kinds.values()).count(k)}" for k in ("loaded", SAFETY, SCOPE))
          + f" of {len(kinds)}")
    # waitfor.fio runs its four jobs one after another (wait_for): not refused for running them
    # at once (it is for threads=, which iomatrix does not pass on)
    with pytest.raises(JobFileError, match=r"\[writers\] threads=1: fio option 'threads'"):
        workloads((FIO_EXAMPLES / "waitfor.fio").read_text(), engine="libaio")


CRAFTED = [
    "rw=read\n[j]\n",                                      # before any section
    "[j]\nrwmixread=/etc/passwd\n", "[j]\nbssplit=/etc/passwd\n", "[j]\nnorandommap=yes\n",
    *(f"[j]\n{key}\n" for key in sorted(TAKES_VALUE)),    # fio wants a value for each
]


@pytest.mark.slow
@pytest.mark.parametrize("number", range(0, len(CRAFTED), 20))
def test_refusals_that_speak_for_fio_are_true_of_fio(tmp_path: Path, number: int) -> None:
    fio = require("fio")
    for text in CRAFTED[number:number + 20]:
        path = tmp_path / "j.fio"
        path.write_text("[global]\nioengine=libaio\nsize=1m\n" + text if text[0] == "[" else text)
        assert verdict(fio, path) == "refused as fio does", text


def fio_runs_together(fio: str, tmp_path: Path, jobs: dict[str, str], long: str, ender: str,
                      seconds: int) -> bool:
    """Whether fio runs jobs [long] and [ender] of ``jobs`` (section → its lines) at the same
    time: [long] runs ``seconds`` (time-based, paced) and [ender] ends every job when it ends
    (exitall), so [long] is cut short exactly when they overlap."""
    extra = {long: f"time_based\nruntime={seconds}s\nrate_iops=100\n",
             ender: "exitall\nexit_what=all\n"}
    path = tmp_path / "order.fio"
    path.write_text("[global]\nioengine=null\nsize=1m\n" + "".join(
        f"[{name}]\n{lines}{extra.get(name, '')}" for name, lines in jobs.items()))
    done = subprocess.run([fio, "--output-format=json", str(path)], capture_output=True,
                          text=True, timeout=seconds + 120, check=True)
    ran = {j["jobname"]: j["job_runtime"] for j in json.loads(done.stdout)["jobs"]}
    return ran[long] < seconds * 500


@pytest.mark.slow
@pytest.mark.parametrize("jobs, long, ender, refused", [
    # fio's waitfor.fio as a chain, one link by name=: each job waits for the one before
    ({"first": "", "second": "name=two\nwait_for=first\n", "third": "wait_for=two\n",
      "fourth": "wait_for=third\n"}, "first", "fourth", None),
    ({"a": "", "b": "wait_for=a\n", "c": ""}, "a", "c",
     "line 4: [c] runs at the same time as [a] in fio (no stonewall)"),
    ({"a": "", "b": "wait_for=a\n", "c": "wait_for=a\n"}, "b", "c",
     "[c] runs at the same time as [b] in fio (no stonewall, and its wait_for waits for [a] only)"),
    ({"a": "", "b": "stonewall\n", "c": ""}, "b", "c",
     "line 4: [c] runs at the same time as [b] in fio (no stonewall)"),
    ({"a": "startdelay=1\n", "b": "stonewall\n"}, "b", "a",
     "[b] runs at the same time as [a] in fio ([a] has startdelay, and fio starts a stonewall "
     "job without waiting for a job still in its delay)"),
])
def test_stonewall_and_wait_for_order_jobs_as_fio_runs_them(
        tmp_path: Path, jobs: dict[str, str], long: str, ender: str, refused: str | None) -> None:
    """iomatrix's verdict on a job file's order is fio's: fio itself runs the jobs it says run
    at the same time together, and those it loads one after the other."""
    text = "".join(f"[{name}]\n{lines}" for name, lines in jobs.items())
    if refused is None:
        assert len(workloads(text, engine="libaio")[0]) == len(jobs)
    else:
        with pytest.raises(JobFileError) as caught:
            workloads(text, engine="libaio")
        assert refused in str(caught.value)
    seconds = 2 if refused is None else 20
    assert fio_runs_together(require("fio"), tmp_path, jobs, long, ender, seconds) == bool(refused)


@pytest.mark.parametrize("text, refused, fio_says", [
    ("[a]\n[b]\nwait_for=c\n", "line 5: [b] wait_for=c: no job before [b] is called c",
     "b: waitee job c unknown"),
    ("[a]\n[b]\nwait_for=b\n", "[b] wait_for=b: a job cannot wait for itself",
     "a job cannot wait for itself"),
    ("[x]\n[x]\nstonewall\n[y]\nstonewall\nwait_for=x\n",
     "[y] wait_for=x: 2 jobs up to [y] are called x; wait_for must name one", "multiple waitees"),
])
def test_a_wait_for_fio_would_not_run_is_refused(tmp_path: Path, text: str, refused: str,
                                                  fio_says: str) -> None:
    """fio checks wait_for when it adds a job, after --parse-only stops: run it (null engine)."""
    with pytest.raises(JobFileError) as caught:
        workloads("[global]\nsize=1m\n" + text, engine="libaio")
    assert refused in str(caught.value)
    (tmp_path / "w.fio").write_text("[global]\nioengine=null\nsize=1m\n" + text)
    done = subprocess.run([require("fio"), "w.fio"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and fio_says in done.stderr + done.stdout


def test_what_fio_would_not_read_or_would_run_buffered_is_noted(tmp_path: Path) -> None:
    """Settings after a ';' (a comment to fio: crystal.fio's, from a public write-up) and a job
    without direct= (fio's default is buffered) are noted in --plan and the run's notes; jobs
    that are one workload say so; a bssplit workload is labelled by its split."""
    crystal = "[global]\nioengine=libaio\ndirect=1\n" + "".join(
        f"[{name}]\nstonewall;rw={rw};bs={bs};iodepth={qd};numjobs={nj}\n"
        for name, rw, bs, qd, nj in [("SEQ1M_Q8T1_READ", "read", "1M", 8, 1),
                                     ("SEQ1M_Q8T1_WRITE", "write", "1M", 8, 1),
                                     ("RND4K_Q32T16_READ", "randread", "4k", 32, 16)])
    split = "[mixed]\nrw=randread\nbssplit=4k/50:64k/50\niodepth=8\n"
    suite = jobfile_suite(tmp_path, {"crystal.fio": crystal, "split.fio": split})
    expansion = expand(load_suite(suite))
    assert [w.label for w in expansion.workloads] == ["4k read QD1",
                                                      "bssplit 4k/50:64k/50 randread QD8"]
    comment = ("job file crystal.fio: line 5: fio reads ';rw=read;bs=1M;iodepth=8;numjobs=1' as "
               "a comment, so neither fio nor iomatrix uses the settings in it (2 more lines "
               "like it); put each option on a line of its own")
    alike = ("job file crystal.fio: [SEQ1M_Q8T1_READ], [SEQ1M_Q8T1_WRITE] and 1 more are one "
             "workload (4k read QD1): measured once")
    buffered = ("job file split.fio: no direct= (fio's default: buffered I/O, through the page "
                "cache) replaced by direct=1: iomatrix measures direct I/O only")
    assert {comment, alike, buffered} <= set(expansion.notes)
    assert not any("crystal.fio: no direct=" in n for n in expansion.notes)
    code, plan = cli("run", str(suite), "--plan")
    assert code == 0 and all(f"note: {n}" in plan for n in (comment, alike, buffered)), plan
    # fio reads crystal.fio so: no rw, bs, iodepth or numjobs in any job; direct is its default 0
    fio = require("fio")
    (tmp_path / "crystal.fio").write_text(crystal.replace("libaio", "null"))
    parsed = subprocess.run([fio, "--debug=parse", "--parse-only", "crystal.fio"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    handled = re.findall(r"handle_option=(\w+)", parsed.stdout + parsed.stderr)
    assert parsed.returncode == 0 and "stonewall" in handled
    assert not {"rw", "bs", "iodepth", "numjobs"} & set(handled)
    direct = subprocess.run([fio, "--cmdhelp=direct"], capture_output=True, text=True,
                            timeout=60, check=True)
    assert re.search(r"default: (0|false)", direct.stdout)
    assert block_sizes(4096, {"bsrange": "1k-64k"}) == "bsrange 1k-64k"


def test_one_size_parser_fios_text_as_fio_reads_it_suites_binary(tmp_path: Path) -> None:
    """fio's text (job files, the job options of imported results) is read as fio read it, kb_base
    included; a suite's own sizes stay binary. fio's own result says what it read."""
    fio = require("fio")
    jobs = {"kib": "bs=8KiB\n", "k": "bs=8k\n", "kib1000": "kb_base=1000\nbs=8KiB\n",
            "k1000": "kb_base=1000\nbs=8k\n"}
    results = tmp_path / "results"
    results.mkdir()
    (tmp_path / "s.fio").write_text("[global]\nioengine=null\nsize=1m\nrw=read\n" + "".join(
        f"[{name}]\nstonewall\n{lines}" for name, lines in jobs.items()))
    done = subprocess.run([fio, "--output-format=json", str(tmp_path / "s.fio")],
                          capture_output=True, text=True, timeout=60, check=True)
    (results / "s.json").write_text(done.stdout)
    used = {j["jobname"]: j["read"]["io_bytes"] // j["read"]["total_ios"]
            for j in json.loads(done.stdout)["jobs"]}
    assert used == {"kib": 8000, "k": 8192, "kib1000": 8192, "k1000": 8000}
    assert {name: fio_size(lines.split("bs=")[1].strip(),
                           kb_base=1000 if "kb_base" in lines else 1024)
            for name, lines in jobs.items()} == used
    with Store(tmp_path / "r.db") as store:
        run = store.load_run(import_results(store, results, mode="host").run_id)
    assert {w.bs for w in run.workloads} == set(used.values())
    assert parse_size("8KiB") == parse_size("8k") == 8192          # a suite's size: binary


# -- where a job file may be ------------------------------------------------------------------

def test_job_files_stay_in_the_suite_files_directory(tmp_path: Path) -> None:
    home, outside = tmp_path / "suite", tmp_path / "outside"
    home.mkdir(), outside.mkdir()
    (outside / "x.fio").write_text(SEED_000)
    (home / "jobs").mkdir()
    (home / "jobs" / "in.fio").write_text(SEED_000)
    (home / "link-in.fio").symlink_to(home / "jobs" / "in.fio")
    (home / "link-out.fio").symlink_to(outside / "x.fio")
    (home / "dir-out").symlink_to(outside)
    os.mkfifo(home / "fifo.fio")

    def load(name: str) -> str:
        path = write_suite(home, f'[[workloads]]\njobfile = "{name}"\n')
        try:
            load_suite(path)
        except SuiteError as exc:
            assert "\n" not in str(exc)
            return str(exc)
        return "loaded"
    assert load("jobs/in.fio") == load("link-in.fio") == "loaded"
    assert "an absolute path" in load(str(outside / "x.fio"))
    assert "'..' leads out of the suite file's directory" in load("../outside/x.fio")
    assert "'..'" in load("jobs/../../outside/x.fio")
    for name in ("link-out.fio", "dir-out/x.fio"):
        assert f"leads to {outside / 'x.fio'}, outside the suite file's directory" in load(name)
    assert "not a regular file" in load("fifo.fio")
    assert "not a regular file" in load("jobs")
    assert "No such file" in load("missing.fio")
    (home / "big.fio").write_text("#" * (256 * 1024 + 1))
    assert "256 KiB at most" in load("big.fio")
    text = '[suite]\nname = "b"\n[target]\ndirectory = "/x"\nsize = "4MiB"\n' \
           '[[workloads]]\njobfile = "j.fio"\n'
    with pytest.raises(SuiteError, match="a built-in suite has no directory to read job files"):
        load_suite_text(text, source="builtin:b")
    with pytest.raises(SuiteError, match="a suite given as text has no directory"):
        load_suite_text(text)


def test_a_suite_may_carry_its_job_files_and_scales_keep_them(tmp_path: Path) -> None:
    body = ('[[workloads]]\njobfile = "a.fio"\n[method]\nmode = "host"\n'
            '[scale.small]\n[[scale.small.workloads]]\njobfile = "b.fio"\n'
            '[jobfiles]\n"a.fio" = """\n[a]\nrw=write\n"""\n"b.fio" = "[b]\\nbs=64k\\n"\n')
    path = write_suite(tmp_path, body)                      # no a.fio, b.fio on disk
    assert [w.rw for w in expand(load_suite(path)).workloads] == ["write"]
    small = load_suite(path, scale="small")
    assert [w.bs for w in expand(small).workloads] == [65536]
    again = RunSpec.of(small).suite(text=small.source_text, source="stored")  # a run keeps
    assert again.jobfiles == {"a.fio": "[a]\nrw=write\n", "b.fio": "[b]\nbs=64k\n"}
    assert expand(again).workloads == expand(small).workloads
    on_disk = jobfile_suite(tmp_path / "disk", {"a.fio": "[a]\nrw=write\n"},
                            extra='[scale.small]\n[[scale.small.workloads]]\njobfile = "b.fio"\n')
    (tmp_path / "disk" / "b.fio").write_text("[b]\nbs=64k\n")
    read = load_suite(on_disk, scale="small")
    stored = RunSpec.from_json(RunSpec.of(read).to_json())
    shutil.rmtree(tmp_path / "disk")
    assert stored.suite(text=read.source_text, source="stored").jobfiles == again.jobfiles
    missing = write_suite(tmp_path, body.replace('jobfile = "b.fio"', 'jobfile = "c.fio"'), name="m")
    with pytest.raises(SuiteError, match="'c.fio' is not in the suite's \\[jobfiles\\] table"):
        load_suite(missing)


# -- a run keeps its job files ----------------------------------------------------------------

class StopAfterFirstTrial(SilentProgress):
    def trial_finished(self, n: int, ok: bool, detail: str) -> None:
        raise KeyboardInterrupt


@pytest.mark.slow
def test_a_run_resumes_and_shows_its_job_files_after_they_are_gone(tmp_path: Path,
                                                                   no_leftovers: None) -> None:
    crlf = "; two jobs, one after the other\r\n[r]\r\nrw=randread\r\n[w]\r\nstonewall\r\n" \
           "rw=randwrite\r\nbs=8k\r\niodepth=4\r\n"
    files = {"read-rand-bs4096-qd32.fio": SEED_000, "jobs/two.fio": crlf}
    suite_file = jobfile_suite(tmp_path, files, method='ramp = 0\nruntime = "500ms"\n'
                               'precondition = false\nseed = 1\n')
    db = tmp_path / "r.db"
    with Store(db) as store:
        with pytest.raises(KeyboardInterrupt):
            run_suite(load_suite(suite_file), store, progress=StopAfterFirstTrial())
        assert store.load_run(1).status == "interrupted"
    for name in files:
        (tmp_path / name).unlink()
    code, output = cli("run", "--resume", "1", "--db", str(db))
    assert code == 0, output
    with Store(db, readonly=True) as store:
        run = store.load_run(1)
        jsons = [json.loads(store.fio_json(t.id) or "{}") for t in run.trials]
    assert run.status == "complete" and len(run.trials) == 3
    ran = {(d["jobs"][0]["job options"]["rw"], d["jobs"][0]["job options"]["bs"],
            d["jobs"][0]["job options"]["iodepth"], d["global options"]["filename"])
           for d in jsons}
    assert {r[:3] for r in ran} == {("randread", "4096", "32"), ("randread", "4096", "1"),
                                    ("randwrite", "8192", "4")}
    target = str(tmp_path / "target")
    assert all(r[3].startswith(target) for r in ran)             # never /dev/sdb
    code, shown = cli("show", "1", "--db", str(db))
    assert code == 0 and ("note: job file read-rand-bs4096-qd32.fio: filename=/dev/sdb "
                          "replaced by the run's target") in shown
    assert ("note: job file jobs/two.fio: no direct= (fio's default: buffered I/O, through the "
            "page cache) replaced by direct=1") in shown              # measured direct, said so
    code, text = cli("export", "1", "--format", "suite", "--db", str(db))
    assert code == 0
    assert tomllib.loads(text)["jobfiles"] == files             # byte for byte, CRs included


# -- issue 38: options made harmless, [fio_vars], and the kind of each refusal ----------------

def test_flow_numa_threads_and_gtod_reduce_load_and_fio_parses_what_runs(tmp_path: Path) -> None:
    fio = require("fio")
    text = ("[global]\ngtod_reduce=1\nthread\nflow=2\nflow_sleep=100\n"
            "[j]\nrw=${RW}\nbs=${BS}\nnuma_cpu_nodes=0\n")
    suite = load_suite(jobfile_suite(tmp_path, {"j.fio": text},
                                     extra='[fio_vars]\nRW = "randread"\nBS = "8k"\n'))
    expansion = expand(suite)
    workload, = expansion.workloads
    assert (workload.rw, workload.bs) == ("randread", 8192)
    assert dict(workload.options) == {"thread": "1", "flow": "2", "flow_sleep": "100",
                                      "numa_cpu_nodes": "0"}
    assert any("gtod_reduce not used" in n for n in expansion.notes)
    job = job_text(workload, target={"filename": str(tmp_path / "f"), "size": "1m",
                                     "ioengine": "null"}, ramp=0, runtime=1)
    assert "$" not in job and "gtod_reduce" not in job
    (tmp_path / "run.fio").write_text(job)
    assert fio_parse_only(fio, tmp_path / "run.fio").returncode == 0


@pytest.mark.parametrize("name, kind", [
    ("ssd-test.fio", "loaded"), ("fio-rand-read.fio", SCOPE), ("rbd.fio", SCOPE),
    ("gfapi.fio", SAFETY), ("exitwhat.fio", SAFETY), ("flow.fio", SCOPE)])
def test_a_sample_of_fios_examples_each_refusal_says_its_kind(name: str, kind: str) -> None:
    """A sample of fio's examples/ (bench/fio_examples.py counts them all): loaded, or refused
    with the kind at the end of the message."""
    path = FIO_EXAMPLES / name
    if not path.exists():
        pytest.skip(f"{path}: ./setup.sh --dev installs Debian's fio-examples")
    found, why = fio_examples.verdict(path)
    assert found == kind, why
    if kind != "loaded":
        with pytest.raises(JobFileError) as caught:
            workloads(path.read_text(), engine=fio_examples.engine_of(path.read_text()))
        assert str(caught.value).endswith(f"({kind})") and caught.value.kind == kind


def test_logs_are_noted_replaced_and_left_out_in_guests(tmp_path: Path) -> None:
    text = "[j]\nrw=randread\nwrite_lat_log=/etc/lat\nwrite_iops_log\n"
    notes = expand(load_suite(jobfile_suite(tmp_path, {"j.fio": text},
                                            extra='[[part]]\nmode = "guest"\n'))).notes
    assert "job file j.fio: write_lat_log=/etc/lat, write_iops_log replaced by a log in the " \
           "trial's own directory, stored with the run" in notes
    assert any("in guest mode the logs are not written" in n for n in notes)
    host_only = expand(load_suite(jobfile_suite(tmp_path / "h", {"j.fio": text}))).notes
    assert not any("in guest mode" in n for n in host_only)
