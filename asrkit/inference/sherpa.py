"""sherpa-onnx: the exported CTC model in the form its offline recognizer reads.

sherpa-onnx (k2-fsa/sherpa-onnx) runs offline CTC models of several types; each type fixes the
graph's interface and the feature extraction the runtime does before calling it. asrkit's
export (:mod:`asrkit.inference.onnx`) has the interface of its **zipformer CTC** type
(``OfflineRecognizer.from_zipformer_ctc(model=..., tokens=...)``, C++ ``--zipformer-ctc-model``):

* inputs ``x`` (N x T x 80 float, the runtime's fbank) and ``x_lens`` (N, int64), outputs
  ``log_probs`` (N x T' x V) and ``log_probs_len`` (N, int64), passed positionally; V is read
  from the output shape, no metadata is required (``model_type=zipformer2_ctc`` is stored anyway);
* ``tokens.txt``: ``SYMBOL ID`` per line; the greedy decoder needs the blank as ``<blk>``,
  ``<eps>`` or ``<blank>`` (asrkit's id 0 is ``<blank>``); a symbol starting with ``▁`` is
  written as a space (asrkit's letter word boundary ``|`` is written as ``▁``; letters upper case,
  as asrkit writes transcripts); a phone model's phones are written with a leading ``▁`` each,
  so sherpa-onnx's greedy search writes them space-separated, as asrkit's phone tokenizer does
  (words come only from a TLG graph: ``asrkit transcribe --model PACKAGE``);
* features: kaldi-native-fbank with the runtime's defaults for this type: 25 ms povey window,
  10 ms shift, 80 bins from 20 Hz to Nyquist - 400 Hz, pre-emphasis 0.97, DC offset removed, no
  dither, ``snip_edges=false`` and **no normalization**, on samples in [-1, 1];
* timestamps: the runtime assumes 4 input frames per output frame (10 ms each): right for a
  frontend stride of 4, scaled by stride / 4 otherwise (the text is unaffected).

asrkit's features are Lhotse's ``Wav2LogFilterBank`` with the same Kaldi settings on samples
scaled to the int16 range, then per-utterance CMVN. The export puts the CMVN inside the graph,
which also cancels the scale (a constant offset of each log-energy). What remains
(:func:`feature_gap` measures it) is the energy floor: kaldi-native-fbank clamps each mel energy
at float epsilon (1.2e-7) of [-1, 1] samples, i.e. log-energy 4.85 on asrkit's int16 scale,
where Lhotse clamps at 1e-10 (log -23). Mel bins quieter than that (the band above a
recording's low-pass, digital silence) read higher in sherpa-onnx; everything else agrees to
~1e-5 after CMVN.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from asrkit.decode.ctc import SP_SPACE, WORD_BOUNDARY, word_boundary_kind

MODEL_TYPE = "zipformer2_ctc"
#: log of kaldi-native-fbank's energy floor (float epsilon) for [-1, 1] samples, on the int16 scale
KNF_FLOOR_INT16 = float(np.log(np.finfo(np.float32).eps) + 2 * np.log(32768.0))


def sherpa_tokens(tokenizer) -> list[str]:
    """The symbols of ``tokens.txt`` in id order."""
    out = []
    phones = word_boundary_kind(tokenizer) == "phone"
    for i, t in enumerate(tokenizer.tokens):
        if i == getattr(tokenizer, "blank_id", 0):
            out.append("<blank>")
        elif phones:
            out.append(SP_SPACE + t)
        elif t == WORD_BOUNDARY:
            out.append(SP_SPACE)
        elif t.startswith("<"):
            out.append(t)
        else:
            out.append(t.upper())
    return out


def write_tokens(tokenizer, path: Path | str) -> Path:
    path = Path(path)
    syms = sherpa_tokens(tokenizer)
    if len(set(syms)) != len(syms):
        raise ValueError("the tokenizer has symbols that coincide in sherpa-onnx's tokens.txt (case or ▁)")
    path.write_text("".join(f"{s} {i}\n" for i, s in enumerate(syms)), encoding="utf-8")
    return path


def recognizer(model: Path | str, tokens: Path | str, threads: int = 1, sample_rate: int = 16000,
               feature_dim: int = 80):
    """A ``sherpa_onnx.OfflineRecognizer`` for an exported model (greedy search)."""
    import sherpa_onnx

    return sherpa_onnx.OfflineRecognizer.from_zipformer_ctc(
        model=str(model), tokens=str(tokens), num_threads=threads, sample_rate=sample_rate,
        feature_dim=feature_dim, decoding_method="greedy_search")


def transcribe(rec, recordings: Iterable[tuple[np.ndarray, int]]) -> list[str]:
    """sherpa-onnx transcripts of ``(samples in [-1, 1], sample rate)`` recordings, one stream each."""
    texts = []
    for samples, sr in recordings:
        s = rec.create_stream()
        s.accept_waveform(sr, np.ascontiguousarray(samples, dtype=np.float32))
        rec.decode_stream(s)
        texts.append(" ".join(s.result.text.split()))
    return texts


def sherpa_fbank(samples: np.ndarray, sample_rate: int = 16000, n_mels: int = 80) -> torch.Tensor:
    """The features sherpa-onnx computes for this model type (kaldi-native-fbank, see the module
    doc), shifted to asrkit's int16 scale (+ 2 ln 32768) so that they compare bin by bin."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = sample_rate
    opts.frame_opts.dither = 0.0
    opts.frame_opts.snip_edges = False
    opts.mel_opts.num_bins = n_mels
    opts.mel_opts.low_freq = 20.0
    opts.mel_opts.high_freq = -400.0
    fb = knf.OnlineFbank(opts)
    fb.accept_waveform(sample_rate, np.asarray(samples, dtype=np.float32).tolist())
    fb.input_finished()
    feats = np.stack([fb.get_frame(i) for i in range(fb.num_frames_ready)]) if fb.num_frames_ready else np.zeros((0, n_mels))
    return torch.from_numpy(feats.astype(np.float32)) + float(2 * np.log(32768.0))


