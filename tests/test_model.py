"""Model shapes and padding invariance (batch of 1 == batch of N in eval mode)."""
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from asrkit.training.checks import load_config
from asrkit.model import build_model


def _cfg(*extra):
    return load_config(None, ["encoder.d_model=64", "encoder.n_layers=2", "encoder.n_heads=4", "encoder.d_ff=128",
                              "encoder.layer_drop=0.0", *extra])


def _batch(lens, F=80, hop=0.01, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lens)
    feats = torch.zeros(len(lens), T, F)
    for i, n in enumerate(lens):
        feats[i, :n] = torch.randn(n, F, generator=g)
    times = torch.arange(T).float()[None].expand(len(lens), -1) * hop
    return feats, torch.tensor(lens), times


@pytest.mark.parametrize("norm_first", [False, True])
def test_forward_shapes(norm_first):
    m = build_model(_cfg(f"encoder.norm_first={str(norm_first).lower()}"), 30).eval()
    feats, lens, times = _batch([100, 61, 7])
    out = m.encode(feats, lens, times)
    assert out.log_probs.shape == (3, 34, 30)
    assert out.lengths.tolist() == [34, 21, 3]  # ceil(n / 3)
    assert torch.allclose(out.times[0, :3], torch.tensor([0.0, 0.03, 0.06]))
    assert torch.allclose(out.log_probs.exp().sum(-1), torch.ones(3, 34), atol=1e-4)


CONV2D = ["frontend.type=conv2d", "frontend.kernel=3", "frontend.stride=4", "frontend.channels=8"]


@pytest.mark.parametrize("frontend", ["conv1d", "conv2d"])
@pytest.mark.parametrize("conv_kernel", [0, 15])
@pytest.mark.parametrize("norm_first", [False, True])
def test_batch_of_one_equals_batch_of_n(norm_first, conv_kernel, frontend):
    """conv_kernel 15: the Conformer convolution module sees 15 frames, more than the shortest
    utterance has, so its padded frames would leak into every real one if they were not zeroed.
    conv2d: the 2-D subsampling's first convolution turns padded frames into ReLU(bias), which
    the second would read if they were not zeroed."""
    extra = CONV2D if frontend == "conv2d" else []
    m = build_model(_cfg(f"encoder.norm_first={str(norm_first).lower()}", f"encoder.conv_kernel={conv_kernel}", *extra),
                    30).eval()
    lens = [100, 61, 7, 88]
    feats, l, times = _batch(lens)
    full = m.encode(feats, l, times)
    for i, n in enumerate(lens):
        one = m.encode(feats[i:i + 1, :n], l[i:i + 1], times[i:i + 1, :n])
        k = int(one.lengths[0])
        assert k == int(full.lengths[i])
        torch.testing.assert_close(one.log_probs[0], full.log_probs[i, :k], atol=1e-5, rtol=1e-5)


def test_conv_kernel_adds_a_convolution_module_and_keeps_plain_layers_keys():
    from asrkit.schema import ConfigError

    plain = set(build_model(_cfg(), 30).state_dict())
    conformer = build_model(_cfg("encoder.conv_kernel=5"), 30)
    new = set(conformer.state_dict()) - plain
    assert plain < set(conformer.state_dict())  # checkpoints of plain Transformers load as before
    assert {k.split(".", 3)[3] for k in new} == {"conv.pw1.weight", "conv.pw1.bias", "conv.dw.weight", "conv.dw.bias",
                                                "conv.norm.weight", "conv.norm.bias", "conv.pw2.weight", "conv.pw2.bias",
                                                "norm_conv.weight", "norm_conv.bias"}
    assert conformer.state_dict()["encoder.layers.0.conv.dw.weight"].shape == (64, 1, 5)  # depthwise
    for bad in (4, 1, -3):
        with pytest.raises(ConfigError, match=r"encoder.conv_kernel.*odd kernel >= 3"):
            build_model(_cfg(f"encoder.conv_kernel={bad}"), 30)


#: ESPnet's whole Conformer layer (tests/test_peers.py matches it against ESPnet's output)
CONFORMER = ["encoder.norm_first=true", "encoder.conv_kernel=15", "encoder.macaron=true", "encoder.block_norm=true",
             "encoder.conv_norm=batch", "encoder.activation=swish", "encoder.dropout=0.0"]


def _drawn_running_stats(m):
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, b in m.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


