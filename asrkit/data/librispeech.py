"""LibriSpeech (and the synthetic ``mini`` corpus, which uses LibriSpeech's layout).

Both go through Lhotse's own :func:`lhotse.recipes.prepare_librispeech`, so the mini recipe
exercises the same code path as the real corpus.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from lhotse import CutSet
from lhotse.recipes import prepare_librispeech

from asrkit.data.manifests import prepare_parts, write_part

logger = logging.getLogger(__name__)

LIBRISPEECH_PARTS = ("train-clean-100", "train-clean-360", "train-other-500", "dev-clean", "dev-other", "test-clean", "test-other")
MINI_PARTS = ("train", "dev", "test", "test-longform")


def _prepare_parts(corpus: str, libri_dir: Path, out_dir: Path, parts: Sequence[str], num_jobs: int) -> dict[str, CutSet]:
    def one(part: str) -> CutSet:
        if not (libri_dir / part).is_dir():
            raise FileNotFoundError(f"{corpus}: part directory {libri_dir / part} does not exist")
        # output_dir=None: nothing is written by Lhotse; we write our own files atomically
        m = prepare_librispeech(libri_dir, dataset_parts=[part], output_dir=None, num_jobs=num_jobs)[part]
        check_complete(corpus, libri_dir / part, m["recordings"])
        return write_part(out_dir, corpus, part, m["recordings"], m["supervisions"])

    return prepare_parts(out_dir, corpus, parts, one, num_jobs=num_jobs)


def check_complete(corpus: str, part_dir: Path, recordings) -> None:
    """Lhotse skips (with a log line only) utterances whose FLAC file is missing and ignores FLAC
    files without a transcript line. Fail naming the missing files; warn about (and so count) the
    untranscribed ones."""
    listed: dict[str, Path] = {}
    for trans in part_dir.rglob("*.trans.txt"):
        with open(trans) as f:
            for line in f:
                if line.strip():
                    uid = line.split(maxsplit=1)[0]
                    listed[uid] = trans.parent / f"{uid}.flac"
    have = set(recordings.ids)
    missing = [str(p) for uid, p in sorted(listed.items()) if uid not in have]
    if missing:
        raise FileNotFoundError(
            f"{corpus}/{part_dir.name}: {len(missing)} audio file(s) listed in *.trans.txt are missing, e.g. "
            + ", ".join(missing[:5])
        )
    untranscribed = sorted({f.stem for f in part_dir.rglob("*.flac")} - set(listed))
    if untranscribed:
        logger.warning("%s/%s: %d recordings without a transcript line: %s", corpus, part_dir.name, len(untranscribed), ", ".join(untranscribed[:5]))


def prepare(corpus_dir: Path | str, out_dir: Path | str, parts: Sequence[str] | None = None, num_jobs: int = 2) -> dict[str, CutSet]:
    """Real LibriSpeech: ``corpus_dir`` holds ``LibriSpeech/<part>`` (or is that ``LibriSpeech`` dir).
    ``train-960`` expands to the three training parts."""
    corpus_dir = Path(corpus_dir)
    libri = corpus_dir / "LibriSpeech" if (corpus_dir / "LibriSpeech").is_dir() else corpus_dir
    parts = list(parts or LIBRISPEECH_PARTS)
    if "train-960" in parts:
        parts.remove("train-960")
        parts += [p for p in LIBRISPEECH_PARTS[:3] if p not in parts]
    return _prepare_parts("librispeech", libri, Path(out_dir), parts, num_jobs)


def prepare_mini(
    corpus_dir: Path | str, out_dir: Path | str, parts: Sequence[str] | None = None, num_jobs: int = 2, seed: int = 0, **synth_kwargs
) -> dict[str, CutSet]:
    """The synthetic corpus: synthesize it into ``corpus_dir`` if it is not there, then prepare it."""
    from asrkit.data.synth import synthesize_corpus

    libri = synthesize_corpus(Path(corpus_dir), seed=seed, jobs=num_jobs, **synth_kwargs)
    return _prepare_parts("mini", libri, Path(out_dir), list(parts or MINI_PARTS), num_jobs)
