"""`python -m asrkit.bench scale`: asrkit's data stages 1-4 at LibriSpeech 960 h's size.

A fake LibriSpeech tree (``LibriSpeech/train-clean-100|train-clean-360|train-other-500/<spk>/<chapter>/``
with ``<spk>-<chapter>.trans.txt`` and one FLAC per utterance, in the proportions of the real
training parts) is written at each size (default 10 k, 30 k, 100 k and 281 241 utterances); the
audio is 16 synthetic FLACs of LibriSpeech-like durations (1.5-24.5 s, mean 12.5 s) reused by hard
links, the transcripts random words (about 34 per utterance, LibriSpeech's mean). Then, each
measurement in a fresh process (wall time and peak RSS of that process and its children):

1. preparation (stage 1: :func:`asrkit.data.librispeech.prepare`, i.e. Lhotse's
   ``prepare_librispeech`` + asrkit's validation and cuts manifests);
2. the stage-2 audio check (streamed; measured whole up to ``--check-full`` utterances, beyond
   that on the first ``--sample`` utterances and extrapolated linearly), and feature storage
   (:class:`asrkit.data.feature_store.FeatureStore`, on ``--fbank-sample`` utterances,
   extrapolated);
3. sampler start-up (``load_train_cuts`` + ``make_sampler``) to the first batch (fbank on the
   fly), for asrkit's bucketing and padding-free samplers: cold (nothing cached: the manifests
   parsed), the first start after stage 2 (which caches the manifests' columns,
   :func:`asrkit.data.cut_index.manifest_columns`, itself measured: what stage 2 adds) and cached
   (every later start), next to Lhotse's own lazy ``DynamicBucketingSampler`` over the same
   manifests feeding the same dataset;
4. a checkpoint of the sampler state half-way through the epoch and a resume from it (a new
   process: sampler start-up, fast-forward to that batch, the next batch).

Writes ``<out>.json``, ``<out>.md`` (table) and ``<out>.png`` (plot).
"""
from __future__ import annotations

import argparse

from asrkit.cliargs import Parser
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

PARTS = {"train-clean-100": 28539, "train-clean-360": 104014, "train-other-500": 148688}
LIBRI_960 = sum(PARTS.values())  # 281 241
DURATIONS = [1.5, 3.0, 5.0, 7.0, 9.0, 10.5, 12.0, 13.0, 14.0, 14.5, 15.0, 15.5, 16.0, 16.5, 20.0, 24.5]
WORDS = ("the and of to a in that he was it his i had you with as for her is but not be at on she my him so "
         "all by this they which have from said were one we me an no there or are what if when who would been "
         "their will out up then them them more could into time little some man very any upon only before").split()
MAX_DURATION = 200.0
#: the time reported: CPU seconds (the machine is shared: wall time depends on what else runs)
T = "cpu_s"


