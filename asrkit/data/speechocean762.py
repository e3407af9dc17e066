"""speechocean762 (OpenSLR 101, CC BY 4.0): 5000 read English utterances of 250 Mandarin-L1
speakers (half of them children), 16 kHz mono WAV, as Kaldi data dirs ``train/`` and ``test/``
(``wav.scp`` with paths relative to the corpus root, ``text``, ``utt2spk``, ``spk2utt``,
``spk2gender``, ``spk2age``) and ``WAVE/SPEAKERxxxx/*.WAV``.

Both Kaldi dirs are imported with :func:`asrkit.data.kaldi.import_kaldi_dir` (Lhotse's own
importer, relative paths resolved against the corpus root). The parts:

* ``train``: the training speakers minus the dev speakers;
* ``dev``: a speaker-disjoint dev set carved from the training speakers (:func:`dev_speakers`):
  the training speakers are split into children (``spk2age`` < 18) and adults, each group is
  sorted by speaker id, and from a group of n >= 2 speakers k = max(1, round(n / 10)) are taken at
  the evenly spaced positions ``floor((i + 0.5) * n / k)``, i = 0..k-1 (0-based). On the full
  corpus: 6 of 58 children and 7 of 67 adults, 13 speakers, 260 utterances;
* ``test``: the official test set (125 speakers, disjoint from the training ones);
* ``test_longform``: each test speaker's utterances in utterance-id order, joined into recordings
  of 20-45 s (:func:`group_20_45`: contiguous groups, each 20-45 s, as equal as possible; a
  speaker with less than 20 s has none); the audio files are concatenated as they are, so the
  real pauses (each file's own leading and trailing silence) stay;
* ``test_session``: each test speaker's utterances joined into one recording, the whole session;
* ``train_synth`` (made only when asked for, with ``synth_hours`` > 0): synthetic speech of the
  ``train`` part's transcripts (:mod:`asrkit.data.synth`: espeak-ng, its many voices and random
  prosody, every sentence cycled in a seeded order until ``synth_hours`` of audio), written in
  LibriSpeech's layout under ``synth_dir`` (default ``<out>/../synth``) and imported with Lhotse's
  ``prepare_librispeech``; speaker ids are prefixed ``synth-``. Train on ``train train_synth`` to
  mix it in (the recipe's ``--synth_hours H``).

The long-form recordings are written as 16-bit WAV under ``longform_dir`` (default
``<out>/../longform/<part>/``), each with one supervision: the utterances' texts joined by
spaces (custom field ``segments``: the utterance ids).

With ``kaldi_out`` (default ``<out>/../kaldi``) the split is also written as Kaldi data dirs
``<kaldi_out>/{train,dev,test,test_longform,test_session}`` (``wav.scp`` with absolute paths,
``text`` upper-case as in the corpus, ``utt2spk``, ``spk2utt``, ``spk2gender``), each written to
a temporary directory and renamed, so that another toolkit trains on exactly this split.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

from asrkit.data.kaldi import ImportDataError, import_kaldi_dir, read_table
from asrkit.data.manifests import manifest_path, prepare_parts, write_part
from asrkit.utils import atomic_path

logger = logging.getLogger(__name__)

PARTS = ("train", "dev", "test", "test_longform", "test_session")
#: the optional part of synthetic speech of the training text (``synth_hours`` > 0)
SYNTH_PART = "train_synth"
URL = "https://www.openslr.org/resources/101/speechocean762.tar.gz"
#: children: spk2age below this
ADULT_AGE = 18
LONGFORM_MIN, LONGFORM_MAX = 20.0, 45.0

HOW_TO_GET = (f"get it with the recipe (egs/speechocean762/asr1/run.sh --download true) or from {URL} "
              "(https://www.openslr.org/101/), unpack it and point SPEECHOCEAN762 (or --corpus_dir) at the "
              "speechocean762 folder")


def check_corpus(corpus_dir: Path) -> Path:
    """The corpus root (the folder with ``train/``, ``test/`` and ``WAVE/``); ``corpus_dir`` may
    also be its parent."""
    corpus_dir = Path(corpus_dir)
    for cand in (corpus_dir, corpus_dir / "speechocean762"):
        if (cand / "train" / "wav.scp").is_file() and (cand / "test" / "wav.scp").is_file():
            return cand
    raise FileNotFoundError(f"speechocean762 is not at {corpus_dir} (no train/wav.scp and test/wav.scp there); {HOW_TO_GET}")


def dev_speakers(spk2age: dict[str, int], fraction: float = 0.1) -> list[str]:
    """The dev speakers (module docstring), sorted."""
    out = []
    for group in (sorted(s for s, a in spk2age.items() if a < ADULT_AGE), sorted(s for s, a in spk2age.items() if a >= ADULT_AGE)):
        n = len(group)
        if n < 2:
            continue
        k = max(1, round(n * fraction))
        out += [group[math.floor((i + 0.5) * n / k)] for i in range(k)]
    return sorted(out)


def group_20_45(durations: Sequence[float], lo: float = LONGFORM_MIN, hi: float = LONGFORM_MAX) -> list[tuple[int, int]]:
    """Split a sequence of utterance durations into contiguous groups ``[(i, j), ...]`` (j
    exclusive) of ``lo``..``hi`` seconds each, as equal as possible (least sum of squared
    deviations from the mean group length, over the feasible splits; dynamic programming). Utterances
    that cannot be placed (a total below ``lo``) give no group; a tail that cannot be placed is left
    out (it is still in the session)."""
    n = len(durations)
    cum = [0.0]
    for d in durations:
        cum.append(cum[-1] + d)
    best_cover, best = -1, None
    # groups must cover a prefix 0..m; prefer the longest coverable prefix, then the most even split
    for m in range(n, 0, -1):
        total = cum[m]
        if total < lo:
            break
        k_lo, k_hi = max(1, math.ceil(total / hi - 1e-9)), max(1, math.floor(total / lo + 1e-9))
        for k in range(k_lo, k_hi + 1):
            target = total / k
            inf = float("inf")
            cost = [[inf] * (m + 1) for _ in range(k + 1)]
            back = [[-1] * (m + 1) for _ in range(k + 1)]
            cost[0][0] = 0.0
            for g in range(1, k + 1):
                for j in range(1, m + 1):
                    for i in range(j - 1, -1, -1):
                        length = cum[j] - cum[i]
                        if length > hi + 1e-9:
                            break
                        if length < lo - 1e-9 or cost[g - 1][i] == inf:
                            continue
                        c = cost[g - 1][i] + (length - target) ** 2
                        if c < cost[g][j]:
                            cost[g][j], back[g][j] = c, i
            if cost[k][m] < inf and (best is None or cost[k][m] < best[0]):
                groups, j = [], m
                for g in range(k, 0, -1):
                    i = back[g][j]
                    groups.append((i, j))
                    j = i
                best = (cost[k][m], groups[::-1])
        if best is not None:
            best_cover = m
            break
    if best is None or best_cover <= 0:
        return []
    return best[1]


def _write_joined(recs: list[Recording], path: Path) -> float:
    """Concatenate the recordings' audio as it is (16-bit WAV at their rate); its duration."""
    import numpy as np
    import soundfile as sf

    rate = recs[0].sampling_rate
    chunks = []
    for r in recs:
        assert r.sampling_rate == rate
        data, sr = sf.read(r.sources[0].source, dtype="int16", always_2d=True)
        chunks.append(data[:, 0])
    samples = np.concatenate(chunks)
    with atomic_path(path) as tmp:
        sf.write(str(tmp), samples, rate, subtype="PCM_16", format="WAV")
    return len(samples) / rate


