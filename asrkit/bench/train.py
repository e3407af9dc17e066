"""``train``: does the input pipeline cost the training step anything? Model-only against
full-pipeline training throughput on a recipe's real batches, and the model's FLOP utilization.

    python -m asrkit.bench train --recipe egs/mini/asr1 [--batches 30] [--rounds 1] [--out bench_train.md]

Rows (each on the first ``--warmup + --batches`` batches of epoch 1 of the recipe's training
sampler, the recipe's config, model and optimizer):

* ``padded, stored fbank``: the bucketing sampler, fbank read from the store (stage 2's, the
  recipe's ``data/fbank`` when it covers these utterances, else computed for them in ``--work``);
* ``padded, on-the-fly fbank``: the same batches, fbank computed from the audio every time;
* ``padding-free, on-the-fly fbank``: ``data.sampler=padfree`` (a hop chosen per batch).

Columns. *loading alone*: the dataset turns the batches' cuts into tensors in this process with
one thread (what a loader worker does). *model only*: forward, backward, gradient clipping,
optimizer step (and the weights' moving average when the config keeps one), as the trainer does
them, on the batches already in memory. *full pipeline*: the same steps fed by the real input
pipeline (the sampler, :func:`asrkit.training.inputs.make_loader`'s DataLoader with the config's
``data.num_workers``): the same batches, now loaded while the model computes. The padded rows
share the model-only figure (identical shapes). Throughput is audio seconds per wall second
over the ``--batches`` after ``--warmup`` (not timed; the loader's start is in the warm-up);
``full / model`` is the ratio of the two (1.0: the input pipeline is free). *loader CPU*: CPU
seconds of the loader workers per audio second (0 with ``data.num_workers=0``: the loading is then
in the main process, between steps). *FLOP utilization*: the model's FLOPs per step
(:class:`torch.utils.flop_counter.FlopCounterMode` on forward + backward of every timed batch:
matrix products, convolutions, attention) times the model-only step rate, against the peak of a
square GEMM (the best of ``--gemm-sizes``) measured in the same run with the same threads and dtype.

A shared or busy machine makes every figure meaningless: run it on a quiet one. ``--rounds N``
repeats the model-only and full-pipeline passes N times and reports the medians (the ratio:
median of the per-round ratios).
"""
from __future__ import annotations

import argparse

from asrkit.cliargs import Parser
import json
import logging
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

#: row key -> (label, data.sampler, fbank source)
ROWS = {
    "padded": ("padded, stored fbank", "bucketing", "stored"),
    "padded_otf": ("padded, on-the-fly fbank", "bucketing", "on_the_fly"),
    "padfree": ("padding-free, on-the-fly fbank", "padfree", "on_the_fly"),
}


# ---------------------------------------------------------------------------- measurements


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_peak(device, dtype, sizes=(512, 1024, 2048), seconds: float = 3.0) -> tuple[float, int]:
    """Best FLOP/s of an ``n x n @ n x n`` product over ``sizes`` (``seconds`` in all), and its n."""
    import torch

    best, best_n = 0.0, sizes[0]
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        a @ b
        _sync(device)
        deadline = time.perf_counter() + seconds / len(sizes)
        while True:
            t0 = time.perf_counter()
            a @ b
            _sync(device)
            dt = time.perf_counter() - t0
            if 2 * n**3 / dt > best:
                best, best_n = 2 * n**3 / dt, n
            if time.perf_counter() > deadline:
                break
    return best, best_n


