"""The relative-position attention micro-benchmark: ESPnet's ``RelPositionMultiHeadedAttention``
(Transformer-XL's scheme) against asrkit's implementation of the same scheme (``relpos_xl``: like
for like) and asrkit's own ``relpos`` (Shaw et al.'s key term: another scheme, shown beside)."""
from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from asrkit.bench.peers.common import ESPNET_RELPOS, REPO, PeersError


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _relpos_asrkit_worker(spec: dict) -> dict:
    """asrkit's self-attention (:class:`asrkit.model.attention.SelfAttention`) with the ``relpos``
    (default) or ``spec["pos_enc"]`` encoding, its default options, one step = ``pos.begin`` +
    ``pos.embed`` + attention forward + ``y.pow(2).mean().backward()``; the same modes as
    ``tools/peers/espnet/relpos_bench.py``."""
    import resource
    import time as _t

    import torch

    from asrkit.config import load_config
    from asrkit.model.attention import SelfAttention
    from asrkit.model.posenc import build_pos_encoding

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    d, h, B, step_s = spec["d"], spec["heads"], spec["batch"], spec["frame_step"]
    cfg = load_config(None, [f"encoder.pos_enc={spec.get('pos_enc', 'relpos')}", f"encoder.d_model={d}", f"encoder.n_heads={h}",
                             "encoder.n_layers=1", *spec.get("extra", [])])
    pos = build_pos_encoding(cfg.encoder, frame_step=step_s)
    att = SelfAttention(d, h, 0.0)
    pos.train(), att.train()
    n_params = sum(p.numel() for p in att.parameters()) + sum(p.numel() for p in pos.parameters())

    def step(T: int) -> tuple[float, float]:
        x = torch.randn(B, T, d, requires_grad=True)
        times = (torch.arange(T, dtype=torch.float32) * step_s).expand(B, T)
        mask = torch.ones(B, T, dtype=torch.bool)
        t0, c0 = _t.perf_counter(), _t.process_time()
        state = pos.begin(x, times, mask)
        y = att(pos.embed(x, state), None, pos, state, 0)
        y.pow(2).mean().backward()
        return _t.perf_counter() - t0, _t.process_time() - c0

    step(8)
    out: dict[str, Any] = {"impl": "asrkit", "torch": torch.__version__, "params": n_params,
                           "max_lag": int(getattr(pos, "max_lag", spec["T"] - 1))}
    if spec.get("mode", "time") == "mem":
        rss0 = _rss_bytes()
        w, c = step(spec["T"])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out.update(time_s=w, cpu_s=c, peak_mb=max(0, peak - rss0) / 2**20)
    else:
        runs = [step(spec["T"]) for _ in range(spec["reps"])]
        out.update(all_s=[r[0] for r in runs], all_cpu_s=[r[1] for r in runs])
    return out


def _relpos_cmd(impl: str, spec: dict, espnet_venv: Path) -> list[str]:
    if impl == "espnet":
        return [str(REPO / espnet_venv / "bin" / "python"), str(REPO / ESPNET_RELPOS), json.dumps(spec)]
    spec = dict(spec, pos_enc=IMPLS[impl])
    return [sys.executable, "-m", "asrkit.bench", "--worker", f"{__name__}:_relpos_asrkit_worker", json.dumps(spec)]


#: fresh processes per implementation whose peak memory is the median
MEM_RUNS = 5

#: the implementations timed: asrkit's (its encoding) and ESPnet's
IMPLS = {"asrkit": "relpos", "asrkit_xl": "relpos_xl", "espnet": None}


def _relpos_run(impl: str, spec: dict, espnet_venv: Path, env: dict) -> dict:
    p = subprocess.run(_relpos_cmd(impl, spec, espnet_venv), capture_output=True, text=True, check=False, env=env, cwd=REPO,
                       timeout=900)
    if p.returncode != 0:
        raise PeersError(f"relpos benchmark ({impl}) failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def relpos_bench(a, env: dict) -> dict:
    """Paired rounds: each round runs both implementations in fresh processes (random order), each
    ``--relpos-reps`` steps; the ratio is the median over rounds of the ratio of the rounds'
    medians. Memory: one fresh process per implementation."""
    from asrkit.model import kernels

    kernels.load("relpos_attention")  # built once here (~25-60 s the first time), not in a timed worker
    spec = {"T": a.relpos_T, "d": a.relpos_d, "heads": a.relpos_heads, "batch": a.relpos_batch, "reps": a.relpos_reps,
            "threads": a.threads, "frame_step": a.relpos_frame_step}
    rounds: list[dict] = []
    for r in range(a.relpos_rounds):
        order = list(IMPLS)
        random.Random(r).shuffle(order)
        rounds.append({impl: _relpos_run(impl, spec, a.espnet_venv, env) for impl in order})
        print(f"[peers] relpos round {r + 1}: " + ", ".join(
            f"{k} {1000 * statistics.median(v['all_s']):.0f} ms" for k, v in rounds[-1].items()), file=sys.stderr)
    # fresh processes, MEM_RUNS each, interleaved: a process's peak RSS varies with the allocator
    # (asrkit relpos_xl at T = 1000: 109, 147 and 163 MiB in three identical runs), so the median
    mem: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    for _ in range(MEM_RUNS):
        for impl in IMPLS:
            mem[impl].append(_relpos_run(impl, dict(spec, mode="mem"), a.espnet_venv, env)["peak_mb"])
    out = {"spec": spec, "rounds": rounds}
    for impl in IMPLS:
        out[impl] = {"time_ms": 1000 * statistics.median(x for rd in rounds for x in rd[impl]["all_s"]),
                     "cpu_ms": 1000 * statistics.median(x for rd in rounds for x in rd[impl]["all_cpu_s"]),
                     "min_ms": 1000 * min(x for rd in rounds for x in rd[impl]["all_s"]),
                     "peak_mb": statistics.median(mem[impl]), "peak_mb_runs": mem[impl],
                     "params": rounds[0][impl]["params"]}
    out["espnet_version"] = rounds[0]["espnet"].get("espnet")
    out["asrkit_max_lag"] = rounds[0]["asrkit"].get("max_lag")
    out["round_ratios"] = [statistics.median(rd["espnet"]["all_s"]) / statistics.median(rd["asrkit"]["all_s"])
                           for rd in rounds]
    out["time_ratio"] = statistics.median(statistics.median(rd["espnet"]["all_s"]) / statistics.median(rd["asrkit"]["all_s"])
                                          for rd in rounds)
    out["mem_ratio"] = out["espnet"]["peak_mb"] / max(out["asrkit"]["peak_mb"], 1e-9)
    # like for like: the same scheme (Transformer-XL) in both toolkits
    out["xl_round_ratios"] = [statistics.median(rd["espnet"]["all_s"]) / statistics.median(rd["asrkit_xl"]["all_s"])
                              for rd in rounds]
    out["xl_time_ratio"] = statistics.median(out["xl_round_ratios"])
    out["xl_mem_ratio"] = out["espnet"]["peak_mb"] / max(out["asrkit_xl"]["peak_mb"], 1e-9)
    return out


