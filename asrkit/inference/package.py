"""Model packages: everything a trained model needs to transcribe, in one directory.

    asrkit export --exp-dir exp/train --out model/ [--checkpoint last|best|avg] [decode.key=value ...]

A package holds

==========================  ==================================================================
``asrkit-model.json``       what this is: format, source experiment, checkpoint, weights kind
``config.yaml``             the resolved config; ``tokens.path`` and ``decode.lm`` relative to the package
``tokenizer.json``          the tokenizer
``model.pt``                the weights decoding uses (the moving average of a run with
                            ``train.ema_decay``, or the averaged checkpoint), vocabulary, config
``lm/``                     the decoding graph (``decode.method=wfst``) or ARPA LM (``prefix_beam``), if any
``README.md``               training data, test WER table, and the commands that produced them
``model.onnx``, ``tokens.txt``  with ``--onnx`` (see :mod:`asrkit.inference.onnx`)
==========================  ==================================================================

Loading a package (:func:`load_package`) reads nothing outside it.
:func:`asrkit.model.loading.load_experiment` loads the same weights from an experiment directory.
"""
from __future__ import annotations

import datetime
import gzip
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from asrkit.model.loading import experiment_state, find_path, instantiate
from asrkit.schema import ConfigError

logger = logging.getLogger(__name__)

PACKAGE_FILE = "asrkit-model.json"
FORMAT = 1


def is_package(path: Path | str) -> bool:
    return (Path(path) / PACKAGE_FILE).is_file()


