"""Your own data in: a Kaldi data dir or Lhotse manifests -> asrkit's manifests.

``asrkit prepare kaldi --corpus-dir ROOT --parts train dev test --name mycorpus``: every part is
a Kaldi data dir ``ROOT/<part>`` with

* ``wav.scp``: ``<recording-id> <path>`` or ``<recording-id> <command> |`` (a command that writes
  a WAV file to stdout, e.g. ``python3 -m asrkit.inference.audio x.mp3 |``); relative paths are resolved against
  ``--wav-root`` (default: the directory ``asrkit prepare`` runs in, as Kaldi and Lhotse do; a
  recipe runs it in its own directory); commands run as they are, in that same directory;
* ``text`` (``<utterance-id> <words>``), ``utt2spk``; optional ``segments``
  (``<utterance-id> <recording-id> <start> <end>``), ``spk2gender``, ``utt2lang``.

The directory is checked line by line first (below), then imported by Lhotse's own importer,
:func:`lhotse.kaldi.load_kaldi_data_dir` (the same as ``lhotse kaldi import``), from a copy of
it whose ``wav.scp`` has the resolved absolute paths; so the manifests are Lhotse's, with the
Kaldi ids unchanged (recording ids from ``wav.scp``, supervision ids = utterance ids) and the
audio paths absolute.

``asrkit prepare lhotse --corpus-dir DIR --parts train dev test --name mycorpus`` reads Lhotse
manifests as they are, per part, whichever of these is there:

* ``DIR/<part>/recordings.jsonl.gz`` + ``DIR/<part>/supervisions.jsonl.gz`` (what
  ``lhotse kaldi import <data dir> <rate> DIR/<part>`` writes);
* ``DIR/<prefix>recordings_<part>.jsonl.gz`` + ``DIR/<prefix>supervisions_<part>.jsonl.gz``
  (Lhotse's recipes, e.g. ``librispeech_recordings_train-clean-100.jsonl.gz``);
* ``DIR/<prefix>cuts_<part>.jsonl.gz`` (a cut set; its recordings and supervisions are used).

``.jsonl`` (not gzipped) works as well. Relative audio paths in manifests are resolved against
``--wav-root`` too.

Checked before anything is written, each failure one line (:class:`ImportDataError`) naming the
file and line and what to do: a missing file of the data dir, a duplicate or malformed line, a
missing audio file, a command that fails, audio not at ``--sample-rate`` (16 kHz by default), a
segment outside its recording, an utterance in ``text`` without audio (not in ``wav.scp`` or
``segments``) or without a speaker, an utterance with audio but no transcript, an empty
transcript. Manifests are written with :func:`asrkit.data.manifests.write_part` (temporary
files renamed at the end, cuts last), so a failed import leaves nothing half-written.
"""
from __future__ import annotations

import io
import logging
import os
import re
import shlex
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from lhotse import CutSet, RecordingSet, SupervisionSet

from asrkit.data.manifests import prepare_parts, write_part

logger = logging.getLogger(__name__)

#: files a Kaldi data dir must have for training
REQUIRED = ("wav.scp", "text", "utt2spk")


class ImportDataError(ValueError):
    """The data to import is incomplete or inconsistent; the message names file, line and fix."""


@dataclass
class Line:
    """One ``<key> <value>`` line of a Kaldi table file, with where it came from."""

    key: str
    value: str
    path: Path
    lineno: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


