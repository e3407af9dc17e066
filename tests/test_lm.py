"""Word n-gram LM: smoothing, ARPA round trip, incremental scoring, the `asrkit lm train` CLI."""
from __future__ import annotations

import gzip
import json
import math
import random

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
