"""ONNX export of CTC models, checked against PyTorch with onnxruntime.

The exported graph (:class:`CtcOnnx`) is the whole acoustic model after the filterbank::

    x        float32 N x T x n_mels   log-mel filterbank (asrkit.data.features.fbank, before CMVN)
    x_lens   int64   N                valid frames of each row (the rest is padding, any value)
    ->
    log_probs      float32 N x T' x V   CTC log-probabilities (token ids of the tokenizer, 0 = blank)
    log_probs_len  int64   N            valid output frames

with per-utterance CMVN (``features.cmvn``) inside the graph over the valid frames, frame times
``t * hop`` built inside, and both the batch and the length axes dynamic. This is also the
interface of sherpa-onnx's offline ``zipformer_ctc`` models (see :mod:`asrkit.inference.sherpa`).

Export traces the model (``torch.onnx.export(dynamo=False)``) on a padded batch of two, so the
padding masks of the encoder are in the graph and a batch of N gives the rows of N batches of one.
Python loops over the frames would be frozen at the traced length: the positional encodings that
build their attention bias that way choose an equivalent dense form themselves while exporting
(relpos / relpos_first gather a T x T bias from q . A for all lags; spe_sine's evaluation draws
become constants: ``PositionalEncoding.prepare_export``). Every Transformer positional encoding (softmax,
linear ReLU and FAVOR+ attention) and the conv encoders export; what cannot is in
:data:`UNSUPPORTED` with the reason. The stochastic training-time parts (CAPE's shifts and
scaling, SHAPE's offset, dropout, layer drop, SpecAugment) are inactive in evaluation mode, so
the graph holds what decoding uses: CAPE's mean-normalized times, SHAPE as sinpos. A
sequence-to-sequence model exports its encoder and CTC head (``decoder.ctc_weight`` > 0).
The graph takes whole utterances: long recordings go through :mod:`asrkit.inference.chunking`.

:func:`check_onnx` runs both on utterances and compares: largest log-probability difference
over the valid frames, and greedy transcripts.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
import torch
from torch import Tensor, nn

from asrkit.model.posenc.base import PositionalEncoding

logger = logging.getLogger(__name__)

OPSET = 17

#: what cannot be exported, and why (pos_enc / encoder / decoder values)
UNSUPPORTED: dict[str, str] = {
    "spe_conv": "its noise is drawn per block of frame positions with seeded torch generators in Python and "
                "filtered by an FFT whose length depends on the input length; ONNX has neither torch's seeded "
                "generators nor a data-dependent number of blocks, so only a fixed maximum length could be baked "
                "in (as a noise table of that length)",
    "decode.method=attention": "the attention decoder's beam search is a Python loop over output tokens with "
                               "data-dependent pruning; only the encoder and its CTC head are exported (a seq2seq "
                               "model with decoder.ctc_weight > 0 exports as a CTC model)",
}
def unsupported_reason(cfg) -> Optional[str]:
    """Why the model of ``cfg`` cannot be exported as a CTC model, or None."""
    if cfg.encoder.pos_enc in UNSUPPORTED:
        return f"encoder.pos_enc={cfg.encoder.pos_enc}: {UNSUPPORTED[cfg.encoder.pos_enc]}"
    if cfg.decoder.type != "none" and cfg.decoder.ctc_weight <= 0:
        return ("decoder.ctc_weight=0: the model has no trained CTC head; "
                + UNSUPPORTED["decode.method=attention"])
    return None


class CtcOnnx(nn.Module):
    """(log-mel ``x``, ``x_lens``) -> (CTC log-probabilities, their lengths); see the module doc."""

    def __init__(self, model: nn.Module, hop: float, cmvn: bool = True, eps: float = 1e-5):
        super().__init__()
        self.model, self.hop, self.cmvn, self.eps = model, float(hop), bool(cmvn), float(eps)

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        B, T, _ = x.shape
        frames = torch.arange(T, device=x.device)
        mask = (frames[None, :] < x_lens[:, None]).unsqueeze(-1).to(x.dtype)  # B x T x 1
        x = x * mask  # padding may hold anything (sherpa-onnx pads with log(1e-10))
        if self.cmvn:  # asrkit.data.features.cmvn over the valid frames of each row
            # statistics in float64: onnxruntime sums sequentially, and a float32 sum of thousands
            # of log-energies (~20 each) is off by ~1e-4 in the mean (torch sums pairwise)
            xd, md = x.double(), mask.double()
            n = x_lens.clamp(min=1).double()[:, None, None]
            mean = xd.sum(1, keepdim=True) / n
            var = (((xd - mean) * md) ** 2).sum(1, keepdim=True) / n
            x = ((xd - mean) / (var.sqrt() + self.eps) * md).to(x.dtype)
        times = (frames.to(x.dtype) * self.hop)[None, :].expand(B, T)
        enc = self.model.encode(x, x_lens, times)
        return enc.log_probs, enc.lengths


@contextlib.contextmanager
def export_forms(model: nn.Module) -> Iterator[None]:
    """Let every positional encoding of the model prepare its exported form
    (:meth:`asrkit.model.posenc.base.PositionalEncoding.prepare_export`) for the block."""
    prepared = [m for m in model.modules() if isinstance(m, PositionalEncoding)]
    for m in prepared:
        m.prepare_export()
    try:
        yield
    finally:
        for m in prepared:
            m.__dict__.pop("_export_draws", None)


# ----------------------------------------------------------------------------------- export
def export_onnx(model: nn.Module, cfg, path: Path | str, metadata: Optional[dict] = None,
                example_frames: tuple[int, int] = (160, 123)) -> Path:
    """Export the CTC branch of ``model`` to ``path`` (see the module doc). ``metadata``: extra
    key/value strings stored in the model (sherpa-onnx reads some). Raises ValueError for a model
    that cannot be exported (:func:`unsupported_reason`)."""
    import onnx

    reason = unsupported_reason(cfg)
    if reason:
        raise ValueError(f"cannot export to ONNX: {reason}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval().cpu()
    wrapper = CtcOnnx(model, cfg.decode.hop or cfg.features.hop, cfg.features.cmvn).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, max(example_frames), cfg.features.n_mels, generator=g)
    lens = torch.tensor(sorted(example_frames, reverse=True), dtype=torch.long)
    import warnings

    with torch.no_grad(), export_forms(model), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python values: covered by check_onnx
        wrapper(x, lens)  # eager once: fills lazy caches (FAVOR+ features) so they trace as constants
        torch.onnx.export(wrapper, (x, lens), str(path), dynamo=False, opset_version=OPSET,
                          input_names=["x", "x_lens"], output_names=["log_probs", "log_probs_len"],
                          dynamic_axes={"x": {0: "N", 1: "T"}, "x_lens": {0: "N"},
                                        "log_probs": {0: "N", 1: "T_out"}, "log_probs_len": {0: "N"}})
    m = onnx.load(str(path))
    meta = {"framework": "asrkit", "vocab_size": str(model.vocab_size),
            "subsampling_factor": str(cfg.frontend.stride), "feature_dim": str(cfg.features.n_mels),
            "frame_shift_s": str(cfg.decode.hop or cfg.features.hop), "cmvn": "per_utterance" if cfg.features.cmvn else "none"}
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    del m.metadata_props[:]
    for k, v in meta.items():
        m.metadata_props.add(key=k, value=v)
    onnx.save(m, str(path))
    return path


# ------------------------------------------------------------------------------------ check
def session(path: Path | str, threads: int = 1):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def raw_fbank(samples: np.ndarray, cfg) -> Tensor:
    """The graph's input for one recording: the log-mel filterbank before CMVN."""
    from asrkit.data.features import fbank

    fc = cfg.features
    return fbank(samples, fc.sample_rate, cfg.decode.hop or fc.hop, fc.win, fc.n_mels, fc.dither)