def read_table(path: Path, allow_empty_value: bool = False) -> dict[str, Line]:
    """A Kaldi table file as ``{key: Line}``; a duplicate key or a line without a value is an error."""
    out: dict[str, Line] = {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            parts = line.split(maxsplit=1)
            key, value = parts[0], (parts[1].strip() if len(parts) > 1 else "")
            if not value and not allow_empty_value:
                raise ImportDataError(f"{path}:{n}: '{key}' has no value; every line is '<id> <value>': fix or remove the line")
            if key in out:
                raise ImportDataError(f"{path}:{n}: '{key}' appears twice (first on line {out[key].lineno}); keep one line per id")
            out[key] = Line(key, value, path, n)
    return out


def _audio_info(data: "str | bytes") -> tuple[int, float]:
    """(sample rate, duration in seconds) of an audio file or of the bytes a command wrote."""
    import soundfile as sf

    info = sf.info(io.BytesIO(data) if isinstance(data, bytes) else data)
    return int(info.samplerate), float(info.frames) / info.samplerate


#: the converter the error messages advise (any format, any rate -> WAV on stdout; nothing to install)
CONVERT = "python3 -m asrkit.inference.audio"


def _check_audio(rec: Line, source: str, is_command: bool, cwd: Path, sample_rate: int) -> Optional[str]:
    """None, or the one-line error for this ``wav.scp`` line."""
    if is_command:
        try:
            p = subprocess.run(source, shell=True, cwd=cwd, capture_output=True, timeout=600)
        except subprocess.TimeoutExpired:
            return f"{rec.where}: the command of recording '{rec.key}' did not finish in 600 s; run it by hand: {source}"
        if p.returncode != 0 or not p.stdout:
            err = (p.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            return (f"{rec.where}: the command of recording '{rec.key}' failed (exit {p.returncode}: {err}); "
                    f"it must write a WAV file to stdout, try it in {cwd}: {source}")
        try:
            rate, _ = _audio_info(p.stdout)
        except Exception as e:  # noqa: BLE001 - libsndfile's errors have no common type
            return f"{rec.where}: the command of recording '{rec.key}' did not write readable audio ({e}); make it write WAV, e.g. by piping it through '{CONVERT} - |'"
        what = "its command's audio"
    else:
        path = Path(source)
        if not path.is_file():
            looked = "" if rec.value == source else f" (looked for {source})"
            return (f"{rec.where}: audio file {rec.value} of recording '{rec.key}' does not exist{looked}; fix the path "
                    f"(relative paths are resolved against --wav-root, here {cwd})")
        try:
            rate, _ = _audio_info(str(path))
        except Exception as e:  # noqa: BLE001
            return (f"{rec.where}: cannot read audio file {source} of recording '{rec.key}' ({e}); convert it to WAV or FLAC, "
                    f"or write a command in wav.scp: '{rec.key} {CONVERT} {shlex.quote(source)} |'")
        what = source
    if rate != sample_rate:
        fix = (f"'{rec.key} {CONVERT} {shlex.quote(source)} --rate {sample_rate} |'" if not is_command
               else f"'... | {CONVERT} - --rate {sample_rate} |'")
        return (f"{rec.where}: {what} (recording '{rec.key}') is at {rate} Hz, expected {sample_rate} Hz; resample it "
                f"(wav.scp: {fix}) or import with --sample-rate {rate} and train with features.sample_rate={rate}")
    return None


def check_kaldi_dir(data_dir: Path, wav_root: Path, sample_rate: int = 16000, num_jobs: int = 2) -> dict[str, str]:
    """Check a Kaldi data dir line by line (module docstring); return ``{recording id: resolved
    wav.scp value}`` (absolute paths; commands unchanged, with their trailing ``|``)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ImportDataError(f"{data_dir}: no such Kaldi data directory; give the directory that holds wav.scp, text and utt2spk")
    for name in REQUIRED:
        if not (data_dir / name).is_file():
            fix = {"utt2spk": "without speakers, one per utterance: awk '{print $1, $1}' text > utt2spk",
                   "text": "it holds '<utterance-id> <transcript>' lines",
                   "wav.scp": "it holds '<recording-id> <audio path>' or '<recording-id> <command> |' lines"}[name]
            raise ImportDataError(f"{data_dir / name}: missing; a Kaldi data dir for training needs wav.scp, text and utt2spk ({fix})")
    wav = read_table(data_dir / "wav.scp")
    text = read_table(data_dir / "text", allow_empty_value=True)
    utt2spk = read_table(data_dir / "utt2spk")
    segments: dict[str, Line] = {}
    if (data_dir / "segments").is_file():
        segments = read_table(data_dir / "segments")
        for seg in segments.values():
            f = seg.value.split()
            if len(f) != 3:
                raise ImportDataError(f"{seg.where}: expected '<utterance-id> <recording-id> <start> <end>', got '{seg.key} {seg.value}'")
            if f[0] not in wav:
                raise ImportDataError(f"{seg.where}: segment '{seg.key}' is in recording '{f[0]}', which is not in {data_dir / 'wav.scp'}; "
                                      "add the recording or remove the segment")
            try:
                start, end = float(f[1]), float(f[2])
            except ValueError:
                raise ImportDataError(f"{seg.where}: start and end of segment '{seg.key}' must be seconds, got '{f[1]} {f[2]}'") from None
            if start < 0 or (end != -1 and end <= start):
                raise ImportDataError(f"{seg.where}: segment '{seg.key}' has start {start} and end {end}; need 0 <= start < end (or end -1)")
    utts = segments if segments else wav
    utts_file = data_dir / ("segments" if segments else "wav.scp")
    for t in text.values():
        if t.key not in utts:
            raise ImportDataError(f"{t.where}: utterance '{t.key}' is not in {utts_file}; add its audio there or remove the line "
                                  "(Kaldi's utils/fix_data_dir.sh keeps only the utterances every file has)")
        if not t.value:
            raise ImportDataError(f"{t.where}: utterance '{t.key}' has an empty transcript; write its words, or remove it from "
                                  f"text, utt2spk and {utts_file.name}")
        if t.key not in utt2spk:
            raise ImportDataError(f"{t.where}: utterance '{t.key}' has no speaker in {data_dir / 'utt2spk'}; add a line "
                                  f"'{t.key} <speaker-id>' (no speakers: the utterance id itself)")
    for u in utts.values():
        if u.key not in text:
            raise ImportDataError(f"{u.where}: utterance '{u.key}' has no transcript in {data_dir / 'text'}; add one or remove it "
                                  "(utils/fix_data_dir.sh)")
    for s in utt2spk.values():
        if s.key not in text:
            raise ImportDataError(f"{s.where}: utterance '{s.key}' is not in {data_dir / 'text'}; remove the line or add its transcript")
    resolved: dict[str, tuple[str, bool]] = {}
    for rec in wav.values():
        v = rec.value
        if v.endswith("|"):
            resolved[rec.key] = (v[:-1].strip(), True)
        else:
            p = Path(v)
            resolved[rec.key] = (str(p if p.is_absolute() else (wav_root / p)), False)
    jobs = max(1, num_jobs) * 4  # header reads and commands wait on I/O and child processes
    with ThreadPoolExecutor(jobs) as ex:
        errors = list(ex.map(lambda r: _check_audio(r, *resolved[r.key], wav_root, sample_rate), wav.values()))
    bad = [e for e in errors if e]
    if bad:
        more = f" (and {len(bad) - 1} more line(s) like it)" if len(bad) > 1 else ""
        raise ImportDataError(bad[0] + more)
    return {k: (f"{s} |" if cmd else s) for k, (s, cmd) in resolved.items()}


def import_kaldi_dir(data_dir: Path | str, wav_root: Path | str | None = None, sample_rate: int = 16000,
                     num_jobs: int = 2) -> tuple[RecordingSet, SupervisionSet]:
    """Check ``data_dir`` (:func:`check_kaldi_dir`), then import it with Lhotse's
    :func:`lhotse.kaldi.load_kaldi_data_dir` from a copy whose ``wav.scp`` has absolute paths."""
    from lhotse.kaldi import load_kaldi_data_dir

    data_dir = Path(data_dir)
    wav_root = Path(wav_root).resolve() if wav_root is not None else Path.cwd()
    resolved = check_kaldi_dir(data_dir, wav_root, sample_rate, num_jobs)
    with tempfile.TemporaryDirectory(prefix="asrkit-kaldi-") as tmp:
        for f in data_dir.iterdir():
            if f.is_file() and f.name not in ("wav.scp", "reco2dur", "feats.scp"):
                (Path(tmp) / f.name).write_bytes(f.read_bytes())
        with open(Path(tmp) / "wav.scp", "w", encoding="utf-8") as f:
            f.writelines(f"{k} {v}\n" for k, v in resolved.items())
        cwd = os.getcwd()
        os.chdir(wav_root)  # Lhotse runs wav.scp commands (for their durations) in the current directory
        try:
            recordings, supervisions, _ = load_kaldi_data_dir(tmp, sampling_rate=sample_rate, num_jobs=max(1, num_jobs))
        finally:
            os.chdir(cwd)
    if len(recordings) != len(resolved):  # Lhotse drops unreadable recordings with a warning; we checked them all
        lost = sorted(set(resolved) - set(recordings.ids))
        raise ImportDataError(f"{data_dir / 'wav.scp'}: Lhotse could not read the audio of {len(lost)} recording(s), e.g. {lost[0]}")
    # a segment past its recording's end (Kaldi allows none; Lhotse would keep it)
    durations = {r.id: r.duration for r in recordings}
    for s in supervisions:
        if s.end > durations[s.recording_id] + 0.01:
            raise ImportDataError(f"{data_dir / 'segments'}: segment '{s.id}' ends at {s.end:.2f} s, after the end of recording "
                                  f"'{s.recording_id}' ({durations[s.recording_id]:.2f} s); fix its end time")
    return recordings, supervisions


def prepare_kaldi(corpus_dir: Path | str, out_dir: Path | str, parts: Sequence[str] | None = None, num_jobs: int = 2,
                  name: str = "kaldi", wav_root: Path | str | None = None, sample_rate: int = 16000) -> dict[str, CutSet]:
    """``asrkit prepare kaldi``: every part is the Kaldi data dir ``corpus_dir/<part>``; manifests
    ``<name>_{recordings,supervisions,cuts}_<part>.jsonl.gz`` in ``out_dir``."""
    corpus_dir = Path(corpus_dir)
    parts = _parts(corpus_dir, parts, "a Kaldi data dir (wav.scp, text, utt2spk)")

    def one(part: str) -> CutSet:
        recs, sups = import_kaldi_dir(corpus_dir / part, wav_root, sample_rate, num_jobs)
        return write_part(out_dir, name, part, recs, sups)

    return prepare_parts(out_dir, name, parts, one, num_jobs=num_jobs)


def _parts(corpus_dir: Path, parts: Sequence[str] | None, what: str) -> list[str]:
    if not corpus_dir.is_dir():
        raise ImportDataError(f"--corpus-dir {corpus_dir}: no such directory")
    if not parts:
        raise ImportDataError(f"give the parts to import with --parts (each {what} under {corpus_dir})")
    for p in parts:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", p):
            raise ImportDataError(f"part name {p!r}: use letters, digits, '.', '_' and '-' only (it names the manifests); "
                                  f"link the directory under {corpus_dir} with such a name")
    return list(parts)


# ----------------------------------------------------------------------------- Lhotse manifests


def find_lhotse_manifests(manifest_dir: Path, part: str) -> tuple[str, Path, Optional[Path]]:
    """``("rs", recordings, supervisions)`` or ``("cuts", cuts, None)`` for one part (module docstring)."""
    sub = manifest_dir / part
    for ext in (".jsonl.gz", ".jsonl"):
        if (sub / f"recordings{ext}").is_file() and (sub / f"supervisions{ext}").is_file():
            return "rs", sub / f"recordings{ext}", sub / f"supervisions{ext}"

    def glob(kind: str) -> list[Path]:
        return sorted(p for ext in (".jsonl.gz", ".jsonl") for p in manifest_dir.glob(f"*{kind}_{part}{ext}")
                      if re.fullmatch(rf"(.*_)?{kind}_{re.escape(part)}\.jsonl(\.gz)?", p.name))

    recs, sups, cuts = glob("recordings"), glob("supervisions"), glob("cuts")
    for kind, found in (("recordings", recs), ("supervisions", sups), ("cuts", cuts)):
        if len(found) > 1:
            raise ImportDataError(f"{manifest_dir}: {len(found)} {kind} manifests of part {part!r} "
                                  f"({', '.join(p.name for p in found)}); keep one, or move the others away")
    if recs and sups:
        return "rs", recs[0], sups[0]
    if cuts:
        return "cuts", cuts[0], None
    raise ImportDataError(
        f"{manifest_dir}: no Lhotse manifests of part {part!r}: expected {part}/recordings.jsonl.gz + "
        f"{part}/supervisions.jsonl.gz (lhotse kaldi import), <prefix>recordings_{part}.jsonl.gz + "
        f"<prefix>supervisions_{part}.jsonl.gz, or <prefix>cuts_{part}.jsonl.gz")


def _jsonl_lines(path: Path) -> list[dict]:
    import gzip
    import json

    opener = gzip.open if path.name.endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                try:
                    out.append((n, json.loads(raw)))
                except json.JSONDecodeError as e:
                    raise ImportDataError(f"{path}:{n}: not a JSON object ({e.msg}); the manifest is damaged, write it again") from None
    return out


def import_lhotse(manifest_dir: Path | str, part: str, wav_root: Path | str | None = None,
                  sample_rate: int = 16000) -> tuple[RecordingSet, SupervisionSet]:
    """One part's Lhotse manifests, checked (module docstring); relative audio paths resolved."""
    from lhotse import Recording, SupervisionSegment
    from lhotse.cut import Cut

    manifest_dir = Path(manifest_dir)
    wav_root = Path(wav_root).resolve() if wav_root is not None else Path.cwd()
    kind, first, second = find_lhotse_manifests(manifest_dir, part)
    recordings: dict[str, tuple[str, Recording]] = {}
    sups: list[tuple[str, SupervisionSegment]] = []
    if kind == "rs":
        for n, d in _jsonl_lines(first):
            try:
                r = Recording.from_dict(d)
            except Exception as e:  # noqa: BLE001
                raise ImportDataError(f"{first}:{n}: not a Lhotse recording ({e})") from None
            if r.id in recordings:
                raise ImportDataError(f"{first}:{n}: recording '{r.id}' appears twice (first at {recordings[r.id][0]}); keep one")
            recordings[r.id] = (f"{first}:{n}", r)
        for n, d in _jsonl_lines(second):
            try:
                sups.append((f"{second}:{n}", SupervisionSegment.from_dict(d)))
            except Exception as e:  # noqa: BLE001
                raise ImportDataError(f"{second}:{n}: not a Lhotse supervision ({e})") from None
    else:
        from lhotse.serialization import deserialize_item

        for n, d in _jsonl_lines(first):
            try:
                c = deserialize_item(d)
                assert isinstance(c, Cut)
            except Exception as e:  # noqa: BLE001
                raise ImportDataError(f"{first}:{n}: not a Lhotse cut ({e})") from None
            if not c.has_recording:
                raise ImportDataError(f"{first}:{n}: cut '{c.id}' has no recording; asrkit trains from audio")
            recordings.setdefault(c.recording.id, (f"{first}:{n}", c.recording))
            sups.extend((f"{first}:{n}", s) for s in c.supervisions)
    # resolve relative paths, check the audio
    fixed = []
    for rid, (where, r) in recordings.items():
        if r.sampling_rate != sample_rate:
            raise ImportDataError(f"{where}: recording '{rid}' is at {r.sampling_rate} Hz, expected {sample_rate} Hz; resample it "
                                  f"or import with --sample-rate {r.sampling_rate} and train with features.sample_rate={r.sampling_rate}")
        srcs = []
        for src in r.sources:
            if src.type == "file":
                p = Path(src.source)
                p = p if p.is_absolute() else wav_root / p
                if not p.is_file():
                    raise ImportDataError(f"{where}: audio file {src.source} of recording '{rid}' does not exist; fix the path "
                                          f"(relative paths are resolved against --wav-root, here {wav_root})")
                src = type(src)(type="file", channels=src.channels, source=str(p))
            srcs.append(src)
        fixed.append(type(r)(id=r.id, sources=srcs, sampling_rate=r.sampling_rate, num_samples=r.num_samples,
                             duration=r.duration, channel_ids=r.channel_ids, transforms=r.transforms))
    seen: dict[str, str] = {}
    for where, s in sups:
        if s.id in seen:
            raise ImportDataError(f"{where}: supervision '{s.id}' appears twice (first at {seen[s.id]}); keep one")
        seen[s.id] = where
        if s.recording_id not in recordings:
            raise ImportDataError(f"{where}: supervision '{s.id}' refers to recording '{s.recording_id}', which is not in the "
                                  "recordings manifest; add it or remove the supervision")
        if not (s.text or "").strip():
            raise ImportDataError(f"{where}: supervision '{s.id}' has an empty transcript; write its words or remove it")
    return RecordingSet.from_recordings(fixed), SupervisionSet.from_segments(s for _, s in sups)


def prepare_lhotse(corpus_dir: Path | str, out_dir: Path | str, parts: Sequence[str] | None = None, num_jobs: int = 2,
                   name: str = "lhotse", wav_root: Path | str | None = None, sample_rate: int = 16000) -> dict[str, CutSet]:
    """``asrkit prepare lhotse``: the parts' Lhotse manifests in ``corpus_dir`` (module docstring)."""
    corpus_dir = Path(corpus_dir)
    parts = _parts(corpus_dir, parts, "Lhotse manifests")

    def one(part: str) -> CutSet:
        recs, sups = import_lhotse(corpus_dir, part, wav_root, sample_rate)
        return write_part(out_dir, name, part, recs, sups)

    return prepare_parts(out_dir, name, parts, one, num_jobs=num_jobs)
