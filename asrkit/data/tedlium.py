"""TED-LIUM release 2 and release 3 (legacy split) -> Lhotse manifests, with the utterances,
ids and texts of the Kaldi / ESPnet recipes.

Layouts::

    TEDLIUM_release2/{train,dev,test}/{sph,stm}/<talk>.{sph,stm}
    TEDLIUM_release-3/legacy/{train,dev,test}/{sph,stm}/<talk>.{sph,stm}   (files or symlinks)

``corpus_dir`` may be the release folder itself or its parent. Any folder or file may be a
symbolic link to another disk; links are followed wherever they point.

The reference is Kaldi's ``egs/tedlium/s5_r2/local/prepare_data.sh`` (+ ``join_suffix.py``),
which ESPnet's ``egs2/tedlium2/asr1/local/prepare_data.sh`` repeats and extends by dropping
duplicated STM lines. Per STM line, as they do (re-implemented from their behaviour; the tests
compare with their output on real STM lines):

* the line's words are edited as their ``sed`` does: pronunciation variants ``(2)`` and
  ``<sil>`` are removed, and a trailing ``(talk-key)``;
* a line identical to another one is dropped (ESPnet), counted in the log;
* suffixes are joined to the token before them (``join_suffix.py``): a token starting with an
  apostrophe is appended to the one before it, the label field included: ``it 's`` -> ``it's``,
  ``we ' cause`` -> ``we' cause``, ``wait 'til`` -> ``wait'til``, ``the '60s`` -> ``the'60s``;
  a segment whose first word starts with an apostrophe loses that word (it is glued to the
  label), so a segment that is only ``'s`` has no words;
* a line holding ``ignore_time_segment_in_scoring`` is not an utterance;
* the id is ``<talk>-<start>-<end>`` with the times in centiseconds, **truncated** and written
  with 7 digits (awk's ``%07d`` of ``time * 100``: 40.05 s -> ``0004004``);
* the label field is any ``<...>`` token in field 6 (``<o,f0,male>``, ``<o,f0,female>``,
  ``<o,,unknown>``, ``<F0_M>``, ``<F0_F>``, ``<NA>``); its gender becomes the supervision's
  ``gender`` (``M``/``F``) and the label is kept in ``custom["label"]``. Kaldi takes field 6 as
  the label whatever it is; here a line whose field 6 is not ``<...>`` (none in the releases)
  is taken to have no label.

Then asrkit's own steps (each counted in the log; docs/corpora.md lists them as deviations):

* :func:`normalize_text` removes the tokens that are not speech: noise tags (``{NOISE}``,
  ``[NOISE]``, also with a joined suffix), ``<s>``, ``</s>``, and ``<unk>`` (also ``<unk>'s``)
  unless ``keep_unk``;
* a segment with no words left, starting after the audio ends, or without duration is dropped;
  segment ends after the audio are clamped to it; segment times are the STM's (Kaldi's
  ``segments`` use the truncated id times);
* two different lines with the same id get ``-2``, ``-3`` ... appended to the later ones;
* optional padding of *training* segments as Kaldi's recipe does (``pad_segments=True``:
  0.15 s earlier, 0.1 s later, by the rules of Kaldi's ``extend_segment_times.py``: segments
  that would overlap meet at the midpoint; ends also clamped to the audio);
* ``custom["break_before"]``: whether an ignored or dropped segment lies between this segment
  and the previous kept one of the talk (long-form windows must not span it);
* audio metadata from the SPHERE header (libsndfile reads the audio later; no sph2pipe);
* release 2 and release 3 audio are never mixed, judged by what the files are: a release-3
  ``legacy/`` file must be the same audio (same file, or same SPHERE header and size) as the
  release's own ``data/sph/<talk>.sph`` where that exists; a release-2 folder must not hold a
  ``legacy/`` folder. A broken symbolic link is named, with its target.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence, Union

from lhotse import CutSet, RecordingSet, SupervisionSegment, SupervisionSet

from asrkit.data.audio import install_sphere_backend, recording_from_sphere
from asrkit.data.manifests import DropStats, prepare_parts, write_part
from asrkit.data.sphere import SphereError, read_header

logger = logging.getLogger(__name__)

PARTS = ("train", "dev", "test")
KALDI_PAD = (0.15, 0.1)
#: Kaldi's extend_segment_times.py default --last-segment-end-padding (prepare_data.sh keeps it)
KALDI_LAST_END_PAD = 0.1
IGNORE = "ignore_time_segment_in_scoring"

_AWK_FS = re.compile(r"[ \t\n]+")  # awk's default field separator
_LABEL = re.compile(r"^<[^<>]*>$")
_TEXT_TAGS = frozenset({"<unk>", "<sil>", "<s>", "</s>"})  # <...> tokens that are words, not labels
# the sed of prepare_data.sh: 's:([0-9])::g' 's:<sil>::g' 's:([^ ]*)$::'
_VARIANT = re.compile(r"\([0-9]\)")
_KEY = re.compile(r"\([^ ]*\)$")
_NOISE = re.compile(r"^\[[^\[\]]*\]('.*)?$")  # after {} -> []: [NOISE], [NOISE]'s
_UNK = re.compile(r"^<unk>('.*)?$")


class TedliumError(RuntimeError):
    """The TED-LIUM corpus on disk is incomplete, mixed or malformed."""


def kaldi_line_edits(line: str) -> str:
    """The ``sed`` of Kaldi's / ESPnet's ``prepare_data.sh`` on one STM line (release-2 rules)."""
    return _KEY.sub("", _VARIANT.sub("", line).replace("<sil>", ""))


def join_suffix(tokens: Sequence[str]) -> list[str]:
    """Kaldi's / ESPnet's ``join_suffix.py`` on a token list: a token that starts with an
    apostrophe is appended to the token before it (pairs only: ``a 'b 'c`` -> ``a'b 'c``)."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        if i + 1 < len(tokens) and tokens[i + 1].startswith("'"):
            out.append(tokens[i] + tokens[i + 1])
            i += 2
        else:
            out.append(tokens[i])
            i += 1
    return out


