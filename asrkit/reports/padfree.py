"""Measurements for padding-free training with a variable STFT hop (CAPE paper, appendix C.3).

    asrkit padfree hops      --synthetic wsj --out OUT        # Fig. 14: hop histogram
    asrkit padfree padding   --cuts CUTS.jsonl.gz --out OUT   # padding fraction per sampler
    asrkit padfree hop-curve --exp-dir EXP --set test --hops 5,8,10,12,15,20   # Fig. 17
    asrkit padfree bench-train --out OUT                      # train throughput, padded vs not

``hops`` and ``padding`` read cut metadata only (durations, sample counts), never audio, so they
run on real manifests (``--cuts``) or on synthetic durations drawn to match a corpus' statistics
(``--synthetic wsj|ted``: mean +- std of the training durations from the paper's Table 8).
``hop-curve`` decodes a test set once per inference hop (batch size 1) and writes the
throughput-vs-WER table and plot. ``bench-train`` times a few training steps of a tiny model on
synthetic audio with the padded and the padding-free pipeline.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from asrkit.reports.plots import save_png
from asrkit.utils import atomic_write

logger = logging.getLogger(__name__)

#: training-set duration statistics (mean, std seconds) from the CAPE paper, Table 8
CORPUS_DURATIONS = {"wsj": (7.8, 2.9), "ted": (6.0, 3.0)}


# ---------------------------------------------------------------------------- cuts


def synthetic_cuts(n: int, mean: float, std: float, seed: int = 0, sample_rate: int = 16000,
                   min_duration: float = 0.5, max_duration: float = 60.0):
    """Metadata-only cuts (no audio behind them) with gamma-distributed durations of the given
    mean and std, clipped to ``[min_duration, max_duration]``."""
    from lhotse import AudioSource, CutSet, MonoCut, Recording, SupervisionSegment

    rng = np.random.default_rng(seed)
    shape, scale = (mean / std) ** 2, std ** 2 / mean
    durs = np.clip(rng.gamma(shape, scale, size=n), min_duration, max_duration)
    cuts = []
    for i, d in enumerate(durs):
        ns = int(round(d * sample_rate))
        dur = ns / sample_rate
        rid = f"syn{i:06d}"
        rec = Recording(id=rid, sources=[AudioSource(type="file", channels=[0], source=f"/nonexistent/{rid}.wav")],
                        sampling_rate=sample_rate, num_samples=ns, duration=dur)
        sup = SupervisionSegment(id=rid, recording_id=rid, start=0.0, duration=dur, text="a")
        cuts.append(MonoCut(id=rid, start=0.0, duration=dur, channel=0, recording=rec, supervisions=[sup]))
    return CutSet.from_cuts(cuts)


def _load_cuts(args) -> tuple[object, str]:
    if args.cuts:
        from lhotse import load_manifest

        return load_manifest(args.cuts), str(args.cuts)
    mean, std = CORPUS_DURATIONS[args.synthetic]
    return (synthetic_cuts(args.num_utts, mean, std, seed=args.seed),
            f"synthetic {args.synthetic}-like durations ({mean} +- {std} s, {args.num_utts} utterances)")


# ---------------------------------------------------------------------------- hops (Fig. 14)


def epoch_hops(cuts, max_duration: float, seed: int = 0, epoch: int = 1, ref_hop: float = 0.010,
               world_size: int = 1) -> list[int]:
    """Hop in samples of every utterance in one epoch of :class:`PadFreeSampler` (all ranks)."""
    from asrkit.data.padfree import PadFreeSampler, plan_batch

    hops: list[int] = []
    for rank in range(world_size):
        s = PadFreeSampler(cuts, max_duration=max_duration, seed=seed, world_size=world_size, rank=rank, hop=ref_hop)
        for b in s.rank_batches(epoch):
            hops += plan_batch([s.cuts[i] for i in b], ref_hop=ref_hop).hops
    return hops


def plot_hop_histogram(hops_ms: dict[str, Sequence[float]], path: Path) -> Path:
    """One panel per label: share of utterances per hop (ms)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(hops_ms), 3.6))
    for k, (label, hops) in enumerate(hops_ms.items()):
        ax = fig.add_subplot(1, len(hops_ms), k + 1)
        cnt = Counter(round(float(h), 4) for h in hops)
        xs = sorted(cnt)
        ax.bar(xs, [100.0 * cnt[x] / len(hops) for x in xs], width=0.055, color="tab:purple")
        ax.axvline(10.0, color="gray", lw=0.8, ls="--")
        ax.set_xlabel("STFT hop (ms)")
        ax.set_ylabel("utterances (%)")
        ax.set_title(label, fontsize=9)
    fig.tight_layout()
    return save_png(fig, path)


