"""``peers --arch espnet``: the same model on both sides, its training step and decoding timed.

Both sides build ESPnet's CTC Transformer (asrkit from ``--config``, by default
``egs/speechocean762/asr1/conf/train_espnet_equal.yaml``; ESPnet its ``TransformerEncoder`` with
conv2d input + ``CTC`` at the same size, ``tools/peers/espnet/step_bench.py`` in its venv) and run
the same work in fresh processes, alternating A B A B (``--rounds`` each, order alternating):

* ``--warmup`` steps not timed, then ``--bench-steps`` timed optimizer steps over the same batches
  (utterance lengths from ``--durations``, grouped by ESPnet's length rule at ``data.max_duration``;
  features and letter targets from ``numpy.random.default_rng(batch index)`` on both sides); a
  step = encoder forward, CTC loss, backward, gradient clipping at ``optim.clip_grad``, Adam at
  ``optim.lr``: the model's work, not either trainer's data loading or logging;
* flush-to-zero on both sides (asrkit's bench processes flush; ESPnet's worker is told to);
* memory: peak RSS minus the RSS after imports, model, optimizer and batches (the step's own),
  and the whole-process peak beside it;
* decoding of the model alone: encoder + CTC argmax over the same cuts, batch 1 and batched;
* one step of each side under ``torch.profiler`` (top operators by self CPU time);
* model FLOP utilization: the model's FLOPs per step (forward + backward of the timed batches,
  :func:`asrkit.bench.sizes.flop_counter` on asrkit's side; ESPnet's side counts with torch's stock
  counter, a check) over the step time and the best square matrix product measured in the same run,
  on the same device, in the step's dtype.

``--device cuda`` runs both sides on a GPU (memory: the CUDA allocator's peak above its allocation
after set-up); ``--amp bf16`` puts forward and loss under ``torch.autocast`` in bf16 on both sides.

Padded frames per step are reported for both samplers on those durations: ESPnet's length
batches (the timed ones) and asrkit's BucketingSampler at the same ``max_duration``.
"""
from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from asrkit.bench.peers.common import REPO, PeersError

ESPNET_STEP = Path("tools/peers/espnet/step_bench.py")
DEFAULT_CONFIG = Path("egs/speechocean762/asr1/conf/train_espnet_equal.yaml")
#: real utterance durations (speechocean762 test, 60 utterances) committed with the ESPnet fixtures
DEFAULT_DURATIONS = Path("tests/fixtures/espnet/durations.json")
HOP = 0.01


def _rss() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def length_batches(durations: list[float], max_duration: float) -> list[list[float]]:
    """ESPnet's ``batch_type: length`` on sorted durations (speech only): a batch closes with the
    utterance whose padded size (count x longest) crosses ``max_duration`` (as
    :func:`asrkit.bench.peers.espnet_config.batches_per_pass` counts them)."""
    out: list[list[float]] = []
    cur: list[float] = []
    for d in sorted(durations):
        cur.append(d)
        if len(cur) * max(cur) > max_duration:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def bucketing_batches(durations: list[float], max_duration: float, num_buckets: int, seed: int = 0,
                      order: str = "shuffle") -> list[list[float]]:
    """asrkit's BucketingSampler's batches of epoch 0 (durations only)."""
    from asrkit.data.batching import BucketingSampler
    from asrkit.data.cut_index import CutTable

    d = np.asarray(durations, dtype=np.float64)
    table = CutTable([], d, np.round(d * 16000).astype(np.int64), np.full(len(d), 16000))
    return [[float(d[i]) for i in b] for b in BucketingSampler(table, max_duration, num_buckets, seed, order=order).all_batches(0)]


def padding_stats(batches: list[list[float]]) -> dict:
    """Frames (10 ms) per step: real, padded (batch size x longest) and the padded share."""
    real = sum(sum(b) for b in batches) / HOP
    padded = sum(len(b) * max(b) for b in batches) / HOP
    return {"batches": len(batches), "real_frames_per_step": real / len(batches),
            "padded_frames_per_step": padded / len(batches), "padding_share": 1 - real / padded}