class Stepper:
    """The trainer's step (:class:`asrkit.training.loop.Trainer`, one micro-batch per step) on one model."""

    def __init__(self, cfg, vocab_size: int, device):
        import copy

        import torch

        from asrkit.model import build_model
        from asrkit.training.optim import AMP_DTYPES, make_optimizer

        torch.manual_seed(cfg.train.seed)
        self.cfg, self.device = cfg, device
        self.model = build_model(cfg, vocab_size).to(device).train()
        self.ema = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.train.ema_decay > 0 else None
        self.optimizer = make_optimizer(cfg, self.model.parameters())
        self.amp = AMP_DTYPES[cfg.train.amp]
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.amp == "fp16")
        self.step_no = 0

    def loss(self, batch):
        import torch

        from asrkit.data.dataset import stable_seed

        self.model.set_step(stable_seed(self.cfg.train.seed, "layer_drop", self.step_no, 1))
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            out = self.model(batch)
        return out["loss"].float() * out["n_utts"], out["n_utts"]

    def __call__(self, batch) -> float:
        import torch

        from asrkit.training.optim import update_ema

        loss_sum, n = self.loss(batch)
        value = float(loss_sum.detach())  # the trainer reads it every step
        self.scaler.scale(loss_sum / n).backward()
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.optim.clip_grad if self.cfg.optim.clip_grad > 0 else float("inf")
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.grad is not None], clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_no += 1
        if self.ema is not None:
            update_ema(self.ema, self.model, self.cfg.train.ema_decay, self.step_no)
        return value

    def flops(self, batch) -> int:
        """FLOPs of forward + backward on ``batch`` (no optimizer step; gradients dropped), the CPU's
        fused attention and grouped convolutions' backward counted too (:func:`asrkit.bench.sizes.flop_counter`)."""
        from asrkit.bench.sizes import flop_counter

        with flop_counter() as counter:
            loss_sum, n = self.loss(batch)
            (loss_sum / n).backward()
        self.optimizer.zero_grad(set_to_none=True)
        return int(counter.get_total_flops())


class FirstBatches:
    """The first ``n`` batches of ``sampler``'s epoch (a sampler for the DataLoader)."""

    def __init__(self, sampler, n: int):
        self.sampler, self.n = sampler, n

    def __iter__(self):
        it = iter(self.sampler)
        for _ in range(self.n):
            b = next(it, None)
            if b is None:
                return
            yield b


def _audio(batch) -> float:
    return float(sum(batch["durations"]))


def _model_only(step: Stepper, batches: list, warmup: int) -> float:
    for b in batches[:warmup]:
        step(b)
    _sync(step.device)
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        step(b)
    _sync(step.device)
    return time.perf_counter() - t0


def _full_pipeline(step: Stepper, cfg, tok, sampler, n: int, warmup: int) -> tuple[float, float, list]:
    """(seconds of the timed steps, loader worker CPU seconds, the batches' ids)."""
    from asrkit.training.inputs import make_loader, to_device

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    loader = make_loader(cfg, tok, FirstBatches(sampler, n), epoch=1, train=True)
    ids, t0 = [], None
    it = iter(loader)
    for i, batch in enumerate(it):
        if i == warmup:
            _sync(step.device)
            t0 = time.perf_counter()
        step(to_device(batch, step.device))
        ids.append(batch["ids"])
    _sync(step.device)
    dt = time.perf_counter() - (t0 if t0 is not None else time.perf_counter())
    del it, loader  # joins the workers: their CPU time is counted in RUSAGE_CHILDREN
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return dt, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), ids


# ---------------------------------------------------------------------------- set-up


def _config(args):
    from asrkit.training.checks import load_config

    recipe = args.recipe
    cfg = load_config(args.config or (recipe / "conf" / "train.yaml" if recipe else None), args.overrides)
    d = cfg.data
    if args.manifest_dir or recipe:
        d.manifest_dir = str(args.manifest_dir or recipe / "data" / "manifests")
    if args.fbank_dir or recipe:
        d.fbank_dir = str(args.fbank_dir or recipe / "data" / "fbank")
    if args.tokens or recipe:
        kind = cfg.tokens.kind
        cfg.tokens.path = str(args.tokens or recipe / "data" / "tokens" /
                              f"{kind}{'' if kind == 'letters' else cfg.tokens.vocab_size}.json")
    if args.workers is not None:
        d.num_workers = args.workers
    explicit = {o.split("=", 1)[0] for o in args.overrides}
    if "data.corpus" not in explicit:
        # the recipe's own corpus (run.sh sets data.corpus, not its conf/train.yaml): the one corpus
        # with training manifests there, when the config's default has none
        md, train = Path(d.manifest_dir), d.train_sets[0]
        if not (md / f"{d.corpus}_cuts_{train}.jsonl.gz").is_file():
            found = sorted(p.name[: -len(f"_cuts_{train}.jsonl.gz")] for p in md.glob(f"*_cuts_{train}.jsonl.gz"))
            if len(found) == 1:
                d.corpus = found[0]
    if cfg.augment.enabled:
        # augmentation draws new audio every epoch: the timed passes must see identical batches
        logger.info("augmentation (augment.*) off for this benchmark: it compares passes over the same batches")
        cfg.augment.speed, cfg.augment.volume, cfg.augment.noise_prob, cfg.augment.reverb_prob = [], [], 0.0, 0.0
    return cfg


