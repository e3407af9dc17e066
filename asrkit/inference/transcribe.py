"""`asrkit transcribe`: transcribe audio files with a model package or an experiment directory.

    asrkit transcribe --model model/ talk.flac interview.mp3            # text to stdout
    asrkit transcribe --model exp/train --format srt --out subs/ *.wav
    asrkit transcribe --model model/ --list files.txt --format json
    cat rec.wav | asrkit transcribe --model model/ -                    # standard input
    asrkit transcribe --model model/ --method prefix_beam --set decode.beam=16 talk.wav
    asrkit transcribe --model model/ --device cuda --batch-size 32 *.flac    # on a GPU

Inputs: audio files in any format libsndfile or FFmpeg's libraries (PyAV) read (wav, flac, mp3, ogg, sph...), any
sample rate (resampled) and channel count (averaged); ``-`` reads one recording from standard
input; ``--list FILE`` adds the paths listed in FILE (one per line, ``#`` comments). Recordings
longer than ``--chunk-s`` are decoded in overlapping chunks (bounded memory) with a progress bar.

An input that cannot be transcribed (unreadable, empty, too short) gets a one-line error on
stderr naming it; the others are still transcribed, and the exit code is 1 at the end
(2: bad options or model).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asrkit.inference.formats import FORMATS, render
from asrkit.utils import flush_denormals


def _read_list(path: str) -> list[str]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_out, add_overrides

    p = Parser(prog="asrkit transcribe", description=__doc__)
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="audio files, or - for standard input; decode.KEY=VALUE items among them are decoding options")
    p.add_argument("--model", required=True, type=Path, help="a model package (asrkit export) or an experiment dir")
    p.add_argument("--list", action="append", default=[], metavar="FILE",
                   help="a file listing audio paths, one per line (repeatable; - = standard input)")
    p.add_argument("--format", choices=FORMATS, default="text", help="output format")
    add_out(p, "write NAME.<format> per input into this directory instead of to stdout", aliases=["--output-dir"])
    p.add_argument("--checkpoint", default="last", help="experiment dir only: last | best | avg | a path | a name in EXP/checkpoints")
    p.add_argument("--raw-weights", action="store_true", help="experiment dir only: not the moving average")
    p.add_argument("--allow-pickle", action="store_true", help="also read a package of format 1 (its weights are a "
                   "pickle: only if you trust its source; docs/sharing_models.md)")
    p.add_argument("--method", choices=("greedy", "prefix_beam", "wfst", "attention"),
                   help="decode.method (default: the model's)")
    add_overrides(p, positional=False)
    p.add_argument("--chunk-s", type=float, default=30.0, help="recordings longer than this are chunked (s)")
    p.add_argument("--overlap-s", type=float, default=6.0, help="overlap of consecutive chunks (s)")
    p.add_argument("--batch-size", type=int, default=8, help="segments per model call")
    p.add_argument("--device", default=None,
                   help="decode.device: auto (a GPU when there is one, else the CPU) | cpu | cuda | cuda:N "
                        "(default: decode.device if given, else auto)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    flush_denormals()  # before any torch computation (asrkit.utils.flush_denormals)
    args = build_parser().parse_args(argv)
    import torch

    from asrkit.inference.transcriber import load_model
    from asrkit.schema import ConfigError
    from asrkit.utils import setup_logging

    setup_logging(level=30)  # warnings only: stdout carries the transcripts
    # decode.KEY=VALUE among the inputs: decoding options, as in asrkit decode
    inputs = [x for x in args.inputs if not (x.startswith("decode.") and "=" in x)]
    overrides = [x for x in args.inputs if x.startswith("decode.") and "=" in x] + list(args.overrides)
    try:
        for lst in args.list:
            inputs += _read_list(lst)
    except OSError as e:
        print(f"asrkit transcribe: error: cannot read list file: {e}", file=sys.stderr)
        return 2
    if not inputs:
        print("asrkit transcribe: error: no input (give audio files, - for stdin, or --list FILE)", file=sys.stderr)
        return 2
    if inputs.count("-") > 1:
        print("asrkit transcribe: error: - (standard input) can be given once", file=sys.stderr)
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    overrides += [f"decode.method={args.method}"] if args.method else []
    from asrkit.decode.methods import resolve_device

    device = args.device or next((x.split("=", 1)[1] for x in reversed(overrides) if x.startswith("decode.device=")),
                                 "auto")
    try:
        device = str(resolve_device(device, "--device" if args.device else "decode.device"))
        model = load_model(args.model, args.checkpoint, device, ema=not args.raw_weights, decode=overrides,
                           allow_pickle=args.allow_pickle, chunk_s=args.chunk_s, overlap_s=args.overlap_s,
                           batch_size=args.batch_size)
    except (ConfigError, FileNotFoundError, ValueError, OSError) as e:
        print(f"asrkit transcribe: error: {e}", file=sys.stderr)
        return 2
    several = len(inputs) > 1
    failed = 0
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    for t in model.iter_transcribe(inputs, progress=not args.no_progress and sys.stderr.isatty(), on_error="keep"):
        if t.error is not None:
            failed += 1
            print(f"asrkit transcribe: error: {t.error}", file=sys.stderr)
            continue
        out = render(t, args.format, several=several)
        if args.out:
            ext = "txt" if args.format == "text" else args.format
            stem = Path(t.name).stem if t.name != "<stdin>" else "stdin"
            (args.out / f"{stem}.{ext}").write_text(render(t, args.format))
        else:
            sys.stdout.write(out)
            sys.stdout.flush()
    if failed:
        print(f"asrkit transcribe: {failed} of {len(inputs)} inputs failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
