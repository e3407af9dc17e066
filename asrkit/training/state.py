"""What a checkpoint must hold to resume exactly, and when resuming would be wrong.

* RNG states (python, numpy, torch, CUDA) and seeding;
* the fingerprints of the training data: utterances, transcripts, tokenizer;
* :func:`thread_warning`: a resume with another CPU thread count is not bitwise;
* :func:`resume_problems`: the reasons a checkpoint cannot be resumed by this run (config,
  world size, data or tokenizer changed), each said in words.
"""
from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import torch

#: config keys that may change between a run and its resumption
RESUMABLE_CHANGES = ("train.max_epochs", "train.max_steps", "train.max_minutes", "train.log_interval",
                     "train.ckpt_every_steps", "train.keep_last", "train.valid_every_epochs", "data.num_workers",
                     "train.threads", "train.dist_timeout_s", "train.elastic", "train.max_bad_steps", "train.valid_decode", "decode",
                     "data.dev_max_utts")


def rng_state() -> dict:
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def portable_rng_state(st: dict) -> dict:
    """:func:`rng_state` as a checkpoint stores it: numpy's key array as an int64 tensor, so that
    the checkpoint is tensors and plain data only (read with ``torch.load(weights_only=True)``)."""
    kind, keys, *rest = st["numpy"]
    return {**st, "numpy": (kind, torch.from_numpy(np.asarray(keys).astype(np.int64)), *rest)}


def set_rng_state(st: dict) -> None:
    """Restore :func:`rng_state` or :func:`portable_rng_state` (or a checkpoint's numpy array of
    keys, as asrkit wrote them before)."""
    random.setstate(st["python"])
    kind, keys, *rest = st["numpy"]
    if isinstance(keys, torch.Tensor):
        keys = keys.numpy().astype(np.uint32)
    np.random.set_state((kind, keys, *rest))
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def data_fingerprint(cuts) -> str:
    """A digest of the training utterances (ids and durations)."""
    h = hashlib.sha256()
    for c in sorted(cuts, key=lambda c: c.id):
        h.update(f"{c.id}:{c.duration:.4f}\n".encode())
    return h.hexdigest()[:16]


def text_fingerprint(cuts) -> str:
    """A digest of the transcripts the model is trained on (as the dataset joins them)."""
    h = hashlib.sha256()
    for c in sorted(cuts, key=lambda c: c.id):
        text = " ".join(s.text for s in c.supervisions if s.text)
        h.update(f"{c.id}\t{text}\n".encode())
    return h.hexdigest()[:16]


def tokenizer_fingerprint(tokenizer) -> str:
    """A digest of the tokenizer as saved (kind, sentencepiece model, text mapping)."""
    return hashlib.sha256(json.dumps(tokenizer.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def fingerprints(cuts, tokenizer) -> dict:
    """What a checkpoint records of the data a run trains on (compared on resume)."""
    pre = getattr(cuts, "data_fingerprints", None)  # computed while indexing (asrkit.data.cut_index.CutIndex)
    if pre:
        return {**pre, "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)}
    return {"data_fingerprint": data_fingerprint(cuts), "text_fingerprint": text_fingerprint(cuts),
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)}


#: what a change of each fingerprint means (checkpoints from before one existed skip its check)
_FINGERPRINT_CHANGES = {
    "data_fingerprint": "training data changed (different utterances or durations)",
    "text_fingerprint": "transcripts of the training data changed (same utterances, other texts)",
    "tokenizer_fingerprint": "tokenizer changed (the file at tokens.path differs)",
}


def thread_warning(st: dict, threads: int) -> str:
    """Why a resume with ``threads`` intra-op threads does not continue the checkpoint's run
    bitwise ("" when it does, or when the checkpoint predates recording it)."""
    old = st.get("threads")
    if old is None or old == threads:
        return ""
    return (f"the checkpoint was trained with {old} CPU thread(s), this run uses {threads} (train.threads; 0 = all "
            "cores): training continues correctly, but not bitwise like an uninterrupted run, since CPU sums split "
            f"over another number of threads round differently. Set train.threads={old} for bitwise continuation")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("pos", "options"):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def config_changes(old: dict, new: dict) -> list[str]:
    """Keys whose change makes a resume wrong (everything except :data:`RESUMABLE_CHANGES`). A key
    the old config lacks (a checkpoint written before asrkit had it) counts as its default value:
    a new release's new keys, left at their defaults, do not stop a resume."""
    from asrkit.config import Config, to_dict

    a, b = _flatten(old), _flatten(new)
    default = _flatten(to_dict(Config()))
    changed = [k for k in sorted(set(a) | set(b)) if a.get(k, default.get(k)) != b.get(k)]
    return [k for k in changed if not any(k == r or k.startswith(r + ".") for r in RESUMABLE_CHANGES)]


def resume_problems(st: dict, config: dict, world_size: int, prints: dict, vocab: list) -> list[str]:
    """Why checkpoint ``st`` cannot be resumed by a run with this (resolved) ``config``, world size,
    data fingerprints (:func:`fingerprints`) and tokenizer vocabulary; empty when it can."""
    problems = []
    changed = config_changes(st["config"], config)
    if changed:
        old, new = _flatten(st["config"]), _flatten(config)
        problems.append("config changed: " + ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed))
    elastic = bool(config.get("train", {}).get("elastic")) and "sampler_start" in st
    if st["world_size"] != world_size and not elastic:
        problems.append(f"world size changed: checkpoint {st['world_size']}, now {world_size} "
                        "(the sampler shards and the global batch would differ; train.elastic=true resumes with the "
                        "new world size, continuing the epoch where it stopped)")
    changed = {k for k in _FINGERPRINT_CHANGES if k in st and st[k] != prints[k]}
    if "data_fingerprint" in changed:
        problems.append(_FINGERPRINT_CHANGES["data_fingerprint"])
    elif "text_fingerprint" in changed:  # (other utterances have other transcripts: said once)
        problems.append(_FINGERPRINT_CHANGES["text_fingerprint"])
    if st.get("vocab") != list(vocab):
        problems.append("tokenizer changed (another vocabulary)")
    elif "tokenizer_fingerprint" in changed:
        problems.append(_FINGERPRINT_CHANGES["tokenizer_fingerprint"])
    return problems
