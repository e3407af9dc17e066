"""``spe_sine`` / ``spe_conv``: gated Stochastic Positional Encoding (Liutkus et al. 2021, section 2).

SPE realizes a *relative* attention template ``P_d(m - n)`` per feature d without ever forming an
attention matrix, so it works with linear attention (``encoder.attention=linear_relu|linear_favor``;
it is rejected at config time with softmax attention). Per head, with d_head = D features:

* draw zero-mean random codes ``Qbar_d`` (positions x R) and ``Kbar_d`` whose cross-covariance is
  ``E[Qbar_d(m) Kbar_d(n)] = P_d(m - n)`` (R = ``realizations``);
* gating (section 2.2, on by default): ``Qbar_d <- sqrt(1-delta_d) Qbar_d + sqrt(delta_d) eps_d`` and
  the same for ``Kbar_d`` with the *same* eps_d ~ N(0, I_R), giving the template
  ``delta_d + (1 - delta_d) P_d``; one learnable gate per layer, head and feature;
* new queries/keys of dimension R (eqs. 16-17): ``qhat = sum_d q_d Qbar_d / (D R)^(1/4)``, so that
  ``qhat . khat / sqrt(R) ~ sum_d q_d k_d P_d(m - n) / sqrt(D)`` (eq. 8), which the linear attention
  then feeds to its feature map.

The codes are drawn once per forward in :meth:`begin` and shared by all layers (the paper's
"sharing" across layers, not across heads); each layer only applies its own gates, and the
gating noise eps is drawn per layer. At training the draws come from torch's global RNG (new
codes every step, as the paper); at evaluation from a generator seeded with ``eval_seed``, so
inference is deterministic. Codes are shared by the examples of a batch (appendix A.2,
"sample-wise noise sharing") yet depend only on each frame's position, so a batch of N gives the
outputs of N batches of 1.

Positions are frame times in units of ``frame_step``: ``u = t / frame_step``.

* ``spe_sine`` (variant I, eq. 18): ``P_d(tau) = 1/(2K) sum_k lambda_kd^2 cos(2 pi f_kd tau + theta_kd)``
  (the 1/(2K) of eqs. 20-21 included), periodic, defined for any real tau, so irregular times are
  encoded exactly. Codes: ``Qbar_d = Omega(u; f_d, theta_d) diag(lambda) Z_d / sqrt(2K)``,
  ``Kbar_d = Omega(u; f_d, 0) diag(lambda) Z_d / sqrt(2K)`` with Z_d a 2K x R Gaussian matrix.
  f = 0.5 sigmoid(.) cycles per frame (up to Nyquist), initialized log-uniformly in [1/1000, 1/2].
* ``spe_conv`` (variant II, eq. 22): white noise on the integer frame grid ``round(u)`` filtered by
  learnable length-P filters, ``Qbar_d = Z * phi^Q_d``, ``Kbar_d = Z * phi^K_d``, giving the vanishing
  template ``P_d(tau) = sum_p phi^Q_d(p) phi^K_d(p + tau)`` (zero for |tau| >= P). The noise at grid
  point g depends only on (seed, g) (drawn in blocks of ``BLOCK`` points), and is drawn on the
  grid extended by the filter length, so there are no edge effects.

Memory: the codes take 2 x H x N x D x R floats for N distinct positions (N = T when the batch
shares its frame times, as in the padded pipeline; N = B x T otherwise): linear in T.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from asrkit.model.posenc.base import PositionalEncoding, PosState
from asrkit.schema import ConfigError


@dataclass
class SPEOptions:
    realizations: int = 32  #: R, dimension of the new queries/keys (paper: 32 or 64)
    gated: bool = True  #: gated SPE (section 2.2)
    frame_step: float = 0.03  #: seconds per position unit (default: the encoder's frame spacing)
    eval_seed: int = 0  #: seed of the codes at evaluation (deterministic inference)

    def __post_init__(self):

        if self.realizations < 1 or self.frame_step <= 0:
            raise ConfigError(f"encoder.pos.realizations={self.realizations} must be >= 1 and frame_step > 0")


class SPE(PositionalEncoding):
    """Shared machinery: draws per forward, gating, the qk hook. Subclasses draw the codes."""

    attention = ("linear",)
    Options = SPEOptions

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts=None):
        super().__init__(d_model, n_heads, n_layers, opts)
        self.d_head = d_model // n_heads
        # gate logits per layer, head, feature; sigmoid(0) = 0.5 at init
        self.gates = nn.Parameter(torch.zeros(n_layers, n_heads, self.d_head)) if self.opts.gated else None

    # -- to implement ------------------------------------------------------------------------
    def codes(self, u: Tensor, R: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """Codes at positions ``u`` (N, in frames): Qbar, Kbar, each N x H x D x R (float32).
        Position-major, so that each layer's ``q @ Qbar`` is a batched matmul without copies."""
        raise NotImplementedError

    def kernel(self, tau: Tensor) -> Tensor:
        """The prescribed (ungated) template P_d(tau), H x D x len(tau)."""
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------
    def gate(self, layer: int) -> Optional[Tensor]:
        return None if self.gates is None else torch.sigmoid(self.gates[layer].float())

    def gated_kernel(self, layer: int, tau: Tensor) -> Tensor:
        """delta_d + (1 - delta_d) P_d(tau): the template layer ``layer`` realizes."""
        p = self.kernel(tau)
        g = self.gate(layer)
        return p if g is None else g[..., None] + (1 - g[..., None]) * p

    def generator(self) -> torch.Generator:
        """CPU generator of this forward's draws: seeded from torch's global RNG at training
        (fresh codes every step, reproducible under ``torch.manual_seed``), ``eval_seed`` at eval."""
        seed = self.opts.eval_seed if not self.training else int(torch.randint(0, 2**62, (1,)).item())
        return torch.Generator().manual_seed(seed)

    def begin(self, x: Tensor, times: Tensor, mask: Tensor) -> PosState:
        B, T = times.shape
        t = torch.where(mask, times, times[:, :1]).to(torch.float64)  # padded frames: a valid time
        ref = int(mask.sum(1).argmax())
        shared = bool(((t == t[ref]) | ~mask).all())  # padded pipeline: all rows share frame times
        u = (t[ref] if shared else t.reshape(-1)) / self.opts.frame_step
        gen = self.generator()
        R = self.opts.realizations
        with torch.autocast(x.device.type, enabled=False):
            qbar, kbar = self.codes(u, R, gen)
        if not shared:  # (B T) x H x D x R -> B x T x H x D x R
            qbar, kbar = (c.view(B, T, *c.shape[1:]) for c in (qbar, kbar))
        eps = None
        if self.gates is not None:
            eps = torch.randn(self.n_layers, self.n_heads, self.d_head, R, generator=gen).to(x.device)
        return PosState(times=times, mask=mask, extra={"spe": (qbar, kbar, eps, shared)})

    def qk(self, layer: int, q: Tensor, k: Tensor, state: PosState) -> tuple[Tensor, Tensor]:
        qbar, kbar, eps, shared = state.extra["spe"]
        D, R = self.d_head, self.opts.realizations
        norm = (D * R) ** -0.25
        g = self.gate(layer)
        a = norm if g is None else norm * torch.sqrt(1 - g)[None, :, None, :]  # 1 x H x 1 x D
        with torch.autocast(q.device.type, enabled=False):
            out = []
            for x, code in ((q.float(), qbar), (k.float(), kbar)):
                xa = x * a  # B x H x T x D
                if shared:  # (T x H x B x D) @ (T x H x D x R)
                    y = torch.matmul(xa.permute(2, 1, 0, 3), code).permute(2, 1, 0, 3)
                else:  # (B x T x H x 1 x D) @ (B x T x H x D x R)
                    y = torch.matmul(xa.permute(0, 2, 1, 3).unsqueeze(-2), code).squeeze(-2).transpose(1, 2)
                if g is not None:  # gating noise, shared by queries and keys: (B x H x T x D) @ (H x D x R)
                    y = y + torch.matmul(x * (norm * torch.sqrt(g)[None, :, None, :]), eps[layer])
                out.append(y)
        return out[0], out[1]


