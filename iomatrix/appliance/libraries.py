"""The shared libraries a dynamically linked binary loads, as ``ldd`` resolves them on this host."""

from __future__ import annotations

from pathlib import Path

from iomatrix.appliance.elf import elf_interpreter
from iomatrix.core.errors import EnvironmentProblem
from iomatrix.core.proc import require, run


def library_closure(binary: Path) -> tuple[str, dict[str, Path]]:
    """The ELF interpreter path of ``binary`` and every shared library it loads (by soname);
    ``("", {})`` for a static binary."""
    interpreter = elf_interpreter(binary.read_bytes())
    if interpreter is None:
        return "", {}
    out = run([require("ldd", hint="install libc-bin"), str(binary)], timeout=60).stdout
    libraries: dict[str, Path] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            if parts[2] == "not":
                raise EnvironmentProblem(f"{binary} needs {parts[0]}, which is not installed",
                                         hint=f"reinstall the package that provides {binary}")
            libraries[parts[0]] = Path(parts[2])
    return interpreter, libraries
