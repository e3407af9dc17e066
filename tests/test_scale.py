"""Corpus size (issue 34): the compact training index (asrkit.data.cut_index) gives what the cuts
in memory give, with its shortcuts checked against the code they stand for; the scale benchmark's
fake LibriSpeech is read by Lhotse's own prepare_librispeech, and its report is written. The
timings themselves are docs/results/scale.md (``python -m asrkit.bench scale``), not tests."""
from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest


def test_letters_fast_path_counts_what_the_tokenizer_gives():
    from asrkit.data.cut_index import _char_ctc_frames
    from asrkit.data.dataset import ctc_min_frames
    from asrkit.tokenizer import CharTokenizer

    rnd = random.Random(0)
    chars = list("abcXYZ  ''-.,0123`|") + ["É", "ß", "İ", "\u212a", "ñ", "Æ", "\u2019", "\t", "\n", "ﬁ", "Ⅻ", "ǅ"]
    for fold in ("none", "ascii"):
        tok = CharTokenizer(fold)
        needs = _char_ctc_frames(tok)
        for _ in range(5000):
            s = "".join(rnd.choice(chars) for _ in range(rnd.randint(0, 30)))
            ids = tok.encode(s)
            assert needs(s) == (len(ids), ctc_min_frames(ids)), (fold, s)


def test_sample_count_rounding_is_lhotses():
    from lhotse.utils import compute_num_samples

    rnd = np.random.default_rng(0)
    durs = list(rnd.uniform(0.1, 35.0, 20000)) + [k / 32000 for k in range(1, 2000)] + [0.5 / 16000, 14.085, 2.03125]
    for d in durs:
        for sr in (8000, 16000, 22050, 44100):
            assert int(round(d * sr, 8) + 0.5) == compute_num_samples(d, sr), (d, sr)


def _manifest(path, n: int, seed: int = 0) -> None:
    """``n`` LibriSpeech-like MonoCut lines (as asrkit's stage 1 writes them)."""
    from lhotse import AudioSource, Recording, SupervisionSegment
    from lhotse.cut import MonoCut

    rng = np.random.default_rng(seed)
    with gzip.open(path, "wt") as f:
        for i in range(n):
            uid = f"{100 + i // 50}-{1000 + i // 50}-{i % 50:04d}"
            d = float(rng.choice([0.2, 1.5, 5.0, 10.5, 12.0, 16.0, 24.5]))
            rec = Recording(uid, [AudioSource("file", [0], f"/LibriSpeech/x/{uid}.flac")], 16000, int(d * 16000), d)
            text = " ".join(rng.choice(["THE", "AND", "OF", "TO", "A", "IT'S", "NAÏVE", "7", "ROCK`N", "Q&A"],
                                       size=int(rng.integers(0, 40))))
            sup = SupervisionSegment(uid, uid, 0.0, d, channel=0, text=text, speaker=uid[:3])
            f.write(json.dumps(MonoCut(uid, 0.0, d, 0, supervisions=[sup], recording=rec).to_dict()) + "\n")


def test_index_is_compact_and_builds_cuts_only_for_batches(tmp_path, monkeypatch):
    from lhotse import load_manifest

    from asrkit.config import FeatureConfig
    from asrkit.data import cut_index
    from asrkit.data.dataset import filter_cuts
    from asrkit.data.sampling import BucketingSampler
    from asrkit.tokenizer import CharTokenizer
    from asrkit.training.state import fingerprints

    (tmp_path / "m").mkdir()
    path = tmp_path / "m" / "ls_cuts_train.jsonl.gz"
    _manifest(path, 3000)
    tok, fc = CharTokenizer(), FeatureConfig()
    idx = cut_index.load_train_index(tmp_path / "m", "ls", ["train"], tok, fc, 3, 0.3, 20.0)
    ref, stats = filter_cuts(load_manifest(path), tok, fc, 3, 0.3, 20.0)
    assert len(idx) == len(ref) and idx.drop_stats.counts == stats.counts and len(stats.counts) >= 3
    assert fingerprints(idx, tok) == fingerprints(ref, tok)
    from asrkit.tokenizer import alphabet_report

    texts = [(c.id, " ".join(s.text for s in c.supervisions if s.text)) for c in ref]
    assert idx.alphabet.to_dict() == alphabet_report(texts).to_dict() and idx.alphabet.utterances > 0
    assert idx.nbytes() / len(idx) < 250  # bytes per utterance (Lhotse cut objects: ~4 KB)
    built = []
    orig = cut_index.CutIndex.get
    monkeypatch.setattr(cut_index.CutIndex, "get", lambda self, ix: built.append(len(ix)) or orig(self, ix))
    s = BucketingSampler(idx, max_duration=100.0, num_buckets=10, seed=1)
    s.set_epoch(1)
    assert built == []  # planning reads the arrays only
    first = next(iter(s))
    assert built == [len(first)] and sum(c.duration for c in first) <= 100.0
    assert [c.to_dict() for c in first] == [ref[c.id].to_dict() for c in first]