def feature_gap(recordings: Iterable[np.ndarray], cfg) -> dict:
    """How sherpa-onnx's features differ from asrkit's on ``recordings`` (samples at the model's
    rate): before CMVN (median / max absolute difference per bin, fraction of bins clamped by
    the knf floor) and after CMVN (what the model sees: mean / max absolute difference)."""
    from asrkit.data.features import cmvn, fbank

    fc = cfg.features
    raw, norm, clamped, n = [], [], 0, 0
    worst_raw = worst_norm = 0.0
    for x in recordings:
        a = fbank(x, fc.sample_rate, fc.hop, fc.win, fc.n_mels, 0.0)
        b = sherpa_fbank(x, fc.sample_rate, fc.n_mels)
        if a.shape != b.shape:
            raise ValueError(f"frame counts differ: asrkit {tuple(a.shape)}, sherpa-onnx {tuple(b.shape)}")
        d = (a - b).abs()
        raw.append(d.flatten())
        worst_raw = max(worst_raw, float(d.max()))
        clamped += int((a < KNF_FLOOR_INT16).sum())
        n += a.numel()
        dn = (cmvn(a) - cmvn(b)).abs()
        norm.append(dn.flatten())
        worst_norm = max(worst_norm, float(dn.max()))
    raw_all, norm_all = torch.cat(raw), torch.cat(norm)
    return {"bins": n, "raw_median_abs_diff": float(raw_all.median()), "raw_max_abs_diff": worst_raw,
            "floored_fraction": clamped / max(n, 1), "cmvn_mean_abs_diff": float(norm_all.mean()),
            "cmvn_max_abs_diff": worst_norm,
            "cmvn_frac_over_1e-3": float((norm_all > 1e-3).float().mean())}


def export_sherpa(onnx_path: Path | str, tokenizer, out_dir: Path | str) -> dict:
    """Add sherpa-onnx's metadata to an exported model and write ``tokens.txt`` next to it."""
    import onnx

    onnx_path, out_dir = Path(onnx_path), Path(out_dir)
    m = onnx.load(str(onnx_path))
    props = {p.key: p.value for p in m.metadata_props}
    props.update({"model_type": MODEL_TYPE, "comment": "asrkit CTC model, sherpa-onnx zipformer CTC interface"})
    del m.metadata_props[:]
    for k, v in props.items():
        m.metadata_props.add(key=k, value=v)
    onnx.save(m, str(onnx_path))
    tokens = write_tokens(tokenizer, out_dir / "tokens.txt")
    return {"model": str(onnx_path), "tokens": str(tokens)}


def sherpa_command(model: Path | str, tokens: Path | str, wav: str = "recording.wav") -> str:
    return (f"sherpa-onnx-offline --zipformer-ctc-model={model} --tokens={tokens} --decoding-method=greedy_search {wav}")


__all__ = ["sherpa_tokens", "write_tokens", "recognizer", "transcribe", "sherpa_fbank", "feature_gap",
           "export_sherpa", "sherpa_command", "MODEL_TYPE", "KNF_FLOOR_INT16"]

