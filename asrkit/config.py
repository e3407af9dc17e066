"""Experiment configuration: typed dataclasses, loaded from YAML plus ``key=value`` overrides.

Here every key is checked: an unknown key is an error that lists the valid keys of its section,
a wrong type names the key and the value (:mod:`asrkit.schema`). What a value means (a known
encoder, a valid range) is checked by the layer that reads it; a training run checks every
section before any work starts (:mod:`asrkit.training.checks`). The fully resolved config is
saved as ``config.yaml`` in the experiment dir, so a run is reproducible from that file alone.

    cfg = load_config("conf/ctc_small.yaml", ["encoder.pos_enc=cape", "optim.lr=0.5"])

Sections: ``features``, ``specaug``, ``augment``, ``tokens``, ``frontend``, ``encoder``, ``decoder``, ``data``,
``optim``, ``train``, ``decode``. ``encoder.pos_enc`` picks the positional encoding and
``encoder.pos`` holds that encoding's own options (validated against it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asrkit.schema import ConfigError, from_dict, load_yaml_mapping, parse_overrides, set_nested


@dataclass
class FeatureConfig:
    """Log-mel filterbank features (Lhotse's torch-native Kaldi fbank), stored once by stage 2 or
    computed on the fly (``data.features``)."""

    n_mels: int = 80  #: mel filterbank bins
    win: float = 0.025  #: window length in seconds
    hop: float = 0.010  #: hop in seconds (the padding-free pipeline varies it per utterance)
    sample_rate: int = 16000  #: audio is resampled to this rate (Hz)
    dither: float = 0.0  #: dither added to the waveform (0: none; Kaldi's default is 1.0)
    cmvn: bool = True  #: per-utterance mean/variance normalization


@dataclass
class SpecAugConfig:
    """SpecAugment (no time warping), as in the CAPE paper appendix C.2."""

    enabled: bool = True  #: apply SpecAugment during training
    freq_masks: int = 2  #: frequency masks per utterance
    freq_width: int = 30  #: max bins per frequency mask
    time_masks: int = 10  #: time masks per utterance
    time_width: int = 50  #: max frames per time mask
    time_ratio: float = 0.1  #: max fraction of the utterance covered by one time mask


@dataclass
class AugmentConfig:
    """Training-time audio augmentation (asrkit.data.augment); all off by default."""

    speed: list = field(default_factory=list)  #: speed perturbation factors besides 1.0, e.g. [0.9, 1.1]
    volume: list = field(default_factory=list)  #: [low, high] gain (log-uniform); [] = off
    noise_prob: float = 0.0  #: probability of additive generated noise
    noise_snr: list = field(default_factory=lambda: [10.0, 30.0])  #: SNR range in dB
    reverb_prob: float = 0.0  #: probability of a simulated room impulse response
    reverb_t60: list = field(default_factory=lambda: [0.2, 0.8])  #: T60 range in seconds

    @property
    def waveform(self) -> bool:
        """Whether an augmentation needs the audio itself (the fbank is then computed on the fly)."""
        return bool(self.volume) or self.noise_prob > 0 or self.reverb_prob > 0

    @property
    def enabled(self) -> bool:
        return bool(self.speed) or self.waveform


@dataclass
class TokenConfig:
    kind: str = "letters"  #: letters | bpe | unigram
    vocab_size: int = 256  #: sentencepiece only
    path: str = ""  #: tokenizer file (set by the recipe: data/tokens/...)


@dataclass
class FrontendConfig:
    """The Transformer's frontend (asrkit.model.frontend): ``conv1d``, one 1-D conv + GLU (CAPE
    paper / Likhomanenko et al.), or ``conv2d``, the Conformers' 2-D conv subsampling."""

    type: str = "conv1d"  #: conv1d | conv2d (asrkit.model.frontend.FRONTENDS)
    kernel: int = 7  #: conv1d: over time; conv2d: kernel x kernel (3 in ESPnet / icefall / NeMo)
    stride: int = 3  #: frames per output frame (conv2d: a power of 2, one stride-2 conv per factor 2)
    channels: int = 64  #: conv2d only: channels of its convolutions
    #: conv2d only: half = kernel // 2 zeros on every side (NeMo's, ceil(T / stride) frames); none = no
    #: padding (ESPnet's Conv2dSubsampling, ((T - 1) // 2 - 1) // 2 frames at stride 4)
    padding: str = "half"
    dropout: float = 0.3  #: dropout after the frontend


