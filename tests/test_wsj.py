"""WSJ: .dot normalization (Kaldi's normalize_transcript.pl byte for byte, checked against the
script's own output; the CAPE setting's words of letters and apostrophes, checked on every token
of the real WSJ marker inventories), LZW LM text, and preparation of miniature WSJ corpora in the
real disc layouts (complete and broken)."""
from __future__ import annotations

import gzip
import logging
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from asrkit.data.audio import load_cut_audio
from asrkit.data.manifests import manifest_path
from asrkit.data.wsj import EXPECTED_COUNTS, WsjError, find_discs, prepare, prepare_lm_text
from asrkit.data.wsj_text import (
    WSJ_NORM_VERSION,
    cape_words,
    is_punctuation_token,
    kaldi_normalize,
    normalize_transcript,
    parse_dot_file,
    read_lm_text,
    unlzw,
)
from tests.corpora import wsj_inventories as inv
from tests.corpora.wsj import TRANSCRIPTS, compress_lzw, make_wsj

KALDI_TSV = Path(__file__).parent / "corpora" / "wsj_kaldi_normalize.tsv"


def _kaldi_reference() -> list[tuple[str, bytes]]:
    """(input, Kaldi's output bytes) pairs of tests/corpora/wsj_kaldi_normalize.tsv."""
    out = []
    for line in KALDI_TSV.read_bytes().split(b"\n"):
        if not line or line.startswith(b"#"):
            continue
        inp, expected = line.split(b"\t")
        out.append((inp.replace(b"\\x09", b"\t").decode("latin-1"), expected))
    return out


def test_kaldi_normalization_byte_for_byte():
    ref = _kaldi_reference()
    assert len(ref) == len(set(inv.PYAUDLIB + inv.ESPNET + inv.SMS_WSJ + inv.NEURAL_SP)) + len(TRANSCRIPTS) + 1
    for inp, expected in ref:
        assert normalize_transcript(inp, clean=False).encode("latin-1") == expected, inp
        assert " ".join(kaldi_normalize(inp)).encode("latin-1") == expected


def test_non_ascii_bytes_as_kaldi():
    # Perl upper-cases a-z only and splits at ASCII white space only (see the TSV's last line)
    assert kaldi_normalize("stra\xdfe \xb5m caf\xe9 a\xa0b") == ["STRA\xdfE", "\xb5M", "CAF\xe9", "A\xa0B"]
    assert "stra\xdfe".upper() == "STRASSE"  # what Python's upper() would have made of it


CAPE_WORD = re.compile(r"[A-Z']*[A-Z][A-Z']*")


def _inventory_tokens():
    raw = inv.PYAUDLIB + inv.ESPNET  # as in the .dot files
    normalized = inv.SMS_WSJ + inv.NEURAL_SP  # after Kaldi (neural_sp lower-cased them)
    return [(t, kaldi_normalize(t)) for t in raw] + [(t, kaldi_normalize(t)) for t in normalized]


@pytest.mark.parametrize("token,kaldi", _inventory_tokens(), ids=lambda x: x if isinstance(x, str) else "")
def test_cape_setting_on_the_real_marker_inventories(token, kaldi):
    words = cape_words(kaldi)
    assert all(CAPE_WORD.fullmatch(w) for w in words), (token, words)
    assert words == inv.SPOKEN.get(token, []), token


# (raw .dot text of tests/corpora/wsj.py, the CAPE setting's text, written by hand from the rules)
CAPE_FIXTURE = [
    "OF COURSE THERE ISN'T ANY GUARANTEE THE COMPANY WILL KEEP ITS HOT HAND",
    "AND NEW HARDWARE SUCH AS THE SET OF PERSONAL COMPUTERS I B M INTRODUCED LAST WEEK CAN LEAD TO UNEXPECTED "
    "CHANGES IN THE SOFTWARE BUSINESS",
    "THE RATE FELL TO SIX PERCENT IN NOVEMBER NINETEEN EIGHTY SIX",
    "MISTER SMITH WHO DECLINED TO COMMENT SAID IT WAS FINE",
    "IT WAS A MISPRONUNCED WORD AND A LENGTHENED SO SOUND",
    "THIS ONE HAS A BOUNDARY NOISE AND A REVO FRAGMENT",
    "PRICES ROSE THREE POINT FIVE PERCENT TODAY",
    "HE SAID AND THEN LEFT QUICKLY REALLY",
    "SALES OF REPUBLICBANK'S UNITS ROSE IN THE THIRD QUARTER",
    "THE INDEX WHICH FELL CLOSED HIGHER",
    "A DEAL WAS REACHED WITH A T AND T LATE YESTERDAY",
    "ANALYSTS SAID THE MONEY MOVE WAS WIDELY EXPECTED OTHERS DISAGREED",
    "NOTHING SPECIAL IN THIS D SENTENCE ABOUT THE BOND MARKET",
]


