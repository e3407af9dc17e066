"""``pos_enc``: the cost of every positional encoding (time and peak memory against ``nopos``).

    python -m asrkit.bench pos_enc [--quick] [--out bench.md]

``pos_enc`` times forward + backward (training mode, so CAPE/SHAPE augmentation and SPE draws are
included) of a 6-layer, 256-dim, 4-head, d_ff 1024 post-LN encoder on ``--threads`` CPU threads
(default 2), fed frames directly (``TransformerEncoder.forward_frames``: the conv frontend is
bypassed, so T is the number of frames *after* the frontend; full-length batch, no padding).
Every encoding runs against ``nopos`` in the same run, and ``nopos`` against
``torch.nn.TransformerEncoder`` of the same size (same dropout, post-LN, batch_first).
SPE needs linear attention, so it is compared with ``nopos`` on the same linear attention and is
also run at longer T to show memory growing linearly. The row ``relpos (bias materialized)`` runs
relpos without any fused CPU attention, ``relpos (no compiled kernel)`` without the compiled kernel
(``asrkit/model/csrc/relpos_attention.cpp``) but with the PyTorch fused path
(:func:`asrkit.model.attention.attention_qbias`): the A/B of those optimizations
(``--lengths 1000 --long --only relpos`` for just those rows). The compiled kernel is built before
any timing (a first run compiles it, ~25-60 s). ``alibi`` (fixed
slopes) gives SDPA one constant bias per forward; ``alibi (learned slopes: fused bias)`` needs the
bias's gradient and takes the fused CPU attention instead.

Method. Time: for each T and each row, one subprocess builds the row's model and its base row's
(``nopos`` on the same attention), runs a tiny warm-up step each (loads kernels), then
``--reps`` rounds in which both run one full step, in a random order each round. A row's time is
its median step; its ratio is the median over rounds of (its step / the base row's step in the
same round): a slow spell of the machine (this is a VM whose wall time of one step varies by
+-20 %) hits both sides of each ratio alike, and no row shares its process (allocator, caches)
with any model but its base. Memory: each (row, T) runs in a fresh
subprocess: build, tiny warm-up, read the resident set size (RSS, /proc/self/statm), one full
step; peak memory is the process high-water mark ``ru_maxrss`` (getrusage) minus that RSS: the
extra memory the forward + backward really touched (activations saved for backward, temporaries,
gradients, allocator overhead). tracemalloc cannot see torch allocations and torch's CPU
allocator keeps no peak statistic; a fresh process makes the high-water mark belong to that
measurement alone. Large buffers are mmap-ed and returned to the OS when freed, so the
high-water mark is close to the true peak.

OpenMP: workers run with OpenMP's default waiting (threads spin a while at a barrier, then
sleep), which is what a user's training run gets; ``--omp-wait passive|active`` sets
``OMP_WAIT_POLICY`` for them instead (an ``OMP_WAIT_POLICY`` already in the environment is kept
unless the option is given). Passive waiting charges every parallel region (every op, and MKL's
GEMMs several times) a thread wake-up, which on a VM can cost up to ~1 ms (measured on the 2-core
development VM: ``index_add_`` of 8 k x 64 rows 0.15 ms default, 1.5 ms passive; a 512 x 64 x 1136
GEMM ~1.5x slower), so passive ratios largely count how many ops an encoding issues rather than
its work. The process CPU time of each step is recorded too; its ratios are printed in a second
table. ``--amp bf16`` runs every row under CPU autocast (``train.amp=bf16``).
"""
from __future__ import annotations


from asrkit.cliargs import Parser
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

#: (label, pos_enc, attention[, extra config overrides]); "torch" = torch.nn.TransformerEncoder
POS_ENC_ROWS: list[tuple] = [
    ("torch.nn.TransformerEncoder", "torch", "softmax"),
    ("nopos", "nopos", "softmax"),
    ("sinpos", "sinpos", "softmax"),
    ("abspos", "abspos", "softmax"),
    ("relpos", "relpos", "softmax"),
    ("relpos (6 s context)", "relpos", "softmax", ["encoder.pos.context_s=6.0"]),
    ("relpos (bias materialized)", "relpos", "softmax", ["!materialize"]),  # the unfused path, for A/B
    ("relpos (no compiled kernel)", "relpos", "softmax", ["!nokernel"]),  # the PyTorch fused path, for A/B
    ("relpos_first", "relpos_first", "softmax"),
    ("cape", "cape", "softmax"),
    ("shape", "shape", "softmax"),
    ("cpe", "cpe", "softmax"),
    ("concat_sin", "concat_sin", "softmax"),
    ("rope", "rope", "softmax"),
    ("rope (augment cape)", "rope", "softmax", ["encoder.pos.augment=cape"]),
    ("alibi", "alibi", "softmax"),
    ("alibi (augment cape)", "alibi", "softmax", ["encoder.pos.augment=cape"]),
    ("alibi (learned slopes: fused bias)", "alibi", "softmax", ["encoder.pos.learn_slopes=true"]),
    ("nopos + linear_relu", "nopos", "linear_relu"),
    ("spe_sine + linear_relu", "spe_sine", "linear_relu"),
    ("spe_conv + linear_relu", "spe_conv", "linear_relu"),
    ("nopos + linear_favor", "nopos", "linear_favor"),
    ("spe_sine + linear_favor", "spe_sine", "linear_favor"),
]

