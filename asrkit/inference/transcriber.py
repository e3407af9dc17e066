"""Transcribe recordings with a trained model: :func:`load_model` and :class:`Transcriber`.

    import asrkit
    model = asrkit.load_model("model/")                 # a package (asrkit export) or an experiment dir
    r = model.transcribe("talk.flac")                    # Transcript: r.text, r.words [Word(word, start, end)]
    rs = model.transcribe(["a.wav", "b.mp3", samples], sample_rate=8000)   # several: a list, batched

Every input is cut into segments (one, or overlapping chunks for long recordings, see
:mod:`asrkit.inference.chunking`), featurized exactly as in training and decoding (on-the-fly
fbank, per-segment CMVN), and decoded in batches of ``batch_size`` segments with the configured
method (:class:`asrkit.decode.methods.Decoder`: greedy, prefix beam with an LM, WFST graph,
attention beam). Each hypothesis is aligned to its segment's frames (:mod:`asrkit.inference.align`)
for word timings, and chunks are merged between words. Audio is read one segment at a time, so
memory does not grow with the length of a recording beyond its transcript.

An input that cannot be transcribed (unreadable, empty, shorter than ``min_duration``) raises
:class:`~asrkit.inference.audio.InputError` naming it, or with ``on_error="keep"`` gives a
:class:`Transcript` whose ``error`` says why, and the other inputs are still transcribed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from asrkit.decode.ctc import word_boundary_kind
from asrkit.inference.align import (TokenTime, Word, attention_frames, best_pronunciations, ctc_align, token_times,
                                   uniform_spans, words_from_tokens)
from asrkit.inference.audio import Audio, InputError, open_audio
from asrkit.inference.chunking import Chunk, merge_chunks, plan_chunks

logger = logging.getLogger(__name__)


@dataclass
class Transcript:
    """The transcript of one input: ``text``, ``words`` with times (seconds), ``duration`` of the
    input, its ``name``, and ``error`` (None, or why it could not be transcribed)."""

    name: str
    text: str = ""
    words: list = field(default_factory=list)
    duration: float = 0.0
    error: Optional[str] = None

    def to_dict(self) -> dict:
        d = {"file": self.name, "text": self.text, "duration": round(self.duration, 3),
             "words": [w.to_dict() for w in self.words]}
        if self.error is not None:
            d["error"] = self.error
        return d


@dataclass
class _Segment:
    item: int  #: index of the input
    index: int  #: of the chunk in the input
    chunk: Chunk
    feats: torch.Tensor
    times: torch.Tensor


class Transcriber:
    """A loaded model ready to transcribe; see the module docstring. Build with :func:`load_model`.

    ``chunk_s`` / ``overlap_s``: recordings longer than ``chunk_s`` are decoded in chunks of that
    length overlapping by ``overlap_s``. ``batch_size``: segments per model call.
    ``min_duration``: shorter inputs are errors (seconds)."""

    def __init__(self, model, cfg, tokenizer, info: Optional[dict] = None, chunk_s: float = 30.0,
                 overlap_s: float = 6.0, batch_size: int = 8, min_duration: float = 0.1):
        from asrkit.decode.methods import Decoder

        self.model, self.cfg, self.tokenizer = model, cfg, tokenizer
        self.info = info or {}
        self.chunk_s, self.overlap_s = float(chunk_s), float(overlap_s)
        self.batch_size = max(1, int(batch_size))
        self.hop = cfg.decode.hop or cfg.features.hop
        self.frame_step = self.hop * cfg.frontend.stride  # seconds per encoder frame
        self.min_duration = max(float(min_duration), self.frame_step)
        self._decoder = Decoder(model, cfg, tokenizer)
        plan_chunks(1, 1, self.chunk_s, self.overlap_s, 0.0)  # validate the chunk options now

    @property
    def sample_rate(self) -> int:
        return int(self.cfg.features.sample_rate)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------------------ public
    def transcribe(self, inputs, sample_rate: Optional[int] = None, *, progress: bool = False,
                   on_error: str = "raise") -> Union[Transcript, list[Transcript]]:
        """Transcribe one input (a path, ``"-"``, bytes, or an array of samples with its
        ``sample_rate``) or a list of them (batched). Returns a :class:`Transcript` or a list."""
        single = not isinstance(inputs, (list, tuple))
        results = list(self.iter_transcribe([inputs] if single else list(inputs), sample_rate,
                                            progress=progress, on_error=on_error))
        return results[0] if single else results

    def iter_transcribe(self, inputs: Sequence, sample_rate: Optional[int] = None, *, progress: bool = False,
                        on_error: str = "raise", names: Optional[Sequence[str]] = None) -> Iterator[Transcript]:
        """Like :meth:`transcribe` for a list, yielding each :class:`Transcript` (in input order) as
        soon as it is done."""
        from tqdm import tqdm

        if on_error not in ("raise", "keep"):
            raise ValueError(f"on_error must be 'raise' or 'keep', got {on_error!r}")
        bar = tqdm(desc="transcribe", unit="s", total=0, disable=not progress, dynamic_ncols=True, leave=False)
        pending: dict[int, dict] = {}  # item -> {"transcript", "chunks", "words", "left"}
        done: dict[int, Transcript] = {}
        batch: list[_Segment] = []
        next_out = 0

        def decode_batch() -> None:
            nonlocal batch
            for seg, words in zip(batch, self._decode(batch)):
                p = pending[seg.item]
                p["words"][seg.index] = words
                p["left"] -= 1
                bar.update(round(seg.chunk.length / self.sample_rate, 2))
                if p["left"] == 0:
                    t = pending.pop(seg.item)["transcript"]
                    t.words = merge_chunks(p["chunks"], p["words"], self.frame_step)
                    t.text = " ".join(w.word for w in t.words)
                    done[seg.item] = t
            batch = []

        def ready() -> Iterator[Transcript]:  # finished transcripts, in input order
            nonlocal next_out
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1

        try:
            for i, src in enumerate(inputs):
                t = Transcript(names[i] if names is not None else _name(src))
                try:
                    with open_audio(src, self.sample_rate, sample_rate, name=t.name) as audio:
                        t.duration = audio.duration
                        chunks = self._check(audio)
                        bar.total += round(audio.duration, 2)
                        pending[i] = {"transcript": t, "chunks": chunks, "words": [None] * len(chunks),
                                      "left": len(chunks)}
                        for k, ch in enumerate(chunks):
                            batch.append(self._segment(i, k, audio, ch))
                            if len(batch) >= self.batch_size:
                                decode_batch()
                                yield from ready()
                except InputError as e:
                    if on_error == "raise":
                        raise
                    pending.pop(i, None)
                    batch = [s for s in batch if s.item != i]
                    t.error = str(e)
                    done[i] = t
                yield from ready()
            if batch:
                decode_batch()
            yield from ready()
        finally:
            bar.close()

    # ----------------------------------------------------------------------------- internals
    def _check(self, audio: Audio) -> list[Chunk]:
        if audio.num_samples == 0:
            raise InputError(f"{audio.name}: empty (no audio samples)")
        if audio.duration < self.min_duration:
            raise InputError(f"{audio.name}: too short ({audio.duration:.3f} s; at least {self.min_duration:g} s needed)")
        return plan_chunks(audio.num_samples, self.sample_rate, self.chunk_s, self.overlap_s, self.frame_step)

    def _segment(self, item: int, index: int, audio: Audio, chunk: Chunk) -> _Segment:
        from asrkit.data.features import cmvn, fbank

        x = audio.read(chunk.start, chunk.length)
        if not np.isfinite(x).all():
            raise InputError(f"{audio.name}: audio has NaN or infinite samples")
        fc = self.cfg.features
        feats = fbank(x, fc.sample_rate, self.hop, fc.win, fc.n_mels, fc.dither)
        if fc.cmvn:
            feats = cmvn(feats)
        times = torch.arange(feats.shape[0], dtype=torch.float32) * self.hop
        return _Segment(item, index, chunk, feats, times)

    @torch.no_grad()
    def _decode(self, segs: list[_Segment]) -> list[list[Word]]:
        from asrkit.data.dataset import Utterance, collate

        utts = [Utterance(f"{s.item}:{s.chunk.start}", s.feats, s.times, [], "", s.chunk.length / self.sample_rate)
                for s in segs]
        batch = collate(utts)
        dev = self.device
        batch = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        enc, texts = self._decoder.decode(batch)
        return [self._words(enc, b, text, s.chunk.offset) for b, (s, text) in enumerate(zip(segs, texts))]

    def _words(self, enc, b: int, text: str, offset: float) -> list[Word]:
        n = int(enc.lengths[b])
        lengths = None
        if word_boundary_kind(self.tokenizer) == "phone" and enc.log_probs is not None:
            prons = best_pronunciations(enc.log_probs[b, :n], self.tokenizer, text)
            ids, lengths = [i for p in prons for i in p], [len(p) for p in prons]
        else:
            ids = self.tokenizer.encode(text)
        times = enc.times[b, :n].float().cpu()
        use_ctc = self.model.decoder is None or self.model.ctc_weight > 0
        if use_ctc:
            edge = getattr(self.tokenizer, "word_boundary_id", None)  # letters: "|" may open / close the path
            spans = ctc_align(enc.log_probs[b, :n], ids, edge=edge) or uniform_spans(n, len(ids))
        else:
            frames = attention_frames(self.model.decoder, enc, b, ids)
            nxt = frames[1:] + [n]
            spans = [(f, max(f, g - 1)) for f, g in zip(frames, nxt)]
        aligned: list[TokenTime] = token_times(spans, ids, times, self.frame_step, offset)
        return words_from_tokens(self.tokenizer, aligned, text, lengths)


def _name(src: Any) -> str:
    if isinstance(src, (str, Path)):
        return "<stdin>" if str(src) == "-" else str(src)
    return "<bytes>" if isinstance(src, (bytes, bytearray)) else "<array>"


def load_model(path: Union[str, Path], checkpoint: str = "last", device: str = "cpu", ema: bool = True,
               decode: Union[dict, Iterable[str], None] = None, allow_pickle: bool = False, **options) -> Transcriber:
    """Load a model package (``asrkit export``) or an experiment directory for transcription.

    ``checkpoint`` / ``ema``: for an experiment dir, which checkpoint (``last``, ``best``,
    ``avg``, a path) and whether to use its moving-average weights. ``decode``: decoding
    options, ``{"method": "prefix_beam", "beam": 8}`` or ``["decode.method=prefix_beam"]``.
    ``options``: :class:`Transcriber` options (``chunk_s``, ``overlap_s``, ``batch_size``,
    ``min_duration``). ``allow_pickle``: a package of format 1 (weights in a pickle, asrkit before
    safetensors packages) may be read; even then only tensors and plain data are accepted
    (:mod:`asrkit.inference.package`). A package of the current format never needs it."""
    from asrkit.config import with_overrides
    from asrkit.inference.package import is_package, load_package
    from asrkit.model.loading import load_experiment
    from asrkit.schema import parse_overrides

    path = Path(path)
    if is_package(path):
        model, cfg, tok, info = load_package(path, device, allow_pickle=allow_pickle)
    elif (path / "checkpoints").is_dir():
        model, cfg, tok, info = load_experiment(path, checkpoint, device, ema)
    else:
        raise FileNotFoundError(f"{path} is neither a model package (written by `asrkit export`) nor an experiment "
                                "directory (no checkpoints/ in it)")
    if decode:
        if isinstance(decode, dict):
            pairs = [(k if k.startswith("decode.") else f"decode.{k}", v) for k, v in decode.items()]
        else:
            pairs = parse_overrides(list(decode))
        bad = [k for k, _ in pairs if not k.startswith("decode.")]
        if bad:
            from asrkit.schema import ConfigError

            raise ConfigError(f"only decode.* options can be changed for transcription, got {', '.join(bad)}")
        cfg = with_overrides(cfg, pairs)
    return Transcriber(model, cfg, tok, info, **options)
