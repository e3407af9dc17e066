"""Word n-gram LM: smoothing against reference toolkits (KenLM for modified Kneser-Ney, IRSTLM for
Witten-Bell, tests/fixtures/lm_reference.json), ARPA round trip, incremental scoring, the
`asrkit lm train` CLI."""
from __future__ import annotations

import bisect
import gzip
import hashlib
import json
import math
import random
from pathlib import Path

import pytest

from asrkit.decode import lm as lm_cli
from asrkit.decode.ngram import BOS, EOS, UNK, NgramLM, read_texts

WORDS = "the cat sat on a mat dog ran kat it's".split()


def corpus(n=150, seed=0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 7))) for _ in range(n)]


HISTORIES = [(), (BOS,), ("the",), (BOS, "the"), ("cat", "sat"), ("zebra", "the"), ("mat", "zebra"),
             ("a", "a", "a"), ("it's", "a", "dog")]


@pytest.mark.parametrize("smoothing", ["kneser-ney", "witten-bell"])
@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_probabilities_sum_to_one(smoothing, order):
    lm = NgramLM.train(corpus(), order=order, smoothing=smoothing)
    vocab = sorted(lm.vocab - {BOS})
    assert UNK in vocab and EOS in vocab
    for h in HISTORIES:
        total = math.fsum(10 ** lm.log10_prob(w, h) for w in vocab)
        assert total == pytest.approx(1.0, abs=1e-9), h
    assert lm.log10_prob(BOS, (BOS,)) <= -99  # <s> is never predicted


def test_hand_computed_values():
    sents = ["a b", "a"]
    wb = NgramLM.train(sents, order=1, smoothing="witten-bell")
    # counts a:2 b:1 </s>:2 (N=5, 3 types), |V| = 4 with <unk>: P(a) = (2 + 3/4) / 8
    assert 10 ** wb.log10_prob("a") == pytest.approx(2.75 / 8)
    assert 10 ** wb.log10_prob("zebra") == pytest.approx(0.75 / 8)  # OOV -> <unk>
    kn = NgramLM.train(sents, order=2, smoothing="kneser-ney")
    # continuation counts a:1 b:1 </s>:2, D = 0.5 (too little data for modified KN discounts)
    assert 10 ** kn.log10_prob("a") == pytest.approx(0.5 / 4 + 0.375 / 4)
    # bigram discount D = n1 / (n1 + 2 n2) = 3/5; P(b|a) = (1 - D)/2 + D * P(b)
    assert 10 ** kn.log10_prob("b", ["a"]) == pytest.approx(0.4 / 2 + 0.6 * 0.21875)
    assert 10 ** kn.log10_prob("a", [BOS]) == pytest.approx(1.4 / 2 + 0.3 * 0.21875)
    # unseen bigram: back-off weight of the context times the unigram
    assert 10 ** kn.log10_prob("a", ["a"]) == pytest.approx(0.6 * 0.21875)


