"""TED-LIUM release 2 and release 3 (legacy split) -> Lhotse manifests.

Layouts::

    TEDLIUM_release2/{train,dev,test}/{sph,stm}/<talk>.{sph,stm}
    TEDLIUM_release-3/legacy/{train,dev,test}/{sph,stm}/<talk>.{sph,stm}   (files or symlinks)

``corpus_dir`` may be the release folder itself or its parent.

Why not call Lhotse's ``prepare_tedlium2`` / ``prepare_tedlium`` directly: they read ``.sph``
metadata through ``sph2pipe`` (not installed here), their STM parser assumes every line has a
``<o,f0,gender>`` label, they keep ``(2)`` variants / ``<sil>`` / trailing ``(id)`` keys in the
text, and their final ``validate_recordings_and_supervisions`` fails on the real corpus, where
some segments end after the audio does. So this module does what they do (recordings of the
``sph/*.sph`` files, one supervision per STM line, ``ignore_time_segment_in_scoring`` lines
skipped) plus:

* audio metadata from the SPHERE header (libsndfile reads the audio later; no sph2pipe);
* STM lines with or without the label field; the label is kept (``custom["label"]``) and its
  gender (``male``/``female``) becomes the supervision's ``gender`` (``M``/``F``);
* text normalization (:func:`normalize_text`): trailing ``(talk-id)`` keys removed, ``word(2)``
  -> ``word``, ``<sil>``, ``<s>``, ``</s>`` and noise tokens (``{NOISE}``, ``{SMACK}``,
  ``[NOISE]`` ...) removed, ``<unk>`` removed unless ``keep_unk``, contractions joined
  (``it 's`` -> ``it's``, a lone ``'`` joined to the next word: ``' cause`` -> ``'cause``);
* segment ends clamped to the audio duration; segments starting after the audio ends, empty
  after normalization or without duration are dropped and counted (logged with examples);
* optional padding of *training* segments as Kaldi's TED-LIUM recipe does (``pad_segments=True``
  extends each segment 0.15 s earlier and 0.1 s later, clamped to the audio; or give a pair);
* ``custom["break_before"]``: whether an ignored or dropped segment lies between this segment
  and the previous kept one of the talk (long-form windows must not span it);
* ids ``<talk>-<start centiseconds, 7 digits>-<end centiseconds>`` (Kaldi style, sortable);
* v2 and v3 audio are never mixed: every audio path of a v3 manifest must resolve to a file
  inside the v3 release folder (symlinks are followed to check), and vice versa.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence, Union

from lhotse import CutSet, RecordingSet, SupervisionSegment, SupervisionSet

from asrkit.data.audio import install_sphere_backend, recording_from_sphere
from asrkit.data.manifests import DropStats, load_cuts, part_done, write_part
from asrkit.data.sphere import SphereError

logger = logging.getLogger(__name__)

PARTS = ("train", "dev", "test")
KALDI_PAD = (0.15, 0.1)

_LABEL = re.compile(r"^<[^<>]*,[^<>]*>$|^<NA>$", re.I)
_VARIANT = re.compile(r"\(\d+\)$")
_KEY = re.compile(r"^\(.*\)$")
_NOISE = re.compile(r"^(\{[^{}]*\}|\[[^\[\]]*\])$")
_DROP_TOKENS = {"<sil>", "<s>", "</s>"}
IGNORE = "ignore_time_segment_in_scoring"


class TedliumError(RuntimeError):
    """The TED-LIUM corpus on disk is incomplete, mixed or malformed."""


def normalize_text(words: Union[str, Sequence[str]], keep_unk: bool = False) -> str:
    """Normalize the words of one STM line (after the label); see the module docstring."""
    toks = words.split() if isinstance(words, str) else list(words)
    if toks and _KEY.match(toks[-1]):
        toks = toks[:-1]
    out: list[str] = []
    pending_quote = False
    for t in toks:
        t = _VARIANT.sub("", t)
        if not t or t in _DROP_TOKENS or _NOISE.match(t) or (t == "<unk>" and not keep_unk):
            continue
        if t == "'":
            pending_quote = True
            continue
        if pending_quote:
            t = "'" + t
            pending_quote = False
        elif t.startswith("'") and len(t) > 1 and out and out[-1] != "<unk>" and t[1].isalpha():
            out[-1] += t
            continue
        out.append(t)
    return " ".join(out)


@dataclasses.dataclass
class StmLine:
    talk: str
    speaker: str
    start: float
    end: float
    label: Optional[str]
    words: list
    line_no: int


def parse_stm(path: Path) -> list[StmLine]:
    """The lines of one STM file (errors name the file and line)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith(";;"):
                continue
            fields = line.split()
            if len(fields) < 5:
                raise TedliumError(f"{path}:{n}: STM line has fewer than 5 fields: {line.strip()[:80]!r}")
            talk, _channel, speaker, start, end, *rest = fields
            try:
                s, e = float(start), float(end)
            except ValueError:
                raise TedliumError(f"{path}:{n}: bad start/end times {start!r} {end!r}")
            label = rest[0] if rest and _LABEL.match(rest[0]) else None
            words = rest[1:] if label is not None else rest
            out.append(StmLine(talk, speaker, s, e, label, words, n))
    return out