@pytest.mark.parametrize("pos_enc", ["relpos_xl", "alibi"])
def test_full_conformer_batch_of_one_equals_batch_of_n_and_more_padding_changes_nothing(pos_enc):
    """macaron + convolution module with BatchNorm + closing LayerNorm: in eval mode each utterance
    alone gives its outputs in the padded batch; in training mode (batch statistics over the real
    frames) the same batch padded 40 frames longer gives the same outputs."""
    m = build_model(_cfg(*CONFORMER, f"encoder.pos_enc={pos_enc}", "encoder.pos={}", "specaug.enabled=false",
                         "frontend.dropout=0.0"), 30)  # nothing random in training mode
    _drawn_running_stats(m)
    lens = [100, 61, 7, 88]
    feats, l, times = _batch(lens)
    m.eval()
    full = m.encode(feats, l, times)
    for i, n in enumerate(lens):
        one = m.encode(feats[i:i + 1, :n], l[i:i + 1], times[i:i + 1, :n])
        k = int(one.lengths[0])
        torch.testing.assert_close(one.log_probs[0], full.log_probs[i, :k], atol=1e-5, rtol=1e-5)
    m.train()
    a = m.encode(feats, l, times)
    longer = torch.cat([feats, torch.zeros(len(lens), 40, feats.shape[2])], 1)  # padding is zeros, as the collator pads
    b = m.encode(longer, l, torch.arange(longer.shape[1]).float()[None].expand(len(lens), -1) * 0.01)
    for i in range(len(lens)):
        k = int(a.lengths[i])
        torch.testing.assert_close(a.log_probs[i, :k], b.log_probs[i, :k], atol=1e-5, rtol=1e-5)


def test_conformer_keys_are_checked():
    from asrkit.schema import ConfigError

    for bad, match in ((["encoder.macaron=true"], r"'encoder.macaron' is for the pre-LN.*set encoder.norm_first=true"),
                       (["encoder.block_norm=true"], r"'encoder.block_norm' is for the pre-LN"),
                       (["encoder.conv_norm=batch"], r"'encoder.conv_norm'='batch'.*set encoder.conv_kernel"),
                       (["encoder.conv_kernel=5", "encoder.conv_norm=group"], r"encoder.conv_norm.*valid: layer, batch")):
        with pytest.raises(ConfigError, match=match):
            build_model(_cfg(*bad), 30)
    plain = set(build_model(_cfg("encoder.norm_first=true", "encoder.conv_kernel=5"), 30).state_dict())
    full = set(build_model(_cfg(*CONFORMER), 30).state_dict())
    assert {k.split(".", 3)[3] for k in full - plain} >= {"ffn_macaron.0.weight", "norm_macaron.weight", "norm_out.weight",
                                                         "conv.norm.running_mean", "conv.norm.running_var"}


def test_conv_module_matches_speechbrain():
    """The Conformer convolution module (with the layer's pre-norm) against SpeechBrain 1.1.2's
    ConvolutionModule (tests/fixtures/conformer/README.md). SpeechBrain zeroes padded frames only
    in its output, so in its padded batch the last k // 2 real frames of the shorter utterance
    read its padding; asrkit zeroes them before the depthwise conv and equals SpeechBrain run on
    each utterance alone."""
    from asrkit.model.transformer import ConvModule

    f = {k: torch.from_numpy(v) for k, v in np.load(Path(__file__).parent / "fixtures" / "conformer" /
                                                     "speechbrain_conv_module.npz").items()}
    conv, norm_conv = ConvModule(8, 5, 0.0).eval(), nn.LayerNorm(8)
    norm_conv.load_state_dict({"weight": f["layer_norm.weight"], "bias": f["layer_norm.bias"]})
    conv.load_state_dict({"pw1.weight": f["bottleneck.0.weight"].squeeze(-1), "pw1.bias": f["bottleneck.0.bias"],
                          "dw.weight": f["conv.weight"], "dw.bias": f["conv.bias"],
                          "norm.weight": f["after_conv.0.weight"], "norm.bias": f["after_conv.0.bias"],
                          "pw2.weight": f["after_conv.2.weight"], "pw2.bias": f["after_conv.2.bias"]})
    x, lengths = f["x"], f["lengths"]
    frame_mask = torch.arange(x.shape[1])[None] < lengths[:, None]
    assert torch.equal(frame_mask, ~f["pad_mask"][..., 0])
    with torch.no_grad():
        y = conv(norm_conv(x), frame_mask)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(y[b, :n], f["out_alone"][b, :n], atol=1e-5, rtol=0)
    torch.testing.assert_close(y[:, :5], f["out"][:, :5], atol=1e-5, rtol=0)
    assert (y[1, 5:7] - f["out"][1, 5:7]).abs().max() > 0.1  # SpeechBrain's batch: padding leaks in


