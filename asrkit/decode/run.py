"""`asrkit decode`: decode test sets with a trained model and score them.

    asrkit decode --exp-dir exp/sinpos --sets test dev test-longform [decode.method=prefix_beam decode.beam=8]

For each set writes ``EXP/decode_<set>[_<suffix>]/hyp.jsonl`` and ``decode_info.json`` (real-time
factor included), then scores it (``result.txt``, ``wer.json``...). Batch size 1 and the training
hop by default, so padding never affects scoring.

Cost of decoding, in ``decode_info.json``: ``wall_seconds`` (the whole set, worker start-up
included) and ``rtf``; ``decode_seconds`` (the batches alone: features, model, search); memory
per batch measured by :class:`asrkit.decode.memory.PeakRss` in the process that decodes it:
``peak_rss_bytes`` (largest resident set of a decoding process, model included) and
``peak_rss_delta_bytes`` (largest increase over the resident set at the batch's start: what
decoding one batch needs), with ``memory_method``. The same per duration bin (``bins``, the
edges of ``decode.bins``): utterances, audio seconds, decode seconds, RTF and the largest
``peak_rss_delta_bytes`` of the bin's batches (a batch mixing bins: its time is split by audio
duration, its memory counts for each of them). Before measuring, each decoding process decodes
its shortest utterance once (output discarded), so one-time set-up (graph loading, kernel and
allocator caches) is counted in no bin.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

from asrkit.config import config_from_dict, to_dict, with_overrides
from asrkit.decode.methods import Decoder, validate_decode_config
from asrkit.model import validate_model_config
from asrkit.model.loading import load_experiment
from asrkit.schema import ConfigError, parse_overrides
from asrkit.utils import atomic_write, flush_denormals, setup_logging

logger = logging.getLogger(__name__)


def check_decode_config(cfg):
    """What decoding reads of a config: the model and the ``decode`` section. Returns ``cfg``."""
    validate_model_config(cfg)
    validate_decode_config(cfg)
    return cfg


def check_decode_lm(cfg):
    """``decode.lm``, when given, exists (the decoders open it only when they are built, after the
    model is loaded): the effective config, after the command line's overrides. Returns ``cfg``."""
    lm = cfg.decode.lm
    if lm and not Path(lm).exists():
        raise ConfigError(f"decode.lm={lm} does not exist (an ARPA file for prefix_beam, a graph dir of "
                          "`asrkit lm graph` for wfst)")
    return cfg


def load_model(exp_dir: Path, checkpoint: str = "last", device: str = "cpu", ema: bool = True):
    """(model in eval mode, config, tokenizer) from an experiment dir
    (:func:`asrkit.model.loading.load_experiment`: EMA weights unless ``ema`` is False)."""
    model, cfg, tok, _ = load_experiment(exp_dir, checkpoint, device, ema)
    return model, check_decode_config(cfg), tok


#: per-utterance measurements carried from _decode_cuts to decode_set (not written to hyp.jsonl)
_COST_KEYS = ("_seconds", "_peak", "_delta")


