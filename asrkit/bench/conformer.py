"""``conformer``: where a CPU training step of the mini Conformer goes, against the mini Transformer.

    python -m asrkit.bench conformer [--a CONF] [--b CONF] [--rounds 5] [--threads 2] [--set KEY=VALUE] [--out bench.md]

Both configs (default: ``egs/mini/asr1/conf/train_conformer.yaml`` and ``train.yaml``) step the
trainer's step (:class:`asrkit.bench.train.Stepper`: forward, CTC loss, backward, clipping, Adam,
EMA) on the same padded batch: ``data.max_duration`` seconds of random fbank in utterances drawn
uniformly from ``--min-s``..``--max-s`` (one bucket of the mini sampler), padded to the longest.
After ``--warmup`` steps each, the two alternate (A B A B ...) for ``--rounds`` rounds; each step's
wall and CPU time (``time.process_time``) are kept, and the ratio is the median of the per-round
ratios, so a slow spell of a shared machine hits both sides of it.

Then, for the first config: a :mod:`torch.profiler` table of one step (top operators by self CPU
time), the share of the step in the frontend and in the convolution modules (each timed alone,
forward + backward on the shapes it sees in the step), the FLOPs of the step by operator kind
(:func:`asrkit.bench.sizes.flop_counter`) and the time they would take at this CPU's measured
fp32 GEMM peak (:func:`asrkit.bench.train.gemm_peak`, ``--threads`` threads).
"""
from __future__ import annotations

import argparse

from asrkit.cliargs import Parser
import statistics
import time
from pathlib import Path

import torch

_MINI = Path(__file__).resolve().parents[2] / "egs" / "mini" / "asr1" / "conf"
VOCAB = 32  #: letters + blank, about mini's


def padded_batch(cfg, min_s: float, max_s: float, seed: int = 0) -> dict:
    """``cfg.data.max_duration`` seconds of random fbank in utterances of ``min_s``..``max_s``
    seconds, padded; random letter targets of one per ~80 ms."""
    g = torch.Generator().manual_seed(seed)
    hop = cfg.features.hop
    lens: list[int] = []
    while sum(lens) * hop + max_s <= cfg.data.max_duration:
        lens.append(round((min_s + (max_s - min_s) * float(torch.rand(1, generator=g))) / hop))
    T = max(lens)
    feats = torch.randn(len(lens), T, cfg.features.n_mels, generator=g)
    lengths = torch.tensor(lens)
    feats *= (torch.arange(T)[None, :] < lengths[:, None])[..., None]
    target_lens = lengths // 8
    targets = torch.randint(1, VOCAB, (len(lens), int(target_lens.max())), generator=g)
    times = torch.arange(T).float()[None].expand(len(lens), -1) * hop
    return {"feats": feats, "feat_lens": lengths, "times": times.contiguous(), "targets": targets,
            "target_lens": target_lens}


def _timed(step, batch) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    step(batch)
    return time.perf_counter() - w, time.process_time() - c


def _fwd_bwd(fn, *inputs) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn(*inputs)
    (out[0] if isinstance(out, tuple) else out).sum().backward()
    return time.perf_counter() - w, time.process_time() - c