@dataclass
class EncoderConfig:
    type: str = "transformer"  #: transformer (conv encoders: see asrkit.model.conv)
    d_model: int = 768  #: model width
    n_layers: int = 36  #: encoder layers
    n_heads: int = 4  #: attention heads
    d_ff: int = 3072  #: feed-forward width
    dropout: float = 0.4  #: dropout in attention output and FFN
    attn_dropout: float = 0.0  #: dropout on attention weights
    layer_drop: float = 0.4  #: probability of skipping a layer in training (LayerDrop)
    norm_first: bool = False  #: False = post-LN as in the paper; True = pre-LN
    activation: str = "relu"  #: feed-forward activation (relu, gelu, swish)
    attention: str = "softmax"  #: softmax | linear_relu | linear_favor
    #: 0 = Transformer layers; an odd k >= 3 = the Conformer's convolution module (depthwise, k
    #: frames after the frontend) in every layer (asrkit.model.transformer.ConvModule)
    conv_kernel: int = 0
    #: the Conformer's half-step feed-forward pair: a second feed-forward before attention, both
    #: residuals x 0.5 (pre-LN only; ESPnet's macaron_style)
    macaron: bool = False
    block_norm: bool = False  #: a LayerNorm closing every layer (the Conformer block's; ESPnet's norm_final)
    #: the convolution module's norm: layer (LayerNorm) | batch (BatchNorm over the real frames,
    #: running statistics moved once per step over all ranks; asrkit.model.batchnorm)
    conv_norm: str = "layer"
    pos_enc: str = "sinpos"  #: see asrkit.model.posenc.POS_ENCODINGS
    pos: dict = field(default_factory=dict)  #: options of the chosen positional encoding
    options: dict = field(default_factory=dict)  #: options of conv encoders (validated by asrkit.model.conv)


@dataclass
class DecoderConfig:
    """Attention decoder for sequence-to-sequence training (``none`` = CTC only)."""

    type: str = "none"  #: none | lstm | transformer
    options: dict = field(default_factory=dict)  #: the decoder's own options (its class in asrkit/model/decoders.py)
    ctc_weight: float = 1.0  #: weight of the CTC loss when a decoder is used


@dataclass
class DataConfig:
    manifest_dir: str = "data/manifests"  #: directory of the Lhotse manifests (recipe stage 1)
    corpus: str = "mini"  #: corpus name in the manifest file names
    train_sets: list = field(default_factory=lambda: ["train"])  #: training parts (manifest names)
    dev_set: str = "dev"  #: development part, validated during training
    sampler: str = "bucketing"  #: bucketing (duration buckets, asrkit.data.batching) | padfree
    max_duration: float = 240.0  #: seconds of audio per batch (per rank)
    num_buckets: int = 30  #: duration buckets of the bucketing sampler
    #: a bucket's utterances packed in random order (shuffle: a batch's utterances change every
    #: epoch) or in duration order (sort: ~1 % padding instead of 7-11 % at 8-10 buckets, the
    #: same batches every epoch up to ties, as ESPnet's length batches); asrkit.data.batching
    bucket_order: str = "shuffle"
    num_workers: int = 1  #: DataLoader worker processes per rank (0: load in the training process)
    min_duration: float = 0.3  #: shorter utterances are dropped (counted) before training
    max_utt_duration: float = 60.0  #: longer utterances are dropped (counted)
    on_bad_audio: str = "raise"  #: raise | skip (skip = warn, count, drop from the batch)
    dev_max_utts: int = 0  #: limit dev utterances used for validation WER (0 = all)
    #: where the padded pipeline's fbank comes from: stored (``asrkit cuts --fbank-parts``, under
    #: ``fbank_dir``) | on_the_fly (every epoch) | auto (stored when the training and dev sets have
    #: it for these features, else on the fly); the padding-free sampler is always on the fly.
    #: A run saves what it used (stored | on_the_fly) in its config.yaml.
    features: str = "auto"
    fbank_dir: str = "data/fbank"  #: stored features (asrkit.data.feature_store)
    #: train from Lhotse Shar shards written by stage 2 (``asrkit cuts --shar-dir``) under this dir,
    #: each rank reading its own shards sequentially (asrkit.data.shar); "" = from the manifests
    shar_dir: str = ""


@dataclass
class OptimConfig:
    name: str = "adagrad"  #: adagrad | adam | adamw
    lr: float = 0.03  #: peak learning rate
    betas: list = field(default_factory=lambda: [0.9, 0.98])  #: Adam / AdamW betas
    eps: float = 1e-8  #: Adam / AdamW epsilon
    weight_decay: float = 0.0  #: weight decay (decoupled for AdamW)
    schedule: str = "constant"  #: constant | warmup_constant | noam | warmup_cosine
    warmup_steps: int = 0  #: linear warm-up steps of the schedule
    min_lr_ratio: float = 0.05  #: warmup_cosine floor
    clip_grad: float = 1.0  #: max gradient norm (0 = off), applied to unscaled gradients


