"""A miniature WSJ (LDC93S6B WSJ0 + LDC94S13B WSJ1) in the real disc layout.

Layout written (``csr_1/`` and ``csr_2_comp/`` parents optional, names optionally upper-cased
as on some CD copies)::

    csr_1/11-1.1/wsj0/si_tr_s/011/011c0201.wv1            SPHERE + embedded Shorten
    csr_1/11-1.1/wsj0/transcrp/dots/si_tr_s/011/011c0200.dot
    csr_1/11-13.1/wsj0/doc/indices/train/tr_s_wv1.ndx     si84 index (disc_id:path)
    csr_1/11-13.1/wsj0/doc/indices/test/nvp/si_et_20.ndx  Nov'92 index (no .wv1 suffix)
    csr_2_comp/13-34.1/wsj1/doc/indices/si_tr_s.ndx       si200 index
    csr_2_comp/13-34.1/wsj1/doc/indices/h1_p0.ndx         Nov'93 dev index
    csr_2_comp/13-32.1/wsj1/doc/indices/wsj1/eval/h1_p0.ndx  Nov'93 eval (says 13_32_1 for 13_33_1)
    csr_2_comp/13-32.1/wsj1/doc/lng_modl/lm_train/np_data/87/*.z   LZW-compressed LM text
    csr_2_comp/13-16.1/wsj1/si_dt_20/4k0/4k0c0301.wv1 (+ 4k0c0300.dot beside it)
    ...

Also :func:`compress_lzw`, a Unix ``compress`` (``.Z``) writer, to make the LM files.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable

import numpy as np

from . import synth_int16, write_sphere

#: (set, corpus, disc, audio dir under the disc, speaker, utterances)
SPEAKERS = [
    ("si84", "wsj0", "11-1.1", "wsj0/si_tr_s", "011", ["011c0201", "011c0202"]),
    ("si84", "wsj0", "11-2.1", "wsj0/si_tr_s", "401", ["401c0201"]),  # excluded by Kaldi
    ("si84", "wsj0", "11-2.1", "wsj0/si_tr_s", "40a", ["40ac0201", "40ac0202"]),
    ("si200", "wsj1", "13-1.1", "wsj1/si_tr_s", "46a", ["46ac0201", "46ac0202"]),
    ("si200", "wsj1", "13-2.1", "wsj1/si_tr_s", "46b", ["46bc0201"]),
    ("dev93", "wsj1", "13-16.1", "wsj1/si_dt_20", "4k0", ["4k0c0301", "4k0c0302"]),
    ("eval92", "wsj0", "11-14.1", "wsj0/si_et_20", "440", ["440c0201", "440c0202"]),
    ("eval93", "wsj1", "13-33.1", "wsj1/si_et_h1/wsj64k", "4k8", ["4k8c0401"]),
]

#: raw .dot transcripts, used in order. The first two are real WSJ1 lines (4k2c0308, 4k2c030a),
#: as quoted in Kaldi's egs/wsj/s5/local/normalize_transcript.pl; the others were written for
#: this fixture and carry the real markers of the inventories in tests/corpora/wsj_inventories.py
#: (noise and boundary markers, [LOUD-BREATH], [<TAP>], fragments, verbalized punctuation in its
#: backslash-quoted raw form, REPUBLICBANK\`S, M:ONEY, <D>, ~NEW-GRAPH, $DOLLAR-SIGN ...).
TRANSCRIPTS = [
    "Of course there isn\\'t any guarantee the company will keep its hot hand [misc_noise]",
    "[loud_breath] And new hardware such as the set of personal computers I\\. B\\. M\\. introduced last week "
    "can lead to unexpected changes in the software business [door_slam]",
    "The rate fell to six \\%PERCENT in November nineteen eighty six \\.PERIOD",
    'Mister Smith \\,COMMA who declined to comment \\,COMMA said \\"DOUBLE\\-QUOTE it was fine \\"END\\-QUOTE',
    "It was a *mispronunced* word and a lengthened so: sound ~",
    "[LOUD-BREATH] This one has a [<door_slam] boundary noise and a REVO(LUTIONARY)- fragment",
    "Prices rose three \\.POINT five \\%PERCENT [phone_ring/] today [/phone_ring] \\.PER(IOD)- -(PER)IOD",
    "He said <and> then left . quickly \\-\\-DASH really [<TAP>]",
    "Sales of REPUBLICBANK\\`S units rose [lip_smack] in the third quarter \\~NEW\\-GRAPH",
    "The index \\(LEFT\\-PAREN which fell \\)CLOSE_PAREN closed higher \\?QUESTION\\-MARK",
    "A deal [door_slam>] was reached with A\\. T\\. and T\\. late yesterday \\$DOLLAR\\-SIGN",
    'Analysts said the M:ONEY move was widely expected \\;SEMI\\-COLON \\"OPEN\\-QUOTES others disagreed \\"CLOSE\\-QUOTES',
    "Nothing special in this <D> sentence about the bond market",
]

INDEX_FILES = {
    "si84": ("11-13.1", "wsj0/doc/indices/train/tr_s_wv1.ndx"),
    "si200": ("13-34.1", "wsj1/doc/indices/si_tr_s.ndx"),
    "dev93": ("13-34.1", "wsj1/doc/indices/h1_p0.ndx"),
    "eval92": ("11-13.1", "wsj0/doc/indices/test/nvp/si_et_20.ndx"),
    "eval93": ("13-32.1", "wsj1/doc/indices/wsj1/eval/h1_p0.ndx"),
}


@dataclasses.dataclass
class WsjFixture:
    root: Path
    #: uttid -> raw transcript
    raw: dict
    #: uttid -> int16 samples written
    audio: dict
    #: uttid -> the .wv1 path written
    paths: dict
    #: set name -> list of uttids listed in its index
    sets: dict
    lm_files: list
    lm_lines: list


def _disc_dir(root: Path, disc: str, parents: bool) -> Path:
    if not parents:
        return root / disc
    return root / ("csr_1" if disc.startswith("11-") else "csr_2_comp") / disc


def _case(rel: str, upper: bool) -> str:
    return rel.upper() if upper else rel


def make_wsj(
    root: Path,
    *,
    parents: bool = True,
    uppercase: bool = False,
    missing_discs: Iterable[str] = (),
    drop_transcripts: Iterable[str] = (),
    corrupt: Iterable[str] = (),
    truncate: Iterable[str] = (),
    seed: int = 0,
    lm: bool = True,
) -> WsjFixture:
    """Write the miniature WSJ under ``root``; see the module docstring.

    ``missing_discs``: disc names (``13-2.1``) not written; ``drop_transcripts``: utterance ids
    whose ``.dot`` line is left out; ``corrupt``: utterances whose Shorten payload gets a few
    bytes flipped; ``truncate``: utterances whose file is cut in half.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    missing, drop, corrupt, truncate = set(missing_discs), set(drop_transcripts), set(corrupt), set(truncate)
    fx = WsjFixture(root=root, raw={}, audio={}, paths={}, sets={}, lm_files=[], lm_lines=[])
    k = 0
    index_lines: dict[str, list[str]] = {s: [] for s in INDEX_FILES}
    for set_name, corpus, disc, audio_dir, spk, utts in SPEAKERS:
        disc_id = disc.replace("-", "_").replace(".", "_")
        for u in utts:
            fx.raw[u] = TRANSCRIPTS[k % len(TRANSCRIPTS)]
            k += 1
            rel = f"{audio_dir}/{spk}/{u}.wv1"
            if set_name == "eval92":
                index_lines[set_name].append(f"{disc_id}:{rel[: -len('.wv1')]}")  # no suffix, as on the disc
            elif set_name == "eval93":
                index_lines[set_name].append(f"13_32_1:{rel}")  # the real index names the wrong disc
            else:
                index_lines[set_name].append(f"{disc_id}:{rel}")
            fx.sets.setdefault(set_name, []).append(u)
            if disc in missing:
                continue
            ddir = _disc_dir(root, disc, parents)
            path = ddir / _case(rel, uppercase)
            x = synth_int16(rng, rng.uniform(0.3, 0.9))
            fx.audio[u] = x
            fx.paths[u] = path
            write_sphere(
                path,
                x,
                shorten=True,
                byte_order="big" if k % 2 else "little",
                extra_fields={"database_id": "CSR-WSJ", "utterance_id": u, "speaking_mode": "read"},
            )
            if u in corrupt:
                b = bytearray(path.read_bytes())
                mid = 1024 + (len(b) - 1024) // 2
                for i in range(mid, min(mid + 8, len(b))):
                    b[i] ^= 0x5A
                path.write_bytes(bytes(b))
            if u in truncate:
                b = path.read_bytes()
                path.write_bytes(b[: 1024 + (len(b) - 1024) // 2])
        if disc in missing:
            continue
        # one .dot file per speaker session: <session>00.dot
        ddir = _disc_dir(root, disc, parents)
        sessions: dict[str, list[str]] = {}
        for u in utts:
            sessions.setdefault(u[:6], []).append(u)
        for sess, us in sessions.items():
            if corpus == "wsj0":
                dot_rel = f"wsj0/transcrp/dots/{audio_dir.split('/', 1)[1]}/{spk}/{sess}00.dot"
            else:
                dot_rel = f"{audio_dir}/{spk}/{sess}00.dot"
            dot = ddir / _case(dot_rel, uppercase)
            dot.parent.mkdir(parents=True, exist_ok=True)
            dot.write_text("".join(f"{fx.raw[u]} ({u})\n" for u in us if u not in drop), encoding="latin-1")
    for set_name, (disc, rel) in INDEX_FILES.items():
        if disc in missing:
            continue
        path = _disc_dir(root, disc, parents) / _case(rel, uppercase)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = f";\n; File: {rel}\n; index of the {set_name} utterances (fixture)\n;\n"
        path.write_text(header + "\n".join(index_lines[set_name]) + "\n", encoding="latin-1")
    if lm and "13-32.1" not in missing:
        lm_dir = _disc_dir(root, "13-32.1", parents) / _case("wsj1/doc/lng_modl/lm_train/np_data/87", uppercase)
        lm_dir.mkdir(parents=True, exist_ok=True)
        sentences = [
            "THE COMPANY SAID IT EXPECTS TO REPORT A LOSS",
            "SHARES CLOSED AT TWENTY ONE DOLLARS",
            "ANALYSTS SAID THE MOVE WAS WIDELY EXPECTED",
        ] * 40
        text = ""
        for i in range(0, len(sentences), 3):
            text += f"<art.870102.{i:04d}>\n<p>\n"
            for s in sentences[i : i + 3]:
                text += f"<s>\n{s}\n</s>\n"
            text += "</p>\n</art>\n"
        path = lm_dir / _case("w870102.z", uppercase)
        path.write_bytes(compress_lzw(text.encode("latin-1"), maxbits=12))
        fx.lm_files.append(path)
        fx.lm_lines = sentences
    return fx


# --------------------------------------------------------------------------- LZW (.Z) writer


def compress_lzw(data: bytes, maxbits: int = 16, block_mode: bool = True) -> bytes:
    """Unix ``compress`` (LZW, ``.Z``): codes of 9..``maxbits`` bits, LSB first, in groups of
    eight per width (a width change or a table clear pads to the end of the group). In block
    mode the table is cleared (code 256) whenever it is full, which exercises a reader's
    CLEAR handling with small ``maxbits``."""
    assert 9 <= maxbits <= 16
    out = bytearray([0x1F, 0x9D, maxbits | (0x80 if block_mode else 0)])
    first = 257 if block_mode else 256
    maxmaxcode = 1 << maxbits
    state = {"acc": 0, "nacc": 0, "seg": 0, "pos": 0, "n_bits": 9}
    chunks: list[int] = []

    def put(code: int) -> None:
        state["acc"] |= code << state["nacc"]
        state["nacc"] += state["n_bits"]
        state["pos"] += state["n_bits"]

    def pad_group() -> None:
        group = state["n_bits"] * 8
        used = state["pos"] - state["seg"]
        extra = -used % group
        state["nacc"] += extra
        state["pos"] += extra
        state["seg"] = state["pos"]

    table: dict[tuple[int, int], int] = {}
    free_ent = first
    maxcode = 511
    if not data:
        return bytes(out)
    ent = data[0]
    for c in data[1:]:
        key = (ent, c)
        code = table.get(key)
        if code is not None:
            ent = code
            continue
        put(ent)
        if free_ent > maxcode and state["n_bits"] < maxbits:  # the reader widens before its next code
            pad_group()
            state["n_bits"] += 1
            maxcode = maxmaxcode if state["n_bits"] == maxbits else (1 << state["n_bits"]) - 1
        ent = c
        if free_ent < maxmaxcode:
            table[key] = free_ent
            free_ent += 1
        elif block_mode:
            put(256)
            pad_group()
            state["n_bits"] = 9
            maxcode = 511
            table.clear()
            free_ent = first
    put(ent)
    nbytes = (state["nacc"] + 7) // 8
    chunks = state["acc"].to_bytes(nbytes, "little")
    return bytes(out) + chunks