def hop_summary(hops_samples: Sequence[int], sample_rate: int = 16000) -> dict:
    h = np.asarray(hops_samples, dtype=np.float64) * 1000.0 / sample_rate
    return {"utterances": int(h.size), "mean_ms": float(h.mean()), "std_ms": float(h.std()),
            "min_ms": float(h.min()), "max_ms": float(h.max()),
            "p5_ms": float(np.percentile(h, 5)), "p95_ms": float(np.percentile(h, 95)),
            "share_within_1ms_of_10": float(np.mean(np.abs(h - 10.0) <= 1.0 + 1e-9))}


# ---------------------------------------------------------------------------- padding fraction


def _padded_stats(batches, hop: float) -> dict:
    from asrkit.data.features import num_frames

    computed = real = nb = n_utts = 0
    for b in batches:
        n = [num_frames(c.num_samples, c.sampling_rate, hop) for c in b]
        computed += len(n) * max(n)
        real += sum(n)
        nb += 1
        n_utts += len(n)
    return {"batches": nb, "utterances": n_utts, "computed_frames": computed, "padding_frames": computed - real,
            "padding_fraction": (computed - real) / max(1, computed)}


def padding_fractions(cuts, max_duration: float, seed: int = 0, hop: float = 0.010, epoch: int = 1,
                      num_buckets: int = 30) -> dict[str, dict]:
    """Fraction of computed feature frames that are padding in one epoch, per sampler, from
    cut metadata only (frames at ``hop``; padding-free: frames after hop choice and dropping).

    Keys: ``padfree`` (:class:`PadFreeSampler`), ``lhotse_bucketing_default`` (Lhotse
    ``DynamicBucketingSampler`` with its default settings, shuffled), ``asrkit_bucketing``
    (:class:`asrkit.data.batching.BucketingSampler`, what ``data.sampler: bucketing`` trains with),
    ``asrkit_bucketing_sort`` (the same with ``data.bucket_order: sort``), ``simple_shuffled`` (Lhotse
    ``SimpleCutSampler``, shuffled)."""
    from lhotse.dataset import DynamicBucketingSampler, SimpleCutSampler

    from asrkit.data.batching import BucketingSampler
    from asrkit.data.features import num_frames
    from asrkit.data.padfree import PadFreeSampler, plan_batch

    out: dict[str, dict] = {}
    pf = PadFreeSampler(cuts, max_duration=max_duration, seed=seed, hop=hop)
    computed = stft = nb = n_utts = 0
    for b in pf.rank_batches(epoch):
        plan = plan_batch([pf.cuts[i] for i in b], ref_hop=hop)
        computed += len(plan.cuts) * plan.T
        stft += sum(plan.frames)
        nb += 1
        n_utts += len(plan.cuts)
    ref_frames = sum(num_frames(c.num_samples, c.sampling_rate, hop) for c in pf.cuts)
    out["padfree"] = {"batches": nb, "utterances": n_utts, "computed_frames": computed, "padding_frames": 0,
                      "padding_fraction": 0.0, "stft_frames": stft,
                      "dropped_frames": stft - computed, "dropped_fraction": (stft - computed) / max(1, stft),
                      "frames_vs_10ms": computed / max(1, ref_frames)}
    with warnings.catch_warnings():  # "eagerly read CutSet": irrelevant here
        warnings.filterwarnings("ignore", message=".*eagerly read CutSet.*")
        samplers = {
            "lhotse_bucketing_default": DynamicBucketingSampler(cuts, max_duration=max_duration, shuffle=True, seed=seed),
            "asrkit_bucketing": BucketingSampler(cuts, max_duration=max_duration, num_buckets=num_buckets, seed=seed),
            "asrkit_bucketing_sort": BucketingSampler(cuts, max_duration=max_duration, num_buckets=num_buckets,
                                                      seed=seed, order="sort"),
            "simple_shuffled": SimpleCutSampler(cuts, max_duration=max_duration, shuffle=True, seed=seed),
        }
    for name, s in samplers.items():
        s.set_epoch(epoch)
        out[name] = _padded_stats(s, hop)
    return out