def _batch(spec: dict, i: int, lengths: list[int]):
    """The same numbers as tools/peers/espnet/step_bench.py's ``batch``."""
    import torch

    g = np.random.default_rng(i)
    T = max(lengths)
    feats = np.zeros((len(lengths), T, spec["n_mels"]), np.float32)
    for b, n in enumerate(lengths):
        feats[b, :n] = g.standard_normal((n, spec["n_mels"]), dtype=np.float32)
    n_tok = [max(1, (((n - 1) // 2 - 1) // 2) // 3) for n in lengths]
    targets = g.integers(1, spec["vocab"], size=(len(lengths), max(n_tok)))
    lens = torch.tensor(lengths)
    return {"feats": torch.from_numpy(feats), "feat_lens": lens,
            "times": (torch.arange(T, dtype=torch.float32) * HOP).expand(len(lengths), T).contiguous(),
            "targets": torch.from_numpy(targets).long(), "target_lens": torch.tensor(n_tok)}


def _asrkit_worker(spec: dict) -> dict:
    """asrkit's side (run by ``python -m asrkit.bench --worker``, which flushes denormals first)."""
    import torch

    from asrkit.bench.train import _sync
    from asrkit.config import load_config
    from asrkit.model import build_model

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    dev = torch.device(spec.get("device", "cpu"))
    amp = spec.get("amp", "none") == "bf16"
    cfg = load_config(spec["config"], spec.get("overrides", []))
    model = build_model(cfg, spec["vocab"]).to(dev)
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=spec["lr"], betas=(0.9, 0.98), eps=1e-8)

    def on_dev(b: dict) -> dict:
        return {k: v.to(dev) for k, v in b.items()}

    batches = [on_dev(_batch(spec, i, b)) for i, b in enumerate(spec["batches"])]
    base, base_dev = _rss(), _dev_mem(dev, reset=True)

    def loss(k: int):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            return model(batches[k % len(batches)])["loss"]

    def step(k: int) -> None:
        out = loss(k)
        opt.zero_grad(set_to_none=True)
        out.backward()
        torch.nn.utils.clip_grad_norm_(params, spec["clip"])
        opt.step()

    model.train()
    for k in range(spec["warmup"]):
        step(k)
    times, cpus = [], []
    for k in range(spec["warmup"], spec["warmup"] + spec["steps"]):
        _sync(dev)
        t0, c0 = time.perf_counter(), time.process_time()
        step(k)
        _sync(dev)
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out: dict[str, Any] = {"impl": "asrkit", "torch": torch.__version__, "params": sum(p.numel() for p in params),
                           "step_s": times, "step_cpu_s": cpus, "baseline_rss": base, "peak_rss": peak,
                           "device_mem": [base_dev, _dev_mem(dev)], "batch_flops": _batch_flops(loss, timed_batches(spec))}
    opt.zero_grad(set_to_none=True)
    if spec.get("profile"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(0)
        out["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    model.eval()

    def decode(bs: list[dict]) -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            for b in bs:
                model.encode(b["feats"], b["feat_lens"], b["times"]).log_probs.argmax(-1)
        _sync(dev)

    with torch.no_grad():
        out["decode_s"] = decode_passes(decode, lambda i, lengths: on_dev(_batch(spec, 1000 + i, lengths)), spec)
    return out


def _dev_mem(dev, reset: bool = False) -> int | None:
    """Bytes the CUDA allocator holds now (``reset``: and restart its peak count), or at its peak; None on CPU."""
    import torch

    if dev.type != "cuda":
        return None
    torch.cuda.synchronize(dev)
    if reset:
        torch.cuda.reset_peak_memory_stats(dev)
        return torch.cuda.memory_allocated(dev)
    return torch.cuda.max_memory_allocated(dev)


def timed_batches(spec: dict) -> list[int]:
    """The indices of the batches the timed steps run (cycled)."""
    n = len(spec["batches"])
    return sorted({k % n for k in range(spec["warmup"], spec["warmup"] + spec["steps"])})


def _batch_flops(loss, indices: list[int]) -> dict[str, int]:
    """FLOPs of forward + backward of each batch (:func:`asrkit.bench.sizes.flop_counter`: torch's
    counter, a multiply-add is 2, with the CPU's fused attention and grouped convolutions' backward
    counted), the gradients then dropped by the caller. The model's FLOPs for both sides' utilization:
    tools/peers/espnet/step_bench.py counts ESPnet's side with torch's stock counter, as a check."""
    from asrkit.bench.sizes import flop_counter

    out = {}
    for k in indices:
        with flop_counter() as counter:
            loss(k).backward()
        out[str(k)] = int(counter.get_total_flops())
    return out


def decode_passes(decode, make_batch, spec: dict) -> dict:
    """Model-alone decoding time per mode (batch 1, batched): the inputs made first, one untimed pass
    of each mode (first-call costs: page faults, kernels chosen per shape), then the median of
    ``spec["decode_passes"]`` timed passes, the modes alternating. Without the warm pass a single timed
    pass depended on what the process had done before (the page faults of a fresh heap).
    tools/peers/espnet/step_bench.py times ESPnet's side the same way."""
    modes = {"batch1": [[n] for b in spec["decode_batches"] for n in b], "batched": spec["decode_batches"]}
    inputs = {m: [make_batch(i, g) for i, g in enumerate(gs)] for m, gs in modes.items()}
    for bs in inputs.values():
        decode(bs)
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(spec.get("decode_passes", 3)):
        for m, bs in inputs.items():
            t0 = time.perf_counter()
            decode(bs)
            times[m].append(time.perf_counter() - t0)
    return {m: statistics.median(t) for m, t in times.items()}


def _run(side: str, spec: dict, espnet_venv: Path, env: dict) -> dict:
    if side == "espnet":
        cmd = [str(REPO / espnet_venv / "bin" / "python"), str(REPO / ESPNET_STEP), json.dumps(spec)]
    else:
        cmd = [sys.executable, "-m", "asrkit.bench", "--worker", f"{__name__}:_asrkit_worker", json.dumps(spec)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, cwd=REPO, timeout=3600)
    if p.returncode != 0:
        raise PeersError(f"equal-architecture step benchmark ({side}) failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def equal_bench(cfg, config_path: Path, durations: list[float], *, steps: int, warmup: int, rounds: int,
                threads: int, vocab: int, espnet_venv: Path, env: dict, overrides: list[str],
                device: str = "cpu", amp: str = "none") -> dict:
    """A B A B rounds of both sides' workers; returns every round and the summaries. ``device``
    (``cpu`` or ``cuda``) and ``amp`` (``none`` or ``bf16``: autocast of forward and loss) apply to
    both sides alike."""
    e = cfg.encoder
    conformer = (e.conv_kernel > 0 and e.macaron and e.block_norm and e.conv_norm == "batch" and e.pos_enc == "relpos_xl"
                 and e.activation in ("relu", "swish"))
    plain = not (e.conv_kernel or e.macaron or e.block_norm) and e.activation == "relu"
    if cfg.frontend.type != "conv2d" or getattr(cfg.frontend, "padding", "half") != "none" \
            or cfg.frontend.channels != e.d_model or e.pos_enc not in ("sinpos", "relpos_xl") or not e.norm_first \
            or not (plain or conformer):
        raise PeersError(f"{config_path}: --arch espnet needs ESPnet's model (frontend conv2d, padding none, channels = "
                         f"d_model; sinpos, or relpos_xl for its rel_pos; norm_first; ReLU Transformer layers, or its "
                         f"whole Conformer layer: relpos_xl with encoder.conv_kernel=K encoder.macaron=true "
                         f"encoder.block_norm=true encoder.conv_norm=batch), as {DEFAULT_CONFIG} has it")
    batches_s = length_batches(durations, cfg.data.max_duration)
    frames = [[int(round(d / HOP)) for d in b] for b in batches_s]
    dec = [[int(round(d / HOP)) for d in b] for b in length_batches(durations, cfg.data.max_duration / 4)]
    spec = {"config": str(config_path), "overrides": overrides,
            "encoder": "conformer" if conformer else "relpos_xl" if e.pos_enc == "relpos_xl" else "transformer",
            "activation": e.activation, "kernel": e.conv_kernel, "d": e.d_model, "layers": e.n_layers,
            "heads": e.n_heads, "ff": e.d_ff, "vocab": vocab, "n_mels": cfg.features.n_mels, "lr": cfg.optim.lr,
            "clip": cfg.optim.clip_grad, "threads": threads, "flush_denormal": True, "warmup": warmup,
            "steps": steps, "batches": frames, "decode_batches": dec, "decode_passes": 3, "device": device, "amp": amp}
    runs: dict[str, list[dict]] = {"asrkit": [], "espnet": []}
    for r in range(rounds):
        for side in (("asrkit", "espnet") if r % 2 == 0 else ("espnet", "asrkit")):
            res = _run(side, dict(spec, profile=(r == rounds - 1)), espnet_venv, env)
            runs[side].append(res)
            print(f"[peers] equal round {r + 1} {side}: {1000 * statistics.median(res['step_s']):.0f} ms/step",
                  file=sys.stderr, flush=True)
    peak_flops, peak_n = matmul_peak(device, amp, threads)
    audio_per_step = [sum(b) * HOP for b in frames]
    mean_audio = statistics.fmean(audio_per_step[(warmup + k) % len(frames)] for k in range(steps))
    dec_audio = sum(sum(b) for b in dec) * HOP
    out: dict[str, Any] = {"spec": {k: v for k, v in spec.items() if k not in ("batches", "decode_batches")},
                           "rounds": runs, "audio_per_step": mean_audio, "decode_audio_s": dec_audio,
                           "peak_flops": peak_flops, "peak_n": peak_n,
                           "samplers": {"espnet_length": padding_stats(batches_s),
                                        **{f"asrkit_bucketing_{o}": padding_stats(bucketing_batches(
                                            durations, cfg.data.max_duration, cfg.data.num_buckets, order=o))
                                           for o in ("shuffle", "sort")}}}
    for side, rs in runs.items():
        step = statistics.median(x for r in rs for x in r["step_s"])
        out[side] = {"params": rs[0]["params"], "step_s": step, "steps_per_s": 1 / step,
                     "audio_s_per_s": mean_audio / step,
                     "cpu_s_per_step": statistics.median(x for r in rs for x in r["step_cpu_s"]),
                     "round_step_s": [statistics.median(r["step_s"]) for r in rs],
                     "mem_above_baseline_mib": statistics.median((r["peak_rss"] - r["baseline_rss"]) / 2**20 for r in rs),
                     "peak_rss_mib": statistics.median(r["peak_rss"] / 2**20 for r in rs),
                     "decode_rtf_batch1": statistics.median(r["decode_s"]["batch1"] for r in rs) / dec_audio,
                     "decode_rtf_batched": statistics.median(r["decode_s"]["batched"] for r in rs) / dec_audio,
                     "profile": rs[-1].get("profile", "")}
        if "batch_flops" in rs[0]:  # FLOPs of the timed steps' batches (cycled), their mean
            bf = rs[0]["batch_flops"]
            out[side]["flops_per_step"] = statistics.fmean(bf[str((warmup + k) % len(frames))] for k in range(steps))
        if rs[0].get("device_mem", [None])[0] is not None:
            out[side]["device_mem_above_baseline_mib"] = statistics.median(
                (r["device_mem"][1] - r["device_mem"][0]) / 2**20 for r in rs)
    if "flops_per_step" in out["asrkit"]:  # one model: asrkit's count (the complete one) for both sides
        for side in runs:
            out[side]["mfu"] = out["asrkit"]["flops_per_step"] / out[side]["step_s"] / peak_flops
    out["espnet_version"] = runs["espnet"][0].get("espnet")
    return out


def matmul_peak(device: str, amp: str, threads: int) -> tuple[float, int]:
    """The measured ceiling for model FLOP utilization: the best FLOP/s of a square matrix product
    on ``device`` in the step's dtype (bf16 under ``amp``), in this process with ``threads``."""
    import torch

    from asrkit.bench.train import gemm_peak

    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if amp == "bf16" else torch.float32
    sizes = (2048, 4096, 8192) if device == "cuda" else (512, 1024, 2048)
    return gemm_peak(torch.device(device), dtype, sizes=sizes)


def format_equal(res: dict, cpu: str, threads: int, command: str) -> str:
    a, e = res["asrkit"], res["espnet"]
    sp = res["spec"]
    what = ("Transformer layers with Transformer-XL relative positions (ESPnet's conformer encoder with rel_pos, "
            "no macaron, no convolution module; asrkit relpos_xl)" if sp.get("encoder") == "relpos_xl"
            else f"Conformer (macaron feed-forward, convolution module of kernel {sp.get('kernel')} with BatchNorm, "
                 f"rel_pos, {sp.get('activation')}; asrkit relpos_xl + encoder.macaron/block_norm/conv_norm=batch)"
            if sp.get("encoder") == "conformer" else "CTC Transformer")
    L = [f"## The same model on both sides: ESPnet's {what} ({sp['layers']} x {sp['d']}, {sp['heads']} heads, "
         f"d_ff {sp['ff']}, conv2d subsampling), model step only", "",
         f"`{command}` on {cpu}, {threads} threads per side, {len(res['rounds']['asrkit'])} rounds per side "
         f"alternating (A B, B A, ...), {sp['warmup']} warm-up steps then {sp['steps']} timed steps per round; "
         + (f"decoding: one untimed pass, then the median of {sp['decode_passes']} timed passes per mode; "
            if "decode_passes" in sp else "decoding: one timed pass per mode; ") +
         f"ESPnet {res.get('espnet_version')}"
         + (f"; on {sp['device']}" if sp.get("device", "cpu") != "cpu" else "")
         + ("; forward and loss under bf16 autocast on both sides" if sp.get("amp", "none") == "bf16" else "")
         + ".", "",
         "| | asrkit | ESPnet | ESPnet / asrkit |", "|---|---:|---:|---:|"]

    def row(label, x, y, spec=".3f", ratio=True):
        L.append(f"| {label} | {x:{spec}} | {y:{spec}} | {(y / x if x else float('nan')):.2f}x |" if ratio
                 else f"| {label} | {x:{spec}} | {y:{spec}} | - |")

    row("parameters", a["params"], e["params"], ",", ratio=False)
    row("training step, median (s)", a["step_s"], e["step_s"])
    row("steps/s", a["steps_per_s"], e["steps_per_s"])
    row("audio-s per wall-s", a["audio_s_per_s"], e["audio_s_per_s"], ".1f")
    row("CPU-s per step (all threads)", a["cpu_s_per_step"], e["cpu_s_per_step"])
    if "flops_per_step" in a and "flops_per_step" in e:
        row("model GFLOPs per step, forward + backward (asrkit: asrkit.bench.sizes.flop_counter, which counts the CPU's "
            "fused attention and depthwise convolutions' backward right; ESPnet: "
            "torch's stock FlopCounterMode, a check)", a["flops_per_step"] / 1e9,
            e["flops_per_step"] / 1e9, ".1f", ratio=False)
        peak = res["peak_flops"]
        peak_s = f"{peak / 1e12:.0f} TFLOP/s" if peak >= 1e12 else f"{peak / 1e9:.0f} GFLOP/s"
        L.append(f"| model FLOP utilization (asrkit's count for both; of the measured {peak_s}, "
                 f"{res['peak_n']}^3 matrix product) | {100 * a['mfu']:.1f} % | {100 * e['mfu']:.1f} % | "
                 f"{e['mfu'] / a['mfu']:.2f}x |")
    if "device_mem_above_baseline_mib" in a and "device_mem_above_baseline_mib" in e:
        row("GPU memory of training above the post-set-up allocation (MiB, CUDA allocator peak)",
            a["device_mem_above_baseline_mib"], e["device_mem_above_baseline_mib"], ".0f")
    row("memory of training above the post-import baseline (MiB, peak)", a["mem_above_baseline_mib"],
        e["mem_above_baseline_mib"], ".0f")
    row("whole-process peak RSS (MiB)", a["peak_rss_mib"], e["peak_rss_mib"], ".0f")
    row("decoding RTF, model alone (encoder + CTC argmax), batch 1", a["decode_rtf_batch1"], e["decode_rtf_batch1"], ".4f")
    row("decoding RTF, model alone, batched", a["decode_rtf_batched"], e["decode_rtf_batched"], ".4f")
    L += ["", "Per-round median step (s): asrkit " + ", ".join(f"{x:.3f}" for x in a["round_step_s"])
          + "; ESPnet " + ", ".join(f"{x:.3f}" for x in e["round_step_s"]) + ".", ""]
    s = res["samplers"]
    L += [f"Same batches on both sides: {res['audio_per_step']:.1f} s of audio per step. Padding of the two samplers "
          "on these durations (10 ms frames per step):", "",
          "| sampler | batches | real frames/step | padded frames/step | padded share |", "|---|---:|---:|---:|---:|"]
    for name, label in (("espnet_length", "ESPnet length (timed here)"),
                        ("asrkit_bucketing_shuffle", "asrkit bucketing (data.bucket_order=shuffle, the default)"),
                        ("asrkit_bucketing_sort", "asrkit bucketing (data.bucket_order=sort)")):
        if name not in s:  # (a result saved before the sort row existed)
            continue
        x = s[name]
        L.append(f"| {label} | {x['batches']} | {x['real_frames_per_step']:.0f} | {x['padded_frames_per_step']:.0f} | "
                 f"{100 * x['padding_share']:.1f} % |")
    L += ["", "Top operators of one training step (torch.profiler, self CPU time):", "", "asrkit:", "", "```",
          a["profile"].strip(), "```", "", "ESPnet:", "", "```", e["profile"].strip(), "```", ""]
    return "\n".join(L)
