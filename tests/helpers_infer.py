"""Fixtures for the inference tests: a "tone language" whose words are known in time, a hand-built
CTC model of it, random-weight experiment dirs, and test audio.

Tone language: the words ``A``, ``B``, ``C``, ``D``, ``E`` (letters tokenizer) are pure tones of
:data:`FREQS` Hz, 0.2-0.35 s long, separated by 0.15-0.4 s of faint noise. A recording says a
random sequence of them; :func:`render` returns the audio and each word's true start and end, so
tests can check word timings and, on recordings of minutes, that chunked decoding neither drops
nor repeats a word at a seam. :class:`ToneOracle` is a hand-built CTC model that recognizes it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SR = 16000
FREQS = {"A": 300.0, "B": 550.0, "C": 900.0, "D": 1400.0, "E": 2200.0}
WORDS = list(FREQS)


def render(words: list[str], rng: np.random.Generator, lead: float = 0.3) -> tuple[np.ndarray, list[tuple[str, float, float]]]:
    """Audio of ``words`` (float32, 16 kHz) and the true ``(word, start, end)`` of each."""
    parts, spans, t = [0.003 * rng.standard_normal(int(lead * SR))], [], lead
    for w in words:
        dur = float(rng.uniform(0.2, 0.35))
        n = int(dur * SR)
        env = np.minimum(1.0, np.minimum(np.arange(n), n - np.arange(n)) / (0.01 * SR))  # 10 ms ramps
        tone = 0.3 * env * np.sin(2 * np.pi * FREQS[w] * np.arange(n) / SR + rng.uniform(0, 6.28))
        parts.append(tone + 0.003 * rng.standard_normal(n))
        spans.append((w, t, t + n / SR))
        t += n / SR
        gap = int(float(rng.uniform(0.15, 0.4)) * SR)
        parts.append(0.003 * rng.standard_normal(gap))
        t += gap / SR
    return np.concatenate(parts).astype(np.float32), spans


def random_words(rng: np.random.Generator, lo: int, hi: int) -> list[str]:
    return [WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(lo, hi + 1)))]


class ToneOracle:
    """A hand-built CTC "model" of the tone language with the :class:`asrkit.model.asr.AsrModel`
    interface (``encode``), for a :class:`~asrkit.inference.Transcriber`: an output frame (4
    filterbank frames, 40 ms) holding a word's tone emits its letter, the first frame after a
    tone emits the word boundary, anything else blank. Its output depends on 2 output frames
    only, so chunked decoding must give exactly the words of whole-recording decoding."""

    stride = 4

    def __init__(self, bins: dict, threshold: float):
        import torch

        from asrkit.tokenizer import CharTokenizer

        self.tok = CharTokenizer()
        self.bins = bins  # letter -> mel bin of its tone
        self.threshold = threshold
        self.decoder, self.ctc_weight, self.vocab_size = None, 1.0, self.tok.vocab_size
        self._param = torch.nn.Parameter(torch.zeros(1))

    def parameters(self):
        return iter([self._param])

    def encode(self, feats, lengths, times):
        import torch

        from asrkit.model.asr import EncoderOutput

        B, T, F = feats.shape
        s = self.stride
        Tp = -(-T // s)
        x = torch.nn.functional.pad(feats, (0, 0, 0, Tp * s - T), value=-1e4).view(B, Tp, s, F).amax(2)
        letters = list(self.bins)
        e = x[:, :, [self.bins[c] for c in letters]]  # B x Tp x words
        on = e.amax(-1) > self.threshold
        ids = torch.tensor([self.tok.encode(c.lower())[0] for c in letters])[e.argmax(-1)]
        prev_on = torch.cat([torch.zeros_like(on[:, :1]), on[:, :-1]], 1)
        label = torch.where(on, ids, torch.where(prev_on, torch.tensor(self.tok.word_boundary_id), torch.tensor(0)))
        lp = torch.log_softmax(10.0 * torch.nn.functional.one_hot(label, self.vocab_size).float(), -1)
        lens = torch.div(lengths + s - 1, s, rounding_mode="floor")
        mask = torch.arange(Tp)[None] < lens[:, None]
        return EncoderOutput(lp, lens, mask, times[:, ::s][:, :Tp], lp)


def tone_oracle(**transcriber_options):
    """A :class:`~asrkit.inference.Transcriber` over :class:`ToneOracle` (fbank without CMVN). Each
    word's mel bin is read off the filterbank of its rendered tone."""
    from asrkit.config import load_config
    from asrkit.data.features import fbank
    from asrkit.inference import Transcriber

    cfg = load_config(ROOT / "conf" / "ctc_tiny.yaml", ["features.n_mels=40", "features.cmvn=false", "frontend.stride=4"])
    bins, peaks = {}, []
    for w, f in FREQS.items():
        tone = fbank(0.3 * np.sin(2 * np.pi * f * np.arange(SR // 2) / SR), SR, 0.01, 0.025, 40).mean(0)
        bins[w] = int(tone.argmax())
        peaks.append(float(tone.max()))
    noise = fbank(0.003 * np.random.default_rng(0).standard_normal(SR), SR, 0.01, 0.025, 40)
    oracle = ToneOracle(bins, 0.5 * (float(noise.max()) + min(peaks)))  # halfway between noise and tones
    return Transcriber(oracle, cfg, oracle.tok, **transcriber_options)


def random_exp(root: Path, overrides: list[str], name: str = "rand", seed: int = 0, boundary_bias: float = 0.0,
               tokenizer=None) -> Path:
    """An experiment dir with one checkpoint of a randomly initialized model (``conf/ctc_tiny.yaml``
    + ``overrides``) and a tokenizer (``tokenizer``, default letters) at a path relative to
    ``root`` (the recipe dir).
    ``boundary_bias`` > 0: CTC head weights x 4 and that bias on the word boundary ``|``, so the
    random model writes many short "words" (gaps between words for chunk merging)."""
    import torch

    from asrkit.checkpoint import save_checkpoint
    from asrkit.config import load_config, to_dict
    from asrkit.model import build_model
    from asrkit.tokenizer import CharTokenizer, save_tokenizer

    tok = tokenizer or CharTokenizer()
    (root / "data" / "tokens").mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, root / "data" / "tokens" / f"{tok.kind}.json")
    cfg = load_config(ROOT / "conf" / "ctc_tiny.yaml", [f"tokens.path=data/tokens/{tok.kind}.json", *overrides])
    torch.manual_seed(seed)
    model = build_model(cfg, tok.vocab_size)
    if boundary_bias:
        with torch.no_grad():
            model.ctc_head.weight.mul_(4.0)
            model.ctc_head.bias[tok.word_boundary_id] += boundary_bias
    exp = root / "exp" / name
    save_checkpoint(exp, "step-00000001", {"model": model.state_dict(), "config": to_dict(cfg), "vocab": tok.tokens,
                                           "step": 1})
    return exp


def espeak(text: str, voice: str = "en", rate: int = 175, pitch: int = 50) -> tuple[np.ndarray, int]:
    """``text`` spoken by the espeak-ng library the mini corpus uses (the ``espeakng-loader`` wheel,
    in-process): float32 samples at 22.05 kHz. The defaults are the espeak-ng program's (voice
    ``en``, 175 words per minute, pitch 50), which this replaces: tests take no program from the
    machine that ``tools/setup.sh`` does not install."""
    from asrkit.data.synth import ESPEAK_SAMPLE_RATE, _Espeak

    global _ENGINE
    if _ENGINE is None:
        _ENGINE = _Espeak()
    _ENGINE.set_voice(voice)
    _ENGINE.set_prosody(rate, pitch, 50, seed=0)
    return _ENGINE.synth(text).astype(np.float32) / 32768.0, ESPEAK_SAMPLE_RATE


_ENGINE = None


def speech(root: Path, text: str = "hello world this is a test of the recognizer", name: str = "speech") -> Path:
    """espeak-ng speech (22.05 kHz WAV) with a noise floor added (white, 0.003 rms, plus noise
    below 300 Hz, 0.01 rms): no bin of its filterbank then reaches sherpa-onnx's energy floor,
    which pre-emphasis and DC removal make the lowest mel bins of quiet audio hit (see
    :mod:`asrkit.inference.sherpa`)."""
    import soundfile as sf
    from scipy.signal import butter, sosfilt

    x, sr = espeak(text)
    rng = np.random.default_rng(0)
    low = sosfilt(butter(4, 300, btype="low", fs=sr, output="sos"), rng.standard_normal(x.size))
    noise = 0.003 * rng.standard_normal(x.size) + 0.01 * low / low.std()
    out = root / f"{name}.wav"
    sf.write(out, (x + noise).astype(np.float32), sr)
    return out
