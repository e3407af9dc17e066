"""Model packages: everything a trained model needs to transcribe, in one directory.

    asrkit export --exp-dir exp/train --out model/ [--checkpoint last|best|avg] [decode.key=value ...]

A package holds

==========================  ==================================================================
``asrkit-model.json``       what this is: format, asrkit version, source experiment, checkpoint,
                            weights kind, the CRC-32 of the weights file
``model.safetensors``       the weights decoding uses (the moving average of a run with
                            ``train.ema_decay``, or the averaged checkpoint): safetensors, data only
``model.json``              the resolved config and the vocabulary the weights were trained with
``config.yaml``             the same config, to read; ``tokens.path`` and ``decode.lm`` relative to the package
``tokenizer.json``          the tokenizer
``lm/``                     the decoding graph (``decode.method=wfst``) or ARPA LM (``prefix_beam``), if any
``README.md``               training data, test WER table, and the commands that produced them
``model.onnx``, ``tokens.txt``  with ``--onnx`` (see :mod:`asrkit.inference.onnx`)
==========================  ==================================================================

Loading a package (:func:`load_package`) reads nothing outside it and unpickles nothing: the
weights are safetensors, everything else JSON (format 2). Packages of format 1 (asrkit before
format 2: ``model.pt``, a pickle of weights, vocabulary and config) are read only with
``allow_pickle=True`` (``asrkit transcribe --allow-pickle``), and even then through PyTorch's
restricted unpickler (tensors and plain data; a pickle that names code is refused);
``asrkit export --exp-dir OLD_PACKAGE --out NEW --allow-pickle`` rewrites one as format 2. Every
broken package (a file missing, truncated or corrupt, a key missing or of the wrong type, weights
of another model, a vocabulary that does not fit the output layer, an unknown or newer format) is
refused with one line naming the file and what is wrong (:class:`PackageError`).
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
import zlib
from pathlib import Path
from typing import Any, Optional

from asrkit.model.loading import experiment_state, find_path, instantiate
from asrkit.schema import ConfigError

logger = logging.getLogger(__name__)

PACKAGE_FILE = "asrkit-model.json"
WEIGHTS_FILE = "model.safetensors"
MODEL_FILE = "model.json"
PICKLE_FILE = "model.pt"  #: format 1's weights, vocabulary and config (a pickle)
#: the package format this asrkit writes (2: safetensors + JSON; 1: model.pt, a pickle)
FORMAT = 2
ALLOW_PICKLE = "--allow-pickle"  #: the option that lets a format 1 package be read (its name in messages)


class PackageError(ValueError):
    """A package that cannot be loaded; the message is one line naming the file and what is wrong."""


def is_package(path: Path | str) -> bool:
    return (Path(path) / PACKAGE_FILE).is_file()


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PackageError(f"{path} is missing: the package is incomplete (copy it whole, or export it again)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        where = f" (line {e.lineno} column {e.colno}: {e.msg})" if isinstance(e, json.JSONDecodeError) else ""
        raise PackageError(f"{path} is not valid JSON{where}: the file is truncated or corrupt") from None


def read_meta(pkg: Path | str) -> dict:
    """``asrkit-model.json`` of a package, its format checked (one this asrkit reads)."""
    path = Path(pkg) / PACKAGE_FILE
    meta = _json(path)
    if not isinstance(meta, dict):
        raise PackageError(f"{path} holds a JSON {type(meta).__name__}, not an object with the package's format")
    fmt = meta.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise PackageError(f"{path}: unknown package format {fmt!r} (asrkit packages have format 1 or {FORMAT})")
    if fmt > FORMAT:
        raise PackageError(f"{path}: package format {fmt}, written by a newer asrkit "
                           f"({meta.get('asrkit_version', '?')}); this asrkit ({_version()}) reads formats up to "
                           f"{FORMAT}: upgrade asrkit to load it")
    return meta


def _crc32(path: Path) -> str:
    """The CRC-32 of a file (hex): catches a truncated or damaged copy at ~1 GB/s (it is no
    signature: whoever sends a package can write any checksum; safety comes from the format)."""
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _read_weights(path: Path, crc32: Optional[str]) -> dict:
    """The tensors of a safetensors file (read as data: a header of JSON, then raw bytes)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise PackageError(f"{path} is missing: the package is incomplete (copy it whole, or export it again)")
    if crc32 is not None and _crc32(path) != crc32:
        raise PackageError(f"{path} is corrupt or truncated: its CRC-32 is not the one {PACKAGE_FILE} records "
                           f"({path.stat().st_size} bytes); copy the package again")
    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PackageError(f"{path} is not a readable safetensors file ({first}); it is truncated or corrupt: "
                           "copy the package again") from None


