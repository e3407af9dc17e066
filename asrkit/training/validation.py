"""Validation during training: dev loss and dev WER per duration bin, with greedy CTC and, as
``train.valid_decode`` says, the decoder the recipe decodes with (``decode.method`` and its
``decode.*`` options: prefix beam search with an n-gram LM, a TLG graph, the attention decoder).

Greedy CTC alone says little about what a model will score: on mini it reads ~60 % when the
recipe's lexicon + unigram TLG decoding of the same weights gives ~14 %. So each WER is labelled
with its method (:func:`method_label`: ``greedy CTC``, ``wfst TLG``, ``prefix_beam + LM``, ...)
in the log and in TensorBoard, and the checkpoints' ``dev_wer`` (``best``, ``asrkit average --by
best``) is the first one of :func:`valid_methods`: the decoder's when one runs besides greedy CTC,
else greedy CTC's; the index entry names it (``dev_wer_method``) and keeps every WER (``dev_wers``).

Scoring: greedy CTC is scored as before, against the transcript folded as the model was trained
(for a phone tokenizer its phones: a phone error rate); a decoder's words are scored as ``asrkit
decode`` scores them, with the corpus's normalizer (:func:`asrkit.textnorm.corpus_normalizer`).

Each rank decodes its share of the dev set (no collective while decoding); rank 0 scores the
gathered hypotheses. Runs on the moving average of the weights when there is one. The encoder
runs once per batch; every method searches its output.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import torch

from asrkit.data.audio import AudioError
from asrkit.data.dataset import stable_seed
from asrkit.decode.ctc import ctc_greedy
from asrkit.scoring import score_pairs
from asrkit.training import TrainingError
from asrkit.training.distributed import DistInfo, all_gather_object
from asrkit.training.inputs import bad_audio_message, make_eval_sampler, make_loader, rng_untouched, to_device
from asrkit.training.signals import stop_signals_deferred
from asrkit.tokenizer import reference_for_greedy

logger = logging.getLogger("asrkit.train")

GREEDY = "greedy"
#: train.valid_decode values besides the decode.method names
VALID_DECODE_MODES = ("auto", GREEDY)


def _is_phones(tokenizer) -> bool:
    return getattr(tokenizer, "kind", "") == "phones"


def valid_methods(cfg, tokenizer=None) -> list[str]:
    """The ``decode.method`` names validation scores, in the order logged: the checkpoints'
    ``dev_wer`` is the first one's. ``auto`` for a phone model whose ``decode.method`` is not wfst
    (its other methods write phones) scores greedy CTC alone."""
    v = cfg.train.valid_decode
    method = cfg.decode.method if v == "auto" else v
    if method == GREEDY or (v == "auto" and _is_phones(tokenizer) and method != "wfst"):
        return [GREEDY]
    return [method, GREEDY]


def method_label(cfg, method: str, tokenizer=None) -> str:
    """How the log and TensorBoard name a dev WER's decoding: ``greedy CTC`` (``greedy CTC phones``
    for a phone model: a phone error rate), ``prefix_beam`` / ``prefix_beam + LM``, ``wfst TLG``,
    ``attention`` / ``attention + CTC``."""
    if method == GREEDY:
        return "greedy CTC phones" if _is_phones(tokenizer) else "greedy CTC"
    if method == "prefix_beam":
        return "prefix_beam + LM" if cfg.decode.lm else "prefix_beam"
    if method == "wfst":
        return "wfst TLG"
    if method == "attention":
        w = cfg.decode.ctc_weight
        if w < 0:
            w = float((cfg.decoder.options or {}).get("search_ctc_weight", 0.0) or 0.0)
        return "attention + CTC" if w > 0 else "attention"
    return method


def check_valid_decode(cfg, tokenizer=None) -> None:
    """``train.valid_decode`` and what its decoder needs (a known method, ``decode.lm`` where the
    method reads one and the file or graph dir exists). Raises :class:`ConfigError` naming the key."""
    from pathlib import Path

    from asrkit.decode.methods import DECODE_METHODS
    from asrkit.schema import ConfigError

    v = cfg.train.valid_decode
    if v not in VALID_DECODE_MODES and v not in DECODE_METHODS:
        raise ConfigError(f"config key 'train.valid_decode': invalid value {v!r}; valid: "
                          f"{', '.join(VALID_DECODE_MODES + tuple(m for m in DECODE_METHODS if m != GREEDY))}")
    methods = valid_methods(cfg, tokenizer)
    if methods == [GREEDY]:
        return
    method = methods[0]
    why = f"train.valid_decode={v}" + (f" (decode.method={method})" if v == "auto" else "")
    if _is_phones(tokenizer) and method != "wfst":
        raise ConfigError(f"{why}: {method} writes phones, not words, for this phone model; validate with "
                          "train.valid_decode=greedy (phone error rate) or wfst (decode.lm=<TLG graph dir>)")
    if method == "wfst" and not cfg.decode.lm:
        raise ConfigError(f"{why} needs decode.lm (a TLG graph dir of `asrkit lm graph`), or set train.valid_decode=greedy")
    if cfg.decode.lm and method in ("wfst", "prefix_beam") and not Path(cfg.decode.lm).exists():
        raise ConfigError(f"{why}: decode.lm={cfg.decode.lm} does not exist (an ARPA file for prefix_beam, a graph "
                          "dir of `asrkit lm graph` for wfst); build it first (recipe stage 3) or set "
                          "train.valid_decode=greedy")
    if method == "attention" and cfg.decoder.type == "none":
        raise ConfigError(f"{why}: the attention method needs an attention decoder (decoder.type: lstm | transformer)")


class DevDecoding:
    """The decodings of :func:`valid_methods` for one model (built once per run: a TLG graph or an
    ARPA LM is loaded once). ``entries``: ``(label, search(enc) -> texts, greedy?)`` in log order."""

    def __init__(self, model: torch.nn.Module, cfg, tokenizer):
        from asrkit.textnorm import corpus_normalizer

        self.entries: list[tuple[str, Callable, bool]] = []
        for method in valid_methods(cfg, tokenizer):
            label = method_label(cfg, method, tokenizer)
            if method == GREEDY:
                self.entries.append((label, lambda enc: [tokenizer.decode(h) for h in ctc_greedy(enc.log_probs, enc.lengths)],
                                     True))
            else:
                from asrkit.decode.methods import Decoder

                self.entries.append((label, Decoder(model, cfg, tokenizer).search, False))
        #: a decoder's words are scored as `asrkit decode` scores them
        self.normalizer = corpus_normalizer(cfg.data.corpus, getattr(tokenizer, "fold", "none"))

    @property
    def labels(self) -> list[str]:
        return [e[0] for e in self.entries]


@torch.no_grad()
def validate(model: torch.nn.Module, dev_cuts, cfg, tokenizer, dist_info: DistInfo, device: torch.device,
             seed: int, amp_dtype=None, decoding: Optional[DevDecoding] = None) -> tuple[dict, dict]:
    """Returns ``(info, results)`` on rank 0: ``info`` = ``{"dev_loss", "dev_wer", "dev_wer_method",
    "dev_wers": {label: WER}, "dev_empty": {label: share of empty hypotheses}, "seconds": {"forward"
    | label: seconds on rank 0}}`` (``dev_wer``: the first method's), ``results`` = ``{label:
    scoring result (bins)}`` in log order; ``({}, {})`` on the other ranks or when nothing could be
    decoded. ``decoding``: the methods (default: built from ``cfg`` for ``model``)."""
    from lhotse import CutSet

    decoding = decoding or DevDecoding(model, cfg, tokenizer)
    mine = list(dev_cuts)[dist_info.rank::dist_info.world_size]
    pairs: dict[str, list] = {label: [] for label in decoding.labels}
    seconds = {"forward": 0.0, **{label: 0.0 for label in decoding.labels}}
    tot_loss, n = 0.0, 0
    if mine:
        was_training = model.training
        model.eval()
        loader = make_loader(cfg, tokenizer, make_eval_sampler(CutSet.from_cuts(mine), cfg.data.max_duration),
                             epoch=0, train=False)
        with rng_untouched(stable_seed(seed, "dev", dist_info.rank)), stop_signals_deferred():
            it = iter(loader)
        while True:
            try:
                batch = next(it, None)
            except AudioError as e:  # data.on_bad_audio=raise
                raise TrainingError(f"validation: {bad_audio_message(e)}") from None
            if batch is None:
                break
            if not batch["ids"]:
                continue
            batch = to_device(batch, device)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                t0 = time.perf_counter()
                out = model(batch)
                enc = out["enc"]
                tot_loss += float(out["loss"]) * out["n_utts"]
                n += out["n_utts"]
                seconds["forward"] += time.perf_counter() - t0
                for label, search, greedy in decoding.entries:
                    t0 = time.perf_counter()
                    hyps = search(enc)
                    seconds[label] += time.perf_counter() - t0
                    for i, hyp in enumerate(hyps):
                        # greedy: folded as trained, phones for phones; a decoder: the transcript (normalized when scored)
                        text = batch["texts"][i]
                        pairs[label].append({"id": batch["ids"][i], "ref": reference_for_greedy(tokenizer, text) if greedy else text,
                                             "hyp": hyp, "duration": batch["durations"][i]})
        model.train(was_training)
    gathered = all_gather_object((pairs, tot_loss, n))
    if not dist_info.is_main:
        return {}, {}
    tot_loss, n = sum(g[1] for g in gathered), sum(g[2] for g in gathered)
    results, empty = {}, {}
    for label, _, greedy in decoding.entries:
        mine_all = [p for g in gathered for p in g[0][label]]
        if not mine_all:
            logger.warning("validation: no dev utterance could be decoded")
            return {}, {}
        results[label] = score_pairs(mine_all, bins=cfg.decode.bins, normalizer="none" if greedy else decoding.normalizer)
        empty[label] = sum(not p["hyp"].strip() for p in mine_all) / len(mine_all)
    first = decoding.labels[0]
    info = {"dev_loss": tot_loss / max(1, n), "dev_wer": results[first].wer, "dev_wer_method": first,
            "dev_wers": {label: r.wer for label, r in results.items()}, "dev_empty": empty,
            "seconds": {k: round(v, 3) for k, v in seconds.items()}}
    return info, results
