"""Transformer decoder (CAPE appendix C.5): a stack of pre-LN layers (causal self-attention,
cross-attention to the encoder output, feed-forward), 6 x 256 dims with 4 heads by default.

Positions: ``relpos`` (default, as in C.5) is a learnable bias per layer and head for every lag
0..``rel_context`` between a token and the earlier tokens it attends to (left-only context; longer
lags share the last bias); ``sinpos`` adds the sinusoidal embedding of the token index instead.
Layer drop (training only) skips whole layers, drawn from a generator seeded per training step
(:meth:`TransformerDecoder.set_step`, like the encoder's); a skipped layer's parameters still get
(zero) gradients, so DDP needs no ``find_unused_parameters`` for the decoder.

Decoding is incremental: every layer caches the keys and values of the tokens so far, so a step
computes only the new token (exactly what the full causal computation gives for it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asrkit.model.dropout import Dropout
from asrkit.model.posenc.base import sinusoid
from asrkit.model.seq2seq import SearchKeys, Seq2SeqDecoder

NEG_INF = float("-inf")


def attend(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Scaled dot-product attention returning (output, scores before softmax, weights)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    w = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return torch.matmul(w, v), scores, w



@dataclass
class TransformerDecoderOptions(SearchKeys):
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.2
    layer_drop: float = 0.2
    pos: str = "relpos"  #: relpos (learnable relative bias per head, left context) | sinpos (absolute sinusoid)
    rel_context: int = 100  #: relpos: lags of 0..rel_context tokens get their own bias (longer ones share the last)
    label_smoothing: float = 0.1


class DecoderLayer(nn.Module):
    def __init__(self, d: int, n_heads: int, d_ff: int, dropout: float, rel_context: int):
        super().__init__()
        self.h = n_heads
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.self_out = nn.Linear(d, d)
        self.q_x = nn.Linear(d, d)
        self.kv_x = nn.Linear(d, 2 * d)
        self.cross_out = nn.Linear(d, d)
        self.ffn = nn.Sequential(nn.Linear(d, d_ff), nn.ReLU(), Dropout(dropout), nn.Linear(d_ff, d))
        self.drop = Dropout(dropout)
        self.rel = nn.Parameter(torch.zeros(n_heads, rel_context + 1)) if rel_context > 0 else None

    def _heads(self, x: Tensor) -> Tensor:  # N x L x d -> N x H x L x dh
        N, L, d = x.shape
        return x.view(N, L, self.h, d // self.h).transpose(1, 2)

    @staticmethod
    def _merge(x: Tensor) -> Tensor:  # N x H x L x dh -> N x L x d
        N, H, L, dh = x.shape
        return x.transpose(1, 2).reshape(N, L, H * dh)

    def memory(self, mem: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.kv_x(mem).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def self_bias(self, L0: int, Q: int, device) -> Tensor:
        """Causal mask + relative-position bias for queries at positions L0..L0+Q-1 over keys 0..L0+Q-1: H x Q x L."""
        lag = torch.arange(L0, L0 + Q, device=device)[:, None] - torch.arange(L0 + Q, device=device)[None, :]
        causal = torch.where(lag < 0, NEG_INF, 0.0)
        if self.rel is None:
            return causal[None]
        return causal[None] + self.rel[:, lag.clamp(0, self.rel.shape[1] - 1)]

    def forward(self, x: Tensor, past: Optional[tuple[Tensor, Tensor]], mem_kv: tuple[Tensor, Tensor],
                mem_bias: Tensor, K: int) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor, Tensor]:
        """x: (B*K) x Q x d (the new tokens of each hypothesis slot); past: cached keys/values
        (B*K) x H x L0 x dh or None; mem_kv: per utterance B x H x T x dh; mem_bias: B x 1 x 1 x T."""
        N, Q, d = x.shape
        q, k, v = (self._heads(t) for t in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        a, _, _ = attend(q, k, v, self.self_bias(k.shape[2] - Q, Q, x.device).to(q.dtype))
        x = x + self.drop(self.self_out(self._merge(a)))
        # cross-attention: the K slots of an utterance share its memory (never copied per slot)
        B = N // K
        qx = self._heads(self.q_x(self.ln2(x)))  # N x H x Q x dh
        H, dh = qx.shape[1], qx.shape[3]
        qx = qx.view(B, K, H, Q, dh).permute(0, 2, 1, 3, 4).reshape(B, H, K * Q, dh)
        a, scores, w = attend(qx, mem_kv[0], mem_kv[1], mem_bias)
        a = a.view(B, H, K, Q, dh).permute(0, 2, 1, 3, 4).reshape(N, H, Q, dh)
        x = x + self.drop(self.cross_out(self._merge(a)))
        x = x + self.drop(self.ffn(self.ln3(x)))
        return x, (k, v), scores, w


class TransformerDecoder(Seq2SeqDecoder):
    def __init__(self, enc_dim: int, vocab_size: int, opts: Optional[TransformerDecoderOptions] = None):
        opts = opts or TransformerDecoderOptions()
        super().__init__(opts, vocab_size)
        o = opts
        d = o.d_model
        self.embed = nn.Embedding(vocab_size, d)
        self.mem_proj = nn.Linear(enc_dim, d) if enc_dim != d else nn.Identity()
        rel = o.rel_context if o.pos == "relpos" else 0
        self.layers = nn.ModuleList(DecoderLayer(d, o.n_heads, o.d_ff, o.dropout, rel) for _ in range(o.n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab_size)
        self.drop = Dropout(o.dropout)
        self._drop_gen = torch.Generator()
        self._drop_gen.manual_seed(0)

    def set_step(self, seed: int) -> None:
        """Seed the layer-drop draw for this training step (the same layers on every rank, and in a
        resumed run, as the encoder's)."""
        self._drop_gen.manual_seed(int(seed))

    def init_static(self, enc) -> dict:
        mem = self.mem_proj(enc.hidden)
        bias = torch.where(enc.mask, 0.0, NEG_INF)[:, None, None, :].to(mem.dtype)
        return {"kv": [layer.memory(mem) for layer in self.layers], "bias": bias}

    def init_dynamic(self, static: dict, K: int) -> dict:
        return {"past": [None] * len(self.layers), "n": 0}

    def _run(self, static: dict, dyn: dict, ys: Tensor, K: int) -> tuple[Tensor, dict]:
        """ys: (B*K) x Q new tokens -> logits (B*K) x Q x V and the extended caches."""
        past = dyn["past"]
        L0 = 0 if past[0] is None else past[0][0].shape[2]
        x = self.embed(ys)
        if self.opts.pos == "sinpos":
            pos = torch.arange(L0, L0 + ys.shape[1], device=ys.device, dtype=torch.float32)
            x = x + sinusoid(pos, x.shape[-1], omega0=1.0).to(x.dtype)
        x = self.drop(x)
        new_past = []
        drop = None
        if self.training and self.opts.layer_drop > 0:
            drop = (torch.rand(len(self.layers), generator=self._drop_gen) < self.opts.layer_drop).tolist()
        for i, layer in enumerate(self.layers):
            y, kv, scores, w = layer(x, past[i], static["kv"][i], static["bias"], K)
            x = x if (drop is not None and drop[i]) else y
            if drop is not None and drop[i]:
                x = x + 0.0 * y  # keep the layer in the graph (zero gradients) for DDP
            new_past.append(kv)
        if self._record is not None:  # last layer, mean over heads: B x (K*Q) x T
            self._keep(scores.mean(1), w.mean(1))
        return self.out(self.ln_f(x)), {"past": new_past, "n": L0 + ys.shape[1]}

    def step(self, static: dict, dyn: dict, prev: Tensor, K: int) -> tuple[Tensor, dict]:
        logits, dyn = self._run(static, dyn, prev[:, None], K)
        return F.log_softmax(logits[:, 0].float(), dim=-1), dyn

    def teacher_logits(self, enc, ys_in: Tensor) -> Tensor:
        static = self.init_static(enc)
        logits, _ = self._run(static, self.init_dynamic(static, 1), ys_in, 1)
        return logits