def format_padding_table(res: dict[str, dict], where: str, max_duration: float) -> str:
    names = {"padfree": "padding-free (PadFreeSampler + variable hop)",
             "lhotse_bucketing_default": "Lhotse DynamicBucketingSampler, defaults (10 buckets), shuffled",
             "asrkit_bucketing": "asrkit's BucketingSampler (data.sampler: bucketing, 30 buckets), shuffled",
             "asrkit_bucketing_sort": "asrkit's BucketingSampler, 30 buckets, data.bucket_order: sort",
             "simple_shuffled": "Lhotse SimpleCutSampler, shuffled"}
    lines = [f"Padding in one epoch: {where}; max_duration {max_duration:g} s per batch; frames at a 10 ms hop.", "",
             "| sampler | batches | utts/batch | computed frames | padding frames | padding % |",
             "|---|---:|---:|---:|---:|---:|"]
    for k, r in res.items():
        lines.append(f"| {names.get(k, k)} | {r['batches']} | {r['utterances'] / max(1, r['batches']):.1f} | "
                     f"{r['computed_frames']} | {r['padding_frames']} | {100 * r['padding_fraction']:.2f} |")
    p = res.get("padfree")
    if p:
        lines += ["", f"Padding-free: {100 * p['dropped_fraction']:.2f} % of the STFT frames computed are dropped to "
                      f"equalize frame counts; frames fed to the model = {p['frames_vs_10ms']:.3f} x those at a 10 ms hop."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- hop curve (Fig. 17)


def hop_curve(exp_dir: Path, set_name: str, hops_ms: Sequence[float], checkpoint: str = "last",
              device: str = "cpu", manifest_dir: Optional[str] = None, max_utts: int = 0,
              norm: Optional[str] = None, overrides: Sequence[str] = ()) -> list[dict]:
    """Decode ``set_name`` (batch size 1) once per hop; return rows ``{hop_ms, wer, throughput,
    model_throughput, rtf, audio_seconds, wall_seconds, dir}`` (throughput = audio s / wall s).
    ``overrides`` are ``decode.*=value`` settings (e.g. the recipe's WFST decoding), applied to
    every hop, so the curve is measured with the decoder the recipe reports."""
    from asrkit.data.manifests import load_cuts
    from asrkit.config import with_overrides
    from asrkit.decode.run import decode_set, load_model, parse_decode_overrides
    from asrkit.scoring import score_dir
    from asrkit.textnorm import corpus_normalizer

    pairs = parse_decode_overrides(list(overrides))  # a typo fails before the model is loaded
    model, cfg, tok = load_model(exp_dir, checkpoint, device)
    cuts = load_cuts(manifest_dir or cfg.data.manifest_dir, cfg.data.corpus, set_name)
    if max_utts:
        cuts = cuts.subset(first=max_utts)
    norm = norm or corpus_normalizer(cfg.data.corpus)
    rows = []
    for h in hops_ms:
        c = with_overrides(cfg, [*pairs, ("decode.hop", h / 1000.0), ("decode.batch_size", 1)])
        out = exp_dir / f"decode_{set_name}_hop{h:g}ms"
        info = decode_set(model, c, tok, cuts, out, set_name, hop=h / 1000.0)
        res = score_dir(out, bins=c.decode.bins, normalizer=norm)
        rows.append({"hop_ms": float(h), "wer": res.wer, "throughput": info["audio_seconds"] / max(1e-9, info["wall_seconds"]),
                     "model_throughput": 1.0 / max(1e-12, info["model_rtf"]), "rtf": info["rtf"],
                     "audio_seconds": info["audio_seconds"], "wall_seconds": info["wall_seconds"], "dir": str(out)})
    return rows


def write_hop_curve(rows: list[dict], out_md: Path, out_png: Path, title: str = "") -> None:
    lines = [f"# Throughput vs WER by inference STFT hop{': ' + title if title else ''}", "",
             "Batch size 1; throughput = audio seconds / wall seconds (whole decode; model only in the last column).", "",
             "| hop (ms) | WER (%) | throughput (x real time) | RTF | model-only throughput |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        wer = "n/a" if r["wer"] is None else f"{r['wer']:.2f}"
        lines.append(f"| {r['hop_ms']:g} | {wer} | {r['throughput']:.1f} | {r['rtf']:.4f} | {r['model_throughput']:.1f} |")
    with atomic_write(out_md) as f:
        f.write("\n".join(lines) + "\n")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    xs = [r["throughput"] for r in rows]
    ys = [r["wer"] if r["wer"] is not None else float("nan") for r in rows]
    ax.plot(xs, ys, "x-", color="tab:purple")
    for r, x, y in zip(rows, xs, ys):
        ax.annotate(f"{r['hop_ms']:g} ms", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("throughput (audio s / wall s)")
    ax.set_ylabel("WER (%)")
    ax.set_title(title or "inference hop", fontsize=9)
    fig.tight_layout()
    save_png(fig, out_png)


# ---------------------------------------------------------------------------- training throughput


def write_synthetic_audio_cuts(out_dir: Path, n: int, seed: int = 0, min_d: float = 1.0, max_d: float = 5.0,
                               sample_rate: int = 16000):
    """``n`` noise WAV files with random letter transcripts (~8 letters/s) -> a CutSet."""
    import soundfile as sf
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    rng = np.random.default_rng(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    cuts = []
    for i in range(n):
        d = float(rng.uniform(min_d, max_d))
        path = out_dir / f"bench{i:04d}.wav"
        sf.write(str(path), (0.1 * rng.standard_normal(int(d * sample_rate))).astype(np.float32), sample_rate)
        rec = Recording.from_file(str(path), recording_id=path.stem)
        words = ["".join(rng.choice(list("abcdefghij"), size=4)) for _ in range(max(1, int(d * 8 / 5)))]
        sup = SupervisionSegment(id=path.stem, recording_id=rec.id, start=0.0, duration=rec.duration, text=" ".join(words))
        cuts.append(MonoCut(id=path.stem, start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=[sup]))
    return CutSet.from_cuts(cuts)


def train_throughput(cuts, sampler: str, max_duration: float = 20.0, steps: int = 10, seed: int = 0,
                     overrides: Sequence[str] = ()) -> dict:
    """Train a tiny CTC model for at most ``steps`` batches of one epoch with ``data.sampler``;
    returns audio seconds per wall second including feature extraction (``audio_sec_per_sec``)
    and for forward + backward + optimizer only (``model_audio_sec_per_sec``)."""
    import torch

    from asrkit.training.checks import load_config
    from asrkit.data.dataset import AsrDataset
    from asrkit.data.padfree import PadFreeDataset
    from asrkit.data.sampling import make_sampler
    from asrkit.model import build_model
    from asrkit.tokenizer import CharTokenizer

    cfg = load_config(None, ["encoder.d_model=64", "encoder.n_layers=2", "encoder.d_ff=128", "encoder.layer_drop=0.0",
                             f"data.sampler={sampler}", f"data.max_duration={max_duration}", "data.num_buckets=4",
                             *overrides])
    tok = CharTokenizer()
    torch.manual_seed(seed)
    model = build_model(cfg, tok.vocab_size).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    args = (tok, cfg.features, cfg.specaug, "raise")
    ds = PadFreeDataset(*args, seed=seed, frontend_stride=cfg.frontend.stride) if sampler == "padfree" else AsrDataset(*args, seed=seed)
    ds.set_epoch(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*eagerly read CutSet.*")
        smp = make_sampler(cuts, cfg.data, train=True, seed=seed)
    smp.set_epoch(1)
    audio = frames = real = 0.0
    t_feat = t_model = 0.0
    n = 0
    for cutset in smp:
        t0 = time.perf_counter()
        batch = ds[cutset]
        t1 = time.perf_counter()
        out = model(batch)
        out["loss"].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if n > 0:  # the first step is warm-up
            t_feat += t1 - t0
            t_model += t2 - t1
            audio += sum(batch["durations"])
            frames += batch["feats"].shape[0] * batch["feats"].shape[1]
            real += float(batch["feat_lens"].sum())
        n += 1
        if n > steps:
            break
    return {"sampler": sampler, "steps": n - 1, "audio_seconds": audio, "feature_seconds": t_feat, "model_seconds": t_model,
            "audio_sec_per_sec": audio / max(1e-9, t_feat + t_model), "model_audio_sec_per_sec": audio / max(1e-9, t_model),
            "frames_per_audio_second": frames / max(1e-9, audio), "padding_fraction": 1.0 - real / max(1.0, frames),
            "threads": torch.get_num_threads()}


# ---------------------------------------------------------------------------- CLI


def _add_cut_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cuts", type=Path, help="a Lhotse cuts manifest (metadata only is read)")
    g.add_argument("--synthetic", choices=sorted(CORPUS_DURATIONS), default="wsj",
                   help="synthetic durations with this corpus' mean/std (default: %(default)s)")
    p.add_argument("--num-utts", type=int, default=5000, help="synthetic utterances (default: %(default)s)")
    p.add_argument("--max-duration", type=float, default=240.0, help="seconds per batch (default: %(default)s)")
    p.add_argument("--seed", type=int, default=42, help="sampler seed")
    p.add_argument("--epoch", type=int, default=1, help="the epoch whose batches are drawn")
    from asrkit.cliargs import add_out

    add_out(p, "output directory", required=True)


def build_parser() -> argparse.ArgumentParser:
    from asrkit.cliargs import Parser, add_exp_dir, add_out, add_overrides, add_sets

    p = Parser(prog="asrkit padfree", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{hops,padding,hop-curve,bench-train}")
    ph = sub.add_parser("hops", help="histogram of the hops of one epoch (paper Fig. 14)",
                        description="Histogram of the hops of one epoch of the padding-free sampler (paper Fig. 14).")
    _add_cut_args(ph)
    pp = sub.add_parser("padding", help="padding fraction per sampler", description="Padding fraction per sampler.")
    _add_cut_args(pp)
    pc = sub.add_parser("hop-curve", help="decode with several hops: throughput vs WER (paper Fig. 17)",
                        description="Decode with several hops: throughput vs WER (paper Fig. 17).")
    add_exp_dir(pc)
    add_sets(pc, "the corpus part to decode", one=True, legacy_set=True)
    pc.add_argument("--hops", default="5,8,10,12,15,20", help="hops in ms (default: %(default)s)")
    pc.add_argument("--checkpoint", default="last", help="last | best | avg | a path | a name in EXP/checkpoints")
    pc.add_argument("--device", default="cpu", help="where the model runs: cpu | cuda | cuda:N")
    pc.add_argument("--manifest-dir", default=None, help="default: the experiment's data.manifest_dir")
    pc.add_argument("--max-utts", type=int, default=0, help="at most this many utterances (0: all)")
    pc.add_argument("--norm", default=None, help="scoring normalizer (default: the corpus's own)")
    add_overrides(pc, "decode.* overrides for every hop, e.g. decode.method=wfst decode.lm=...")
    pb = sub.add_parser("bench-train", help="training throughput: padded vs padding-free, tiny model, synthetic audio",
                        description="Training throughput: padded vs padding-free, tiny model, synthetic audio.")
    add_out(pb, "output directory", required=True)
    pb.add_argument("--num-utts", type=int, default=48, help="synthetic utterances")
    pb.add_argument("--steps", type=int, default=8, help="training steps per pipeline")
    pb.add_argument("--max-duration", type=float, default=20.0, help="seconds of audio per batch")
    pb.add_argument("--threads", type=int, default=1, help="torch threads")
    pb.add_argument("--seed", type=int, default=0, help="random seed")
    return p


def main(argv: list[str] | None = None) -> int:
    from asrkit.utils import setup_logging

    p = build_parser()
    args = p.parse_args(argv)
    if getattr(args, "sets", None):
        args.set = args.sets[0]
    setup_logging()

    if args.cmd == "hops":
        cuts, where = _load_cuts(args)
        hops = epoch_hops(cuts, args.max_duration, seed=args.seed, epoch=args.epoch)
        sr = next(iter(cuts)).sampling_rate
        summary = hop_summary(hops, sr)
        png = plot_hop_histogram({f"{where}\nmax_duration {args.max_duration:g} s": [h * 1000.0 / sr for h in hops]},
                                 args.out / "padfree_hops.png")
        with atomic_write(args.out / "padfree_hops.json") as f:
            json.dump({"where": where, "max_duration": args.max_duration, "summary": summary,
                       "counts_samples": dict(sorted(Counter(hops).items()))}, f, indent=1)
        print(json.dumps(summary, indent=1))
        print(f"wrote {png}")
        return 0
    if args.cmd == "padding":
        cuts, where = _load_cuts(args)
        res = padding_fractions(cuts, args.max_duration, seed=args.seed, epoch=args.epoch)
        table = format_padding_table(res, where, args.max_duration)
        with atomic_write(args.out / "padding.md") as f:
            f.write(table)
        with atomic_write(args.out / "padding.json") as f:
            json.dump({"where": where, "max_duration": args.max_duration, "samplers": res}, f, indent=1)
        print(table, end="")
        return 0
    if args.cmd == "hop-curve":
        hops = [float(h) for h in args.hops.split(",") if h.strip()]
        rows = hop_curve(args.exp_dir, args.set, hops, args.checkpoint, args.device, args.manifest_dir,
                         args.max_utts, args.norm, args.overrides)
        md, png = args.exp_dir / f"hop_curve_{args.set}.md", args.exp_dir / f"hop_curve_{args.set}.png"
        write_hop_curve(rows, md, png, title=f"{args.exp_dir.name} / {args.set}")
        with atomic_write(args.exp_dir / f"hop_curve_{args.set}.json") as f:
            json.dump(rows, f, indent=1)
        print(md.read_text(), end="")
        return 0
    if args.cmd == "bench-train":
        import torch

        torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            cuts = write_synthetic_audio_cuts(Path(tmp), args.num_utts, seed=args.seed)
            rows = [train_throughput(cuts, s, args.max_duration, args.steps, args.seed) for s in ("bucketing", "padfree")]
        lines = [f"Training throughput, tiny CTC model (d_model 64, 2 layers), {args.num_utts} synthetic 1-5 s "
                 f"utterances, max_duration {args.max_duration:g} s, {args.threads} thread(s), {args.steps} steps after 1 warm-up.", "",
                 "| pipeline | audio s / wall s (features + model) | model only | frames per audio s | padding % |",
                 "|---|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['sampler']} | {r['audio_sec_per_sec']:.1f} | {r['model_audio_sec_per_sec']:.1f} | "
                         f"{r['frames_per_audio_second']:.1f} | {100 * r['padding_fraction']:.2f} |")
        with atomic_write(args.out / "bench_train.md") as f:
            f.write("\n".join(lines) + "\n")
        with atomic_write(args.out / "bench_train.json") as f:
            json.dump(rows, f, indent=1)
        print("\n".join(lines))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
