"""``speed``: reading speed-perturbed audio, Lhotse's resampling against asrkit's.

    python -m asrkit.bench speed [--cuts CUTS] [--utts 200] [--factors 0.9 1.1] [--rounds 5] [--threads 2]

Reads the audio of the first ``--utts`` cuts of ``--cuts`` (default: the speechocean762 recipe's
training cuts) as training does on the fly (:func:`asrkit.data.audio.load_cut_audio`), in rows:
the cuts themselves, and for each factor Lhotse's copy (``cut.perturb_speed``: strided ``conv1d``)
and asrkit's (:func:`asrkit.data.speed.speed_copy`: the same filter as one matrix product); then
whole training batches of those cuts as the dataset makes them with ``--config``'s features and
``data.max_duration`` (audio, each utterance's epoch-1 factor among 1.0 and ``--factors``, fbank,
collation), once with each resampling. Each
round reads every row once, in a random order; a row's figure is its median audio-s/s over the
rounds, and the ratio asrkit / Lhotse is the median of the per-round ratios, so a slow spell of the
VM hits both sides of a ratio. It also checks that both copies give the same samples.
"""
from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from asrkit.cliargs import Parser

RECIPE = Path(__file__).resolve().parents[2] / "egs" / "speechocean762" / "asr1"
DEFAULT_CUTS = str(RECIPE / "data" / "manifests" / "speechocean762_cuts_train.jsonl.gz")
DEFAULT_CONFIG = str(RECIPE / "conf" / "train_espnet_equal.yaml")


def _lhotse_copy(cut, factor):
    return (cut.drop_features() if cut.has_features else cut).perturb_speed(factor)


def _using(resampler, fn):
    """``fn()`` with the dataset's speed copies made by ``resampler`` (asrkit's
    :func:`~asrkit.data.speed.speed_copy` or Lhotse's own)."""
    from asrkit.data import dataset

    keep, dataset.speed_copy = dataset.speed_copy, resampler
    try:
        return fn()
    finally:
        dataset.speed_copy = keep


def _batches(ds, batches) -> float:
    """Training batches as the dataset makes them (audio, speed perturbation, fbank, collation)."""
    t0 = time.perf_counter()
    for b in batches:
        ds[b]
    return time.perf_counter() - t0


def _read(cuts) -> float:
    from asrkit.data.audio import load_cut_audio

    t0 = time.perf_counter()
    for c in cuts:
        load_cut_audio(c)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    from lhotse import load_manifest_lazy

    from asrkit.data.audio import load_cut_audio
    from asrkit.data.dataset import AsrDataset
    from asrkit.data.speed import speed_copy
    from asrkit.tokenizer import CharTokenizer
    from asrkit.training.checks import load_config
    from asrkit.utils import cpu_model

    ap = Parser(prog="asrkit bench speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuts", default=DEFAULT_CUTS, help="a Lhotse cuts manifest with audio (default: %(default)s)")
    ap.add_argument("--utts", type=int, default=200, help="how many of its first cuts to read")
    ap.add_argument("--factors", type=float, nargs="+", default=[0.9, 1.1], help="speed factors")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each reads every row once")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (training's loader uses the training's)")
    ap.add_argument("--config", default=DEFAULT_CONFIG,
                    help="training config of the batch rows (its features, augment.speed, data.max_duration)")
    a = ap.parse_args(argv)
    if not Path(a.cuts).is_file():
        print(f"asrkit bench speed: no cuts manifest {a.cuts}: make it with "
              f"{RECIPE}/run.sh --stop_stage 1, or pass --cuts", flush=True)
        return 1
    torch.set_num_threads(a.threads)
    cuts = []
    for c in load_manifest_lazy(a.cuts):
        cuts.append(c)
        if len(cuts) == a.utts:
            break
    audio = sum(c.duration for c in cuts)
    rows = {"no perturbation": cuts}
    for f in a.factors:
        rows[f"{f:g}, Lhotse"] = [_lhotse_copy(c, f) for c in cuts]
        rows[f"{f:g}, asrkit"] = [speed_copy(c, f) for c in cuts]
        for x, y in zip(rows[f"{f:g}, Lhotse"][:20], rows[f"{f:g}, asrkit"][:20]):
            if not np.allclose(load_cut_audio(x), load_cut_audio(y), rtol=0, atol=1e-5):
                print(f"asrkit bench speed: {y.id}: asrkit's samples differ from Lhotse's", flush=True)
                return 1
    cfg = load_config(a.config, [f"augment.speed=[{','.join(f'{f:g}' for f in a.factors)}]"])
    ds = AsrDataset(CharTokenizer(), cfg.features, augment=cfg.augment, frontend_stride=cfg.frontend.stride)
    ds.set_epoch(1)  # the same factor per utterance for both sides
    batches, cur = [], []
    for c in cuts:  # consecutive cuts up to data.max_duration
        if cur and sum(x.duration for x in cur) + c.duration > cfg.data.max_duration:
            batches.append(cur)
            cur = []
        cur.append(c)
    batches.append(cur)
    x = _using(speed_copy, lambda: ds[batches[0]])
    y = _using(_lhotse_copy, lambda: ds[batches[0]])
    if not torch.allclose(x["feats"], y["feats"], atol=1e-3):
        print("asrkit bench speed: the batches' fbank differs between the two resamplings", flush=True)
        return 1
    runs = {n: (lambda r=r: _read(r)) for n, r in rows.items()}
    runs["training batches, Lhotse"] = lambda: _using(_lhotse_copy, lambda: _batches(ds, batches))
    runs["training batches, asrkit"] = lambda: _using(speed_copy, lambda: _batches(ds, batches))
    for r in rows.values():  # warm-up: files cached, resamplers built
        _read(r[:10])
    took = {n: [] for n in runs}
    rng = random.Random(0)
    for _ in range(a.rounds):
        order = list(runs)
        rng.shuffle(order)
        for n in order:
            took[n].append(runs[n]())
    print(f"{len(cuts)} utterances, {audio:.0f} s of audio, {a.threads} threads, {a.rounds} rounds; {cpu_model()}\n")
    print("| audio read | audio-s per s (median) | Lhotse time / asrkit time (median of rounds) |\n|---|---:|---:|")
    for n, t in took.items():
        ratio = ""
        if n.endswith("asrkit"):
            lh = took[n.replace("asrkit", "Lhotse")]
            ratio = f"{statistics.median(tl / ta for tl, ta in zip(lh, t)):.2f}x"
        print(f"| {n} | {audio / statistics.median(t):.0f} | {ratio} |")
    return 0