@pytest.mark.parametrize("suffix", [".arpa", ".arpa.gz"])
def test_arpa_round_trip(tmp_path, suffix):
    lm = NgramLM.train(corpus(), order=3)
    path = tmp_path / f"lm{suffix}"
    lm.write_arpa(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary files left
    back = NgramLM.from_arpa(path)
    assert back.order == 3 and back.vocab == lm.vocab
    for h in HISTORIES:
        for w in sorted(lm.vocab - {BOS}) + ["zebra"]:
            assert back.log10_prob(w, h) == pytest.approx(lm.log10_prob(w, h), abs=1e-6)
    # writing the read model again gives the same file
    again = tmp_path / f"again{suffix}"
    back.write_arpa(again)
    opener = gzip.open if suffix.endswith(".gz") else open
    with opener(path, "rt") as a, opener(again, "rt") as b:
        assert a.read() == b.read()


def test_arpa_reader_errors(tmp_path):
    bad = tmp_path / "bad.arpa"
    bad.write_text("\\data\\\nngram 1=3\n\n\\1-grams:\n-1.0 a\n-1.0 </s>\n\n\\end\\\n")
    with pytest.raises(ValueError, match="declares 3 1-grams"):
        NgramLM.from_arpa(bad)
    bad.write_text("just text\n")
    with pytest.raises(ValueError, match="ARPA"):
        NgramLM.from_arpa(bad)


def test_incremental_states_match_direct_scoring():
    lm = NgramLM.train(corpus(), order=3)
    for sent in ["the cat sat on a mat", "zebra the dog", "it's"]:
        state, total = lm.start_state(), 0.0
        for w in sent.split():
            lp, state = lm.score(state, w)
            assert len(state) <= lm.order - 1
            total += lp
        total += lm.final_score(state)
        assert total == pytest.approx(lm.sentence_log10_prob(sent) * math.log(10), abs=1e-9)
    assert lm.start_state() == (BOS,)
    # an OOV history is <unk>, which never starts a listed trigram: the state is shortened
    assert lm.score(("cat",), "zebra")[1] in ((UNK,), ())


def test_train_rejects_empty_text():
    with pytest.raises(ValueError, match="no non-empty sentences"):
        NgramLM.train(["", "  "])


def test_read_texts_from_manifests(tmp_path):
    sup = tmp_path / "sups.jsonl.gz"
    with gzip.open(sup, "wt") as f:
        f.write(json.dumps({"id": "u1", "recording_id": "r1", "start": 0, "duration": 1, "text": "HELLO WORLD"}) + "\n")
        f.write(json.dumps({"id": "u2", "recording_id": "r2", "start": 0, "duration": 1, "text": "IT'S ME"}) + "\n")
    cuts = tmp_path / "cuts.jsonl"
    cuts.write_text(json.dumps({"id": "c1", "supervisions": [{"text": "A CAT"}, {"text": "SAT"}]}) + "\n")
    txt = tmp_path / "t.txt"
    txt.write_text("one line\n\n two lines \n")
    assert list(read_texts(sup)) == ["HELLO WORLD", "IT'S ME"]
    assert list(read_texts(cuts)) == ["A CAT", "SAT"]
    assert list(read_texts(txt)) == ["one line", "two lines"]


def test_cli_train(tmp_path, capsys):
    sup = tmp_path / "sups.jsonl.gz"
    with gzip.open(sup, "wt") as f:
        for s in ["THE CAT SAT.", "THE CAT RAN", "A DOG SAT"]:
            f.write(json.dumps({"id": s, "text": s}) + "\n")
    txt = tmp_path / "extra.txt"
    txt.write_text("The dog ran, fast!\n")
    out = tmp_path / "lm" / "2g.arpa"
    assert lm_cli.main(["train", "--text", str(sup), str(txt), "--order", "2", "--out", str(out)]) == 0
    lm = NgramLM.from_arpa(out)
    assert lm.order == 2
    assert {"the", "cat", "sat", "dog", "ran", "fast"} <= lm.vocab  # normalized like the tokenizer
    assert lm.log10_prob("cat", ["the"]) > lm.log10_prob("dog", ["the"])
    assert "2-grams" in capsys.readouterr().out
    assert lm_cli.main(["train", "--text", str(tmp_path / "missing.txt"), "--out", str(out)]) == 2


# -- against reference toolkits on a real-size text ----------------------------------------------
REF = json.loads((Path(__file__).parent / "fixtures" / "lm_reference.json").read_text())
HELDOUT_OOV = ["zzzq a b", "a zzzq", "qqqq"]  # the 3 held-out sentences with OOVs of the fixture


def word(i: int) -> str:
    """Letters-only spelling of a word index (survives `asrkit lm train`'s normalization)."""
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(97 + r) + s
    return s


def lm_text(n_sent: int, seed: int, vocab: int = 4000) -> list[str]:
    """Deterministic text with natural-language-like statistics (Zipfian words over 4000 types, each
    word with 8 preferred successors, 1..25 words a sentence); only Random.random(), whose
    sequence Python guarantees, so the fixture's reference values stay valid."""
    rng = random.Random(seed)
    h = sum(1.0 / r for r in range(1, vocab + 1))
    cdf, acc = [], 0.0
    for r in range(1, vocab + 1):
        acc += 1.0 / r / h
        cdf.append(acc)

    def zipf() -> int:
        return min(bisect.bisect_left(cdf, rng.random()), vocab - 1)

    out = []
    for _ in range(n_sent):
        n = 1 + int(rng.random() ** 1.5 * 25)
        w = zipf()
        s = [w]
        for _ in range(n - 1):
            if rng.random() < 0.6:
                w = (w * 31 + 7 * (1 + int(rng.random() ** 2 * 8))) % vocab
            else:
                w = zipf()
            s.append(w)
        out.append(" ".join(word(x) for x in s))
    return out


@pytest.fixture(scope="module")
def ref_text(tmp_path_factory):
    sents = lm_text(*REF["text"]["train"])
    assert hashlib.sha1("\n".join(sents).encode()).hexdigest() == REF["text"]["sha1"]  # the fixture's text
    path = tmp_path_factory.mktemp("lmref") / "train.txt"
    path.write_text("\n".join(sents) + "\n")
    return path


def _cli_lm(text: Path, smoothing: str) -> NgramLM:
    out = text.parent / f"{smoothing}.arpa"
    assert lm_cli.main(["train", "--text", str(text), "--order", "4", "--smoothing", smoothing, "--out", str(out)]) == 0
    return NgramLM.from_arpa(out)


def _counts(lm: NgramLM) -> list[int]:
    return [sum(1 for ng in lm._logp if len(ng) == n) for n in range(1, lm.order + 1)]


def test_kneser_ney_equals_kenlm(ref_text):
    """`asrkit lm train` (interpolated modified Kneser-Ney, the default) == KenLM lmplz: the same
    n-grams per order, probabilities and back-off weights to the ARPA precision, held-out sentence
    log-probabilities (OOVs included) equal to KenLM's query."""
    ref = REF["kneser_ney"]
    lm = _cli_lm(ref_text, "kneser-ney")
    assert _counts(lm) == ref["counts"]
    for ng, lp, bow in ref["ngrams"]:
        key = tuple(ng.split())
        if key != (BOS,):  # P(<s>): KenLM writes 0, asrkit -99 (never predicted either way)
            assert lm._logp[key] == pytest.approx(lp, abs=2e-6), ng
        assert lm._bow.get(key, 0.0) == pytest.approx(bow or 0.0, abs=2e-6), ng
    heldout = lm_text(*REF["text"]["heldout"]) + HELDOUT_OOV
    ours = [lm.sentence_log10_prob(s) for s in heldout]
    assert ours == pytest.approx(ref["heldout_log10"], abs=5e-5)


def test_witten_bell_interpolation_equals_irstlm(ref_text):
    """Interpolated Witten-Bell == IRSTLM's above the unigram level: every context's back-off
    weight T(h) / (c(h) + T(h)) and the discounted part P(w|h) - bow(h) P(w|h[1:]) = c(h, w) /
    (c(h) + T(h)) of each sampled n-gram. (IRSTLM's unigram level differs by design: it predicts
    <s> and gives <unk> its own mass; see the fixture's note.)"""
    ref = REF["witten_bell"]
    lm = _cli_lm(ref_text, "witten-bell")
    assert _counts(lm)[0] == ref["counts"][0]
    for w, bow in ref["unigram_bows"]:
        assert lm._bow[(w,)] == pytest.approx(bow, abs=2e-6), w
    for ng, lp, lp_suffix, bow in ref["ngrams"]:
        key = tuple(ng.split())
        ctx = key[:-1]
        assert lm._bow[ctx] == pytest.approx(bow, abs=1e-4 if ctx == (BOS,) else 2e-6), ng
        theirs = 10**lp - 10**bow * 10**lp_suffix
        ours = 10 ** lm._logp[key] - 10 ** lm._bow[ctx] * 10 ** lm._logp[key[1:]]
        assert ours == pytest.approx(theirs, rel=2e-3 if ctx == (BOS,) else 2e-4), ng