def _check_model_json(path: Path, st: Any) -> dict:
    if not isinstance(st, dict):
        raise PackageError(f"{path} holds a JSON {type(st).__name__}, not an object with config and vocab")
    for key, kind in (("config", dict), ("vocab", list)):
        if key not in st:
            raise PackageError(f"{path} lacks {key!r}")
        if not isinstance(st[key], kind):
            raise PackageError(f"{path}: {key!r} is a {type(st[key]).__name__}, not a JSON "
                               f"{'object' if kind is dict else 'array'}")
    if not all(isinstance(t, str) for t in st["vocab"]):
        raise PackageError(f"{path}: 'vocab' must be a list of strings (the tokens)")
    for sec, key in (("tokens", "path"), ("decode", "lm")):
        if not isinstance(st["config"].get(sec), dict) or not isinstance(st["config"][sec].get(key, ""), str):
            raise PackageError(f"{path}: config.{sec}.{key} is missing or not a string")
    return st


def read_state(pkg: Path | str, allow_pickle: bool = False) -> tuple[dict, dict]:
    """``({"model", "config", "vocab"}, meta)`` of a package, read as data, every file checked;
    ``allow_pickle``: a format 1 package's ``model.pt`` may be read (restricted unpickler)."""
    from asrkit.checkpoint import load_state

    pkg = Path(pkg)
    meta = read_meta(pkg)
    if meta["format"] == 1:
        old = pkg / PICKLE_FILE
        if not allow_pickle:
            raise PackageError(
                f"{old}: a package of format 1, whose weights are a pickle (a file that can run code when loaded); "
                f"asrkit does not read one unless told to: if you trust where {pkg} came from, add {ALLOW_PICKLE} "
                f"(load_model(..., allow_pickle=True)), or convert it once: asrkit export --exp-dir {pkg} --out NEW "
                f"{ALLOW_PICKLE}")
        if not old.is_file():
            raise PackageError(f"{old} is missing: the package is incomplete (copy it whole, or export it again)")
        try:
            st = load_state(old, what="package weights")  # tensors and plain data only, even when allowed
        except ValueError as e:
            raise PackageError(str(e)) from None
        if not isinstance(st.get("model"), dict):
            raise PackageError(f"{old} lacks the weights ('model')")
        out = _check_model_json(old, {k: st[k] for k in ("config", "vocab") if k in st})
        out["model"] = st["model"]
        return out, meta
    st = _check_model_json(pkg / MODEL_FILE, _json(pkg / MODEL_FILE))
    st["model"] = _read_weights(pkg / WEIGHTS_FILE, meta.get("weights_crc32"))
    return st, meta


def _inside(pkg: Path, rel: str, path: Path) -> str:
    """``pkg / rel``, refused when ``rel`` leads out of the package (an absolute path, ``..``)."""
    p = (pkg / rel).resolve()
    if not p.is_relative_to(pkg.resolve()):
        raise PackageError(f"{path}: the path {rel!r} leads out of the package; a package reads only its own files")
    return str(pkg / rel)


