"""The ESPnet2 ``asr_train`` config generated from asrkit's, and ESPnet's epochs x iterations plan."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from asrkit.bench.peers.common import PeersError


def _espnet_scheduler(o, total: int) -> tuple[str | None, dict]:
    """asrkit's ``optim.schedule`` as an ESPnet scheduler with the same learning-rate curve
    (asrkit's step s = 1, 2, ... is ESPnet's ``last_epoch + 1``); ``total``: optimizer steps."""
    if o.schedule == "constant":
        return None, {}
    if o.schedule == "warmup_cosine":  # ESPnet's warmup starts at min_lr, asrkit's at 0 (see the differences)
        if o.warmup_steps >= total:
            raise PeersError(f"optim.warmup_steps={o.warmup_steps} is not below the {total} steps of the budget; "
                             "raise --steps or pass --asrkit-args optim.warmup_steps=N")
        return "cosineannealingwarmuprestarts", {"first_cycle_steps": total, "max_lr": o.lr,
                                                 "min_lr": o.lr * o.min_lr_ratio, "warmup_steps": max(1, o.warmup_steps)}
    if o.schedule == "warmup_constant":  # lr * min(1, s / w): linear to lr, then flat
        return "piecewiselinearwarmuplr", {"warmup_steps_list": [0, max(1, o.warmup_steps), 10**9],
                                           "warmup_lr_list": [0.0, o.lr, o.lr]}
    if o.schedule == "noam":  # lr * min(s / w, sqrt(w / s)) = ESPnet's WarmupLR
        return "warmuplr", {"warmup_steps": max(1, o.warmup_steps)}
    raise PeersError(f"optim.schedule={o.schedule!r} has no ESPnet equivalent here (constant, warmup_constant, "
                     "noam, warmup_cosine have); pick one of those in the config for this comparison")


def espnet_config(cfg, *, epochs: int, iters_per_epoch: int, typical_frames: int = 400,
                  nbest: int | None = None) -> tuple[dict, list[str]]:
    """The ESPnet2 ``asr_train`` config closest to asrkit's ``cfg`` (a :class:`asrkit.config.Config`),
    and the list of differences that remain (one sentence each). ``epochs`` x ``iters_per_epoch``
    optimizer steps. ``typical_frames``: the median training utterance in 10 ms frames (picks
    which of asrkit's two time-mask caps ESPnet takes). ``nbest``: checkpoints ESPnet averages for
    decoding when asrkit averages its weights (default: the better half of the epochs by dev loss,
    at most 10)."""
    e, f, s, o, t = cfg.encoder, cfg.features, cfg.specaug, cfg.optim, cfg.train
    diffs: list[str] = []
    if e.type != "transformer" or e.attention != "softmax":
        raise PeersError(f"encoder.type={e.type!r}, encoder.attention={e.attention!r}: only the softmax Transformer "
                         "has an ESPnet counterpart here")
    conformer = bool(e.conv_kernel or e.macaron or e.block_norm)
    if conformer and not (e.conv_kernel and e.macaron and e.block_norm and e.conv_norm == "batch" and e.norm_first
                          and e.pos_enc == "relpos_xl" and e.activation in ("relu", "swish")):
        raise PeersError(
            f"encoder.conv_kernel={e.conv_kernel}, encoder.macaron={e.macaron}, encoder.block_norm={e.block_norm}, "
            f"encoder.conv_norm={e.conv_norm}, encoder.pos_enc={e.pos_enc}: ESPnet's Conformer layer is asrkit's with "
            "encoder.conv_kernel=K encoder.macaron=true encoder.block_norm=true encoder.conv_norm=batch "
            "encoder.norm_first=true and its relative positions (encoder.pos_enc=relpos_xl 'encoder.pos={}'); "
            "only that Conformer is mapped here, or a Transformer config without those keys")
    if cfg.decoder.type != "none":
        raise PeersError(f"decoder.type={cfg.decoder.type!r}: this comparison is CTC only (decoder.type=none)")
    if cfg.tokens.kind != "letters":
        raise PeersError(f"tokens.kind={cfg.tokens.kind!r}: only letters (ESPnet token_type char) is mapped here")
    if t.accum_grad != 1:
        diffs.append(f"train.accum_grad={t.accum_grad} is kept as ESPnet's accum_grad")
    sr = f.sample_rate
    win, hop = round(f.win * sr), round(f.hop * sr)
    conf: dict[str, Any] = {
        "frontend": "default",
        "frontend_conf": {"fs": sr, "n_fft": 1 << (win - 1).bit_length(), "win_length": win, "hop_length": hop,
                          "n_mels": f.n_mels},
        "normalize": "utterance_mvn" if f.cmvn else None,
        "normalize_conf": {"norm_means": True, "norm_vars": True} if f.cmvn else {},
        "encoder": "transformer",
        "encoder_conf": {"output_size": e.d_model, "attention_heads": e.n_heads, "linear_units": e.d_ff,
                         "num_blocks": e.n_layers, "dropout_rate": e.dropout, "positional_dropout_rate": e.dropout,
                         "attention_dropout_rate": e.attn_dropout, "input_layer": "conv2d",
                         "normalize_before": e.norm_first, "layer_drop_rate": e.layer_drop},
        "model_conf": {"ctc_weight": 1.0},
        "optim": o.name,
        "optim_conf": {"lr": o.lr, "weight_decay": o.weight_decay, "eps": o.eps}
        | ({"betas": list(o.betas)} if o.name in ("adam", "adamw") else {}),
        "grad_clip": o.clip_grad if o.clip_grad > 0 else -1,
        "accum_grad": t.accum_grad,
        "batch_type": "length",
        "batch_bins": int(cfg.data.max_duration * sr),
        "max_epoch": epochs,
        "num_iters_per_epoch": iters_per_epoch,
        "num_workers": cfg.data.num_workers,
        "seed": t.seed,
        "log_interval": 1,
        "best_model_criterion": [["valid", "loss", "min"]],
        "keep_nbest_models": 1,
        "num_att_plot": 0,
    }
    sched, sched_conf = _espnet_scheduler(o, epochs * iters_per_epoch)
    if sched:
        conf["scheduler"], conf["scheduler_conf"] = sched, sched_conf
    if o.schedule == "warmup_cosine":
        diffs.append(f"learning rate: the same warmup ({o.warmup_steps} steps) and cosine decay to {o.min_lr_ratio:g} x "
                     "lr over the budget; ESPnet's CosineAnnealingWarmupRestarts warms up from that floor, asrkit's from 0")
    if s.enabled:
        conf["specaug"] = "specaug"
        by_ratio = s.time_ratio * typical_frames < s.time_width  # the cap that binds for most utterances
        conf["specaug_conf"] = {"apply_time_warp": False, "apply_freq_mask": True,
                                "freq_mask_width_range": [0, s.freq_width], "num_freq_mask": s.freq_masks,
                                "apply_time_mask": True, "num_time_mask": s.time_masks}
        if by_ratio:
            conf["specaug_conf"]["time_mask_width_ratio_range"] = [0.0, s.time_ratio]
        else:
            conf["specaug_conf"]["time_mask_width_range"] = [0, s.time_width]
        diffs.append(f"SpecAugment time masks: asrkit caps each at min({s.time_width} frames, {s.time_ratio:g} x the "
                     "utterance); ESPnet takes one cap, here "
                     + (f"{s.time_ratio:g} x the batch's padded length (binding for the median utterance, "
                        f"{typical_frames} frames)" if by_ratio else f"{s.time_width} frames")
                     + "; ESPnet masks the log-mel features with 0 before its utterance normalization, asrkit "
                     "after CMVN (0 = the mean)")
    aug = getattr(cfg, "augment", None)  # asrkit's augment section (speed perturbation and more), where present
    speed = [float(x) for x in (getattr(aug, "speed", None) or [])]
    if speed:  # asrkit: each epoch each utterance at 1.0 or one of the factors, uniformly
        conf["preprocessor_conf"] = {
            "fs": sr,  # its data augmentation needs the sample rate (asserts fs > 0)
            "data_aug_effects": [[1.0, "speed_perturb", {"factor": f}] for f in speed],
            "data_aug_num": [1, 1], "data_aug_prob": len(speed) / (len(speed) + 1)}
        diffs.append(f"speed perturbation {speed}: both draw 1.0 or one factor uniformly per utterance and epoch; "
                     "asrkit resamples with Lhotse's windowed-sinc filter applied as one matrix product (asrkit.data.speed), "
                     "ESPnet with its preprocessor's speed_perturb "
                     "effect (torchaudio resampling), and ESPnet batches by the unperturbed lengths")
    for key in ("volume", "noise_prob", "reverb_prob"):
        v = getattr(aug, key, None) if aug is not None else None
        if v:
            diffs.append(f"augment.{key}={v}: not given to ESPnet (no matching effect mapped here)")
    if t.amp != "none":
        diffs.append(f"train.amp={t.amp}: ESPnet trains in fp32 here (its use_amp is CUDA autocast)")
    if t.ema_decay > 0:
        span = 1.0 / (1.0 - t.ema_decay)
        n = nbest or max(1, min(10, math.ceil(epochs / 2)))
        conf["keep_nbest_models"] = n
        diffs.append(f"weight averaging: asrkit decodes an exponential moving average of the weights (decay "
                     f"{t.ema_decay:g}, e-folding ~{span:.0f} steps); ESPnet has none and averages its {n} best "
                     f"epoch checkpoints by dev loss (valid.loss.ave, its standard way; {n} = the better half of "
                     f"its {epochs} epochs, at most 10)")
    else:
        if nbest:
            conf["keep_nbest_models"] = nbest
        diffs.append("weight averaging: none on either side (train.ema_decay 0): asrkit decodes its last weights, "
                     "ESPnet latest.pth, its last epoch's, after the same number of steps")
    fe, pos = cfg.frontend, dict(e.pos or {})
    same_frontend = (fe.type == "conv2d" and fe.stride == 4 and fe.kernel == 3 and fe.channels == e.d_model
                     and getattr(fe, "padding", "half") == "none")
    same_pos = (e.pos_enc == "sinpos" and pos.get("scale_input") and pos.get("interleaved")
                and abs(float(pos.get("omega0", 30.0)) * f.hop * fe.stride - 1.0) < 1e-6)
    same_xl = (e.pos_enc == "relpos_xl" and pos.get("scale_input", True)
               and abs(float(pos.get("frame_step", f.hop * fe.stride)) - f.hop * fe.stride) < 1e-9
               and e.activation in ("relu", "swish"))
    if same_xl:  # ESPnet's Conformer encoder: its whole layer, or reduced to Transformer layers
        conf["encoder"] = "conformer"
        conf["encoder_conf"] |= {"macaron_style": conformer, "use_cnn_module": conformer, "rel_pos_type": "latest",
                                 "pos_enc_layer_type": "rel_pos", "selfattention_layer_type": "rel_selfattn",
                                 "activation_type": e.activation} | ({"cnn_module_kernel": e.conv_kernel} if conformer else {})
    if e.activation != "relu" and not same_xl:  # ESPnet's conformer encoder takes asrkit's activation
        diffs.append(f"encoder.activation={e.activation}: ESPnet's Transformer feed-forward is ReLU")
    if conformer:
        diffs.append(f"encoder layers: the same Conformer layer (macaron feed-forward, convolution module of kernel "
                     f"{e.conv_kernel} with BatchNorm, a LayerNorm closing each layer); asrkit's BatchNorm takes its "
                     "batch statistics over the real frames and moves its running statistics once per step, ESPnet's "
                     "over every frame of the padded batch, once per forward; asrkit zeroes padded frames before the "
                     "depthwise convolution, ESPnet convolves them")
    if same_frontend:
        diffs.append("frontend: the same (ESPnet's conv2d subsampling: 3x3 stride 2 twice, no padding, "
                     f"{e.d_model} channels, then Linear); ESPnet's padded batches give a shorter utterance up to 2 "
                     "more frames than it has alone (its subsampling's mask), asrkit's exactly its own")
    elif fe.type == "conv1d":
        diffs.append(f"frontend: asrkit 1-D conv (kernel {fe.kernel}, stride {fe.stride}) + GLU on the fbank; ESPnet "
                     "conv2d subsampling (two 3x3 Conv2d of stride 2 + ReLU, then a linear layer): the same 40 ms per "
                     "encoder frame at stride 4, a different model (see the parameter counts)")
    elif fe.stride == 4:
        diffs.append(f"frontend: asrkit conv2d subsampling ({fe.channels} channels, padding {getattr(fe, 'padding', 'half')}); "
                     f"ESPnet's: {e.d_model} channels (encoder output_size), no padding; set frontend.channels="
                     f"{e.d_model} frontend.padding=none for ESPnet's (egs/speechocean762/asr1/conf/train_espnet_equal.yaml)")
    else:
        diffs.append(f"frontend stride {fe.stride}: ESPnet's conv2d subsampling has stride 4")
    diffs.append("positional encoding: the same (x sqrt(d) + the sinusoid of the frame index, sin / cos interleaved)"
                 if same_pos else
                 "positional encoding: the same, Transformer-XL's relative positions (asrkit relpos_xl; ESPnet's "
                 "conformer encoder with rel_pos / rel_selfattn, rel_pos_type latest"
                 + (")" if conformer else ", no macaron feed-forward, no convolution module: Transformer layers)")
                 if same_xl else
                 f"positional encoding: asrkit encoder.pos_enc={e.pos_enc}; ESPnet's Transformer encoder with conv2d "
                 "input always adds its sinusoidal absolute encoding (x sqrt(d)) after the subsampling")
    same_pos = same_pos or same_xl
    pos_drop = float(pos.get("dropout", 0.0)) if same_pos else None
    diffs += [
        (f"dropout: ESPnet's positional dropout {e.dropout:g}, asrkit's encoder.pos.dropout {pos_drop:g} and "
         f"frontend.dropout {fe.dropout:g}" if same_pos else
         f"dropout: ESPnet's conv2d subsampling drops out its output at encoder dropout_rate ({e.dropout:g}); asrkit's "
         f"frontend at frontend.dropout ({fe.dropout:g})"),
        "layer norm: eps 1e-12 in ESPnet, 1e-5 in asrkit (encoder outputs differ by < 1e-4 on the fixture)",
        "flush-to-zero of denormals: on in both toolkits' processes (asrkit sets it itself; "
        "tools/peers/espnet/run.py --flush-denormal true for ESPnet's training and decoding)",
        "features: asrkit Kaldi-compatible fbank (Lhotse, povey window); ESPnet's default frontend (STFT, hann "
        f"window, n_fft {conf['frontend_conf']['n_fft']}, log-mel): same {f.n_mels} mels, 25 ms / 10 ms",
        f"batches: asrkit's BucketingSampler ({cfg.data.num_buckets} duration buckets, utterances packed in "
        + ("duration order, data.bucket_order=sort: the same batches every epoch up to ties" if cfg.data.bucket_order == "sort"
           else "random order: pads more than ESPnet, favours ESPnet's speed; data.bucket_order=sort removes it")
        + "), at most data.max_duration seconds per batch; ESPnet batch_type length (sorted durations) with "
        "batch_bins = max_duration x 16000 (samples, padded, + letters), the batch that crosses the limit included",
        "tokens: asrkit letters a-z, ' and a word boundary (lower-cased); ESPnet char tokens of the transcripts "
        "as written, <space> for the word boundary",
    ]
    if not speed:
        diffs.append("speed perturbation: off on both (as asrkit's config has it)")
    if (f.dither or 0) > 0:
        diffs.append(f"features.dither={f.dither}: ESPnet's default frontend has no dither")
    return conf, diffs


def config_lines(path: Path) -> int:
    """Lines a user writes: non-blank lines that are not only a comment."""
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))


def config_settings(path: Path) -> int:
    """Settings in a YAML config: its leaf values (a list counts as one)."""
    import yaml

    def leaves(x) -> int:
        return sum(leaves(v) for v in x.values()) if isinstance(x, dict) else 1

    return leaves(yaml.safe_load(path.read_text()) or {})



def batches_per_pass(durations: list[float], max_duration: float) -> int:
    """ESPnet's length sampler on sorted durations (speech samples only): a batch closes on the
    utterance that crosses ``max_duration`` (padded: size x longest)."""
    n, cur, longest = 0, 0, 0.0
    for d in sorted(durations):
        cur += 1
        longest = max(longest, d)
        if cur * longest > max_duration:
            n, cur, longest = n + 1, 0, 0.0
    return n + (cur > 0)


def plan_steps(steps: int, n_batch: int) -> tuple[int, int]:
    """(epochs, iterations per epoch): about one epoch per pass over the data, E x I >= steps, the
    smallest such product."""
    e = max(1, round(steps / max(1, n_batch)))
    return e, math.ceil(steps / e)




#: asr.sh's model to decode (its ``inference_asr_model`` default): the average of the best epochs by dev accuracy
ASR_SH_MODEL = "valid.acc.ave.pth"


def espnet_recipe_config(path: Path, *, epochs: int) -> tuple[dict, list[str], str]:
    """An ESPnet recipe's ``asr_train`` YAML (e.g. a copy of an egs2 recipe's
    ``conf/train_asr_*.yaml``) as written, for the recipe-default row: only the budget
    (``max_epoch`` = ``epochs`` full passes), one log line per iteration (the step times are summed
    from them) and ``use_amp`` off on a CPU are changed. Returns the config, the sentences naming
    each change, and the checkpoint asr.sh would decode (``valid.acc.ave.pth`` when the recipe keeps
    its best epochs by dev accuracy, as asr.sh's default; else the first criterion's average)."""
    import yaml

    try:
        conf = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PeersError(f"--espnet-config {path}: cannot read it as YAML ({e}); give an ESPnet asr_train config, "
                         "e.g. a copy of an egs2 recipe's conf/train_asr_transformer.yaml") from None
    if not isinstance(conf, dict) or "encoder" not in conf:
        raise PeersError(f"--espnet-config {path}: no 'encoder' key; give an ESPnet asr_train config (an egs2 "
                         "recipe's conf/train_asr_*.yaml)")
    if "frontend" in conf and conf["frontend"] is None:
        raise PeersError(f"--espnet-config {path}: 'frontend: null' reads features extracted beforehand; both sides "
                         "read the same raw audio here: pick a recipe config with ESPnet's default frontend")
    changes = [f"max_epoch {conf.get('max_epoch', 'unset')} -> {epochs} (the budget: {epochs} full passes over the "
               "training data, as asrkit's side)"]
    iters = conf.pop("num_iters_per_epoch", None)
    if iters:
        changes.append(f"num_iters_per_epoch {iters} removed (each epoch a full pass, as asrkit's)")
    conf["max_epoch"] = epochs
    if conf.get("log_interval") != 1:
        changes.append(f"log_interval {conf.get('log_interval', 'unset')} -> 1 (each iteration's train_time logged "
                       "and summed: the training-steps throughput)")
        conf["log_interval"] = 1
    if conf.get("use_amp"):
        changes.append("use_amp true -> false (CUDA autocast: nothing on a CPU)")
        conf["use_amp"] = False
    crit = [tuple(c) for c in conf.get("best_model_criterion") or [("valid", "acc", "max")]]
    model = ASR_SH_MODEL if ("valid", "acc", "max") in crit else f"{crit[0][0]}.{crit[0][1]}.ave.pth"
    return conf, changes, model


def espnet_recipe_diffs(conf: dict, changes: list[str], source: Path, asrkit_config: Path, cfg) -> list[str]:
    """The differences of the recipe-default row, one sentence each: two recipes, two models."""
    enc, dec = conf.get("encoder"), conf.get("decoder")
    ec = conf.get("encoder_conf") or {}
    sched = conf.get("scheduler")
    warm = (conf.get("scheduler_conf") or {}).get("warmup_steps")
    speed = [float(x) for x in (getattr(getattr(cfg, "augment", None), "speed", None) or [])]
    return [
        f"models: each toolkit's recipe default, two different models (see the parameter counts): asrkit "
        f"{asrkit_config} ({cfg.encoder.n_layers} x {cfg.encoder.d_model} {cfg.encoder.type}, encoder.pos_enc="
        f"{cfg.encoder.pos_enc}, frontend {cfg.frontend.type}, CTC); ESPnet {source} ({ec.get('num_blocks', '?')} x "
        f"{ec.get('output_size', '?')} {enc} encoder, input_layer {ec.get('input_layer', '?')}"
        + (f", {dec} decoder, ctc_weight {(conf.get('model_conf') or {}).get('ctc_weight', '?')}" if dec else "")
        + "): no ratio of this row measures a toolkit",
        "ESPnet's YAML as written except: " + "; ".join(changes),
        "what asr.sh's training stage adds for raw audio, given as it gives it: global mean and variance "
        "normalization from collect_stats (feats_normalize=global_mvn), fold lengths 80000 / 150, --frontend_conf fs",
        "tokens: characters on both sides (asr.sh --token_type char); asr.sh's own default is BPE",
        "speed perturbation: asr.sh's --speed_perturb_factors is a data-preparation option outside the YAML, none "
        "here on ESPnet's side; asrkit's config " + (f"perturbs at {speed}" if speed else "has none"),
        "decoding: greedy CTC on both sides (ESPnet's recipes decode with beam search"
        + (" and the attention decoder" if dec else "") + ")",
        f"learning rate: asrkit's schedule as its config has it (optim.schedule {cfg.optim.schedule} over "
        f"train.max_steps {cfg.train.max_steps}), stopped after the passes; ESPnet's as written"
        + (f" ({sched}, {warm} warm-up steps)" if sched else "")
        + ": both recipes cut short, so the WER of this row says nothing about either recipe's result",
        f"batches: each recipe's own (asrkit data.max_duration {cfg.data.max_duration:g} s, {cfg.data.bucket_order} "
        f"buckets; ESPnet batch_type {conf.get('batch_type', 'folded')}, "
        + (f"batch_bins {conf['batch_bins']}" if "batch_bins" in conf else f"batch_size {conf.get('batch_size', 20)}")
        + f", accum_grad {conf.get('accum_grad', 1)})",
    ]
