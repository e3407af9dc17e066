"""``sizes``: parameters, training FLOPs and the expected time on one GPU of the recipe configs.

    python -m asrkit.bench sizes [--utt-seconds 15] [--lengths 5,30] [--mfu 0.1,0.3] [--out FILE.md]

For each config of :data:`RECIPES` (the CPU models of mini and speechocean762, the LibriSpeech
100 h and 960 h Conformers, the CAPE paper's 36 x 768 Transformer):

* **parameters** of the model :func:`asrkit.model.build_model` builds from the config, with the
  letters tokenizer's 29 outputs (the recipes' ``--token_type letters``);
* **training FLOPs per audio second**: :class:`torch.utils.flop_counter.FlopCounterMode` around one
  real forward + backward (training mode, CTC loss) of a batch of ``--utts`` utterances of
  ``--utt-seconds`` of random fbank at the config's features, on the CPU, divided by the batch's
  audio seconds. The utterances have one length (no padding), so the figure does not depend on
  ``--utts``. PyTorch's counter has no formula for the CPU's fused attention
  (``_scaled_dot_product_flash_attention_for_cpu`` and its backward), so :func:`flop_counter` adds
  PyTorch's own SDPA formulas for them (without them attention would count 0), and its formula for a
  convolution's backward ignores ``groups`` (a depthwise convolution's backward would count as a
  dense one's), so :func:`flop_counter` counts it as twice the forward. Layer drop is off
  while counting (every layer runs), so a config with ``encoder.layer_drop`` p trains with about
  (1 - p) of its layers' FLOPs; elementwise work (norms, softmax, activations) and the CTC loss
  count nothing, as by convention. Attention's FLOPs per audio second grow linearly with the
  utterance length (T^2 per utterance of T frames): ``--lengths`` measures other lengths too;
* **the budget**: ``train.max_steps`` x ``data.max_duration`` x ``train.accum_grad`` audio seconds
  (a config without ``max_steps``: ``train.max_epochs`` x its data's hours), times FLOPs per audio
  second. Batches fill a little under ``max_duration``, so this is an upper bound by a few %;
* **time on one GPU** = budget FLOPs / (dense bf16 peak x model FLOP utilization), for each
  ``--mfu``: an estimate from FLOP counts, not a measurement.
"""
from __future__ import annotations

import argparse

from asrkit.cliargs import Parser
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Recipe:
    """One row: a config and the training data it budgets for."""

    name: str
    config: str  #: path relative to the repository root
    data: str  #: the training data, in words
    hours: float  #: hours of training audio (one epoch)


#: the configs of the table, smallest first
RECIPES: tuple[Recipe, ...] = (
    Recipe("mini Transformer (CPU)", "egs/mini/asr1/conf/train.yaml", "mini, synthetic", 12.0),
    Recipe("speechocean762 Conformer (CPU)", "egs/speechocean762/asr1/conf/train_conformer.yaml",
           "speechocean762 train", 2.63),
    Recipe("LibriSpeech 100 h Conformer", "egs/librispeech/asr1/conf/train_conformer_100h.yaml",
           "train-clean-100", 100.6),
    Recipe("LibriSpeech 960 h Conformer", "egs/librispeech/asr1/conf/train_conformer_960h.yaml", "train-960", 960.9),
    Recipe("CAPE paper Transformer", "egs/librispeech/asr1/conf/train.yaml", "train-960", 960.9),
)

#: dense bf16 tensor-core peak, FLOP/s (a multiply-add = 2 FLOPs, as the counter counts): H100 SXM
#: (the PCIe card: ~756e12), A100 (SXM and PCIe)
GPU_PEAKS: dict[str, float] = {"H100": 989e12, "A100": 312e12}

#: one CPU core's fbank throughput in the loader, audio-s/s (docs/results/input_pipeline.md)
LOADER_ON_THE_FLY, LOADER_STORED = 1850.0, 5100.0


def vocab_size() -> int:
    """Outputs of the letters tokenizer (26 letters, apostrophe, word boundary, blank)."""
    from asrkit.tokenizer import CharTokenizer

    return CharTokenizer().vocab_size


def load(recipe: Recipe):
    """The recipe's config, every section validated (:func:`asrkit.training.checks.load_config`)."""
    from asrkit.training.checks import load_config

    return load_config(ROOT / recipe.config)