def _decode_cuts(model, cfg, tok, cut_list: list, hop: float, desc: str, position: int = 0) -> tuple[list[dict], float]:
    """Decode cuts in order; returns (results, model seconds). Each result carries its share of
    its batch's decode seconds and the batch's peak RSS and delta (:data:`_COST_KEYS`)."""
    from tqdm import tqdm

    from asrkit.data.dataset import AsrDataset, collate
    from asrkit.decode.memory import PeakRss

    ds = AsrDataset(tok, cfg.features, None, on_bad_audio="raise")
    decoder = Decoder(model, cfg, tok)
    bs = cfg.decode.batch_size
    if cut_list:  # warm-up (see the module docstring)
        decoder(collate([ds.utterance(min(cut_list, key=lambda c: c.duration), hop=hop)]))
    mem = PeakRss()
    results, t_model = [], 0.0
    for i in tqdm(range(0, len(cut_list), bs), desc=desc, dynamic_ncols=True, position=position):
        chunk = cut_list[i:i + bs]
        mem.start()
        t0 = time.perf_counter()
        batch = collate([ds.utterance(c, hop=hop) for c in chunk])
        tm = time.perf_counter()
        hyps = decoder(batch)
        t1 = time.perf_counter()
        peak, delta = mem.stop()
        t_model += t1 - tm
        audio = sum(c.duration for c in chunk)
        for c, u_text, hyp in zip(chunk, batch["texts"], hyps):
            r = {"id": c.id, "ref": u_text, "hyp": hyp, "duration": c.duration}
            speaker = c.supervisions[0].speaker if c.supervisions else None
            if speaker:  # the sign test's blocks (asrkit compare --sign-unit speaker), whatever the ids
                r["speaker"] = speaker
            window = getattr(c, "window", None)  # long-form window size (Lhotse custom field)
            if window is not None:
                r["window"] = window
            share = c.duration / audio if audio > 0 else 1.0 / len(chunk)
            r.update(_seconds=(t1 - t0) * share, _peak=peak, _delta=delta)
            results.append(r)
    return results, t_model


def _cost_info(results: list[dict], bins, method: str) -> dict:
    """The cost entries of decode_info.json (see the module docstring); pops the per-utterance
    measurements from ``results``."""
    from asrkit.scoring import bin_index, bin_labels

    costs = [tuple(r.pop(k) for k in _COST_KEYS) for r in results]
    edges = tuple(bins)
    per_bin = [{"label": lab, "utterances": 0, "audio_seconds": 0.0, "decode_seconds": 0.0,
                "rtf": None, "peak_rss_delta_bytes": None} for lab in bin_labels(edges)]
    for r, (sec, _, delta) in zip(results, costs):
        b = per_bin[bin_index(r["duration"], edges)]
        b["utterances"] += 1
        b["audio_seconds"] += r["duration"]
        b["decode_seconds"] += sec
        b["peak_rss_delta_bytes"] = max(b["peak_rss_delta_bytes"] or 0, delta)
    for b in per_bin:
        if b["audio_seconds"] > 0:
            b["rtf"] = b["decode_seconds"] / b["audio_seconds"]
    return {
        "decode_seconds": sum(c[0] for c in costs),
        "peak_rss_bytes": max((c[1] for c in costs), default=None),
        "peak_rss_delta_bytes": max((c[2] for c in costs), default=None),
        "memory_method": method,
        "bins": per_bin,
    }


def _worker(args) -> tuple[list[dict], float]:
    exp_dir, checkpoint, ema, cfg_dict, shard, hop, job, threads = args
    torch.set_num_threads(threads)
    from asrkit.decode.methods import resolve_device

    model, _, tok = load_model(exp_dir, checkpoint, ema=ema)
    cfg = check_decode_config(config_from_dict(cfg_dict))
    model = model.to(resolve_device(cfg.decode.device))
    return _decode_cuts(model, cfg, tok, shard, hop, f"decode job {job}", position=job)