def _joined_part(test_recs: RecordingSet, test_sups: SupervisionSet, out_wav_dir: Path,
                 kind: str) -> tuple[RecordingSet, SupervisionSet]:
    """``test_longform`` (kind ``longform``) or ``test_session`` (kind ``session``) of the test set."""
    by_spk: dict[str, list[SupervisionSegment]] = {}
    for s in test_sups:
        by_spk.setdefault(s.speaker, []).append(s)
    recs, sups = [], []
    for spk in sorted(by_spk):
        utts = sorted(by_spk[spk], key=lambda s: s.id)
        durs = [test_recs[s.recording_id].duration for s in utts]
        groups = group_20_45(durs) if kind == "longform" else [(0, len(utts))]
        for i, j in groups:
            seg = utts[i:j]
            rid = f"{seg[0].id}_{'session' if kind == 'session' else f'lf{len(seg)}'}"
            path = (out_wav_dir / f"{rid}.wav").resolve()
            dur = _write_joined([test_recs[s.recording_id] for s in seg], path)
            rec = Recording.from_file(path, recording_id=rid)
            assert abs(rec.duration - dur) < 1e-6
            recs.append(rec)
            sups.append(SupervisionSegment(
                id=rid, recording_id=rid, start=0.0, duration=rec.duration, channel=0,
                text=" ".join(s.text for s in seg), language=seg[0].language, speaker=spk, gender=seg[0].gender,
                custom={"segments": [s.id for s in seg]}))
    return RecordingSet.from_recordings(recs), SupervisionSet.from_segments(sups)