def test_conv2d_frontend_lengths_times_and_config_errors():
    from asrkit.schema import ConfigError

    m = build_model(_cfg(*CONV2D), 30).eval()
    feats, lens, times = _batch([100, 61, 7])
    out = m.encode(feats, lens, times)
    assert out.lengths.tolist() == [25, 16, 2]  # ceil(n / 4), as every data filter assumes
    assert torch.allclose(out.times[0, :3], torch.tensor([0.0, 0.04, 0.08]))
    keys = set(m.state_dict())
    assert {"encoder.frontend.convs.0.weight", "encoder.frontend.convs.1.weight", "encoder.frontend.out.weight"} <= keys
    assert m.state_dict()["encoder.frontend.out.weight"].shape == (64, 8 * 20)  # 8 channels x 80 / 4 mels
    for bad, match in ((["frontend.type=conv3d"], r"frontend.type.*valid: conv1d, conv2d"),
                       (CONV2D + ["frontend.stride=3"], r"frontend.stride.*power of 2"),
                       (CONV2D + ["frontend.kernel=4"], r"frontend.kernel.*odd kernel >= 3"),
                       (CONV2D + ["frontend.channels=0"], r"frontend.channels"),
                       (CONV2D + ["encoder.type=conv", "encoder.n_layers=2", "encoder.options={pool_layers: 2}"],
                        r"frontend.type.*remove frontend.type")):
        with pytest.raises(ConfigError, match=match):
            build_model(_cfg(*bad), 30)


def test_conv2d_frontend_matches_nemo():
    """The conv2d frontend against NeMo's ConvSubsampling (striding, factor 4), run unchanged
    (tests/fixtures/nemo_conv_subsampling/README.md): the same output lengths, and the same
    outputs on every frame of the padded batch and of each utterance alone. Length 21 makes the
    first convolution's valid length odd, so its last valid frame reads padding: NeMo masks it
    between the convolutions, and so must asrkit."""
    from asrkit.model.frontend import Conv2dSubsampling

    f = {k: torch.from_numpy(v) for k, v in np.load(Path(__file__).parent / "fixtures" / "nemo_conv_subsampling" /
                                                     "nemo_striding4.npz").items()}
    m = Conv2dSubsampling(16, 12, kernel=3, stride=4, channels=8).eval()
    names = {"convs.0": "conv.0", "convs.1": "conv.2", "out": "out"}
    m.load_state_dict({k: f["param/" + names[k.rsplit(".", 1)[0]] + "." + k.rsplit(".", 1)[1]] for k in m.state_dict()})
    x = f["x"]
    x21 = x.clone()
    x21[1, 21:] = 0
    times = torch.arange(x.shape[1]).float()[None].expand(2, -1) * 0.01
    with torch.no_grad():
        for xs, lengths, y_batch, len_batch, alone in (
                (x, f["lengths"], f["y_batch"], f["len_batch"], [(f["y_alone_0"], f["len_alone_0"]), (f["y_alone_1"], f["len_alone_1"])]),
                (x21, f["lengths21"], f["y_batch21"], f["len_batch21"], [(f["y_alone_0"], f["len_alone_0"]), (f["y_alone21_1"], f["len_alone21_1"])])):
            y, lens, _ = m(xs, lengths, times)
            assert lens.tolist() == len_batch.tolist()
            torch.testing.assert_close(y, y_batch, atol=1e-5, rtol=0)
            for b, (ya, la) in enumerate(alone):
                n = int(lengths[b])
                y1, l1, _ = m(xs[b:b + 1, :n], lengths[b:b + 1], times[b:b + 1, :n])
                assert l1.tolist() == la.tolist()
                torch.testing.assert_close(y1, ya, atol=1e-5, rtol=0)


def test_loss_and_backward():
    m = build_model(_cfg(), 30).train()
    feats, lens, times = _batch([90, 60])
    batch = {"feats": feats, "feat_lens": lens, "times": times,
             "targets": torch.tensor([1, 2, 3, 4, 5, 6, 7]), "target_lens": torch.tensor([4, 3])}
    out = m(batch)
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)


