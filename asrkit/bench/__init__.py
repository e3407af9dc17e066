"""`python -m asrkit.bench <name>` (or `asrkit bench <name>`): benchmarks, one module each.

    python -m asrkit.bench pos_enc [--quick] [--out bench.md]     # cost of every positional encoding
    python -m asrkit.bench transcribe --model PKG --recipe DIR     # transcribe / ONNX / sherpa-onnx figures
    python -m asrkit.bench train --recipe egs/mini/asr1             # input pipeline vs model: throughput, FLOP use
    python -m asrkit.bench peers --steps 800                        # side by side with ESPnet (tools/peers/espnet)
    python -m asrkit.bench scale [--sizes 10000,281241]             # data stages 1-4 at LibriSpeech 960 h's size
    python -m asrkit.bench frontend [--channels 32,64]             # cost of the conv1d / conv2d frontends
    python -m asrkit.bench dropout [--p 0.1]                       # cost of dropout: asrkit's CPU mask vs PyTorch's
    python -m asrkit.bench sizes [--out docs/results/model_sizes.md]  # recipe configs: parameters, FLOPs, GPU time
    python -m asrkit.bench speed [--utts 200]                      # speed perturbation's resampling: Lhotse's vs asrkit's

Speed targets live here, not in the test suite. A benchmark that measures in fresh processes
runs its workers as ``python -m asrkit.bench --worker <module>:<function> <json spec>``.
"""
from __future__ import annotations

import importlib
import json
import sys
from asrkit.utils import flush_denormals

#: benchmark name -> module with ``main(argv) -> int``
BENCHMARKS: dict[str, str] = {
    "pos_enc": "asrkit.bench.pos_enc",
    "transcribe": "asrkit.bench.transcribe",
    "train": "asrkit.bench.train",
    "peers": "asrkit.bench.peers",
    "scale": "asrkit.bench.scale",
    "frontend": "asrkit.bench.frontend",
    "dropout": "asrkit.bench.dropout",
    "sizes": "asrkit.bench.sizes",
    "conformer": "asrkit.bench.conformer",
    "speed": "asrkit.bench.speed",
}


def build_parser():
    """The parser of ``asrkit bench`` (each benchmark's own options: ``asrkit bench NAME --help``)."""
    import argparse

    from asrkit.cliargs import Parser

    p = Parser(prog="asrkit bench", description=__doc__)
    p.add_argument("name", choices=list(BENCHMARKS), help="the benchmark (its options: asrkit bench NAME --help)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's options")
    return p


def main(argv: list[str] | None = None) -> int:
    flush_denormals()  # before any torch computation (asrkit.utils.flush_denormals)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:  # internal: one measurement in a fresh process, JSON on stdout
        module, func = argv[1].split(":")
        print(json.dumps(getattr(importlib.import_module(module), func)(json.loads(argv[2]))))
        return 0
    usage = "usage: asrkit bench <name> [args]   (names: " + ", ".join(BENCHMARKS) + ")"
    if not argv or argv[0] in ("-h", "--help"):
        print(build_parser().format_help() if argv else usage)
        return 0 if argv else 2
    if argv[0] not in BENCHMARKS:
        print(f"asrkit bench: unknown benchmark {argv[0]!r}\n{usage}", file=sys.stderr)
        return 2
    return int(importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:]) or 0)