class SineSPE(SPE):
    name = "spe_sine"

    @dataclass
    class Options(SPEOptions):
        sines: int = 10  #: K sinusoidal components per feature (paper, LRA: 10)

        def __post_init__(self):
            super().__post_init__()

            if self.sines < 1:
                raise ConfigError(f"encoder.pos.sines={self.sines} must be >= 1")

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts=None):
        super().__init__(d_model, n_heads, n_layers, opts)
        H, D, K = n_heads, self.d_head, self.opts.sines
        f0 = torch.exp(torch.empty(H, D, K).uniform_(math.log(1e-3), math.log(0.5)))  # cycles / frame
        self.freq_logits = nn.Parameter(torch.logit(2 * f0, eps=1e-6))
        self.phases = nn.Parameter(torch.zeros(H, D, K))
        self.gains = nn.Parameter(torch.ones(H, D, K))

    def freqs(self) -> Tensor:
        return 0.5 * torch.sigmoid(self.freq_logits.float())

    def kernel(self, tau: Tensor) -> Tensor:
        K = self.opts.sines
        ph = 2 * math.pi * self.freqs()[..., None] * tau.float() + self.phases.float()[..., None]  # H D K N
        return (self.gains.float()[..., None] ** 2 * torch.cos(ph)).sum(2) / (2 * K)

    def prepare_export(self) -> None:
        """The evaluation draws (``eval_seed``: the codes' noise, then the gates' noise, in the
        order :meth:`begin` draws them) become constants of the exported graph."""
        gen = self.generator()
        z = self._draw_z(self.opts.realizations, gen)
        eps = None
        if self.gates is not None:
            eps = torch.randn(self.n_layers, self.n_heads, self.d_head, self.opts.realizations, generator=gen)
        self._export_draws = (z, eps)

    def begin(self, x: Tensor, times: Tensor, mask: Tensor) -> PosState:
        draws = getattr(self, "_export_draws", None)
        if not (torch.onnx.is_in_onnx_export() and draws is not None):
            return super().begin(x, times, mask)
        # exported graphs: every row shares the frame times t * hop (asrkit.inference.onnx)
        z, eps = draws
        qbar, kbar = self._codes(times[0] / self.opts.frame_step, z)
        return PosState(times=times, mask=mask, extra={"spe": (qbar, kbar, eps, True)})

    def _draw_z(self, R: int, gen: torch.Generator) -> Tensor:
        H, D, K = self.n_heads, self.d_head, self.opts.sines
        return torch.randn(H, D, 2 * K, R, generator=gen).to(self.gains.device) * (1.0 / math.sqrt(2 * K))

    def codes(self, u: Tensor, R: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        z = self._draw_z(R, gen)
        if torch.is_grad_enabled():  # keep only the codes: recompute the N x 2K modulations in backward
            return checkpoint(self._codes, u, z, use_reentrant=False)
        return self._codes(u, z)

    def _codes(self, u: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        # phases of the positions in float64 (minutes of audio), reduced mod 2 pi, then float32
        w = 2 * math.pi * self.freqs().double()  # H D K
        ph = torch.remainder(u.to(z.device)[None, :, None, None] * w[:, None], 2 * math.pi).float()  # H N D K
        th = self.phases.float()[:, None]  # H 1 D K
        lam = self.gains.float()[:, None].repeat(1, 1, 1, 2)
        omega_q = torch.cat([torch.cos(ph + th), torch.sin(ph + th)], -1) * lam
        omega_k = torch.cat([torch.cos(ph), torch.sin(ph)], -1) * lam
        # [cos_k..., sin_k...] pairs the same Z rows for the cos and sin of a component as eq. (19)
        qbar = torch.einsum("hndl,hdlr->nhdr", omega_q, z).contiguous()
        kbar = torch.einsum("hndl,hdlr->nhdr", omega_k, z).contiguous()
        return qbar, kbar


def _fft_size(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= n (fast FFT lengths)."""
    best = 1 << (n - 1).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


class ConvSPE(SPE):
    name = "spe_conv"
    BLOCK = 32  #: grid points per noise block

    @dataclass
    class Options(SPEOptions):
        kernel_size: int = 128  #: P, filter length in frames (paper, LRA and music: 128; 3.84 s here)

        def __post_init__(self):
            super().__post_init__()

            if self.kernel_size < 1:
                raise ConfigError(f"encoder.pos.kernel_size={self.kernel_size} must be >= 1")

    def __init__(self, d_model: int, n_heads: int, n_layers: int, opts=None):
        super().__init__(d_model, n_heads, n_layers, opts)
        H, D, P = n_heads, self.d_head, self.opts.kernel_size
        w = torch.randn(H, D, P) / math.sqrt(P)
        self.filters_q = nn.Parameter(w.clone())  # equal at init: P_d peaks at lag 0
        self.filters_k = nn.Parameter(w.clone())

    def kernel(self, tau: Tensor) -> Tensor:
        """P_d(tau) = sum_p wq(p) wk(p + tau) (zero outside |tau| < P), for integer tau."""
        P = self.opts.kernel_size
        wq, wk = self.filters_q.float(), self.filters_k.float()
        full = torch.stack(
            [(wq[..., max(0, -s) : P - max(0, s)] * wk[..., max(0, s) : P - max(0, -s)]).sum(-1) if abs(s) < P
             else wq.new_zeros(wq.shape[:-1]) for s in range(-P + 1, P)], -1
        )  # H D (2P-1), lags -(P-1) .. P-1
        t = tau.long()
        inside = t.abs() < P
        out = full[..., (t.clamp(-P + 1, P - 1) + P - 1)]
        return torch.where(inside, out, 0.0)

    def noise(self, g0: int, n: int, R: int, seed: int) -> Tensor:
        """White noise at grid points g0 .. g0+n-1, n x H x D x R; the value at a grid point depends
        only on (seed, grid point), whatever the range asked."""
        H, D, Bk = self.n_heads, self.d_head, self.BLOCK
        z = torch.empty(n, H, D, R)
        for b in range(g0 // Bk, (g0 + n - 1) // Bk + 1):
            gen = torch.Generator().manual_seed((seed * 1_000_003 + b + 2**40) % 2**63)
            lo, hi = max(g0, b * Bk), min(g0 + n, (b + 1) * Bk)  # grid points of block b we need
            if hi - lo == Bk:
                z[lo - g0 : hi - g0].normal_(generator=gen)
            else:
                z[lo - g0 : hi - g0] = torch.randn(Bk, H, D, R, generator=gen)[lo - b * Bk : hi - b * Bk]
        return z

    def codes(self, u: Tensor, R: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        P = self.opts.kernel_size
        dev = self.filters_q.device
        grid = torch.round(u).long()
        g0, g1 = int(grid.min()), int(grid.max())
        G, c = g1 - g0 + 1, P // 2
        seed = int(torch.randint(0, 2**62, (1,), generator=gen).item())
        z = self.noise(g0 - c, G + P - 1, R, seed).to(dev)  # (G+P-1) x H x D x R
        # Qbar(g) = sum_p z(g - c + p) wq(p) for g = g0 .. g1: a correlation, computed as a linear
        # convolution with the flipped filters through the FFT (O(G log G) instead of O(G P); grouped
        # conv1d is far slower on CPU, its backward especially). n >= G + P - 1 avoids wrap-around
        # for the G outputs kept.
        n = _fft_size(G + P - 1)
        zf = torch.fft.rfft(z, n=n, dim=0)  # n/2+1 x H x D x R
        del z
        idx = grid - g0
        regular = G == u.numel() and bool((idx == torch.arange(G, device=idx.device)).all())
        out = []
        for filt in (self.filters_q, self.filters_k):
            wf = torch.fft.rfft(filt.float().flip(-1), n=n, dim=-1).permute(2, 0, 1)[..., None]  # n/2+1 x H x D x 1
            y = torch.fft.irfft(zf * wf, n=n, dim=0)[P - 1 : P - 1 + G]  # G x H x D x R
            out.append(y if regular else y[idx])  # regular grid: a view, no gather
        return out[0], out[1]
