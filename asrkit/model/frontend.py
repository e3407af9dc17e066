"""The Transformer's frontends: fbank frames (B x T x F) -> B x T' x D at ``frontend.stride``.

* ``conv1d`` (:class:`Conv1dGLU`): one 1-D convolution + GLU (CAPE paper, section 5.2: kernel 7,
  stride 3).
* ``conv2d`` (:class:`Conv2dSubsampling`): log2(stride) 2-D convolutions over (time, frequency),
  each of stride 2 on both axes + ReLU, then a linear layer: the "conv2d subsampling" of the
  ESPnet / icefall / NeMo Conformers, with NeMo's ``striding`` padding (``kernel // 2`` on every
  side), so ``T' = ceil(T / stride)``; checked against NeMo's ``ConvSubsampling``
  (tests/fixtures/nemo_conv_subsampling). ``frontend.padding: none`` gives ESPnet's
  ``Conv2dSubsampling`` instead: no padding, ``T' = ((T - 1) // 2 - 1) // 2`` at stride 4 and
  kernel 3 (checked against ESPnet's encoder: tests/fixtures/espnet_encoder).

Frame times follow the frames: output frame j is centred on input frame ``j * stride``, so its
time is that input frame's time (without padding, the first input frame of its receptive field,
which ESPnet's positional encoding also numbers j). With zero padding of ``kernel // 2`` and padded
frames zeroed (on the input, and after every 2-D convolution), a padded batch gives exactly the
outputs of each utterance alone; without padding, the valid outputs never see a padded frame.

The 2-D convolutions run in the memory layout :func:`conv_layout` picks for the device: the values
are the same up to rounding, only the speed differs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asrkit.model.dropout import Dropout
from asrkit.utils import freed_memory_kept


def _strided_lengths(lengths: Tensor, kernel: int, stride: int, pad: int | None = None) -> Tensor:
    pad = kernel // 2 if pad is None else pad
    return torch.div(lengths + 2 * pad - kernel, stride, rounding_mode="floor") + 1


def conv_layout(device: torch.device, capability: str | None = None, kept: bool | None = None) -> torch.memory_format:
    """The memory layout of :class:`Conv2dSubsampling`'s convolutions on ``device``: PyTorch's
    default (NCHW) on a CPU whose best kernels are AVX2 (``capability``, default
    ``torch.backends.cpu.get_cpu_capability()``) in a process that keeps freed memory (``kept``,
    default :func:`asrkit.utils.freed_memory_kept`: ``train.keep_freed_memory``), channels-last
    (NHWC) elsewhere. ESPnet's 192-channel subsampling in its Transformer, forward + backward
    (``python -m asrkit.bench frontend``, medians of 5 steps in two runs): on an AMD EPYC (AVX2)
    with freed memory kept the default layout's step 1.62-1.65 s against channels-last's 2.14-2.20
    s, with glibc's default allocator 2.48-2.50 against 2.28-2.47 s (the default layout's
    temporaries page-fault more); the same on a Xeon limited to AVX2 (``ATEN_CPU_CAPABILITY=avx2
    ONEDNN_MAX_CPU_ISA=AVX2``): kept 1.51-1.54 against 2.08-2.25 s, glibc's 2.11-2.21 against
    2.08-2.22 s. With AVX-512 (that Xeon) channels-last 1.44-1.78 s against 1.83-2.33 s with glibc's
    default, 1.24-1.32 against 1.26-1.39 s kept. On GPUs channels-last is cuDNN's layout for tensor
    cores."""
    if device.type != "cpu" or (capability or torch.backends.cpu.get_cpu_capability()) != "AVX2":
        return torch.channels_last
    return torch.contiguous_format if (freed_memory_kept() if kept is None else kept) else torch.channels_last


#: frontend.padding of conv2d -> zeros on each side of its convolutions, from the kernel
CONV2D_PADDINGS = {"half": lambda kernel: kernel // 2, "none": lambda kernel: 0}


class Conv1dGLU(nn.Module):
    def __init__(self, n_in: int, d_model: int, kernel: int = 7, stride: int = 3, dropout: float = 0.3):
        super().__init__()
        self.kernel, self.stride = kernel, stride
        self.conv = nn.Conv1d(n_in, 2 * d_model, kernel, stride=stride, padding=kernel // 2)
        self.dropout = Dropout(dropout)

    def out_lengths(self, lengths: Tensor) -> Tensor:
        return _strided_lengths(lengths, self.kernel, self.stride)

    def forward(self, feats: Tensor, lengths: Tensor, times: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """feats: B x T x F (padded frames zero), lengths: B, times: B x T seconds.
        Returns x: B x T' x D, lengths': B, times': B x T'."""
        x = F.glu(self.conv(feats.transpose(1, 2)), dim=1).transpose(1, 2)
        x = self.dropout(x)
        out_times = times[:, :: self.stride][:, : x.shape[1]]
        return x, self.out_lengths(lengths), out_times


class Conv2dSubsampling(nn.Module):
    """``n = log2(stride)`` x (Conv2d kernel x kernel, stride 2, padding kernel // 2 or none, ReLU)
    over (time, frequency), padded frames zeroed after each, then Linear(channels x F' -> d_model)
    (the conv output flattened channel-major, as NeMo and ESPnet do) and dropout."""

    def __init__(self, n_in: int, d_model: int, kernel: int = 3, stride: int = 4, channels: int = 64,
                 dropout: float = 0.0, padding: str = "half"):
        super().__init__()
        n = stride.bit_length() - 1
        if stride < 2 or stride != 1 << n:
            raise ValueError(f"Conv2dSubsampling: stride {stride} is not a power of 2 >= 2")
        self.kernel, self.stride = kernel, stride
        self.pad = CONV2D_PADDINGS[padding](kernel)
        self.convs = nn.ModuleList(nn.Conv2d(1 if i == 0 else channels, channels, kernel, stride=2, padding=self.pad)
                                   for i in range(n))
        f = n_in
        for _ in range(n):
            f = (f + 2 * self.pad - kernel) // 2 + 1
        self.out = nn.Linear(channels * f, d_model)
        self.dropout = Dropout(dropout)
        #: the convolutions' layout (None: :func:`conv_layout` of the input's device); the weights are
        #: kept in the layout of this machine's CPU, and converted per step on another device
        self.memory_format: torch.memory_format | None = None
        self.convs.to(memory_format=conv_layout(torch.device("cpu")))

    def out_lengths(self, lengths: Tensor) -> Tensor:
        for _ in self.convs:
            lengths = _strided_lengths(lengths, self.kernel, 2, self.pad)
        return lengths.clamp(min=0)

    def forward(self, feats: Tensor, lengths: Tensor, times: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """As :meth:`Conv1dGLU.forward`."""
        fmt = conv_layout(feats.device) if self.memory_format is None else self.memory_format
        h = feats.unsqueeze(1).contiguous(memory_format=fmt)  # B x 1 x T x F
        for conv in self.convs:
            h = F.relu(F.conv2d(h, conv.weight.contiguous(memory_format=fmt), conv.bias, 2, self.pad))
            lengths = _strided_lengths(lengths, self.kernel, 2, self.pad).clamp(min=0)
            if self.pad:  # without padding no valid output sees a padded frame: nothing to zero
                keep = torch.arange(h.shape[2], device=h.device)[None, :] < lengths[:, None]
                h = h * keep[:, None, :, None].to(h.dtype)
        B, C, T, Fp = h.shape
        x = self.dropout(self.out(h.transpose(1, 2).reshape(B, T, C * Fp)))
        out_times = times[:, :: self.stride][:, :T]
        return x, lengths, out_times


#: frontend.type -> its module class (the single list of valid frontends)
FRONTENDS = {"conv1d": Conv1dGLU, "conv2d": Conv2dSubsampling}


def build_frontend(n_feats: int, d_model: int, cfg) -> nn.Module:
    """The frontend ``cfg`` (:class:`asrkit.config.FrontendConfig`) names."""
    if cfg.type == "conv2d":
        return Conv2dSubsampling(n_feats, d_model, cfg.kernel, cfg.stride, cfg.channels, cfg.dropout,
                                 getattr(cfg, "padding", "half"))
    return Conv1dGLU(n_feats, d_model, cfg.kernel, cfg.stride, cfg.dropout)
