"""The Kaldi data dirs both toolkits read (absolute wav paths, segments cut into files)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

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


def normalize_kaldi_dir(src: Path, dst: Path, bases: list[Path], every: int = 1) -> dict[str, float]:
    """Copy Kaldi dir ``src`` to ``dst``: ``wav.scp`` with absolute paths (``segments`` cut into wav
    files under ``dst/wav``), ``text``, ``utt2spk``; returns utterance -> duration (seconds).
    ``every`` > 1 keeps every ``every``-th utterance of ``text`` in sorted order (a fixed subset)."""
    import soundfile as sf

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
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
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
    (dst / "wav.scp").write_text("".join(f"{u} {wav[u]}\n" for u in ids))
    (dst / "text").write_text("".join(f"{u} {text[u]}\n" for u in ids))
    (dst / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in ids))
    return dst
