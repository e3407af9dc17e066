"""`asrkit export`: a self-contained model package, optionally with ONNX and sherpa-onnx files.

    asrkit export --exp-dir exp/train --out model/ [--checkpoint last|best|avg] [decode.key=value ...]
    asrkit export --exp-dir exp/train --out model/ --onnx [--check-set test] [--check-max 200]

The package (:mod:`asrkit.inference.package`) holds the resolved config, the tokenizer, the
weights decoding uses (EMA / averaged), the decoding graph or LM of ``decode.lm`` and a README;
``decode.*`` overrides set the package's default decoding (e.g. ``decode.method=wfst
decode.lm=data/lm/graph_letters_1gram decode.lm_weight=0.2``). ``asrkit transcribe --model
model/`` and ``asrkit.load_model("model/")`` read it and nothing else.

``--onnx`` adds ``model.onnx`` (the CTC model after the filterbank, CMVN inside:
:mod:`asrkit.inference.onnx`) and ``tokens.txt`` (sherpa-onnx's zipformer CTC form:
:mod:`asrkit.inference.sherpa`), then checks the graph with onnxruntime against PyTorch on up to
``--check-max`` utterances of ``--check-set`` (the corpus part of the training config, when its
manifest is found) and on a 45 s input: the largest log-probability difference must be at most
``--tolerance`` (1e-4) and the greedy transcripts identical, else the exit code is 1. The figures
go to ``onnx_check.json``.
"""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

import numpy as np
from asrkit.utils import flush_denormals

logger = logging.getLogger(__name__)


def check_utterances(cfg, exp_dir: Path, part: str, limit: int, seed: int = 0):
    """``(id, samples)`` of up to ``limit`` utterances of ``part`` (manifest of the training
    config, found from the recipe dir) plus a 45 s input (three utterances of the part appended
    with short gaps, or noise when there is no manifest)."""
    from asrkit.data.audio import load_cut_audio
    from asrkit.model.loading import find_path

    mdir = Path(find_path(cfg.data.manifest_dir, [exp_dir.parent.parent]))
    path = mdir / f"{cfg.data.corpus}_cuts_{part}.jsonl.gz"
    utts = []
    if path.is_file():
        from lhotse import load_manifest

        cuts = load_manifest(path)
        for i, cut in enumerate(cuts):
            if limit and i >= limit:
                break
            utts.append((cut.id, load_cut_audio(cut)))
    else:
        logger.warning("no manifest %s: checking ONNX on synthetic inputs only", path)
    sr = cfg.features.sample_rate
    if utts:
        pieces, gap = [], np.zeros(int(0.3 * sr), dtype=np.float32)
        while sum(p.size for p in pieces) < 45 * sr:
            for _, x in utts:
                pieces += [x, gap]
        long = np.concatenate(pieces)[: 45 * sr]
    else:
        long = 0.05 * np.random.default_rng(seed).standard_normal(45 * sr).astype(np.float32)
    return utts + [("45s-input", long)]


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_exp_dir, add_out, add_overrides

    p = Parser(prog="asrkit export", description=__doc__)
    add_exp_dir(p, help="the trained experiment directory to package")
    add_out(p, "package directory to write (replaced if it is a package)", required=True)
    p.add_argument("--checkpoint", default="last", help="last | best | avg | a path | a name in EXP/checkpoints")
    p.add_argument("--raw-weights", action="store_true", help="the trained weights, not their moving average")
    p.add_argument("--allow-pickle", action="store_true", help="--exp-dir is a package of format 1 (weights in a "
                   "pickle) that you trust: rewrite it in the current format (docs/sharing_models.md)")
    p.add_argument("--onnx", action="store_true", help="also write model.onnx + tokens.txt (sherpa-onnx) and check them")
    p.add_argument("--check-set", default="test", help="corpus part to check ONNX against PyTorch on")
    p.add_argument("--check-max", type=int, default=200, help="at most this many utterances of --check-set (0: all)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed log-probability difference")
    add_overrides(p, "decode.* settings of the package, e.g. decode.method=wfst decode.lm=...")
    return p


def main(argv: list[str] | None = None) -> int:
    flush_denormals()  # before any torch computation (asrkit.utils.flush_denormals)
    args = build_parser().parse_args(argv)

    from asrkit.inference.package import convert_package, is_package, load_package, write_package
    from asrkit.schema import ConfigError, parse_overrides
    from asrkit.utils import setup_logging

    setup_logging()
    command = shlex.join(["asrkit", "export", *(sys.argv[1:] if argv is None else argv)])
    try:
        pairs = parse_overrides(args.overrides)
        if args.onnx:  # refuse before writing anything
            from asrkit.config import config_from_dict
            from asrkit.inference.onnx import unsupported_reason
            from asrkit.model.loading import experiment_state

            reason = unsupported_reason(config_from_dict(experiment_state(args.exp_dir, args.checkpoint)["config"]))
            if reason:
                raise ValueError(f"cannot export to ONNX: {reason}")
        if is_package(args.exp_dir):  # a package: rewritten in the current format (safetensors)
            if pairs or args.onnx:
                raise ValueError(f"{args.exp_dir} is a model package: it can only be converted (no decode.* "
                                 "settings, no --onnx; export again from its experiment dir for those)")
            out = convert_package(args.exp_dir, args.out, args.allow_pickle, command)
        else:
            out = write_package(args.exp_dir, args.out, args.checkpoint, not args.raw_weights, pairs, command)
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError, OSError) as e:
        print(f"asrkit export: error: {e}", file=sys.stderr)
        return 2
    print(f"package -> {out}")
    if not args.onnx:
        return 0

    from asrkit.inference.onnx import check_onnx, export_onnx
    from asrkit.decode.ctc import word_boundary_kind
    from asrkit.inference.sherpa import export_sherpa, sherpa_command

    model, cfg, tok, _ = load_package(out)
    onnx_path = export_onnx(model, cfg, out / "model.onnx")
    export_sherpa(onnx_path, tok, out)
    utts = check_utterances(cfg, args.exp_dir, args.check_set, args.check_max)
    res = check_onnx(model, cfg, tok, onnx_path, utts)
    res.update({"tolerance": args.tolerance, "check_set": args.check_set})
    ok = res["max_abs_diff"] <= args.tolerance and not res["greedy_mismatches"] and not res["frames_mismatch"]
    res["ok"] = ok
    (out / "onnx_check.json").write_text(json.dumps(res, indent=1))
    print(f"onnx -> {onnx_path} (+ tokens.txt); onnxruntime vs PyTorch on {res['utterances']} inputs: "
          f"max |log-prob diff| {res['max_abs_diff']:.2e}, greedy transcripts differ on {len(res['greedy_mismatches'])}")
    print(f"sherpa-onnx: {sherpa_command(onnx_path, out / 'tokens.txt')}")
    if word_boundary_kind(tok) == "phone":
        print("note: a phone model: sherpa-onnx's greedy search writes its phones, space-separated, not words; "
              f"words come from its TLG graph: asrkit transcribe --model {out} RECORDING.wav")
    if not ok:
        print(f"asrkit export: error: the ONNX model does not match PyTorch (see {out / 'onnx_check.json'})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
