"""Cost of decoding in decode_info.json: decode seconds and peak memory per set and per duration bin
(asrkit.decode.memory.PeakRss, asrkit.decode.run.decode_set)."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from asrkit.decode.memory import PeakRss
from asrkit.decode.run import _COST_KEYS, _cost_info, decode_set

MB = 1 << 20
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")


@linux_only
def test_peak_is_reset_for_each_measurement():
    mem = PeakRss()
    assert mem.exact and "VmHWM" in mem.method
    mem.start()
    x = np.ones(200 * MB // 8)  # 200 MB touched, then freed
    del x
    peak, delta = mem.stop()
    assert delta >= 190 * MB and peak >= delta
    # a later stretch that allocates little is not charged for the earlier peak
    mem.start()
    y = np.ones(5 * MB // 8)
    del y
    _, delta2 = mem.stop()
    assert delta2 < 20 * MB, delta2


def test_cost_info_per_bin():
    rows = [  # (duration, seconds, peak, delta)
        (5.0, 0.5, 100, 10), (8.0, 0.3, 120, 30), (12.0, 1.0, 150, 50), (30.0, 4.0, 400, 300),
    ]
    results = [{"id": f"u{i}", "duration": d, **dict(zip(_COST_KEYS, (s, p, m)))} for i, (d, s, p, m) in enumerate(rows)]
    info = _cost_info(results, [10.0, 15.0, 20.0], "test")
    assert all(set(r) == {"id", "duration"} for r in results)  # the measurements are taken out
    assert info["decode_seconds"] == pytest.approx(5.8)
    assert info["peak_rss_bytes"] == 400 and info["peak_rss_delta_bytes"] == 300
    bins = {b["label"]: b for b in info["bins"]}
    assert list(bins) == ["<10s", "10-15s", "15-20s", ">=20s"]
    assert bins["<10s"]["utterances"] == 2 and bins["<10s"]["decode_seconds"] == pytest.approx(0.8)
    assert bins["<10s"]["rtf"] == pytest.approx(0.8 / 13) and bins["<10s"]["peak_rss_delta_bytes"] == 30
    assert bins["15-20s"] == {"label": "15-20s", "utterances": 0, "audio_seconds": 0.0, "decode_seconds": 0.0,
                              "rtf": None, "peak_rss_delta_bytes": None}
    assert bins[">=20s"]["rtf"] == pytest.approx(4.0 / 30)


def _cut(d, cid, dur, seed):
    import soundfile as sf
    from lhotse import MonoCut, Recording, SupervisionSegment

    rng = np.random.default_rng(seed)
    x = 0.05 * rng.standard_normal(int(dur * 16000)).astype(np.float32)
    path = d / f"{cid}.flac"
    sf.write(str(path), x, 16000)
    rec = Recording.from_file(str(path), recording_id=cid)
    sup = SupervisionSegment(id=cid, recording_id=cid, start=0.0, duration=rec.duration, text="a b")
    return MonoCut(id=cid, start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=[sup])


def test_decode_set_writes_cost_per_bin(tmp_path):
    from lhotse import CutSet

    from asrkit.model import build_model
    from asrkit.tokenizer import CharTokenizer
    from asrkit.training.checks import load_config

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = load_config(None, ["encoder.d_model=32", "encoder.n_layers=2", "encoder.n_heads=4", "encoder.d_ff=64",
                                 "decode.method=greedy"])
        tok = CharTokenizer()
        torch.manual_seed(0)
        model = build_model(cfg, tok.vocab_size).eval()
        cuts = CutSet.from_cuts([_cut(tmp_path, "a-1-0001", 2.0, 1), _cut(tmp_path, "a-1-0002", 11.0, 2),
                                 _cut(tmp_path, "a-1-0003", 60.0, 3)])
        info = decode_set(model, cfg, tok, cuts, tmp_path / "decode_t", "t", cfg.features.hop)
    finally:
        torch.set_num_threads(n)
    on_disk = json.loads((tmp_path / "decode_t" / "decode_info.json").read_text())
    assert on_disk == json.loads(json.dumps(info))
    rows = [json.loads(x) for x in (tmp_path / "decode_t" / "hyp.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a-1-0001", "a-1-0002", "a-1-0003"]
    assert all(set(r) == {"id", "ref", "hyp", "duration"} for r in rows)  # hyp.jsonl keeps its format
    bins = {b["label"]: b for b in info["bins"]}
    assert [bins[k]["utterances"] for k in ("<10s", "10-15s", "15-20s", ">=20s")] == [1, 1, 0, 1]
    assert 0 < info["decode_seconds"] <= info["wall_seconds"]
    assert sum(b["decode_seconds"] for b in bins.values()) == pytest.approx(info["decode_seconds"])
    assert info["peak_rss_bytes"] > info["peak_rss_delta_bytes"] > 0
    if sys.platform.startswith("linux"):
        # full attention over 60 s (1500 frames x 1500 per head) needs far more than 2 s does
        assert bins[">=20s"]["peak_rss_delta_bytes"] > bins["<10s"]["peak_rss_delta_bytes"] + 4 * MB
