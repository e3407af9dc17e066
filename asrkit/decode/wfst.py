"""WFST decoding of CTC output with a TLG graph, built and searched with the k2 project's CPU
libraries (``kaldifst`` for FST operations, ``kaldilm`` for ARPA -> G, ``kaldi_decoder`` for the
Viterbi beam search). k2 itself is not needed.

Graph (``build_tlg``):

* **Labels.** Token id ``i`` (blank included) is FST input label ``i + 1``, since label 0 is
  epsilon; ``kaldi_decoder.DecodableCtc`` reads column ``label - 1`` of the log-probabilities.
  Disambiguation symbols ``#0, #1, ...`` follow the tokens. Word ids come from ``words.txt``
  (``<eps>`` = 0, the words, then ``#0 <s> </s>``).
* **L** (tokens -> words). Letter tokenizers: a word is its letters, and consecutive words are
  separated by the boundary token ``|``; a ``|`` before the first or after the last word, and
  repeated ``|``, are accepted too. Sentencepiece tokenizers: a word is its pieces
  (``tokenizer.encode(word)``, first piece ``▁``-prefixed), words follow each other directly.
  Phone tokenizers: a word is any of its pronunciations in the tokenizer's lexicon, words follow
  each other directly. A pronunciation that is a prefix of another one or shared by several
  words gets a disambiguation symbol ``#1, #2, ...``; ``#0`` self-loops pass G's back-off
  symbol through.
* **G** from the ARPA file with ``kaldilm.arpa2fst`` (back-off arcs on ``#0``, ``<s>``/``</s>``
  as epsilon, n-grams with words outside the lexicon dropped).
* ``LG = minimize_encoded(determinize_star(L o G))`` (log semiring), which the disambiguation
  symbols make determinizable.
* **T** is the standard CTC topology (one state per label: blank and repeats output epsilon, a
  repeated label needs a blank in between), plus ``<eps>:#k`` self-loops on every state that
  consume LG's disambiguation symbols, so ``TLG = T o LG`` has none left on its input side.
  T has ``V**2`` arcs: fine for letters and a few thousand pieces.

The graph goes to ``graph_dir/TLG.fst`` (a ConstFst) with ``words.txt``, ``tokens.txt`` and
``graph.json`` (build key and sizes). ``graph.json`` is written last and removed first, so a
killed build is never mistaken for a finished one; a build with the same inputs is skipped.

Decoding (``WfstDecoder``) runs ``kaldi_decoder.FasterDecoder`` per utterance on
``acoustic_scale * log_probs`` and the graph costs scaled by ``lm_scale`` (the decoder sees
``log_probs * acoustic_scale / lm_scale`` and a beam of ``beam / lm_scale``, which ranks and
prunes exactly like the scaled total cost).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from asrkit.decode.ctc import SP_SPACE, WORD_BOUNDARY, Tokenizer, word_boundary_kind
from asrkit.utils import atomic_path, atomic_write

log = logging.getLogger(__name__)

Pathlike = Union[str, Path]
GRAPH_FORMAT = 1
_SPECIAL_WORDS = ("<s>", "</s>", "<unk>", "<eps>", "#0")


# ---------------------------------------------------------------------------- lexicon
def spell(tokenizer: Tokenizer, word: str, kind: Optional[str] = None) -> Optional[List[int]]:
    """Token ids of one word in the lexicon (without word boundary), or None if the tokenizer
    cannot spell it exactly (unknown characters, blank, or a different word after decoding)."""
    kind = kind or word_boundary_kind(tokenizer)
    try:
        ids = list(tokenizer.encode(word))
    except (KeyError, ValueError):
        return None
    toks = tokenizer.tokens
    blank = getattr(tokenizer, "blank_id", 0)
    if not ids or any(i == blank or not 0 <= i < len(toks) for i in ids):
        return None
    if kind == "letter":
        if any(toks[i] == WORD_BOUNDARY for i in ids):
            return None  # normalization split the word in two
        spelled = "".join(toks[i] for i in ids)
    else:
        if not toks[ids[0]].startswith(SP_SPACE) or any(toks[i].startswith(SP_SPACE) for i in ids[1:]):
            return None
        spelled = "".join(toks[i] for i in ids)[len(SP_SPACE) :]
    if spelled.lower() != word.lower():
        return None
    return ids


def make_lexicon(tokenizer: Tokenizer, words: Iterable[str]) -> Tuple[Dict[str, List[List[int]]], List[str]]:
    """``({word: [token ids of each pronunciation]}, [words that could not be spelled])``, in sorted
    word order. Letters and pieces have one pronunciation per word (the spelling); a phone
    tokenizer has those of its lexicon."""
    kind = word_boundary_kind(tokenizer)
    lex: Dict[str, List[List[int]]] = {}
    bad: List[str] = []
    for w in sorted(set(words)):
        if not w or w in _SPECIAL_WORDS or w.startswith("#"):
            continue
        if kind == "phone":
            prons = tokenizer.pronunciations(w)
        else:
            ids = spell(tokenizer, w, kind)
            prons = [] if ids is None else [ids]
        if prons:
            lex[w] = prons
        else:
            bad.append(w)
    return lex, bad


def add_disambig(lexicon: Dict[str, List[List[int]]]) -> Tuple[Dict[Tuple[str, int], int], int]:
    """Disambiguation index per ``(word, pronunciation index)`` (0 = none) for pronunciations
    that are a proper prefix of another or shared by several entries, and the highest index used."""
    prons = {(w, k): tuple(p) for w, ps in lexicon.items() for k, p in enumerate(ps)}
    count = Counter(prons.values())
    prefixes = {p[:i] for p in prons.values() for i in range(1, len(p))}
    nxt: Dict[tuple, int] = defaultdict(int)
    out: Dict[Tuple[str, int], int] = {}
    for e in sorted(prons):
        p = prons[e]
        if p in prefixes or count[p] > 1:
            nxt[p] += 1
            out[e] = nxt[p]
        else:
            out[e] = 0
    return out, max(nxt.values(), default=0)


# ---------------------------------------------------------------------------- FST builders
def _arc(il: int, ol: int, w: float, ns: int):
    import kaldifst

    return kaldifst.StdArc(il, ol, w, ns)


def build_lexicon_fst(
    lexicon: Dict[str, List[List[int]]],
    word_ids: Dict[str, int],
    disambig: Dict[Tuple[str, int], int],
    kind: str,
    boundary_id: Optional[int],
    disambig_base: int,
):
    """L with disambiguation symbols: input = token id + 1 (or ``disambig_base + k`` for #k),
    output = word id. See the module docstring for the structure."""
    import kaldifst

    L = kaldifst.StdVectorFst()
    s0 = L.add_state()
    L.start = s0
    L.set_final(s0, 0.0)
    loop_states = [s0]
    if kind == "letter":
        s1 = L.add_state()
        L.set_final(s1, 0.0)
        loop_states.append(s1)
        end = s1
        b = boundary_id + 1
        L.add_arc(s1, _arc(b, 0, 0.0, s0))
        L.add_arc(s0, _arc(b, 0, 0.0, s0))
    else:
        end = s0
    d0 = disambig_base  # #0
    for s in loop_states:
        L.add_arc(s, _arc(d0, word_ids["#0"], 0.0, s))
    for w, prons in lexicon.items():
        for k, ids in enumerate(prons):
            labels = [i + 1 for i in ids]
            if disambig[w, k]:
                labels.append(disambig_base + disambig[w, k])
            cur = s0
            for j, il in enumerate(labels):
                nxt = end if j == len(labels) - 1 else L.add_state()
                L.add_arc(cur, _arc(il, word_ids[w] if j == 0 else 0, 0.0, nxt))
                cur = nxt
    kaldifst.arcsort(L, sort_type="olabel")
    return L


def build_ctc_topo(vocab_size: int, blank: int, disambig_labels: Sequence[int] = ()):
    """Standard CTC topology T over labels ``token + 1``: state 0 = after blank (start), state
    ``s`` = after token ``s - 1 != blank``; every state is final. ``<eps>:#k`` self-loops for
    ``disambig_labels``."""
    import kaldifst

    T = kaldifst.StdVectorFst()
    states = {}
    start = T.add_state()
    T.start = start
    states[blank] = start
    for tok in range(vocab_size):
        if tok != blank:
            states[tok] = T.add_state()
    for tok, s in states.items():
        T.set_final(s, 0.0)
        T.add_arc(s, _arc(tok + 1, 0, 0.0, s))  # stay: blank loop, or repeated label
        for d in disambig_labels:
            T.add_arc(s, _arc(0, d, 0.0, s))
        for nxt, ns in states.items():
            if nxt == tok:
                continue
            if nxt == blank:
                T.add_arc(s, _arc(blank + 1, 0, 0.0, ns))
            else:
                T.add_arc(s, _arc(nxt + 1, nxt + 1, 0.0, ns))
    kaldifst.arcsort(T, sort_type="olabel")
    return T


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def arpa_words(arpa_path: Pathlike) -> List[str]:
    """The unigram words of an ARPA file (``<s>``, ``</s>``, ``<unk>`` excluded)."""
    import gzip

    arpa_path = Path(arpa_path)
    opener = gzip.open if arpa_path.suffix == ".gz" else open
    words: List[str] = []
    in_uni = False
    with opener(arpa_path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line == "\\1-grams:":
                in_uni = True
                continue
            if in_uni:
                if line.startswith("\\"):
                    break
                parts = line.split()
                if len(parts) >= 2 and parts[1] not in _SPECIAL_WORDS:
                    words.append(parts[1])
    if not in_uni:
        raise ValueError(f"{arpa_path}: no \\1-grams: section; is this an ARPA file?")
    return words


def build_tlg(
    tokenizer: Tokenizer,
    words: Optional[Iterable[str]],
    arpa_path: Pathlike,
    out_dir: Pathlike,
    force: bool = False,
) -> Path:
    """Build (or reuse) ``out_dir/TLG.fst`` for ``tokenizer`` and the LM ``arpa_path``.

    Args:
        tokenizer: see :class:`asrkit.decode.ctc.Tokenizer` (letters with ``|``, sentencepiece, or
            phones with their lexicon).
        words: lexicon words; ``None`` takes every unigram of the ARPA file. Words the tokenizer
            cannot spell are skipped (logged); n-grams with words outside the lexicon are dropped.
        arpa_path: word n-gram LM in ARPA format (plain text; ``.gz`` is decompressed first).
        out_dir: graph directory (created).
        force: rebuild even if a graph for the same inputs exists.

    Returns ``out_dir``.
    """
    import kaldifst
    import kaldilm

    out_dir = Path(out_dir)
    arpa_path = Path(arpa_path)
    if not arpa_path.is_file():
        raise FileNotFoundError(f"ARPA file {arpa_path} does not exist")
    kind = word_boundary_kind(tokenizer)
    tokens = list(tokenizer.tokens)
    blank = int(getattr(tokenizer, "blank_id", 0))
    V = len(tokens)
    word_list = sorted(set(arpa_words(arpa_path) if words is None else words))
    key_src = json.dumps(
        {"format": GRAPH_FORMAT, "tokens": tokens, "blank": blank, "words": word_list, "arpa": _sha256_file(arpa_path),
         **({"lexicon": tokenizer.lexicon} if kind == "phone" else {})}
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()
    meta_path = out_dir / "graph.json"
    if not force and meta_path.is_file() and (out_dir / "TLG.fst").is_file():
        try:
            if json.loads(meta_path.read_text()).get("key") == key:
                log.info("graph %s is up to date", out_dir)
                return out_dir
        except json.JSONDecodeError:
            pass
    t0 = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)  # the graph is incomplete until graph.json is back

    lexicon, bad = make_lexicon(tokenizer, word_list)
    if bad:
        log.warning("%d words cannot be spelled with the tokenizer and are left out, e.g. %s", len(bad), bad[:10])
    if not lexicon:
        raise ValueError(f"no word of the lexicon ({len(word_list)} words) can be spelled with the tokenizer")
    disambig, max_d = add_disambig(lexicon)
    disambig_base = V + 1  # label of #0
    word_syms = ["<eps>"] + list(lexicon) + ["#0", "<s>", "</s>"]
    word_ids = {w: i for i, w in enumerate(word_syms)}
    with atomic_write(out_dir / "words.txt") as f:
        f.writelines(f"{w} {i}\n" for i, w in enumerate(word_syms))
    with atomic_write(out_dir / "tokens.txt") as f:
        f.write("<eps> 0\n")
        f.writelines(f"{t} {i + 1}\n" for i, t in enumerate(tokens))
        f.writelines(f"#{k} {disambig_base + k}\n" for k in range(max_d + 1))

    boundary_id = tokens.index(WORD_BOUNDARY) if kind == "letter" else None
    L = build_lexicon_fst(lexicon, word_ids, disambig, kind, boundary_id, disambig_base)

    arpa_in = arpa_path
    with atomic_path(out_dir / "G.fst") as g_tmp:
        if arpa_path.suffix == ".gz":
            import gzip
            import shutil

            arpa_in = g_tmp.with_suffix(".arpa")
            with gzip.open(arpa_path, "rb") as fi, open(arpa_in, "wb") as fo:
                shutil.copyfileobj(fi, fo)
        try:
            kaldilm.arpa2fst(
                str(arpa_in),
                str(g_tmp),
                disambig_symbol="#0",
                read_symbol_table=str(out_dir / "words.txt"),
                max_arpa_warnings=10,
            )
        finally:
            if arpa_in != arpa_path:
                arpa_in.unlink(missing_ok=True)
        G = kaldifst.StdVectorFst.read(str(g_tmp))
    kaldifst.arcsort(G, sort_type="ilabel")

    LG = kaldifst.compose(L, G)
    LG = kaldifst.StdVectorFst(LG) if not isinstance(LG, kaldifst.StdVectorFst) else LG
    kaldifst.determinize_star(LG, use_log=True)
    kaldifst.minimize_encoded(LG)
    kaldifst.arcsort(LG, sort_type="ilabel")

    T = build_ctc_topo(V, blank, [disambig_base + k for k in range(max_d + 1)])
    TLG = kaldifst.compose(T, LG)  # trimmed (connect=True)
    kaldifst.arcsort(TLG, sort_type="ilabel")
    n_states = TLG.num_states
    if n_states == 0:
        raise ValueError(
            f"the TLG graph is empty: no sentence of {arpa_path} can be spelled with the lexicon "
            f"({len(lexicon)} words)"
        )
    with atomic_path(out_dir / "TLG.fst") as tmp:
        if not kaldifst.StdConstFst(TLG).write(str(tmp)):
            raise OSError(f"could not write {tmp}")
    meta = {
        "key": key,
        "format": GRAPH_FORMAT,
        "kind": kind,
        "vocab_size": V,
        "blank": blank,
        "num_words": len(lexicon),
        "skipped_words": len(bad),
        "num_disambig": max_d + 1,
        "arpa": str(arpa_path),
        "L_states": L.num_states,
        "LG_states": LG.num_states,
        "TLG_states": n_states,
        "build_seconds": round(time.time() - t0, 3),
    }
    with atomic_write(meta_path) as f:
        json.dump(meta, f, indent=1)
    log.info("built %s: %d words, TLG with %d states (%.1f s)", out_dir, len(lexicon), n_states, time.time() - t0)
    return out_dir


# ---------------------------------------------------------------------------- decoding
class WfstDecoder:
    """Viterbi beam search of CTC log-probabilities through a TLG graph.

    Args:
        graph_dir: a directory written by :func:`build_tlg` (``asrkit lm graph``).
        beam: search beam (in units of the scaled total cost).
        max_active: maximum active states per frame.
        min_active: minimum active states per frame.
        acoustic_scale: weight of the CTC log-probabilities.
        lm_scale: weight of the graph (LM) costs.
    """

    def __init__(
        self,
        graph_dir: Pathlike,
        beam: float = 16.0,
        max_active: int = 7000,
        min_active: int = 20,
        acoustic_scale: float = 1.0,
        lm_scale: float = 1.0,
    ) -> None:
        import kaldi_decoder
        import kaldifst

        self.graph_dir = Path(graph_dir)
        meta_path = self.graph_dir / "graph.json"
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"{meta_path} does not exist: {self.graph_dir} is not a finished graph directory "
                "(build it with `asrkit lm graph`)"
            )
        self.meta = json.loads(meta_path.read_text())
        if lm_scale <= 0 or acoustic_scale <= 0:
            raise ValueError(f"acoustic_scale and lm_scale must be > 0, got {acoustic_scale}, {lm_scale}")
        self.acoustic_scale = float(acoustic_scale)
        self.lm_scale = float(lm_scale)
        with open(self.graph_dir / "words.txt", encoding="utf-8") as f:
            table = [line.split() for line in f if line.strip()]
        self.words = [""] * (max(int(i) for _, i in table) + 1)
        for w, i in table:
            self.words[int(i)] = w
        self.fst = kaldifst.StdConstFst.read(str(self.graph_dir / "TLG.fst"))
        self.options = kaldi_decoder.FasterDecoderOptions(
            beam=float(beam) / self.lm_scale, max_active=int(max_active),
            min_active=min(int(min_active), int(max_active) - 1),  # kaldi-decoder: min < max
        )
        self._decoder = kaldi_decoder.FasterDecoder(self.fst, self.options)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def decode_one(self, log_probs: Union[Tensor, np.ndarray]) -> List[str]:
        """Words for one utterance's ``[T, V]`` log-probabilities."""
        import kaldi_decoder
        import kaldifst

        if isinstance(log_probs, Tensor):
            log_probs = log_probs.detach().float().cpu().numpy()
        feats = np.ascontiguousarray(log_probs, dtype=np.float32)
        if feats.ndim != 2 or feats.shape[1] != self.vocab_size:
            raise ValueError(
                f"log_probs must be [T, {self.vocab_size}] for graph {self.graph_dir}, got {tuple(feats.shape)}"
            )
        if feats.shape[0] == 0:
            return []
        scale = self.acoustic_scale / self.lm_scale
        if scale != 1.0:
            feats = feats * np.float32(scale)
        decodable = kaldi_decoder.DecodableCtc(feats)
        self._decoder.decode(decodable)
        ok, lattice = self._decoder.get_best_path()
        if not ok:
            return []
        ok, _, olabels, _ = kaldifst.get_linear_symbol_sequence(lattice)
        if not ok:
            return []
        return [self.words[i] for i in olabels if i > 0]

    def decode(self, log_probs: Tensor, lengths: Tensor) -> List[List[str]]:
        """Words for each utterance of ``[B, T, V]`` log-probabilities with ``[B]`` lengths."""
        if log_probs.dim() != 3:
            raise ValueError(f"log_probs must be [B, T, V], got shape {tuple(log_probs.shape)}")
        lp = log_probs.detach().float().cpu().numpy()
        lens = torch.as_tensor(lengths).tolist()
        if len(lens) != lp.shape[0]:
            raise ValueError(f"lengths has {len(lens)} entries for a batch of {lp.shape[0]}")
        return [self.decode_one(lp[b, : int(n)]) for b, n in enumerate(lens)]
