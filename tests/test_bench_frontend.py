"""`asrkit bench frontend` runs and writes its table (the figures themselves are not asserted)."""
from asrkit.bench import frontend


def test_frontend_benchmark_writes_a_row_per_frontend(tmp_path):
    out = tmp_path / "bench.md"
    assert frontend.main(["--reps", "1", "--threads", "1", "--batch-seconds", "2", "--utt-seconds", "1",
                          "--channels", "4", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| conv")]
    assert [r.split(" | ")[0] for r in rows] == ["| conv1d", "| conv2d, 4 channels", "| conv2d, 4 channels, default layout"]
    assert rows[0].endswith("| 1.00x |")
