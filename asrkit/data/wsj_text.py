"""WSJ transcript handling: ``.dot`` files, Kaldi-equivalent normalization, LM text (``.Z``).

Normalization (:func:`normalize_transcript`, version :data:`WSJ_NORM_VERSION`) runs in layers,
each a documented function:

1. :func:`kaldi_normalize` -- exactly what Kaldi's ``egs/wsj/s5/local/normalize_transcript.pl``
   does, word by word and byte for byte (re-implemented from its behaviour; the tests compare
   with the script's own output):

   * words are split at ASCII white space only (space, tab, CR, LF, FF, VT: Perl's ``split " "``
     on bytes), so a no-break space (0xA0) stays inside a word;
   * upper-case ``a-z`` only: other characters (``ß``, ``µ``, ``é`` ...) are kept as they are
     (Perl's ``tr:a-z:A-Z:``; Python's ``upper()`` would turn ``ß`` into ``SS``);
   * remove backslashes (``isn\\'t`` -> ``ISN'T``, ``I\\.`` -> ``I.``);
   * ``%PERCENT`` -> ``PERCENT`` and ``.POINT`` -> ``POINT`` (spoken words, Nov'93 style);
   * delete noise *boundary* markers: ``[<door_slam]`` (noise in the previous word),
     ``[door_slam>]`` (in the next word), ``[phone_ring/]`` / ``[/phone_ring]`` (start / end of
     a long noise);
   * delete ``~`` (utterance truncation) and ``.`` (a pause) when they stand alone;
   * any other token containing ``[word]`` (``[loud_breath]``, ``[misc_noise]``) -> the noise
     word, ``<NOISE>`` by default; "word" means ASCII letters, digits and ``_``, so
     ``[loud-breath]`` and ``[<tap>]`` are *not* noise to Kaldi and stay as they are;
   * ``<word>`` (a word the reader was asked to delete but said) -> ``word``;
   * ``--DASH`` -> ``-DASH`` (the CMU dictionary spelling).

   Everything else is kept as it is: verbalized punctuation (``,COMMA``), mispronunciation
   marks (``*WORD*``), lengthening colons (``SO:``) and word fragments (``REVO(LUTION)-``).

2. :func:`clean_marks` (asrkit, used for the test sets) -- the marks Kaldi leaves for its
   lexicon to map to ``<SPOKEN_NOISE>``, resolved: ``*WORD*`` -> ``WORD``; ``:`` inside a word
   is removed (``SO:`` -> ``SO``); fragments keep their spoken part and the hyphen
   (``REVO(LUTION)-`` -> ``REVO-``, ``(IN)TERESTING`` -> ``TERESTING``); ``~`` attached to a
   word is removed; tokens that become empty are dropped. The noise word and verbalized
   punctuation (:func:`is_punctuation_token`) are kept.

3. :func:`cape_words` (the CAPE setting, used for the training sets by default) -- what the
   acoustic model is trained on: **words of letters and apostrophes only** (each word matches
   ``[A-Z']*[A-Z][A-Z']*``), so that nothing but spoken words reaches a letter tokenizer:

   * dropped: the noise word; every token holding ``[ ] < > { }`` (noise and markup Kaldi
     leaves, e.g. ``[LOUD-BREATH]``, ``[<TAP>]``); verbalized punctuation and formatting words
     and fragments of them (:func:`is_punctuation_token`: ``,COMMA``, ``(BRACKET``,
     ``)CLOSE_PAREN``, ``$DOLLAR-SIGN``, ``-EM-DASH``, ```SINGLE-QUOTE``,
     ``'CLOSE-SINGLE-QUOTE``, ``~NEW-PARAGRAPH``, ``.PER(IOD)-``, ``-(PER)IOD`` ...);
     tokens without a letter (``...``, ``'``);
   * kept and cleaned: the spoken part of a fragment (``REVO(LUTION)-`` -> ``REVO``,
     ``(IN)TERESTING`` -> ``TERESTING``; a token that is all in parentheses was not spoken and
     is dropped), mispronounced words (``*AMORTIZE*`` -> ``AMORTIZE``), lengthened ones
     (``SO:`` -> ``SO``, ``M:ONEY`` -> ``MONEY``), a back-quote typed for an apostrophe
     (``REPUBLICBANK`S`` -> ``REPUBLICBANK'S``), ``~`` attached to a word removed;
   * then every other character that is not a letter or an apostrophe separates words:
     ``MR.`` -> ``MR``, ``U.S.`` -> ``U S``, ``LONG-TERM`` -> ``LONG TERM``; pieces without a
     letter are dropped. The spoken words ``PERCENT`` and ``POINT`` (from ``%PERCENT``,
     ``.POINT``) are words; contractions (``'S``, ``'EM``, ``'N'``) are words.

   The test sets (nov'92, nov'93: non-verbalized punctuation) keep layer 2, so that scoring
   sees Kaldi's tokens; the scorer's own ``wsj`` normalizer removes the noise word and tags.

Version history: 1 -- Kaldi + clean marks (+ a list of punctuation words for training);
2 -- Kaldi byte for byte (ASCII upper-casing and white space), the CAPE setting as above.
"""
from __future__ import annotations