D_MODEL, N_LAYERS, N_HEADS, D_FF, DROPOUT = 256, 6, 4, 1024, 0.1


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _build(pos_enc: str, attention: str, extra: list[str]):
    import torch
    from torch import nn

    if pos_enc == "torch":
        layer = nn.TransformerEncoderLayer(D_MODEL, N_HEADS, D_FF, DROPOUT, batch_first=True, norm_first=False)
        layer.self_attn.dropout = 0.0  # as ours (encoder.attn_dropout=0): dropout after attention and in the FFN only
        enc = nn.TransformerEncoder(layer, N_LAYERS, enable_nested_tensor=False)
        return lambda x, lens, times: enc(x)
    from asrkit.model import transformer
    from asrkit.training.checks import load_config

    materialize = "!materialize" in extra  # run a QBias (relpos) through the materialized bias + SDPA-style path
    if "!nokernel" in extra:  # relpos without its compiled kernel (asrkit.model.kernels): the PyTorch fused path
        os.environ["ASRKIT_KERNELS"] = "0"
    extra = [e for e in extra if e not in ("!materialize", "!nokernel")]
    cfg = load_config(None, [
        f"encoder.pos_enc={pos_enc}", f"encoder.attention={attention}", f"encoder.d_model={D_MODEL}",
        f"encoder.n_layers={N_LAYERS}", f"encoder.n_heads={N_HEADS}", f"encoder.d_ff={D_FF}",
        f"encoder.dropout={DROPOUT}", "encoder.layer_drop=0.0", "encoder.attn_dropout=0.0", *extra,
    ])
    enc = transformer.build(cfg)
    torch.manual_seed(0)

    def fwd(x, lens, times):
        import asrkit.model.attention as attention

        attention.FUSE_QBIAS = not materialize
        return enc.forward_frames(x, lens, times)[0]

    return fwd


def _step_fn(fwd, B: int, amp: Optional[str] = None):
    """One forward + backward at length t, under CPU autocast in ``amp`` (``bf16``) if given."""
    import torch

    from asrkit.training.optim import AMP_DTYPES

    dtype = AMP_DTYPES[amp or "none"]

    def step(t: int) -> tuple[float, float]:
        x = torch.randn(B, t, D_MODEL, requires_grad=True)
        lens = torch.full((B,), t, dtype=torch.long)
        times = (torch.arange(t, dtype=torch.float32) * 0.03).expand(B, t)
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            y = fwd(x, lens, times)
        y.float().pow(2).mean().backward()
        return time.perf_counter() - t0, time.process_time() - c0

    return step


def _pos_enc_time_worker(spec: dict) -> dict:
    """Timing of all rows at one T, in one process, interleaved: round r runs every row once, so
    a change of load on the machine hits all rows alike. Returns label -> median wall / CPU time and every round's."""
    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    steps = {label: _step_fn(_build(pe, att, extra), spec["batch"], spec.get("amp"))
             for label, pe, att, extra in spec["rows"]}
    for step in steps.values():
        step(8)
    wall: dict[str, list] = {k: [] for k in steps}
    cpu: dict[str, list] = {k: [] for k in steps}
    order = list(steps)
    for r in range(spec["reps"]):
        random.Random(r).shuffle(order)  # no row always runs right after another one
        for label in order:
            w, c = steps[label](spec["T"])
            wall[label].append(w)
            cpu[label].append(c)
    return {k: {"time_s": statistics.median(wall[k]), "cpu_s": statistics.median(cpu[k]), "all_s": wall[k],
                "all_cpu_s": cpu[k]} for k in steps}


