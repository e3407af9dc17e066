"""``transcribe``: speed, memory and accuracy of ``asrkit transcribe``, ONNX and sherpa-onnx.

    asrkit export --exp-dir exp/train --out model --onnx decode.method=wfst decode.lm=data/lm/graph_letters_1gram decode.lm_weight=0.2
    python -m asrkit.bench transcribe --model model --recipe . [--threads 2] [--out bench_transcribe.md]

(run from ``egs/mini/asr1`` after ``run.sh``; ``--model`` is a package written with ``--onnx``,
``--recipe`` the recipe dir whose ``data/manifests`` hold the test sets.) Figures:

* **load**: seconds to ``import asrkit.inference`` and to ``load_model(MODEL)`` (fresh process).
* **short files**: real-time factor (wall / audio seconds) of ``Transcriber.transcribe`` over the
  audio files of ``--test-set`` (files read from disk, batch ``--batch-size``), fresh process,
  after one warm-up file.
* **one-hour file**: a WAV of ``--hour-min`` minutes made of the recordings of ``--hour-set``
  (end to end, same RMS level, repeated as needed) transcribed in chunks: RTF, WER, and peak
  memory (the process's high-water RSS ``ru_maxrss``, and how much of it came after loading the
  model and transcribing one short file).
* **ONNX vs PyTorch**: seconds of the acoustic model alone (filterbank computed beforehand,
  CMVN included) over the test set, one utterance at a time, PyTorch ``model.encode`` vs the
  package's ``model.onnx`` in onnxruntime, same threads, each in a fresh process.
* **sherpa-onnx vs asrkit**: WER on the whole test set of ``sherpa_onnx.OfflineRecognizer`` (the
  package's ONNX model, greedy search, its own feature extraction) vs asrkit's greedy decoding of
  the same model, and the feature gap (:func:`asrkit.inference.sherpa.feature_gap`).
* **chunked vs whole**: WER on ``--longform-set`` decoded whole and in chunks of ``--chunks``
  (``chunk_s/overlap_s``), with the package's decoding method and with greedy decoding.

Timings need a quiet machine (workers are fresh processes with ``--threads`` threads).
"""
from __future__ import annotations

import argparse

from asrkit.cliargs import Parser
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cuts(spec: dict, part: str) -> list:
    from asrkit.data.manifests import load_cuts

    return list(load_cuts(Path(spec["recipe"]) / "data" / "manifests", spec["corpus"], part))


def _text(cut) -> str:
    return " ".join(s.text for s in cut.supervisions if s.text)


def _wer(pairs: list[dict], corpus: str) -> float:
    from asrkit.scoring import score_pairs
    from asrkit.textnorm import NORMALIZERS

    return score_pairs(pairs, normalizer=corpus if corpus in NORMALIZERS else "none").wer


# ------------------------------------------------------------------------------------ workers
def _load_worker(spec: dict) -> dict:
    t0 = time.perf_counter()
    import torch

    import asrkit.inference as inf

    torch.set_num_threads(spec["threads"])
    t1 = time.perf_counter()
    inf.load_model(spec["model"])
    return {"import_s": t1 - t0, "load_s": time.perf_counter() - t1}


def _short_worker(spec: dict) -> dict:
    import torch

    from asrkit.inference import load_model

    torch.set_num_threads(spec["threads"])
    m = load_model(spec["model"], batch_size=spec["batch_size"], decode=spec.get("decode"))
    files = spec["files"]
    m.transcribe(files[0])  # warm-up
    t = time.perf_counter()
    res = m.transcribe(files)
    wall = time.perf_counter() - t
    audio = sum(r.duration for r in res)
    return {"files": len(files), "audio_s": audio, "wall_s": wall, "rtf": wall / audio}


def _hour_worker(spec: dict) -> dict:
    import torch

    from asrkit.inference import load_model

    torch.set_num_threads(spec["threads"])
    m = load_model(spec["model"], batch_size=spec["batch_size"], decode=spec.get("decode"))
    m.transcribe(spec["warmup"])
    base = _rss()
    t = time.perf_counter()
    r = m.transcribe(spec["wav"])
    wall = time.perf_counter() - t
    return {"audio_s": r.duration, "wall_s": wall, "rtf": wall / r.duration, "peak_rss_mb": _peak() / 2**20,
            "rss_after_load_mb": base / 2**20, "hyp": r.text}


