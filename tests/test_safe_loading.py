"""A model from someone else cannot run code (issue 54): packages are safetensors + JSON, checkpoints
are read with ``torch.load(weights_only=True)``, the cut index caches are data; every broken model
is refused with one line naming the file.

The payloads are real: a pickle whose ``__reduce__`` names ``os.system("touch MARKER")`` (written by
``torch.save`` and by ``pickle``), given to ``asrkit transcribe`` (an old-format package and an
experiment dir), ``train.init_from``, ``asrkit average``, ``asrkit decode``, a resumed ``asrkit train``
and the cut index cache; each test asserts that the marker file is never created. The broken
files are real files broken: a truncated safetensors file, flipped bytes, wrong JSON, a tensor
left out or of another type, another model's weights, another tokenizer, an unknown or newer format.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

sys.path.insert(0, os.path.dirname(__file__))
import helpers_infer as HI  # noqa: E402
import helpers_train as HT  # noqa: E402

from asrkit.cli import main as cli  # noqa: E402

TINY = ["encoder.d_model=32", "encoder.n_heads=2", "encoder.d_ff=64", "encoder.n_layers=2", "frontend.stride=4"]


class Payload:
    """Unpickling this runs ``touch marker`` (what a malicious model file would do)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_state(marker: Path) -> dict:
    return {"model": {"w": Payload(marker)}, "config": {}, "vocab": [], "step": 1}


def _one_line(err: str) -> str:
    """The refusal: exactly one non-empty line on stderr, no traceback."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A random-weight experiment dir, its format-2 package, a format-1 package of the same weights
    (as asrkit wrote them before: model.pt = torch.save of weights, vocabulary and config) and a wav."""
    root = tmp_path_factory.mktemp("safe")
    exp = HI.random_exp(root / "recipe", TINY)
    pkg = root / "pkg"
    assert cli(["export", "--exp-dir", str(exp), "--out", str(pkg)]) == 0
    old = root / "pkg_v1"
    old.mkdir()
    for name in ("tokenizer.json", "config.yaml", "README.md"):
        (old / name).write_bytes((pkg / name).read_bytes())
    from safetensors.torch import load_file

    st = json.loads((pkg / "model.json").read_text())
    torch.save({"model": load_file(pkg / "model.safetensors"), "vocab": st["vocab"], "config": st["config"]},
               old / "model.pt")
    meta = json.loads((pkg / "asrkit-model.json").read_text())
    (old / "asrkit-model.json").write_text(json.dumps({**meta, "format": 1}))
    wav = root / "x.wav"
    sf.write(wav, (0.1 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32), 16000)
    return {"root": root, "exp": exp, "pkg": pkg, "old": old, "wav": wav}


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _transcribe(capsys, model: Path, wav: Path, *extra) -> tuple[int, str, str]:
    rc = cli(["transcribe", "--model", str(model), *extra, str(wav)])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------------------ payloads
def test_old_package_with_a_payload_runs_nothing_with_or_without_the_opt_in(world, tmp_path):
    """(a) The issue's package, through the real command line (a subprocess)."""
    marker = tmp_path / "MARKER"
    pkg = _copy(world["old"], tmp_path / "evil_pkg")
    torch.save(_evil_state(marker), pkg / "model.pt")
    cmd = [sys.executable, "-m", "asrkit", "transcribe", "--model", str(pkg), str(world["wav"])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=HT.env())
    line = _one_line(r.stderr)
    assert r.returncode == 2 and not marker.exists()
    assert str(pkg / "model.pt") in line and "--allow-pickle" in line and "format 1" in line
    r = subprocess.run(cmd + ["--allow-pickle"], capture_output=True, text=True, timeout=120, env=HT.env())
    line = _one_line(r.stderr)
    assert r.returncode == 2 and not marker.exists()  # the opt-in still reads data only
    assert str(pkg / "model.pt") in line and "posix.system" in line and "refused" in line
    # a plain pickle (not torch's zip format) with the same payload, and the conversion command
    with open(pkg / "model.pt", "wb") as f:
        pickle.dump(_evil_state(marker), f)
    import asrkit

    with pytest.raises(ValueError, match="names posix.system"):
        asrkit.load_model(pkg, allow_pickle=True)
    assert cli(["export", "--exp-dir", str(pkg), "--out", str(tmp_path / "conv"), "--allow-pickle"]) == 2
    assert not marker.exists() and not (tmp_path / "conv").exists()