def _gender(label: Optional[str]) -> Optional[str]:
    if not label:
        return None
    parts = label.strip("<>").lower().split(",")
    if "female" in parts:
        return "F"
    if "male" in parts:
        return "M"
    return None


def _find_root(corpus_dir: Path, version: int) -> Path:
    corpus_dir = Path(corpus_dir)
    name = "TEDLIUM_release2" if version == 2 else "TEDLIUM_release-3"
    root = corpus_dir / name if (corpus_dir / name).is_dir() else corpus_dir
    if not root.is_dir():
        raise FileNotFoundError(f"TED-LIUM {version} directory {root} does not exist")
    if version == 2 and (root / "legacy").is_dir():
        raise TedliumError(f"{root} has a legacy/ folder: that is TED-LIUM 3, not release 2 (use tedlium3)")
    if version == 3 and not (root / "legacy").is_dir():
        raise TedliumError(f"{root} has no legacy/ folder: not a TED-LIUM 3 release (expected {root}/legacy/{{train,dev,test}})")
    return root


def _part_dir(root: Path, version: int, part: str) -> Path:
    return root / part if version == 2 else root / "legacy" / part


def _recordings(sph_files: list[Path], num_jobs: int) -> RecordingSet:
    def one(p: Path):
        try:
            return recording_from_sphere(p)
        except (SphereError, OSError) as e:
            raise TedliumError(f"unreadable or truncated TED-LIUM audio file {p}: {e}") from e

    with ThreadPoolExecutor(max(1, num_jobs)) as ex:
        recs = list(ex.map(one, sph_files))
    return RecordingSet.from_recordings(recs)


def _check_inside(recordings: RecordingSet, root: Path, version: int) -> None:
    root_r = root.resolve()
    other = 2 if version == 3 else 3
    for r in recordings:
        for s in r.sources:
            target = Path(s.source).resolve()
            if root_r not in target.parents:
                raise TedliumError(
                    f"TED-LIUM {version}: audio of {r.id} ({s.source}) resolves to {target}, outside the release "
                    f"folder {root_r}; release {other} audio must not be mixed in (the releases' audio differs for "
                    "the same talk)"
                )