def count_parameters(cfg) -> int:
    """Parameters of the model built from ``cfg`` (on the meta device: nothing is allocated)."""
    from asrkit.model import build_model

    with torch.device("meta"):
        model = build_model(cfg, vocab_size())
    return sum(p.numel() for p in model.parameters())


def _sdpa_cpu(query, key, value, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def _sdpa_cpu_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out, query, key, value)


def _conv_backward(grad_out, x, w, _bias, _stride, _padding, _dilation, transposed, _output_padding, _groups,
                   output_mask, out_shape=None, **kwargs) -> int:
    """A convolution's backward: the forward's FLOPs once for the input's gradient and once for the
    weight's, each where asked for. PyTorch's own formula ignores ``groups`` there and counts a
    depthwise convolution's backward as a dense one's (the Conformer's convolution module, kernel 31,
    256 channels: 257x its forward instead of 2x)."""
    from torch.utils.flop_counter import conv_flop_count

    return conv_flop_count(x, w, grad_out, transposed) * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


#: ops whose FLOPs PyTorch's counter misses or miscounts -> formulas: the CPU's fused attention
#: (counted 0 without these: PyTorch's formulas for the same computation on a GPU) and the
#: backward of grouped convolutions
CUSTOM_FORMULAS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward,
    torch.ops.aten.convolution_backward: _conv_backward,
}


