"""``dropout``: what dropout costs in a training step, with asrkit's CPU mask and PyTorch's.

    python -m asrkit.bench dropout [--config CONF] [--p 0.1] [--reps 7] [--out bench.md]

Times forward + backward (training mode) of the model built from ``--config`` (default: the
speechocean762 recipe's Conformer) on a batch of ``--batch-seconds`` of ``--utt-seconds``
utterances, ``--threads`` CPU threads, in three rows: ``encoder.dropout=0``, ``encoder.dropout=P``
with asrkit's mask (:mod:`asrkit.model.dropout`) and the same with PyTorch's own CPU dropout
(``FAST_CPU = False``). The three models have the same weights. In every round each row runs one
step, in a random order; a row's ratio is the median over rounds of its step / the no-dropout
step of the same round, so a slow spell of the VM hits both sides of each ratio.
"""
from __future__ import annotations

import random
import statistics
import time

import torch

from asrkit.cliargs import Parser
from asrkit.bench.frontend import add_step_args, set_allocator, step_batch


def _step(model, feats, lengths, times, fast: bool) -> float:
    from asrkit.model import dropout as dmod

    dmod.FAST_CPU = fast
    try:
        t0 = time.perf_counter()
        model.encode(feats, lengths, times).log_probs.sum().backward()
        return time.perf_counter() - t0
    finally:
        dmod.FAST_CPU = True


def main(argv: list[str] | None = None) -> int:
    from asrkit.model import build_model
    from asrkit.training.checks import load_config
    from asrkit.utils import cpu_model

    ap = Parser(prog="asrkit bench dropout", description=__doc__.split("\n\n")[0])
    add_step_args(ap)
    ap.add_argument("--p", type=float, default=0.1, help="encoder.dropout of the dropout rows")
    a = ap.parse_args(argv)
    allocator = set_allocator(a)
    torch.set_num_threads(a.threads)
    models = {}
    for p in (0.0, a.p):
        torch.manual_seed(0)
        models[p] = build_model(load_config(a.config, [f"encoder.dropout={p}"]), 32).train()
    rows = {"no dropout": (0.0, True), f"dropout {a.p:g}, asrkit's mask": (a.p, True),
            f"dropout {a.p:g}, PyTorch's bernoulli_": (a.p, False)}
    feats, lengths, times = step_batch(a)
    B = feats.shape[0]
    for p, fast in rows.values():  # warm-up: kernels loaded, allocator primed
        _step(models[p], feats, lengths, times, fast)
    took = {n: [] for n in rows}
    rng = random.Random(0)
    for _ in range(a.reps):
        order = list(rows)
        rng.shuffle(order)
        for n in order:
            took[n].append(_step(models[rows[n][0]], feats, lengths, times, rows[n][1]))
    base = "no dropout"
    lines = [f"## Dropout: forward + backward of one training step ({B} x {a.utt_seconds:g} s, {a.threads} threads, "
             f"{a.reps} rounds; {cpu_model() or 'unknown CPU'}; torch {torch.__version__}; {allocator})", "",
             f"config: `{a.config}` (`encoder.dropout` per row)", "",
             "| row | step s (median) | step / no dropout (median of per-round ratios) |", "|---|---:|---:|"]
    for n in rows:
        ratio = statistics.median(x / y for x, y in zip(took[n], took[base]))
        lines.append(f"| {n} | {statistics.median(took[n]):.3f} | {ratio:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0
