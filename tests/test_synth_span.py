"""mini's ``test-span`` part (2-45 s files, every duration bin filled) and whole-recording
long-form windows: the recipe's evaluation sets cover the four bins with >= 1000 words each, the
other parts do not change when it is added, and the files lie in the bins they were planned for."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from lhotse import load_manifest

from asrkit.data import synth
from asrkit.data.librispeech import _prepare_parts
from asrkit.data.longform import WHOLE, build, longform_path, parse_window, window_name
from asrkit.scoring import DEFAULT_BINS, bin_index

ROOT = Path(__file__).resolve().parents[1]
ONLY_SPAN = dict(train_hours=0, dev_minutes=0, test_minutes=0, longform_minutes=0)


def _recipe_span_minutes() -> float:
    """The ``--span-minutes`` that egs/mini/asr1/run.sh synthesizes."""
    m = re.search(r"--span-minutes ([0-9.]+)", (ROOT / "egs/mini/asr1/run.sh").read_text())
    assert m, "egs/mini/asr1/run.sh does not pass --span-minutes"
    return float(m.group(1))


def _meta(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "synth_utts" / f"{synth.SPAN_PART}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def recipe_span(tmp_path_factory) -> Path:
    """test-span exactly as the mini recipe makes it (seed 0)."""
    return synth.synthesize_corpus(tmp_path_factory.mktemp("span"), seed=0, jobs=2,
                                   span_minutes=_recipe_span_minutes(), **ONLY_SPAN)


def test_recipe_span_fills_every_bin(recipe_span):
    meta = _meta(recipe_span)
    words, seconds = Counter(), Counter()
    for m in meta:
        b = bin_index(m["duration"], DEFAULT_BINS)
        words[b] += m["num_words"]
        seconds[b] += m["duration"]
        assert 2.0 <= m["duration"] < 45.0, m["id"]
        assert m["text"] == " ".join(m["sentences"]).upper()
    assert sorted(words) == [0, 1, 2, 3]
    assert min(words.values()) >= 1000, words
    assert max(seconds.values()) < 1.25 * min(seconds.values()), seconds  # stratified: similar audio per bin
    # chapters of about 4 minutes: the whole-recording windows are longer than 120 s
    chapters = Counter()
    for m in meta:
        chapters[m["chapter"]] += m["duration"]
    assert len(chapters) >= 8 and min(chapters.values()) > 150.0
    assert len({m["speaker"] for m in meta}) >= 8


def test_files_lie_in_their_planned_bins(recipe_span):
    plan = synth.plan_corpus(synth.SynthConfig(seed=0, span_minutes=_recipe_span_minutes(), **ONLY_SPAN))
    targets = {u.utt_id: u.target for c in plan[synth.SPAN_PART].chapters for u in c.utterances}
    for m in _meta(recipe_span):
        lo, hi = synth.target_bounds(targets[m["id"]])
        assert lo <= m["duration"] < hi, (m["id"], m["duration"], lo, hi)


def test_adding_span_changes_no_other_part():
    for seed, hours in ((0, 12.0), (3, 0.5)):
        without = synth.SynthConfig(seed=seed, train_hours=hours)
        with_span = synth.SynthConfig(seed=seed, train_hours=hours, span_minutes=32)
        a, b = synth.plan_corpus(without), synth.plan_corpus(with_span)
        assert synth.SPAN_PART not in a and synth.SPAN_PART in b
        for part in synth.PARTS:
            assert a[part].fingerprint(without) == b[part].fingerprint(with_span), (seed, part)
    # the mini recipe's corpus (seed 0, 12 h): the fingerprints its synth_info.json records
    cfg = synth.SynthConfig(seed=0, train_hours=12.0, span_minutes=32)
    assert synth.plan_corpus(cfg)["train"].fingerprint(cfg) == "dbe5ba6478f34054"


def test_span_sentences_are_held_out():
    plan = synth.plan_corpus(synth.SynthConfig(seed=0, train_hours=1.0, span_minutes=10))
    sents = {p: {s for c in pl.chapters for u in c.utterances for s in u.sentences} for p, pl in plan.items()}
    for part in synth.PARTS:
        assert sents[synth.SPAN_PART].isdisjoint(sents[part]), part


def test_whole_recording_windows(tmp_path):
    root = synth.synthesize_corpus(tmp_path / "c", seed=2, jobs=2, span_minutes=3, **ONLY_SPAN)
    _prepare_parts("mini", root, tmp_path / "m", [synth.SPAN_PART], 1)
    paths = build(tmp_path / "m", "mini", synth.SPAN_PART, windows=(60, WHOLE))
    assert paths[WHOLE] == longform_path(tmp_path / "m", "mini", synth.SPAN_PART, WHOLE)
    assert paths[WHOLE].name == "mini_cuts_test-span-longformwhole.jsonl.gz"
    meta = _meta(root)
    whole = load_manifest(paths[WHOLE])
    # one window per chapter, each holding the chapter's files in order
    assert len(whole) == len({m["chapter"] for m in meta})
    for c in whole:
        assert c.window is None and c.whole and "_wwhole_" in c.id
        chapter = [m for m in meta if m["id"].rsplit("-", 1)[0] == c.segments[0].rsplit("-", 1)[0]]
        assert c.segments == [m["id"] for m in chapter]
        assert c.duration == pytest.approx(sum(m["duration"] for m in chapter), abs=1e-3)
    w60 = load_manifest(paths[60])
    assert all(c.window == 60 for c in w60) and len(w60) > len(whole)
    assert sorted(s for c in w60 for s in c.segments) == sorted(s for c in whole for s in c.segments)


def test_window_names():
    assert parse_window("whole") == WHOLE and parse_window("60") == 60.0
    assert window_name(WHOLE) == "whole" and window_name(60.0) == "60" and window_name(12.5) == "12.5"
    for bad in ("0", "-5", "nan", "inf", "long"):
        with pytest.raises(ValueError, match="positive seconds .* or 'whole'"):
            parse_window(bad)
