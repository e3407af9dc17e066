"""The training input pipeline: which utterances, how they are batched and loaded.

Data loading must never consume the training RNGs (a resumed run would otherwise draw different
dropout): every place that may draw from them runs under :func:`rng_untouched`.
"""
from __future__ import annotations

import contextlib
import logging
import os
from functools import partial
from typing import Optional

import torch

from asrkit.data.dataset import AsrDataset, filter_cuts
from asrkit.data.manifests import load_cuts
from asrkit.tokenizer import alphabet_report
from asrkit.training import TrainingError
from asrkit.training.distributed import original_error
from asrkit.training.signals import worker_ignores_stop_signals
from asrkit.utils import RECIPE_CMD_ENV, remedy

logger = logging.getLogger("asrkit.train")


def load_train_cuts(cfg, tokenizer, where: str = "train"):
    """The training (``where="train"``) or dev utterances, filtered (too short/long, untokenizable),
    with the counts of what was dropped."""
    from lhotse import CutSet

    sets = cfg.data.train_sets if where == "train" else [cfg.data.dev_set]
    if where == "train":  # compact, cached: LibriSpeech 960 h's 281 k cuts (asrkit.data.cut_index.CutIndex)
        from asrkit.data.cut_index import load_train_index
        from asrkit.data.shar import load_shar_index

        load = partial(load_shar_index, cfg.data.shar_dir) if cfg.data.shar_dir else partial(load_train_index, cfg.data.manifest_dir)
        try:
            index = load(cfg.data.corpus, sets, tokenizer, cfg.features, cfg.frontend.stride, cfg.data.min_duration,
                         cfg.data.max_utt_duration)
        except (FileNotFoundError, ValueError) as e:
            raise TrainingError(str(e)) from None
        if len(index) == 0:
            raise TrainingError(f"no usable {where} utterances in {sets} ({index.drop_stats})")
        return index, index.drop_stats
    cuts = CutSet.from_cuts(c for s in sets for c in load_cuts(cfg.data.manifest_dir, cfg.data.corpus, s))
    cuts, stats = filter_cuts(cuts, tokenizer, cfg.features, cfg.frontend.stride, cfg.data.min_duration,
                              cfg.data.max_utt_duration, where=f"{cfg.data.corpus}/{'+'.join(sets)}")
    if len(cuts) == 0:
        raise TrainingError(f"no usable {where} utterances in {sets} ({stats})")
    return cuts, stats


def alphabet_check(cuts, tokenizer, cfg, warn: bool = True) -> dict:
    """Count (and warn about, with examples) the training transcripts with letters or digits the
    tokenizer cannot represent (they are dropped from their words); for ``train_info.json``."""
    def utts():
        for c in cuts:
            yield c.id, " ".join(s.text for s in c.supervisions if s.text)

    report = getattr(cuts, "alphabet", None) or alphabet_report(utts(), getattr(tokenizer, "fold", "none"))
    if warn and report.utterances:
        logger.warning("%s", report.describe(f"{cfg.data.corpus}/{'+'.join(cfg.data.train_sets)}"))
    return report.to_dict()


def load_data(cfg, tokenizer):
    """``(train cuts, their drop counts, dev cuts or None)`` of a run, with their stored features
    when :func:`use_stored_features` says so."""
    train, stats = load_train_cuts(cfg, tokenizer, "train")
    dev = None
    if cfg.data.dev_set:
        dev, _ = load_train_cuts(cfg, tokenizer, "dev")
        if cfg.data.dev_max_utts:
            dev = dev.subset(first=cfg.data.dev_max_utts)
    train, dev = use_stored_features(cfg, train, dev, tokenizer)
    return train, stats, dev


def _store_hint(d) -> str:
    if os.environ.get(RECIPE_CMD_ENV, "").strip():
        return remedy("To store it once", 2, "", [("--stop_stage", "2"), ("--force", "true")])
    parts = " ".join(d.train_sets + ([d.dev_set] if d.dev_set else []))
    return (f"To store it once, run: asrkit cuts --corpus {d.corpus} --manifest-dir {d.manifest_dir} --parts {parts} "
            f"--fbank-parts {parts} --fbank-dir {d.fbank_dir} --train-config CONFIG --train-args 'OVERRIDES' "
            "(this run's config file and key=value overrides)")


