"""SPE templates (asrkit.model.posenc.spe) against the official SPE code.

Oracle: tests/fixtures/spe_official_kernels.json, the exact cross-covariance
``P_d(tau) = E[Qbar_d(m) Kbar_d(n)]`` of the codes drawn by the official implementation
(github.com/aliutkus/spe, commit 3aa364b102ed9b7b2ce172a0e12c9f70f0f36a3a,
src/pytorch/spe/spe.py), for one sine and one conv parameter set; its ``note`` says how it was
computed. The parameters go into asrkit's modules through the mapping the note gives; then
asrkit's ``kernel``, its Monte-Carlo codes and its gated ``qk`` path must realize those templates.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from asrkit.model.posenc.spe import ConvSPE, SineSPE

torch.set_num_threads(1)

FIX = json.loads((Path(__file__).parent / "fixtures" / "spe_official_kernels.json").read_text())
H, D, L = FIX["H"], FIX["D"], FIX["L"]
LAGS = torch.arange(-(L - 1), L)  # tau = m - n


def official(name: str) -> tuple[object, torch.Tensor]:
    """asrkit's module with the fixture's parameters, and the official template by lag (H x D x 2L-1)."""
    fx = FIX[name]
    t = lambda key: torch.tensor(fx[key], dtype=torch.float32)  # noqa: E731
    if name == "sine":
        spe = SineSPE(H * D, H, 2, SineSPE.Options(sines=fx["K"], frame_step=1.0))
        params = {"freq_logits": t("freqs"), "phases": t("offsets"), "gains": t("gains_softplus")}
    else:
        spe = ConvSPE(H * D, H, 2, ConvSPE.Options(kernel_size=fx["kernel_size"], frame_step=1.0))
        params = {"filters_q": t("filter_q"), "filters_k": t("filter_k")}
    with torch.no_grad():
        for k, v in params.items():
            getattr(spe, k).copy_(v)
    return spe.eval(), torch.tensor(fx["P"], dtype=torch.float64)


def as_matrix(p_lags: torch.Tensor) -> torch.Tensor:
    """H x D x L x L template P(m - n) from the lag vector."""
    m = torch.arange(L)
    return p_lags[..., (m[:, None] - m[None, :]) + L - 1]


@pytest.mark.parametrize("name", ["sine", "conv"])
def test_kernel_equals_official_template(name):
    spe, ref = official(name)
    torch.testing.assert_close(spe.kernel(LAGS).double(), ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["sine", "conv"])
def test_codes_converge_to_official_template(name):
    """Qbar Kbar^T / R -> P_d(m - n) on the frame grid, error ~ 1/sqrt(R)."""
    spe, ref = official(name)
    target = as_matrix(ref)
    u = torch.arange(L, dtype=torch.float64)
    errs = []
    for R in (64, 1024, 8192):
        with torch.no_grad():
            qbar, kbar = spe.codes(u, R, torch.Generator().manual_seed(R))  # L x H x D x R
        est = torch.einsum("mhdr,nhdr->hdmn", qbar.double(), kbar.double()) / R
        errs.append(float((est - target).abs().mean() / target.abs().mean()))
    assert errs[0] > errs[1] > errs[2] and errs[2] < 0.05, errs
    assert errs[0] / errs[2] > 7, errs  # ~ sqrt(8192 / 64) = 11.3


@pytest.mark.parametrize("name", ["sine", "conv"])
def test_gated_qk_realizes_gated_official_template(name):
    """Through begin() and qk() (the path the attention uses): with one-hot queries and keys on
    feature d, qhat(m) . khat(n) sqrt(D R) / R -> delta_d + (1 - delta_d) P_d(m - n), the gated
    template of section 2.2 (delta_d = sigmoid(gate) of the layer)."""
    spe, ref = official(name)
    R = 8192
    spe.opts.realizations = R
    with torch.no_grad():
        spe.gates.copy_(torch.randn(spe.gates.shape, generator=torch.Generator().manual_seed(3)))
    times = torch.arange(L, dtype=torch.float32)[None].expand(D, L)  # frame_step 1: u = frame index
    st = spe.begin(torch.zeros(D, L, H * D), times, torch.ones(D, L, dtype=torch.bool))
    onehot = torch.eye(D)[:, None, None, :].expand(D, H, L, D)  # batch b: feature b only
    with torch.no_grad():
        qhat, khat = spe.qk(1, onehot, onehot, st)  # D x H x L x R
    est = torch.einsum("bhmr,bhnr->hbmn", qhat.double(), khat.double()) * math.sqrt(D * R) / R
    g = torch.sigmoid(spe.gates[1].detach()).double()[..., None, None]
    target = g + (1 - g) * as_matrix(ref)
    assert float((est - target).abs().mean()) < 0.05 * float(target.abs().mean())
    # the gate matters: the ungated template is far from what the gated codes realize
    assert float((est - as_matrix(ref)).abs().mean()) > 0.2 * float(target.abs().mean())


def test_sine_template_at_irregular_positions():
    """Sine SPE is defined for any real lag (irregular frame times): eq. (18) with the 1/(2K) of
    eqs. (20-21), whose reading is first checked against the official template at integer lags."""
    spe, ref = official("sine")
    fx = FIX["sine"]
    f = torch.sigmoid(torch.tensor(fx["freqs"], dtype=torch.float64)) / 2  # official: sigmoid(freqs) / 2
    theta = torch.tensor(fx["offsets"], dtype=torch.float64)
    lam2 = torch.tensor(fx["gains_softplus"], dtype=torch.float64) ** 2

    def eq18(tau: torch.Tensor) -> torch.Tensor:
        ph = 2 * math.pi * f[..., None] * tau + theta[..., None]  # H D K N
        return (lam2[..., None] * torch.cos(ph)).sum(2) / (2 * fx["K"])

    torch.testing.assert_close(eq18(LAGS.double()), ref, atol=1e-8, rtol=1e-7)
    u = torch.arange(L, dtype=torch.float64) * 1.37
    tau = u[:, None] - u[None, :]
    target = eq18(tau.reshape(-1)).reshape(H, D, L, L)
    torch.testing.assert_close(spe.kernel(tau.reshape(-1)).double().reshape(H, D, L, L), target, atol=1e-5, rtol=1e-4)
    R = 8192
    with torch.no_grad():
        qbar, kbar = spe.codes(u, R, torch.Generator().manual_seed(1))
    est = torch.einsum("mhdr,nhdr->hdmn", qbar.double(), kbar.double()) / R
    assert float((est - target).abs().mean()) < 0.05 * float(target.abs().mean())