def flop_counter():
    """A :class:`FlopCounterMode` that also counts the CPU's fused attention and grouped
    convolutions' backward right (:data:`CUSTOM_FORMULAS`)."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=CUSTOM_FORMULAS)


def _is_attention(op) -> bool:
    """Attention's products: SDPA's fused ops, or ``bmm`` where SDPA runs its math path (attention
    dropout on the CPU); nothing else in these models calls ``bmm``."""
    name = str(op)
    return "scaled_dot_product" in name or "attention" in name or name.startswith("aten.bmm")


@dataclass
class Flops:
    """Training FLOPs (forward + backward) per audio second at one utterance length."""

    utt_seconds: float
    per_audio_s: float
    attention_per_audio_s: float

    @property
    def attention_share(self) -> float:
        return self.attention_per_audio_s / self.per_audio_s


def train_flops(cfg, utt_seconds: float = 15.0, utts: int = 2, seed: int = 0) -> Flops:
    """Count forward + backward of ``utts`` utterances of ``utt_seconds`` of random fbank (CPU, fp32,
    training mode, layer drop off), per audio second."""
    from asrkit.config import with_overrides
    from asrkit.model import build_model

    cfg = with_overrides(cfg, [("encoder.layer_drop", 0.0)])
    torch.manual_seed(seed)
    model = build_model(cfg, vocab_size()).train()
    fc = cfg.features
    T = round(utt_seconds / fc.hop)
    n_tokens = max(1, int(12 * utt_seconds))  # ~LibriSpeech's letters per second; CTC counts no FLOPs
    batch = {
        "feats": torch.randn(utts, T, fc.n_mels),
        "feat_lens": torch.full((utts,), T),
        "times": (torch.arange(T).float() * fc.hop)[None].expand(utts, -1).contiguous(),
        "targets": torch.randint(1, vocab_size(), (utts, n_tokens)),
        "target_lens": torch.full((utts,), n_tokens),
        "ids": [f"u{i}" for i in range(utts)],
        "durations": [utt_seconds] * utts,
    }
    with flop_counter() as counter:
        model(batch)["loss"].backward()
    counts = counter.get_flop_counts()["Global"]
    total = sum(counts.values())
    attention = sum(n for op, n in counts.items() if _is_attention(op))
    audio = utts * utt_seconds
    return Flops(utt_seconds, total / audio, attention / audio)


@dataclass
class Budget:
    """What a config trains: audio seconds per optimizer step, steps, epochs of its data."""

    step_audio_s: float
    steps: int
    epochs: float
    audio_s: float


def budget(cfg, hours: float) -> Budget:
    """``train.max_steps`` x ``data.max_duration`` x ``train.accum_grad`` on one process; a config
    without ``max_steps`` trains ``train.max_epochs`` epochs of ``hours``."""
    step = cfg.data.max_duration * cfg.train.accum_grad
    if cfg.train.max_steps > 0:
        audio = cfg.train.max_steps * step
        return Budget(step, cfg.train.max_steps, audio / (hours * 3600), audio)
    audio = cfg.train.max_epochs * hours * 3600
    return Budget(step, math.ceil(audio / step), float(cfg.train.max_epochs), audio)


def steps_for(hours: float, epochs: float, max_duration: float, accum_grad: int = 1, gpus: int = 1) -> int:
    """``train.max_steps`` for ``epochs`` of ``hours`` of audio: hours x 3600 x epochs / (audio per step)."""
    return round(hours * 3600 * epochs / (max_duration * accum_grad * gpus))


def fmt_time(seconds: float) -> str:
    if seconds < 1:
        return "< 1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def fmt_int(n: float) -> str:
    return f"{round(n):,}"


@dataclass
class Row:
    recipe: Recipe
    params: int
    budget: Budget
    flops: Flops  #: at the table's utterance length
    other: list  #: Flops at the other lengths

    @property
    def budget_flops(self) -> float:
        return self.budget.audio_s * self.flops.per_audio_s


def measure(recipe: Recipe, utt_seconds: float, lengths: list[float], utts: int) -> Row:
    cfg = load(recipe)
    log.info("%s: counting", recipe.config)
    return Row(recipe, count_parameters(cfg), budget(cfg, recipe.hours), train_flops(cfg, utt_seconds, utts),
               [train_flops(cfg, s, utts) for s in lengths])


def tables(rows: list[Row], mfus: list[float]) -> str:
    """The Markdown tables: sizes and times, then FLOPs by utterance length."""
    times = [(gpu, mfu) for mfu in mfus for gpu in GPU_PEAKS]
    s = rows[0].flops.utt_seconds
    head = ["config", "parameters", "data", "audio s per step", "steps", "epochs",
            f"train GFLOP per audio s ({s:g} s utts)", "budget (PFLOP)",
            *[f"{gpu} @ {100 * mfu:.0f} %" for gpu, mfu in times]]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        b = r.budget
        cells = [f"{r.recipe.name}, `{r.recipe.config}`", fmt_int(r.params), r.recipe.data, f"{b.step_audio_s:g}",
                 fmt_int(b.steps), f"{b.epochs:.3g}", f"{r.flops.per_audio_s / 1e9:.2f}", f"{r.budget_flops / 1e15:,.1f}",
                 *[fmt_time(r.budget_flops / (GPU_PEAKS[gpu] * mfu)) for gpu, mfu in times]]
        out.append("| " + " | ".join(cells) + " |")
    lengths = sorted([rows[0].flops, *rows[0].other], key=lambda f: f.utt_seconds)
    out += ["", "| config | " + " | ".join(f"GFLOP per audio s at {f.utt_seconds:g} s (attention)" for f in lengths)
            + f" | audio-s/s an H100 consumes at {100 * max(mfus):.0f} % | loader cores (on the fly / stored fbank) |",
            "|---|" + "---:|" * (len(lengths) + 2)]
    top = GPU_PEAKS["H100"] * max(mfus)
    for r in rows:
        per = sorted([r.flops, *r.other], key=lambda f: f.utt_seconds)
        rate = top / r.flops.per_audio_s
        out.append(f"| {r.recipe.name} | " + " | ".join(
            f"{f.per_audio_s / 1e9:.2f} ({100 * f.attention_share:.0f} %)" for f in per)
            + f" | {fmt_int(rate)} | {rate / LOADER_ON_THE_FLY:.0f} / {rate / LOADER_STORED:.0f} |")
    return "\n".join(out) + "\n"


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    from asrkit.utils import atomic_write

    ap = Parser(prog="asrkit bench sizes", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--utt-seconds", type=float, default=15.0, help="utterance length of the main table's FLOPs")
    ap.add_argument("--lengths", type=_floats, default=[5.0, 30.0], help="other utterance lengths to count (comma-separated)")
    ap.add_argument("--utts", type=int, default=2, help="utterances per counted batch (one length, so no padding)")
    ap.add_argument("--mfu", type=_floats, default=[0.1, 0.3], help="model FLOP utilizations of the time columns")
    ap.add_argument("--only", default="", help="only the configs whose path contains this")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--out", type=Path, help="also write the tables here (Markdown)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(a.threads)
    recipes = [r for r in RECIPES if a.only in r.config]
    rows = [measure(r, a.utt_seconds, [s for s in a.lengths if s != a.utt_seconds], a.utts) for r in recipes]
    text = tables(rows, a.mfu)
    print(text, end="")
    if a.out:
        with atomic_write(a.out) as f:
            f.write(text)
    return 0

