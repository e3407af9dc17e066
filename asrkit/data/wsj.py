"""WSJ (LDC93S6B WSJ0 + LDC94S13B WSJ1) -> Lhotse manifests, the way Kaldi's ``wsj_data_prep.sh``
builds its sets. Lhotse has no WSJ recipe; this is one.

Corpus layout: the CD/disc folders ``11-*.1`` (WSJ0) and ``13-*.1`` (WSJ1), directly under
``corpus_dir`` or below parents such as ``csr_1/`` and ``csr_2_comp/`` (any depth up to 4),
with upper- or lower-case file names (paths are resolved case-insensitively).

Sets (the ``.ndx`` index files list ``disc_id:path`` lines, e.g. ``11_2_1:wsj0/si_tr_s/011/011c0201.wv1``):

=============  ==============================================================  =========
part           index files                                                     real size
=============  ==============================================================  =========
train_si284    13-34.1/wsj1/doc/indices/si_tr_s.ndx + 11-13.1/.../tr_s_wv1.ndx    37416
train_si84     11-13.1/wsj0/doc/indices/train/tr_s_wv1.ndx                         7138
test_dev93     13-34.1/wsj1/doc/indices/h1_p0.ndx (Nov'93 dev)                      503
test_eval92    11-13.1/wsj0/doc/indices/test/nvp/si_et_20.ndx (no .wv1 suffix)     333
test_eval93    13-32.1/wsj1/doc/indices/wsj1/eval/h1_p0.ndx (13_32_1 -> 13_33_1)   213
=============  ==============================================================  =========

Speaker 401 of ``11-2.1/wsj0/si_tr_s`` is excluded from the training sets (as Kaldi does).
A disc that holds audio of the requested sets but is not there is an error naming each missing
disc and how many utterances of which set it holds, before anything is written; with
``allow_missing_discs=True`` (``asrkit prepare wsj --allow-missing-discs``) those utterances
are left out with a warning instead (a partial corpus). A missing index disc is always an
error. Sizes that differ from the real ones are logged as a warning with the reason (discs
missing, by name and count; files or transcripts missing).

Transcripts come from the ``.dot`` files (one per speaker session, ``<session>00.dot``, lines
``text (uttid)``), normalized by :func:`asrkit.data.wsj_text.normalize_transcript` (version
:data:`~asrkit.data.wsj_text.WSJ_NORM_VERSION`): Kaldi's ``normalize_transcript.pl`` byte for
byte, then for the training parts by default the CAPE setting's words of letters and
apostrophes (``cape_train_text``), for the test parts Kaldi's tokens with the marks resolved.
The raw text is kept in the supervision's ``custom["raw_text"]``. Utterances without a
transcript are dropped, counted and logged with the ``.dot`` file that lacks them (Kaldi's
``find_transcripts.pl`` also only warns).

Audio: ``.wv1`` files are SPHERE with embedded Shorten. Recordings point at them (duration and
sample count from the SPHERE header) and :mod:`asrkit.data.audio` decodes them in-process. With
``verify_audio`` (default) every file is decoded once during preparation (``num_jobs``
processes) and its sample count and checksum are checked; a corrupt or missing file is an error
naming it (``skip_bad_audio=True`` drops it with a warning instead). With ``flac_dir`` the
decoded audio is also cached there as FLAC and the recordings point at the FLAC files.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from lhotse import AudioSource, CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

from asrkit.data.manifests import DropStats, prepare_parts, write_part
from asrkit.utils import remedy
from asrkit.data.wsj_text import WSJ_NORM_VERSION, normalize_transcript, parse_dot_file, read_lm_text

logger = logging.getLogger(__name__)

CORPUS = "wsj"

#: part -> index files as (disc, path on the disc)
WSJ_SETS: dict[str, list[tuple[str, str]]] = {
    "train_si284": [("13-34.1", "wsj1/doc/indices/si_tr_s.ndx"), ("11-13.1", "wsj0/doc/indices/train/tr_s_wv1.ndx")],
    "train_si84": [("11-13.1", "wsj0/doc/indices/train/tr_s_wv1.ndx")],
    "test_dev93": [("13-34.1", "wsj1/doc/indices/h1_p0.ndx")],
    "test_eval92": [("11-13.1", "wsj0/doc/indices/test/nvp/si_et_20.ndx")],
    "test_eval93": [("13-32.1", "wsj1/doc/indices/wsj1/eval/h1_p0.ndx")],
}
#: utterance counts of the real corpus (Kaldi's)
EXPECTED_COUNTS = {"train_si284": 37416, "train_si84": 7138, "test_dev93": 503, "test_eval92": 333, "test_eval93": 213}
DEFAULT_PARTS = ("train_si284", "test_dev93", "test_eval92")

_DISC_DIR = re.compile(r"^(\d+)-(\d+)\.(\d+)$")
_NDX_LINE = re.compile(r"^(\d+)_(\d+)_(\d+)\s*:\s*(\S+)")
_EXCLUDED = ("11-2.1", "wsj0/si_tr_s/401/")  # Kaldi: grep -v 11-2.1/wsj0/si_tr_s/401


class WsjError(RuntimeError):
    """The WSJ corpus on disk is incomplete or malformed in a way preparation cannot work around."""


def find_discs(corpus_dir: Path, max_depth: int = 4) -> dict[str, Path]:
    """Disc folders (``11-13.1`` ...) under ``corpus_dir`` (itself possibly one), by name."""
    corpus_dir = Path(corpus_dir)
    found: dict[str, Path] = {}
    if _DISC_DIR.match(corpus_dir.name):
        return {corpus_dir.name: corpus_dir}
    base_depth = len(corpus_dir.parts)
    for dirpath, dirnames, _ in os.walk(corpus_dir, followlinks=True):
        depth = len(Path(dirpath).parts) - base_depth
        keep = []
        for d in sorted(dirnames):
            if _DISC_DIR.match(d):
                if d in found:
                    logger.warning("WSJ: disc %s found twice (%s and %s); using the first", d, found[d], Path(dirpath) / d)
                else:
                    found[d] = Path(dirpath) / d
            elif depth + 1 < max_depth:
                keep.append(d)
        dirnames[:] = keep
    return found


class _DiscFiles:
    """Case-insensitive file lookup inside one disc (built lazily with one walk)."""

    def __init__(self, root: Path):
        self.root = root
        self._files: Optional[dict[str, Path]] = None

    @property
    def files(self) -> dict[str, Path]:
        if self._files is None:
            files = {}
            for dirpath, _, filenames in os.walk(self.root, followlinks=True):
                rel_dir = os.path.relpath(dirpath, self.root)
                for fn in filenames:
                    rel = fn if rel_dir == "." else f"{rel_dir}/{fn}"
                    files[rel.replace(os.sep, "/").lower()] = Path(dirpath) / fn
            self._files = files
        return self._files

    def get(self, rel: str) -> Optional[Path]:
        return self.files.get(rel.strip("/").lower())


@dataclass
class _Entry:
    uttid: str
    disc: str
    rel: str
    path: Optional[Path] = None


@dataclass
class _SetListing:
    part: str
    entries: list = field(default_factory=list)  # resolved _Entry
    listed: int = 0
    excluded: int = 0
    duplicates: int = 0
    missing_discs: dict = field(default_factory=dict)  # disc -> count
    missing_files: list = field(default_factory=list)  # (uttid, expected path)


class WsjCorpus:
    """The discs of one WSJ installation, with case-insensitive path resolution."""

    def __init__(self, corpus_dir: Path | str):
        self.corpus_dir = Path(corpus_dir)
        if not self.corpus_dir.is_dir():
            raise FileNotFoundError(f"WSJ corpus directory {self.corpus_dir} does not exist")
        self.discs = {name: _DiscFiles(p) for name, p in find_discs(self.corpus_dir).items()}
        if not self.discs:
            raise WsjError(
                f"no WSJ disc folders (named like 11-13.1 or 13-34.1) found under {self.corpus_dir} "
                "(checked 4 levels deep, e.g. csr_1/11-13.1)"
            )
        self._dots: Optional[dict[str, list[Path]]] = None
        self._dot_cache: dict[Path, dict[str, str]] = {}

    def disc_path(self, disc: str) -> Optional[Path]:
        d = self.discs.get(disc)
        return d.root if d else None

    def resolve(self, disc: str, rel: str) -> Optional[Path]:
        d = self.discs.get(disc)
        return d.get(rel) if d else None

    # ---------------------------------------------------------------- indices

    def read_index(self, disc: str, rel: str, part: str) -> list[tuple[str, str]]:
        """``(disc, path)`` entries of one ``.ndx`` file."""
        if disc not in self.discs:
            raise WsjError(
                f"WSJ {part}: the index {disc}/{rel} is on disc {disc}, which is not under {self.corpus_dir} "
                f"(found discs: {', '.join(sorted(self.discs)) or 'none'})"
            )
        path = self.resolve(disc, rel)
        if path is None:
            raise WsjError(f"WSJ {part}: index file {self.discs[disc].root / rel} does not exist (disc {disc} is incomplete?)")
        out = []
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                line = raw.decode("latin-1").strip()
                if not line or line.startswith(";"):
                    continue
                m = _NDX_LINE.match(line)
                if not m:
                    raise WsjError(f"{path}:{n}: bad index line {line!r} (expected disc_id:path, e.g. 11_2_1:wsj0/...)")
                d = f"{m.group(1)}-{m.group(2)}.{m.group(3)}"
                if part == "test_eval93" and d == "13-32.1":
                    d = "13-33.1"  # the Nov'93 eval index names the wrong disc (as Kaldi notes)
                p = m.group(4).lstrip("/")
                if not p.lower().endswith(".wv1"):
                    p += ".wv1"  # the Nov'92 index has no suffix
                out.append((d, p))
        return out

    def list_set(self, part: str) -> _SetListing:
        if part not in WSJ_SETS:
            raise ValueError(f"unknown WSJ part {part!r}; valid: {', '.join(WSJ_SETS)}")
        listing = _SetListing(part)
        seen = set()
        for disc, rel in WSJ_SETS[part]:
            for d, p in self.read_index(disc, rel, part):
                listing.listed += 1
                if part.startswith("train") and d == _EXCLUDED[0] and p.lower().startswith(_EXCLUDED[1]):
                    listing.excluded += 1
                    continue
                uttid = Path(p).stem.lower()
                if uttid in seen:
                    listing.duplicates += 1
                    continue
                seen.add(uttid)
                if d not in self.discs:
                    listing.missing_discs[d] = listing.missing_discs.get(d, 0) + 1
                    continue
                path = self.resolve(d, p)
                if path is None:
                    listing.missing_files.append((uttid, str(self.discs[d].root / p)))
                    continue
                listing.entries.append(_Entry(uttid, d, p, path))
        listing.entries.sort(key=lambda e: e.uttid)
        return listing

    # ---------------------------------------------------------------- transcripts

    @property
    def dot_files(self) -> dict[str, list[Path]]:
        """Speaker session (first 6 characters of the utterance id) -> its ``.dot`` file(s)
        (a session can have copies on several discs)."""
        if self._dots is None:
            dots: dict[str, list[Path]] = {}
            for name in sorted(self.discs):
                for rel, path in sorted(self.discs[name].files.items()):
                    if rel.endswith(".dot"):
                        dots.setdefault(Path(rel).stem[:6], []).append(path)
            self._dots = dots
        return self._dots

    def transcript(self, uttid: str) -> tuple[Optional[str], str]:
        """``(raw transcript or None, where it was looked for)``."""
        dots = self.dot_files.get(uttid[:6])
        if not dots:
            return None, f"no .dot file for session {uttid[:6]} (expected {uttid[:6]}00.dot on some disc)"
        for dot in dots:
            if dot not in self._dot_cache:
                self._dot_cache[dot] = parse_dot_file(dot)
            text = self._dot_cache[dot].get(uttid)
            if text is not None:
                return text, str(dot)
        return None, ", ".join(str(d) for d in dots)


def _describe_shortfall(listing: _SetListing, n_final: int) -> Optional[str]:
    expected = EXPECTED_COUNTS.get(listing.part)
    if expected is None or n_final == expected:
        return None
    reasons = []
    if listing.missing_discs:
        reasons.append(
            "missing discs: " + ", ".join(f"{d} ({n} utterances)" for d, n in sorted(listing.missing_discs.items()))
        )
    if listing.missing_files:
        reasons.append(f"{len(listing.missing_files)} audio files missing on present discs")
    if listing.listed - listing.excluded - listing.duplicates != expected:
        reasons.append(
            f"the index files list {listing.listed - listing.excluded - listing.duplicates} utterances "
            f"({listing.excluded} of speaker 401 excluded, {listing.duplicates} duplicates)"
        )
    return (
        f"WSJ {listing.part}: {n_final} utterances, the full corpus has {expected}"
        + (f"; {'; '.join(reasons)}" if reasons else "")
    )


# ------------------------------------------------------------------------- audio checks (in workers)


def _probe(args: tuple) -> tuple:
    """Worker: header (+ decode and verify, + FLAC cache) of one file.

    Returns ``(uttid, sample_rate, channels, num_samples, audio_path, None)`` or
    ``(uttid, ..., error message)``."""
    uttid, path, verify, flac_path = args
    from asrkit.data.sphere import SphereError, read_sphere_int16, sphere_info

    try:
        h = sphere_info(path)
        if flac_path is not None:
            import soundfile as sf

            from asrkit.utils import atomic_path

            flac = Path(flac_path)
            ok = False
            if flac.is_file():
                try:
                    i = sf.info(str(flac))
                    ok = i.frames == h.sample_count and i.samplerate == h.sample_rate
                except RuntimeError:
                    ok = False
            if not ok:
                samples, sr = read_sphere_int16(path, verify=True)
                with atomic_path(flac) as tmp:
                    sf.write(str(tmp), samples.T, sr, format="FLAC", subtype="PCM_16")
            return uttid, h.sample_rate, h.channels, h.sample_count, str(flac), None
        if verify:
            read_sphere_int16(path, verify=True)
        return uttid, h.sample_rate, h.channels, h.sample_count, str(path), None
    except (SphereError, OSError, RuntimeError, ValueError) as e:
        return uttid, 0, 0, 0, str(path), f"{type(e).__name__}: {e}"


def _run_probes(tasks: list, num_jobs: int) -> list:
    from tqdm import tqdm

    if num_jobs <= 1 or len(tasks) < 8:
        return [_probe(t) for t in tqdm(tasks, desc="WSJ audio", disable=len(tasks) < 100)]
    with ProcessPoolExecutor(num_jobs) as ex:
        return list(tqdm(ex.map(_probe, tasks, chunksize=32), total=len(tasks), desc="WSJ audio", disable=len(tasks) < 100))


# ------------------------------------------------------------------------- preparation


_SKIP_BAD_AUDIO = dict(cli_option="--skip-bad-audio", recipe_options=[("--prepare_args", "--skip-bad-audio")])


def missing_discs_error(corpus: WsjCorpus, listings: dict[str, "_SetListing"]) -> Optional[str]:
    """The message for discs that requested sets need but are not there (``None`` if none are)."""
    by_disc: dict[str, dict[str, int]] = {}
    for part, listing in listings.items():
        for disc, n in listing.missing_discs.items():
            by_disc.setdefault(disc, {})[part] = n
    if not by_disc:
        return None
    lines = [
        f"  {disc}: " + ", ".join(f"{n} utterance{'s' * (n != 1)} of {part}" for part, n in parts.items())
        for disc, parts in sorted(by_disc.items())
    ]
    return (
        f"WSJ: {len(by_disc)} disc(s) holding audio of the requested sets are not under {corpus.corpus_dir} "
        f"(found: {', '.join(sorted(corpus.discs))}):\n" + "\n".join(lines) + "\n"
        "Put the missing disc folders under it (up to 4 levels deep, e.g. csr_2_comp/13-2.1). "
        + remedy("To prepare the discs that are there only (a partial corpus)", 1,
                 "--allow-missing-discs", [("--prepare_args", "--allow-missing-discs")])
    )


def prepare_part(
    corpus: WsjCorpus,
    part: str,
    out_dir: Path,
    num_jobs: int = 2,
    verify_audio: bool = True,
    skip_bad_audio: bool = False,
    flac_dir: Optional[Path] = None,
    cape_train_text: bool = True,
    noise_word: str = "<NOISE>",
    listing: Optional["_SetListing"] = None,
) -> CutSet:
    listing = listing or corpus.list_set(part)
    stats = DropStats()
    if listing.missing_files:
        msg = "; ".join(f"{u}: {p}" for u, p in listing.missing_files[:10])
        if not skip_bad_audio:
            raise FileNotFoundError(
                f"WSJ {part}: {len(listing.missing_files)} audio file(s) listed in the index are missing "
                f"on discs that are present, e.g. {msg}\n"
                + remedy("To leave them out", 1, **_SKIP_BAD_AUDIO)
            )
        for u, _ in listing.missing_files:
            stats.add("audio file missing", u)
        logger.warning("WSJ %s: dropping %d utterances whose audio file is missing, e.g. %s", part, len(listing.missing_files), msg)
    if listing.missing_discs:
        logger.warning(
            "WSJ %s: %d listed utterances are on discs that are not under %s: %s",
            part,
            sum(listing.missing_discs.values()),
            corpus.corpus_dir,
            ", ".join(f"{d} ({n})" for d, n in sorted(listing.missing_discs.items())),
        )
    # transcripts first (cheap), so that audio work is done only for usable utterances
    cape = cape_train_text and part.startswith("train")
    entries, sups = [], {}
    missing_tr: dict[str, list[str]] = {}
    for e in listing.entries:
        raw, where = corpus.transcript(e.uttid)
        if raw is None:
            stats.add("no transcript", e.uttid)
            missing_tr.setdefault(where, []).append(e.uttid)
            continue
        entries.append(e)
        sups[e.uttid] = SupervisionSegment(
            id=e.uttid,
            recording_id=e.uttid,
            start=0.0,
            duration=0.0,  # set from the audio below
            channel=0,
            text=normalize_transcript(raw, noise_word=noise_word, cape=cape),
            language="English",
            speaker=e.uttid[:3],
            custom={"raw_text": raw, "norm_version": WSJ_NORM_VERSION},
        )
    for where, utts in missing_tr.items():
        logger.warning("WSJ %s: no transcript for %d utterance(s) %s in %s", part, len(utts), ", ".join(utts[:5]), where)
    tasks = [
        (e.uttid, str(e.path), verify_audio, None if flac_dir is None else str(Path(flac_dir) / f"{e.uttid}.flac"))
        for e in entries
    ]
    results = _run_probes(tasks, num_jobs)
    recordings, bad = [], []
    for uttid, sr, ch, n, audio_path, err in results:
        if err is not None:
            bad.append(f"{uttid}: {err}")
            stats.add("bad audio", uttid)
            sups.pop(uttid, None)
            continue
        recordings.append(
            Recording(
                id=uttid,
                sources=[AudioSource(type="file", channels=list(range(ch)), source=audio_path)],
                sampling_rate=sr,
                num_samples=n,
                duration=n / sr,
            )
        )
        sups[uttid] = dataclasses.replace(sups[uttid], duration=n / sr)
    if bad:
        if not skip_bad_audio:
            raise WsjError(
                f"WSJ {part}: {len(bad)} unreadable or corrupt audio file(s):\n  " + "\n  ".join(bad[:10]) + "\n"
                + remedy("To leave them out", 1, **_SKIP_BAD_AUDIO)
            )
        logger.warning("WSJ %s: dropped %d utterances with bad audio:\n  %s", part, len(bad), "\n  ".join(bad[:10]))
    shortfall = _describe_shortfall(listing, len(recordings))
    if shortfall:
        logger.warning("%s", shortfall)
    if stats.counts:
        logger.warning("WSJ %s: dropped: %s", part, stats)
    return write_part(out_dir, CORPUS, part, RecordingSet.from_recordings(recordings), SupervisionSet.from_segments(list(sups.values())))


def prepare_lm_text(corpus_dir: Path | str, out_file: Path | str, noise_word: str = "<NOISE>") -> int:
    """Write the normalized WSJ1 LM training text (``lng_modl/lm_train/np_data/*/*.z``, LZW or plain)
    to ``out_file`` (gzip text, one sentence a line, atomically). Returns the number of sentences."""
    import gzip

    from asrkit.utils import atomic_path

    corpus = WsjCorpus(corpus_dir)
    files = []
    for name in sorted(corpus.discs):
        for rel, path in sorted(corpus.discs[name].files.items()):
            if "/lng_modl/lm_train/np_data/" in f"/{rel}" and rel.endswith((".z", ".gz", ".txt")):
                files.append(path)
    if not files:
        raise FileNotFoundError(
            f"no WSJ LM text (13-32.1/wsj1/doc/lng_modl/lm_train/np_data/*/*.z) under {corpus.corpus_dir}"
        )
    n = 0
    with atomic_path(Path(out_file)) as tmp:
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            for path in files:
                for s in read_lm_text(path, noise_word=noise_word):
                    f.write(s + "\n")
                    n += 1
    logger.info("WSJ LM text: %d sentences from %d files -> %s", n, len(files), out_file)
    return n