def load_package(pkg: Path | str, device: str = "cpu"):
    """(model, config, tokenizer, info) from a package directory; nothing outside it is read."""
    pkg = Path(pkg)
    meta = json.loads((pkg / PACKAGE_FILE).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{pkg}: package format {meta.get('format')!r}; this asrkit reads format {FORMAT}")
    st = torch.load(pkg / "model.pt", map_location="cpu", weights_only=False)
    cfg = st["config"]
    cfg["tokens"]["path"] = str(pkg / cfg["tokens"]["path"])
    if cfg["decode"].get("lm"):
        cfg["decode"]["lm"] = str(pkg / cfg["decode"]["lm"])
    model, cfg, tok = instantiate({"model": st["model"], "config": cfg, "vocab": st["vocab"]}, device, str(pkg))
    logger.info("loaded package %s (%s)", pkg, meta.get("source", {}).get("checkpoint"))
    return model, cfg, tok, meta


# ----------------------------------------------------------------------------------- writing
def _copy_lm(lm: str, dest: Path) -> str:
    """Copy a graph directory or an ARPA file into ``dest/lm``; its path relative to ``dest``."""
    src = Path(lm)
    if not src.exists():
        raise FileNotFoundError(f"decode.lm={lm} does not exist (give its path with decode.lm=...)")
    if src.is_dir():
        target = dest / "lm" / src.name
        shutil.copytree(src, target, ignore=shutil.ignore_patterns("G.fst", ".*"))  # G.fst: only needed to build TLG
    else:
        target = dest / "lm" / src.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return str(target.relative_to(dest))


def _corpus_stats(cfg: dict) -> list[str]:
    """Lines about the training data: sets, utterances and hours when the manifests are readable."""
    d = cfg["data"]
    lines = [f"- corpus `{d['corpus']}`, training sets {', '.join(f'`{s}`' for s in d['train_sets'])}"
             + (f", dev set `{d['dev_set']}`" if d.get("dev_set") else "")]
    for part in d["train_sets"]:
        p = Path(d["manifest_dir"]) / f"{d['corpus']}_cuts_{part}.jsonl.gz"
        if not p.is_file():
            continue
        n, secs = 0, 0.0
        with gzip.open(p, "rt") as f:
            for line in f:
                n += 1
                secs += float(json.loads(line).get("duration", 0.0))
        lines.append(f"- `{part}`: {n} utterances, {secs / 3600:.2f} h ({p})")
    return lines


def _wer_table(exp_dir: Path) -> list[str]:
    rows = []
    for d in sorted(exp_dir.glob("decode_*")):
        wj, ij = d / "wer.json", d / "decode_info.json"
        if not wj.is_file():
            continue
        w = json.loads(wj.read_text())["overall"]
        info = json.loads(ij.read_text()) if ij.is_file() else {}
        cmd = ["asrkit", "decode", "--exp-dir", str(exp_dir), "--sets", info.get("set", d.name[len("decode_"):])]
        method = info.get("decoder")
        if method:
            cmd.append(f"decode.method={method}")
            if method != "greedy" and info.get("beam") is not None:
                cmd.append(f"decode.beam={info['beam']}")
        if info.get("lm"):
            cmd.append(f"decode.lm={info['lm']}")
        for key in ("lm_weight", "blank_penalty", "word_bonus"):  # recorded since asrkit tune (2026-11-27)
            if info.get(key) is not None and (info.get("lm") if key == "lm_weight" else info[key]):
                cmd.append(f"decode.{key}={info[key]}")
        wer = "-" if w.get("wer") is None else f"{w['wer']:.2f}"
        rows.append(f"| {d.name[len('decode_'):]} | {method or '?'} | {wer} | {w.get('snt')} | {w.get('wrd')} | "
                    f"`{shlex.join(cmd)}` |")
    if not rows:
        return ["(no scored decoding in the experiment directory)"]
    return ["| set | decoder | WER % | utterances | words | command (the checkpoint is not recorded) |",
            "|---|---|---:|---:|---:|---|", *rows]


def _readme(exp_dir: Path, cfg: dict, info: dict, n_params: int, command: str) -> str:
    e, dec = cfg["encoder"], cfg["decode"]
    weights = ("the exponential moving average of the weights" if info.get("ema") else
               f"the average of {', '.join(info['averaged_from'])}" if info.get("averaged_from") else "the trained weights")
    lm = f", LM `{dec['lm']}` (weight {dec['lm_weight']})" if dec.get("lm") else ""
    train_info = exp_dir / "train_info.json"
    ti = json.loads(train_info.read_text()) if train_info.is_file() else {}
    lines = [
        f"# asrkit model `{exp_dir.name}`", "",
        f"Exported on {datetime.date.today().isoformat()} from `{exp_dir}` by", "",
        f"    {command}", "",
        f"Weights: {weights} of `{Path(info['checkpoint']).name}` (step {info.get('step')}).", "",
        "## Use", "",
        "    asrkit transcribe --model THIS_DIR recording.wav [--format json|srt|vtt|ctm]", "",
        "    import asrkit",
        "    model = asrkit.load_model(\"THIS_DIR\")",
        "    result = model.transcribe(\"recording.wav\")   # result.text, result.words (start, end in s)", "",
        "## Model", "",
        f"- encoder `{e['type']}`, {e['n_layers']} layers x {e['d_model']}, positional encoding `{e['pos_enc']}`, "
        f"{n_params / 1e6:.2f} M parameters",
        f"- features: {cfg['features']['n_mels']} log-mel, hop {cfg['features']['hop']} s, "
        f"{cfg['features']['sample_rate']} Hz; frontend stride {cfg['frontend']['stride']}",
        f"- tokens: {cfg['tokens']['kind']}; decoder `{cfg['decoder']['type']}`",
        f"- decoding: `{dec['method']}` (beam {dec['beam']}{lm})", "",
        "## Training data", "", *_corpus_stats(cfg),
    ]
    lines.insert(lines.index("## Training data") + 2, "- the resolved training config is `config.yaml` in this directory")
    if ti:
        lines.append(f"- trained {ti.get('steps')} steps, {ti.get('epochs_completed')} epochs, "
                     f"{ti.get('audio_seconds', 0) / 3600:.1f} h of audio seen ({ti.get('stopped_by')})")
    lines += ["", "## Test WER (decoded in the experiment directory)", "", *_wer_table(exp_dir), ""]
    return "\n".join(lines)


def write_package(exp_dir: Path | str, out: Path | str, checkpoint: str = "last", ema: bool = True,
                  decode_overrides: Optional[list[tuple[str, Any]]] = None, command: Optional[str] = None) -> Path:
    """Write the package of ``exp_dir`` to ``out`` (replacing a package already there).

    ``decode_overrides``: ``(decode.key, value)`` pairs baked into the package's config (the
    decoding method and LM the package uses by default). The directory is built under a
    temporary name and renamed, so ``out`` is never half-written."""
    from asrkit.config import config_from_dict, to_dict, with_overrides
    from asrkit.tokenizer import load_tokenizer, save_tokenizer

    exp_dir, out = Path(exp_dir), Path(out)
    if out.exists() and not is_package(out) and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an asrkit model package; choose another --out")
    state = experiment_state(exp_dir, checkpoint, ema)
    cfg = config_from_dict(state["config"])
    for key, _ in decode_overrides or []:
        if not key.startswith("decode."):
            raise ConfigError(f"only decode.* keys can be set for a package, got {key!r}")
    cfg = with_overrides(cfg, decode_overrides or [])
    cfg_dict = to_dict(cfg)
    cfg_dict["decode"]["lm"] = find_path(cfg_dict["decode"]["lm"], [exp_dir.parent.parent])
    tok = load_tokenizer(cfg_dict["tokens"]["path"])
    if list(tok.tokens) != list(state["vocab"]):
        raise ValueError(f"tokenizer {cfg_dict['tokens']['path']} differs from the one {exp_dir} was trained with")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it 0700
    try:
        save_tokenizer(tok, tmp / "tokenizer.json")
        pkg_cfg = json.loads(json.dumps(cfg_dict))
        pkg_cfg["tokens"]["path"] = "tokenizer.json"
        if cfg_dict["decode"]["lm"] and cfg.decode.method in ("wfst", "prefix_beam"):
            pkg_cfg["decode"]["lm"] = _copy_lm(cfg_dict["decode"]["lm"], tmp)
        else:
            pkg_cfg["decode"]["lm"] = ""
        import yaml

        (tmp / "config.yaml").write_text(yaml.safe_dump(pkg_cfg, sort_keys=False))
        model = {k: v.detach().clone() for k, v in state["model"].items()}
        torch.save({"model": model, "vocab": list(tok.tokens), "config": pkg_cfg}, tmp / "model.pt")
        n_params = sum(v.numel() for k, v in model.items() if v.is_floating_point())
        command = command or shlex.join(["asrkit", "export", *sys.argv[1:]])
        readme_cfg = json.loads(json.dumps(cfg_dict))
        (tmp / "README.md").write_text(_readme(exp_dir, readme_cfg, state["info"], n_params, command))
        meta = {"format": FORMAT, "asrkit_version": _version(), "command": command,
                "source": {"exp_dir": str(exp_dir.resolve()), **state["info"]},
                "decode": pkg_cfg["decode"]}
        (tmp / PACKAGE_FILE).write_text(json.dumps(meta, indent=1))
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _version() -> str:
    import asrkit

    return getattr(asrkit, "__version__", "?")