def _acoustic_worker(spec: dict) -> dict:
    import numpy as np
    import torch

    from asrkit.data.features import cmvn
    from asrkit.inference.package import load_package

    torch.set_num_threads(spec["threads"])
    feats = [torch.from_numpy(np.load(p)) for p in spec["feats"]]
    model, cfg, _, _ = load_package(spec["model"])
    hop = cfg.features.hop
    if spec["engine"] == "onnx":
        from asrkit.inference.onnx import session

        sess = session(Path(spec["model"]) / "model.onnx", spec["threads"])

        def run(f):
            sess.run(None, {"x": f[None].numpy(), "x_lens": np.array([f.shape[0]], dtype=np.int64)})
    else:
        def run(f):
            with torch.no_grad():
                x = cmvn(f) if cfg.features.cmvn else f
                model.encode(x[None], torch.tensor([x.shape[0]]), (torch.arange(x.shape[0]) * hop)[None])
    run(feats[0])
    t = time.perf_counter()
    for f in feats:
        run(f)
    return {"wall_s": time.perf_counter() - t}


def _run(name: str, spec: dict, timeout: float = 7200) -> Optional[dict]:
    cmd = [sys.executable, "-m", "asrkit.bench", "--worker", f"{__name__}:{name}", json.dumps(spec)]
    n = str(spec["threads"])
    env = dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        print(f"  [{name}] failed:\n{p.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------- main
def _one_hour(cuts: list, minutes: float, out: Path) -> tuple[Path, str]:
    """A WAV of ``minutes`` made of ``cuts`` (repeated as needed) end to end, each brought to the
    same RMS level (one recording session), and its reference text. (No digital silence between
    them: a stretch of exact zeros sits at the filterbank's floor and skews a chunk's CMVN.)"""
    import numpy as np
    import soundfile as sf

    from asrkit.data.audio import load_cut_audio

    sr = cuts[0].sampling_rate
    need, n, texts = int(minutes * 60 * sr), 0, []
    with sf.SoundFile(out, "w", sr, 1, subtype="PCM_16") as f:
        while n < need:
            for c in cuts:
                x = load_cut_audio(c)
                x = x * (0.05 / max(float(np.sqrt(np.mean(x ** 2))), 1e-6))
                f.write(x)
                n += x.size
                texts.append(_text(c))
                if n >= need:
                    break
    return out, " ".join(texts)


def main(argv: list[str]) -> int:
    p = Parser(prog="python -m asrkit.bench transcribe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=Path, help="a package written by asrkit export --onnx")
    p.add_argument("--recipe", type=Path, default=Path("."), help="recipe dir (data/manifests)")
    p.add_argument("--test-set", default="test", help="short-utterance set of the recipe to transcribe (default: %(default)s)")
    p.add_argument("--longform-set", default="test-longform", help="long-form set of the recipe (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="batch size of the batched measurement (default: %(default)s)")
    p.add_argument("--hour-min", type=float, default=60.0, help="length of the long file (minutes)")
    p.add_argument("--hour-set", default="test-longform", help="corpus part the long file is made of")
    p.add_argument("--chunks", nargs="+", default=["30/6", "20/4", "10/2"], help="chunk_s/overlap_s settings")
    p.add_argument("--skip", nargs="*", default=[], choices=["load", "short", "hour", "onnx", "sherpa", "chunks"], help="measurements to leave out (default: none)")
    p.add_argument("--out", type=Path, help="also write the Markdown report here (+ .json)")
    args = p.parse_args(argv)

    import numpy as np

    from asrkit.inference import load_model

    model = load_model(args.model)
    corpus = model.cfg.data.corpus
    spec = {"model": str(args.model.resolve()), "recipe": str(args.recipe.resolve()), "corpus": corpus,
            "threads": args.threads, "batch_size": args.batch_size}
    test = _cuts(spec, args.test_set)
    rows: list[str] = [f"# asrkit transcribe benchmark: {args.model} ({model.cfg.decode.method}), "
                       f"{args.threads} threads", ""]
    res: dict = {}
    with tempfile.TemporaryDirectory(prefix="asrkit-bench-") as tmp:
        tmp = Path(tmp)
        files = [str(c.recording.sources[0].source) for c in test]
        if "load" not in args.skip:
            r = res["load"] = _run("_load_worker", spec)
            if r:
                rows.append(f"- model load: {r['load_s']:.2f} s (import asrkit.inference: {r['import_s']:.2f} s)")
        if "short" not in args.skip:
            for method in dict.fromkeys([model.cfg.decode.method, "greedy"]):
                r = res[f"short_{method}"] = _run("_short_worker", {**spec, "files": files, "decode": {"method": method}})
                if r:
                    rows.append(f"- short files ({args.test_set}, {r['files']} files, {r['audio_s'] / 60:.1f} min, "
                                f"{method}): RTF {r['rtf']:.4f}")
        if "hour" not in args.skip:
            wav, ref = _one_hour(_cuts(spec, args.hour_set), args.hour_min, tmp / "hour.wav")
            r = res["hour"] = _run("_hour_worker", {**spec, "wav": str(wav), "warmup": files[0]})
            if r:
                wer = _wer([{"id": "hour", "ref": ref, "hyp": r.pop("hyp"), "duration": r["audio_s"]}], corpus)
                r["wer"] = wer
                rows.append(f"- {args.hour_min:g}-minute file: RTF {r['rtf']:.4f}, peak RSS {r['peak_rss_mb']:.0f} MB "
                            f"({r['peak_rss_mb'] - r['rss_after_load_mb']:.0f} MB above the loaded model), "
                            f"WER {wer:.2f} %")
        if "onnx" not in args.skip and (args.model / "model.onnx").is_file():
            from asrkit.inference.onnx import raw_fbank
            from asrkit.data.audio import load_cut_audio

            paths = []
            for i, c in enumerate(test):
                paths.append(str(tmp / f"f{i}.npy"))
                np.save(paths[-1], raw_fbank(load_cut_audio(c), model.cfg).numpy())
            pt = _run("_acoustic_worker", {**spec, "feats": paths, "engine": "pytorch"})
            ox = _run("_acoustic_worker", {**spec, "feats": paths, "engine": "onnx"})
            res["onnx"] = {"pytorch_s": pt and pt["wall_s"], "onnxruntime_s": ox and ox["wall_s"]}
            if pt and ox:
                rows.append(f"- acoustic model over {args.test_set}: PyTorch {pt['wall_s']:.2f} s, onnxruntime "
                            f"{ox['wall_s']:.2f} s (onnxruntime / PyTorch {ox['wall_s'] / pt['wall_s']:.2f})")
    if "sherpa" not in args.skip and (args.model / "model.onnx").is_file():
        from asrkit.data.audio import load_cut_audio
        from asrkit.inference import sherpa

        audio = [load_cut_audio(c) for c in test]
        rec = sherpa.recognizer(args.model / "model.onnx", args.model / "tokens.txt", threads=args.threads)
        hyp_sh = sherpa.transcribe(rec, [(x, model.sample_rate) for x in audio])
        greedy = load_model(args.model, decode={"method": "greedy"})
        hyp_ak = [t.text for t in greedy.transcribe(audio, sample_rate=model.sample_rate)]
        pairs = lambda hyps: [{"id": c.id, "ref": _text(c), "hyp": h, "duration": c.duration}  # noqa: E731
                              for c, h in zip(test, hyps)]
        w_sh, w_ak = _wer(pairs(hyp_sh), corpus), _wer(pairs(hyp_ak), corpus)
        gap = sherpa.feature_gap(audio, model.cfg)
        same = sum(a == b for a, b in zip(hyp_sh, hyp_ak))
        res["sherpa"] = {"wer_sherpa": w_sh, "wer_asrkit_greedy": w_ak, "identical": same, "n": len(test), "gap": gap}
        rows.append(f"- sherpa-onnx vs asrkit greedy on {args.test_set} ({len(test)} utterances): WER {w_sh:.2f} % vs "
                    f"{w_ak:.2f} % ({w_sh - w_ak:+.2f}), identical transcripts {same}/{len(test)}; features: "
                    f"{100 * gap['floored_fraction']:.2f} % of bins at the knf floor, mean |diff| after CMVN "
                    f"{gap['cmvn_mean_abs_diff']:.1e}")
    if "chunks" not in args.skip:
        from asrkit.data.audio import load_cut_audio

        lf = _cuts(spec, args.longform_set)
        audio = [load_cut_audio(c) for c in lf]
        longest = max(c.duration for c in lf)
        settings = [("whole", longest + 1, 0.0)] + [(s, float(s.split("/")[0]), float(s.split("/")[1])) for s in args.chunks]
        rows += ["", f"WER on {args.longform_set} ({len(lf)} files, {min(c.duration for c in lf):.0f}-{longest:.0f} s):", "",
                 "| decoding | " + " | ".join(n for n, _, _ in settings) + " |", "|---" * (len(settings) + 1) + "|"]
        res["chunks"] = {}
        for method in dict.fromkeys([model.cfg.decode.method, "greedy"]):
            cells = []
            for name, chunk_s, overlap_s in settings:
                m = load_model(args.model, decode={"method": method}, chunk_s=chunk_s, overlap_s=overlap_s,
                               batch_size=args.batch_size)
                hyps = [t.text for t in m.transcribe(audio, sample_rate=lf[0].sampling_rate)]
                w = _wer([{"id": c.id, "ref": _text(c), "hyp": h, "duration": c.duration} for c, h in zip(lf, hyps)], corpus)
                res["chunks"][f"{method} {name}"] = w
                cells.append(f"{w:.2f}")
            rows.append(f"| {method} | " + " | ".join(cells) + " |")
    report = "\n".join(rows) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)
        args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    return 0
