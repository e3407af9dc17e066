"""Training cuts at LibriSpeech 960 h's size: compact arrays instead of Lhotse cut objects.

A LibriSpeech 960 h manifest holds 281 241 cuts; as Lhotse Cut objects in memory that is ~1 GB
per process (and per DDP rank) and half a minute to load. Training needs, per utterance, only its
duration and sample count (to plan batches) until the utterance is in a batch; the cut itself is
needed for that batch alone. :class:`CutIndex` keeps those numbers in numpy arrays and the
manifest lines zlib-compressed in blocks, and builds Lhotse cuts on demand.

Two caches next to the manifests make a training start cheap. The data stage (``asrkit cuts``)
parses each manifest it writes once into :class:`ManifestColumns` (every cut's numbers, lines,
transcript and letter counts; :func:`manifest_columns`), so the first training start of a tokenizer
and filter only filters arrays (:meth:`CutIndex.derive`: the rule of
:func:`asrkit.data.dataset.filter_cuts`, the fingerprints, the alphabet report); the index it
derives is cached too (:func:`load_train_index`), for every later start and every DDP rank.

The caches are data, never code: a JSON header (the fingerprints, drop counts, alphabet report,
and each array's dtype, shape and place) then the arrays' raw bytes (numbers and bytes only: a
dtype of Python objects is refused; :func:`_save_cache`, :func:`_load_cache`).
A cache directory next to the manifests is often shared (a cluster's file system): a file there
that is not a valid cache of this version is ignored and rebuilt, and nothing in one can run.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import logging
import multiprocessing
import os
import re
import warnings
import zlib
from array import array
from pathlib import Path
from typing import Optional

import numpy as np

from asrkit.utils import atomic_path

logger = logging.getLogger(__name__)

#: manifest lines per compressed block (a cut costs one block's decompression, ~10 us)
BLOCK = 32
#: manifest lines per unit of work of :meth:`CutIndex.build` (one process parses a chunk)
CHUNK = 8192
#: version of the cached index files (bump when their content or the filter rules change)
INDEX_VERSION = 7


def _num_frames_vec(num_samples: np.ndarray, sample_rate: np.ndarray, hop: float) -> np.ndarray:
    """:func:`asrkit.data.features.num_frames` on arrays."""
    shift = np.rint(hop * sample_rate.astype(np.float64)).astype(np.int64)
    return (num_samples + shift // 2) // shift


class CutTable:
    """Utterances as arrays (``durations``, ``num_samples``, ``sampling_rates``) plus a way to get
    the Lhotse cuts of some of them (:meth:`get`): what the samplers plan batches with. Built from
    cuts in memory (:meth:`of`) or a :class:`CutIndex` (which is one)."""

    def __init__(self, cuts: list, durations, num_samples, sampling_rates):
        self._cuts = cuts
        self.durations = np.asarray(durations, dtype=np.float64)
        self.num_samples = np.asarray(num_samples, dtype=np.int64)
        self.sampling_rates = np.asarray(sampling_rates, dtype=np.int32)

    @classmethod
    def of(cls, cuts) -> "CutTable":
        """``cuts`` itself if it is a table already, else a table over them (materialized once)."""
        if isinstance(cuts, CutTable):
            return cuts
        lst = list(cuts)
        ns = [int(c.num_samples) if c.num_samples is not None else int(round(c.duration * c.sampling_rate)) for c in lst]
        return cls(lst, [c.duration for c in lst], ns, [c.sampling_rate for c in lst])

    def __len__(self) -> int:
        return len(self.durations)

    def id(self, i: int) -> str:
        return self._cuts[i].id

    def get(self, indices) -> list:
        """The cuts at ``indices`` (in that order)."""
        return [self._cuts[int(i)] for i in indices]

    def __getitem__(self, i: int):
        return self.get([i])[0]

    def __iter__(self):
        for start in range(0, len(self), 256):
            yield from self.get(range(start, min(len(self), start + 256)))

    def take(self, keep: np.ndarray) -> "CutTable":
        """The table of the utterances at the (sorted) indices ``keep``."""
        return _SubTable(self, np.asarray(keep, dtype=np.int64))

    def subset(self, cut_ids=None, first: Optional[int] = None):
        """A Lhotse ``CutSet`` of the cuts with these ids (in that order) or of the ``first`` ones
        (as :meth:`lhotse.CutSet.subset`)."""
        from lhotse import CutSet

        if first is not None:
            return CutSet.from_cuts(self.get(range(min(first, len(self)))))
        where = {self.id(i): i for i in range(len(self))}
        missing = [c for c in cut_ids if c not in where]
        if missing:
            raise KeyError(f"no utterance {missing[0]!r} among the training cuts")
        return CutSet.from_cuts(self.get([where[c] for c in cut_ids]))

    def to_eager(self):
        from lhotse import CutSet

        return CutSet.from_cuts(list(self))


class _SubTable(CutTable):
    def __init__(self, base: CutTable, keep: np.ndarray):
        self.base, self.keep = base, keep
        super().__init__([], base.durations[keep], base.num_samples[keep], base.sampling_rates[keep])

    def id(self, i: int) -> str:
        return self.base.id(int(self.keep[i]))

    def get(self, indices) -> list:
        return self.base.get(self.keep[np.asarray(list(indices), dtype=np.int64)])


class CutIndex(CutTable):
    """The training cuts of one or more manifests, compact (see above): arrays of durations,
    sample counts and sampling rates, the ids (a numpy bytes array), and the manifest lines of the
    kept cuts, zlib-compressed by blocks of :data:`BLOCK`. Also what the trainer needs from a pass
    over every transcript, computed in the same pass: the data and text fingerprints
    (:func:`asrkit.training.state.fingerprints`, same values as over the cuts themselves) and the
    alphabet report (:func:`asrkit.tokenizer.alphabet_report`)."""

    def __init__(self, blocks: list, ids: np.ndarray, durations, num_samples, sampling_rates,
                 fingerprints: dict, alphabet, drop_stats, sources: Optional[np.ndarray] = None):
        super().__init__([], durations, num_samples, sampling_rates)
        self.blocks, self.ids = blocks, ids
        #: which of the manifests read each cut came from (their index in the list given to :meth:`build`)
        self.sources = sources if sources is not None else np.zeros(len(ids), dtype=np.int32)
        self.starts = np.zeros(len(ids))  #: start of each cut in its recording (seconds)
        #: stored features' paths are relative to this directory (:func:`attach_stored`)
        self.feature_prefix: Optional[str] = None
        self.data_fingerprints, self.alphabet, self.drop_stats = fingerprints, alphabet, drop_stats
        #: where each cut's line is: its block and its row in the block
        self.block_of = np.arange(len(ids), dtype=np.int32) // BLOCK
        self.row = (np.arange(len(ids)) % BLOCK).astype(np.uint8)
        self._cache: dict[int, list] = {}

    def id(self, i: int) -> str:
        return self.ids[i].decode()

    def _lines(self, b: int) -> list:
        lines = self._cache.get(b)
        if lines is None:
            if len(self._cache) >= 8:
                self._cache.pop(next(iter(self._cache)))
            lines = self._cache[b] = zlib.decompress(self.blocks[b]).split(b"\n")
        return lines

    def get(self, indices) -> list:
        from lhotse.serialization import deserialize_item

        cuts = [deserialize_item(json.loads(self._lines(int(self.block_of[i]))[self.row[i]])) for i in indices]
        if self.feature_prefix:
            from lhotse.utils import fastcopy

            cuts = [fastcopy(c, features=c.features.with_path_prefix(self.feature_prefix)) if c.has_features else c
                    for c in cuts]
        return cuts

    def id_texts(self):
        """``(id, transcript)`` of every cut, in order (the transcript as the dataset joins it)."""
        for b in range(len(self.blocks)):
            for line in zlib.decompress(self.blocks[b]).split(b"\n"):
                d = json.loads(line)
                yield d["id"], " ".join(s["text"] for s in d.get("supervisions", []) if s.get("text"))

    def nbytes(self) -> int:
        return (sum(len(b) for b in self.blocks) + self.ids.nbytes + self.durations.nbytes + self.num_samples.nbytes
                + self.sampling_rates.nbytes + self.block_of.nbytes + self.row.nbytes)

    # ------------------------------------------------------------------------ building
    @classmethod
    def build(cls, paths, drop_reason, fold: str = "none", desc: str = "", workers: Optional[int] = None) -> "CutIndex":
        """Read the cuts manifests ``paths`` (in order; :meth:`ManifestColumns.build`, in parallel)
        and keep the cuts for which ``drop_reason(id, text, duration, num_samples, sampling_rate)``
        is None, counting the others (:meth:`derive`). The result does not depend on ``workers``."""
        return cls.derive(ManifestColumns.build(paths, desc, workers), drop_reason, fold)

    @classmethod
    def derive(cls, columns: list, drop_reason, fold: str = "none") -> "CutIndex":
        """The index of the cuts of ``columns`` (:class:`ManifestColumns` of the manifests, in order)
        that ``drop_reason`` keeps: the filter (vectorized when ``drop_reason`` has a ``codes``
        method, as :func:`train_drop_reason`'s has), its counts with examples, the fingerprints and
        the alphabet report; no manifest line is parsed again."""
        from asrkit.data.manifests import DropStats
        from asrkit.tokenizer import AlphabetReport

        c = ManifestColumns.concat(columns)
        if hasattr(drop_reason, "codes"):
            names, codes = drop_reason.codes(c)
        else:
            names, where = [None], {None: 0}
            codes = np.zeros(len(c), dtype=np.int8)
            for i in range(len(c)):
                why = drop_reason(c.id(i), c.text(i), float(c.durations[i]), int(c.num_samples[i]),
                                  int(c.sampling_rates[i]))
                if why not in where:
                    where[why] = len(names)
                    names.append(why)
                codes[i] = where[why]
        stats = DropStats()
        dropped = [(int(np.argmax(codes == k)), k) for k in range(1, len(names)) if (codes == k).any()]
        for _, k in sorted(dropped):  # in the order of their first utterance, as a pass over the lines counts them
            at = np.flatnonzero(codes == k)
            stats.counts[names[k]] = int(at.size)
            stats.examples[names[k]] = [c.id(int(i)) for i in at[:5]]
        keep = np.flatnonzero(codes == 0)
        alphabet = AlphabetReport(fold=fold)
        odd = keep[~c.plain[keep]]
        alphabet.total = len(keep) - len(odd)
        for i in odd.tolist():
            alphabet.add(c.id(i), c.text(i))
        ids, durations = c.ids[keep], c.durations[keep]
        # the fingerprints of asrkit.training.state, over the cuts sorted by id
        order = np.argsort(ids, kind="stable")
        hd = hashlib.sha256(b"".join(b"%s:%.4f\n" % x for x in zip(ids[order].tolist(), durations[order].tolist())))
        ht, kept = hashlib.sha256(), keep[order]
        for a in range(0, len(kept), 8192):  # (in pieces: no copy of every transcript at once)
            ht.update(c.texts_of(kept[a:a + 8192]))
        prints = {"data_fingerprint": hd.hexdigest()[:16], "text_fingerprint": ht.hexdigest()[:16]}
        index = cls(c.blocks, ids, durations, c.num_samples[keep], c.sampling_rates[keep], prints, alphabet, stats,
                    c.sources[keep])
        index.starts = c.starts[keep]
        index.block_of, index.row = c.block_of[keep], c.row[keep]
        return index

    # ------------------------------------------------------------------------ cache
    _ARRAYS = ("ids", "durations", "num_samples", "sampling_rates", "sources", "starts", "block_of", "row")

    def save(self, path: Path) -> None:
        """Write the index to ``path`` (data only: :func:`_save_cache`)."""
        a, d = self.alphabet, self.drop_stats
        meta = {"feature_prefix": self.feature_prefix, "fingerprints": self.data_fingerprints,
                "alphabet": {"fold": a.fold, "total": a.total, "utterances": a.utterances, "chars": dict(a.chars),
                             "examples": [list(e) for e in a.examples]},
                "drop_stats": {"counts": d.counts, "examples": d.examples}}
        _save_cache(path, "CutIndex", meta, {k: getattr(self, k) for k in self._ARRAYS}, {"blocks": self.blocks})

    @classmethod
    def load(cls, path: Path) -> Optional["CutIndex"]:
        """The index saved at ``path``; None when it is not a valid cache of this version."""
        from collections import Counter

        from asrkit.data.manifests import DropStats
        from asrkit.tokenizer import AlphabetReport

        got = _load_cache(path, "CutIndex")
        if got is None:
            return None
        meta, arrays, blobs = got
        try:
            a, d = meta["alphabet"], meta["drop_stats"]
            alphabet = AlphabetReport(fold=a["fold"], total=a["total"], utterances=a["utterances"],
                                      chars=Counter(a["chars"]), examples=[tuple(e) for e in a["examples"]])
            index = cls(blobs["blocks"], arrays["ids"], arrays["durations"], arrays["num_samples"],
                        arrays["sampling_rates"], dict(meta["fingerprints"]), alphabet,
                        DropStats(counts=dict(d["counts"]), examples=dict(d["examples"])), arrays["sources"])
            index.starts, index.block_of, index.row = arrays["starts"], arrays["block_of"], arrays["row"]
            index.feature_prefix = meta["feature_prefix"]
        except (KeyError, TypeError, ValueError) as e:
            logger.info("%s is not a valid index cache (%s); rebuilding it", path, e)
            return None
        return index

    def __getstate__(self) -> dict:  # (sent to DataLoader worker processes: without the block cache)
        st = dict(self.__dict__)
        st["_cache"] = {}
        return st


class ManifestColumns:
    """Every cut of one cuts manifest, unfiltered, as columns: what :meth:`CutIndex.derive` needs
    to filter, fingerprint and index them without parsing a line again. The ids, durations, sample
    counts, sampling rates and starts; the lines zlib-compressed by blocks (shared with the indexes
    derived from it); ``text_blobs``: ``"<id>\\t<transcript>\\n"`` of every cut, UTF-8, one bytes
    string per manifest (``text_start``/``text_end``: each cut's slice of its manifest's); for the letters tokenizer, whatever its fold,
    ``letters`` (characters of the normalized transcript, word boundaries included) and
    ``repeats`` (neighbouring equal ones) of every ``plain`` transcript (ASCII, no digit or
    backquote: the usual case, which no fold changes). Built in one pass over the manifest
    (:meth:`build`, in parallel); cached next to it by :func:`manifest_columns`, which the data
    stage calls after writing the manifest, so that a training start only filters arrays."""

    def __init__(self, parts: list, path: str = ""):
        self.path = path
        self.blocks, block_of, rows = [], [], []
        for p in parts:
            block_of.append(p["block_of"] + len(self.blocks))
            rows.append(p["row"])
            self.blocks += p["blocks"]

        def cat(key, dtype):
            return np.concatenate([p[key] for p in parts]).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

        ids = [x for p in parts for x in p["ids"]]
        self.ids = np.array(ids, dtype=bytes) if ids else np.zeros(0, dtype="S1")
        self.durations, self.num_samples = cat("durs", np.float64), cat("nss", np.int64)
        self.sampling_rates, self.starts = cat("srs", np.int32), cat("starts", np.float64)
        self.block_of = np.concatenate(block_of).astype(np.int32) if parts else np.zeros(0, np.int32)
        self.row = np.concatenate(rows).astype(np.uint8) if parts else np.zeros(0, np.uint8)
        self.plain, self.letters, self.repeats = cat("plain", bool), cat("letters", np.int32), cat("repeats", np.int32)
        self.text_blobs = [b"".join(p["texts"] for p in parts)]
        self.text_end = np.cumsum(cat("text_len", np.int64))
        self.text_start = self.text_end - cat("text_len", np.int64)
        self.sources = np.zeros(len(self.ids), dtype=np.int32)
        self.lines = sum(p["lines"] for p in parts)

    def __len__(self) -> int:
        return len(self.ids)

    _ARRAYS = ("ids", "durations", "num_samples", "sampling_rates", "starts", "block_of", "row", "plain", "letters",
               "repeats", "text_start", "text_end", "sources")

    def save(self, path: Path) -> None:
        """Write the columns to ``path`` (data only: :func:`_save_cache`)."""
        _save_cache(path, "ManifestColumns", {"path": self.path, "lines": self.lines},
                  {k: getattr(self, k) for k in self._ARRAYS}, {"blocks": self.blocks, "text_blobs": self.text_blobs})

    @classmethod
    def load(cls, path: Path) -> Optional["ManifestColumns"]:
        """The columns saved at ``path``; None when it is not a valid cache of this version."""
        got = _load_cache(path, "ManifestColumns", whole=("text_blobs",))
        if got is None:
            return None
        meta, arrays, blobs = got
        out = cls([])
        try:
            out.path, out.lines = str(meta["path"]), int(meta["lines"])
            for k in cls._ARRAYS:
                setattr(out, k, arrays[k])
            out.blocks, out.text_blobs = blobs["blocks"], blobs["text_blobs"]
        except (KeyError, TypeError, ValueError) as e:
            logger.info("%s is not a valid columns cache (%s); rebuilding it", path, e)
            return None
        return out

    def id(self, i: int) -> str:
        return self.ids[i].decode()

    def text(self, i: int) -> str:
        """The transcript of cut ``i`` (its supervisions' texts joined by spaces)."""
        line = self.text_blobs[self.sources[i]][self.text_start[i]:self.text_end[i]].decode()
        return line[line.index("\t") + 1:-1]

    def texts_of(self, indices: np.ndarray) -> bytes:
        """``"<id>\\t<transcript>\\n"`` of the cuts at ``indices``, one after the other."""
        blobs, src = self.text_blobs, self.sources[indices].tolist()
        return b"".join([blobs[k][a:b] for k, a, b in zip(src, self.text_start[indices].tolist(),
                                                           self.text_end[indices].tolist())])

    @classmethod
    def build(cls, paths, desc: str = "", workers: Optional[int] = None) -> list:
        """The columns of each of the manifests ``paths``: their lines parsed in chunks of
        :data:`CHUNK`, by ``workers`` processes (default: the CPUs this process may run on, at most
        16; forked) when there is more than one chunk in all; the result does not depend on
        ``workers``."""
        from tqdm import tqdm

        if workers is None:
            workers = min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        paths = [str(p) for p in paths]
        bar = tqdm(desc=f"index {desc or Path(paths[0]).name}", unit="utt", dynamic_ncols=True, mininterval=2.0,
                   disable=None)
        global _PATHS
        _PATHS = paths
        try:
            if workers <= 1 or not _more_than_one_chunk(paths):
                stripes = [_parse_stripe((0, 1))]
            else:  # each worker reads the manifests itself and parses every workers-th chunk: no lines are sent
                # Python >= 3.12 warns of fork() beside threads (torch's); the workers only parse text
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
                    pool = multiprocessing.get_context("fork").Pool(workers)
                with pool:
                    stripes = pool.map(_parse_stripe, [(w, workers) for w in range(workers)])
        finally:
            _PATHS = None
        chunks = sorted((c for stripe in stripes for c in stripe), key=lambda c: c[0])
        out = [cls([p for _, m, p in chunks if m == k], path) for k, path in enumerate(paths)]
        bar.update(sum(c.lines for c in out))
        bar.close()
        return out

    @staticmethod
    def concat(columns: list) -> "ManifestColumns":
        """The columns of several manifests one after the other (``sources``: which one each cut is
        from); one manifest's are returned as they are."""
        if len(columns) == 1:
            return columns[0]
        out = ManifestColumns([])
        nb = 0
        keys = ("ids", "durations", "num_samples", "sampling_rates", "starts", "row", "plain", "letters", "repeats")
        for k in keys:
            setattr(out, k, np.concatenate([getattr(c, k) for c in columns]))
        block_of = []
        for c in columns:
            block_of.append(c.block_of + nb)
            nb += len(c.blocks)
        out.block_of = np.concatenate(block_of)
        out.text_start, out.text_end = np.concatenate([c.text_start for c in columns]), np.concatenate([c.text_end for c in columns])
        out.blocks = [b for c in columns for b in c.blocks]
        out.text_blobs = [c.text_blobs[0] for c in columns]  # (not joined: no copy)
        out.sources = np.concatenate([np.full(len(c), k, np.int32) for k, c in enumerate(columns)])
        out.lines = sum(c.lines for c in columns)
        return out


def _cache_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(json.dumps([INDEX_VERSION, str(path.resolve()), st.st_size, st.st_mtime_ns]).encode()).hexdigest()[:16]


def manifest_columns(paths, cache_dir=None, cache: bool = True, desc: str = "") -> list:
    """The :class:`ManifestColumns` of each cuts manifest of ``paths``, from its cache
    (``<cache_dir or the manifest's directory>/.index/<file name>.<key>.cols.idx``, valid while the
    manifest's path, size and modification time are unchanged) or built (those not cached, together)
    and cached (written atomically; older caches of the same manifest are removed; a directory that
    cannot be written is used without cache). The data stage (``asrkit cuts``) calls it for the
    manifests it writes, so that a training start finds them cached."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    where = [Path(cache_dir or p.parent) / ".index" / f"{p.name}.{_cache_key(p)}.cols.idx" for p in paths]
    out = [ManifestColumns.load(w) if cache and w.is_file() else None for w in where]
    todo = [k for k, c in enumerate(out) if c is None]
    if todo:
        for k, cols in zip(todo, ManifestColumns.build([paths[k] for k in todo], desc)):
            out[k] = cols
    for k in todo if cache else []:
        try:
            where[k].parent.mkdir(exist_ok=True)
            out[k].save(where[k])
            for pattern in (f"{paths[k].name}.*.cols.idx", f"{paths[k].name}.*.cols.pkl"):  # (.pkl: before v7)
                for old in where[k].parent.glob(pattern):
                    if old != where[k]:
                        old.unlink(missing_ok=True)
        except OSError as e:
            logger.info("%s: columns not cached (%s); they are rebuilt at every start", paths[k], e)
    return out


def _pack(blobs) -> tuple:
    """A list of bytes strings (or :class:`_Blobs`) as one uint8 array and the int64 offsets of their ends."""
    if isinstance(blobs, _Blobs):
        return np.frombuffer(blobs.data, dtype=np.uint8)[:blobs.ends[-1] if blobs.ends else 0], np.asarray(blobs.ends, np.int64)
    ends = np.cumsum([len(b) for b in blobs], dtype=np.int64) if len(blobs) else np.zeros(0, np.int64)
    return np.frombuffer(b"".join(blobs), dtype=np.uint8), ends


class _Blobs:
    """A list of bytes strings kept as one (``data``, and the ``ends`` of the pieces): what a cache
    reads back the compressed blocks of manifest lines as (one read; a piece is cut out when asked for)."""

    def __init__(self, data: bytes, ends: list):
        self.data, self.ends = data, ends

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = i + len(self) if i < 0 else i
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.data[self.ends[i - 1] if i else 0:self.ends[i]]

    def __iter__(self):
        return (self[i] for i in range(len(self)))


#: first bytes of a cache file (then the header's length, 8 bytes little-endian, the JSON header, the arrays)
_MAGIC = b"ASRKITIDX\n"
_ALIGN = 64


def _save_cache(path: Path, kind: str, meta: dict, arrays: dict, blobs: dict) -> None:
    """A cache file, data only: ``arrays`` (numpy: numbers, booleans, fixed-size bytes) and
    ``blobs`` (lists of bytes strings, packed) as raw bytes after a JSON header that gives each
    one's dtype, shape and place, and ``meta`` (JSON); written atomically. Read by :func:`_load_cache`."""
    out = {f"a.{k}": np.ascontiguousarray(v) for k, v in arrays.items()}
    for k, v in blobs.items():
        out[f"b.{k}"], out[f"e.{k}"] = _pack(v)
    table, offset = {}, 0
    for k, v in out.items():
        if v.dtype.hasobject:
            raise TypeError(f"cache array {k} holds Python objects; a cache holds data only")
        table[k] = [v.dtype.str, list(v.shape), offset, v.nbytes]
        offset += -(-v.nbytes // _ALIGN) * _ALIGN
    head = json.dumps({"version": INDEX_VERSION, "kind": kind, "meta": meta, "arrays": table}).encode()
    start = -(-(len(_MAGIC) + 8 + len(head)) // _ALIGN) * _ALIGN
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(_MAGIC + len(head).to_bytes(8, "little") + head)
        for k, v in out.items():
            f.seek(start + table[k][2])
            f.write(memoryview(v.reshape(-1).view(np.uint8)) if v.size else b"")
        f.truncate(start + offset)


#: the dtype kinds a cache array may have: booleans, integers, floats, bytes (never objects)
_DATA_KINDS = "biufS"


def _load_cache(path: Path, kind: str, whole: tuple = ()) -> Optional[tuple]:
    """``(meta, arrays, blobs)`` of a cache file of this version and kind, each array's dtype
    checked to be numbers or bytes and its place to be inside the file (nothing is unpickled,
    nothing can run). A list of bytes strings comes back as a :class:`_Blobs`, or as a list for
    those named in ``whole``. None when the file is missing, partial, foreign or of another version (it is
    then rebuilt)."""
    try:
        with open(path, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                return None
            n = int.from_bytes(f.read(8), "little")
            head = json.loads(f.read(n))
            if not isinstance(head, dict) or head.get("version") != INDEX_VERSION or head.get("kind") != kind:
                return None
            start = -(-(len(_MAGIC) + 8 + n) // _ALIGN) * _ALIGN
            size = os.fstat(f.fileno()).st_size
            out, blobs = {}, {}
            table = head["arrays"]
            for k, (dt, shape, offset, nbytes) in sorted(table.items(), key=lambda kv: kv[0].startswith("b.")):
                dtype = np.dtype(dt)
                if dtype.kind not in _DATA_KINDS or start + offset + nbytes > size or nbytes % max(1, dtype.itemsize):
                    raise ValueError(f"array {k}: dtype {dt} or its place ({offset}+{nbytes} bytes) is not valid")
                f.seek(start + offset)
                if k.startswith("b."):  # a list of bytes strings
                    ends = out[f"e.{k[2:]}"].tolist()
                    if (ends[-1] if ends else 0) != nbytes or any(b < a for a, b in zip([0, *ends], ends)):
                        raise ValueError(f"{k}: its pieces do not add up to its size")
                    if k[2:] in whole:  # a few large ones: each its own bytes string
                        blobs[k[2:]] = [f.read(e - a) for a, e in zip([0, *ends[:-1]], ends)]
                    else:  # many small ones: one read
                        blobs[k[2:]] = _Blobs(f.read(nbytes), ends)
                    continue
                arr = np.empty(nbytes // max(1, dtype.itemsize), dtype=dtype)
                if f.readinto(memoryview(arr.view(np.uint8))) != nbytes:
                    raise ValueError(f"array {k}: the file is shorter than its header says")
                out[k] = arr.reshape(shape)
        arrays = {k[2:]: v for k, v in out.items() if k.startswith("a.")}
    except Exception as e:  # noqa: BLE001 - a missing, partial or foreign cache is rebuilt
        logger.info("%s is not a valid cache (%s: %s); rebuilding it", path, type(e).__name__, e)
        return None
    return head["meta"], arrays, blobs


_PATHS = None  #: the manifest of the build in progress (inherited by the forked workers)


def _chunks(paths, w: int = 0, k: int = 1):
    """The chunks number w, w + k, w + 2k... of the manifests ``paths`` (:data:`CHUNK` lines each;
    a manifest's last one may be shorter), as ``(chunk number, (index of the manifest, its path,
    number of the first line, raw lines))``; the lines of the other chunks are only counted."""
    c = 0
    for m, path in enumerate(paths):
        with gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb") as f:
            first, n, lines, mine = 1, 0, [], c % k == w
            for raw in f:
                if mine:
                    lines.append(raw)
                n += 1
                if n == CHUNK:
                    if mine:
                        yield c, (m, str(path), first, lines)
                    c, first, n, lines = c + 1, first + CHUNK, 0, []
                    mine = c % k == w
            if n:
                if mine:
                    yield c, (m, str(path), first, lines)
                c += 1


def _more_than_one_chunk(paths) -> bool:
    n = 0
    for path in paths:
        with gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb") as f:
            for n, _ in enumerate(f, n + 1):
                if n > CHUNK:
                    return True
    return False


def _parse_stripe(stripe) -> list:
    """``(w, k)``: the chunks number w, w + k, w + 2k... of the manifest (:data:`_PATHS`), parsed:
    ``[(chunk number, number of its manifest, :func:`_parse_chunk` of it), ...]``."""
    return [(c, chunk[0], _parse_chunk(chunk)) for c, chunk in _chunks(_PATHS, *stripe)]


def _parse_chunk(chunk) -> dict:
    """One chunk of manifest lines -> the columns of its cuts (arrays, compressed blocks of lines,
    transcripts, letter counts); runs in a worker process of :meth:`ManifestColumns.build` or in
    the caller."""
    _, path, first, lines = chunk
    blocks, cur, ids, texts = [], [], [], []
    durs, nss, srs, starts = array("d"), array("q"), array("i"), array("d")
    plain, letters, repeats, text_len = array("b"), array("i"), array("i"), array("q")
    for n, raw in enumerate(lines, first):
        raw = raw.rstrip(b"\r\n")
        if not raw:
            continue
        try:
            d = json.loads(raw)
            cid, dur = d["id"], float(d["duration"])
            sr = int(d["recording"]["sampling_rate"]) if "recording" in d else int(d.get("sampling_rate") or 16000)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}, line {n}: not a Lhotse cut ({type(e).__name__}: {e}); "
                             "rerun the data stages (1 and 2) to rewrite the manifest") from None
        text = " ".join(s["text"] for s in d.get("supervisions", []) if s.get("text"))
        ns = int(round(dur * sr, 8) + 0.5)  # lhotse.utils.compute_num_samples (half up), faster
        if text.isascii() and not _DIGIT.search(text):  # nothing outside a-z ' that any fold changes
            n_tok, n_frames = _letter_counts(text.lower())
            plain.append(1)
            letters.append(n_tok)
            repeats.append(n_frames - n_tok)
        else:
            plain.append(0)
            letters.append(-1)
            repeats.append(-1)
        ids.append(cid.encode())
        durs.append(dur)
        nss.append(ns)
        srs.append(sr)
        starts.append(float(d.get("start", 0.0)))
        t = f"{cid}\t{text}\n".encode()
        texts.append(t)
        text_len.append(len(t))
        cur.append(raw)
        if len(cur) == BLOCK:
            blocks.append(zlib.compress(b"\n".join(cur), 1))
            cur = []
    if cur:
        blocks.append(zlib.compress(b"\n".join(cur), 1))
    m = len(ids)
    return {"lines": len(lines), "ids": ids, "texts": b"".join(texts), "blocks": blocks,
            "durs": np.frombuffer(durs, np.float64), "nss": np.frombuffer(nss, np.int64),
            "srs": np.frombuffer(srs, np.int32), "starts": np.frombuffer(starts, np.float64),
            "plain": np.frombuffer(plain, np.int8).astype(bool), "letters": np.frombuffer(letters, np.int32),
            "repeats": np.frombuffer(repeats, np.int32), "text_len": np.frombuffer(text_len, np.int64),
            "block_of": np.arange(m, dtype=np.int32) // BLOCK, "row": (np.arange(m) % BLOCK).astype(np.uint8)}


class _TrainFilter:
    """The rule of :func:`asrkit.data.dataset.filter_cuts` (same reasons, same order): as
    ``(id, text, duration, num_samples, sampling_rate) -> reason or None``, and on the columns of
    manifests at once (:meth:`codes`)."""

    def __init__(self, tokenizer, hop: float, frontend_stride: int, min_duration: float, max_duration: float):
        from asrkit.data.dataset import ctc_min_frames

        self.hop, self.stride, self.min, self.max = hop, frontend_stride, min_duration, max_duration
        self.letters = _char_ctc_frames(tokenizer)
        if self.letters is None:
            def needs(text):
                toks = tokenizer.encode(text)
                return len(toks), ctc_min_frames(toks)
            self.needs = needs
        else:
            self.needs = self.letters
        self.names = [None, "empty transcript", f"shorter than {min_duration} s", f"longer than {max_duration} s",
                      "too short for its transcript"]

    def __call__(self, cid, text, dur, ns, sr):
        from asrkit.data.features import num_frames

        n_toks, n_frames = self.needs(text)
        if not n_toks:
            return self.names[1]
        if dur < self.min:
            return self.names[2]
        if dur > self.max:
            return self.names[3]
        if -(-num_frames(ns, sr, self.hop) // self.stride) < n_frames:
            return self.names[4]
        return None

    def codes(self, c: ManifestColumns) -> tuple:
        """``(reasons, code of each cut)``: ``reasons[code]`` is why it is dropped (code 0: kept)."""
        if self.letters is not None:  # the counts were taken while parsing; transcripts no fold leaves alone are redone
            n_toks, n_frames = c.letters.astype(np.int64), (c.letters + c.repeats).astype(np.int64)
            redo = np.flatnonzero(~c.plain)
        else:
            n_toks, n_frames = np.zeros(len(c), np.int64), np.zeros(len(c), np.int64)
            redo = np.arange(len(c))
        for i in redo.tolist():
            n_toks[i], n_frames[i] = self.needs(c.text(i))
        avail = -(-_num_frames_vec(c.num_samples, c.sampling_rates, self.hop) // self.stride)
        code = np.select([n_toks == 0, c.durations < self.min, c.durations > self.max, avail < n_frames],
                         [1, 2, 3, 4], 0).astype(np.int8)
        return self.names, code


def train_drop_reason(tokenizer, hop: float, frontend_stride: int, min_duration: float = 0.0,
                      max_duration: float = float("inf")) -> _TrainFilter:
    """The rule of :func:`asrkit.data.dataset.filter_cuts` as ``(id, text, duration, num_samples,
    sampling_rate) -> reason or None`` (same reasons, same order), vectorized over
    :class:`ManifestColumns` by its ``codes`` method."""
    return _TrainFilter(tokenizer, hop, frontend_stride, min_duration, max_duration)


_DIGIT = re.compile(r"[0-9`]")  # (the one ASCII character folded to another: ` -> ')
_WORD = re.compile(r"[a-z']+")
_REPEAT = re.compile(r"(.)(?=\1)", re.S)


def _char_ctc_frames(tokenizer):
    """For the letters tokenizer, ``text -> (tokens, ctc_min_frames(tokens))`` without building
    the token list (one token per character of the normalized words joined by the word boundary,
    a repeat wherever two neighbouring characters are equal): 5x faster than encoding, the same
    numbers (tests/test_elastic.py). None for other tokenizers."""
    from asrkit.tokenizer import WORD_BOUNDARY, CharTokenizer
    from asrkit.utils import fold_text

    if type(tokenizer) is not CharTokenizer or len(WORD_BOUNDARY) != 1:
        return None
    fold = tokenizer.fold

    def needs(text):
        return _letter_counts((text if fold == "none" else fold_text(text, fold)).lower())

    return needs


def _letter_counts(lowered: str) -> tuple:
    """``(tokens, ctc_min_frames)`` of the letters tokenizer for a folded, lower-cased text:
    normalize_for_tokens(text).split() is its runs of [a-z'], joined by the word boundary."""
    from asrkit.tokenizer import WORD_BOUNDARY

    s = WORD_BOUNDARY.join(_WORD.findall(lowered))
    return len(s), len(s) + len(_REPEAT.findall(s))


def load_train_index(manifest_dir, corpus: str, sets, tokenizer, features, frontend_stride: int,
                     min_duration: float = 0.0, max_duration: float = float("inf"), cache: bool = True,
                     paths: Optional[list] = None, cache_dir=None) -> CutIndex:
    """The training cuts of ``sets`` as a :class:`CutIndex`, filtered like
    :func:`asrkit.data.dataset.filter_cuts` (the counts of what was dropped in ``.drop_stats``).

    With ``cache``, the index is saved next to the manifests
    (``<manifest_dir>/.index/<corpus>_<sets>.<key>.idx``, data only, written atomically; every DDP rank may
    write it, with the same content) and reused while the manifests (size, modification time) and
    what the filter depends on (tokenizer, hop, stride, duration limits) are unchanged; when it is
    not, the index is derived from the manifests' cached columns (:func:`manifest_columns`, which
    stage 2 writes; built here when missing). A manifest directory that cannot be written is used
    without cache. ``paths`` (and ``cache_dir``): read
    these cuts manifests instead (Shar shards' cuts, :mod:`asrkit.data.shar`)."""
    from asrkit.data.manifests import manifest_path

    paths = [Path(p) for p in paths] if paths is not None else [manifest_path(manifest_dir, corpus, "cuts", s) for s in sets]
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"no cuts manifest {p} (run the data stages first)")
    where = f"{corpus}/{'+'.join(sets)}"
    key_src = json.dumps({"v": INDEX_VERSION, "files": [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths],
                          "tok": tokenizer.to_dict() if hasattr(tokenizer, "to_dict") else repr(tokenizer),
                          "hop": features.hop, "stride": frontend_stride, "min": min_duration, "max": max_duration},
                         sort_keys=True, default=str)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    cache_path = Path(cache_dir or manifest_dir) / ".index" / f"{corpus}_{'+'.join(sets)}.{key}.idx"
    if cache and cache_path.is_file():
        index = CutIndex.load(cache_path)
        if index is not None:
            logger.info("%s: %d training utterances from the index %s", where, len(index), cache_path)
            return _report(index, where)
    columns = manifest_columns(paths, cache_dir, cache, where)
    index = CutIndex.derive(columns, train_drop_reason(tokenizer, features.hop, frontend_stride, min_duration, max_duration),
                            getattr(tokenizer, "fold", "none"))
    del columns
    if cache:
        try:
            cache_path.parent.mkdir(exist_ok=True)
            index.save(cache_path)
        except OSError as e:
            logger.info("%s: index not cached (%s); it is rebuilt at every start", where, e)
    return _report(index, where)


def _report(index: CutIndex, where: str) -> CutIndex:
    st = index.drop_stats
    if st.counts:
        logger.warning("%s: dropped %d utterances: %s", where, sum(st.counts.values()), st)
    return index


def attach_stored(index: CutIndex, store, corpus: str, parts, tokenizer, features, frontend_stride: int,
                  min_duration: float = 0.0, max_duration: float = float("inf")):
    """:meth:`asrkit.data.feature_store.FeatureStore.attach` for a :class:`CutIndex`: ``(an index of
    the same cuts with their stored features, "")`` or ``(None, why not)``. The store's cuts
    manifests (the same cuts, with features) are indexed with the same filter (and cached in the
    store); they must hold exactly the training utterances, with the same starts and durations."""
    parts = [parts] if isinstance(parts, str) else list(parts)
    missing = [p for p in parts if not store.cuts_path(corpus, p).is_file()]
    if missing:
        return None, f"no stored features of {', '.join(f'{corpus}/{p}' for p in missing)} in {store.dir}"
    problem = store._stamp_problem()
    if problem:
        return None, problem
    stored = load_train_index(None, corpus, parts, tokenizer, features, frontend_stride, min_duration, max_duration,
                              paths=[store.cuts_path(corpus, p) for p in parts], cache_dir=store.dir)
    stored.feature_prefix = str(store.dir)
    where = f"the stored features of {corpus}/{'+'.join(parts)} in {store.dir} are out of date: utterance"
    if len(stored) == len(index) and np.array_equal(stored.ids, index.ids):
        pos = None  # the usual case: the same cuts in the same order
    else:  # the store may hold more utterances than the training manifests now do
        order = np.argsort(stored.ids, kind="stable")
        k = np.minimum(np.searchsorted(stored.ids[order], index.ids), len(order) - 1)
        found = stored.ids[order][k] == index.ids
        if not found.all():
            return None, f"{where} {index.id(int(np.argmin(found)))!r} is missing there"
        pos = order[k]
    sd, ss = (stored.durations, stored.starts) if pos is None else (stored.durations[pos], stored.starts[pos])
    bad = np.flatnonzero((np.abs(sd - index.durations) > 1e-6) | (np.abs(ss - index.starts) > 1e-6))
    if bad.size:
        return None, f"{where} {index.id(int(bad[0]))!r} is different there"
    if pos is None:
        return stored, ""
    view = stored.take(pos)
    view.data_fingerprints, view.alphabet, view.drop_stats = index.data_fingerprints, index.alphabet, index.drop_stats
    return view, ""
