"""``frontend``: the cost of the Transformer's frontends (``frontend.type``) in a training step.

    python -m asrkit.bench frontend [--config CONF] [--channels 32,64] [--reps 7] [--out bench.md]

Times forward + backward (training mode) of each frontend alone and of the whole model built from
``--config`` (default: the speechocean762 recipe's Conformer) with that frontend, on a batch of
``--batch-seconds`` of ``--utt-seconds`` utterances (fbank frames, no padding), ``--threads`` CPU
threads. Rows: ``conv1d`` (1-D conv + GLU), and ``conv2d`` at each ``--channels`` in each memory
layout, channels-last and PyTorch's default (the A/B of :func:`asrkit.model.frontend.conv_layout`;
the layout it picks on this CPU with this allocator is marked). ``--allocator keep`` keeps freed
memory in the process as ``asrkit train`` does with ``train.keep_freed_memory=true``; ``glibc``
(the default, as ``asrkit train``'s) leaves glibc's allocator as it is. In every round each row runs one step, in a random order; a row's
ratio is the median over rounds of its step / ``conv1d``'s step in the same round, so a slow spell
of the VM hits both sides of each ratio.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from asrkit.cliargs import Parser

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "egs" / "speechocean762" / "asr1" / "conf" / "train_conformer.yaml"


def _rows(channels: list[int]) -> dict[str, list[str]]:
    rows = {"conv1d": ["frontend.type=conv1d", "frontend.kernel=7"]}
    for c in channels:
        conv2d = ["frontend.type=conv2d", "frontend.kernel=3", f"frontend.channels={c}"]
        for layout in LAYOUTS:
            rows[f"conv2d, {c} channels, {layout}"] = conv2d
    return rows


#: the conv2d rows' memory layouts
LAYOUTS = {"channels-last": torch.channels_last, "default layout": torch.contiguous_format}


def add_step_args(ap: argparse.ArgumentParser) -> None:
    """The options of a training-step benchmark: model config, rounds, threads, batch, output."""
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None, help="asrkit config whose model is timed (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=7, help="paired timing rounds (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    ap.add_argument("--batch-seconds", type=float, default=100.0, help="audio seconds per batch (default: %(default)s)")
    ap.add_argument("--utt-seconds", type=float, default=5.0, help="seconds per utterance of the batch (default: %(default)s)")
    ap.add_argument("--allocator", choices=["glibc", "keep"], default="glibc",
                    help="glibc: glibc's default, which unmaps blocks above 32 MB when freed (asrkit train's default); "
                         "keep: freed memory kept for reuse, as asrkit train with train.keep_freed_memory=true "
                         "(default: %(default)s)")
    ap.add_argument("--out", type=Path, help="also write the table here (Markdown)")


def set_allocator(a: argparse.Namespace) -> str:
    """Apply ``--allocator`` to this process; returns its label for the table's header."""
    from asrkit.utils import freed_memory_kept, keep_freed_memory

    if a.allocator == "keep" and not keep_freed_memory():
        return "freed memory not kept (the C library is not glibc)"
    return "freed memory kept" if freed_memory_kept() else "glibc's default allocator"


def step_batch(a: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(feats, lengths, times) of a batch of ``a.batch_seconds`` of ``a.utt_seconds`` utterances
    (random fbank frames of ``a.config``'s features, no padding)."""
    from asrkit.training.checks import load_config

    fc = load_config(a.config, []).features
    T = int(round(a.utt_seconds / fc.hop))
    B = max(1, int(a.batch_seconds // a.utt_seconds))
    times = torch.arange(T).float()[None].expand(B, -1) * fc.hop
    return torch.randn(B, T, fc.n_mels), torch.full((B,), T), times


def _step(module, *inputs) -> float:
    t0 = time.perf_counter()
    out = module(*inputs)
    (out[0] if isinstance(out, tuple) else out.log_probs).sum().backward()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    from asrkit.model import build_model
    from asrkit.model.frontend import conv_layout
    from asrkit.training.checks import load_config
    from asrkit.utils import cpu_model

    ap = Parser(prog="asrkit bench frontend", description=__doc__.split("\n\n")[0])
    add_step_args(ap)
    ap.add_argument("--channels", default="32,64", help="conv2d channel counts, comma-separated")
    a = ap.parse_args(argv)
    allocator = set_allocator(a)
    torch.set_num_threads(a.threads)
    rows = _rows([int(c) for c in a.channels.split(",") if c])
    models = {}
    for name, overrides in rows.items():
        torch.manual_seed(0)
        m = build_model(load_config(a.config, overrides), 32).train()
        for layout, fmt in LAYOUTS.items():
            if name.endswith(layout):
                m.encoder.frontend.memory_format = fmt
        models[name] = m
    feats, lengths, times = step_batch(a)
    B = feats.shape[0]
    for m in models.values():  # warm-up: kernels loaded, allocator primed
        _step(m.encode, feats, lengths, times)
        _step(m.encoder.frontend, feats, lengths, times)
    model_t = {n: [] for n in models}
    front_t = {n: [] for n in models}
    rng = random.Random(0)
    for _ in range(a.reps):
        order = list(models)
        rng.shuffle(order)
        for n in order:
            model_t[n].append(_step(models[n].encode, feats, lengths, times))
            front_t[n].append(_step(models[n].encoder.frontend, feats, lengths, times))
    base = "conv1d"
    lines = [f"## Frontends: forward + backward of one training step ({B} x {a.utt_seconds:g} s, {a.threads} threads, "
             f"{a.reps} rounds; {cpu_model() or 'unknown CPU'}, torch CPU capability "
             f"{torch.backends.cpu.get_cpu_capability()}; torch {torch.__version__}; {allocator})", "",
             f"config: `{a.config}` (its frontend replaced per row); * = the layout asrkit picks on this CPU", "",
             "| frontend | parameters | frontend s (median) | model s (median) | model / conv1d (median of per-round ratios) |",
             "|---|---:|---:|---:|---:|"]
    picked = {fmt: layout for layout, fmt in LAYOUTS.items()}[conv_layout(torch.device("cpu"))]
    for n, m in models.items():
        ratio = statistics.median(x / y for x, y in zip(model_t[n], model_t[base]))
        params = sum(p.numel() for p in m.parameters()) / 1e6
        lines.append(f"| {n}{' *' if n.endswith(picked) else ''} | {params:.2f} M | {statistics.median(front_t[n]):.3f} | {statistics.median(model_t[n]):.3f} "
                     f"| {ratio:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0
