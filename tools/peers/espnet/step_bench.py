"""Run in ESPnet's venv: ESPnet's CTC Transformer (its TransformerEncoder with conv2d input + its
CTC) trained for a few optimizer steps on given batches, timed, for ``python -m asrkit.bench peers
--arch espnet`` (asrkit's side: ``asrkit.bench.peers.equal``, the same spec and output).

    tools/peers/espnet/.venv/bin/python tools/peers/espnet/step_bench.py '<json spec>'

The spec (JSON): ``encoder`` (``transformer``, the default, or ``relpos_xl``: ESPnet's conformer
encoder with rel_pos / rel_selfattn and neither macaron feed-forward nor convolution module, as
asrkit's ``encoder.pos_enc: relpos_xl``; or ``conformer``: that encoder's whole layer, macaron and
convolution module of kernel ``kernel``, activation ``activation``), ``d, layers, heads, ff, vocab, n_mels, lr, clip, threads, flush_denormal,
warmup, steps, batches`` (a list of lists of utterance lengths in 10 ms frames, cycled),
``decode_batches`` (the same for decoding), ``decode_passes`` (timed decoding passes per mode after
one untimed pass, default 3; the median is reported), ``profile`` (bool), ``device`` (``cpu``, the
default, or ``cuda``), ``amp`` (``none``, the default, or ``bf16``: forward and loss under
``torch.autocast``). Features and targets come from
``numpy.random.default_rng(batch index)``: both sides see the same numbers. One step = encoder
forward, CTC loss (sum over the batch / batch size, as ESPnet's CTC computes it), backward,
gradient clipping at ``clip``, Adam step: the work of one step of ESPnet's trainer less its data
loading, frontend (features are given) and logging. Also: the FLOPs of forward + backward of each
batch (torch's stock ``FlopCounterMode``, in all and by operator: a check of the count asrkit's side
makes of the same model) and, on a GPU, the
CUDA allocator's bytes after set-up and at its peak. Prints one JSON line.

This script only calls ESPnet's classes (and torch); it contains no ESPnet code.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import resource
import statistics
import sys
import time

import numpy as np
import torch


def rss() -> int:
    with open("/proc/self/statm") as f:
        import os

        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def batch(spec: dict, i: int, lengths: list[int]):
    g = np.random.default_rng(i)
    T = max(lengths)
    feats = np.zeros((len(lengths), T, spec["n_mels"]), np.float32)
    for b, n in enumerate(lengths):
        feats[b, :n] = g.standard_normal((n, spec["n_mels"]), dtype=np.float32)
    n_tok = [max(1, (((n - 1) // 2 - 1) // 2) // 3) for n in lengths]
    targets = g.integers(1, spec["vocab"], size=(len(lengths), max(n_tok)))
    return (torch.from_numpy(feats), torch.tensor(lengths), torch.from_numpy(targets).long(), torch.tensor(n_tok))


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("flush_denormal"):
        torch.set_flush_denormal(True)
    torch.set_num_threads(spec["threads"])
    from espnet2.asr.ctc import CTC
    from espnet2.asr.encoder.conformer_encoder import ConformerEncoder
    from espnet2.asr.encoder.transformer_encoder import TransformerEncoder

    torch.manual_seed(0)
    common = dict(input_size=spec["n_mels"], output_size=spec["d"], attention_heads=spec["heads"],
                  linear_units=spec["ff"], num_blocks=spec["layers"], dropout_rate=0.0, positional_dropout_rate=0.0,
                  attention_dropout_rate=0.0, input_layer="conv2d", normalize_before=True)
    if spec.get("encoder", "transformer") == "relpos_xl":  # Transformer layers with Transformer-XL positions
        enc = ConformerEncoder(**common, macaron_style=False, use_cnn_module=False, rel_pos_type="latest",
                               pos_enc_layer_type="rel_pos", selfattention_layer_type="rel_selfattn",
                               activation_type="relu")
    elif spec["encoder"] == "conformer":  # its whole Conformer layer
        enc = ConformerEncoder(**common, macaron_style=True, use_cnn_module=True, cnn_module_kernel=spec["kernel"],
                               rel_pos_type="latest", pos_enc_layer_type="rel_pos",
                               selfattention_layer_type="rel_selfattn", activation_type=spec["activation"])
    else:
        enc = TransformerEncoder(**common)
    dev = torch.device(spec.get("device", "cpu"))
    amp = spec.get("amp", "none") == "bf16"
    ctc = CTC(odim=spec["vocab"], encoder_output_size=spec["d"])
    enc.to(dev), ctc.to(dev)
    params = list(enc.parameters()) + list(ctc.parameters())
    opt = torch.optim.Adam(params, lr=spec["lr"], betas=(0.9, 0.98), eps=1e-8)
    batches = [tuple(t.to(dev) for t in batch(spec, i, b)) for i, b in enumerate(spec["batches"])]
    base = rss()
    if dev.type == "cuda":
        sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base_dev = torch.cuda.memory_allocated(dev)

    def loss_of(k: int):
        x, xl, y, yl = batches[k % len(batches)]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            h, hl, _ = enc(x, xl)
            return ctc(h, hl, y, yl)

    def step(k: int) -> None:
        loss = loss_of(k)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, spec["clip"])
        opt.step()

    enc.train(), ctc.train()
    for k in range(spec["warmup"]):
        step(k)
    times, cpus = [], []
    for k in range(spec["warmup"], spec["warmup"] + spec["steps"]):
        sync(dev)
        t0, c0 = time.perf_counter(), time.process_time()
        step(k)
        sync(dev)
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"impl": "espnet", "espnet": md.version("espnet"), "torch": torch.__version__,
           "params": sum(p.numel() for p in params), "step_s": times, "step_cpu_s": cpus,
           "baseline_rss": base, "peak_rss": peak,
           "device_mem": [base_dev, torch.cuda.max_memory_allocated(dev)] if dev.type == "cuda" else [None, None]}
    from torch.utils.flop_counter import FlopCounterMode

    flops, by_op = {}, {}
    n = len(batches)  # forward + backward of each timed batch
    for k in sorted({k % n for k in range(spec["warmup"], spec["warmup"] + spec["steps"])}):
        with FlopCounterMode(display=False) as counter:
            loss_of(k).backward()
        flops[str(k)] = int(counter.get_total_flops())
        by_op[str(k)] = {str(op): int(v) for op, v in counter.get_flop_counts()["Global"].items()}
    out["batch_flops"], out["batch_flops_by_op"] = flops, by_op
    opt.zero_grad(set_to_none=True)
    if spec.get("profile"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(0)
        out["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    enc.eval(), ctc.eval()

    def decode(bs):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            for x, xl in bs:
                ctc.argmax(enc(x, xl)[0])
        sync(dev)

    # as asrkit's side (asrkit/bench/peers/equal.py, decode_passes): inputs first, one untimed pass of
    # each mode, then the median of decode_passes timed passes, the modes alternating
    modes = {"batch1": [[n] for b in spec["decode_batches"] for n in b], "batched": spec["decode_batches"]}
    inputs = {m: [tuple(t.to(dev) for t in batch(spec, 1000 + i, g)[:2]) for i, g in enumerate(gs)]
              for m, gs in modes.items()}
    times = {m: [] for m in modes}
    with torch.no_grad():
        for bs in inputs.values():
            decode(bs)
        for _ in range(spec.get("decode_passes", 3)):
            for m, bs in inputs.items():
                t0 = time.perf_counter()
                decode(bs)
                times[m].append(time.perf_counter() - t0)
    out["decode_s"] = {m: statistics.median(t) for m, t in times.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
