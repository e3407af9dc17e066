"""The one interface every positional encoding implements.

An encoder calls the hooks below at fixed points; each hook defaults to "do nothing", so an
encoding overrides only what it needs and the encoder layers never special-case an encoding:

====================  ==============================================  ====================
hook                  called                                          used by
====================  ==============================================  ====================
``begin``             once per forward, after the frontend            all (draws randomness)
``embed``             on the frontend output, before layer 0          sinpos, cape, shape,
                                                                      abspos, concat_sin
``qk``                in every attention layer, on q and k            spe (gated codes)
``attn_bias``         in every softmax attention layer                relpos, relpos_first
``after_layer``       after every encoder layer                       cpe (PEG)
====================  ==============================================  ====================

Positions are *times in seconds* of each frame (``times``, shape ``B x T``): frame index x hop x
frontend stride for the padded pipeline, or the true timestamp of every kept frame for the
padding-free one. ``mask`` (``B x T``, True = real frame) says which frames are padding; padding
must never enter a mean, a convolution edge or an attention.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import torch
from torch import Tensor, nn

from asrkit.model.dropout import Dropout
from asrkit.schema import ConfigError


@dataclass
class PosState:
    """Per-forward state shared by all layers: positions, the padding mask, and anything an
    encoding draws once per forward (CAPE's augmented times, SPE's codes...)."""

    times: Tensor  #: B x T seconds
    mask: Tensor  #: B x T bool, True = real frame
    extra: dict[str, Any] = field(default_factory=dict)


class PositionalEncoding(nn.Module):
    """Base class: a no-op encoding (``nopos``). Subclasses override the hooks they need.

    Class attributes:
        name: the config value (``encoder.pos_enc``).
        attention: which attention kinds it works with (``softmax``, ``linear``).
        Options: a dataclass of the encoding's own options (``encoder.pos``), validated at config time.
    """

    name: ClassVar[str] = "nopos"
    attention: ClassVar[tuple[str, ...]] = ("softmax", "linear")

    @dataclass
    class Options:
        pass

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts: Any = None):
        super().__init__()
        self.d_model, self.n_heads, self.n_layers = d_model, n_heads, n_layers
        self.opts = opts if opts is not None else self.Options()

    def output_dim(self, d_in: int) -> int:
        """Feature size after :meth:`embed` (differs from ``d_in`` only for concatenation)."""
        return d_in

    def begin(self, x: Tensor, times: Tensor, mask: Tensor) -> PosState:
        return PosState(times=times, mask=mask)

    def embed(self, x: Tensor, state: PosState) -> Tensor:
        return x

    def qk(self, layer: int, q: Tensor, k: Tensor, state: PosState) -> tuple[Tensor, Tensor]:
        """q, k: B x H x T x Dh."""
        return q, k

    def attn_bias(self, layer: int, q: Tensor, state: PosState) -> "Optional[Tensor | QBias]":
        """An additive attention bias broadcastable to B x H x T x T, or a :class:`QBias` (a bias
        computed from the queries, which the attention may fuse), or None. q: B x H x T x Dh.
        A tensor bias already holds -inf at the padded keys (``state.mask`` False), so the
        attention hands it to SDPA as it is and one tensor can serve every layer (alibi); a
        :class:`QBias` is masked by the attention."""
        return None

    def after_layer(self, layer: int, x: Tensor, state: PosState) -> Tensor:
        return x

    def prepare_export(self) -> None:
        """Called once, in evaluation mode, before the model is traced for export (ONNX). An
        encoding whose evaluation path draws random numbers (SPE) makes them constants here; one
        whose hooks loop in Python over blocks chooses a traceable form itself while
        ``torch.onnx.is_in_onnx_export()`` (relpos)."""


NoPos = PositionalEncoding


class QBias:
    """An additive attention bias computed from the queries and one parameter tensor,
    ``bias = f(q, weight)``, linear in each (relpos: ``bias_ij = q_i . w_{r(i,j)}``).

    Returned by :meth:`PositionalEncoding.attn_bias` instead of a tensor, it lets the attention
    write the bias straight into its own score buffer and take its gradient from the score
    gradient, so no separate B x H x T x T bias (nor its gradient) is ever allocated
    (:func:`asrkit.model.attention.attention_qbias`). :meth:`materialize` gives the plain
    differentiable tensor for every other case. Subclasses implement :meth:`fill_` and
    :meth:`grad`; ``weight`` is an autograd tensor (gradients reach the parameters through it).
    """

    def __init__(self, weight: Tensor):
        self.weight = weight

    def fill_(self, out: Tensor, q: Tensor, weight: Tensor) -> None:
        """Write ``f(q, weight)`` (B x H x T x T) into ``out`` (no autograd)."""
        raise NotImplementedError

    def grad(self, grad: Tensor, q: Tensor, weight: Tensor, gq: Optional[Tensor], need_weight: bool
             ) -> Optional[Tensor]:
        """Backward of ``<grad, f(q, weight)>``: adds its gradient w.r.t. ``q`` into ``gq`` (a
        contiguous tensor shaped like ``q``; None: not needed) and returns the gradient w.r.t.
        ``weight`` (None when not ``need_weight``)."""
        raise NotImplementedError

    def attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor]) -> Optional[Tensor]:
        """``softmax(q k^T / sqrt(d) + bias) v`` by a kernel of this bias's own that computes the
        whole attention, or None (the default: none here), in which case the attention fills a
        score buffer with :meth:`fill_`. ``key_mask``: B x 1 x 1 x T bool (True = attend) or None."""
        return None

    def materialize(self, q: Tensor) -> Tensor:
        """The bias as a differentiable B x H x T x T tensor."""
        return _QBiasFn.apply(q, self.weight, self)


class _QBiasFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, weight: Tensor, qb: QBias) -> Tensor:
        B, H, T, _ = q.shape
        with torch.autocast(q.device.type, enabled=False):
            out = q.new_empty(B, H, T, T)
            qb.fill_(out, q, weight.to(q.dtype))
        ctx.save_for_backward(q, weight)
        ctx.qb = qb
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        q, weight = ctx.saved_tensors
        w = weight.to(q.dtype)
        gq = torch.zeros(q.shape, dtype=q.dtype, device=q.device) if ctx.needs_input_grad[0] else None
        gw = ctx.qb.grad(grad.to(q.dtype), q, w, gq, ctx.needs_input_grad[1])
        return gq, (gw.to(weight.dtype) if gw is not None else None), None


def sinusoid(times: Tensor, dim: int, omega0: float = 30.0, base: float = 10000.0, t2t: bool = False) -> Tensor:
    """Sinusoidal embedding of continuous ``times`` (any shape, seconds) -> ``times.shape + (dim,)``.

    E_2k(t) = cos(w_k t), E_2k+1(t) = sin(w_k t), w_k = omega0 * base^(-2k/dim) (CAPE section 3,
    "positional encoding for sound": omega0 = 30 gives 30 ms specificity over minutes of audio).
    ``t2t``: w_k = omega0 * base^(-k/(dim/2 - 1)) instead, the spacing of tensor2tensor's
    ``get_timing_signal_1d`` and RETURNN's ``positional_encoding`` layer (the slowest is omega0/base).
    Components are laid out [cos..., sin...], which is a fixed permutation of the interleaved form.
    Computed in float32 whatever the input dtype (phases of minutes-long audio need it).
    """
    assert dim % 2 == 0, f"sinusoidal embedding needs an even dimension, got {dim}"
    k = torch.arange(dim // 2, device=times.device, dtype=torch.float32)
    w = omega0 * base ** (-k / max(dim // 2 - 1, 1) if t2t else -2.0 * k / dim)
    phase = times.to(torch.float32).unsqueeze(-1) * w
    return torch.cat([torch.cos(phase), torch.sin(phase)], dim=-1)


class SinPos(PositionalEncoding):
    """``sinpos``: sinusoidal embedding of each frame's time in seconds, added to the input.

    The defaults are the CAPE paper's (omega0 = 30, layout [cos..., sin...], nothing else). Three
    options give the original Transformer's form (Vaswani et al., 2017, sections 3.4, 3.5 and 5.4)
    as ESPnet's ``PositionalEncoding`` applies it: ``scale_input`` multiplies the input by
    sqrt(d_model) before the embedding is added, ``interleaved`` lays the components out as
    PE(pos, 2k) = sin, PE(pos, 2k+1) = cos, and ``dropout`` drops out the sum. With ``omega0`` =
    1 / frame_step (25 for 40 ms frames) the phase is the frame index times 10000^(-2k/d), the
    paper's PE(pos) at pos = frame index."""

    name = "sinpos"

    @dataclass
    class Options:
        omega0: float = 30.0  #: w_k = omega0 * 10000^(-2k/K)
        scale: float = 1.0  #: multiplier of the embedding before it is added
        scale_input: bool = False  #: multiply the input by sqrt(d_model) first (Vaswani et al. 3.4; ESPnet)
        interleaved: bool = False  #: components sin, cos, sin, cos... (Vaswani et al. 3.5) instead of [cos..., sin...]
        dropout: float = 0.0  #: dropout of the sum (Vaswani et al. 5.4; ESPnet's positional_dropout_rate)

        def __post_init__(self):
            if not 0.0 <= self.dropout < 1.0:
                raise ConfigError(f"encoder.pos.dropout={self.dropout} must be in [0, 1)")

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts: Any = None):
        super().__init__(d_model, n_heads, n_layers, opts)
        p = getattr(self.opts, "dropout", 0.0)
        self.drop = Dropout(p) if p > 0 else None

    def positions(self, state: PosState) -> Tensor:
        """Times (seconds) to encode; augmenting subclasses (CAPE, SHAPE) override this."""
        return state.times

    def embed(self, x: Tensor, state: PosState) -> Tensor:
        d = x.shape[-1]
        pe = sinusoid(self.positions(state), d, self.opts.omega0)
        if getattr(self.opts, "interleaved", False):  # [cos..., sin...] -> sin_0, cos_0, sin_1, cos_1, ...
            pe = torch.stack([pe[..., d // 2:], pe[..., : d // 2]], dim=-1).flatten(-2)
        if getattr(self.opts, "scale_input", False):
            x = x * math.sqrt(d)
        x = x + (self.opts.scale * pe).to(x.dtype)
        return x if self.drop is None else self.drop(x)
