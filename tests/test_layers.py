"""The import contracts of setup.cfg ([importlinter]): layers import only downwards, no package
has import cycles. `lint-imports` (import-linter, a dev dependency) checks the real import graph;
a planted upward import and a planted cycle in a copy of the package show that it can fail."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(root / "setup.cfg"), "--no-cache"], cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=300)


def test_import_contracts_hold():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_import_contracts_catch_an_upward_import_and_a_cycle(tmp_path):
    shutil.copytree(ROOT / "asrkit", tmp_path / "asrkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    asr = tmp_path / "asrkit/model/asr.py"
    asr.write_text(asr.read_text() + "\nfrom asrkit.decode import ctc  # planted upward import\n")
    base = tmp_path / "asrkit/model/posenc/base.py"
    base.write_text(base.read_text() + "\nfrom asrkit.model.posenc import relpos  # planted cycle\n")
    r = _lint(tmp_path)
    assert r.returncode != 0
    assert "asrkit.model is not allowed to import asrkit.decode" in r.stdout
    assert "asrkit.model.asr -> asrkit.decode.ctc" in r.stdout
    assert "No cycles are allowed in asrkit.model.posenc" in r.stdout, r.stdout[-3000:]


def test_no_undefined_or_unused_names():
    """pyflakes rules (ruff F): undefined names (a moved function still called by its old name),
    unused imports and variables. A dev dependency like import-linter."""
    ruff = Path(sys.executable).with_name("ruff")
    r = subprocess.run([str(ruff), "check", "--select", "F", "--no-cache", "--output-format", "concise", "asrkit",
                        "tests"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
