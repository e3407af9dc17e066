"""The training input pipeline: which utterances, how they are batched and loaded.

Data loading must never consume the training RNGs (a resumed run would otherwise draw different
dropout): every place that may draw from them runs under :func:`rng_untouched`.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Optional

import torch

from asrkit.data.dataset import AsrDataset, filter_cuts
from asrkit.data.manifests import load_cuts
from asrkit.tokenizer import alphabet_report
from asrkit.training import TrainingError
from asrkit.training.distributed import original_error
from asrkit.training.signals import worker_ignores_stop_signals

logger = logging.getLogger("asrkit.train")


def load_train_cuts(cfg, tokenizer, where: str = "train"):
    """The training (``where="train"``) or dev utterances, filtered (too short/long, untokenizable),
    with the counts of what was dropped."""
    from lhotse import CutSet

    sets = cfg.data.train_sets if where == "train" else [cfg.data.dev_set]
    cuts = CutSet.from_cuts(c for s in sets for c in load_cuts(cfg.data.manifest_dir, cfg.data.corpus, s))
    cuts, stats = filter_cuts(cuts, tokenizer, cfg.features, cfg.frontend.stride, cfg.data.min_duration,
                              cfg.data.max_utt_duration, where=f"{cfg.data.corpus}/{'+'.join(sets)}")
    if len(cuts) == 0:
        raise TrainingError(f"no usable {where} utterances in {sets} ({stats})")
    return cuts, stats


def alphabet_check(cuts, tokenizer, where: str, warn: bool = True) -> dict:
    """Count (and warn about, with examples) the training transcripts with letters or digits the
    tokenizer cannot represent (they are dropped from their words); for ``train_info.json``."""
    def utts():
        for c in cuts:
            yield c.id, " ".join(s.text for s in c.supervisions if s.text)

    report = alphabet_report(utts(), getattr(tokenizer, "fold", "none"))
    if warn and report.utterances:
        logger.warning("%s", report.describe(where))
    return report.to_dict()


def load_data(cfg, tokenizer):
    """``(train cuts, their drop counts, dev cuts or None)`` of a run."""
    train, stats = load_train_cuts(cfg, tokenizer, "train")
    dev = None
    if cfg.data.dev_set:
        dev, _ = load_train_cuts(cfg, tokenizer, "dev")
        if cfg.data.dev_max_utts:
            dev = dev.subset(first=cfg.data.dev_max_utts)
    return train, stats, dev


def make_eval_sampler(cuts, max_duration: float = 200.0):
    from lhotse.dataset import SimpleCutSampler

    return SimpleCutSampler(cuts, max_duration=max_duration, shuffle=False)


def make_loader(cfg, tokenizer, sampler, epoch: int, train: bool) -> torch.utils.data.DataLoader:
    """A DataLoader of collated batches (``batch_size=None``: the sampler yields whole batches)."""
    args = (tokenizer, cfg.features, cfg.specaug if train else None, cfg.data.on_bad_audio)
    if train and cfg.data.sampler == "padfree":  # variable hop, no padding (asrkit.data.padfree)
        from asrkit.data.padfree import PadFreeDataset

        ds = PadFreeDataset(*args, seed=cfg.train.seed, frontend_stride=cfg.frontend.stride)
    else:
        ds = AsrDataset(*args, seed=cfg.train.seed)
    ds.set_epoch(epoch)
    nw = cfg.data.num_workers
    # workers leave stop signals to the main process (asrkit.training.signals)
    return torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=nw,
                                       persistent_workers=False, prefetch_factor=4 if nw else None,
                                       worker_init_fn=worker_ignores_stop_signals if nw else None)


def bad_audio_message(e: BaseException) -> str:
    """One line for unreadable audio met with ``data.on_bad_audio=raise``: the utterance and file
    (also when a DataLoader worker met it) and what to do."""
    return (f"{original_error(e)}. Fix or remove that file, or set data.on_bad_audio=skip to skip such "
            "utterances (counted in train_info.json)")


@contextlib.contextmanager
def rng_untouched(seed: int):
    """Run a block without consuming the global RNGs (e.g. ``iter(DataLoader)`` draws a worker base
    seed from torch's RNG); inside it torch's RNG is seeded with ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


def n_utts(batch: Optional[dict]) -> int:
    return 0 if batch is None else len(batch["ids"])


def stand_in_batch(cfg) -> dict:
    """A one-utterance batch of silence, trained on with weight 0 by a DDP rank that has no real
    batch yet (it must still take part in every collective of the step)."""
    fc = cfg.features
    T = 32 * max(1, cfg.frontend.stride)
    return {"feats": torch.zeros(1, T, fc.n_mels), "feat_lens": torch.tensor([T]),
            "times": (torch.arange(T, dtype=torch.float32) * fc.hop)[None], "targets": torch.tensor([1]),
            "target_lens": torch.tensor([1]), "ids": ["<stand-in>"], "texts": [""], "durations": [T * fc.hop],
            "n_bad_audio": 0}
