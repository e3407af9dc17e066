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


# -- properties (hypothesis): what the module promises, on random corpora ----------------------------
# Expected values come from the generated corpus itself (segment order, breaks, gaps, texts), never
# from the functions under test.
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from lhotse import AudioSource, CutSet, MonoCut, Recording, SupervisionSegment  # noqa: E402

from asrkit.data.longform import MAX_GAP  # noqa: E402

PROPS = settings(max_examples=60, derandomize=True, deadline=None, database=None)
SIZES = st.lists(st.sampled_from(WINDOWS) | st.floats(3.0, 60.0).map(lambda x: round(x, 1)),
                 min_size=1, max_size=3, unique=True)


def _cut(rec: Recording, cid: str, start: float, dur: float, text: str, brk: bool = False) -> MonoCut:
    sup = SupervisionSegment(id=cid, recording_id=rec.id, start=0.0, duration=dur, text=text,
                             custom={"break_before": brk})
    return MonoCut(id=cid, start=start, duration=dur, channel=0, recording=rec, supervisions=[sup])


def _rec(rid: str, end: float) -> Recording:
    return Recording(id=rid, sources=[AudioSource(type="file", channels=[0], source=f"/nonexistent/{rid}.wav")],
                     sampling_rate=16000, num_samples=round(end * 16000) + 16000, duration=end + 1.0)


@st.composite
def span_corpora(draw):
    """Talks of time-ordered segments (0.2..25 s, gaps 0..3 s, some breaks, 0..4 unique words),
    handed over in shuffled order. Returns (cuts, runs): runs are the expected id lists."""
    cuts, runs = [], []
    for r in range(draw(st.integers(1, 3))):
        segs = draw(st.lists(st.tuples(st.integers(200, 25000), st.integers(0, 3000), st.booleans(),
                                       st.integers(0, 4)), min_size=1, max_size=14))
        t, rows = 0.0, []
        for i, (dur_ms, gap_ms, brk, n_words) in enumerate(segs):
            start = t + (gap_ms / 1000 if i else 0.0)
            rows.append((f"t{r}-{i:03d}", start, dur_ms / 1000, " ".join(f"t{r}s{i}w{j}" for j in range(n_words)),
                         brk and i > 0))
            t = start + dur_ms / 1000
        rec = _rec(f"talk{r}", t)
        run: list[str] = []
        for j, (cid, start, dur, text, brk) in enumerate(rows):
            if j and (brk or start - (rows[j - 1][1] + rows[j - 1][2]) > MAX_GAP):
                runs.append(run)
                run = []
            run.append(cid)
            cuts.append(_cut(rec, cid, start, dur, text, brk))
        runs.append(run)
    order = draw(st.permutations(range(len(cuts))))
    return CutSet.from_cuts([cuts[i] for i in order]), runs


def _check_windows(sets, cuts, runs, window_len):
    """Each window size: every segment in exactly one window, windows are consecutive pieces of
    one run (never across a break or a gap) in order, the text is the segments' texts joined (so
    no word is lost, duplicated or reordered), at most W long unless one segment, ids and custom
    fields as documented."""
    by_id = {c.id: c for c in cuts}
    all_words = [w for run in runs for i in run for w in by_id[i].supervisions[0].text.split()]
    for w, cs in sets.items():
        pieces = [c.custom["segments"] for c in cs]
        pos = {i: (r, k) for r, run in enumerate(runs) for k, i in enumerate(run)}
        for p in pieces:
            (r0, k0) = pos[p[0]]
            assert [pos[i] for i in p] == [(r0, k0 + j) for j in range(len(p))], p  # consecutive, one run
        assert sorted(i for p in pieces for i in p) == sorted(by_id)  # each segment exactly once
        ordered = sorted(zip(pieces, cs), key=lambda pc: pos[pc[0][0]])
        words = [x for _, c in ordered for x in c.supervisions[0].text.split()]
        assert words == all_words, w
        for p, c in ordered:
            want = " ".join(t for t in (by_id[i].supervisions[0].text for i in p) if t)
            assert c.supervisions[0].text == want
            length = window_len(p)
            assert c.duration == pytest.approx(length, abs=2e-6)
            assert length <= w + 1e-6 or len(p) == 1
            assert c.id == f"{p[0]}_w{w:g}_{len(p)}" and c.custom["window"] == w
            if abs(length - w / 2) > 1e-6:
                assert c.custom["full"] == (length >= w / 2)
            else:  # exactly W/2 (up to the rounding of float sums) counts as full
                assert c.custom["full"]


@PROPS
@given(span_corpora(), SIZES)
def test_span_windows_cover_every_word_once(corpus, sizes):
    cuts, runs = corpus
    by_id = {c.id: c for c in cuts}
    sets = make_windows(cuts, "span", sizes)
    assert sorted(sets) == sorted(sizes)
    _check_windows(sets, cuts, runs, lambda p: by_id[p[-1]].end - by_id[p[0]].start)
    for cs in sets.values():
        for c in cs:  # one contiguous span of the talk
            first = by_id[c.custom["segments"][0]]
            assert c.recording_id == first.recording_id and c.start == pytest.approx(first.start, abs=1e-6)


@st.composite
def append_corpora(draw):
    """LibriSpeech-style chapters: utterances <spk>-<chapter>-<nnnn> with holes in the numbering,
    separate recordings, 0..4 unique words each, shuffled."""
    cuts, runs = [], []
    for ch in range(draw(st.integers(1, 3))):
        nums = sorted(draw(st.sets(st.integers(0, 25), min_size=1, max_size=12)))
        run: list[str] = []
        for j, n in enumerate(nums):
            cid = f"{100 + ch}-{7 * ch + 1}-{n:04d}"
            if j and n != nums[j - 1] + 1:
                runs.append(run)
                run = []
            run.append(cid)
            dur = draw(st.integers(500, 25000)) / 1000
            text = " ".join(f"c{ch}u{n}w{k}" for k in range(draw(st.integers(0, 4))))
            cuts.append(_cut(_rec(cid, dur), cid, 0.0, dur, text))
        runs.append(run)
    order = draw(st.permutations(range(len(cuts))))
    return CutSet.from_cuts([cuts[i] for i in order]), runs


@PROPS
@given(append_corpora(), SIZES)
def test_append_windows_cover_every_word_once(corpus, sizes):
    cuts, runs = corpus
    by_id = {c.id: c for c in cuts}
    sets = make_windows(cuts, "append", sizes)
    _check_windows(sets, cuts, runs, lambda p: sum(by_id[i].duration for i in p))