import gzip
import io
import re
import string
from pathlib import Path
from typing import Iterable, Iterator, Union

WSJ_NORM_VERSION = 2
NOISE_WORD = "<NOISE>"

_A = re.ASCII
_DEL_PATTERNS = (
    re.compile(r"^\[<\w+\]$", _A),  # [<door_slam]
    re.compile(r"^\[\w+>\]$", _A),  # [door_slam>]
    re.compile(r"\[\w+/\]$", _A),  # [phone_ring/]
    re.compile(r"\[/\w+\]$", _A),  # [/phone_ring]
)
_NOISE = re.compile(r"\[\w+\]", _A)
_VERBAL_DELETION = re.compile(r"^<([\w']+)>$", _A)
_PERL_SPACE = re.compile(r"[ \t\n\r\f\v]+")  # Perl's \s on bytes: ASCII white space only
_UPPER = str.maketrans(string.ascii_lowercase, string.ascii_uppercase)


def split_words(text: str) -> list[str]:
    """Split at ASCII white space only, as Perl's ``split(" ", $line)`` does on bytes."""
    return [w for w in _PERL_SPACE.split(text) if w]


def kaldi_normalize(words: Union[str, Iterable[str]], noise_word: str = NOISE_WORD) -> list[str]:
    """Kaldi's WSJ ``normalize_transcript.pl``, word by word (see the module docstring)."""
    if isinstance(words, str):
        words = split_words(words)
    out = []
    for w in words:
        w = w.translate(_UPPER).replace("\\", "")
        if w == "%PERCENT":
            w = "PERCENT"
        elif w == ".POINT":
            w = "POINT"
        if any(p.search(w) for p in _DEL_PATTERNS) or w in ("~", "."):
            continue
        if _NOISE.search(w):
            out.append(noise_word)
            continue
        m = _VERBAL_DELETION.match(w)
        if m:
            out.append(m.group(1))
        elif w == "--DASH":
            out.append("-DASH")
        else:
            out.append(w)
    return out


# characters that start a verbalized punctuation or formatting word (",COMMA", "~NEW-GRAPH");
# the apostrophe, "*" and "(" are handled apart: they also start words and word fragments
_PUNCT_LEAD = frozenset('!"#$%&)+,-./:;=?@\\^_`{|}~')
_MISPRONOUNCED = re.compile(r"^\*[^*]+\*$")


def _has_letter(w: str) -> bool:
    return any("A" <= c <= "Z" or "a" <= c <= "z" for c in w)


def is_punctuation_token(w: str) -> bool:
    """Whether the (Kaldi-normalized) token ``w`` is a verbalized punctuation or formatting word,
    or a fragment of one: a letter-bearing token that starts with a punctuation character
    (``,COMMA``, ``-DASH``, ``)CLOSE_PAREN``, ``$DOLLAR-SIGN``, ```SINGLE-QUOTE``, ``~NEW-GRAPH``,
    ``.PER(IOD)-``, ``-(PER)IOD``), ``(NAME`` without a closing parenthesis (``(PAREN``;
    ``(IN)TERESTING`` is a word fragment), ``*NAME`` without a closing star (``*AMORTIZE*`` is a
    mispronounced word), and ``'NAME`` where NAME names a quote or the apostrophe
    (``'SINGLE-QUOTE``; ``'EM``, ``'S``, ``'N'`` are words)."""
    if not w or not _has_letter(w):
        return False
    c = w[0]
    if c in _PUNCT_LEAD:
        return True
    if c == "(":
        return ")" not in w
    if c == "*":
        return not _MISPRONOUNCED.match(w)
    if c == "'":
        name = w.upper()
        return "QUOTE" in name or "APOSTROPHE" in name
    return False