@pytest.mark.parametrize("raw,expected", list(zip(TRANSCRIPTS, CAPE_FIXTURE)))
def test_cape_setting_on_transcripts(raw, expected):
    assert normalize_transcript(raw, cape=True) == expected


# (raw, asrkit's test-set text: Kaldi + clean marks)
CLEAN_CASES = [
    ("a *mispronunced* word", "A MISPRONUNCED WORD"),
    ("so: long", "SO LONG"),
    ("a REVO(LUTION)- fragment", "A REVO- FRAGMENT"),
    ("(IN)TERESTING", "TERESTING"),
    ("the end~", "THE END"),
    ("a :COLON b", "A :COLON B"),
    ("*~*", ""),
    ("[breath] x", "<NOISE> X"),
]


@pytest.mark.parametrize("raw,expected", CLEAN_CASES)
def test_clean_marks(raw, expected):
    assert normalize_transcript(raw) == expected


def test_cape_words_rules():
    assert cape_words("ROCK 'N' ROLL 'EM 'SINGLE-QUOTE 'CLOSE-SINGLE-QUOTE `SINGLE-QUOTE ' ...".split()) == [
        "ROCK", "'N'", "ROLL", "'EM"]
    assert cape_words("(BRACKET (IN)TERESTING (UH) *AMORTIZE* *ASTERISK MR. U.S. LONG-TERM -EM-DASH".split()) == [
        "TERESTING", "AMORTIZE", "MR", "U", "S", "LONG", "TERM"]
    assert cape_words(["<NOISE>", "~NEW-PARAGRAPH", "[<TAP>]", "[LOUD-BREATH]", "<*IN*>"]) == []


def test_norm_version_and_punct_tokens():
    assert WSJ_NORM_VERSION == 2
    with pytest.raises(ValueError, match="version 1"):
        normalize_transcript("x", version=1)
    assert all(is_punctuation_token(w) for w in (",COMMA", '"QUOTE', ".PERIOD", "-IOD", "(PAREN", "'QUOTE", "*ASTERISK"))
    assert not any(is_punctuation_token(w) for w in ("'S", "'EM", "PERCENT", "A.", "<NOISE>", "I.", "(IN)TERESTING",
                                                     "*WORD*", "...", "'"))


def test_dot_file_parsing(tmp_path):
    p = tmp_path / "011c0200.dot"
    p.write_text("Hello there (011c0201)\nSecond line [breath]   (011C0202)  \n\n")
    assert parse_dot_file(p) == {"011c0201": "Hello there", "011c0202": "Second line [breath]"}
    p.write_text("no key here\n")
    with pytest.raises(ValueError, match=r"011c0200\.dot:1"):
        parse_dot_file(p)


# ------------------------------------------------------------------ LZW


def test_unlzw_known_vector():
    # `printf a | compress` -> 1f 9d 90 61 00 (16-bit codes, block mode; 'a' as a 9-bit code)
    assert unlzw(bytes.fromhex("1f9d906100")) == b"a"
    with pytest.raises(ValueError, match="magic"):
        unlzw(b"\x1f\x8b\x08")


@pytest.mark.parametrize("maxbits,block", [(16, True), (12, True), (10, True), (10, False)])
def test_lzw_roundtrip_and_gzip_agrees(maxbits, block):
    rng = np.random.default_rng(maxbits)
    words = [b"THE", b"COMPANY", b"SAID", b"SHARES", b"ROSE", b"\n"]
    data = b" ".join(words[i] for i in rng.integers(0, len(words), 12000)) + bytes(rng.integers(0, 256, 3000, dtype=np.uint8))
    z = compress_lzw(data, maxbits=maxbits, block_mode=block)
    assert unlzw(z) == data  # includes table clears when maxbits is small
    if shutil.which("gzip"):  # an independent decoder: gzip reads .Z
        assert subprocess.run(["gzip", "-dc"], input=z, capture_output=True, check=True).stdout == data


