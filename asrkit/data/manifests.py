"""Writing and reading Lhotse manifests with asrkit's naming and validation rules.

Names: ``<corpus>_{recordings,supervisions,cuts}_<part>.jsonl.gz`` in one directory.
Every file is written atomically (temporary name, fsync, rename), recordings and supervisions
first and cuts last, so a cuts manifest on disk always means the part is complete.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from typing import Callable, Optional, Sequence

from lhotse import CutSet, RecordingSet, SupervisionSet, load_manifest

from asrkit.utils import atomic_path

logger = logging.getLogger(__name__)


def manifest_path(out_dir: Path | str, corpus: str, kind: str, part: str) -> Path:
    assert kind in ("recordings", "supervisions", "cuts"), kind
    return Path(out_dir) / f"{corpus}_{kind}_{part}.jsonl.gz"


@dataclass
class DropStats:
    """Counts of supervisions dropped while building cuts, by reason (with a few example ids)."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, utt_id: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < 5:
            ex.append(utt_id)

    def __str__(self) -> str:
        if not self.counts:
            return "none dropped"
        return "; ".join(f"{r}: {n} (e.g. {', '.join(self.examples[r])})" for r, n in self.counts.items())


def validate_supervisions(
    recordings: RecordingSet, supervisions: SupervisionSet, min_duration: float = 0.0, where: str = ""
) -> tuple[SupervisionSet, DropStats]:
    """Drop (and count) supervisions with an empty transcript, a missing recording, or a duration
    below ``min_duration``. Missing audio *files* are checked by :func:`check_audio_files`."""
    stats = DropStats()
    kept = []
    rec_ids = set(recordings.ids)  # a set: `in RecordingSet` is a linear scan (quadratic for 281k files)
    for s in supervisions:
        if s.recording_id not in rec_ids:
            stats.add("no recording", s.id)
        elif not (s.text or "").strip():
            stats.add("empty transcript", s.id)
        elif s.duration < min_duration:
            stats.add(f"shorter than {min_duration} s", s.id)
        else:
            kept.append(s)
    if stats.counts:
        logger.warning("%s: dropped supervisions: %s", where, stats)
    return SupervisionSet.from_segments(kept), stats


def check_audio_files(recordings: RecordingSet, where: str = "") -> None:
    """Fail with the file name if any recording's audio file is missing."""
    missing = []
    for r in recordings:
        for src in r.sources:
            if src.type == "file" and not Path(src.source).is_file():
                missing.append(f"{r.id}: {src.source}")
    if missing:
        head = "\n  ".join(missing[:10])
        raise FileNotFoundError(f"{where}: {len(missing)} audio file(s) missing, e.g.:\n  {head}")


def write_part(
    out_dir: Path | str,
    corpus: str,
    part: str,
    recordings: RecordingSet,
    supervisions: SupervisionSet,
    min_duration: float = 0.0,
) -> CutSet:
    """Validate, then write recordings, supervisions and cuts of one part atomically; return the cuts."""
    where = f"{corpus}/{part}"
    check_audio_files(recordings, where)
    supervisions, stats = validate_supervisions(recordings, supervisions, min_duration, where)
    if len(supervisions) == 0:
        raise ValueError(f"{where}: no usable utterances ({stats})")
    used = {s.recording_id for s in supervisions}  # built once, not once per recording
    recordings = RecordingSet.from_recordings(r for r in recordings if r.id in used)
    cuts = (
        CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
        .trim_to_supervisions(keep_overlapping=False)
        .to_eager()  # trim_to_supervisions is lazy in recent Lhotse; len() below needs an eager set
    )
    for kind, manifest in (("recordings", recordings), ("supervisions", supervisions), ("cuts", cuts)):
        with atomic_path(manifest_path(out_dir, corpus, kind, part)) as tmp:
            manifest.to_file(tmp)
    logger.info("%s: %d utterances, %.2f h", where, len(cuts), sum(c.duration for c in cuts) / 3600)
    return cuts


def load_cuts(out_dir: Path | str, corpus: str, part: str) -> CutSet:
    path = manifest_path(out_dir, corpus, "cuts", part)
    if not path.is_file():
        raise FileNotFoundError(f"no cuts manifest {path} (run the data stages first)")
    return load_manifest(path)


def part_done(out_dir: Path | str, corpus: str, part: str) -> bool:
    """Whether ``part`` is prepared: its cuts manifest (written last, atomically) exists."""
    return manifest_path(out_dir, corpus, "cuts", part).is_file()


def prepare_parts(
    out_dir: Path | str,
    corpus: str,
    parts: Sequence[str],
    prepare_one: Callable[[str], CutSet],
    start: Optional[Callable[[list[str]], None]] = None,
    num_jobs: Optional[int] = None,
) -> dict[str, CutSet]:
    """The one loop of every corpus preparer: parts already prepared are loaded (and logged as
    skipped), the others are made by ``prepare_one(part)``, in the order given, each logged with
    its speed (audio files per second, with ``num_jobs`` workers).

    ``start(pending)``, if given, is called once before the first part is made, with the list of
    parts to make (not called when every part is already there): the place to open the corpus
    and to check, for all pending parts at once, that what they need is on disk.
    """
    pending = [p for p in parts if not part_done(out_dir, corpus, p)]
    if pending and start is not None:
        start(pending)
    out: dict[str, CutSet] = {}
    for part in parts:
        if part in pending:
            t0 = time.perf_counter()
            out[part] = prepare_one(part)
            dt = time.perf_counter() - t0
            n = len({c.recording_id for c in out[part]})
            jobs = f", {num_jobs} jobs" if num_jobs else ""
            logger.info("%s/%s: %d audio files in %.1f s (%.1f files/s%s)", corpus, part, n, dt, n / max(dt, 1e-9), jobs)
        else:
            logger.info("%s/%s: manifests exist, skipping", corpus, part)
            out[part] = load_cuts(out_dir, corpus, part)
    return out