def use_stored_features(cfg, train, dev, tokenizer=None):
    """Attach the stored fbank (:mod:`asrkit.data.feature_store`) to the training and dev cuts
    when ``data.features`` is ``stored``, or ``auto`` and the store covers both (padded pipeline
    only). Sets ``data.features`` to what is used (``stored`` | ``on_the_fly``): the saved config
    says it, and a resume that would read its features from elsewhere is refused (config changed)."""
    from asrkit.data.feature_store import FeatureStore

    d = cfg.data
    if d.features == "stored" and cfg.augment.waveform:
        raise TrainingError("data.features=stored: augment.volume / noise_prob / reverb_prob change the audio, so its "
                            "fbank is computed on the fly; set data.features=on_the_fly (or auto), or turn them off")
    if d.features == "on_the_fly" or d.sampler == "padfree" or d.shar_dir or cfg.augment.waveform:
        if d.features == "auto" and cfg.augment.waveform and d.sampler != "padfree":
            logger.info("augment: waveform augmentation on, so the fbank is computed on the fly")
        d.features = "on_the_fly"  # (shards: the audio is in them)
        return train, dev
    store = FeatureStore.of(d.fbank_dir, cfg.features)
    if hasattr(train, "feature_prefix"):  # the compact index (asrkit.data.cut_index): stays compact
        from asrkit.data.cut_index import attach_stored

        got, why = attach_stored(train, store, d.corpus, d.train_sets, tokenizer, cfg.features, cfg.frontend.stride,
                                 d.min_duration, d.max_utt_duration)
    else:
        got, why = store.attach(train, d.corpus, d.train_sets)
    if got is not None and dev is not None:
        got_dev, why = store.attach(dev, d.corpus, d.dev_set)
        got = got if got_dev is not None else None
    if got is not None and cfg.augment.speed:  # the stored speed-perturbed copies (stage 2 with augment.speed)
        got, why = store.attach_speed_copies(got, d.corpus, d.train_sets, cfg.augment.speed)
    if got is None:
        hint = _store_hint(d)
        if d.features == "stored":
            raise TrainingError(f"data.features=stored: {why}. {hint}, or train with data.features=on_the_fly")
        logger.warning("data.features=auto: the fbank is computed on the fly every epoch (%s). %s, then rerun "
                       "training", why, hint)
        d.features = "on_the_fly"
        return train, dev
    logger.info("training on the stored features of %s%s", store.dir,
                f" and of their speed-perturbed copies {cfg.augment.speed}" if cfg.augment.speed else "")
    d.features = "stored"
    return got, (got_dev if dev is not None else None)


def make_eval_sampler(cuts, max_duration: float = 200.0):
    from lhotse.dataset import SimpleCutSampler

    return SimpleCutSampler(cuts, max_duration=max_duration, shuffle=False)


def make_loader(cfg, tokenizer, sampler, epoch: int, train: bool) -> torch.utils.data.DataLoader:
    """A DataLoader of collated batches (``batch_size=None``: the sampler yields whole batches)."""
    args = (tokenizer, cfg.features, cfg.specaug if train else None, cfg.data.on_bad_audio)
    augment = cfg.augment if train else None  # evaluation never augments
    if train and cfg.data.sampler == "padfree":  # variable hop, no padding (asrkit.data.padfree)
        from asrkit.data.padfree import PadFreeDataset

        ds = PadFreeDataset(*args, seed=cfg.train.seed, frontend_stride=cfg.frontend.stride, augment=augment)
    else:
        ds = AsrDataset(*args, seed=cfg.train.seed, augment=augment, frontend_stride=cfg.frontend.stride)
    ds.set_epoch(epoch)
    nw = cfg.data.num_workers
    # workers leave stop signals to the main process (asrkit.training.signals)
    return torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=nw,
                                       persistent_workers=False, prefetch_factor=4 if nw else None,
                                       worker_init_fn=_loader_worker_init if nw else None, pin_memory=_uses_cuda(cfg))


def _loader_worker_init(worker_id: int) -> None:
    """A loader worker computes with one thread: the cores belong to the training step (the worker
    only keeps a few batches ready; torch sets this too, said here so that it stays so). It leaves
    stop signals to the main process (:mod:`asrkit.training.signals`)."""
    torch.set_num_threads(1)
    worker_ignores_stop_signals(worker_id)


def _uses_cuda(cfg) -> bool:
    """Page-locked batches (``pin_memory``) when training on a GPU: their copy to the device overlaps compute."""
    return cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available())


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