def test_checkpoint_payloads_run_nothing_in_transcribe_decode_average(world, tmp_path, capsys):
    """(c) averaging, (d) asrkit decode, and an experiment dir given to transcribe / export."""
    marker = tmp_path / "MARKER"
    exp = _copy(world["exp"], tmp_path / "recipe" / "exp" / "evil")
    good = exp / "checkpoints" / "step-00000001.pt"
    bad = exp / "checkpoints" / "step-00000002.pt"
    torch.save({**_evil_state(marker), "step": 2}, bad)  # the newest: what last / decode picks
    (exp / "checkpoints" / "index.json").unlink()
    for argv, prog in ((["decode", "--exp-dir", str(exp), "--sets", "test", "--checkpoint", str(bad)], "decode"),
                       (["transcribe", "--model", str(exp), "--checkpoint", str(bad), str(world["wav"])], "transcribe"),
                       (["export", "--exp-dir", str(exp), "--checkpoint", str(bad), "--out", str(tmp_path / "p")],
                        "export")):
        assert cli(argv) == 2, prog
        line = _one_line(capsys.readouterr().err)
        assert line.startswith(f"asrkit {prog}: error: checkpoint {bad} is refused"), line
        assert "posix.system" in line and not marker.exists()
    # averaging: two epoch checkpoints, the newer one the payload
    (exp / "checkpoints" / "epoch-0001.pt").write_bytes(good.read_bytes())
    torch.save({**_evil_state(marker), "step": 3, "epoch": 2}, exp / "checkpoints" / "epoch-0002.pt")
    assert cli(["average", "--exp-dir", str(exp), "--num", "2", "--by", "last"]) == 1
    err = capsys.readouterr().err
    line = _one_line("\n".join(ln for ln in err.splitlines() if "WARNING" not in ln))  # (+ the index's warning)
    assert "epoch-0002.pt is refused" in line and "posix.system" in line and not marker.exists()
    assert not (exp / "checkpoints" / "averaged.pt").exists()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return HT.build_corpus(tmp_path_factory.mktemp("safe_corpus"), n_train=8, n_dev=2)


def _train_error(exp: Path) -> str:
    errors = [ln for ln in (exp / "train.log").read_text().splitlines() if "ERROR" in ln]
    assert len(errors) == 1 and "Traceback" not in (exp / "train.log").read_text(), errors
    return errors[0]


def test_init_from_and_resume_payloads_run_nothing(corpus, tmp_path):
    """(b) train.init_from and (e) a resume: both refused before any step, one logged line."""
    marker = tmp_path / "MARKER"
    src = tmp_path / "src"
    (src / "checkpoints").mkdir(parents=True)
    evil = src / "checkpoints" / "step-00000005.pt"
    torch.save(_evil_state(marker), evil)
    exp = tmp_path / "exp"
    assert HT.run_inprocess(exp, HT.overrides(corpus, train__init_from=str(evil))) == 1
    line = _train_error(exp)
    assert f"train.init_from={evil}: checkpoint {evil} is refused" in line and "posix.system" in line
    assert not marker.exists() and not (exp / "checkpoints").exists()
    for spec in (str(src),):  # the experiment dir as the source: its newest checkpoint, the same refusal
        exp2 = tmp_path / "exp2"
        assert HT.run_inprocess(exp2, HT.overrides(corpus, train__init_from=spec)) == 1
        assert "is refused" in _train_error(exp2) and not marker.exists()
    # resume: the experiment dir's only checkpoint is the payload
    exp3 = tmp_path / "exp3"
    (exp3 / "checkpoints").mkdir(parents=True)
    torch.save(_evil_state(marker), exp3 / "checkpoints" / "step-00000003.pt")
    assert HT.run_inprocess(exp3, HT.overrides(corpus)) == 1
    line = _train_error(exp3)
    assert "cannot resume: checkpoint" in line and "step-00000003.pt is refused" in line and "move it out of" in line
    assert not marker.exists() and (exp3 / "checkpoints" / "step-00000003.pt").exists()