def _batches_of(cfg, cuts, sampler_kind: str, n: int):
    """(sampler factory, the first ``n`` batches of its epoch 1 as CutSets)."""
    import copy

    from asrkit.data.sampling import make_sampler

    data = copy.copy(cfg.data)
    data.sampler = sampler_kind

    def new():
        s = make_sampler(cuts, data, train=True, seed=cfg.train.seed)
        s.set_epoch(1)
        return s

    return new, list(FirstBatches(new(), n))


def _with_stored(cfg, cuts, used, work: Path, num_jobs: int):
    """``cuts`` with stored features on the ``used`` ones (the recipe's store, or one computed in ``work``)."""
    from lhotse import CutSet

    from asrkit.data.feature_store import FeatureStore

    d = cfg.data
    ids = {c.id for cs in used for c in cs}
    sub = CutSet.from_cuts(c for c in cuts if c.id in ids)  # (the compact training index has no filter)
    got, why = FeatureStore.of(d.fbank_dir, cfg.features).attach(sub, d.corpus, d.train_sets)
    where = FeatureStore.of(d.fbank_dir, cfg.features).dir
    if got is None:
        logger.info("no usable store in %s (%s): storing the fbank of the %d utterances used in %s",
                    d.fbank_dir, why, len(sub), work)
        store = FeatureStore.of(work, cfg.features)
        feats, bad = store.compute(sub, d.corpus, "bench", num_jobs)
        if bad:
            raise RuntimeError(f"unreadable audio: {bad}")
        store.save(sub, feats, d.corpus, "bench")
        got, why = store.attach(sub, d.corpus, "bench")
        where = store.dir
    stored = {c.id: c for c in got}
    return CutSet.from_cuts(stored.get(c.id, c) for c in cuts), where