def write_kaldi_dir(out: Path, recordings: RecordingSet, supervisions: SupervisionSet) -> None:
    """A Kaldi data dir (wav.scp with absolute paths, text, utt2spk, spk2utt, spk2gender) of
    whole-recording supervisions, written to a temporary directory and renamed over ``out``."""
    sups = sorted(supervisions, key=lambda s: s.id)
    for s in sups:
        r = recordings[s.recording_id]
        assert s.start == 0 and abs(s.duration - r.duration) < 1e-3 and s.id == r.id, s.id
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        spk2utt: dict[str, list[str]] = {}
        genders: dict[str, str] = {}
        for s in sups:
            spk2utt.setdefault(s.speaker, []).append(s.id)
            if s.gender:
                genders[s.speaker] = s.gender
        files = {
            "wav.scp": [f"{s.id} {Path(recordings[s.recording_id].sources[0].source).resolve()}" for s in sups],
            "text": [f"{s.id} {s.text}" for s in sups],
            "utt2spk": [f"{s.id} {s.speaker}" for s in sups],
            "spk2utt": [f"{k} {' '.join(v)}" for k, v in sorted(spk2utt.items())],
            "spk2gender": [f"{k} {v}" for k, v in sorted(genders.items())],
        }
        for name, lines in files.items():
            (tmp / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old"
            if old.exists():
                shutil.rmtree(old)
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _synth_part(train_sups: SupervisionSet, synth_dir: Path, hours: float, num_jobs: int) -> tuple[RecordingSet, SupervisionSet]:
    """``train_synth``: espeak-ng speech of the training transcripts (module docstring)."""
    from lhotse.recipes import prepare_librispeech
    from lhotse.utils import fastcopy

    from asrkit.data.librispeech import check_complete
    from asrkit.data.synth import SynthConfig, normalize_sentence, synthesize_corpus

    text = tuple(t for t in (normalize_sentence(s.text or "") for s in sorted(train_sups, key=lambda s: s.id)) if t)
    if not text:
        raise ImportDataError("speechocean762: the train part has no transcript to synthesize")
    config = SynthConfig(seed=0, train_hours=hours, dev_minutes=0.0, test_minutes=0.0, longform_minutes=0.0,
                         jobs=num_jobs, train_text=text)
    libri = synthesize_corpus(synth_dir, config=config)
    m = prepare_librispeech(libri, dataset_parts=["train"], output_dir=None, num_jobs=num_jobs)["train"]
    check_complete("speechocean762", libri / "train", m["recordings"])
    sups = SupervisionSet.from_segments(fastcopy(s, speaker=f"synth-{s.speaker}") for s in m["supervisions"])
    return m["recordings"], sups


def prepare(corpus_dir: Path | str, out_dir: Path | str, parts: Sequence[str] | None = None, num_jobs: int = 2,
            kaldi_out: Optional[Path | str] = None, longform_dir: Optional[Path | str] = None,
            synth_hours: float = 0.0, synth_dir: Optional[Path | str] = None) -> dict[str, CutSet]:
    """``asrkit prepare speechocean762`` (module docstring)."""
    root = check_corpus(Path(corpus_dir))
    out_dir = Path(out_dir)
    parts = list(parts or PARTS)
    unknown = [p for p in parts if p not in PARTS + (SYNTH_PART,)]
    if unknown:
        raise ValueError(f"speechocean762: unknown part(s) {', '.join(unknown)}; valid: {', '.join(PARTS + (SYNTH_PART,))}")
    if SYNTH_PART in parts and not synth_hours > 0:
        raise ValueError(f"speechocean762: part {SYNTH_PART} is synthetic speech of the training text: give its "
                         "amount with --synth-hours H (e.g. --synth-hours 2.6, as much as the real training audio)")
    synth_dir = Path(synth_dir) if synth_dir else out_dir.parent / "synth"
    longform_dir = Path(longform_dir) if longform_dir else out_dir.parent / "longform"
    kaldi_out = Path(kaldi_out) if kaldi_out else out_dir.parent / "kaldi"
    made: dict[str, tuple[RecordingSet, SupervisionSet]] = {}

    def split() -> None:
        if made:
            return
        train_r, train_s = import_kaldi_dir(root / "train", root, 16000, num_jobs)
        test_r, test_s = import_kaldi_dir(root / "test", root, 16000, num_jobs)
        ages = {}
        for line in read_table(root / "train" / "spk2age").values():
            try:
                ages[line.key] = int(line.value)
            except ValueError:
                raise ImportDataError(f"{line.where}: age of speaker '{line.key}' is not a whole number: {line.value!r}") from None
        train_spk = {s.speaker for s in train_s}
        missing = sorted(train_spk - set(ages))
        if missing:
            raise ImportDataError(f"{root / 'train' / 'spk2age'}: no age for speaker(s) {', '.join(missing[:5])}; the dev split needs them")
        shared = train_spk & {s.speaker for s in test_s}
        if shared:
            raise ImportDataError(f"{root}: speaker(s) {', '.join(sorted(shared)[:5])} are in both train and test")
        dev = set(dev_speakers({s: ages[s] for s in train_spk}))
        for name, keep in (("train", lambda s: s.speaker not in dev), ("dev", lambda s: s.speaker in dev)):
            sups = SupervisionSet.from_segments(s for s in train_s if keep(s))
            ids = {s.recording_id for s in sups}
            made[name] = (RecordingSet.from_recordings(r for r in train_r if r.id in ids), sups)
        made["test"] = (test_r, test_s)
        for name, kind in (("test_longform", "longform"), ("test_session", "session")):
            made[name] = _joined_part(test_r, test_s, longform_dir / name, kind)
        n_child = sum(ages[s] < ADULT_AGE for s in dev)
        logger.info("speechocean762: dev speakers (%d children, %d adults): %s", n_child, len(dev) - n_child, " ".join(sorted(dev)))
        if kaldi_out:
            for name in PARTS:
                write_kaldi_dir(kaldi_out / name, *made[name])
            logger.info("speechocean762: Kaldi data dirs of the split in %s", kaldi_out)

    def one(part: str) -> CutSet:
        if part == SYNTH_PART:  # needs the train part's transcripts only: from its manifest when there is one
            sup_path = manifest_path(out_dir, "speechocean762", "supervisions", "train")
            if not made and sup_path.is_file():
                train_sups = SupervisionSet.from_file(sup_path)
            else:
                split()
                train_sups = made["train"][1]
            return write_part(out_dir, "speechocean762", part, *_synth_part(train_sups, synth_dir, synth_hours, num_jobs))
        split()
        return write_part(out_dir, "speechocean762", part, *made[part])

    # the Kaldi dirs are part of the output: their absence makes the split run again
    start = None
    if kaldi_out and not all((kaldi_out / p / "text").is_file() for p in PARTS):
        split()
    return prepare_parts(out_dir, "speechocean762", parts, one, start=start, num_jobs=num_jobs)
