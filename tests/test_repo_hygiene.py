"""The repository tracks no recipe outputs (data, experiments) and no symbolic links."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_recipe_outputs_or_links_tracked():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    p = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"git unavailable: {p.stderr.strip()}")
    bad = []
    for line in p.stdout.splitlines():
        mode, path = line.split()[0], line.split("\t", 1)[1]
        if mode == "120000" or re.match(r"egs/[^/]+/asr1/(data|exp|dump|downloads)(/|$)", path):
            bad.append(path)
        # what a recipe dir tracks: its scripts, conf/, README.md and RESULTS.md (the reference figures;
        # stage 6 writes its own side-by-side to exp/RESULTS.md); anything else there is an output
        m = re.match(r"egs/[^/]+/asr1/([^/]+)$", path)
        if m and not (m.group(1).endswith(".sh") or m.group(1) in ("README.md", "RESULTS.md")):
            bad.append(path)
    assert not bad, f"tracked recipe outputs or symlinks (a fresh clone would reuse or dangle them): {bad}"
