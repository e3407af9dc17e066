"""Decoding methods: the model's encoder output -> one hypothesis text per utterance.

``decode.method`` picks one class of :data:`DECODE_METHODS` (the single list of valid values);
adding a method is one class here (or in its own module) plus one registry line.

========== ======================================================== ===============================
method     what                                                     needs
========== ======================================================== ===============================
greedy     best CTC label per frame, repeats merged, blanks dropped  -
prefix_beam CTC prefix beam search, optional word n-gram fusion     ``decode.lm`` = ARPA (optional)
wfst       TLG graph search (kaldi-decoder)                          ``decode.lm`` = graph dir
attention  beam search of the attention decoder (+ CTC prefix)       ``decoder.type`` lstm|transformer
========== ======================================================== ===============================

``decode.device`` (:func:`resolve_device`) says where the model runs; a batch is moved there, and
the searches that run on the CPU (prefix beam, WFST) get their log-probabilities there.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from asrkit.model.asr import EncoderOutput, NoFramesError
from asrkit.schema import ConfigError


class DecodeMethod:
    """Base class. ``__call__(enc)`` returns one text per utterance of the encoder output."""

    name: ClassVar[str] = ""

    def __init__(self, model, cfg, tokenizer):
        self.model, self.cfg, self.tok = model, cfg, tokenizer

    @classmethod
    def check_config(cls, cfg) -> None:
        """Config-time checks of what this method needs (raise :class:`ConfigError`)."""

    def __call__(self, enc: EncoderOutput) -> list[str]:
        raise NotImplementedError


class Greedy(DecodeMethod):
    name = "greedy"

    def __call__(self, enc: EncoderOutput) -> list[str]:
        from asrkit.decode.ctc import ctc_greedy

        return [self.tok.decode(h) for h in ctc_greedy(enc.log_probs, enc.lengths)]


class PrefixBeam(DecodeMethod):
    name = "prefix_beam"

    def __init__(self, model, cfg, tokenizer):
        super().__init__(model, cfg, tokenizer)
        self.lm = None
        if cfg.decode.lm:
            from asrkit.decode.ngram import NgramLM

            self.lm = NgramLM.from_arpa(cfg.decode.lm)

    def __call__(self, enc: EncoderOutput) -> list[str]:
        from asrkit.decode.ctc import ctc_prefix_beam_search

        d = self.cfg.decode
        hyps = ctc_prefix_beam_search(enc.log_probs.cpu(), enc.lengths.cpu(), beam=d.beam, lm=self.lm, lm_weight=d.lm_weight,
                                      word_bonus=d.word_bonus, tokenizer=self.tok)
        return [self.tok.decode(h.tokens) for h in hyps]


class Wfst(DecodeMethod):
    name = "wfst"

    def __init__(self, model, cfg, tokenizer):
        super().__init__(model, cfg, tokenizer)
        from asrkit.decode.wfst import WfstDecoder

        if not cfg.decode.lm:
            raise ConfigError("decode.method=wfst needs decode.lm (a graph directory built by `asrkit lm graph`)")
        self.wfst = WfstDecoder(cfg.decode.lm, beam=cfg.decode.search_beam, max_active=cfg.decode.max_active,
                                lm_scale=cfg.decode.lm_weight)

    def __call__(self, enc: EncoderOutput) -> list[str]:
        return [" ".join(words).upper() for words in self.wfst.decode(enc.log_probs, enc.lengths)]


class AttentionBeam(DecodeMethod):
    """Beam search of the attention decoder with its own search options (``decoder.options.search_*``);
    ``decode.ctc_weight`` >= 0 overrides the joint CTC weight."""

    name = "attention"

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.decoder.type == "none":
            raise ConfigError("decode.method=attention needs an attention decoder (decoder.type: lstm | transformer)")

    def __init__(self, model, cfg, tokenizer):
        super().__init__(model, cfg, tokenizer)
        dec = model.decoder
        if tokenizer is not None and tokenizer.vocab_size != dec.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, the decoder {dec.vocab_size}")
        self.search = dec.search
        if cfg.decode.ctc_weight >= 0:  # decode-time override of the joint CTC weight
            self.search = dataclasses.replace(self.search, ctc_weight=cfg.decode.ctc_weight)

    def tokens(self, enc: EncoderOutput) -> list[list[int]]:
        """The best hypothesis of every utterance as token ids."""
        from asrkit.decode.attention import beam_search

        if self.search.ctc_weight > 0 and enc.log_probs is None:
            raise ValueError("joint CTC scoring (decode.ctc_weight > 0) needs a CTC head: train with decoder.ctc_weight > 0")
        return [h[0].tokens if h else [] for h in beam_search(self.model.decoder, enc, self.cfg.decode.beam, self.search)]

    def __call__(self, enc: EncoderOutput) -> list[str]:
        return [self.tok.decode(t) for t in self.tokens(enc)]


#: decode.method -> class
DECODE_METHODS: dict[str, type[DecodeMethod]] = {m.name: m for m in (Greedy, PrefixBeam, Wfst, AttentionBeam)}


#: the valid forms of decode.device (``cuda:N``: the N-th visible GPU)
DEVICES = ("auto", "cpu", "cuda", "cuda:N")


def resolve_device(spec: str, key: str = "decode.device") -> torch.device:
    """The torch device of a ``decode.device`` value (see :data:`DEVICES`): ``auto`` is the first
    GPU when CUDA is available, else the CPU. A GPU that is not there is a :class:`ConfigError`
    (one line, saying what to use instead)."""
    spec = str(spec).strip().lower()
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or (spec.startswith("cuda:") and spec[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={spec}: no CUDA device is available here (torch.cuda.is_available() is "
                              f"False: a CPU-only torch build or no GPU); use {key}=cpu (or auto)")
        index = int(spec[5:]) if ":" in spec else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{key}={spec}: only {torch.cuda.device_count()} CUDA device(s) are visible "
                              f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
        return torch.device(f"cuda:{index}")
    raise ConfigError(f"config key {key!r}: invalid value {spec!r}; valid: {', '.join(DEVICES)}")


def validate_decode_config(cfg) -> None:
    """The ``decode`` section: a known method and what it needs, ranges. Raises :class:`ConfigError`."""
    d = cfg.decode
    if d.method not in DECODE_METHODS:
        raise ConfigError(f"config key 'decode.method': invalid value {d.method!r}; valid: {', '.join(DECODE_METHODS)}")
    if d.beam < 1 or d.batch_size < 1:
        raise ConfigError(f"decode.beam={d.beam} and decode.batch_size={d.batch_size} must be >= 1")
    if d.hop < 0:
        raise ConfigError(f"decode.hop={d.hop} must be >= 0 seconds (0 = the training hop)")
    if d.blank_penalty < 0:
        raise ConfigError(f"decode.blank_penalty={d.blank_penalty} must be >= 0 (0 = off)")
    if d.search_beam <= 0:
        raise ConfigError(f"decode.search_beam={d.search_beam} must be > 0 (the TLG search's pruning beam; default 16)")
    if d.max_active < 2:
        raise ConfigError(f"decode.max_active={d.max_active} must be >= 2 (kaldi-decoder's minimum; default 7000)")
    if d.ctc_weight != -1.0 and not 0.0 <= d.ctc_weight <= 1.0:
        raise ConfigError(f"decode.ctc_weight={d.ctc_weight} must be in [0, 1] (or -1: the model's own)")
    if list(d.bins) != sorted(d.bins):
        raise ConfigError(f"decode.bins must be increasing, got {d.bins}")
    dev = str(d.device).strip().lower()
    if dev not in ("auto", "cpu", "cuda") and not (dev.startswith("cuda:") and dev[5:].isdigit()):
        raise ConfigError(f"config key 'decode.device': invalid value {d.device!r}; valid: {', '.join(DEVICES)}")
    DECODE_METHODS[d.method].check_config(cfg)


def with_blank_penalty(enc: EncoderOutput, penalty: float) -> EncoderOutput:
    """The encoder output with ``penalty`` subtracted from the blank's (label 0) CTC log-probability
    of every frame (``decode.blank_penalty``); the same object when 0 or without a CTC head."""
    if not penalty or enc.log_probs is None:
        return enc
    lp = enc.log_probs.clone()
    lp[..., 0] -= penalty
    return dataclasses.replace(enc, log_probs=lp)


class Decoder:
    """A batch -> hypothesis texts with the configured ``decode.method`` (encoder pass included)."""

    def __init__(self, model, cfg, tokenizer):
        self.model, self.cfg, self.tok = model, cfg, tokenizer
        if getattr(tokenizer, "kind", "") == "phones" and cfg.decode.method != Wfst.name:
            raise ConfigError(
                f"decode.method={cfg.decode.method} writes phones, not words, for this phone model (tokens.kind="
                "phones): decode with decode.method=wfst decode.lm=<graph dir>, a TLG graph of the model's tokenizer "
                "(`asrkit lm graph --tokens <tokenizer.json> --arpa <lm.arpa> --out <graph dir>`)")
        self.method = DECODE_METHODS[cfg.decode.method](model, cfg, tokenizer)

    @torch.no_grad()
    def encode(self, batch: dict) -> EncoderOutput:
        """The encoder output of a batch (an utterance too short for the model is named)."""
        # the batch goes where the model is (decode.device); a model without parameters stays put
        param = next(self.model.parameters(), None)
        dev = param.device if param is not None else None
        feats, lens, times = (batch[k].to(dev) if isinstance(batch[k], torch.Tensor) and dev is not None else batch[k]
                              for k in ("feats", "feat_lens", "times"))
        try:
            return self.model.encode(feats, lens, times)
        except NoFramesError as e:
            raise e.naming(batch["ids"]) from None

    def search(self, enc: EncoderOutput) -> list[str]:
        """The hypothesis texts of an encoder output (``decode.blank_penalty`` applied first)."""
        return self.method(with_blank_penalty(enc, self.cfg.decode.blank_penalty))

    @torch.no_grad()
    def decode(self, batch: dict) -> tuple[EncoderOutput, list[str]]:
        """The encoder output (for alignments, analyses) and the hypothesis texts."""
        enc = self.encode(batch)
        return enc, self.search(enc)

    def __call__(self, batch: dict) -> list[str]:
        return self.decode(batch)[1]