def _run_layers(m, *inputs, backward: bool = False) -> list[int]:
    """Indices of the encoder layers that ran (forward pre-hooks) in one forward (+ backward)."""
    ran: list[int] = []
    hooks = [layer.register_forward_pre_hook(lambda mod, args, i=i: ran.append(i)) for i, layer in enumerate(m.encoder.layers)]
    try:
        out = m.encode(*inputs)
        if backward:
            out.log_probs.logsumexp(-1).sum().backward()
    finally:
        for h in hooks:
            h.remove()
    return ran


def test_layer_drop_drops_layers_chosen_by_the_step_seed():
    """Observed: which layers run (hooks), how often, and which get gradients. The layers are a
    function of the step seed only (not of the global RNG, which differs across DDP ranks)."""
    n, p = 6, 0.5
    m = build_model(_cfg(f"encoder.layer_drop={p}", f"encoder.n_layers={n}"), 30).train()
    inputs = _batch([50])
    runs = {}
    for step in range(40):
        m.encoder.set_step(1000 + step)
        runs[step] = _run_layers(m, *inputs)
        assert runs[step] == sorted(set(runs[step]))  # each layer at most once, in order
    dropped = sum(n - len(r) for r in runs.values())
    assert 0.35 * 40 * n < dropped < 0.65 * 40 * n, dropped  # a fraction p of the layers
    assert len({tuple(r) for r in runs.values()}) > 20  # a new draw per step
    for step in (3, 17):  # the same step seed after any use of the global RNG: the same layers
        torch.manual_seed(step)
        torch.rand(100)
        m.encoder.set_step(1000 + step)
        assert _run_layers(m, *inputs) == runs[step]
    # a dropped layer takes no part in the step: no gradient; a layer that ran gets one
    m.zero_grad(set_to_none=True)
    m.encoder.set_step(1000 + 5)
    ran = _run_layers(m, *inputs, backward=True)
    assert 0 < len(ran) < n
    for i, layer in enumerate(m.encoder.layers):
        grads = [q.grad for q in layer.parameters()]
        if i in ran:
            assert all(g is not None and bool(g.abs().sum() > 0) for g in grads), i
        else:
            assert all(g is None for g in grads), i
    # evaluation runs every layer, and so does training without layer drop
    assert _run_layers(m.eval(), *inputs) == list(range(n))
    m0 = build_model(_cfg("encoder.layer_drop=0.0", f"encoder.n_layers={n}"), 30).train()
    assert all(_run_layers(m0, *inputs) == list(range(n)) for _ in range(5))


def test_bf16_autocast_runs():
    m = build_model(_cfg(), 30).eval()
    feats, lens, times = _batch([50, 40])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m.encode(feats, lens, times)
    assert out.log_probs.dtype == torch.float32 and torch.isfinite(out.log_probs).all()


def test_conv2d_layout_by_device():
    """The subsampling's convolutions run in PyTorch's default layout on AVX2-only CPUs in a process
    that keeps freed memory (the faster one there), channels-last elsewhere
    (asrkit.model.frontend.conv_layout); either
    way the output is NeMo's (test_conv2d_frontend_matches_nemo runs this machine's choice; here
    both layouts give the same values to float rounding)."""
    from asrkit.model.frontend import Conv2dSubsampling, conv_layout

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert conv_layout(cpu, "AVX2", kept=True) == torch.contiguous_format
    assert conv_layout(cpu, "AVX2", kept=False) == torch.channels_last
    for kept in (True, False):
        assert conv_layout(cpu, "AVX512", kept=kept) == torch.channels_last
        assert conv_layout(cuda, "AVX2", kept=kept) == torch.channels_last
    torch.manual_seed(0)
    m = Conv2dSubsampling(16, 12, kernel=3, stride=4, channels=8).eval()
    feats, lengths = torch.randn(3, 40, 16), torch.tensor([40, 33, 9])
    feats[1, 33:], feats[2, 9:] = 0, 0
    times = torch.arange(40).float()[None].expand(3, -1) * 0.01
    outs = {}
    for fmt in (torch.channels_last, torch.contiguous_format):
        m.memory_format = fmt
        with torch.no_grad():
            outs[fmt] = m(feats, lengths, times)
    torch.testing.assert_close(outs[torch.channels_last][0], outs[torch.contiguous_format][0], atol=1e-5, rtol=0)
    assert torch.equal(outs[torch.channels_last][1], outs[torch.contiguous_format][1])