def test_lm_text_reader(tmp_path):
    fx = make_wsj(tmp_path / "wsj")
    lines = list(read_lm_text(fx.lm_files[0]))
    assert lines == fx.lm_lines
    n = prepare_lm_text(tmp_path / "wsj", tmp_path / "lm.txt.gz")
    assert n == len(fx.lm_lines)
    assert gzip.open(tmp_path / "lm.txt.gz", "rt").read().splitlines() == fx.lm_lines


# ------------------------------------------------------------------ preparation


def _texts(cuts):
    return {c.id: c.supervisions[0].text for c in cuts}


@pytest.mark.parametrize("parents,uppercase", [(True, False), (False, True)])
def test_prepare_complete_corpus(tmp_path, caplog, parents, uppercase):
    fx = make_wsj(tmp_path / "wsj", parents=parents, uppercase=uppercase)
    assert set(find_discs(tmp_path / "wsj")) >= {"11-13.1", "13-34.1", "11-2.1"}
    with caplog.at_level(logging.WARNING):
        cuts = prepare(tmp_path / "wsj", tmp_path / "m", parts=list(EXPECTED_COUNTS), num_jobs=2)
    si84 = ["011c0201", "011c0202", "40ac0201", "40ac0202"]
    assert sorted(cuts["train_si84"].ids) == si84  # speaker 401 excluded
    assert sorted(cuts["train_si284"].ids) == sorted(si84 + ["46ac0201", "46ac0202", "46bc0201"])
    assert sorted(cuts["test_dev93"].ids) == ["4k0c0301", "4k0c0302"]
    assert sorted(cuts["test_eval92"].ids) == ["440c0201", "440c0202"]  # index lines without .wv1
    assert sorted(cuts["test_eval93"].ids) == ["4k8c0401"]  # index names disc 13_32_1
    # count check against the real corpus: a warning with the reason
    assert "train_si284: 7 utterances, the full corpus has 37416" in caplog.text
    # texts: training in the CAPE setting (words of letters and apostrophes), test: Kaldi's tokens
    tr = _texts(cuts["train_si284"])
    assert tr == {u: CAPE_FIXTURE[TRANSCRIPTS.index(fx.raw[u])] for u in tr}
    assert tr["40ac0201"] == "MISTER SMITH WHO DECLINED TO COMMENT SAID IT WAS FINE"
    te = _texts(cuts["test_dev93"])
    assert te["4k0c0302"] == "THE INDEX (LEFT-PAREN WHICH FELL )CLOSE_PAREN CLOSED HIGHER ?QUESTION-MARK"
    for c in cuts["train_si284"]:
        s = c.supervisions[0]
        assert s.custom["raw_text"] == fx.raw[c.id] and s.custom["norm_version"] == WSJ_NORM_VERSION
        assert s.speaker == c.id[:3]
    # audio: decoded == written, metadata right
    for part in ("test_dev93", "train_si284"):
        for c in cuts[part]:
            x = fx.audio[c.id]
            assert c.recording.num_samples == len(x) and c.duration == pytest.approx(len(x) / 16000)
            a = load_cut_audio(c)
            assert np.array_equal(np.round(a * 32768).astype(np.int16), x)
    # manifests are on disk; a rerun loads them instead of redoing
    assert manifest_path(tmp_path / "m", "wsj", "cuts", "train_si284").is_file()
    again = prepare(tmp_path / "nonexistent", tmp_path / "m", parts=["train_si284"])
    assert sorted(again["train_si284"].ids) == sorted(cuts["train_si284"].ids)