_PAREN = re.compile(r"\([^()]*\)")


def clean_marks(words: Iterable[str], noise_word: str = NOISE_WORD) -> list[str]:
    """Resolve mispronunciation / lengthening / fragment marks Kaldi leaves in (module docstring)."""
    out = []
    for w in words:
        if w == noise_word or is_punctuation_token(w):
            out.append(w)
            continue
        w = w.replace("*", "").replace("~", "").replace(":", "")
        if "(" in w:
            stripped = _PAREN.sub("", w)
            w = stripped if stripped.strip("-") else w.replace("(", "").replace(")", "")
        if w.strip("-"):
            out.append(w)
    return out


_MARKUP = frozenset("[]<>{}")
_NOT_WORD_CHAR = re.compile(r"[^A-Z']+")


def cape_words(words: Iterable[str], noise_word: str = NOISE_WORD) -> list[str]:
    """The CAPE setting's training text: words of letters and apostrophes (module docstring)."""
    out: list[str] = []
    for w in words:
        if w == noise_word or _MARKUP.intersection(w) or is_punctuation_token(w):
            continue
        w = _PAREN.sub("", w).replace("`", "'")
        w = w.replace("*", "").replace(":", "").replace("~", "")
        out.extend(p for p in _NOT_WORD_CHAR.split(w) if _has_letter(p))
    return out


def normalize_transcript(
    text: str,
    noise_word: str = NOISE_WORD,
    clean: bool = True,
    cape: bool = False,
    version: int = WSJ_NORM_VERSION,
) -> str:
    """Normalize one raw ``.dot`` transcript (without its ``(uttid)``); see the module docstring.

    ``clean=False, cape=False`` gives Kaldi's output exactly; ``cape=True`` the CAPE setting's
    words of letters and apostrophes (``clean`` is then irrelevant).
    """
    if version != WSJ_NORM_VERSION:
        raise ValueError(f"WSJ normalization version {version} is not implemented (have {WSJ_NORM_VERSION})")
    words = kaldi_normalize(text, noise_word)
    if cape:
        words = cape_words(words, noise_word)
    elif clean:
        words = clean_marks(words, noise_word)
    return " ".join(words)


# --------------------------------------------------------------------------- .dot files

_DOT_LINE = re.compile(r"^(.*)\((\w+)\)[ \t\r\f\v]*$", re.ASCII)


def parse_dot_file(path: Union[str, Path]) -> dict[str, str]:
    """``uttid (lower case) -> raw transcript`` from a ``.dot`` file (lines ``text (uttid)``).

    Raises ``ValueError`` naming the file and line for a line without the ``(uttid)`` key.
    """
    out: dict[str, str] = {}
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = raw.decode("latin-1").rstrip("\r\n")
            if not line.strip(" \t\r\f\v"):
                continue
            m = _DOT_LINE.match(line)
            if not m:
                raise ValueError(f"{path}:{n}: transcript line without a trailing (uttid): {line[:80]!r}")
            out[m.group(2).lower()] = m.group(1).strip(" \t\r\f\v")
    return out


# --------------------------------------------------------------------------- .Z (LZW) files