def prepare_part(
    corpus: str,
    root: Path,
    version: int,
    part: str,
    out_dir: Path,
    num_jobs: int = 2,
    pad: Optional[tuple[float, float]] = None,
    keep_unk: bool = False,
) -> CutSet:
    pdir = _part_dir(root, version, part)
    if not pdir.is_dir():
        raise FileNotFoundError(f"TED-LIUM {version} part directory {pdir} does not exist")
    stms = sorted((pdir / "stm").glob("*.stm"))
    if not stms:
        raise FileNotFoundError(f"TED-LIUM {version} {part}: no STM files in {pdir / 'stm'}")
    sph_by_talk = {p.stem: p for p in sorted((pdir / "sph").glob("*.sph"))}
    missing = [f"{pdir / 'sph' / (s.stem + '.sph')} (for {s})" for s in stms if s.stem not in sph_by_talk]
    if missing:
        raise FileNotFoundError(f"TED-LIUM {version} {part}: {len(missing)} audio file(s) missing: " + "; ".join(missing[:5]))
    extra = sorted(set(sph_by_talk) - {s.stem for s in stms})
    if extra:
        logger.warning("TED-LIUM %d %s: %d audio files without STM, skipped: %s", version, part, len(extra), ", ".join(extra[:5]))
    recordings = _recordings([sph_by_talk[s.stem] for s in stms], num_jobs)
    _check_inside(recordings, root, version)
    stats = DropStats()
    sups: list[SupervisionSegment] = []
    n_clamped = n_unk = 0
    for stm in stms:
        rec = recordings[stm.stem]
        lines = sorted(parse_stm(stm), key=lambda x: (x.start, x.end))
        broken = False
        seen: set[str] = set()
        for ln in lines:
            if ln.talk != stm.stem:
                raise TedliumError(f"{stm}:{ln.line_no}: talk id {ln.talk!r} does not match the file name {stm.stem!r}")
            key = f"{ln.talk}-{int(round(ln.start * 100)):07d}-{int(round(ln.end * 100)):07d}"
            words = ln.words
            if len(words) == 1 and words[0] == IGNORE:
                stats.add("ignore_time_segment_in_scoring", key)
                broken = True
                continue
            n_unk += sum(1 for w in words if w == "<unk>")
            text = normalize_text(words, keep_unk=keep_unk)
            start, end = max(0.0, ln.start), ln.end
            if start >= rec.duration:
                stats.add("starts after the audio ends", key)
                broken = True
                continue
            if end > rec.duration:
                end = rec.duration
                n_clamped += 1
            if not text:
                stats.add("empty after normalization", key)
                broken = True
                continue
            if end - start <= 0:
                stats.add("no duration", key)
                broken = True
                continue
            if pad is not None:
                start, end = max(0.0, start - pad[0]), min(rec.duration, end + pad[1])
            sid = key
            k = 1
            while sid in seen:
                k += 1
                sid = f"{key}-{k}"
            seen.add(sid)
            sups.append(
                SupervisionSegment(
                    id=sid,
                    recording_id=rec.id,
                    start=round(start, 4),
                    duration=round(end - start, 4),
                    channel=0,
                    text=text,
                    language="English",
                    speaker=ln.speaker,
                    gender=_gender(ln.label),
                    custom={"label": ln.label, "break_before": broken},
                )
            )
            broken = False
    where = f"{corpus}/{part}"
    if n_clamped:
        logger.info("%s: %d segment ends clamped to the audio duration", where, n_clamped)
    if n_unk and not keep_unk:
        logger.info("%s: removed %d <unk> tokens", where, n_unk)
    if stats.counts:
        logger.info("%s: segments not used: %s", where, stats)
    return write_part(out_dir, corpus, part, recordings, SupervisionSet.from_segments(sups))


def _prepare(
    version: int,
    corpus_dir: Path | str,
    out_dir: Path | str,
    parts: Optional[Sequence[str]],
    num_jobs: int,
    pad_segments: Union[bool, tuple, None],
    keep_unk: bool,
) -> dict[str, CutSet]:
    install_sphere_backend()
    corpus = f"tedlium{version}"
    out_dir = Path(out_dir)
    parts = list(parts or PARTS)
    for p in parts:
        if p not in PARTS:
            raise ValueError(f"unknown TED-LIUM part {p!r}; valid: {', '.join(PARTS)}")
    pad = KALDI_PAD if pad_segments is True else (tuple(pad_segments) if pad_segments else None)
    root: Optional[Path] = None
    out: dict[str, CutSet] = {}
    for part in parts:
        if part_done(out_dir, corpus, part):
            logger.info("%s/%s: manifests exist, skipping", corpus, part)
            out[part] = load_cuts(out_dir, corpus, part)
            continue
        root = root or _find_root(Path(corpus_dir), version)
        out[part] = prepare_part(
            corpus, root, version, part, out_dir, num_jobs=num_jobs, pad=pad if part == "train" else None, keep_unk=keep_unk
        )
    return out


def prepare_v2(
    corpus_dir: Path | str,
    out_dir: Path | str,
    parts: Optional[Sequence[str]] = None,
    num_jobs: int = 2,
    pad_segments: Union[bool, tuple, None] = False,
    keep_unk: bool = False,
    **_unused,
) -> dict[str, CutSet]:
    """TED-LIUM release 2 -> ``tedlium2_{recordings,supervisions,cuts}_<part>.jsonl.gz``."""
    return _prepare(2, corpus_dir, out_dir, parts, num_jobs, pad_segments, keep_unk)


def prepare_v3(
    corpus_dir: Path | str,
    out_dir: Path | str,
    parts: Optional[Sequence[str]] = None,
    num_jobs: int = 2,
    pad_segments: Union[bool, tuple, None] = False,
    keep_unk: bool = False,
    **_unused,
) -> dict[str, CutSet]:
    """TED-LIUM release 3, legacy split -> ``tedlium3_{recordings,supervisions,cuts}_<part>.jsonl.gz``."""
    return _prepare(3, corpus_dir, out_dir, parts, num_jobs, pad_segments, keep_unk)