def test_index_built_by_several_processes_is_the_one_built_by_one(tmp_path, monkeypatch):
    """Chunks parsed by forked workers give the index one process gives: the same cuts at every
    position (chunks and blocks not aligned: 3000 lines in chunks of 700, some dropped), arrays,
    fingerprints, drop counts with their examples, alphabet report; two manifests, in order."""
    from asrkit.config import FeatureConfig
    from asrkit.data import cut_index
    from asrkit.tokenizer import CharTokenizer

    paths = [tmp_path / "a_cuts_train.jsonl.gz", tmp_path / "b_cuts_train.jsonl.gz"]
    _manifest(paths[0], 3000)
    _manifest(paths[1], 500, seed=1)
    reason = cut_index.train_drop_reason(CharTokenizer(), FeatureConfig().hop, 3, 0.3, 20.0)
    one = cut_index.CutIndex.build(paths, reason, workers=1)
    monkeypatch.setattr(cut_index, "CHUNK", 700)
    many = cut_index.CutIndex.build(paths, reason, workers=3)
    assert 0 < len(many) == len(one) < 3500 and list(many.ids) == list(one.ids)
    for key in ("durations", "num_samples", "sampling_rates", "sources", "starts"):
        assert np.array_equal(getattr(many, key), getattr(one, key)), key
    assert many.data_fingerprints == one.data_fingerprints
    assert many.drop_stats.counts == one.drop_stats.counts and many.drop_stats.examples == one.drop_stats.examples
    assert many.alphabet.to_dict() == one.alphabet.to_dict()
    assert len(many.blocks) > len(one.blocks)  # partial blocks at the chunks' ends
    every = range(len(one))
    assert [c.to_dict() for c in many.get(every)] == [c.to_dict() for c in one.get(every)]


