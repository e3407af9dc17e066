#!/usr/bin/env python3
"""Print a PATH that holds only the programs the project may take from the machine.

    PATH=$(python3 tools/ci_path.py [DIR])

Makes DIR (default: a fresh temporary directory) with a link to every program of the Debian
packages named in tools/system-packages.txt (found through dpkg's file lists; alternatives such
as ``c++`` and ``awk`` are followed to the package that owns their target) and to the Python
interpreter this script runs with, and prints it. `.ci/run` runs the test suite under it, so a
test or recipe that runs a program neither the base image nor tools/setup.sh provides fails here
as on a fresh machine ("command not found"), even where someone installed it by hand.
Standard library only: it runs before the virtualenv exists.
"""
from __future__ import annotations

import fnmatch
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DPKG_INFO = Path("/var/lib/dpkg/info")
BIN_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")


def allowed_patterns(path: Path = ROOT / "tools" / "system-packages.txt") -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def package_files(patterns: list[str]) -> set[str]:
    """Real paths of every file that a matching installed package owns."""
    files: set[str] = set()
    for lst in DPKG_INFO.glob("*.list"):
        pkg = lst.stem.split(":", 1)[0]
        if any(fnmatch.fnmatchcase(pkg, p) for p in patterns):
            for line in lst.read_text(errors="replace").splitlines():
                if line.startswith(BIN_DIRS):
                    files.add(os.path.realpath(line))
    return files


def build(out: Path, patterns: list[str]) -> list[str]:
    owned = package_files(patterns)
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for d in BIN_DIRS:
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            src = os.path.join(d, name)
            link = out / name
            if link.exists() or link.is_symlink():
                continue
            real = os.path.realpath(src)
            if real in owned and os.access(real, os.X_OK) and os.path.isfile(real):
                link.symlink_to(src)
                made.append(name)
    for name in ("python3", "python"):  # the interpreter that makes the venv (pyenv's, the image's...)
        link = out / name
        if link.is_symlink():
            link.unlink()
        link.symlink_to(sys.executable)
    return made


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="asrkit-ci-path-"))
    if not DPKG_INFO.is_dir():
        print(f"tools/ci_path.py: {DPKG_INFO} not found (not a Debian system): leaving PATH as it is",
              file=sys.stderr)
        print(os.environ.get("PATH", ""))
        return 0
    made = build(out, allowed_patterns())
    print(f"tools/ci_path.py: {len(made)} programs of tools/system-packages.txt in {out}", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