def decode_set(model, cfg, tok, cuts, out_dir: Path, set_name: str, hop: float, nj: int = 1,
               exp_dir: Path | None = None, checkpoint: str = "last", ema: bool = True,
               normalizer: str | None = None) -> dict:
    """Decode one set into ``out_dir`` (hyp.jsonl + decode_info.json). With ``nj > 1`` the set is split
    into ``nj`` contiguous shards decoded by as many processes (each loads the model, with
    cores / nj threads, on ``decode.device``); results keep the manifest order. The RTF is wall
    time / audio time. ``normalizer``: the scoring normalizer recorded in decode_info.json, which
    ``asrkit score`` then uses by default (the corpus's own)."""
    from asrkit.decode.memory import PeakRss

    cut_list = list(cuts)
    t0 = time.time()
    if nj <= 1 or len(cut_list) < 2:
        results, t_model = _decode_cuts(model, cfg, tok, cut_list, hop, f"decode {set_name}")
    else:
        import multiprocessing as mp

        nj = min(nj, len(cut_list))
        threads = max(1, torch.get_num_threads() // nj)
        k = -(-len(cut_list) // nj)
        shards = [cut_list[i * k:(i + 1) * k] for i in range(nj)]
        jobs = [(exp_dir, checkpoint, ema, to_dict(cfg), sh, hop, j, threads) for j, sh in enumerate(shards) if sh]
        with mp.get_context("spawn").Pool(len(jobs)) as pool:
            parts = pool.map(_worker, jobs)
        results = [r for part, _ in parts for r in part]
        t_model = sum(t for _, t in parts)
    wall = time.time() - t0
    audio_s = sum(r["duration"] for r in results)
    cost = _cost_info(results, cfg.decode.bins, PeakRss().method)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_write(out_dir / "hyp.jsonl") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    info = {"set": set_name, "decoder": cfg.decode.method, "beam": cfg.decode.beam, "hop": hop,
            "batch_size": cfg.decode.batch_size, "nj": nj, "utterances": len(results), "audio_seconds": audio_s,
            "wall_seconds": wall, "rtf": wall / max(audio_s, 1e-9), "model_rtf": t_model / max(audio_s, 1e-9),
            "threads": torch.get_num_threads(), "lm": cfg.decode.lm or None, "lm_weight": cfg.decode.lm_weight,
            "blank_penalty": cfg.decode.blank_penalty, "word_bonus": cfg.decode.word_bonus,
            **({"search_beam": cfg.decode.search_beam, "max_active": cfg.decode.max_active} if cfg.decode.method == "wfst" else {}),
            "device": str(next(model.parameters()).device) if model is not None else cfg.decode.device,
            **({"normalizer": normalizer} if normalizer else {}), **cost}
    with atomic_write(out_dir / "decode_info.json") as f:
        json.dump(info, f, indent=1)
    return info


def parse_decode_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """Parse ``decode.key=value`` overrides; any other section is a :class:`ConfigError`."""
    pairs = parse_overrides(overrides)
    for key, _ in pairs:
        if not key.startswith("decode."):
            raise ConfigError(f"only decode.* keys can be overridden at decoding time, got {key!r}")
    return pairs


def _missing_sets(cfg, sets: list[str]) -> str:
    """A one-line error for the first set without a cuts manifest ("" when all have one)."""
    from asrkit.data.manifests import manifest_path

    for s in sets:
        path = manifest_path(cfg.data.manifest_dir, cfg.data.corpus, "cuts", s)
        if not path.is_file():
            prefix = f"{cfg.data.corpus}_cuts_"
            have = sorted(p.name[len(prefix):-len(".jsonl.gz")] for p in path.parent.glob(f"{prefix}*.jsonl.gz"))
            return (f"set {s!r} has no cuts manifest {path} (sets with one there: {', '.join(have) or 'none'}); "
                    "check --sets, or prepare that set first (run the data stages)")
    return ""


def _methods_epilog() -> str:
    """The decoding methods (DECODE_METHODS) and the decode.* keys (the config schema), for --help."""
    import textwrap

    from asrkit.config import config_keys
    from asrkit.decode.methods import DECODE_METHODS

    lines = ["decoding methods (decode.method=NAME):"]
    for name, cls in DECODE_METHODS.items():
        doc = (cls.__doc__ or "").strip().splitlines()
        lines.append(f"  {name:<12} {_METHOD_HELP.get(name, doc[0] if doc else '')}")
    lines += ["", "decode.* keys (positional decode.KEY=VALUE or --set decode.KEY=VALUE; docs/config.md):"]
    for k in config_keys():
        if k["key"].startswith("decode."):
            lines.append(f"  {k['key']}={k['default']!s}")
            if k["doc"]:
                lines += textwrap.wrap(k["doc"], 96, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


_METHOD_HELP = {
    "greedy": "best CTC label per frame, repeats merged, blanks dropped",
    "prefix_beam": "CTC prefix beam search (decode.beam), optional word n-gram fusion (decode.lm = an ARPA file)",
    "wfst": "TLG graph search (decode.lm = a graph dir of asrkit lm graph)",
    "attention": "beam search of the attention decoder (+ CTC prefix scores, decode.ctc_weight)",
}


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_exp_dir, add_nj, add_overrides, add_sets

    p = Parser(prog="asrkit decode", description=__doc__, epilog=_methods_epilog())
    add_exp_dir(p)
    add_sets(p, "parts of the corpus (cuts manifests) to decode; key=value items among them are overrides")
    p.add_argument("--checkpoint", default="last", help="last | best | avg | a path | a name in EXP/checkpoints")
    p.add_argument("--raw-weights", action="store_true",
                   help="decode the trained weights, not their moving average (runs with train.ema_decay > 0)")
    p.add_argument("--suffix", default="", help="decode dir suffix (decode_<set>_<suffix>; default: none)")
    p.add_argument("--norm", default=None, help="scoring normalizer (default: the corpus's own, as the recipe's)")
    p.add_argument("--no-score", action="store_true", help="write hyp.jsonl only (score later: asrkit score)")
    add_nj(p, 1, "decoding processes (each gets cores / nj threads)")
    add_overrides(p)
    return p


def main(argv: list[str] | None = None) -> int:
    flush_denormals()  # before any torch computation (asrkit.utils.flush_denormals)
    from asrkit.data.manifests import load_cuts
    from asrkit.decode.methods import resolve_device

    p = build_parser()
    args = p.parse_args(argv)
    # `--sets test dev decode.beam=4`: argparse gives the overrides to --sets (nargs="+"); set names
    # never contain '=', so every item with one is an override
    overrides = [s for s in args.sets if "=" in s] + args.overrides
    sets = [s for s in args.sets if "=" not in s]
    if not sets:
        p.error("--sets needs at least one set name")
    setup_logging()
    try:
        overrides = parse_decode_overrides(overrides)  # fail before loading anything
        model, cfg, tok = load_model(args.exp_dir, args.checkpoint, ema=not args.raw_weights)
        cfg = check_decode_lm(check_decode_config(with_overrides(cfg, overrides)))
        model = model.to(resolve_device(cfg.decode.device))
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"asrkit decode: error: {e}", file=sys.stderr)
        return 2
    missing = _missing_sets(cfg, sets)  # before decoding anything
    if missing:
        print(f"asrkit decode: error: {missing}", file=sys.stderr)
        return 2
    hop = cfg.decode.hop or cfg.features.hop
    from asrkit.scoring import score_dir
    from asrkit.textnorm import corpus_normalizer

    norm = args.norm or corpus_normalizer(cfg.data.corpus, getattr(tok, "fold", "none"))  # refs folded like the training text
    from asrkit.model.asr import NoFramesError

    for s in sets:
        cuts = load_cuts(cfg.data.manifest_dir, cfg.data.corpus, s)
        name = f"decode_{s}" + (f"_{args.suffix}" if args.suffix else "")
        try:
            info = decode_set(model, cfg, tok, cuts, args.exp_dir / name, s, hop, nj=args.nj,
                              exp_dir=args.exp_dir, checkpoint=args.checkpoint, ema=not args.raw_weights,
                              normalizer=norm)
        except NoFramesError as e:
            print(f"asrkit decode: error: {s}: {e}", file=sys.stderr)
            return 1
        logger.info("%s: %d utterances, RTF %.4f", s, info["utterances"], info["rtf"])
        if not args.no_score:
            score_dir(args.exp_dir / name, bins=cfg.decode.bins, normalizer=norm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
