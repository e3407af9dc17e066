"""Single-layer LSTM attention decoder of Park & Sung (section 3), after Zeyer et al. (2018).

At output step i (s_i the LSTM state, h_t the encoder outputs, y_{i-1} the previous token)::

    s_i       = LSTM(s_{i-1}, [emb(y_{i-1}), c_{i-1}])                         (5)
    beta_i,t  = sigmoid(v_beta^T h_t) * sum_{k<i} alpha_k,t                    (3)  weight feedback
    e_i,t     = v_e^T tanh(W [s_i, h_t, beta_i,t])                             (2)
    alpha_i   = softmax_t(e_i)          (padded frames excluded)
    c_i       = sum_t alpha_i,t h_t                                           (4)
    p(y_i)    = softmax(U maxout(R [s_i, emb(y_{i-1}), c_i]))                  readout

``W [s, h, beta]`` is computed as ``W_s s + W_h h + w_beta beta`` (the three column blocks of W;
``W_h h`` is precomputed once per utterance). <sos> = <eos> = id 0 (see :mod:`asrkit.model.decoders`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asrkit.model.dropout import Dropout
from asrkit.model.seq2seq import SearchKeys, Seq2SeqDecoder



@dataclass
class LstmDecoderOptions(SearchKeys):
    units: int = 1000  #: LSTM size (paper: 1000)
    embed_dim: int = 256  #: target embedding size
    att_dim: int = 1024  #: size of the MLP attention's hidden layer (rows of W in Eq. 2)
    readout_dim: int = 1000  #: readout layer before maxout (2 -> readout_dim / 2) and the softmax
    dropout: float = 0.3
    weight_feedback: bool = True  #: the beta term of Eqs. (2)-(3)
    label_smoothing: float = 0.1


class MlpAttention(nn.Module):
    """MLP attention with attention-weight feedback, Eqs. (2)-(4). Queries come in groups of K
    per utterance (K hypotheses in beam search, 1 in training)."""

    def __init__(self, s_dim: int, h_dim: int, att_dim: int, weight_feedback: bool = True):
        super().__init__()
        self.w_s = nn.Linear(s_dim, att_dim, bias=False)
        self.w_h = nn.Linear(h_dim, att_dim)  # carries the bias of W
        self.v_e = nn.Linear(att_dim, 1, bias=False)
        self.weight_feedback = weight_feedback
        if weight_feedback:
            self.w_beta = nn.Linear(1, att_dim, bias=False)
            self.v_beta = nn.Linear(h_dim, 1, bias=False)

    def precompute(self, h: Tensor) -> dict:
        """Per-utterance terms: ``W_h h_t`` (B x T x A) and the feedback gate sigmoid(v_beta^T h_t) (B x T)."""
        out = {"h_proj": self.w_h(h)}
        if self.weight_feedback:
            out["gate"] = torch.sigmoid(self.v_beta(h)).squeeze(-1)
        return out

    def feedback(self, gate: Tensor, cum_alpha: Tensor) -> Tensor:
        """beta (Eq. 3): gate B x T, cum_alpha (sum of the previous steps' weights) B x K x T."""
        return gate[:, None, :] * cum_alpha

    def forward(self, s: Tensor, h: Tensor, pre: dict, cum_alpha: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """s: B x K x S decoder states; h: B x T x D; cum_alpha: B x K x T; mask: B x T (True = frame).
        Returns energies e (B x K x T, -inf at padding), weights alpha (B x K x T), context (B x K x D)."""
        x = pre["h_proj"][:, None] + self.w_s(s)[:, :, None]  # B x K x T x A
        if self.weight_feedback:
            x = x + self.w_beta(self.feedback(pre["gate"], cum_alpha).unsqueeze(-1))
        e = self.v_e(torch.tanh(x)).squeeze(-1).masked_fill(~mask[:, None, :], float("-inf"))
        alpha = torch.softmax(e.float(), dim=-1).to(h.dtype)
        return e, alpha, torch.matmul(alpha, h)


class LstmDecoder(Seq2SeqDecoder):
    def __init__(self, enc_dim: int, vocab_size: int, opts: Optional[LstmDecoderOptions] = None):
        opts = opts or LstmDecoderOptions()
        super().__init__(opts, vocab_size)
        o = opts
        self.embed = nn.Embedding(vocab_size, o.embed_dim)
        self.cell = nn.LSTMCell(o.embed_dim + enc_dim, o.units)
        self.att = MlpAttention(o.units, enc_dim, o.att_dim, o.weight_feedback)
        self.readout = nn.Linear(o.units + o.embed_dim + enc_dim, o.readout_dim)
        self.out = nn.Linear(o.readout_dim // 2, vocab_size)
        self.drop = Dropout(o.dropout)
        self.enc_dim = enc_dim

    # -- incremental interface (asrkit.decode.attention)
    def init_static(self, enc) -> dict:
        return {"h": enc.hidden, "mask": enc.mask, **self.att.precompute(enc.hidden)}

    def init_dynamic(self, static: dict, K: int) -> dict:
        h = static["h"]
        B, T, _ = h.shape
        N, U = B * K, self.opts.units
        z = h.new_zeros
        return {"s": z(N, U), "c": z(N, U), "ctx": z(N, self.enc_dim), "cum": z(N, T)}

    def _logits(self, static: dict, dyn: dict, prev: Tensor, K: int) -> tuple[Tensor, dict]:
        H, mask = static["h"], static["mask"]
        B, T, D = H.shape
        N = B * K
        y = self.drop(self.embed(prev))
        s, c = self.cell(torch.cat([y, dyn["ctx"].to(y.dtype)], dim=-1), (dyn["s"], dyn["c"]))
        e, alpha, ctx = self.att(s.view(B, K, -1), H, static, dyn["cum"].view(B, K, T), mask)
        self._keep(e, alpha)
        alpha, ctx = alpha.reshape(N, T), ctx.reshape(N, D)
        r = self.readout(torch.cat([self.drop(s), y, ctx.to(s.dtype)], dim=-1))
        r = r.view(N, -1, 2).amax(-1)  # maxout over pairs
        logits = self.out(self.drop(r))
        return logits, {"s": s, "c": c, "ctx": ctx, "cum": dyn["cum"] + alpha}

    def step(self, static: dict, dyn: dict, prev: Tensor, K: int) -> tuple[Tensor, dict]:
        logits, dyn = self._logits(static, dyn, prev, K)
        return F.log_softmax(logits.float(), dim=-1), dyn

    # -- training
    def teacher_logits(self, enc, ys_in: Tensor) -> Tensor:
        static = self.init_static(enc)
        dyn = self.init_dynamic(static, 1)
        out = []
        for i in range(ys_in.shape[1]):
            logits, dyn = self._logits(static, dyn, ys_in[:, i], 1)
            out.append(logits)
        return torch.stack(out, dim=1)
