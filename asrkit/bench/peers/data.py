"""The Kaldi data dirs both toolkits read (absolute wav paths, segments cut into files)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

try:
    import fcntl
except ImportError:  # (not on Windows: no lock there)
    fcntl = None

from asrkit.bench.peers.common import PeersError
from asrkit.bench.peers.espnet_output import read_kaldi_text


def _resolve_audio(p: str, bases: list[Path], where: str) -> Path:
    if p.endswith("|") or " " in p.strip():
        raise PeersError(f"{where}: {p!r} is a command, not a file; write the audio to wav files first")
    q = Path(p)
    if q.is_absolute():
        if q.is_file():
            return q
        raise PeersError(f"{where}: {q} does not exist")
    for b in bases:
        if (b / q).is_file():
            return (b / q).resolve()
    raise PeersError(f"{where}: {p} is found relative to none of {', '.join(map(str, bases))}")


def _stamp(src: Path, every: int) -> dict:
    """What a normalized dir was made from: the source dir, the subset, and the size and
    modification time of each of its files (a changed file makes the dir again)."""
    files = {f: [(src / f).stat().st_size, (src / f).stat().st_mtime_ns]
             for f in ("wav.scp", "text", "utt2spk", "segments") if (src / f).is_file()}
    return {"src": str(src.resolve()), "every": every, "files": files}


@contextlib.contextmanager
def prepare_lock(work: Path):
    """Held while WORK/data is written: two ``--only`` runs started together (one per side)
    make it once; the second waits, then finds it made. ``flock``: released however the holder
    ends."""
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "data.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def normalize_kaldi_dir(src: Path, dst: Path, bases: list[Path], every: int = 1) -> dict[str, float]:
    """Copy Kaldi dir ``src`` to ``dst``: ``wav.scp`` with absolute paths (``segments`` cut into wav
    files under ``dst/wav``), ``text``, ``utt2spk``; returns utterance -> duration (seconds).
    ``every`` > 1 keeps every ``every``-th utterance of ``text`` in sorted order (a fixed subset).
    A ``dst`` made before from the same files (its ``source.json``) is kept as it is, so a rerun
    never rewrites a dir a running side reads."""
    for f in ("wav.scp", "text"):
        if not (src / f).is_file():
            raise PeersError(f"{src}/{f} missing: --data must hold Kaldi data dirs with wav.scp and text")
    wav = read_kaldi_text(src / "wav.scp")
    text = read_kaldi_text(src / "text")
    if every > 1:
        text = {u: text[u] for u in sorted(text)[::every]}
    spk = read_kaldi_text(src / "utt2spk") if (src / "utt2spk").is_file() else {}
    if every > 1 and not (src / "segments").is_file():
        wav = {u: p for u, p in wav.items() if u in text}
    paths = {r: _resolve_audio(p, bases + [src] + list(src.parents)[:3], f"{src}/wav.scp {r}") for r, p in wav.items()}
    stamp = _stamp(src, every)
    if (dst / "source.json").is_file() and (dst / "durations.json").is_file():
        if json.loads((dst / "source.json").read_text()) == stamp:  # made from these files before:
            return json.loads((dst / "durations.json").read_text())  # kept (a side may be reading it)
    tmp = dst.with_name(f"{dst.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        return _write_dir(src, dst, tmp, text, spk, paths, stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # (renamed to dst when it worked)


def _write_dir(src: Path, dst: Path, tmp: Path, text: dict, spk: dict, paths: dict, stamp: dict) -> dict[str, float]:
    import soundfile as sf

    dur: dict[str, float] = {}
    out_wav: dict[str, str] = {}
    if (src / "segments").is_file():
        (tmp / "wav").mkdir()
        for n, line in enumerate((src / "segments").read_text().splitlines(), 1):
            if not line.strip():
                continue
            u, rec, b, e = line.split()[:4]
            if u not in text:
                continue
            if rec not in paths:
                raise PeersError(f"{src}/segments:{n}: recording {rec!r} is not in wav.scp")
            info = sf.info(str(paths[rec]))
            lo, hi = int(float(b) * info.samplerate), int(float(e) * info.samplerate)
            audio, sr = sf.read(str(paths[rec]), start=lo, stop=hi, dtype="int16")
            sf.write(str(tmp / "wav" / f"{u}.wav"), audio, sr, subtype="PCM_16")
            out_wav[u] = str(dst / "wav" / f"{u}.wav")
            dur[u] = len(audio) / sr
    else:
        for u, p in paths.items():
            info = sf.info(str(p))
            if info.samplerate != 16000:
                raise PeersError(f"{src}/wav.scp {u}: {p} is {info.samplerate} Hz; both toolkits are set up for 16 kHz")
            out_wav[u], dur[u] = str(p), info.frames / info.samplerate
    missing = [u for u in text if u not in out_wav]
    if missing:
        raise PeersError(f"{src}/text: {len(missing)} utterances without audio (first: {missing[0]})")
    ids = sorted(text)
    (tmp / "wav.scp").write_text("".join(f"{u} {out_wav[u]}\n" for u in ids))
    (tmp / "text").write_text("".join(f"{u} {text[u]}\n" for u in ids))
    (tmp / "utt2spk").write_text("".join(f"{u} {spk.get(u, u)}\n" for u in ids))
    (tmp / "durations.json").write_text(json.dumps({u: dur[u] for u in ids}))
    (tmp / "source.json").write_text(json.dumps(stamp))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return {u: dur[u] for u in ids}


def librispeech_to_kaldi(part_dir: Path, dst: Path) -> Path:
    """A Kaldi data dir (``wav.scp`` of absolute audio paths, ``text``, ``utt2spk``) for one part of
    a corpus in LibriSpeech's layout (``<spk>/<chapter>/<spk>-<chapter>.trans.txt`` beside
    ``<utt>.flac``), e.g. the mini corpus; returns ``dst``."""
    trans = sorted(part_dir.rglob("*.trans.txt"))
    if not trans:
        raise PeersError(f"{part_dir}: no */*/*.trans.txt: not a part of a corpus in LibriSpeech's layout "
                         "(--layout librispeech wants --data to hold the parts, e.g. data/corpus/LibriSpeech)")
    wav, text = {}, {}
    for t in trans:
        for n, line in enumerate(t.read_text().splitlines(), 1):
            if not line.strip():
                continue
            u, _, words = line.partition(" ")
            audio = next((t.parent / f"{u}{ext}" for ext in (".flac", ".wav") if (t.parent / f"{u}{ext}").is_file()), None)
            if audio is None:
                raise PeersError(f"{t}:{n}: no audio file {u}.flac (or .wav) beside it")
            wav[u], text[u] = str(audio.resolve()), words.strip()
    dst.mkdir(parents=True, exist_ok=True)
    ids = sorted(text)
    _write_if_changed(dst / "wav.scp", "".join(f"{u} {wav[u]}\n" for u in ids))
    _write_if_changed(dst / "text", "".join(f"{u} {text[u]}\n" for u in ids))
    _write_if_changed(dst / "utt2spk", "".join(f"{u} {u.split('-')[0]}\n" for u in ids))
    return dst


def _write_if_changed(path: Path, text: str) -> None:
    """Unchanged files keep their modification time (the stamp ``normalize_kaldi_dir`` checks)."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
