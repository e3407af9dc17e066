"""Long-form windows: the same segments and words at every window size, breaks at ignored segments
/ gaps / numbering holes, audio of a window == the segments' audio, deterministic ids, the CLI."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from lhotse import load_manifest

from asrkit.data.audio import load_cut_audio
from asrkit.data.librispeech import _prepare_parts, prepare
from asrkit.data.longform import WINDOWS, build, longform_path, main, make_windows, partition, runs_span
from asrkit.data.tedlium import prepare_v2
from tests.corpora.librispeech import make_librispeech
from tests.corpora.tedlium import make_tedlium


def test_partition_covers_everything_within_the_window():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        d = rng.uniform(0.5, 14, n)
        gaps = rng.uniform(0, 1, n)
        starts, ends, t = [], [], 0.0
        for i in range(n):
            starts.append(t)
            ends.append(t + d[i])
            t += d[i] + gaps[i]
        for w in WINDOWS:
            groups = partition(starts, ends, w)
            assert [i for a, b in groups for i in range(a, b)] == list(range(n))
            for a, b in groups:
                assert b - a == 1 or ends[b - 1] - starts[a] <= w + 1e-6
    assert partition([0.0], [50.0], 10) == [(0, 1)]  # an over-long segment is its own window
    g = partition([0, 6, 12, 18], [6, 12, 18, 24], 20)  # 24 s -> two balanced 12 s windows
    assert g == [(0, 2), (2, 4)]


def _check_same_words(sets, segments):
    seg_words = Counter(w for s in segments for w in s.supervisions[0].text.split())
    seg_ids = sorted(s.id for s in segments)
    for w, cs in sets.items():
        assert Counter(x for c in cs for x in c.supervisions[0].text.split()) == seg_words, w
        assert sorted(i for c in cs for i in c.segments) == seg_ids  # each segment exactly once
        for c in cs:
            assert len(c.supervisions) == 1 and c.window == w
            assert c.supervisions[0].duration == pytest.approx(c.duration)


@pytest.fixture(scope="module")
def ted(tmp_path_factory):
    root = tmp_path_factory.mktemp("tl")
    fx = make_tedlium(root / "c", 2)
    cuts = prepare_v2(root / "c", root / "m", parts=["dev", "test"])
    return root, fx, cuts


def test_tedlium_windows(ted):
    root, fx, cuts = ted
    dev = cuts["dev"]
    sets = make_windows(dev, "span")
    _check_same_words(sets, list(dev))
    by_id = {c.id: c for c in dev}
    for w, cs in sets.items():
        for c in cs:
            segs = [by_id[i] for i in c.segments]
            assert c.start == pytest.approx(segs[0].start) and c.end == pytest.approx(segs[-1].end)
            assert c.supervisions[0].text == " ".join(s.supervisions[0].text for s in segs)
            for a, b in zip(segs, segs[1:]):  # never across an ignored segment or a long gap
                assert not b.supervisions[0].custom["break_before"]
                assert b.start - a.end <= 1.0 + 1e-6
            assert c.duration <= w + 1e-6 or len(segs) == 1
    # breaks exist in the fixture, so runs are more than talks
    assert len(runs_span(dev)) > len({c.recording_id for c in dev})
    # audio of a window = that span of the talk
    c = max(sets[30], key=lambda c: c.duration)
    x = fx.audio[("dev", c.recording_id)]
    a = np.round(load_cut_audio(c) * 32768).astype(np.int16)
    st = round(c.start * 16000)
    assert len(a) == round(c.duration * 16000) and np.array_equal(a, x[st : st + len(a)])


def test_tedlium_build_is_deterministic_and_written(ted, tmp_path):
    root, _, _ = ted
    p1 = build(root / "m", "tedlium2", "test", out_dir=tmp_path / "a")
    p2 = build(root / "m", "tedlium2", "test", out_dir=tmp_path / "b")
    for w in WINDOWS:
        assert p1[w].name == f"tedlium2_cuts_test-longform{w}.jsonl.gz"
        a, b = load_manifest(p1[w]), load_manifest(p2[w])
        assert list(a.ids) == list(b.ids) and [c.to_dict() for c in a] == [c.to_dict() for c in b]


@pytest.fixture(scope="module")
def libri(tmp_path_factory):
    root = tmp_path_factory.mktemp("ls")
    parts = {"dev-clean": {"84": {"121123": 9, "121550": 4}, "174": {"50561": 6}}}
    fx = make_librispeech(root / "c", parts=parts, dur=(2.0, 9.0), skip=("84-121123-0004",))
    cuts = prepare(root / "c", root / "m", parts=["dev-clean"])
    return root, fx, cuts["dev-clean"]


def test_librispeech_windows(libri):
    root, fx, cuts = libri
    sets = make_windows(cuts, "append")
    _check_same_words(sets, list(cuts))
    for w, cs in sets.items():
        for c in cs:
            nums = [int(i.rsplit("-", 1)[1]) for i in c.segments]
            chapters = {i.rsplit("-", 1)[0] for i in c.segments}
            assert len(chapters) == 1 and nums == list(range(nums[0], nums[0] + len(nums)))
            if chapters == {"84-121123"}:  # 84-121123-0004 is missing in the corpus: a break
                assert not (3 in nums and 5 in nums)
            assert c.duration <= w + 1e-6 or len(nums) == 1
            assert c.id == f"{c.segments[0]}_w{w}_{len(nums)}"
    multi = [c for c in sets[45] if len(c.segments) > 1]
    assert multi
    c = multi[0]
    ref = np.concatenate([fx.utts[i][1] for i in c.segments])
    assert np.array_equal(np.round(load_cut_audio(c) * 32768).astype(np.int16), ref)
    assert c.supervisions[0].text == " ".join(fx.utts[i][0] for i in c.segments)


def test_cli_writes_all_windows(libri, capsys):
    root, _, _ = libri
    assert main(["librispeech", "--manifests", str(root / "m"), "--windows", "10", "45"]) == 0
    for w in (10, 45):
        p = longform_path(root / "m", "librispeech", "dev-clean", w)
        assert p.is_file() and len(load_manifest(p)) > 0
    assert "dev-clean 45s" in capsys.readouterr().out


def test_mini_corpus_per_chapter(tmp_path):
    parts = {"dev": {"1": {"10": 5}, "2": {"20": 4}}}
    fx = make_librispeech(tmp_path / "c", parts=parts, dur=(3.0, 8.0))
    _prepare_parts("mini", fx.root, tmp_path / "m", ["dev"], 1)
    paths = build(tmp_path / "m", "mini", "dev", windows=(10, 25))
    for w, p in paths.items():
        cs = load_manifest(p)
        assert sorted(i for c in cs for i in c.segments) == sorted(fx.utts)
