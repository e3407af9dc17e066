"""Convolutional encoders of Park & Sung, "Effect of adding positional information on convolutional
neural networks for end-to-end speech recognition" (section 3, Fig. 1).

``encoder.type: conv`` (Fig. 1b) or ``gated_conv`` (Fig. 1c)::

    feats (B x T x F, 10 ms frames)
      -> 2-D frontend: two 3x3 convolutions over (time, frequency), each followed by max-pooling
         over frequency (and by ReLU unless ``frontend_activation: none``)
      -> positional encoding from the frame *times*, before any time pooling
         (``encoder.pos_enc: concat_sin`` concatenates it, the paper's best variant; any encoding
         that only embeds the input works: nopos, sinpos, cape, abspos...)
      -> [``project: true``] linear projection to ``encoder.d_model`` = D
      -> ``encoder.n_layers`` 1-D depthwise convolution layers (Eq. 1):
             x'_{t,k} = sum_{i=-(W-1)/2}^{(W-1)/2} W_{i,k} x_{t+i,k}      (depthwise, width W)
             h_t      = f(V x'_t + b)                                       (pointwise -> D)
         gated layer: h_t = (V x'_t + b) * sigmoid(U x'_t + c)  (a GLU after the depthwise filter;
         ``f(V x'_t + b) * sigmoid(U x'_t + c)`` with ``gate_value_activation: true``)
         max-pooling of size 2 over time after each of the first ``pool_layers`` (3) layers:
         10 ms -> 80 ms per output frame; a residual connection around every two layers,
         followed by LayerNorm.

Two wirings (``encoder.options``):

* **published** (the paper's RETURNN configs, car3936/returnn-exp-jinh ``config/*.config``; the
  paper-size ``conf/conv_*.yaml``): ``project: false, frontend_activation: none,
  gate_value_activation: true`` with ``concat_sin`` of ``dim: 320, omega0: 100, timescales: t2t``.
  The 2-D frontend (two 3x3 convolutions with bias and *no* activation, each max-pooled over
  frequency: 40 mel bins x 32 channels -> 10 x 32 = 320) is concatenated with a 320-dim sinusoid
  (RETURNN's ``positional_encoding`` layer of the frame index), and the 640 channels go straight
  into layer 0's depthwise filters, whose pointwise layer maps them to D; layer 0 has no residual
  connection (its width changes), the residual groups are layers 1-2, 3-4, ... (RETURNN's residual
  at every even layer i > 0), and a gated layer is RETURNN's ``gating`` layer with
  ``activation: relu``: ``relu(a) * sigmoid(g)``.
* **projected** (asrkit's first wiring, the defaults): ``project: true, frontend_activation: relu,
  gate_value_activation: false``: ReLU in the frontend, a Linear projection of the frontend(+pos)
  output to D, residual groups 0-1, 2-3, ..., GLU gating ``a * sigmoid(g)``.

Not reproduced from the RETURNN configs: where the dropout sits (RETURNN: on the pointwise
layer's input, here on its output) and their "random drop" (dropout 0.5 i / N on the output of
each layer that closes a residual group).

Conv options live in ``encoder.options`` (strict keys, :class:`ConvOptions`); ``encoder.d_model``,
``encoder.n_layers``, ``encoder.dropout`` and ``encoder.activation`` (the ``f`` of Eq. 1; the gated
layer's value path with ``gate_value_activation``) are reused; the Transformer keys (``n_heads``, ``d_ff``, ``layer_drop``...) are
unused. ``frontend.stride`` must equal the encoder's total time reduction (``pool_size **
pool_layers``, 8 by default): the data pipeline uses it to drop utterances too short for CTC
(``frontend.kernel`` / ``frontend.dropout`` belong to the Transformer's 1-D frontend and are unused).

The positional encoding sees the frontend output (``channels x n_mels / 4`` dims at 10 ms), so
``concat_sin``'s ``encoder.pos.omega0: 100`` reproduces the paper's Eq. 6, which is written per
10 ms frame index i (``sin(i / 10000^(2k/D))`` = ``sin(100 t / 10000^(2k/D))`` with t in seconds),
and the ``frame_step`` of encodings that count frames (``abspos``, ``shape``) is ``features.hop``
(:func:`frame_step`).

Padding: padded frames are set to zero before every convolution and every pooling, so a padded
batch gives exactly the outputs of each utterance alone. Pooling is "same" (ceil) pooling by
default: an odd last frame is pooled with a zero frame, output length ``ceil(n / 2)``, and the time
of output frame j is that of input frame ``2 j``. With ``pool_ceil: false`` ("valid" pooling,
``floor(n / 2)``) an utterance shorter than ``pool_size ** pool_layers`` frames has no frames left:
that is an error naming the utterance (its id where the caller has the batch: training and decoding), its
length and the options at fault.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asrkit.model.asr import NoFramesError
from asrkit.model.dropout import Dropout
from asrkit.model.posenc import POS_ENCODINGS, build_pos_encoding
from asrkit.model.posenc.base import PositionalEncoding
from asrkit.schema import ConfigError, from_dict

logger = logging.getLogger(__name__)

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}
#: ``encoder.options.frontend_activation`` values
FRONTEND_ACTIVATIONS = ("relu", "none")
CONV_TYPES = ("conv", "gated_conv")


@dataclass
class ConvOptions:
    """``encoder.options`` of the conv encoders."""

    kernel: int = 3  #: W, width of the depthwise filters (odd: centred, Eq. 1)
    pool_layers: int = 3  #: max-pool over time after each of the first N layers (paper: 3)
    pool_size: int = 2  #: pooling size (= stride) over time
    pool_ceil: bool = True  #: True: "same" pooling, ceil(n / size) frames; False: floor(n / size)
    residual_every: int = 2  #: a residual connection + LayerNorm around every N layers (paper: 2)
    frontend_channels: int = 32  #: channels of both 3x3 2-D convolutions
    frontend_freq_pool: int = 2  #: max-pool size over frequency after each 2-D convolution
    frontend_activation: str = "relu"  #: after each 2-D convolution: relu | none (published: none)
    project: bool = True  #: Linear frontend(+pos) -> d_model before layer 0 (published: false, none)
    gate_value_activation: bool = False  #: gated: f(a) * sigmoid(g) instead of a * sigmoid(g) (published: true)


def conv_options(enc_cfg) -> ConvOptions:
    """Parse and check ``encoder.options`` (strict keys). Raises ConfigError naming the key."""

    o = from_dict(ConvOptions, dict(enc_cfg.options or {}), "encoder.options.")
    if o.kernel < 1 or o.kernel % 2 == 0:
        raise ConfigError(f"encoder.options.kernel={o.kernel}: the depthwise filter width W must be odd and >= 1 "
                          "(the filter is centred on its frame, Eq. 1 sums i = -(W-1)/2 .. (W-1)/2), e.g. 3, 5, 7, 11, 15")
    if not 0 <= o.pool_layers <= enc_cfg.n_layers:
        raise ConfigError(f"encoder.options.pool_layers={o.pool_layers} must be in [0, encoder.n_layers={enc_cfg.n_layers}]")
    if o.pool_size < 1:
        raise ConfigError(f"encoder.options.pool_size={o.pool_size} must be >= 1")
    if o.residual_every < 1:
        raise ConfigError(f"encoder.options.residual_every={o.residual_every} must be >= 1")
    if o.frontend_channels < 1 or o.frontend_freq_pool < 1:
        raise ConfigError("encoder.options.frontend_channels and encoder.options.frontend_freq_pool must be >= 1")
    if o.frontend_activation not in FRONTEND_ACTIVATIONS:
        raise ConfigError(f"encoder.options.frontend_activation={o.frontend_activation!r}: valid: "
                          f"{', '.join(FRONTEND_ACTIVATIONS)} (none: the published RETURNN configs)")
    return o


def time_reduction(o: ConvOptions) -> int:
    """Input frames per encoder output frame."""
    return o.pool_size ** o.pool_layers


def receptive_field(cfg) -> dict:
    """Receptive field of a conv encoder config.

    ``paper_s``: the paper's Fig. 3 estimate, (W - 1) x (80 ms) x layers, with 80 ms the frame
    period after pooling (``hop * time_reduction``). ``exact_s`` / ``exact_frames``: the exact span
    of input frames one output frame sees (2-D frontend, filters and pooling windows included).
    """
    o = conv_options(cfg.encoder)
    hop = cfg.features.hop
    period = hop * time_reduction(o)
    paper = (o.kernel - 1) * period * cfg.encoder.n_layers
    rf, jump = 1 + 2 * 2, 1  # two 3x3 convolutions at the input rate
    for i in range(cfg.encoder.n_layers):
        rf += (o.kernel - 1) * jump
        if i < o.pool_layers:
            rf += (o.pool_size - 1) * jump
            jump *= o.pool_size
    return {"kernel": o.kernel, "layers": cfg.encoder.n_layers, "frame_period_s": period, "paper_s": paper,
            "exact_frames": rf, "exact_s": rf * hop}


# ------------------------------------------------------------------------------------------ layers


def _zero_pad(x: Tensor, mask: Tensor) -> Tensor:
    """Zero the padded frames of x (B x T x ...), mask B x T (True = real frame)."""
    return x * mask.view(*mask.shape, *([1] * (x.dim() - 2))).to(x.dtype)


def pool_time(x: Tensor, size: int, ceil: bool) -> Tensor:
    """Max-pool B x T x D over time with kernel = stride = ``size``; padded frames must be zero."""
    if size == 1:
        return x
    B, T, D = x.shape
    if ceil:
        x = F.pad(x, (0, 0, 0, (-T) % size))
    else:
        x = x[:, : (T // size) * size]
    return x.reshape(B, -1, size, D).amax(2)


class Frontend2d(nn.Module):
    """Two 3x3 convolutions over (time, frequency), each followed by ReLU (``activation="none"``:
    nothing, as the published RETURNN configs) and max-pooling over frequency only (time
    resolution kept). B x T x F -> B x T x (C * F'), F' = F // p // p."""

    def __init__(self, n_feats: int, channels: int = 32, freq_pool: int = 2, activation: str = "relu"):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.freq_pool = freq_pool
        self.act = F.relu if activation == "relu" else (lambda h: h)
        self.out_dim = channels * (n_feats // freq_pool // freq_pool)

    def forward(self, feats: Tensor, mask: Tensor) -> Tensor:
        m = mask[:, None, :, None].to(feats.dtype)
        h = feats.unsqueeze(1) * m  # B x 1 x T x F
        for conv in (self.conv1, self.conv2):
            h = F.max_pool2d(self.act(conv(h * m)), (1, self.freq_pool))
        h = h * m
        B, C, T, Fp = h.shape
        return h.permute(0, 2, 1, 3).reshape(B, T, C * Fp)


class DepthwiseConvLayer(nn.Module):
    """Eq. (1): depthwise filter of width W over time (``d`` channels), then pointwise
    ``V x' + b`` (to ``d_out`` channels, default ``d``) and ``f``. ``gated``:
    ``(V x' + b) * sigmoid(U x' + c)`` instead (Fig. 1c), ``f(V x' + b) * sigmoid(U x' + c)`` with
    ``value_activation`` (RETURNN's ``gating`` layer with an activation)."""

    def __init__(self, d: int, kernel: int, activation: str = "relu", dropout: float = 0.0, gated: bool = False,
                 d_out: int | None = None, value_activation: bool = False):
        super().__init__()
        d_out = d_out or d
        self.depthwise = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d, bias=False)
        self.pointwise = nn.Linear(d, 2 * d_out if gated else d_out)
        self.act = ACTIVATIONS[activation]()
        self.gated, self.value_activation = gated, value_activation
        self.drop = Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.depthwise(_zero_pad(x, mask).transpose(1, 2)).transpose(1, 2)
        h = self.pointwise(x)
        if self.gated:
            a, g = h.chunk(2, dim=-1)
            h = (self.act(a) if self.value_activation else a) * torch.sigmoid(g)
        else:
            h = self.act(h)
        return self.drop(h)


class ConvEncoder(nn.Module):
    """features (B x T x F) -> hidden (B x T' x D), with output lengths, mask and frame times."""

    def __init__(self, cfg, gated: bool = False):
        super().__init__()
        enc = cfg.encoder
        o = conv_options(enc)
        self.opts = o
        d = enc.d_model
        self.frontend = Frontend2d(cfg.features.n_mels, o.frontend_channels, o.frontend_freq_pool, o.frontend_activation)
        self.pos = build_pos_encoding(enc, d_model=self.frontend.out_dim, frame_step=frame_step(cfg))
        d_in = self.pos.output_dim(self.frontend.out_dim)
        # projected: Linear -> D, residual groups 0-1, 2-3, ...; published: layer 0 takes the d_in
        # channels (its pointwise layer maps them to D), no residual around it, groups 1-2, 3-4, ...
        self.proj = nn.Linear(d_in, d) if o.project else nn.Identity()
        self.res_start = 0 if o.project else 1  #: layers before it lie outside the residual groups
        self.layers = nn.ModuleList(
            DepthwiseConvLayer(d if (o.project or i > 0) else d_in, o.kernel, enc.activation, enc.dropout, gated,
                               d_out=d, value_activation=o.gate_value_activation) for i in range(enc.n_layers))
        n_groups = -(-(enc.n_layers - self.res_start) // o.residual_every)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(n_groups))
        self.drop = Dropout(enc.dropout)
        self.d_model = d
        self.time_reduction = time_reduction(o)
        if enc.layer_drop > 0:
            logger.warning("encoder.layer_drop=%s is ignored by the conv encoders (no layer drop)", enc.layer_drop)
        rf = receptive_field(cfg)
        logger.info("%s encoder %dx%d, W=%d, pos_enc=%s: receptive field %.2f s by the paper's (W-1) x %d ms x "
                    "layers (exactly %d input frames = %.2f s)", "gated conv" if gated else "conv", enc.n_layers, d,
                    o.kernel, enc.pos_enc, rf["paper_s"], round(rf["frame_period_s"] * 1000), rf["exact_frames"],
                    rf["exact_s"])

    def _pool(self, x: Tensor, res: Tensor, mask: Tensor, lengths: Tensor, times: Tensor, layer: int):
        o = self.opts
        s = o.pool_size
        x, res = pool_time(_zero_pad(x, mask), s, o.pool_ceil), pool_time(_zero_pad(res, mask), s, o.pool_ceil)
        new = torch.div(lengths + (s - 1 if o.pool_ceil else 0), s, rounding_mode="floor")
        if bool((new <= 0).any()):
            b = int((new <= 0).nonzero()[0, 0])
            raise NoFramesError(
                f"conv encoder: utterance {b} of the batch has no frames left after the time pooling of layer "
                f"{layer} (it had {int(lengths[b])} frames there; encoder.options.pool_layers={o.pool_layers}, "
                f"pool_size={s}, pool_ceil={str(o.pool_ceil).lower()} need at least {self.time_reduction} input "
                f"frames). Drop shorter utterances (data.min_duration) or use encoder.options.pool_ceil=true", b)
        times = times[:, ::s][:, : x.shape[1]]
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < new[:, None]
        return x, res, mask, new, times

    def forward(self, feats: Tensor, lengths: Tensor, times: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if bool((lengths <= 0).any()):
            b = int((lengths <= 0).nonzero()[0, 0])
            raise ValueError(f"conv encoder: utterance {b} of the batch has {int(lengths[b])} feature frames")
        mask = torch.arange(feats.shape[1], device=feats.device)[None, :] < lengths[:, None]
        x = self.frontend(feats, mask)
        state = self.pos.begin(x, times, mask)  # positions from the 10 ms frame times, before any pooling
        x = _zero_pad(self.drop(self.proj(self.pos.embed(x, state))), mask)
        o = self.opts
        res = x
        for i, layer in enumerate(self.layers):
            x = layer(x, mask)
            if i < o.pool_layers:
                x, res, mask, lengths, times = self._pool(x, res, mask, lengths, times, i)
            j = i - self.res_start  # position in the residual groups
            if j < 0:
                res = x
            elif (j + 1) % o.residual_every == 0 or i == len(self.layers) - 1:
                x = _zero_pad(self.norms[j // o.residual_every](x + res), mask)
                res = x
        return x, lengths, mask, times


# ------------------------------------------------------------------------------ registry / checks

_HOOKS_UNSUPPORTED = ("qk", "attn_bias", "after_layer")


def _conv_pos_encodings() -> list[str]:
    """Positional encodings the conv encoders can use: those that only embed the input."""
    return [n for n, cls in POS_ENCODINGS.items()
            if all(getattr(cls, h) is getattr(PositionalEncoding, h) for h in _HOOKS_UNSUPPORTED)]


def validate_conv_config(cfg) -> None:
    """``encoder.options`` and what a conv encoder needs from the rest of the config."""
    enc = cfg.encoder
    o = conv_options(enc)
    if enc.pos_enc not in _conv_pos_encodings():
        raise ConfigError(f"encoder.pos_enc={enc.pos_enc!r} acts inside attention layers, which "
                          f"encoder.type={enc.type!r} has none of; valid: {', '.join(_conv_pos_encodings())}")
    n_freq = cfg.features.n_mels // o.frontend_freq_pool // o.frontend_freq_pool
    if n_freq < 1:
        raise ConfigError(f"features.n_mels={cfg.features.n_mels} leaves no frequency bins after two max-poolings of "
                          f"encoder.options.frontend_freq_pool={o.frontend_freq_pool}")
    red = time_reduction(o)
    if cfg.frontend.stride != red:
        raise ConfigError(
            f"frontend.stride={cfg.frontend.stride}: with encoder.type={enc.type!r} it must equal the encoder's time "
            f"reduction, encoder.options.pool_size ** pool_layers = {o.pool_size} ** {o.pool_layers} = {red} (the data "
            f"pipeline uses frontend.stride to drop utterances too short for CTC); set frontend.stride={red}")
    d_front = o.frontend_channels * n_freq
    pos = build_pos_encoding(enc, d_model=d_front, frame_step=frame_step(cfg))
    try:
        x = torch.zeros(1, 2, d_front)
        t, m = torch.tensor([[0.0, cfg.features.hop]]), torch.ones(1, 2, dtype=torch.bool)
        pos.embed(x, pos.begin(x, t, m))
    except (AssertionError, RuntimeError) as e:
        raise ConfigError(f"encoder.pos_enc={enc.pos_enc!r} does not fit the conv frontend output of "
                          f"{o.frontend_channels} channels x {n_freq} bins = {d_front} dims: {e}") from None


def frame_step(cfg) -> float:
    """Seconds between the frames the positional encoding sees: the 10 ms frames, before any time pooling."""
    return cfg.features.hop


def build_conv(cfg) -> nn.Module:
    return ConvEncoder(cfg, gated=False)


def build_gated_conv(cfg) -> nn.Module:
    return ConvEncoder(cfg, gated=True)
