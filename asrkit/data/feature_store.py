"""Precomputed features: asrkit's fbank computed once per utterance (stage 2, ``asrkit cuts``),
stored with Lhotse (lilcom-compressed chunked storage), attached to the cuts and read by the
padded training pipeline instead of decoding the audio and computing the fbank every epoch.

The values are asrkit's own fbank (:func:`asrkit.data.features.fbank`, int16-scaled samples),
wrapped as a Lhotse :class:`~lhotse.features.base.FeatureExtractor` (:class:`AsrkitFbank`,
``type: asrkit-fbank`` in the manifests); Lhotse's own ``Fbank`` takes samples in [-1, 1] and
gives other values. Lilcom stores integer multiples of ``2 ** TICK_POWER``: a stored value is
within :data:`PRECISION` of the on-the-fly one (tests/test_feature_store.py). Per-utterance CMVN
and SpecAugment stay on the fly (:meth:`asrkit.data.dataset.AsrDataset.featurize`).

Layout: one directory per fbank configuration (several configs of a recipe can coexist),
``<fbank_dir>/<key>/`` with ``key`` e.g. ``fbank80_hop10ms_win25ms_16k`` (:meth:`FbankOptions.key`)::

    store.json                        the fbank options (checked before any read)
    <corpus>_feats_<part>/NNNNN.lca   lilcom chunky files, one per block of utterances
    <corpus>_cuts_<part>.jsonl.gz     the part's cuts with features (paths relative to the store)

The cuts manifest is written last and removed first when a part is recomputed: when it exists,
the part is complete. The utterances trained on always come from ``data.manifest_dir``; the
store only lends them features (:meth:`FeatureStore.attach`), and a store that does not cover
every utterance with the same start and duration is out of date and not used.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from lhotse.features.base import FeatureExtractor, register_extractor

from asrkit.data.features import fbank
from asrkit.utils import atomic_path, atomic_write

logger = logging.getLogger(__name__)

#: lilcom stores integer multiples of 2 ** TICK_POWER (Lhotse's default for fbank)
TICK_POWER = -5
#: the largest difference between a stored value and the computed one
PRECISION = 2.0 ** (TICK_POWER - 1)
STORE_VERSION = 1
#: key of a cut's ``custom`` holding the stored features of its speed-perturbed copies
SPEED_FEATS = "asrkit_speed_features"


@dataclass
class FbankOptions:
    """What the stored values depend on (the ``features`` config minus ``cmvn``, which stays on the fly)."""

    sample_rate: int = 16000
    win: float = 0.025
    hop: float = 0.010
    n_mels: int = 80
    dither: float = 0.0

    @classmethod
    def of(cls, features) -> "FbankOptions":
        """From a :class:`asrkit.config.FeatureConfig`."""
        return cls(int(features.sample_rate), float(features.win), float(features.hop), int(features.n_mels),
                   float(features.dither))

    def key(self) -> str:
        """Directory name of the store of these options."""
        k = f"fbank{self.n_mels}_hop{self.hop * 1000:g}ms_win{self.win * 1000:g}ms_{self.sample_rate / 1000:g}k"
        return k + (f"_dither{self.dither:g}" if self.dither else "")


@register_extractor
class AsrkitFbank(FeatureExtractor):
    """asrkit's fbank (:func:`asrkit.data.features.fbank`) as a Lhotse feature extractor."""

    name = "asrkit-fbank"
    config_type = FbankOptions

    def extract(self, samples: np.ndarray, sampling_rate: int) -> np.ndarray:
        c = self.config
        if sampling_rate != c.sample_rate:
            raise ValueError(f"asrkit-fbank: audio at {sampling_rate} Hz, features.sample_rate is {c.sample_rate}")
        x = np.asarray(samples, dtype=np.float32)
        x = x[0] if x.ndim == 2 else x  # first channel, as load_cut_audio
        return fbank(x, c.sample_rate, c.hop, c.win, c.n_mels, c.dither).numpy()

    @property
    def frame_shift(self) -> float:
        return self.config.hop

    def feature_dim(self, sampling_rate: int) -> int:
        return self.config.n_mels