def _loading_alone(ds, cutsets: list) -> tuple[list, float]:
    """The batches, and the seconds the dataset took to make them with one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        batches = [ds[cs] for cs in cutsets]
        return batches, time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)


def _dataset(cfg, tok, sampler_kind: str):
    from asrkit.data.dataset import AsrDataset
    from asrkit.data.padfree import PadFreeDataset

    args = (tok, cfg.features, cfg.specaug, cfg.data.on_bad_audio)
    if sampler_kind == "padfree":
        ds = PadFreeDataset(*args, seed=cfg.train.seed, frontend_stride=cfg.frontend.stride)
    else:
        ds = AsrDataset(*args, seed=cfg.train.seed)
    ds.set_epoch(1)
    return ds


def _padding(batches: list) -> float:
    frames = sum(b["feats"].shape[0] * b["feats"].shape[1] for b in batches)
    return 1.0 - sum(float(b["feat_lens"].sum()) for b in batches) / max(1, frames)


# ---------------------------------------------------------------------------- the run


def run(args) -> dict:
    import copy

    import torch

    from asrkit.tokenizer import load_tokenizer
    from asrkit.training.inputs import load_train_cuts, to_device
    from asrkit.training.optim import AMP_DTYPES

    cfg = _config(args)
    threads = args.threads or cfg.train.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    dev = cfg.train.device
    device = torch.device("cuda" if dev == "cuda" or (dev == "auto" and torch.cuda.is_available()) else "cpu")
    tok = load_tokenizer(cfg.tokens.path)
    cuts, _ = load_train_cuts(cfg, tok, "train")
    n = args.warmup + args.batches
    res = {"config": str(args.config or (args.recipe / "conf" / "train.yaml" if args.recipe else "<defaults>")),
           "corpus": cfg.data.corpus, "train_sets": cfg.data.train_sets, "utterances": len(cuts),
           "device": str(device), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "threads": threads, "num_workers": cfg.data.num_workers, "max_duration": cfg.data.max_duration,
           "warmup": args.warmup, "batches": args.batches, "rounds": args.rounds, "rows": {}}
    dtype = AMP_DTYPES[cfg.train.amp] or torch.float32
    peak, peak_n = gemm_peak(device, dtype, tuple(args.gemm_sizes), args.gemm_seconds)
    res.update(gemm_peak_gflops=peak / 1e9, gemm_n=peak_n, dtype=str(dtype).replace("torch.", ""))
    print(f"GEMM peak {peak / 1e9:.1f} GFLOP/s ({peak_n}^3, {res['dtype']}, {threads} threads, {device})", file=sys.stderr)
    rows = [r for r in args.rows]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="asrkit_bench_train_"))
    padded_model: Optional[dict] = None
    for key in rows:
        label, sampler_kind, source = ROWS[key]
        rcfg = copy.deepcopy(cfg)
        rcfg.data.sampler = sampler_kind
        new_sampler, cutsets = _batches_of(rcfg, cuts, sampler_kind, n)
        row_cuts = cuts
        if source == "stored":
            row_cuts, where = _with_stored(rcfg, cuts, cutsets, work, args.num_jobs)
            new_sampler, cutsets = _batches_of(rcfg, row_cuts, sampler_kind, n)
            res["store"] = str(where)
        ds = _dataset(rcfg, tok, sampler_kind)
        batches, t_load = _loading_alone(ds, cutsets)
        if source == "stored":
            assert all(c.has_features for cs in cutsets for c in cs)
        audio = sum(_audio(b) for b in batches[args.warmup:])
        audio_all = sum(_audio(b) for b in batches)
        row = {"label": label, "audio_s": audio, "padding": _padding(batches[args.warmup:]),
               "loading_alone": audio_all / t_load}
        step = Stepper(rcfg, tok.vocab_size, device)
        on_dev = [to_device(b, device) for b in batches]
        if sampler_kind == "bucketing" and padded_model is not None:
            assert padded_model["ids"] == [b["ids"] for b in batches]
            row.update(flops=padded_model["flops"], model_s_all=padded_model["model_s_all"])  # the same batch shapes
            model_s = row["model_s_all"]
        else:
            flops = sum(step.flops(b) for b in on_dev[args.warmup:])
            model_s = [_model_only(step, on_dev, args.warmup) for _ in range(args.rounds)]
            row.update(flops=flops, model_s_all=model_s)
            if sampler_kind == "bucketing":
                padded_model = {"flops": flops, "model_s_all": model_s, "ids": [b["ids"] for b in batches]}
        full_s, cpu = [], []
        for _ in range(args.rounds):
            dt, c, ids = _full_pipeline(step, rcfg, tok, new_sampler(), n, args.warmup)
            if ids != [b["ids"] for b in batches]:
                raise RuntimeError(f"{label}: the DataLoader's batches are not the preloaded ones")
            full_s.append(dt)
            cpu.append(c)
        ms, fs = statistics.median(model_s), statistics.median(full_s)
        row.update(full_s_all=full_s, model_only=audio / ms, full=audio / fs,
                   ratio=statistics.median(m / f for m, f in zip(model_s, full_s)) if len(model_s) == len(full_s)
                   else ms / fs,
                   loader_cpu_per_audio_s=statistics.median(cpu) / audio_all,
                   gflops=row["flops"] / ms / 1e9, utilization=row["flops"] / ms / peak)
        res["rows"][key] = row
        print(f"  {label}: model only {row['model_only']:.1f}, full {row['full']:.1f} audio s/s "
              f"(x{row['ratio']:.2f}), {row['gflops']:.1f} GFLOP/s", file=sys.stderr, flush=True)
    return res


def table(res: dict) -> str:
    """The result as Markdown."""
    lines = [
        f"Training throughput on {res['corpus']}/{'+'.join(res['train_sets'])} ({res['config']}): "
        f"{res['batches']} batches of up to {res['max_duration']:g} s after {res['warmup']} warm-up, "
        f"{res['rounds']} round(s); {res['device']}, {res['cores']} cores ({res['cpu']}), {res['threads']} compute "
        f"threads, {res['num_workers']} loader worker(s) of 1 thread; GEMM peak {res['gemm_peak_gflops']:.1f} GFLOP/s "
        f"({res['gemm_n']}^3 {res['dtype']}). Throughput in audio seconds per wall second.",
        "",
        "| pipeline | audio (s) | padding | loading alone, 1 thread | model only | full pipeline | full / model "
        "| loader CPU s per audio s | model GFLOP/s | of GEMM peak |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"].values():
        lines.append(f"| {r['label']} | {r['audio_s']:.0f} | {100 * r['padding']:.1f} % | {r['loading_alone']:.0f} | "
                     f"{r['model_only']:.1f} | {r['full']:.1f} | {r['ratio']:.2f} | {r['loader_cpu_per_audio_s']:.4f} | "
                     f"{r['gflops']:.1f} | {100 * r['utilization']:.0f} % |")
    return "\n".join(lines) + "\n"


MINI = Path(__file__).resolve().parents[2] / "egs" / "mini" / "asr1"


def _unprepared(args) -> Optional[str]:
    """What to run first when the benchmark has no prepared recipe to read (None: ready). Without
    ``--recipe`` (nor ``--tokens`` / ``--manifest-dir``) the mini recipe is used once prepared."""
    if args.recipe is None and args.tokens is None and args.manifest_dir is None:
        if (MINI / "data" / "tokens").is_dir() and (MINI / "data" / "manifests").is_dir():
            args.recipe = MINI
        else:
            return (f"it measures training on a prepared recipe's data and none was given; prepare the mini "
                    f"recipe first (stages 1-3, a few minutes): (cd {MINI} && ./run.sh --stop_stage 3), then rerun "
                    f"this command (or name another prepared recipe with --recipe DIR)")
    if args.recipe is not None:
        missing = [d for d in ("conf/train.yaml", "data/manifests", "data/tokens") if not (args.recipe / d).exists()]
        if missing:
            return (f"{args.recipe} is not a prepared recipe (no {', '.join(missing)}); run its stages 1-3 first: "
                    f"(cd {args.recipe} && ./run.sh --stop_stage 3)")
    return None


def main(argv: list[str]) -> int:
    from asrkit.schema import ConfigError
    from asrkit.utils import atomic_write

    p = Parser(prog="asrkit bench train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", type=Path, help="a recipe dir after stages 1-3: conf/train.yaml, data/manifests, "
                   "data/tokens, data/fbank (read only)")
    p.add_argument("--config", type=Path, help="default: RECIPE/conf/train.yaml")
    p.add_argument("--manifest-dir", type=Path, help="default: RECIPE/data/manifests")
    p.add_argument("--tokens", type=Path, help="default: RECIPE/data/tokens/<tokens.kind>.json")
    p.add_argument("--fbank-dir", type=Path, help="stored features to use if they cover the batches "
                   "(default: RECIPE/data/fbank); otherwise they are computed in --work")
    p.add_argument("--work", type=Path, help="where to store features when needed (default: a new temp dir)")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS), help="pipelines to measure (default: all)")
    p.add_argument("--batches", type=int, default=30, help="timed batches per row (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches first (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=1, help="repeat the timed passes, report medians")
    p.add_argument("--threads", type=int, default=0, help="compute threads (default: train.threads, else torch's)")
    p.add_argument("--workers", type=int, default=None, help="loader workers (default: data.num_workers)")
    p.add_argument("--num-jobs", type=int, default=2, help="processes computing a missing store")
    p.add_argument("--gemm-sizes", type=int, nargs="+", default=[512, 1024, 2048], help="square matrix sizes of the GEMM peak measurement (default: %(default)s)")
    p.add_argument("--gemm-seconds", type=float, default=3.0, help="seconds per GEMM size (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the table (Markdown) here, and the figures as JSON next to it")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (e.g. data.max_duration=120)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    problem = _unprepared(args)
    if problem:
        print(f"asrkit bench train: {problem}", file=sys.stderr)
        return 2
    try:
        res = run(args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"asrkit bench train: {e}", file=sys.stderr)
        return 2
    text = table(res)
    print(text, end="")
    if args.out:
        with atomic_write(args.out) as f:
            f.write(text)
        with atomic_write(args.out.with_suffix(".json")) as f:
            json.dump(res, f, indent=1)
    return 0
