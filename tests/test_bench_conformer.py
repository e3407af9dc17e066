"""``python -m asrkit.bench conformer`` on tiny models: its batch and its report (figures not asserted)."""
from pathlib import Path

from asrkit.bench import conformer
from asrkit.training.checks import load_config

MINI = Path(__file__).resolve().parents[1] / "egs" / "mini" / "asr1" / "conf"
TINY = ["data.max_duration=6", "encoder.d_model=16", "encoder.d_ff=32", "encoder.n_heads=2", "encoder.n_layers=1",
        "frontend.channels=4"]


def test_padded_batch_fills_max_duration_with_padded_utterances():
    cfg = load_config(MINI / "train_conformer.yaml", ["data.max_duration=30"])
    b = conformer.padded_batch(cfg, 3.0, 6.0)
    lens = b["feat_lens"]
    hop = cfg.features.hop
    assert 30 - 6 < float(lens.sum()) * hop <= 30
    assert all(300 <= int(n) <= 600 for n in lens)
    assert b["feats"].shape[1] == int(lens.max())
    for i, n in enumerate(lens.tolist()):  # padded frames are zero
        assert float(b["feats"][i, n:].abs().sum()) == 0.0
    assert (b["target_lens"] <= lens // 8).all() and b["targets"].shape[0] == len(lens)


def test_conformer_benchmark_writes_its_tables(tmp_path):
    out = tmp_path / "bench.md"
    args = ["--warmup", "1", "--rounds", "2", "--threads", "1", "--peak-seconds", "0.05", "--no-profile",
            "--min-s", "1", "--max-s", "1.5", "--out", str(out)]
    for s in TINY:
        args += ["--set", s]
    assert conformer.main(args) == 0
    text = out.read_text()
    assert "A / B:" in text and "GFLOP/s" in text
    assert "| A: train_conformer.yaml | frontend | " in text
    assert "| A: train_conformer.yaml | conv modules | " in text
    assert "| B: train.yaml | conv modules | " not in text  # the Transformer has none
