"""`asrkit <command> [args]`: one entry point; each command lives in its own module.

Every command module exposes ``main(argv: list[str] | None = None) -> int`` and
``build_parser() -> argparse.ArgumentParser`` (an :class:`asrkit.cliargs.Parser`), so
``asrkit <command> --help`` documents it and docs/cli.md is generated from the parsers
(``python -m asrkit.cli_docs``). Modules are imported lazily: ``asrkit score`` never imports torch.
"""
from __future__ import annotations

import importlib
import sys
from typing import NamedTuple


class Command(NamedTuple):
    module: str  #: the module with main() and build_parser()
    help: str  #: one line for the top-level help
    group: str  #: the task it belongs to (a key of GROUPS)


#: task -> heading of the top-level help, in this order
GROUPS: dict[str, str] = {
    "data": "data (recipe stages 1-3)",
    "train": "train",
    "decode": "decode and score",
    "transcribe": "transcribe and export",
    "reports": "reports",
    "research": "research tools",
}

#: the single list of commands
COMMANDS: dict[str, Command] = {
    "prepare": Command("asrkit.data.prepare", "corpus on disk -> Lhotse manifests", "data"),
    "cuts": Command("asrkit.data.cuts", "check audio of manifests, store fbank, build long-form windows (stage 2)", "data"),
    "longform": Command("asrkit.data.longform", "build long-form windows (10..45 s) from segments", "data"),
    "synth": Command("asrkit.data.synth", "synthesize the mini corpus in LibriSpeech layout", "data"),
    "tokens": Command("asrkit.tokenizer", "train a tokenizer (letters, sentencepiece or phones)", "data"),
    "lm": Command("asrkit.decode.lm", "train an n-gram LM / build a decoding graph", "data"),
    "config": Command("asrkit.training.checks", "print the resolved config (validates it)", "train"),
    "train": Command("asrkit.training.command", "train a model from a YAML config plus key=value overrides", "train"),
    "average": Command("asrkit.training.average", "average the last or best N checkpoints", "train"),
    "decode": Command("asrkit.decode.run", "decode test sets with a trained model (and score them)", "decode"),
    "score": Command("asrkit.scoring.report", "score hypotheses: sclite-style summary, WER per duration bin", "decode"),
    "tune": Command("asrkit.reports.tune", "choose decoding weights (LM weight, blank penalty...) on a development set",
                    "decode"),
    "transcribe": Command("asrkit.inference.transcribe",
                          "transcribe audio files with a model package or an experiment dir", "transcribe"),
    "export": Command("asrkit.inference.export", "write a self-contained model package (+ ONNX / sherpa-onnx)",
                      "transcribe"),
    "report": Command("asrkit.reports.report", "write RESULTS.md for an experiment dir", "reports"),
    "compare": Command("asrkit.reports.compare", "compare experiments: Markdown table, significance, PNG plots",
                       "reports"),
    "curve": Command("asrkit.reports.curve", "WER against training steps: decode every kept checkpoint, table + PNG",
                     "reports"),
    "analysis": Command("asrkit.reports.analysis",
                        "Park & Sung analyses: receptive field, PCA, attention maps, errors vs length, looping",
                        "research"),
    "padfree": Command("asrkit.reports.padfree",
                       "padding-free pipeline reports: hop histogram, padding fraction, hop-vs-WER curve", "research"),
    "bench": Command("asrkit.bench", "benchmarks (asrkit bench <name>)", "research"),
}


def version() -> str:
    """The installed distribution's version (importlib.metadata), else ``asrkit.__version__``."""
    try:
        from importlib.metadata import PackageNotFoundError, version as _version

        return _version("asrkit")
    except (ImportError, PackageNotFoundError):
        from asrkit import __version__

        return __version__


def usage() -> str:
    """The top-level help: commands grouped by task, and where to read more."""
    lines = ["usage: asrkit <command> [args]      asrkit <command> --help      asrkit --version", ""]
    for group, title in GROUPS.items():
        lines.append(f"{title}:")
        lines += [f"  {name:<11} {c.help}" for name, c in COMMANDS.items() if c.group == group]
        lines.append("")
    lines += ["Recipes (every stage above, end to end): egs/<corpus>/asr1/run.sh --help; start with egs/mini/asr1.",
              "Documentation: docs/README.md (index), docs/cli.md (every command's options), "
              "docs/config.md (every config key)."]
    return "\n".join(lines)


def build_parser(name: str):
    """The argparse parser of command ``name`` (imports its module)."""
    return importlib.import_module(COMMANDS[name].module).build_parser()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"asrkit {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"asrkit: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name].module)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