def kaldi_words(words: Sequence[str], label: Optional[str]) -> list[str]:
    """The words of Kaldi's ``text`` for a line (after :func:`kaldi_line_edits`): suffixes joined
    with the label field in front (a first word that is a suffix is glued to the label and
    lost, as in Kaldi), ``{`` ``}`` turned into ``[`` ``]``."""
    tokens = join_suffix(([label] if label else []) + list(words))
    if label:
        tokens = tokens[1:]
    return [t.replace("{", "[").replace("}", "]") for t in tokens]


def remove_non_speech(words: Sequence[str], keep_unk: bool = False) -> list[str]:
    """asrkit's removal of the tokens that are not speech (module docstring)."""
    return [
        w for w in words
        if w not in ("<s>", "</s>") and not _NOISE.match(w) and (keep_unk or not _UNK.match(w))
    ]


def normalize_text(words: Union[str, Sequence[str]], keep_unk: bool = False, label: Optional[str] = None) -> str:
    """The text asrkit keeps for the words of one STM line (after its label): Kaldi's edits and
    suffix joining (:func:`kaldi_line_edits`, :func:`kaldi_words`), then
    :func:`remove_non_speech`."""
    text = words if isinstance(words, str) else " ".join(words)
    toks = [t for t in _AWK_FS.split(kaldi_line_edits(text)) if t]
    return " ".join(remove_non_speech(kaldi_words(toks, label), keep_unk))


@dataclasses.dataclass
class StmLine:
    """One STM line after Kaldi's edits (:func:`kaldi_line_edits`)."""

    talk: str
    speaker: str
    start: float
    end: float
    label: Optional[str]
    words: list
    line_no: int
    ignored: bool  # holds ignore_time_segment_in_scoring (Kaldi drops such lines with grep -v)
    key: tuple  # what ESPnet compares to find duplicated lines (all fields but the channel)
    utt_id: str  # Kaldi's id: <talk>-<start>-<end>, centiseconds truncated, 7 digits


def kaldi_utt_id(talk: str, start: str, end: str) -> str:
    """``<talk>-%07d-%07d`` of start and end times 100, truncated, as Kaldi's awk prints them."""
    return f"{talk}-{int(float(start) * 100):07d}-{int(float(end) * 100):07d}"