def load_package(pkg: Path | str, device: str = "cpu", allow_pickle: bool = False):
    """(model, config, tokenizer, info) from a package directory; nothing outside it is read and
    nothing is unpickled (``allow_pickle``: a format 1 package, see the module's docstring)."""
    from asrkit.schema import ConfigError

    pkg = Path(pkg)
    st, meta = read_state(pkg, allow_pickle)
    src = pkg / (PICKLE_FILE if meta["format"] == 1 else MODEL_FILE)
    cfg = st["config"]
    cfg["tokens"]["path"] = _inside(pkg, cfg["tokens"]["path"], src)
    if cfg["decode"].get("lm"):
        cfg["decode"]["lm"] = _inside(pkg, cfg["decode"]["lm"], src)
    weights = pkg / (PICKLE_FILE if meta["format"] == 1 else WEIGHTS_FILE)
    try:
        model, cfg, tok = instantiate({"model": st["model"], "config": cfg, "vocab": st["vocab"]}, device,
                                      str(pkg), str(weights))
    except ConfigError as e:
        raise PackageError(f"{src}: {e}") from None
    logger.info("loaded package %s (%s)", pkg, (meta.get("source") or {}).get("checkpoint"))
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
    tmp = _new_dir(out)
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
        crc = _write_model(tmp, model, list(tok.tokens), pkg_cfg)
        n_params = sum(v.numel() for k, v in model.items() if v.is_floating_point())
        command = command or shlex.join(["asrkit", "export", *sys.argv[1:]])
        readme_cfg = json.loads(json.dumps(cfg_dict))
        (tmp / "README.md").write_text(_readme(exp_dir, readme_cfg, state["info"], n_params, command))
        meta = {"format": FORMAT, "asrkit_version": _version(), "command": command,
                "source": {"exp_dir": str(exp_dir.resolve()), **state["info"]},
                "decode": pkg_cfg["decode"], "weights_crc32": crc}
        (tmp / PACKAGE_FILE).write_text(json.dumps(meta, indent=1))
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def convert_package(src: Path | str, out: Path | str, allow_pickle: bool = False, command: Optional[str] = None) -> Path:
    """Rewrite the package ``src`` (format 1 with ``allow_pickle``, or any format this asrkit reads)
    as a package of the current format at ``out``: the same weights, config, tokenizer, LM and
    README; the weights as safetensors. The package is loaded first (a broken one is refused)."""
    src, out = Path(src), Path(out)
    if out.exists() and not is_package(out) and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an asrkit model package; choose another --out")
    if out.exists() and out.resolve() == src.resolve():
        raise FileExistsError(f"--out {out} is the package being converted; write the new one elsewhere")
    st, meta = read_state(src, allow_pickle)
    load_package(src, allow_pickle=allow_pickle)  # every file checked before anything is written
    tmp = _new_dir(out)
    try:
        for p in src.iterdir():
            if p.name in (PICKLE_FILE, PACKAGE_FILE, WEIGHTS_FILE, MODEL_FILE) or p.name.startswith("."):
                continue
            (shutil.copytree if p.is_dir() else shutil.copy2)(p, tmp / p.name)
        crc = _write_model(tmp, {k: v.contiguous() for k, v in st["model"].items()}, st["vocab"], st["config"])
        meta.pop("weights_sha256", None)
        meta = {**meta, "format": FORMAT, "weights_crc32": crc, "converted": {
            "from": str(src.resolve()), "format": meta["format"], "asrkit_version": _version(),
            "command": command or shlex.join(["asrkit", "export", *sys.argv[1:]])}}
        (tmp / PACKAGE_FILE).write_text(json.dumps(meta, indent=1))
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _new_dir(out: Path) -> Path:
    """A temporary directory beside ``out`` (mode as the umask says) to build a package in."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it 0700
    return tmp


def _write_model(d: Path, model: dict, vocab: list, cfg: dict) -> str:
    """``model.safetensors`` (the weights, each tensor its own copy) and ``model.json`` (config and
    vocabulary) in ``d``; returns the weights file's CRC-32."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in model.items()}, str(d / WEIGHTS_FILE),
              metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    (d / WEIGHTS_FILE).chmod(0o666 & ~umask)  # (safetensors writes it 0600)
    (d / MODEL_FILE).write_text(json.dumps({"config": cfg, "vocab": list(vocab)}, indent=1))
    return _crc32(d / WEIGHTS_FILE)


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished package ``tmp`` to ``out`` (replacing a package there)."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _version() -> str:
    import asrkit

    return getattr(asrkit, "__version__", "?")
