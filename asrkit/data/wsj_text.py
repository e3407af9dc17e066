"""WSJ transcript handling: ``.dot`` files, Kaldi-equivalent normalization, LM text (``.Z``).

Normalization (:func:`normalize_transcript`, version :data:`WSJ_NORM_VERSION`) runs in three
layers, each a documented function:

1. :func:`kaldi_normalize` -- exactly what Kaldi's ``egs/wsj/s5/local/normalize_transcript.pl``
   does, word by word (re-implemented from its behaviour):

   * upper-case; remove backslashes (``isn\\'t`` -> ``ISN'T``, ``I\\.`` -> ``I.``);
   * ``%PERCENT`` -> ``PERCENT`` and ``.POINT`` -> ``POINT`` (spoken words, Nov'93 style);
   * delete noise *boundary* markers: ``[<door_slam]`` (noise in the previous word),
     ``[door_slam>]`` (in the next word), ``[phone_ring/]`` / ``[/phone_ring]`` (start / end of
     a long noise);
   * delete ``~`` (utterance truncation) and ``.`` (a pause) when they stand alone;
   * any other token containing ``[word]`` (``[loud_breath]``, ``[misc_noise]``) -> the noise
     word, ``<NOISE>`` by default;
   * ``<word>`` (a word the reader was asked to delete but said) -> ``word``;
   * ``--DASH`` -> ``-DASH`` (the CMU dictionary spelling).

   Everything else is kept as it is: verbalized punctuation (``,COMMA``), mispronunciation
   marks (``*WORD*``), lengthening colons (``SO:``) and word fragments (``REVO(LUTION)-``).

2. :func:`clean_marks` (asrkit, on by default) -- the marks Kaldi leaves for its lexicon to map
   to ``<SPOKEN_NOISE>``, resolved so that a character/subword model never sees them:
   ``*WORD*`` -> ``WORD``; ``:`` inside a word is removed (``SO:`` -> ``SO``; ``:COLON`` is kept);
   fragments keep their spoken part and the hyphen (``REVO(LUTION)-`` -> ``REVO-``,
   ``(IN)TERESTING`` -> ``TERESTING``); ``~`` attached to a word is removed; tokens that become
   empty are dropped.

3. :func:`remove_punctuation` (optional; the CAPE paper's choice for training on si284) --
   drop verbalized punctuation tokens (:data:`PUNCTUATION_TOKENS`, e.g. ``,COMMA``,
   ``"DOUBLE-QUOTE``, ``.PERIOD``, ``-DASH``), which only occur in the verbalized-punctuation
   (vp) part of the training data. Contractions (``'S``, ``'EM``) are words, not punctuation.

Version history: 1 -- the above.
"""
from __future__ import annotations

import gzip
import io
import re
from pathlib import Path
from typing import Iterable, Iterator, Union

WSJ_NORM_VERSION = 1
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

#: verbalized punctuation words of the WSJ vp transcripts (the CMU dictionary's spellings),
#: after :func:`kaldi_normalize` (so ``--DASH`` appears as ``-DASH``; ``%PERCENT`` and
#: ``.POINT`` are spoken words and became ``PERCENT`` / ``POINT``).
PUNCTUATION_TOKENS = frozenset(
    """
    !EXCLAMATION-POINT "CLOSE-QUOTE "DOUBLE-QUOTE "END-OF-QUOTE "END-QUOTE "IN-QUOTES "QUOTE
    "UNQUOTE #SHARP-SIGN &AMPERSAND 'APOSTROPHE 'CLOSE-QUOTE 'END-INNER-QUOTE 'END-QUOTE
    'INNER-QUOTE 'QUOTE 'SINGLE-QUOTE (BEGIN-PARENS (IN-PARENTHESES (LEFT-PAREN
    (OPEN-PARENTHESES (PAREN (PARENS (PARENTHESES )CLOSE-PAREN )CLOSE-PARENTHESES )END-PAREN
    )END-PARENS )END-PARENTHESES )END-THE-PAREN )PAREN )PARENS )RIGHT-PAREN )UN-PARENTHESES
    +PLUS ,COMMA --DASH -DASH -HYPHEN ...ELLIPSIS .DECIMAL .DOT .FULL-STOP .PERIOD /SLASH
    :COLON ;SEMI-COLON ;SEMICOLON ?QUESTION-MARK {BRACE {LEFT-BRACE {OPEN-BRACE }CLOSE-BRACE
    }RIGHT-BRACE
    """.split()
)
# other spellings of the same kind: punctuation characters, then a capitalized name
_PUNCT_LIKE = re.compile(r'^[!"#&,./:;?{}+]+[A-Z][A-Z-]*[A-Z]$', _A)


def is_punctuation_token(w: str) -> bool:
    """Whether ``w`` (upper case) is a verbalized punctuation word like ``,COMMA``."""
    return w in PUNCTUATION_TOKENS or bool(_PUNCT_LIKE.match(w))


def kaldi_normalize(words: Union[str, Iterable[str]], noise_word: str = NOISE_WORD) -> list[str]:
    """Kaldi's WSJ ``normalize_transcript.pl``, word by word (see the module docstring)."""
    if isinstance(words, str):
        words = words.split()
    out = []
    for w in words:
        w = w.upper().replace("\\", "")
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


def remove_punctuation(words: Iterable[str]) -> list[str]:
    """Drop verbalized punctuation words (``,COMMA``, ``"DOUBLE-QUOTE``, ...)."""
    return [w for w in words if not is_punctuation_token(w)]


def normalize_transcript(
    text: str,
    noise_word: str = NOISE_WORD,
    clean: bool = True,
    drop_punctuation: bool = False,
    version: int = WSJ_NORM_VERSION,
) -> str:
    """Normalize one raw ``.dot`` transcript (without its ``(uttid)``); see the module docstring.

    ``clean=False, drop_punctuation=False`` gives Kaldi's output exactly.
    """
    if version != WSJ_NORM_VERSION:
        raise ValueError(f"WSJ normalization version {version} is not implemented (have {WSJ_NORM_VERSION})")
    words = kaldi_normalize(text, noise_word)
    if clean:
        words = clean_marks(words, noise_word)
    if drop_punctuation:
        words = remove_punctuation(words)
    return " ".join(words)


# --------------------------------------------------------------------------- .dot files

_DOT_LINE = re.compile(r"^(.*)\((\w+)\)\s*$")


def parse_dot_file(path: Union[str, Path]) -> dict[str, str]:
    """``uttid (lower case) -> raw transcript`` from a ``.dot`` file (lines ``text (uttid)``).

    Raises ``ValueError`` naming the file and line for a line without the ``(uttid)`` key.
    """
    out: dict[str, str] = {}
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = raw.decode("latin-1").rstrip("\r\n")
            if not line.strip():
                continue
            m = _DOT_LINE.match(line)
            if not m:
                raise ValueError(f"{path}:{n}: transcript line without a trailing (uttid): {line[:80]!r}")
            out[m.group(2).lower()] = m.group(1).strip()
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