def stored_fbank(cut, features, hop: float) -> Optional[torch.Tensor]:
    """The cut's stored fbank (``T x n_mels``) when it has asrkit's features at ``hop`` with these
    ``features`` options, else None (the caller computes them)."""
    f = getattr(cut, "features", None)
    if (f is None or f.type != AsrkitFbank.name or f.num_features != features.n_mels
            or f.sampling_rate != features.sample_rate or not math.isclose(f.frame_shift, hop, rel_tol=1e-9)):
        return None
    from asrkit.data.audio import AudioError

    try:
        return torch.from_numpy(np.ascontiguousarray(cut.load_features(), dtype=np.float32))
    except Exception as e:  # missing or truncated storage file
        raise AudioError(f"cannot read the stored features of utterance {cut.id!r} from {f.storage_path}: {e}; "
                         "recompute them (stage 2, asrkit cuts --fbank-parts) or train with "
                         "data.features=on_the_fly") from e


# ---------------------------------------------------------------------------- computing


def _compute_block(args) -> list[tuple[str, object, Optional[str]]]:
    """Worker: ``(cut id, Features or None, error or None)`` for a block of cuts, stored in one file."""
    from lhotse import LilcomChunkyWriter

    from asrkit.data.audio import AudioError, load_cut_audio

    cuts, options, path, threads = args
    if threads:
        torch.set_num_threads(threads)
    ext = AsrkitFbank(options)
    out = []
    with LilcomChunkyWriter(path, tick_power=TICK_POWER) as w:
        for cut in cuts:
            try:
                samples = load_cut_audio(cut)
            except AudioError as e:
                out.append((cut.id, None, str(e)))
                continue
            feats = ext.extract_from_samples_and_store(samples[None], storage=w, sampling_rate=cut.sampling_rate,
                                                       offset=cut.start, channel=cut.channel)
            out.append((cut.id, feats, None))
    return out