@torch.no_grad()
def check_onnx(model: nn.Module, cfg, tokenizer, path: Path | str, utterances: Iterable[tuple[str, np.ndarray]],
               threads: int = 1) -> dict:
    """Compare PyTorch (the model in asrkit's decoding pipeline: fbank, CMVN, encoder) with the
    ONNX graph under onnxruntime, one utterance at a time. Returns ``{"utterances", "max_abs_diff"
    (log-probabilities, valid frames), "greedy_mismatches" (ids), "frames_mismatch" (ids)}``."""
    from asrkit.data.features import cmvn
    from asrkit.decode.ctc import ctc_greedy

    sess = session(path, threads)
    model = model.eval()
    hop = cfg.decode.hop or cfg.features.hop
    worst, n, bad, bad_len = 0.0, 0, [], []
    for uid, samples in utterances:
        feats = raw_fbank(samples, cfg)
        x = cmvn(feats) if cfg.features.cmvn else feats
        T = x.shape[0]
        enc = model.encode(x[None], torch.tensor([T]), (torch.arange(T, dtype=torch.float32) * hop)[None])
        lp_pt = enc.log_probs[0, : int(enc.lengths[0])]
        lp_ox, len_ox = sess.run(None, {"x": feats[None].numpy(), "x_lens": np.array([T], dtype=np.int64)})
        lp_ox = torch.from_numpy(lp_ox[0, : int(len_ox[0])])
        n += 1
        if lp_ox.shape != lp_pt.shape:
            bad_len.append(uid)
            continue
        worst = max(worst, float((lp_ox - lp_pt).abs().max()))
        one = torch.tensor([lp_pt.shape[0]])
        if tokenizer.decode(ctc_greedy(lp_pt[None], one)[0]) != tokenizer.decode(ctc_greedy(lp_ox[None], one)[0]):
            bad.append(uid)
    return {"utterances": n, "max_abs_diff": worst, "greedy_mismatches": bad, "frames_mismatch": bad_len}