def test_bench_corpus_is_librispeech_for_lhotse_and_the_report_is_written(tmp_path):
    from asrkit.bench import scale
    from asrkit.data.librispeech import prepare
    from asrkit.data.manifests import load_cuts

    libri = scale.make_corpus(tmp_path / "c", 120)
    parts = sorted(p.name for p in libri.iterdir())
    assert parts == sorted(scale.PARTS)
    flacs = list(libri.rglob("*.flac"))
    assert len(flacs) == 120 and all(f.stat().st_nlink > 1 for f in flacs)  # hard links to a few files
    prepare(libri.parent, tmp_path / "m", ["train-960"], num_jobs=1)  # Lhotse's prepare_librispeech
    n = {p: len(load_cuts(tmp_path / "m", "librispeech", p)) for p in scale.PARTS}
    assert sum(n.values()) == 120 and n["train-other-500"] > n["train-clean-100"]
    run = lambda w, m: [{"wall_s": w, "cpu_s": w, "peak_rss_mb": m, "batches": 10}]  # noqa: E731
    row = {"n": 120, "prepare": {"cpu_s": 1, "peak_rss_mb": 200}, "check": {"cpu_s": 2, "peak_rss_mb": 210},
           "fbank": {"cpu_s": 3}, "lhotse": run(1.0, 300), "lhotse_resume": {"cpu_s": 2.0},
           "bucketing_resume": {"cpu_s": 0.5}}
    for k in ("bucketing_cold", "bucketing_warm", "padfree_cold", "padfree_warm"):
        row[k] = run(0.8, 280)
    old = dict(row)  # a row measured before the first start after stage 2 was
    row = dict(row, columns=run(0.5, 250), bucketing_first=run(0.3, 270), padfree_first=run(0.3, 270))
    res = {"cpu": "test", "rows": [old, row, dict(row, n=240)]}
    md = scale.table(res)
    assert "| 120 |" in md and "0.80x / 0.30x / 0.80x, 0.90x" in md and "0.80x / - / 0.80x, 0.93x" in md
    scale.plot(dict(res, rows=res["rows"][1:]), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10000


def test_stored_features_attach_to_the_index(tmp_path):
    """data.features=stored with the compact index: the cuts of a batch come with the store's
    features (absolute paths, readable), the same as FeatureStore.attach gives the cuts in memory;
    a store that lacks a training utterance is refused, naming it."""
    import helpers_train as H
    from asrkit.data.feature_store import FeatureStore
    from asrkit.data.manifests import load_cuts
    from asrkit.tokenizer import load_tokenizer
    from asrkit.training.checks import load_config
    from asrkit.training.inputs import load_data

    corpus = H.build_corpus(tmp_path / "c", n_train=12, n_dev=2)
    ovr = H.overrides(corpus, dev=True, data__features="stored", data__fbank_dir=tmp_path / "fbank")
    H.store_features(ovr)
    cfg = load_config(H.TINY, ovr)
    tok = load_tokenizer(cfg.tokens.path)
    train, _, dev = load_data(cfg, tok)
    assert cfg.data.features == "stored" and train.feature_prefix
    store = FeatureStore.of(cfg.data.fbank_dir, cfg.features)
    ref, why = store.attach(load_cuts(corpus["manifests"], "fx", "train"), "fx", "train")
    got = train.get(range(len(train)))
    assert [c.to_dict() for c in got] == [ref[c.id].to_dict() for c in got]
    assert np.array_equal(got[3].load_features(), ref[got[3].id].load_features())
    # the store lacks one training utterance: refused (data.features=stored), naming it
    from lhotse import load_manifest

    path = store.cuts_path("fx", "train")
    full = load_manifest(path)
    full.filter(lambda c: c.id != got[5].id).to_file(path)
    cfg = load_config(H.TINY, ovr)
    from asrkit.training import TrainingError

    with pytest.raises(TrainingError, match=rf"out of date: utterance '{got[5].id}' is missing there"):
        load_data(cfg, tok)


def test_a_start_after_the_data_stage_parses_no_line_and_filters_as_filter_cuts(tmp_path, monkeypatch):
    """Stage 2 caches the columns of its manifests (asrkit.data.cut_index.manifest_columns); a
    training start with a new tokenizer or filter then only filters arrays (no manifest line parsed)
    and gets what filter_cuts over the cuts gives: kept cuts, drop counts with examples,
    fingerprints, alphabet report, for the letters tokenizer with either fold and for BPE (which
    re-encodes the transcripts). A rewritten manifest invalidates its columns."""
    from lhotse import load_manifest

    from asrkit.config import FeatureConfig
    from asrkit.data import cut_index
    from asrkit.data.dataset import filter_cuts
    from asrkit.tokenizer import CharTokenizer, alphabet_report, train_tokenizer
    from asrkit.training.state import fingerprints

    m = tmp_path / "m"
    m.mkdir()
    path = m / "ls_cuts_train.jsonl.gz"
    _manifest(path, 2500, seed=3)
    cut_index.manifest_columns(path)  # what `asrkit cuts` does after writing a manifest
    cols = list((m / ".index").glob("*.cols.idx"))
    assert len(cols) == 1

    def no_parse(chunk):
        raise AssertionError("a manifest line was parsed at training start")

    monkeypatch.setattr(cut_index, "_parse_chunk", no_parse)
    ref_cuts = load_manifest(path)
    texts = [" ".join(s.text for s in c.supervisions if s.text) for c in ref_cuts]
    bpe = train_tokenizer(texts, "bpe", 40)
    fc = FeatureConfig()
    for tok, stride, lo, hi in ((CharTokenizer(), 3, 0.3, 20.0), (CharTokenizer("ascii"), 4, 0.0, 12.0), (bpe, 4, 1.0, 30.0)):
        idx = cut_index.load_train_index(m, "ls", ["train"], tok, fc, stride, lo, hi)
        ref, stats = filter_cuts(ref_cuts, tok, fc, stride, lo, hi)
        assert list(idx.ids.astype(str)) == [c.id for c in ref]
        assert idx.drop_stats.counts == stats.counts and idx.drop_stats.examples == stats.examples
        assert list(idx.drop_stats.counts) == list(stats.counts)  # in the order filter_cuts meets them
        assert fingerprints(idx, tok) == fingerprints(ref, tok)
        rep = alphabet_report([(c.id, " ".join(s.text for s in c.supervisions if s.text)) for c in ref], tok.fold)
        assert idx.alphabet.to_dict() == rep.to_dict()
        assert [c.to_dict() for c in idx.get([0, 7, len(idx) - 1])] == [ref[i].to_dict() for i in (0, 7, len(idx) - 1)]
    # a drop rule without a vectorized form runs per utterance over the same columns: the same index
    rule = cut_index.train_drop_reason(CharTokenizer(), fc.hop, 3, 0.3, 20.0)
    columns = cut_index.manifest_columns(path)
    fast = cut_index.CutIndex.derive(columns, rule)
    slow = cut_index.CutIndex.derive(columns, lambda *a: rule(*a))
    assert list(slow.ids) == list(fast.ids) and slow.drop_stats.examples == fast.drop_stats.examples
    assert slow.data_fingerprints == fast.data_fingerprints
    # the manifest rewritten: its columns are rebuilt (a line is parsed), the old cache removed
    _manifest(path, 100, seed=4)
    with pytest.raises(AssertionError, match="parsed at training start"):
        cut_index.load_train_index(m, "ls", ["train"], CharTokenizer(), fc, 3, 0.3, 20.0)
    monkeypatch.undo()
    assert len(cut_index.load_train_index(m, "ls", ["train"], CharTokenizer(), fc, 3, 0.3, 20.0)) <= 100
    assert [p.name for p in (m / ".index").glob("*.cols.idx")] != [cols[0].name]
    assert len(list((m / ".index").glob("*.cols.idx"))) == 1