class FeatureStore:
    """The stored features of one fbank configuration under ``fbank_dir``."""

    def __init__(self, fbank_dir: str | Path, options: FbankOptions):
        self.options = options
        self.dir = Path(fbank_dir) / options.key()

    @classmethod
    def of(cls, fbank_dir: str | Path, features) -> "FeatureStore":
        return cls(fbank_dir, FbankOptions.of(features))

    def cuts_path(self, corpus: str, part: str) -> Path:
        return self.dir / f"{corpus}_cuts_{part}.jsonl.gz"

    def _stamp(self) -> dict:
        return {"extractor": AsrkitFbank.name, "options": asdict(self.options), "tick_power": TICK_POWER,
                "version": STORE_VERSION}

    def _stamp_problem(self) -> Optional[str]:
        path = self.dir / "store.json"
        try:
            stamp = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            return f"{path} is missing or unreadable ({e})"
        if stamp != self._stamp():
            return f"{path} describes other features ({stamp}) than {self._stamp()}"
        return None

    def compute(self, cuts, corpus: str, part: str, num_jobs: int = 2, block: int = 500) -> tuple[dict, dict]:
        """Compute and store the features of ``cuts`` (in parallel, with progress). Returns
        ``({cut id: Features}, {cut id: audio error})``; nothing is attached yet (:meth:`save`)."""
        from tqdm import tqdm

        cut_list = list(cuts)
        for c in cut_list:
            if c.sampling_rate != self.options.sample_rate:
                raise ValueError(f"{corpus}/{part}: utterance {c.id!r} is at {c.sampling_rate} Hz but "
                                 f"features.sample_rate is {self.options.sample_rate}; set features.sample_rate")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cuts_path(corpus, part).unlink(missing_ok=True)  # the part is incomplete from here on
        with atomic_write(self.dir / "store.json") as f:
            json.dump(self._stamp(), f, indent=1)
        rel = Path(f"{corpus}_feats_{part}")
        shutil.rmtree(self.dir / rel, ignore_errors=True)
        (self.dir / rel).mkdir(parents=True)
        # blocks of 50..block utterances (one file each), about 4 per job for balance and progress
        block = max(1, min(block, max(50, math.ceil(len(cut_list) / max(1, 4 * num_jobs)))))
        jobs = [(cut_list[i:i + block], self.options, str(self.dir / rel / f"{i // block:05d}.lca"), 1 if num_jobs > 1 else 0)
                for i in range(0, len(cut_list), block)]
        feats, bad = {}, {}
        bar = tqdm(total=len(cut_list), desc=f"fbank {corpus}/{part}", dynamic_ncols=True, unit="utt")

        def collect(results) -> None:
            for cid, f, err in results:
                if err is not None:
                    bad[cid] = err
                else:  # relative to the store: the store may be read from another directory
                    feats[cid] = _relative(f, self.dir)
            bar.update(len(results))

        if num_jobs <= 1:
            for job in jobs:
                collect(_compute_block(job))
        else:
            with ProcessPoolExecutor(num_jobs) as ex:
                for fut in as_completed([ex.submit(_compute_block, job) for job in jobs]):
                    collect(fut.result())
        bar.close()
        return feats, bad

    def save(self, cuts, feats: dict, corpus: str, part: str) -> Path:
        """Write the part's cuts with their features (every cut must have them): the part is complete."""
        from lhotse import CutSet
        from lhotse.utils import fastcopy

        out = CutSet.from_cuts(fastcopy(c, features=feats[c.id]) for c in cuts)
        with atomic_path(self.cuts_path(corpus, part)) as tmp:
            out.to_file(tmp)
        return self.cuts_path(corpus, part)

    # ------------------------------------------------------------------------ reading

    def attach(self, cuts, corpus: str, parts):
        """``(cuts with their stored features, "")``, or ``(None, why not)`` when the store lacks
        one of the ``parts`` (a part name or a list) the cuts come from, describes other features,
        or is out of date (an utterance missing, or with another start or duration)."""
        from lhotse import CutSet, load_manifest
        from lhotse.utils import fastcopy

        parts = [parts] if isinstance(parts, str) else list(parts)
        missing = [p for p in parts if not self.cuts_path(corpus, p).is_file()]
        if missing:
            return None, f"no stored features of {', '.join(f'{corpus}/{p}' for p in missing)} in {self.dir}"
        problem = self._stamp_problem()
        if problem:
            return None, problem
        stored = {c.id: c for p in parts for c in load_manifest(self.cuts_path(corpus, p))}
        out = []
        for c in cuts:
            s = stored.get(c.id)
            if s is None or not s.has_features or abs(s.start - c.start) > 1e-6 or abs(s.duration - c.duration) > 1e-6:
                return None, (f"the stored features of {corpus}/{'+'.join(parts)} in {self.dir} are out of date: "
                              f"utterance {c.id!r} is {'missing' if s is None else 'different'} there")
            out.append(fastcopy(c, features=s.features.with_path_prefix(self.dir)))
        return CutSet.from_cuts(out), ""

    def attach_speed_copies(self, cuts, corpus: str, parts, factors):
        """``(cuts carrying the stored features of their speed-perturbed copies, "")``, or
        ``(None, why not)``. Stage 2 stores the copies as parts ``<part>_sp<factor>``; each cut gets
        ``custom[SPEED_FEATS] = {factor: Features}``, which :class:`asrkit.data.dataset.AsrDataset`
        reads for the copy it trains on."""
        from lhotse import CutSet
        from lhotse.utils import fastcopy

        from asrkit.data.augment import speed_part

        parts = [parts] if isinstance(parts, str) else list(parts)
        cuts = list(cuts)
        copies = {}
        for f in map(float, factors):
            want = [c.drop_features().perturb_speed(f) if c.has_features else c.perturb_speed(f) for c in cuts]
            got, why = self.attach(want, corpus, [speed_part(p, f) for p in parts])
            if got is None:
                return None, why
            copies[f] = [g.features for g in got]
        out = [fastcopy(c, custom={**(c.custom or {}), SPEED_FEATS: {f: copies[f][i] for f in copies}})
               for i, c in enumerate(cuts)]
        return CutSet.from_cuts(out), ""

    def is_complete(self, cuts, corpus: str, part: str) -> bool:
        """Whether the store has features for every one of ``cuts`` (stage 2 then skips the part)."""
        return self.attach(cuts, corpus, part)[0] is not None


def _relative(f, root: Path):
    from lhotse.utils import fastcopy

    return fastcopy(f, storage_path=str(Path(f.storage_path).relative_to(root)))
