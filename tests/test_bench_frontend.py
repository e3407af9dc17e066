"""`asrkit bench frontend` runs and writes its table (the figures themselves are not asserted)."""
import torch

from asrkit.bench import frontend
from asrkit.model.frontend import conv_layout


def test_frontend_benchmark_writes_a_row_per_frontend(tmp_path):
    out = tmp_path / "bench.md"
    assert frontend.main(["--reps", "1", "--threads", "1", "--batch-seconds", "2", "--utt-seconds", "1",
                          "--channels", "4", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| conv")]
    names = [r.split(" | ")[0].removesuffix(" *") for r in rows]
    assert names == ["| conv1d", "| conv2d, 4 channels, channels-last", "| conv2d, 4 channels, default layout"]
    assert rows[0].endswith("| 1.00x |")
    # the layout asrkit runs on this CPU is marked, and only that one
    picked = "default layout" if conv_layout(torch.device("cpu")) == torch.contiguous_format else "channels-last"
    assert [r.split(" | ")[0] for r in rows if r.split(" | ")[0].endswith(" *")] == [f"| conv2d, 4 channels, {picked} *"]
    assert "glibc's default allocator" in out.read_text().splitlines()[0]  # --allocator glibc, as asrkit train
