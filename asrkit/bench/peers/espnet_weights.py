"""ESPnet's CTC Transformer weights as asrkit's: the state-dict names of one model in the other's.

ESPnet's ``TransformerEncoder`` (``input_layer: conv2d``, ``normalize_before: true``) + ``CTC`` and
asrkit's Transformer built by ``egs/speechocean762/asr1/conf/train_espnet_equal.yaml`` (conv2d
frontend with ``padding: none`` and ``channels = d_model``, ``sinpos`` with ``scale_input`` and
``interleaved``, pre-norm layers) hold the same tensors under other names; the one difference of
layout is the attention's input projection, three Linears (q, k, v) in ESPnet and one fused
Linear in asrkit (their rows stacked q, k, v). ``tests/test_peers.py`` loads ESPnet's weights
(tests/fixtures/espnet_encoder) into asrkit's model and compares the encoder outputs; the speed
benchmark starts both sides from the same weights this way. ESPnet's ``ConformerEncoder`` with
Transformer-XL relative positions and neither macaron feed-forward nor convolution module
(``rel_pos`` / ``rel_selfattn``, ``rel_pos_type: latest``) maps onto the same model with
``encoder.pos_enc: relpos_xl``: its layer norms are named ``norm_mha`` / ``norm_ff``, and its
per-layer ``linear_pos``, ``pos_bias_u`` and ``pos_bias_v`` are the encoding's
(tests/fixtures/espnet_encoder_relpos_xl). ESPnet's whole Conformer layer (``macaron_style``,
``use_cnn_module``) maps onto asrkit's with ``encoder.macaron``, ``encoder.block_norm``,
``encoder.conv_kernel`` and ``encoder.conv_norm: batch``: its pointwise Conv1d's of kernel 1 are
asrkit's Linears (the kernel axis dropped), its BatchNorm's running statistics come along
(tests/fixtures/espnet_encoder_conformer).
"""
from __future__ import annotations

import re

import numpy as np

from asrkit.bench.peers.common import PeersError

#: ESPnet name (regex, ``{i}`` a layer) -> asrkit name; the q/k/v projections are fused separately
_RENAMES = [
    (r"encoder\.embed\.conv\.0\.(weight|bias)", r"encoder.frontend.convs.0.\1"),
    (r"encoder\.embed\.conv\.2\.(weight|bias)", r"encoder.frontend.convs.1.\1"),
    (r"encoder\.embed\.out\.0\.(weight|bias)", r"encoder.frontend.out.\1"),
    (r"encoder\.encoders\.(\d+)\.self_attn\.linear_out\.(weight|bias)", r"encoder.layers.\1.attn.out.\2"),
    (r"encoder\.encoders\.(\d+)\.feed_forward\.w_1\.(weight|bias)", r"encoder.layers.\1.ffn.0.\2"),
    (r"encoder\.encoders\.(\d+)\.feed_forward\.w_2\.(weight|bias)", r"encoder.layers.\1.ffn.3.\2"),
    (r"encoder\.encoders\.(\d+)\.norm([12])\.(weight|bias)", r"encoder.layers.\1.norm\2.\3"),
    # ESPnet's Conformer layer without macaron and convolution module (relpos_xl): the same layer
    (r"encoder\.encoders\.(\d+)\.norm_mha\.(weight|bias)", r"encoder.layers.\1.norm1.\2"),
    (r"encoder\.encoders\.(\d+)\.norm_ff\.(weight|bias)", r"encoder.layers.\1.norm2.\2"),
    (r"encoder\.encoders\.(\d+)\.self_attn\.linear_pos\.weight", r"encoder.pos.proj.\1.weight"),
    # ESPnet's whole Conformer layer: macaron feed-forward, convolution module, a norm closing the layer
    (r"encoder\.encoders\.(\d+)\.feed_forward_macaron\.w_1\.(weight|bias)", r"encoder.layers.\1.ffn_macaron.0.\2"),
    (r"encoder\.encoders\.(\d+)\.feed_forward_macaron\.w_2\.(weight|bias)", r"encoder.layers.\1.ffn_macaron.3.\2"),
    (r"encoder\.encoders\.(\d+)\.norm_ff_macaron\.(weight|bias)", r"encoder.layers.\1.norm_macaron.\2"),
    (r"encoder\.encoders\.(\d+)\.norm_conv\.(weight|bias)", r"encoder.layers.\1.norm_conv.\2"),
    (r"encoder\.encoders\.(\d+)\.norm_final\.(weight|bias)", r"encoder.layers.\1.norm_out.\2"),
    (r"encoder\.encoders\.(\d+)\.conv_module\.pointwise_conv1\.(weight|bias)", r"encoder.layers.\1.conv.pw1.\2"),
    (r"encoder\.encoders\.(\d+)\.conv_module\.pointwise_conv2\.(weight|bias)", r"encoder.layers.\1.conv.pw2.\2"),
    (r"encoder\.encoders\.(\d+)\.conv_module\.depthwise_conv\.(weight|bias)", r"encoder.layers.\1.conv.dw.\2"),
    (r"encoder\.encoders\.(\d+)\.conv_module\.norm\.(weight|bias|running_mean|running_var|num_batches_tracked)",
     r"encoder.layers.\1.conv.norm.\2"),
    (r"encoder\.after_norm\.(weight|bias)", r"encoder.final_norm.\1"),
    (r"ctc\.ctc_lo\.(weight|bias)", r"ctc_head.\1"),
]
_QKV = re.compile(r"encoder\.encoders\.(\d+)\.self_attn\.linear_([qkv])\.(weight|bias)")
#: Transformer-XL's per-layer u and v (ESPnet's pos_bias_u / _v), stacked over layers in asrkit's relpos_xl
_UV = re.compile(r"encoder\.encoders\.(\d+)\.self_attn\.pos_bias_([uv])")