def _pos_enc_mem_worker(spec: dict) -> dict:
    """Peak memory of one row at one T (runs in its own process, see module doc)."""
    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    step = _step_fn(_build(spec["pos_enc"], spec["attention"], spec.get("extra", [])), spec["batch"], spec.get("amp"))
    step(8)
    rss0 = _rss_bytes()
    wall, cpu = step(spec["T"])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"time_s": wall, "cpu_s": cpu, "peak_mb": max(0, peak - rss0) / 2**20}


WORKERS = {"_pos_enc_time_worker": _pos_enc_time_worker, "_pos_enc_mem_worker": _pos_enc_mem_worker}


def _run_worker(name: str, spec: dict, timeout: float) -> Optional[dict]:
    cmd = [sys.executable, "-m", "asrkit.bench", "--worker", f"{__name__}:{name}", json.dumps(spec)]
    n = str(spec["threads"])
    env = dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
    if spec.get("omp_wait"):
        env["OMP_WAIT_POLICY"] = spec["omp_wait"].upper()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"  [{name} T={spec['T']}] timed out after {timeout:.0f} s", file=sys.stderr)
        return None
    if p.returncode != 0:
        print(f"  [{name} T={spec['T']}] failed:\n{p.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def _fmt_ratio(v: Optional[float], base: Optional[float]) -> str:
    return f"{v / base:.2f}x" if v is not None and base else "-"


def _paired_ratio(r: dict, key: str = "all_s", invert: bool = False) -> str:
    """Median over rounds of (row time / base time) in the same round of the same process: a slow
    spell of the machine hits both sides of each ratio alike."""
    pairs = zip(r[key], r["base_" + key])
    return f"{statistics.median((y / x) if invert else (x / y) for x, y in pairs):.2f}x"


def _base_label(row: tuple) -> str:
    """The row a row is compared with: ``nopos`` on the same attention (``nopos`` for torch)."""
    label, pos_enc, attention = row[:3]
    return "nopos" if attention == "softmax" else f"nopos + {attention}"


def _reps(T: int, reps: int = 0) -> int:
    return reps or (9 if T <= 1000 else 3 if T <= 3000 else 2)


def main(argv: list[str]) -> int:
    p = Parser(prog="asrkit bench pos_enc", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="T = 100, 300 (+1000 for linear attention): a smoke run")
    p.add_argument("--out", type=Path, help="also write the table as Markdown to this file")
    p.add_argument("--batch", type=int, default=1, help="utterances per batch (all full length)")
    p.add_argument("--threads", type=int, default=2, help="torch threads per measurement process (default: %(default)s)")
    p.add_argument("--reps", type=int, default=0, help="timing rounds (default 9 / 3 / 2 for T <= 1000 / 3000 / more)")
    p.add_argument("--lengths", type=int, nargs="+", help="frame counts for all rows (default 100 1000 3000)")
    p.add_argument("--long", type=int, nargs="*", help="extra lengths for linear-attention rows (default 10000)")
    p.add_argument("--only", nargs="+", help="only rows whose label contains one of these")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    p.add_argument("--omp-wait", choices=["passive", "active"],
                   help="OMP_WAIT_POLICY of the workers (default: OpenMP's own, spin then sleep)")
    p.add_argument("--amp", choices=["none", "bf16"], default="none",
                   help="CPU autocast of every row (train.amp; bf16 pays on CPUs with AMX, README)")
    args = p.parse_args(argv)
    import torch  # noqa: F401  (fail here, clearly, rather than in every worker)

    lengths = args.lengths or ([100, 300] if args.quick else [100, 1000, 3000])
    long = args.long if args.long is not None else ([1000] if args.quick else [10000])
    long = [t for t in long if t not in lengths]
    rows = [r for r in POS_ENC_ROWS if not args.only or any(o in r[0] for o in args.only)]
    if any(r[1].startswith("relpos") for r in rows):
        from asrkit.model import kernels

        kernels.load("relpos_attention")  # built here once (~25-60 s the first time), not in a timed worker
    bases = {_base_label(r) for r in rows}  # plus the base rows they are measured against
    rows = [r for r in POS_ENC_ROWS if r in rows or r[0] in bases]
    res: dict[tuple[str, int], Optional[dict]] = {}
    t_start = time.time()
    for T in lengths + long:
        todo = [(label, pe, att, extra[0] if extra else []) for label, pe, att, *extra in rows
                if T not in long or att.startswith("linear")]
        reps = _reps(T, args.reps)
        by_label = {row[0]: row for row in todo}
        times: dict[str, dict] = {}
        base_runs: dict[str, list] = {}
        for row in todo:  # every row in its own process, against its base row in the same process
            label, _, attention, _ = row
            base = _base_label(row)
            if label == base:
                continue
            spec = dict(T=T, batch=args.batch, threads=args.threads, reps=reps, rows=[by_label[base], row],
                        omp_wait=args.omp_wait, amp=args.amp)
            r = _run_worker("_pos_enc_time_worker", spec, args.timeout * 2)
            if r is not None:
                times[label] = dict(r[label], base_all_s=r[base]["all_s"], base_all_cpu_s=r[base]["all_cpu_s"])
                base_runs.setdefault(base, []).append(r[base])
        for base, runs in base_runs.items():
            all_s = [x for run in runs for x in run["all_s"]]
            all_cpu = [x for run in runs for x in run["all_cpu_s"]]
            times[base] = {"time_s": statistics.median(all_s), "cpu_s": statistics.median(all_cpu),
                           "all_s": all_s, "all_cpu_s": all_cpu, "base_all_s": all_s, "base_all_cpu_s": all_cpu}
        for label, pos_enc, attention, extra in todo:
            mem = _run_worker("_pos_enc_mem_worker", dict(pos_enc=pos_enc, attention=attention, T=T, batch=args.batch,
                                                          threads=args.threads, extra=extra, omp_wait=args.omp_wait,
                                                          amp=args.amp),
                              args.timeout)
            r = times.get(label)
            res[(label, T)] = None if r is None or mem is None else dict(r, peak_mb=mem["peak_mb"])
            msg = "failed" if res[(label, T)] is None else f"{1000 * r['time_s']:9.1f} ms {mem['peak_mb']:8.1f} MB"
            print(f"  T={T:<6d} {label:<28s} {msg}", file=sys.stderr, flush=True)
    all_T = lengths + long
    lines = [
        f"# pos_enc benchmark: {N_LAYERS} layers, d={D_MODEL}, {N_HEADS} heads, d_ff={D_FF}, batch {args.batch}, "
        f"{args.threads} CPU threads, forward+backward (train mode), OpenMP waiting: "
        f"{args.omp_wait or os.environ.get('OMP_WAIT_POLICY') or 'default'}"
        f"{'' if args.amp == 'none' else f', autocast {args.amp}'}",
        "",
        f"Time = median over {'/'.join(str(_reps(T, args.reps)) for T in lengths + long)} rounds (T = "
        f"{'/'.join(str(T) for T in lengths + long)}); every row runs in its own process together with its base row, "
        "the two alternating in a random order each round; time ratio = median over rounds of the ratio to the base "
        "row in the same round (base rows: all their rounds); memory = peak RSS "
        "increase during one forward+backward (fresh process per cell). Ratios: vs `nopos` with the same attention (softmax rows) / vs "
        "`nopos + <same linear attention>` (linear rows); `torch.nn.TransformerEncoder` row: nopos vs torch "
        "(nopos time / torch time).",
        "",
    ]
    head = "| encoding | " + " | ".join(f"T={T} ms | x | MB | x" for T in all_T) + " |"
    lines += [head, "|---|" + "---:|---:|---:|---:|" * len(all_T)]
    cpu_lines = ["", "Same runs, ratios of process CPU time (user + sys, all threads; less sensitive to other "
                 "processes on a shared machine than wall time):", "",
                 "| encoding | " + " | ".join(f"T={T}" for T in all_T) + " |", "|---|" + "---:|" * len(all_T)]
    for row in rows:
        label, pos_enc = row[0], row[1]
        base_label = _base_label(row)
        cells, cpu_cells = [], []
        for T in all_T:
            r, b = res.get((label, T)), res.get((base_label, T))
            if r is None:
                cells.append("- | - | - | -")
                cpu_cells.append("-")
                continue
            inv = pos_enc == "torch"  # that row shows nopos / torch
            ratio_t, ratio_c = _paired_ratio(r, invert=inv), _paired_ratio(r, "all_cpu_s", invert=inv)
            if b is None:
                ratio_m = "-"
            else:
                ratio_m = _fmt_ratio(b["peak_mb"], r["peak_mb"]) if inv else _fmt_ratio(r["peak_mb"], b["peak_mb"])
            cells.append(f"{1000 * r['time_s']:.0f} | {ratio_t} | {r['peak_mb']:.0f} | {ratio_m}")
            cpu_cells.append(ratio_c)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        cpu_lines.append(f"| {label} | " + " | ".join(cpu_cells) + " |")
    lines += cpu_lines
    lines += ["", f"Total wall time {time.time() - t_start:.0f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from asrkit.utils import atomic_write

        with atomic_write(args.out) as f:
            f.write(text)
    failed = sorted(f"{label} T={T}" for (label, T), r in res.items() if r is None)
    if failed:
        print(f"asrkit bench pos_enc: {len(failed)} measurement(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