def test_missing_disc_is_an_error_unless_a_partial_corpus_is_asked_for(tmp_path, caplog, monkeypatch):
    make_wsj(tmp_path / "wsj", missing_discs=["13-2.1", "11-1.1"])
    monkeypatch.delenv("ASRKIT_RECIPE_CMD", raising=False)
    with pytest.raises(WsjError) as e:
        prepare(tmp_path / "wsj", tmp_path / "m", parts=["train_si284", "train_si84", "test_dev93"])
    msg = str(e.value)
    assert "2 disc(s) holding audio of the requested sets are not under" in msg
    assert "  11-1.1: 2 utterances of train_si284, 2 utterances of train_si84\n" in msg
    assert "  13-2.1: 1 utterance of train_si284\n" in msg
    assert "rerun the same asrkit command with --allow-missing-discs" in msg
    assert not (tmp_path / "m").exists() or not list((tmp_path / "m").iterdir())  # nothing written
    with caplog.at_level(logging.WARNING):
        cuts = prepare(tmp_path / "wsj", tmp_path / "m", parts=["train_si284"], allow_missing_discs=True)
    assert sorted(cuts["train_si284"].ids) == ["40ac0201", "40ac0202", "46ac0201", "46ac0202"]
    assert "missing discs: 11-1.1 (2 utterances), 13-2.1 (1 utterances)" in caplog.text


def test_missing_index_disc_is_an_error(tmp_path):
    make_wsj(tmp_path / "wsj", missing_discs=["13-34.1"])
    with pytest.raises(WsjError, match=r"test_dev93.*disc 13-34\.1"):
        prepare(tmp_path / "wsj", tmp_path / "m", parts=["test_dev93"])


def test_missing_transcript_dropped_and_named(tmp_path, caplog):
    make_wsj(tmp_path / "wsj", drop_transcripts=["46ac0202"])
    with caplog.at_level(logging.WARNING):
        cuts = prepare(tmp_path / "wsj", tmp_path / "m", parts=["train_si284"])
    assert "46ac0202" not in cuts["train_si284"].ids and len(cuts["train_si284"]) == 6
    assert "no transcript" in caplog.text and "46ac0200.dot" in caplog.text


def test_corrupt_and_missing_audio_are_errors_naming_the_file(tmp_path, caplog):
    fx = make_wsj(tmp_path / "wsj", corrupt=["4k0c0302"])
    with pytest.raises(WsjError, match=r"4k0c0302.*4k0c0302\.wv1"):
        prepare(tmp_path / "wsj", tmp_path / "m", parts=["test_dev93"])
    assert not manifest_path(tmp_path / "m", "wsj", "cuts", "test_dev93").exists()
    with caplog.at_level(logging.WARNING):
        cuts = prepare(tmp_path / "wsj", tmp_path / "m", parts=["test_dev93"], skip_bad_audio=True)
    assert list(cuts["test_dev93"].ids) == ["4k0c0301"] and "bad audio" in caplog.text
    fx.paths["440c0201"].unlink()
    with pytest.raises(FileNotFoundError, match=r"440c0201\.wv1"):
        prepare(tmp_path / "wsj", tmp_path / "m2", parts=["test_eval92"])


def test_flac_cache(tmp_path):
    fx = make_wsj(tmp_path / "wsj", lm=False)
    cuts = prepare(tmp_path / "wsj", tmp_path / "m", parts=["test_dev93"], flac_dir=tmp_path / "flac")
    for c in cuts["test_dev93"]:
        src = c.recording.sources[0].source
        assert src.endswith(".flac") and src.startswith(str(tmp_path / "flac"))
        assert np.array_equal(np.round(load_cut_audio(c) * 32768).astype(np.int16), fx.audio[c.id])


def test_interrupted_preparation_leaves_no_trusted_manifest(tmp_path, monkeypatch):
    make_wsj(tmp_path / "wsj", lm=False)
    import lhotse

    real = lhotse.CutSet.to_file

    def boom(self, path, *a, **k):
        raise KeyboardInterrupt("killed while writing cuts")

    monkeypatch.setattr(lhotse.CutSet, "to_file", boom)
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "wsj", tmp_path / "m", parts=["test_dev93"])
    out = tmp_path / "m"
    assert not manifest_path(out, "wsj", "cuts", "test_dev93").exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp") or ".tmp." in p.name]
    monkeypatch.setattr(lhotse.CutSet, "to_file", real)
    cuts = prepare(tmp_path / "wsj", out, parts=["test_dev93"])  # redone, not skipped
    assert len(cuts["test_dev93"]) == 2 and manifest_path(out, "wsj", "cuts", "test_dev93").is_file()
