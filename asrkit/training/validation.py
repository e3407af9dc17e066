"""Validation during training: dev loss and greedy CTC WER per duration bin (over phones for a
phone tokenizer).

Each rank decodes its share of the dev set (no collective while decoding); rank 0 scores the
gathered hypotheses. Runs on the moving average of the weights when there is one.
"""
from __future__ import annotations

import logging

import torch

from asrkit.data.audio import AudioError
from asrkit.data.dataset import stable_seed
from asrkit.decode.ctc import ctc_greedy
from asrkit.scoring import score_pairs
from asrkit.training import TrainingError
from asrkit.training.distributed import DistInfo, all_gather_object
from asrkit.training.inputs import bad_audio_message, make_eval_sampler, make_loader, rng_untouched, to_device
from asrkit.training.signals import stop_signals_deferred
from asrkit.tokenizer import reference_for_greedy

logger = logging.getLogger("asrkit.train")


@torch.no_grad()
def validate(model: torch.nn.Module, dev_cuts, cfg, tokenizer, dist_info: DistInfo, device: torch.device,
             seed: int, amp_dtype=None) -> tuple[dict, object]:
    """Returns ``(info, result)`` on rank 0: ``info`` = ``{"dev_loss", "dev_wer"}``, ``result`` the
    scoring result (bins); ``({}, None)`` on the other ranks or when nothing could be decoded."""
    from lhotse import CutSet

    mine = list(dev_cuts)[dist_info.rank::dist_info.world_size]
    pairs, tot_loss, n = [], 0.0, 0
    if mine:
        was_training = model.training
        model.eval()
        loader = make_loader(cfg, tokenizer, make_eval_sampler(CutSet.from_cuts(mine), cfg.data.max_duration),
                             epoch=0, train=False)
        with rng_untouched(stable_seed(seed, "dev", dist_info.rank)), stop_signals_deferred():
            it = iter(loader)
        while True:
            try:
                batch = next(it, None)
            except AudioError as e:  # data.on_bad_audio=raise
                raise TrainingError(f"validation: {bad_audio_message(e)}") from None
            if batch is None:
                break
            if not batch["ids"]:
                continue
            batch = to_device(batch, device)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                out = model(batch)
            enc = out["enc"]
            tot_loss += float(out["loss"]) * out["n_utts"]
            n += out["n_utts"]
            for i, hyp in enumerate(ctc_greedy(enc.log_probs, enc.lengths)):
                ref = reference_for_greedy(tokenizer, batch["texts"][i])  # folded as trained; phones for phones
                pairs.append({"id": batch["ids"][i], "ref": ref, "hyp": tokenizer.decode(hyp),
                              "duration": batch["durations"][i]})
        model.train(was_training)
    gathered = all_gather_object((pairs, tot_loss, n))
    if not dist_info.is_main:
        return {}, None
    pairs = [p for g in gathered for p in g[0]]
    tot_loss, n = sum(g[1] for g in gathered), sum(g[2] for g in gathered)
    if not pairs:
        logger.warning("validation: no dev utterance could be decoded")
        return {}, None
    res = score_pairs(pairs, bins=cfg.decode.bins)
    return {"dev_loss": tot_loss / max(1, n), "dev_wer": res.wer}, res