def parse_stm(path: Path) -> list[StmLine]:
    """The lines of one STM file, after Kaldi's edits (errors name the file and line)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, raw in enumerate(f, 1):
            line = kaldi_line_edits(raw.rstrip("\n"))
            if line.startswith(";;"):
                continue
            fields = [t for t in _AWK_FS.split(line) if t]
            if not fields:
                continue
            if len(fields) < 5:
                raise TedliumError(f"{path}:{n}: STM line has fewer than 5 fields: {raw.strip()[:80]!r}")
            talk, _channel, speaker, start, end, *rest = fields
            try:
                s, e = float(start), float(end)
            except ValueError:
                raise TedliumError(f"{path}:{n}: bad start/end times {start!r} {end!r}") from None
            label = rest[0] if rest and _LABEL.match(rest[0]) and rest[0] not in _TEXT_TAGS else None
            words = rest[1:] if label is not None else rest
            out.append(
                StmLine(talk, speaker, s, e, label, words, n, IGNORE in line, (talk, *fields[2:]),
                        kaldi_utt_id(talk, start, end))
            )
    return out


def gender_of(label: Optional[str]) -> Optional[str]:
    """``M`` / ``F`` from an STM label (``<o,f0,male>``, ``<F0_F>``), else ``None`` (``<NA>``,
    ``<o,,unknown>``)."""
    if not label:
        return None
    last = re.split(r"[,_]", label.strip("<>"))[-1].lower()
    return {"male": "M", "m": "M", "female": "F", "f": "F"}.get(last)


def extend_segment_times(
    segs: list[tuple[float, float]], start_pad: float, end_pad: float, duration: float
) -> list[tuple[float, float]]:
    """Pad the segments of one recording as Kaldi's ``utils/data/extend_segment_times.py`` does
    (``--last-segment-end-padding 0.1``, ``--fix-overlapping-segments true``): in order of their
    midpoints, starts move ``start_pad`` earlier (not below 0), ends ``end_pad`` later (not past
    the last end + 0.1 s, and here not past the audio), and two neighbours that then overlap
    meet at the midpoint between them. Returns the new ``(start, end)`` in the input order."""
    if not segs:
        return []
    order = sorted(range(len(segs)), key=lambda i: 0.5 * (segs[i][0] + segs[i][1]))
    max_time = min(max(e for _, e in segs) + KALDI_LAST_END_PAD, duration)
    new = [[max(0.0, s - start_pad), min(max_time, e + end_pad)] for s, e in segs]
    for a, b in zip(order, order[1:]):
        if new[a][1] > new[b][0]:
            mid = 0.5 * (new[a][1] + new[b][0])
            new[a][1] = new[b][0] = mid
    return [(s, e) for s, e in new]


def _find_root(corpus_dir: Path, version: int) -> Path:
    corpus_dir = Path(corpus_dir)
    name = "TEDLIUM_release2" if version == 2 else "TEDLIUM_release-3"
    _check_link(corpus_dir / name)
    root = corpus_dir / name if (corpus_dir / name).is_dir() else corpus_dir
    _check_link(root)
    if not root.is_dir():
        raise FileNotFoundError(f"TED-LIUM {version} directory {root} does not exist")
    if version == 2 and (root / "legacy").is_dir():
        raise TedliumError(f"{root} has a legacy/ folder: that is TED-LIUM 3, not release 2 (use tedlium3)")
    if version == 3 and not (root / "legacy").is_dir():
        _check_link(root / "legacy")
        raise TedliumError(f"{root} has no legacy/ folder: not a TED-LIUM 3 release (expected {root}/legacy/{{train,dev,test}})")
    return root


def _check_link(p: Path) -> None:
    """A symbolic link whose target does not exist is an error naming the link and the target."""
    if p.is_symlink() and not p.exists():
        raise TedliumError(
            f"{p} is a broken symbolic link: it points to {os.readlink(p)}, which resolves to "
            f"{os.path.realpath(p)}, which does not exist (mount the disk it is on, or fix the link)"
        )


def _part_dir(root: Path, version: int, part: str) -> Path:
    return root / part if version == 2 else root / "legacy" / part


def _recordings(sph_files: list[Path], num_jobs: int) -> RecordingSet:
    def one(p: Path):
        _check_link(p)
        try:
            return recording_from_sphere(p)
        except (SphereError, OSError) as e:
            raise TedliumError(f"unreadable or truncated TED-LIUM audio file {p}: {e}") from e

    with ThreadPoolExecutor(max(1, num_jobs)) as ex:
        recs = list(ex.map(one, sph_files))
    return RecordingSet.from_recordings(recs)


def _same_audio(a: Path, b: Path) -> bool:
    """Whether two SPHERE files are the same audio: the same file, or equal headers and sizes."""
    if os.path.samefile(a, b):
        return True
    ha, hb = read_header(a), read_header(b)
    return ha.fields == hb.fields and a.stat().st_size == b.stat().st_size


def _check_release3_audio(root: Path, sph_files: list[Path]) -> None:
    """A release-3 legacy/ file must be the release's own audio of that talk (data/sph/), where
    the release has it: release-2 audio of the same talk differs (another length, other times)."""
    own_dir = root / "data" / "sph"
    for p in sph_files:
        own = own_dir / p.name
        if not own.exists() or _same_audio(p, own):
            continue
        hp, ho = read_header(p), read_header(own)
        raise TedliumError(
            f"TED-LIUM 3: {p} (-> {os.path.realpath(p)}) is not the release's own audio of talk {p.stem}: "
            f"{own} (-> {os.path.realpath(own)}) has another header ({hp.sample_count} vs {ho.sample_count} samples) "
            "or size. Releases 2 and 3 have different audio for the same talk; link legacy/ to the release-3 files."
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
    for d in (pdir, pdir / "stm", pdir / "sph"):
        _check_link(d)
    if not pdir.is_dir():
        raise FileNotFoundError(f"TED-LIUM {version} part directory {pdir} does not exist")
    stms = sorted((pdir / "stm").glob("*.stm"))
    if not stms:
        raise FileNotFoundError(f"TED-LIUM {version} {part}: no STM files in {pdir / 'stm'}")
    for s in stms:
        _check_link(s)
    sph_by_talk = {p.stem: p for p in sorted((pdir / "sph").glob("*.sph"))}
    missing = [f"{pdir / 'sph' / (s.stem + '.sph')} (for {s})" for s in stms if s.stem not in sph_by_talk]
    if missing:
        raise FileNotFoundError(f"TED-LIUM {version} {part}: {len(missing)} audio file(s) missing: " + "; ".join(missing[:5]))
    extra = sorted(set(sph_by_talk) - {s.stem for s in stms})
    if extra:
        logger.warning("TED-LIUM %d %s: %d audio files without STM, skipped: %s", version, part, len(extra), ", ".join(extra[:5]))
    sph_files = [sph_by_talk[s.stem] for s in stms]
    recordings = _recordings(sph_files, num_jobs)
    if version == 3:
        _check_release3_audio(root, sph_files)
    stats = DropStats()
    sups: list[SupervisionSegment] = []
    n_clamped = n_unk = n_renamed = 0
    for stm in stms:
        rec = recordings[stm.stem]
        lines = sorted(parse_stm(stm), key=lambda x: (x.start, x.end))
        kept: list[tuple[StmLine, str, float, float, bool]] = []
        broken = False
        seen_lines: set[tuple] = set()
        for ln in lines:
            if ln.talk != stm.stem:
                raise TedliumError(f"{stm}:{ln.line_no}: talk id {ln.talk!r} does not match the file name {stm.stem!r}")
            if ln.key in seen_lines:
                stats.add("duplicated STM line", f"{stm.name}:{ln.line_no}")
                continue
            seen_lines.add(ln.key)
            if ln.ignored:
                stats.add(IGNORE, ln.utt_id)
                broken = True
                continue
            words = kaldi_words(ln.words, ln.label)
            n_unk += sum(1 for w in words if _UNK.match(w))
            text = " ".join(remove_non_speech(words, keep_unk))
            start, end = max(0.0, ln.start), ln.end
            if start >= rec.duration:
                stats.add("starts after the audio ends", ln.utt_id)
                broken = True
                continue
            if end > rec.duration:
                end = rec.duration
                n_clamped += 1
            if not text:
                stats.add("no words (after removing non-speech tokens)", ln.utt_id)
                broken = True
                continue
            if end - start <= 0:
                stats.add("no duration", ln.utt_id)
                broken = True
                continue
            kept.append((ln, text, start, end, broken))
            broken = False
        if pad is not None:
            times = extend_segment_times([(s, e) for _, _, s, e, _ in kept], pad[0], pad[1], rec.duration)
            kept = [(ln, text, s, e, b) for (ln, text, _, _, b), (s, e) in zip(kept, times)]
        ids: set[str] = set()
        for ln, text, start, end, brk in kept:
            if end - start <= 0:
                stats.add("no duration after padding", ln.utt_id)
                continue
            sid, k = ln.utt_id, 1
            while sid in ids:
                k += 1
                sid = f"{ln.utt_id}-{k}"
            n_renamed += sid != ln.utt_id
            ids.add(sid)
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
                    gender=gender_of(ln.label),
                    custom={"label": ln.label, "break_before": brk},
                )
            )
    where = f"{corpus}/{part}"
    if n_clamped:
        logger.info("%s: %d segment ends clamped to the audio duration", where, n_clamped)
    if n_unk and not keep_unk:
        logger.info("%s: removed %d <unk> tokens", where, n_unk)
    if n_renamed:
        logger.warning("%s: %d different segments with the id of another one got a -2, -3 ... suffix", where, n_renamed)
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
    root: list[Path] = []

    def start(pending: list[str]) -> None:
        root.append(_find_root(Path(corpus_dir), version))

    def one(part: str) -> CutSet:
        return prepare_part(
            corpus, root[0], version, part, out_dir, num_jobs=num_jobs, pad=pad if part == "train" else None, keep_unk=keep_unk
        )

    return prepare_parts(out_dir, corpus, parts, one, start, num_jobs=num_jobs)


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