def _medians(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def parts(model, batch, reps: int = 5) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of forward + backward of the frontend and of all convolution
    modules alone, on the inputs they see in a step of ``batch``."""
    enc = model.encoder
    feats, lens, times = batch["feats"], batch["feat_lens"], batch["times"]
    out: dict[str, tuple[float, float]] = {}
    out["frontend"] = _medians([_fwd_bwd(enc.frontend, feats, lens, times) for _ in range(reps + 1)][1:])
    with torch.no_grad():
        x, flens, _ = enc.frontend(feats, lens, times)
    mask = torch.arange(x.shape[1])[None, :] < flens[:, None]
    convs = [layer.conv for layer in enc.layers if hasattr(layer, "conv")]
    if convs:
        x = x.detach().requires_grad_(True)

        def all_convs(h):
            return sum(c(h, mask) for c in convs)

        out["conv modules"] = _medians([_fwd_bwd(all_convs, x) for _ in range(reps + 1)][1:])
    return out


def flops_by_kind(step, batch) -> dict[str, int]:
    """FLOPs of forward + backward of ``batch``: matmul (mm/addmm/bmm/attention), convolution."""
    from asrkit.bench.sizes import flop_counter

    with flop_counter() as fc:
        loss, n = step.loss(batch)
        (loss / n).backward()
    step.optimizer.zero_grad(set_to_none=True)
    kinds = {"matmul": 0, "convolution": 0, "other": 0}
    for op, f in fc.get_flop_counts().get("Global", {}).items():
        name = str(op)
        k = "convolution" if "convolution" in name else (
            "matmul" if any(s in name for s in ("mm", "attention", "matmul")) else "other")
        kinds[k] += int(f)
    return kinds


def profile_table(step, batch, top: int = 15) -> str:
    """torch.profiler's operator table of one step, top ``top`` by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step(batch)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=45)


def run(a: argparse.Namespace) -> str:
    from asrkit.bench.train import Stepper, gemm_peak
    from asrkit.training.checks import load_config
    from asrkit.utils import cpu_model

    torch.set_num_threads(a.threads)
    cfgs = {"A": load_config(a.a, a.set), "B": load_config(a.b, a.set)}
    steps = {k: Stepper(c, VOCAB, torch.device("cpu")) for k, c in cfgs.items()}
    batch = padded_batch(cfgs["A"], a.min_s, a.max_s)
    B, T = batch["feats"].shape[:2]
    real = int(batch["feat_lens"].sum())
    for _ in range(a.warmup):
        for st in steps.values():
            st(batch)
    wall = {k: [] for k in steps}
    cpu = {k: [] for k in steps}
    for r in range(a.rounds):
        for k in (("A", "B") if r % 2 == 0 else ("B", "A")):
            w, c = _timed(steps[k], batch)
            wall[k].append(w)
            cpu[k].append(c)
    ratio_w = statistics.median(x / y for x, y in zip(wall["A"], wall["B"]))
    ratio_c = statistics.median(x / y for x, y in zip(cpu["A"], cpu["B"]))
    lines = [f"## One training step, {a.a.name} (A) against {a.b.name} (B)", "",
             (f"{cpu_model() or 'unknown CPU'}; torch {torch.__version__}; {a.threads} threads; batch {B} x {T} frames "
              f"({real * cfgs['A'].features.hop:.1f} s of audio, {1 - real / (B * T):.1%} padding); "
              f"{a.warmup} warm-up steps each, then {a.rounds} rounds A B / B A"), "",
             "| config | parameters | wall s/step (median) | CPU s/step (median) | all wall s |", "|---|---:|---:|---:|---|"]
    for k, path in (("A", a.a), ("B", a.b)):
        p = sum(x.numel() for x in steps[k].model.parameters()) / 1e6
        lines.append(f"| {k}: {path.name} | {p:.2f} M | {statistics.median(wall[k]):.3f} | {statistics.median(cpu[k]):.3f} "
                     f"| {' '.join(f'{x:.2f}' for x in wall[k])} |")
    lines += ["", f"A / B: **{ratio_w:.2f}x** wall, {ratio_c:.2f}x CPU time (medians of per-round ratios)", ""]
    peak, n = gemm_peak(torch.device("cpu"), torch.float32, sizes=(2048,), seconds=a.peak_seconds)
    lines += [f"fp32 GEMM peak, {a.threads} threads ({n}x{n} matmul loop, best): **{peak / 1e9:.1f} GFLOP/s**", "",
              ("| config | matmul GFLOP | conv GFLOP | matmul-bound s | (matmul+conv)-bound s | step wall s | "
               f"step CPU s / {a.threads} | matmul-bound share of wall | of CPU s / {a.threads} |"),
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k, path in (("A", a.a), ("B", a.b)):
        f = flops_by_kind(steps[k], batch)
        st, sc = statistics.median(wall[k]), statistics.median(cpu[k]) / a.threads
        lines.append(f"| {k}: {path.name} | {f['matmul'] / 1e9:.1f} | {f['convolution'] / 1e9:.1f} | "
                     f"{f['matmul'] / peak:.3f} | {(f['matmul'] + f['convolution']) / peak:.3f} | {st:.3f} | {sc:.3f} | "
                     f"{f['matmul'] / peak / st:.0%} | {f['matmul'] / peak / sc:.0%} |")
    lines += ["", "Parts, forward + backward alone on the step's shapes (median of 5):", "",
              "| config | part | wall s | CPU s | share of the step's CPU time (median) |", "|---|---|---:|---:|---:|"]
    for k, path in (("A", a.a), ("B", a.b)):
        for name, (w, c) in parts(steps[k].model, batch).items():
            lines.append(f"| {k}: {path.name} | {name} | {w:.3f} | {c:.3f} | {c / statistics.median(cpu[k]):.0%} |")
    if a.profile:
        lines += ["", f"torch.profiler, one step of A ({a.a.name}), top 15 operators by self CPU time:", "", "```",
                  profile_table(steps["A"], batch), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="asrkit bench conformer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, default=_MINI / "train_conformer.yaml", help="config A (profiled)")
    ap.add_argument("--b", type=Path, default=_MINI / "train.yaml", help="config B")
    ap.add_argument("--min-s", type=float, default=4.5, help="shortest utterance of the batch, seconds")
    ap.add_argument("--max-s", type=float, default=4.8, help="longest utterance of the batch, seconds")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps of each model first (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating timed rounds, A B then B A (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    ap.add_argument("--peak-seconds", type=float, default=3.0, help="seconds of the GEMM peak measurement (default: %(default)s)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override applied to both configs (repeatable)")
    ap.add_argument("--no-profile", dest="profile", action="store_false", help="skip the per-operator profile of one step of A")
    ap.add_argument("--out", type=Path, help="also write the report here (Markdown)")
    a = ap.parse_args(argv)
    text = run(a)
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0
