"""`asrkit <command> [args]`: one entry point; each command lives in its own module.

Every command module exposes ``main(argv: list[str] | None = None) -> int`` with its
own argparse parser, so ``asrkit <command> --help`` documents it. Modules are
imported lazily: ``asrkit score`` never imports torch.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "synth": ("asrkit.data.synth", "synthesize the mini corpus in LibriSpeech layout"),
    "prepare": ("asrkit.data.prepare", "corpus on disk -> Lhotse manifests"),
    "cuts": ("asrkit.data.cuts", "check audio of manifests, build long-form windows (recipe stage 2)"),
    "longform": ("asrkit.data.longform", "build long-form windows (10..45 s) from segments"),
    "tokens": ("asrkit.tokenizer", "train a tokenizer (letters or sentencepiece)"),
    "train": ("asrkit.training.command", "train a model from a YAML config plus key=value overrides"),
    "decode": ("asrkit.decode.run", "decode test sets with a trained model"),
    "transcribe": ("asrkit.inference.transcribe", "transcribe audio files with a model package or an experiment dir"),
    "export": ("asrkit.inference.export", "write a self-contained model package (+ ONNX / sherpa-onnx)"),
    "score": ("asrkit.scoring", "score hypotheses: sclite-style summary, WER per duration bin"),
    "report": ("asrkit.reports.report", "write RESULTS.md for an experiment dir"),
    "compare": ("asrkit.reports.compare", "compare experiments: Markdown table and PNG plots"),
    "tune": ("asrkit.reports.tune", "choose decoding weights (LM weight, blank penalty...) on a development set"),
    "curve": ("asrkit.reports.curve", "WER against training steps: decode every kept checkpoint, table + PNG"),
    "average": ("asrkit.training.average", "average the last or best N checkpoints"),
    "lm": ("asrkit.decode.lm", "train an n-gram LM / build a decoding graph"),
    "analysis": ("asrkit.reports.analysis", "Park & Sung analyses: receptive field, PCA, attention maps, errors vs length, looping"),
    "padfree": ("asrkit.reports.padfree", "padding-free pipeline reports: hop histogram, padding fraction, hop-vs-WER curve"),
    "bench": ("asrkit.bench", "benchmarks (python -m asrkit.bench <name>)"),
    "config": ("asrkit.training.checks", "print the resolved config (validates it)"),
}


def _usage() -> str:
    lines = ["usage: asrkit <command> [args]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"asrkit: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