@dataclass
class TrainConfig:
    seed: int = 42  #: seed of weights, batches, augmentation and dropout
    max_epochs: int = 100  #: stop after this many epochs
    max_steps: int = 0  #: stop after this many optimizer steps (0 = no limit)
    max_minutes: float = 0.0  #: stop (cleanly, with a checkpoint) after this wall time (0 = no limit)
    accum_grad: int = 1  #: batches accumulated per optimizer step
    amp: str = "none"  #: none | bf16 | fp16 | auto (bf16 where the hardware computes it natively, else none)
    device: str = "auto"  #: auto | cpu | cuda
    threads: int = 0  #: torch intra-op threads on CPU (0 = torch default)
    #: keep freed memory in the training process for reuse (glibc's malloc: no mmap, no trimming),
    #: so a CPU step does not page-fault its large activations afresh: faster CPU steps (measured
    #: 1.2x the audio per second) at several times the resident memory (3.5x; docs/training.md).
    #: false = glibc's default. No effect outside glibc
    keep_freed_memory: bool = False
    log_interval: int = 50  #: log a line every N optimizer steps
    ckpt_every_steps: int = 1000  #: write a step checkpoint every N optimizer steps
    keep_last: int = 3  #: step checkpoints kept (0: all)
    valid_every_epochs: int = 1  #: validate on the dev set every N epochs
    #: how validation decodes the dev set (asrkit.training.validation; the ``decode.*`` options apply).
    #: ``auto``: greedy CTC, plus ``decode.method`` when that is not greedy (the recipe's decoder,
    #: e.g. wfst with its TLG graph, when the recipe's decode.* settings are in the training config);
    #: ``greedy``: greedy CTC alone; a ``decode.method`` name (prefix_beam | wfst | attention):
    #: greedy CTC plus that method. Each WER is logged and in TensorBoard labelled with its method
    #: (``dev WER ... (greedy CTC)``, ``(wfst TLG)``, ``(prefix_beam + LM)``...). The checkpoints'
    #: ``dev_wer`` (``best``, ``asrkit average --by best``) is the first one logged: the decoder's
    #: when one runs besides greedy CTC, else greedy CTC's
    valid_decode: str = "auto"
    #: > 0: also keep an exponential moving average of the weights with this decay (e.g. 0.999;
    #: ramped up as min(decay, (1 + step) / (10 + step))); validation and decoding then use it
    ema_decay: float = 0.0
    max_bad_steps: int = 20  #: consecutive NaN/inf steps before training stops
    dist_timeout_s: float = 600.0  #: DDP collective timeout: a rank that hangs ends the job after this many seconds
    #: a resume with another number of processes is allowed: the rest of the epoch is dealt out to
    #: the new ranks (no utterance skipped or repeated; the global batch changes with the world size)
    elastic: bool = False
    #: start from the weights of another run: its experiment dir (newest checkpoint; the moving
    #: average of the weights where it kept one) or a checkpoint file. The model's shapes and the
    #: tokenizer must be the same (checked). A run that resumes from its own checkpoint ignores it.
    init_from: str = ""
    #: with init_from: take everything but the token-sized layers (the CTC output layer and any
    #: attention decoder), which start afresh, so that a model of another tokenizer (letters ->
    #: phones, another BPE) starts this one's encoder (NeMo's change_vocabulary)
    init_new_head: bool = False


@dataclass
class DecodeConfig:
    method: str = "greedy"  #: greedy | prefix_beam | wfst | attention
    beam: int = 8  #: beam size (prefix_beam, attention)
    batch_size: int = 1  #: 1 = padding never affects scoring
    hop: float = 0.0  #: STFT hop for inference (0 = the training hop)
    lm: str = ""  #: ARPA word LM for prefix beam fusion, or a TLG graph dir for wfst
    lm_weight: float = 0.5  #: LM weight (prefix beam) / LM scale relative to the acoustic scores (wfst)
    word_bonus: float = 0.0  #: added per word to a hypothesis's score (prefix beam with an LM)
    #: subtracted from the CTC blank's log-probability of every frame before the search (as icefall's
    #: and sherpa-onnx's blank_penalty): > 0 trades deletions for insertions; 0 = off
    blank_penalty: float = 0.0
    #: wfst: the Viterbi search's pruning beam, in the graph's cost units (Kaldi's and kaldi-decoder's
    #: ``beam``; divided by decode.lm_weight as the costs are)
    search_beam: float = 16.0
    #: wfst: the most states kept per frame (Kaldi's ``max_active``; sherpa-onnx's ctc max_active
    #: defaults to 3000). Smaller is faster: an under-trained model's flat posteriors fill it
    max_active: int = 7000
    #: attention decoding: weight of the CTC prefix score in [0, 1] (joint CTC/attention search);
    #: -1 = the model's own ``decoder.options.search_ctc_weight``
    ctc_weight: float = -1.0
    bins: list = field(default_factory=lambda: [10.0, 15.0, 20.0])  #: duration bin edges (s) of the WER and cost per bin
    #: where asrkit decode / transcribe / tune / curve run the model: auto (the first GPU when CUDA is
    #: available, else the CPU: as train.device, icefall and NeMo) | cpu | cuda | cuda:N. cuda where
    #: there is none is an error. Raise decode.batch_size (e.g. 32) to batch on a GPU
    device: str = "auto"