def test_checkpoints_are_data_and_old_ones_still_resume(corpus, tmp_path):
    """A checkpoint of a real run names no code (no global outside the allow-list: the RNG states
    are tensors); one written as asrkit did before (numpy's RNG keys as an array) still loads, and
    its RNG state restores numpy's generator exactly."""
    from asrkit.checkpoint import list_checkpoints, load_state, unsafe_globals
    from asrkit.training.state import set_rng_state

    exp = tmp_path / "exp"
    assert HT.run_inprocess(exp, HT.overrides(corpus, train__max_steps=2, train__ema_decay=0.9)) == 0
    ck = list_checkpoints(exp)[-1]
    assert torch.serialization.get_unsafe_globals_in_checkpoint(ck) == []
    st = load_state(ck)
    kind, keys, pos, *rest = st["rng"][0]["numpy"]
    assert isinstance(keys, torch.Tensor)
    old = dict(st)
    old["rng"] = [{**st["rng"][0], "numpy": (kind, keys.numpy().astype(np.uint32), pos, *rest)}]
    torch.save(old, tmp_path / "old.pt")
    assert unsafe_globals(tmp_path / "old.pt") == []  # numpy arrays: allowed (data)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "old.pt")  # (it does name numpy)
    for path in (ck, tmp_path / "old.pt"):
        set_rng_state(load_state(path)["rng"][0])
        a = np.random.random(5)
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, *rest))
        assert np.array_equal(a, np.random.random(5))


def test_cut_index_cache_is_never_unpickled(corpus, tmp_path):
    """The cut index caches beside the manifests: a pickle put in their place (or at the old
    .pkl names) is ignored and the cache rebuilt; nothing runs."""
    from asrkit.config import load_config
    from asrkit.data.cut_index import load_train_index
    from asrkit.tokenizer import load_tokenizer

    marker = tmp_path / "MARKER"
    cfg = load_config(HT.TINY, HT.overrides(corpus))
    tok = load_tokenizer(cfg.tokens.path)

    def index():
        return load_train_index(corpus["manifests"], "fx", ["train"], tok, cfg.features, cfg.frontend.stride)

    import shutil

    shutil.rmtree(corpus["manifests"] / ".index", ignore_errors=True)
    ref = index()
    caches = sorted((corpus["manifests"] / ".index").glob("*.idx"))
    assert len(caches) == 2  # the columns and the index
    for p in caches:
        with open(p, "wb") as f:
            pickle.dump({"version": 7, "index": Payload(marker)}, f)
        with open(p.with_suffix(".pkl"), "wb") as f:
            pickle.dump({"version": 6, "index": Payload(marker)}, f)
    again = index()
    assert list(again.ids) == list(ref.ids) and again.data_fingerprints == ref.data_fingerprints
    assert not marker.exists()
    assert all(p.read_bytes().startswith(b"ASRKITIDX") for p in caches)  # rebuilt as data


# ------------------------------------------------------------------ old packages, conversion
def test_old_package_loads_only_when_allowed_and_converts(world, tmp_path, capsys):
    rc, _, err = _transcribe(capsys, world["old"], world["wav"])
    assert rc == 2 and "--allow-pickle" in _one_line(err)
    rc, ref, _ = _transcribe(capsys, world["pkg"], world["wav"])
    assert rc == 0
    rc, out, _ = _transcribe(capsys, world["old"], world["wav"], "--allow-pickle")
    assert rc == 0 and out == ref
    conv = tmp_path / "conv"
    assert cli(["export", "--exp-dir", str(world["old"]), "--out", str(conv), "--allow-pickle"]) == 0
    capsys.readouterr()
    meta = json.loads((conv / "asrkit-model.json").read_text())
    assert meta["format"] == 2 and meta["converted"]["format"] == 1 and not (conv / "model.pt").exists()
    rc, out, _ = _transcribe(capsys, conv, world["wav"])
    assert rc == 0 and out == ref