def _cpu() -> float:
    """CPU seconds (user + system) of this process and its finished children: what a measurement
    costs whatever else the machine runs (its wall time is also recorded)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024


# ------------------------------------------------------------------------------------ corpus
def make_corpus(root: Path, n: int, seed: int = 0) -> Path:
    """The fake LibriSpeech tree of ``n`` utterances under ``root`` (see the module docstring)."""
    import numpy as np
    import soundfile as sf

    libri = root / "LibriSpeech"
    done = root / ".complete"
    if done.is_file():
        return libri
    shutil.rmtree(root, ignore_errors=True)
    src = root / "sources"
    src.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    sources = []
    for k, d in enumerate(DURATIONS):
        t = np.arange(int(d * 16000)) / 16000
        x = 0.2 * np.sin(2 * np.pi * (200 + 40 * k) * t) + 0.02 * rng.standard_normal(t.size)
        p = src / f"{k:02d}.flac"
        sf.write(p, x.astype(np.float32), 16000)
        sources.append(p)
    counts = {p: int(round(c * n / LIBRI_960)) for p, c in PARTS.items()}
    counts["train-other-500"] += n - sum(counts.values())
    spk = 100
    for part, m in counts.items():
        u = 0
        while u < m:
            chapter = 1000 + spk * 3
            d = libri / part / str(spk) / str(chapter)
            d.mkdir(parents=True)
            lines = []
            for j in range(min(50, m - u)):
                uid = f"{spk}-{chapter}-{j:04d}"
                os.link(sources[int(rng.integers(len(sources)))], d / f"{uid}.flac")
                words = rng.choice(WORDS, size=int(rng.integers(20, 48)))
                lines.append(f"{uid} {' '.join(words).upper()}\n")
            (d / f"{spk}-{chapter}.trans.txt").write_text("".join(lines))
            u += len(lines)
            spk += 1
    done.write_text(str(n))
    return libri


# ------------------------------------------------------------------------------------ workers
def w_prepare(spec: dict) -> dict:
    from asrkit.data.librispeech import prepare

    t0, c0 = time.perf_counter(), _cpu()
    prepare(spec["corpus"], spec["manifests"], spec.get("parts", ["train-960"]), num_jobs=spec.get("jobs", 2))
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0, "peak_rss_mb": _peak_mb()}


def w_check(spec: dict) -> dict:
    from itertools import islice

    from lhotse import CutSet, load_manifest_lazy

    from asrkit.data.cuts import check_audio
    from asrkit.data.manifests import manifest_path

    lazy = [load_manifest_lazy(manifest_path(spec["manifests"], "librispeech", "cuts", p)) for p in PARTS]
    n = spec.get("limit")
    cuts = CutSet.from_cuts(islice((c for cs in lazy for c in cs), n)) if n else CutSet(
        __import__("lhotse").lazy.LazyIteratorChain(*[cs.data for cs in lazy]))
    t0, c0 = time.perf_counter(), _cpu()
    bad = check_audio(cuts, spec.get("jobs", 2), "bench")
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0, "peak_rss_mb": _peak_mb(), "bad": len(bad)}


def w_fbank(spec: dict) -> dict:
    from itertools import islice

    from lhotse import CutSet, load_manifest_lazy

    from asrkit.config import FeatureConfig
    from asrkit.data.feature_store import FeatureStore
    from asrkit.data.manifests import manifest_path

    cs = load_manifest_lazy(manifest_path(spec["manifests"], "librispeech", "cuts", "train-other-500"))
    cuts = CutSet.from_cuts(list(islice(iter(cs), spec["limit"])))
    store = FeatureStore.of(spec["fbank_dir"], FeatureConfig())
    t0, c0 = time.perf_counter(), _cpu()
    feats, bad = store.compute(cuts, "bench", "sample", spec.get("jobs", 2))
    store.save(cuts, feats, "bench", "sample")
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    size = sum(f.stat().st_size for f in Path(store.dir).rglob("*") if f.is_file())
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": _peak_mb(), "n": len(cuts), "bytes": size,
            "audio_s": sum(c.duration for c in cuts)}


def w_columns(spec: dict) -> dict:
    """What stage 2 (``asrkit cuts``) adds after writing the training manifests: their columns
    (:func:`asrkit.data.cut_index.manifest_columns`) built and cached."""
    from asrkit.data.cut_index import manifest_columns
    from asrkit.data.manifests import manifest_path

    t0, c0 = time.perf_counter(), _cpu()
    for p in PARTS:
        manifest_columns(manifest_path(spec["manifests"], "librispeech", "cuts", p))
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0, "peak_rss_mb": _peak_mb()}


def _cfg(spec: dict):
    from asrkit.config import load_config

    return load_config(None, [f"data.manifest_dir={spec['manifests']}", "data.corpus=librispeech",
                              f"data.train_sets=[{','.join(PARTS)}]", f"data.sampler={spec.get('kind', 'bucketing')}",
                              f"data.max_duration={MAX_DURATION}", "data.num_buckets=30", "data.num_workers=0",
                              "data.features=on_the_fly", "data.dev_set="])


def w_asrkit(spec: dict) -> dict:
    """load_train_cuts + make_sampler -> first batch; or (``resume``) the same, resumed at batch k."""
    t_imp = time.perf_counter()
    from asrkit.data.sampling import ResumableSampler, make_sampler
    from asrkit.tokenizer import CharTokenizer
    from asrkit.training.inputs import load_train_cuts, make_loader
    from asrkit.training.state import fingerprints

    t0, c0 = time.perf_counter(), _cpu()
    cfg, tok = _cfg(spec), CharTokenizer()
    cuts, _ = load_train_cuts(cfg, tok, "train")
    fingerprints(cuts, tok)  # what the trainer also computes at start-up (from the index: free)
    sampler = make_sampler(cuts, cfg.data, train=True, seed=0)
    sampler.set_epoch(1)
    out = {"utterances": len(cuts), "import_s": t0 - t_imp}
    k = spec.get("resume", 0)
    if k:  # the trainer's checkpointed sampler state (asrkit.training.checkpointing)
        out["state"] = {"epoch": 1, "batch_in_epoch": k, "sampler_start": 0}
    loader = make_loader(cfg, tok, ResumableSampler(sampler, k), epoch=1, train=True)
    batch = next(iter(loader))
    out.update(wall_s=time.perf_counter() - t0, cpu_s=_cpu() - c0, peak_rss_mb=_peak_mb(), batches=len(sampler),
               first_batch_utts=len(batch["ids"]), index_mb=getattr(cuts, "nbytes", lambda: 0)() / 2**20)
    if spec.get("checkpoint"):
        import pickle

        t1 = time.perf_counter()
        blob = pickle.dumps({"epoch": 1, "batch_in_epoch": spec["checkpoint"], "sampler_start": 0})
        out["checkpoint_s"], out["checkpoint_bytes"] = time.perf_counter() - t1, len(blob)
    return out


def w_lhotse(spec: dict) -> dict:
    """Lhotse's own lazy DynamicBucketingSampler over the same manifests -> the first batch of the
    same dataset; ``checkpoint``: its state_dict after that many batches; ``resume``: load_state_dict
    (its fast-forward) -> next batch."""
    t_imp = time.perf_counter()
    import pickle
    import warnings

    import torch
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler

    from asrkit.data.dataset import AsrDataset
    from asrkit.data.manifests import manifest_path
    from asrkit.tokenizer import CharTokenizer

    t0, c0 = time.perf_counter(), _cpu()
    cfg = _cfg(spec)
    cuts = CutSet.from_files([str(manifest_path(spec["manifests"], "librispeech", "cuts", p)) for p in PARTS])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = DynamicBucketingSampler(cuts, max_duration=MAX_DURATION, num_buckets=30, shuffle=True,
                                          drop_last=False, seed=0)
    ds = AsrDataset(CharTokenizer(), cfg.features, None, "raise", 0)
    out = {"import_s": t0 - t_imp}
    if spec.get("resume_state"):
        with open(spec["resume_state"], "rb") as f:
            sampler.load_state_dict(pickle.load(f))
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=0)
    it = iter(loader)
    batch = next(it)
    out.update(wall_s=time.perf_counter() - t0, cpu_s=_cpu() - c0, peak_rss_mb=_peak_mb(),
               first_batch_utts=len(batch["ids"]))
    if spec.get("checkpoint"):
        for _ in range(spec["checkpoint"] - 1):  # position the sampler (not timed); next() only: a Lhotse
            next(sampler)                      # sampler restarts its epoch on every iter()
        t1 = time.perf_counter()
        blob = pickle.dumps(sampler.state_dict())
        out["checkpoint_s"], out["checkpoint_bytes"] = time.perf_counter() - t1, len(blob)
        Path(spec["state_out"]).write_bytes(blob)
        out["peak_rss_mb_after_ckpt"] = _peak_mb()
    return out


def _run(fn: str, spec: dict, timeout: float = 3600) -> dict:
    cmd = [sys.executable, "-m", "asrkit.bench", "--worker", f"asrkit.bench.scale:{fn}", json.dumps(spec)]
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{fn} {spec}: exit {r.returncode}\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"  {fn} {({k: v for k, v in spec.items() if k not in ('manifests', 'corpus')})}: "
          f"{res.get('wall_s', 0):.2f} s wall, {res.get('cpu_s', 0):.2f} s CPU, {res.get('peak_rss_mb', 0):.0f} MB",
          file=sys.stderr, flush=True)
    return res


# ------------------------------------------------------------------------------------ driver
STAGES = ("prepare", "check", "fbank", "startup", "resume")


def measure(work: Path, n: int, args, row: dict) -> dict:
    """Run the ``args.stages`` of size ``n`` (each measurement in a fresh process), updating ``row``.
    Stages can be run one invocation at a time (``--stages``; ``--part`` prepares one training part):
    the results accumulate in OUT.json."""
    root = work / f"n{n}"
    libri = make_corpus(root / "corpus", n)
    man = root / "manifests"
    row["n"] = n
    stages = args.stages
    if "prepare" in stages:
        parts = [args.part] if args.part else list(PARTS)
        for part in parts:
            for kind in ("recordings", "supervisions", "cuts"):
                (man / f"librispeech_{kind}_{part}.jsonl.gz").unlink(missing_ok=True)
            row.setdefault("prepare_parts", {})[part] = _run("w_prepare", {"corpus": str(libri.parent), "manifests": str(man),
                                                                          "parts": [part]})
        pp = row["prepare_parts"]
        if all(p in pp for p in PARTS):
            row["prepare"] = {"wall_s": sum(pp[p]["wall_s"] for p in PARTS), "cpu_s": sum(pp[p]["cpu_s"] for p in PARTS),
                              "peak_rss_mb": max(pp[p]["peak_rss_mb"] for p in PARTS), "by_part": True}
    base = {"manifests": str(man)}
    if "check" in stages:
        if n <= args.check_full:
            row["check"] = dict(_run("w_check", dict(base)), extrapolated=False)
        else:
            c = _run("w_check", dict(base, limit=args.sample))
            row["check"] = {"wall_s": c["wall_s"] * n / args.sample, "cpu_s": c["cpu_s"] * n / args.sample,
                            "peak_rss_mb": c["peak_rss_mb"],
                            "extrapolated": True, "sample": args.sample, "sample_wall_s": c["wall_s"]}
    if "fbank" in stages and args.fbank_sample:
        f = _run("w_fbank", dict(base, limit=args.fbank_sample, fbank_dir=str(root / "fbank")))
        shutil.rmtree(root / "fbank", ignore_errors=True)
        row["fbank"] = {"wall_s": f["wall_s"] * n / f["n"], "cpu_s": f["cpu_s"] * n / f["n"], "extrapolated": True,
                        "sample": f["n"],
                        "sample_wall_s": f["wall_s"], "peak_rss_mb_sample": f["peak_rss_mb"],
                        "disk_gb": f["bytes"] * n / f["n"] / 1e9, "audio_h": f["audio_s"] * n / f["n"] / 3600}
    if "startup" in stages:  # paired: Lhotse; asrkit cold (no cache), after stage 2 (columns cached), warm, per kind
        for key in ("lhotse", "columns", "bucketing_cold", "bucketing_first", "bucketing_warm", "padfree_cold",
                    "padfree_first", "padfree_warm"):
            row[key] = []
        for _ in range(args.rounds):
            shutil.rmtree(man / ".index", ignore_errors=True)
            row["lhotse"].append(_run("w_lhotse", dict(base)))
            row["columns"].append(_run("w_columns", dict(base)))  # what stage 2 adds after writing the manifests
            for kind in ("bucketing", "padfree"):
                shutil.rmtree(man / ".index", ignore_errors=True)
                row[f"{kind}_cold"].append(_run("w_asrkit", dict(base, kind=kind)))
                for f in (man / ".index").glob("*.idx"):
                    if not f.name.endswith(".cols.idx"):
                        f.unlink()  # the columns stay: the first training start after stage 2
                row[f"{kind}_first"].append(_run("w_asrkit", dict(base, kind=kind)))
                row[f"{kind}_warm"].append(_run("w_asrkit", dict(base, kind=kind)))
    if "resume" in stages:  # a checkpoint half-way through the epoch, and a resume from it
        half = max(1, row["bucketing_warm"][0]["batches"] // 2)
        state = root / "lhotse_state.pkl"
        row["lhotse_ckpt"] = _run("w_lhotse", dict(base, checkpoint=half, state_out=str(state)))
        row["lhotse_resume"] = _run("w_lhotse", dict(base, resume_state=str(state)))
        for kind in ("bucketing", "padfree"):
            row[f"{kind}_ckpt"] = _run("w_asrkit", dict(base, kind=kind, checkpoint=half))
            row[f"{kind}_resume"] = _run("w_asrkit", dict(base, kind=kind, resume=half))
        row["resume_at_batch"] = half
    return row


def _med(rows: list, key: str) -> float:
    v = sorted(r[key] for r in rows)
    return v[len(v) // 2]


def table(res: dict) -> str:
    out = ["| utterances | stage 1 prepare CPU s / MB | stage 2 audio check CPU s / MB | stage 2 index columns CPU s / MB | "
           "fbank storage CPU s (extrap.) | Lhotse DynamicBucketing CPU s / MB | asrkit bucketing: cold | after stage 2 | "
           "cached | asrkit padfree: cold | after stage 2 | cached | asrkit bucketing vs Lhotse: CPU cold / after stage 2 / "
           "cached, memory after stage 2 | resume at half-epoch CPU s: Lhotse / asrkit |",
           "|---:|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        p = r.get("prepare", {})
        c = r["check"]
        f = r.get("fbank", {})
        lh = (_med(r["lhotse"], T), _med(r["lhotse"], "peak_rss_mb"))
        cells = [f"{r['n']:,}".replace(",", " "),
                 f"{p[T]:.1f} / {p['peak_rss_mb']:.0f}" if p else "-",
                 f"{c[T]:.1f}{'*' if c.get('extrapolated') else ''} / {c['peak_rss_mb']:.0f}",
                 f"{_med(r['columns'], T):.2f} / {_med(r['columns'], 'peak_rss_mb'):.0f}" if r.get("columns") else "-",
                 f"{f[T]:.0f}*" if f else "-",
                 f"{lh[0]:.2f} / {lh[1]:.0f}"]
        for kind in ("bucketing", "padfree"):
            for temp in ("cold", "first", "warm"):
                rows = r.get(f"{kind}_{temp}")
                cells.append(f"{_med(rows, T):.2f} / {_med(rows, 'peak_rss_mb'):.0f}" if rows else "-")
        bw, bc, bf = r["bucketing_warm"], r["bucketing_cold"], r.get("bucketing_first")
        first = f"{_med(bf, T) / lh[0]:.2f}x" if bf else "-"
        mem = _med(bf or bw, "peak_rss_mb") / lh[1]
        cells.append(f"{_med(bc, T) / lh[0]:.2f}x / {first} / {_med(bw, T) / lh[0]:.2f}x, {mem:.2f}x")
        cells.append(f"{r['lhotse_resume'][T]:.1f} / {r['bucketing_resume'][T]:.2f}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    n = [r["n"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    series = {
        "Lhotse DynamicBucketingSampler (lazy)": ("lhotse", "C0", "o-"),
        "asrkit bucketing, index cold": ("bucketing_cold", "C1", "o-"),
        "asrkit bucketing, first start after stage 2": ("bucketing_first", "C7", "o-"),
        "asrkit bucketing, index cached": ("bucketing_warm", "C2", "o-"),
        "asrkit padfree, index cold": ("padfree_cold", "C3", "o--"),
        "asrkit padfree, index cached": ("padfree_warm", "C4", "o--"),
    }
    for label, (key, color, style) in series.items():
        if not all(r.get(key) for r in rows):
            continue
        a.plot(n, [_med(r[key], T) for r in rows], style, color=color, label=label)
        b.plot(n, [_med(r[key], "peak_rss_mb") for r in rows], style, color=color, label=label)
    before = sorted((int(k), v) for k, v in res.get("before", {}).items())
    if before:
        label = f"asrkit before ({res.get('before_commit', 'eager cuts')}), bucketing"
        a.plot([k for k, _ in before], [v[T] for _, v in before], "x-", color="k", label=label)
        b.plot([k for k, _ in before], [v["peak_rss_mb"] for _, v in before], "x-", color="k", label=label)
    a.plot(n, [r["lhotse_resume"][T] for r in rows], "s:", color="C0", label="Lhotse: resume at half-epoch")
    a.plot(n, [r["bucketing_resume"][T] for r in rows], "s:", color="C2", label="asrkit: resume at half-epoch")
    prep = [r for r in rows if r.get("prepare")]
    for ax, key in ((a, T), (b, "peak_rss_mb")):
        if prep:
            ax.plot([r["n"] for r in prep], [r["prepare"][key] for r in prep], "^-.", color="C5", label="stage 1 prepare")
        ax.plot(n, [r["check"][key] for r in rows], "v-.", color="C6", label="stage 2 audio check (sampled > 10 k)")
    for ax, yl in ((a, "CPU seconds"), (b, "peak RSS per process (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("utterances in the training manifests")
        ax.set_ylabel(yl)
        ax.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=7)
    b.set_title("sampler start-up to the first batch; stages 1-2 (memory)", fontsize=9)
    a.set_title("sampler start-up to the first batch; resume; stages 1-2 (CPU)", fontsize=9)
    fig.suptitle(f"asrkit data stages at LibriSpeech 960 h's size ({res['cpu']}, 2 shared cores)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def growth(res: dict, key: str) -> float:
    """Exponent of a power-law fit time ~ n^k between the two largest sizes."""
    import math

    r = res["rows"]
    if len(r) < 2:
        return float("nan")
    a, b = r[-2], r[-1]
    return math.log(_med(b[key], T) / _med(a[key], T)) / math.log(b["n"] / a["n"])


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="asrkit bench scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=f"10000,30000,100000,{LIBRI_960}", help="corpus sizes (utterances, comma-separated) to measure (default: %(default)s)")
    p.add_argument("--work", type=Path, default=Path("/tmp/asrkit_bench_scale"), help="corpora and manifests (kept)")
    p.add_argument("--out", type=Path, default=Path("bench_scale"), help="writes OUT.json, OUT.md, OUT.png")
    p.add_argument("--rounds", type=int, default=1, help="paired repetitions of the start-up measurements")
    p.add_argument("--check-full", type=int, default=30000, help="audio check whole up to this many utterances")
    p.add_argument("--sample", type=int, default=3000, help="audio check sample beyond --check-full")
    p.add_argument("--fbank-sample", type=int, default=300, help="feature storage sample (0 = skip)")
    p.add_argument("--stages", default=",".join(STAGES), help="which measurements (default: all): " + ",".join(STAGES))
    p.add_argument("--part", default="", help="with --stages prepare: prepare this training part only")
    p.add_argument("--report", action="store_true", help="only write OUT.md and OUT.png from OUT.json")
    args = p.parse_args(argv)
    args.stages = [s for s in args.stages.split(",") if s]
    from asrkit.utils import cpu_model

    cpu = cpu_model()
    out = args.out.with_suffix(".json")
    res = json.loads(out.read_text()) if out.is_file() else {"cpu": cpu, "cores": os.cpu_count(),
                                                             "max_duration": MAX_DURATION, "rows": []}
    rows = {r["n"]: r for r in res["rows"]}
    for n in [] if args.report else [int(x) for x in args.sizes.split(",")]:
        print(f"== {n} utterances: {', '.join(args.stages)}", file=sys.stderr, flush=True)
        rows[n] = measure(args.work, n, args, rows.get(n, {}))
        res["rows"] = [rows[k] for k in sorted(rows)]
        out.write_text(json.dumps(res, indent=1))
    done = [r for r in res["rows"] if all(k in r for k in ("check", "lhotse", "bucketing_warm", "lhotse_resume"))]
    if len(done) < len(res["rows"]):
        print(f"(report: {len(done)} of {len(res['rows'])} sizes have every stage measured)", file=sys.stderr)
    res = dict(res, rows=done)
    if not done:
        return 0
    res["growth"] = {k: growth(res, k) for k in ("lhotse", "columns", "bucketing_cold", "bucketing_first", "bucketing_warm",
                                                  "padfree_cold", "padfree_first", "padfree_warm")
                     if all(r.get(k) for r in done)}
    args.out.with_suffix(".growth.json").write_text(json.dumps(res["growth"], indent=1))
    args.out.with_suffix(".md").write_text(table(res) + "\n")
    plot(res, args.out.with_suffix(".png"))
    print(table(res))
    print("growth exponents (time ~ n^k between the two largest sizes):", json.dumps(res["growth"]))
    return 0