def espnet_to_asrkit(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ESPnet state dict (``encoder.*`` of its TransformerEncoder, ``ctc.*`` of its CTC) -> asrkit's
    (:class:`asrkit.model.asr.AsrModel` with the Transformer encoder). Every ESPnet tensor must be
    used exactly once; raises :class:`PeersError` naming one that is not (e.g. a Conformer's)."""
    out: dict[str, np.ndarray] = {}
    qkv: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    uv: dict[str, dict[int, np.ndarray]] = {}
    for name, value in params.items():
        m = _QKV.fullmatch(name)
        if m:
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = np.asarray(value)
            continue
        m = _UV.fullmatch(name)
        if m:
            uv.setdefault(m.group(2), {})[int(m.group(1))] = np.asarray(value)
            continue
        for pat, rep in _RENAMES:
            if re.fullmatch(pat, name):
                value = np.asarray(value)
                if ".pointwise_conv" in name and value.ndim == 3:  # Conv1d of kernel 1 = Linear
                    value = value[..., 0]
                out[re.sub(pat, rep, name)] = value
                break
        else:
            raise PeersError(f"ESPnet parameter {name!r} has no counterpart in asrkit's Transformer here "
                             "(only ESPnet's transformer encoder with conv2d input and its CTC head are mapped)")
    for (layer, kind), parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise PeersError(f"ESPnet layer {layer}: self_attn linear_q/k/v {kind} incomplete ({sorted(parts)})")
        out[f"encoder.layers.{layer}.attn.qkv.{kind}"] = np.concatenate([parts["q"], parts["k"], parts["v"]], axis=0)
    for kind, layers in uv.items():
        if sorted(layers) != list(range(len(layers))):
            raise PeersError(f"ESPnet pos_bias_{kind}: layers {sorted(layers)}, not 0..{len(layers) - 1}")
        out[f"encoder.pos.bias_{kind}"] = np.stack([layers[i] for i in range(len(layers))])
    return out


def load_espnet_weights(model, params: dict[str, np.ndarray]) -> None:
    """Copy ESPnet's weights into asrkit's ``model`` (strict: every asrkit tensor set, same shapes)."""
    import torch

    sd = {k: torch.from_numpy(np.array(v, order="C")) for k, v in espnet_to_asrkit(params).items()}  # 0-d stays 0-d
    own = model.state_dict()
    missing = sorted(set(own) - set(sd))
    extra = sorted(set(sd) - set(own))
    if missing or extra:
        raise PeersError(f"asrkit model and ESPnet weights differ: asrkit tensors without ESPnet weights {missing[:4]}, "
                         f"ESPnet weights without asrkit tensors {extra[:4]}")
    for k, v in sd.items():
        if tuple(own[k].shape) != tuple(v.shape):
            raise PeersError(f"{k}: asrkit shape {tuple(own[k].shape)}, ESPnet's {tuple(v.shape)}")
    model.load_state_dict(sd)