# ------------------------------------------------------------------------ broken packages
def _rewrite_weights(pkg: Path, change) -> None:
    """Change the package's tensors with ``change(dict)`` and record the new file's CRC-32."""
    import zlib

    from safetensors.torch import load_file, save_file

    w = load_file(pkg / "model.safetensors")
    change(w)
    save_file(w, str(pkg / "model.safetensors"))
    meta = json.loads((pkg / "asrkit-model.json").read_text())
    meta["weights_crc32"] = f"{zlib.crc32((pkg / 'model.safetensors').read_bytes()):08x}"
    (pkg / "asrkit-model.json").write_text(json.dumps(meta))


def _edit_json(path: Path, change) -> None:
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))


def _no_checksum(pkg: Path) -> None:
    _edit_json(pkg / "asrkit-model.json", lambda m: m.pop("weights_crc32"))


def _truncate(p: Path, keep: float = 0.5) -> None:
    b = p.read_bytes()
    p.write_bytes(b[: int(len(b) * keep)])


def _other_arch(pkg: Path, world) -> None:
    exp = HI.random_exp(pkg.parent / "other_recipe", [t.replace("d_model=32", "d_model=48") for t in TINY])
    other = pkg.parent / "other_pkg"
    assert cli(["export", "--exp-dir", str(exp), "--out", str(other)]) == 0
    (pkg / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    _no_checksum(pkg)


def _other_tokenizer(pkg: Path, world) -> None:
    from asrkit.tokenizer import PhoneTokenizer, read_lexicon, save_tokenizer

    tok = PhoneTokenizer(read_lexicon(HI.ROOT / "tests" / "fixtures" / "lexicon" / "speechocean762_excerpt.txt"))
    save_tokenizer(tok, pkg / "tokenizer.json")
    _edit_json(pkg / "model.json", lambda m: m.update(vocab=list(tok.tokens)))


def _flip_header(pkg: Path, world) -> None:
    b = bytearray((pkg / "model.safetensors").read_bytes())
    b[8:24] = b"\xff" * 16  # inside the JSON header
    (pkg / "model.safetensors").write_bytes(bytes(b))
    _no_checksum(pkg)


BROKEN = {
    # name: (break the package, file named in the refusal, words of the refusal)
    "truncated weights": (lambda p, w: _truncate(p / "model.safetensors"), "model.safetensors", "CRC-32"),
    "truncated weights, no checksum": (lambda p, w: (_truncate(p / "model.safetensors"), _no_checksum(p)),
                                       "model.safetensors", "not a readable safetensors file"),
    "corrupt header": (_flip_header, "model.safetensors", "not a readable safetensors file"),
    "flipped weight bytes": (lambda p, w: (p / "model.safetensors").write_bytes(
        (p / "model.safetensors").read_bytes()[:-4] + b"\x00\x01\x02\x03"), "model.safetensors", "CRC-32"),
    "weights missing": (lambda p, w: (p / "model.safetensors").unlink(), "model.safetensors", "is missing"),
    "a tensor missing": (lambda p, w: _rewrite_weights(p, lambda t: t.pop("ctc_head.bias")), "model.safetensors",
                         "1 weight(s) missing (e.g. ctc_head.bias)"),
    "a tensor of another type": (lambda p, w: _rewrite_weights(p, lambda t: t.update(
        {"ctc_head.bias": t["ctc_head.bias"].long()})), "model.safetensors", "another type (ctc_head.bias: torch.int64"),
    "another architecture": (_other_arch, "model.safetensors", "of another shape"),
    "vocabulary vs output layer": (_other_tokenizer, "model.safetensors", "its output layer has 29 rows, the vocabulary 23 tokens"),
    "tokenizer vs vocabulary": (lambda p, w: _edit_json(p / "model.json", lambda m: m["vocab"].append("x")),
                                "tokenizer.json", "differs from the one the model was trained with"),
    "meta not JSON": (lambda p, w: (p / "asrkit-model.json").write_text('{"format": 2,'), "asrkit-model.json",
                      "not valid JSON (line 1"),
    "model.json truncated": (lambda p, w: _truncate(p / "model.json"), "model.json", "not valid JSON"),
    "vocab missing": (lambda p, w: _edit_json(p / "model.json", lambda m: m.pop("vocab")), "model.json",
                      "lacks 'vocab'"),
    "vocab a string": (lambda p, w: _edit_json(p / "model.json", lambda m: m.update(vocab="abc")), "model.json",
                       "'vocab' is a str"),
    "config a list": (lambda p, w: _edit_json(p / "model.json", lambda m: m.update(config=[1])), "model.json",
                      "'config' is a list"),
    "config value of the wrong type": (lambda p, w: _edit_json(
        p / "model.json", lambda m: m["config"]["encoder"].update(d_model="big")), "model.json", "encoder.d_model"),
    "path out of the package": (lambda p, w: _edit_json(
        p / "model.json", lambda m: m["config"]["tokens"].update(path="../recipe/data/tokens/letters.json")),
                                "model.json", "leads out of the package"),
    "unknown format": (lambda p, w: _edit_json(p / "asrkit-model.json", lambda m: m.update(format="two")),
                       "asrkit-model.json", "unknown package format 'two'"),
    "newer asrkit": (lambda p, w: _edit_json(p / "asrkit-model.json", lambda m: m.update(format=3, asrkit_version="9.0")),
                     "asrkit-model.json", "package format 3, written by a newer asrkit (9.0)"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_every_broken_package_is_one_line_naming_the_file(world, tmp_path, capsys, name):
    brk, file, words = BROKEN[name]
    pkg = _copy(world["pkg"], tmp_path / "pkg")
    brk(pkg, world)
    capsys.readouterr()
    rc, out, err = _transcribe(capsys, pkg, world["wav"])
    line = _one_line(err)
    assert rc == 2 and out == ""
    assert line.startswith("asrkit transcribe: error: ") and file in line and words in line, line


def test_broken_checkpoints_are_one_line(world, tmp_path, capsys):
    """A truncated checkpoint, one that is not a dict, one without its vocabulary, and another
    model's weights, given to decode / transcribe / train.init_from."""
    from asrkit.training import TrainingError
    from asrkit.training.init_from import init_weights

    exp = _copy(world["exp"].parent.parent, tmp_path / "recipe") / "exp" / world["exp"].name
    ck = exp / "checkpoints" / "step-00000001.pt"
    good = ck.read_bytes()
    st = torch.load(ck, weights_only=True)
    cases = [
        (lambda: ck.write_bytes(good[: len(good) // 2]), "is truncated or corrupt, or not a PyTorch file"),
        (lambda: torch.save([1, 2], ck), "holds a list, not an asrkit checkpoint"),
        (lambda: torch.save({k: v for k, v in st.items() if k != "vocab"}, ck), "lacks vocab"),
        (lambda: torch.save({**st, "model": {**st["model"], "ctc_head.weight": torch.zeros(30, 32)}}, ck),
         "its output layer has 30 rows"),
    ]
    for brk, words in cases:
        brk()
        for argv in (["decode", "--exp-dir", str(exp), "--sets", "test"],
                     ["transcribe", "--model", str(exp), str(world["wav"])]):
            assert cli(argv) == 2
            line = _one_line(capsys.readouterr().err)
            assert str(ck) in line and words in line, line
    ck.write_bytes(good[: len(good) // 2])
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TrainingError, match=f"train.init_from={ck}: checkpoint {ck} is truncated or corrupt"):
        init_weights(str(ck), model, list(st["vocab"]))