def prepare(
    corpus_dir: Path | str,
    out_dir: Path | str,
    parts: Optional[Sequence[str]] = None,
    num_jobs: int = 2,
    verify_audio: bool = True,
    skip_bad_audio: bool = False,
    flac_dir: Optional[Path | str] = None,
    cape_train_text: bool = True,
    lm_text: bool = False,
    allow_missing_discs: bool = False,
    **_unused,
) -> dict[str, CutSet]:
    """Prepare WSJ parts (default ``train_si284``, ``test_dev93``, ``test_eval92``; also
    ``train_si84``, ``test_eval93``) into ``out_dir``; parts whose cuts manifest exists are
    loaded, not redone. Options: see the module docstring. ``lm_text`` also writes
    ``wsj_lm_text.txt.gz`` (normalized LM training sentences)."""
    out_dir = Path(out_dir)
    parts = list(parts or DEFAULT_PARTS)
    for p in parts:
        if p not in WSJ_SETS:
            raise ValueError(f"unknown WSJ part {p!r}; valid: {', '.join(WSJ_SETS)}")
    corpus: Optional[WsjCorpus] = None
    listings: dict[str, _SetListing] = {}

    def start(pending: list[str]) -> None:
        nonlocal corpus
        corpus = WsjCorpus(corpus_dir)
        logger.info("WSJ: found discs %s", ", ".join(sorted(corpus.discs)))
        listings.update({p: corpus.list_set(p) for p in pending})
        msg = missing_discs_error(corpus, listings)
        if msg and not allow_missing_discs:
            raise WsjError(msg)

    def one(part: str) -> CutSet:
        assert corpus is not None
        return prepare_part(
            corpus,
            part,
            out_dir,
            num_jobs=num_jobs,
            verify_audio=verify_audio,
            skip_bad_audio=skip_bad_audio,
            flac_dir=None if flac_dir is None else Path(flac_dir),
            cape_train_text=cape_train_text,
            listing=listings[part],
        )

    out = prepare_parts(out_dir, CORPUS, parts, one, start, num_jobs=num_jobs)
    if lm_text:
        lm_file = out_dir / "wsj_lm_text.txt.gz"
        if not lm_file.is_file():
            prepare_lm_text(corpus_dir, lm_file)
    return out
