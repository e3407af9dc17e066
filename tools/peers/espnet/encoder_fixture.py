"""Run in ESPnet's venv (tools/peers/espnet/.venv/bin/python): ESPnet's own CTC Transformer encoder
on features of ESPnet's own frontend, stored as a fixture for asrkit's tests, and its parameter
counts at a given size.

    tools/peers/espnet/.venv/bin/python tools/peers/espnet/encoder_fixture.py fixture tests/fixtures/espnet_encoder
    tools/peers/espnet/.venv/bin/python tools/peers/espnet/encoder_fixture.py count --d 192 --layers 6 --ff 768 --vocab 30
    tools/peers/espnet/.venv/bin/python tools/peers/espnet/encoder_fixture.py fixture tests/fixtures/espnet_encoder_relpos_xl \
        --encoder relpos_xl
    tools/peers/espnet/.venv/bin/python tools/peers/espnet/encoder_fixture.py fixture tests/fixtures/espnet_encoder_conformer \
        --encoder conformer

``fixture``: a tiny encoder (``--d 32 --layers 2 --heads 4 --ff 64``, conv2d input layer,
normalize_before) + CTC head built by ESPnet with ``torch.manual_seed(0)``, its parameters perturbed
(LayerNorm gains and biases drawn too, so that a mapping that drops a bias or swaps two tensors
changes the output), in eval mode; the input: 1.5 s and its first 1.0 s of a synthesized
harmonic tone with a glide and noise (seeded), through ESPnet's DefaultFrontend (STFT, log-mel 80)
and UtteranceMVN, as one padded batch of two. Writes ``encoder.npz`` (``param/<ESPnet name>``
arrays, ``feats`` B x T x 80, ``feat_lens``, ``hidden`` B x T' x d, ``out_lens``, ``ctc_log_probs``,
and ``hidden_second_alone`` / ``out_lens_second_alone``: the shorter utterance run alone)
and ``meta.json`` (sizes, versions, the names).

``count``: JSON of the parameter counts of ESPnet's encoder + CTC head at that size (the same
classes ``espnet2.bin.asr_train`` builds for ``encoder: transformer``, ``input_layer: conv2d``).

This script only calls ESPnet's classes; asrkit never imports it and it contains no ESPnet code.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import math
from pathlib import Path

import numpy as np
import torch


#: --encoder relpos_xl: ESPnet's Conformer reduced to Transformer layers with Transformer-XL relative
#: positions (no macaron feed-forward, no convolution module), ReLU feed-forward
RELPOS_XL = dict(macaron_style=False, use_cnn_module=False, rel_pos_type="latest", pos_enc_layer_type="rel_pos",
                 selfattention_layer_type="rel_selfattn", activation_type="relu")
#: --encoder conformer: ESPnet's whole Conformer layer (macaron feed-forward, convolution module with
#: BatchNorm, a LayerNorm closing each layer), its relative positions, swish
CONFORMER = dict(macaron_style=True, use_cnn_module=True, cnn_module_kernel=7, rel_pos_type="latest",
                 pos_enc_layer_type="rel_pos", selfattention_layer_type="rel_selfattn", activation_type="swish")
ENCODERS = {"relpos_xl": RELPOS_XL, "conformer": CONFORMER}


def build(d: int, layers: int, heads: int, ff: int, vocab: int, n_mels: int = 80, encoder: str = "transformer"):
    from espnet2.asr.ctc import CTC
    from espnet2.asr.encoder.conformer_encoder import ConformerEncoder
    from espnet2.asr.encoder.transformer_encoder import TransformerEncoder

    common = dict(input_size=n_mels, output_size=d, attention_heads=heads, linear_units=ff, num_blocks=layers,
                  dropout_rate=0.0, positional_dropout_rate=0.0, attention_dropout_rate=0.0, input_layer="conv2d",
                  normalize_before=True)
    enc = TransformerEncoder(**common) if encoder == "transformer" else ConformerEncoder(**common, **ENCODERS[encoder])
    ctc = CTC(odim=vocab, encoder_output_size=d)
    return enc, ctc


def count(args) -> dict:
    enc, ctc = build(args.d, args.layers, args.heads, args.ff, args.vocab, encoder=args.encoder)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return {"espnet": md.version("espnet"), "encoder": n(enc), "frontend (embed)": n(enc.embed), "ctc": n(ctc),
            "total": n(enc) + n(ctc), "size": vars(args)}


def features(seconds: float, seed: int = 0) -> torch.Tensor:
    """A harmonic tone gliding 140 -> 220 Hz with 5 harmonics and light noise, 16 kHz."""
    g = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    f0 = 140 + 80 * t / max(seconds, 1e-9)
    phase = 2 * math.pi * np.cumsum(f0) / 16000
    x = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.3 + 0.2 * np.sin(2 * math.pi * 3 * t))
    x = x + 0.01 * g.standard_normal(len(t))
    return torch.tensor(x, dtype=torch.float32)


def fixture(args) -> None:
    from espnet2.asr.frontend.default import DefaultFrontend
    from espnet2.layers.utterance_mvn import UtteranceMVN

    torch.manual_seed(0)
    enc, ctc = build(args.d, args.layers, args.heads, args.ff, args.vocab, encoder=args.encoder)
    with torch.no_grad():  # draw every parameter, LayerNorms included (their defaults are 1 and 0)
        g = torch.Generator().manual_seed(1)
        for name, p in list(enc.named_parameters()) + list(ctc.named_parameters()):
            if p.dim() == 1:
                p.copy_((1.0 if name.endswith(("norm1.weight", "norm2.weight", "norm_mha.weight", "norm_ff.weight",
                                               "after_norm.weight", "norm_ff_macaron.weight", "norm_conv.weight",
                                               "norm_final.weight", "conv_module.norm.weight")) else 0.0)
                       + 0.1 * torch.randn(p.shape, generator=g))
        for name, b in enc.named_buffers():  # BatchNorm's running statistics (used in eval mode)
            if name.endswith("running_mean"):
                b.copy_(0.3 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    enc.eval(), ctc.eval()
    fe = DefaultFrontend(fs=16000, n_fft=512, win_length=400, hop_length=160, n_mels=80)
    mvn = UtteranceMVN(norm_means=True, norm_vars=True)
    wav = features(1.5)
    speech = torch.stack([wav, torch.cat([wav[:16000], torch.zeros(len(wav) - 16000)])])
    lens = torch.tensor([len(wav), 16000])
    with torch.no_grad():
        feats, flens = fe(speech, lens)
        feats, flens = mvn(feats, flens)
        hidden, olens, _ = enc(feats, flens)
        logp = ctc.log_softmax(hidden)
        n2 = int(flens[1])  # the shorter utterance alone: ESPnet's padded batch gives it more frames (see README)
        hidden2, olens2, _ = enc(feats[1:, :n2], flens[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {f"param/encoder.{k}": v.numpy() for k, v in enc.state_dict().items()}
    arrays |= {f"param/ctc.{k}": v.numpy() for k, v in ctc.state_dict().items()}
    arrays |= {"feats": feats.numpy(), "feat_lens": flens.numpy(), "hidden": hidden.numpy(),
               "out_lens": olens.numpy(), "ctc_log_probs": logp.numpy(), "hidden_second_alone": hidden2.numpy(),
               "out_lens_second_alone": olens2.numpy()}
    np.savez_compressed(out / "encoder.npz", **arrays)
    meta = {"espnet": md.version("espnet"), "torch": torch.__version__,
            "size": {"d": args.d, "layers": args.layers, "heads": args.heads, "ff": args.ff, "vocab": args.vocab,
                     "n_mels": 80},
            "encoder": args.encoder,
            "classes": [("espnet2.asr.encoder.transformer_encoder.TransformerEncoder" if args.encoder == "transformer"
                         else "espnet2.asr.encoder.conformer_encoder.ConformerEncoder (" + ", ".join(
                             f"{k} {v}" for k, v in ENCODERS[args.encoder].items()) + ")")
                        + " (input_layer conv2d, normalize_before true, dropout 0)", "espnet2.asr.ctc.CTC",
                        "espnet2.asr.frontend.default.DefaultFrontend (n_fft 512, win 400, hop 160, 80 mels)",
                        "espnet2.layers.utterance_mvn.UtteranceMVN"],
            "feat_lens": flens.tolist(), "out_lens": olens.tolist(), "out_lens_second_alone": olens2.tolist(),
            "params": {k: list(v.shape) for k, v in arrays.items() if k.startswith("param/")}}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps({k: meta[k] for k in ("espnet", "torch", "feat_lens", "out_lens")}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["fixture", "count"])
    p.add_argument("out", nargs="?", default="tests/fixtures/espnet_encoder")
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=64)
    p.add_argument("--vocab", type=int, default=30)
    p.add_argument("--encoder", choices=["transformer", *ENCODERS], default="transformer",
                   help="transformer: TransformerEncoder (absolute sinusoid); relpos_xl: ConformerEncoder with "
                        "rel_pos / rel_selfattn (latest), no macaron, no convolution module, ReLU; conformer: "
                        "ConformerEncoder with all of it (macaron, convolution module kernel 7, BatchNorm), rel_pos, swish")
    args = p.parse_args()
    if args.what == "count":
        print(json.dumps(count(args)))
    else:
        fixture(args)


if __name__ == "__main__":
    main()
