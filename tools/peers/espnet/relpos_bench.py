#!/usr/bin/env python3
"""One measurement of ESPnet's relative-position self-attention, forward + backward, in this process.

    tools/peers/espnet/.venv/bin/python tools/peers/espnet/relpos_bench.py '{"T": 1000, "d": 192, "heads": 4,
        "batch": 1, "reps": 5, "threads": 2, "mode": "time"}'

Module: ``espnet.nets.pytorch_backend.transformer.attention.RelPositionMultiHeadedAttention`` (the
Transformer-XL form ESPnet's Conformer uses: ``linear_pos``, learned ``pos_bias_u`` / ``pos_bias_v``,
``rel_shift``) fed by ``espnet.nets.pytorch_backend.transformer.embedding.RelPositionalEncoding``
(sinusoidal positions for lags -(T-1) .. T-1), dropout 0, no mask (a full-length batch), training mode.
One step: positional encoding + attention forward, ``y.pow(2).mean().backward()``.

mode ``time``: a warm-up step at T = 8, then ``reps`` steps at T; prints the wall and process CPU
seconds of each. mode ``mem``: a warm-up step, the resident set size (RSS), one step at T; prints
the process's peak RSS (``ru_maxrss``) minus that RSS: the memory the step touched (the method of
asrkit's ``python -m asrkit.bench pos_enc``). Output: one JSON line on stdout.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    spec = json.loads(sys.argv[1])
    import importlib.metadata as md

    import torch
    from espnet.nets.pytorch_backend.transformer.attention import (
        RelPositionMultiHeadedAttention,
    )
    from espnet.nets.pytorch_backend.transformer.embedding import RelPositionalEncoding

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    d, h, B = spec["d"], spec["heads"], spec["batch"]
    pos = RelPositionalEncoding(d, 0.0)
    att = RelPositionMultiHeadedAttention(h, d, 0.0)
    pos.train(), att.train()
    n_params = sum(p.numel() for p in att.parameters())

    def step(T: int) -> tuple[float, float]:
        x = torch.randn(B, T, d, requires_grad=True)
        t0, c0 = time.perf_counter(), time.process_time()
        xs, pos_emb = pos(x)
        y = att(xs, xs, xs, pos_emb, None)
        y.pow(2).mean().backward()
        return time.perf_counter() - t0, time.process_time() - c0

    step(8)
    out = {"impl": "espnet", "espnet": md.version("espnet"), "torch": torch.__version__, "params": n_params}
    if spec.get("mode", "time") == "mem":
        rss0 = rss_bytes()
        w, c = step(spec["T"])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out.update(time_s=w, cpu_s=c, peak_mb=max(0, peak - rss0) / 2**20)
    else:
        runs = [step(spec["T"]) for _ in range(spec["reps"])]
        out.update(all_s=[r[0] for r in runs], all_cpu_s=[r[1] for r in runs])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
