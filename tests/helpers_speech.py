"""Real (synthetic) speech for the learning tests: a handful of espeak-ng utterances made by
``asrkit synth`` (:mod:`asrkit.data.synth`), prepared by the mini corpus' own preparation
(Lhotse's LibriSpeech recipe), a letters tokenizer, and runners of ``asrkit train`` /
``asrkit decode`` on them.

The utterances are English sentences of 3-10 words from 10 synthetic speakers; their
transcripts are what espeak-ng was asked to say, so the truth is known without any of asrkit's
own code. :func:`wer` scores with ``jiwer`` (a reference tool), not with asrkit's scorer.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import helpers_train as H

ROOT = H.ROOT
CTC_CONF = ROOT / "conf" / "ctc_tiny.yaml"
ATT_CONF = ROOT / "conf" / "conv_small.yaml"


def speech_corpus(root: Path, seed: int = 3, train_hours: float = 0.006) -> dict:
    """Synthesize and prepare the ``train`` part of a mini corpus (``train_hours=0.006``: 10
    utterances, 22 s, 64 words with seed 3) under ``root``; a letters tokenizer. Returns paths."""
    from asrkit.data.librispeech import prepare_mini
    from asrkit.tokenizer import CharTokenizer, save_tokenizer

    root = Path(root)
    prepare_mini(root / "corpus", root / "manifests", parts=["train"], num_jobs=1, seed=seed,
                 train_hours=train_hours, dev_minutes=0, test_minutes=0, longform_minutes=0)
    save_tokenizer(CharTokenizer(), root / "tokens.json")
    corpus = {"root": root, "manifests": root / "manifests", "tokens": root / "tokens.json"}
    equal_length_part(corpus)
    return corpus


def equal_length_part(corpus: dict, seconds: float = 3.8, seed: int = 0) -> None:
    """Part ``fixed``: every ``train`` recording placed at a random offset in ``seconds`` of
    background (Gaussian noise at the level of its first 30 ms, which hold only the synthesizer's
    noise floor). All inputs then have the same length: a model can tell the utterances apart
    only by listening (10 utterances of 10 different lengths can be memorized by their length
    and frame positions alone, even from all-zero features)."""
    import numpy as np
    import soundfile as sf
    from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet

    from asrkit.data.manifests import load_cuts, write_part

    rng = np.random.default_rng(seed)
    out = Path(corpus["root"]) / "fixed"
    out.mkdir(parents=True, exist_ok=True)
    recs, sups = [], []
    for cut in sorted(load_cuts(corpus["manifests"], "mini", "train"), key=lambda c: c.id):
        x = cut.load_audio()[0].astype(np.float64)
        sr = cut.sampling_rate
        floor = float(np.sqrt(np.mean(x[: int(0.03 * sr)] ** 2)))
        slack = int(seconds * sr) - x.size
        assert slack >= 0, f"{cut.id} is longer than {seconds} s"
        lead = int(rng.integers(0, slack + 1))
        y = np.concatenate([rng.normal(0, floor, lead), x, rng.normal(0, floor, slack - lead)])
        path = out / f"{cut.id}.flac"
        sf.write(path, y.astype(np.float32), sr)
        rec = Recording.from_file(path, recording_id=cut.id)
        recs.append(rec)
        sups.append(SupervisionSegment(id=cut.id, recording_id=cut.id, start=0.0, duration=rec.duration,
                                       text=cut.supervisions[0].text, speaker=cut.supervisions[0].speaker))
    write_part(corpus["manifests"], "mini", "fixed", RecordingSet.from_recordings(recs),
               SupervisionSet.from_segments(sups))


def overrides(corpus: dict, **kw) -> list[str]:
    """Settings shared by every run on the speech corpus: the whole set in one or two batches
    per epoch, no SpecAugment (to overfit), no step checkpoints; ``kw`` as in
    :func:`helpers_train.overrides` (``optim__lr=0.1``)."""
    o = {
        "data.manifest_dir": str(corpus["manifests"]), "data.corpus": "mini", "data.train_sets": "[fixed]",
        "data.dev_set": "", "data.max_duration": 100, "data.num_buckets": 2, "data.num_workers": 0,
        "tokens.path": str(corpus["tokens"]), "specaug.enabled": "false", "train.device": "cpu",
        "train.threads": 1, "train.ckpt_every_steps": 0, "train.log_interval": 10, "train.max_epochs": 1000,
    }
    o.update({k.replace("__", "."): v for k, v in kw.items()})
    return [f"{k}={v}" for k, v in o.items()]


_restored_logging_and_threads = H.restored_logging_and_threads


def train(exp: Path, config: Path, ovr: list[str]) -> int:
    """``asrkit train`` in this process."""
    from asrkit.training import command

    with _restored_logging_and_threads():
        return command.main(["--config", str(config), "--exp-dir", str(exp)] + list(ovr))


def decode(exp: Path, *args: str) -> list[dict]:
    """``asrkit decode`` of the ``fixed`` part in this process (no scoring); its hypotheses."""
    from asrkit.decode import run

    with _restored_logging_and_threads():
        assert run.main(["--exp-dir", str(exp), "--sets", "fixed", "--no-score", *args]) == 0
    return hyps(Path(exp) / "decode_fixed")


def decode_cmd(exp: Path, *args: str) -> list[str]:
    """Command line of ``asrkit decode`` on the ``fixed`` part of ``exp``'s corpus."""
    return [sys.executable, "-m", "asrkit", "decode", "--exp-dir", str(exp), "--sets", "fixed", *args]


def hyps(decode_dir: Path) -> list[dict]:
    """The lines of ``hyp.jsonl`` in file order."""
    return [json.loads(line) for line in (Path(decode_dir) / "hyp.jsonl").read_text().splitlines()]


def wer(rows: list[dict]) -> float:
    """Corpus WER in percent by jiwer (reference tool) over ``{"ref", "hyp"}`` rows."""
    import jiwer

    return 100.0 * jiwer.wer([r["ref"] for r in rows], [r["hyp"] for r in rows])
