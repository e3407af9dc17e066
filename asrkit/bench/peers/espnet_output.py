"""ESPnet's output as asrkit's: ``1best_recog/text`` -> ``hyp.jsonl`` + ``decode_info.json``."""
from __future__ import annotations

import json
from pathlib import Path

from asrkit.bench.peers.common import PeersError


def read_kaldi_text(path: Path) -> dict[str, str]:
    """``uttid TEXT`` lines (the text may be empty: an empty hypothesis)."""
    out: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if parts[0] in out:
            raise PeersError(f"{path}:{n}: utterance {parts[0]!r} appears twice")
        out[parts[0]] = parts[1] if len(parts) > 1 else ""
    return out


def espnet_hyps_to_records(hyp_text: Path, ref_text: Path, durations: dict[str, float],
                           utt2spk: Path | None = None) -> list[dict]:
    """ESPnet's ``1best_recog/text`` (``uttid HYP``, char tokens already joined, ``<space>`` turned
    into spaces by its tokenizer) as asrkit ``hyp.jsonl`` records ``{id, ref, hyp, duration}``, in the
    order of the reference ``text``, with ``speaker`` from the Kaldi ``utt2spk`` where given (as
    ``asrkit decode`` records the cut's speaker, so that ``asrkit compare --sign-unit speaker``
    blocks both sides alike). Every reference utterance must have a hypothesis."""
    hyps, refs = read_kaldi_text(hyp_text), read_kaldi_text(ref_text)
    spk = read_kaldi_text(utt2spk) if utt2spk is not None and utt2spk.is_file() else {}
    missing = [u for u in refs if u not in hyps]
    if missing:
        raise PeersError(f"{hyp_text}: no hypothesis for {len(missing)} of {len(refs)} utterances of {ref_text} "
                         f"(first: {missing[0]}); the decoding did not finish: rerun it")
    extra = [u for u in hyps if u not in refs]
    if extra:
        raise PeersError(f"{hyp_text}: {len(extra)} hypotheses for utterances not in {ref_text} (first: {extra[0]})")
    out = []
    for u, ref in refs.items():
        hyp = " ".join(hyps[u].replace("<space>", " ").split())
        rec = {"id": u, "ref": ref, "hyp": hyp, "duration": float(durations[u])}
        if u in spk:
            rec["speaker"] = spk[u]
        out.append(rec)
    return out


def write_espnet_decode_dir(out_dir: Path, records: list[dict], set_name: str, wall_seconds: float,
                            peak_rss_bytes: int | None, bins: list, model: str, beam: int, threads: int) -> dict:
    """``hyp.jsonl`` + ``decode_info.json`` as ``asrkit decode`` writes them, for ESPnet's output."""
    from asrkit.scoring import bin_index, bin_labels
    from asrkit.utils import atomic_write

    audio = sum(r["duration"] for r in records)
    edges = tuple(bins)
    per_bin = [{"label": lab, "utterances": 0, "audio_seconds": 0.0, "decode_seconds": 0.0, "rtf": None,
                "peak_rss_delta_bytes": None} for lab in bin_labels(edges)]
    for r in records:  # ESPnet reports no per-utterance time: the set's wall time shared by audio duration
        b = per_bin[bin_index(r["duration"], edges)]
        b["utterances"] += 1
        b["audio_seconds"] += r["duration"]
        b["decode_seconds"] += wall_seconds * r["duration"] / max(audio, 1e-9)
    for b in per_bin:
        if b["audio_seconds"] > 0:
            b["rtf"] = b["decode_seconds"] / b["audio_seconds"]
    info = {"set": set_name, "decoder": "espnet greedy CTC" if beam <= 0 else f"espnet asr_inference (beam {beam})",
            "beam": beam,
            "hop": 0.01, "batch_size": 1, "nj": 1, "utterances": len(records), "audio_seconds": audio,
            "wall_seconds": wall_seconds, "rtf": wall_seconds / max(audio, 1e-9), "model_rtf": None,
            "threads": threads, "lm": None, "decode_seconds": wall_seconds, "peak_rss_bytes": peak_rss_bytes,
            "peak_rss_delta_bytes": None, "memory_method": "ru_maxrss of the decoding process", "bins": per_bin,
            "model": model}
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_write(out_dir / "hyp.jsonl") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    with atomic_write(out_dir / "decode_info.json") as f:
        json.dump(info, f, indent=1)
    return info