def unlzw(data: bytes) -> bytes:
    """Decompress Unix ``compress`` (``.Z``, LZW) data.

    Format: magic ``1f 9d``, a flags byte (low 5 bits: maximum code width 9..16; 0x80: block
    mode, where code 256 clears the table), then codes packed least-significant-bit first,
    starting 9 bits wide. Codes come in groups of eight, so when the width grows (or the table
    is cleared) the reader skips to the end of the current group of ``8 * width`` bits.
    """
    if len(data) < 3 or data[0] != 0x1F or data[1] != 0x9D:
        raise ValueError("not a .Z (LZW) stream: bad magic")
    flags = data[2]
    maxbits = flags & 0x1F
    block_mode = bool(flags & 0x80)
    if not 9 <= maxbits <= 16:
        raise ValueError(f"bad .Z stream: maximum code width {maxbits} not in 9..16")
    body = data[3:]
    total_bits = len(body) * 8
    padded = body + b"\0\0\0"
    n_bits = 9
    maxcode = (1 << n_bits) - 1
    maxmaxcode = 1 << maxbits
    first = 257 if block_mode else 256
    prefix: list[int] = [0] * maxmaxcode
    suffix = bytearray(maxmaxcode)
    for i in range(256):
        suffix[i] = i
    cache: dict[int, bytes] = {}  # code -> string for the current table generation

    def expand(code: int) -> bytes:
        s = cache.get(code)
        if s is not None:
            return s
        chars = bytearray()
        c = code
        while c >= 256:
            chars.append(suffix[c])
            c = prefix[c]
        chars.append(c)
        chars.reverse()
        s = bytes(chars)
        cache[code] = s
        return s

    out = io.BytesIO()
    free_ent = first
    pos = 0
    seg_start = 0
    oldcode = -1
    finchar = 0

    def align(pos: int, seg_start: int, width: int) -> int:
        group = width * 8
        used = pos - seg_start
        return seg_start + -(-used // group) * group

    while True:
        if free_ent > maxcode and n_bits < maxbits:
            pos = align(pos, seg_start, n_bits)
            seg_start = pos
            n_bits += 1
            maxcode = maxmaxcode if n_bits == maxbits else (1 << n_bits) - 1
        if pos + n_bits > total_bits:
            break
        i = pos >> 3
        code = (int.from_bytes(padded[i : i + 3], "little") >> (pos & 7)) & ((1 << n_bits) - 1)
        pos += n_bits
        if oldcode == -1:
            if code >= 256:
                raise ValueError(f"bad .Z stream: first code {code} is not a literal")
            finchar = oldcode = code
            out.write(bytes((code,)))
            continue
        if code == 256 and block_mode:
            pos = align(pos, seg_start, n_bits)
            seg_start = pos
            n_bits = 9
            maxcode = (1 << n_bits) - 1
            free_ent = first
            cache.clear()
            oldcode = -1
            continue
        if code < free_ent:
            s = expand(code)
        elif code == free_ent:  # the KwKwK case
            s = expand(oldcode) + bytes((finchar,))
        else:
            raise ValueError(f"bad .Z stream: code {code} beyond the table ({free_ent}) at bit {pos - n_bits}")
        out.write(s)
        finchar = s[0]
        if free_ent < maxmaxcode:
            prefix[free_ent] = oldcode
            suffix[free_ent] = finchar
            free_ent += 1
        oldcode = code
    return out.getvalue()


def read_maybe_compressed(path: Union[str, Path]) -> bytes:
    """The content of a file that may be LZW (``.Z``/``.z``), gzip or plain (WSJ mixes all three:
    its ``.z`` suffix does not say which)."""
    data = Path(path).read_bytes()
    try:
        if data[:2] == b"\x1f\x9d":
            return unlzw(data)
        if data[:2] == b"\x1f\x8b":
            return gzip.decompress(data)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path}: corrupt compressed file: {e}") from e
    return data


_TAG = re.compile(r"<[^>]*>")


def read_lm_text(path: Union[str, Path], noise_word: str = NOISE_WORD) -> Iterator[str]:
    """Normalized sentences of a WSJ LM training text file (``lng_modl/lm_train/np_data/*/*.z``):
    SGML markup lines (``<art.87...>``, ``<p>``, ``<s>``) are skipped, tags inside lines removed,
    and the rest normalized like transcripts (:func:`normalize_transcript`)."""
    text = read_maybe_compressed(path).decode("latin-1")
    for line in text.splitlines():
        s = line.strip()
        if not s or (s.startswith("<") and s.endswith(">")):
            continue
        s = _TAG.sub(" ", s)
        norm = normalize_transcript(s, noise_word=noise_word)
        if norm:
            yield norm