@dataclass
class Config:
    features: FeatureConfig = field(default_factory=FeatureConfig)
    specaug: SpecAugConfig = field(default_factory=SpecAugConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    tokens: TokenConfig = field(default_factory=TokenConfig)
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


#: keys that no longer exist -> the value they held when they did nothing (old configs and
#: checkpoints that carry that value still load; any other value is an error saying so)
RETIRED_KEYS: dict[str, Any] = {
    "data.speed_perturb": [],  # declared in 0.1 but never implemented
}


#: what to write instead of a retired key that held a value
RETIRED_HINTS = {"data.speed_perturb": "speed perturbation is augment.speed, e.g. augment.speed=[0.9,1.1]"}


def _drop_retired(data: dict, where: str) -> dict:
    for dotted, inert in RETIRED_KEYS.items():
        sec, key = dotted.split(".")
        section = data.get(sec)
        if isinstance(section, dict) and key in section:
            if section[key] != inert:
                raise ConfigError(f"{where}: config key {dotted!r} was removed (it was never implemented); "
                                  + RETIRED_HINTS.get(dotted, "remove it"))
            data = {**data, sec: {k: v for k, v in section.items() if k != key}}
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config and apply ``key=value`` overrides: every key known, every value of its type
    (raises :class:`ConfigError` naming the file and key). What the values mean is checked by the
    layers that read them; :func:`asrkit.training.checks.load_config` checks everything a training
    run reads."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        data = load_yaml_mapping(path.read_text(), f"config file {path}")
    for key, value in parse_overrides(overrides or []):
        set_nested(data, key, value)
    try:
        return from_dict(Config, _drop_retired(data, str(path or "<overrides>")))
    except ConfigError as e:
        raise ConfigError(f"{path or '<overrides>'}: {e}") from None


def experiment_config(exp_dir: str | Path) -> dict | None:
    """The mapping an experiment dir's ``config.yaml`` holds, as ``asrkit train`` wrote it (keys
    added since that run are absent; :func:`config_from_dict` fills them in). None when the dir has
    no config.yaml; a file that is not a YAML mapping raises :class:`ConfigError` naming it."""
    path = Path(exp_dir) / "config.yaml"
    if not path.is_file():
        return None
    return load_yaml_mapping(path.read_text(encoding="utf-8"), f"config file {path}")


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def config_from_dict(data: dict) -> Config:
    """A Config from its dict form (e.g. a checkpoint's ``config``); keys and types checked."""
    return from_dict(Config, _drop_retired(data, "config"))


def with_overrides(cfg: Config, pairs: list[tuple[str, Any]]) -> Config:
    """A copy of ``cfg`` with ``(dotted.key, value)`` pairs (:func:`parse_overrides`) set (keys and types checked)."""
    data = to_dict(cfg)
    for key, value in pairs:
        set_nested(data, key, value)
    return config_from_dict(data)


def config_keys() -> list[dict[str, Any]]:
    """Every config key, in declaration order: ``{"key", "type", "default", "doc"}`` with the doc
    from the ``#:`` comments of the dataclasses (on the line, or on the lines just above) and the
    section's docstring first line as the doc of ``<section>.*``. For docs/config.md and
    ``asrkit decode --help``."""
    import inspect
    import re
    import typing

    out: list[dict[str, Any]] = []
    for sec in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[sec.name]
        hints = typing.get_type_hints(cls)
        docs: dict[str, str] = {}
        pending: list[str] = []
        for line in inspect.getsource(cls).splitlines()[1:]:
            s = line.strip()
            if s.startswith("#:"):
                pending.append(s[2:].strip())
                continue
            m = re.match(r"([a-z_][a-z0-9_]*)\s*:[^=]*(?:=.*?)?(?:#:\s*(.*))?$", s)
            if m and m.group(1) in hints:
                docs[m.group(1)] = " ".join(pending + ([m.group(2).strip()] if m.group(2) else []))
            pending = [] if not s.startswith("#") else pending
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            typ = hints[f.name]
            out.append({"key": f"{sec.name}.{f.name}", "type": getattr(typ, "__name__", str(typ).replace("typing.", "")),
                        "default": default, "doc": docs.get(f.name, ""), "section_doc": inspect.getdoc(cls) or ""})
    return out
