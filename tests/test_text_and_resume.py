"""What a run trains on, checked (issue 22, points 2, 3 and 9):

* a resume is refused when the transcripts changed (same utterances and durations) or the
  tokenizer file changed (same vocabulary), naming which; checkpoints from before these checks
  still resume;
* a resume with another CPU thread count says, once, that it cannot continue bitwise, and why;
* transcripts with letters outside the tokenizer's alphabet are counted and reported with
  examples (in `asrkit tokens` and at training start, and in train_info.json); ``--fold ascii``
  maps them to ASCII letters identically in training, LM text, validation and scoring.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import helpers_train as H
from asrkit.checkpoint import list_checkpoints

pytestmark = pytest.mark.timeout(180)

ACCENTED = {0: "CAFÉ NAÏVE", 1: "ÜBER SEÑOR", 2: "DON’T GO"}  # utterance index -> transcript


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return H.build_corpus(tmp_path_factory.mktemp("text_corpus"), n_train=16, n_dev=2)


def _log(exp) -> str:
    return (exp / "train.log").read_text()


def _copy(corpus, tmp_path) -> dict:
    man = tmp_path / "manifests"
    shutil.copytree(corpus["manifests"], man)
    return dict(corpus, manifests=man)


def _set_texts(c: dict, texts: dict) -> None:
    """Rewrite transcripts of the training cuts manifest (index -> text), keeping ids and durations."""
    from asrkit.data.manifests import load_cuts, manifest_path

    cuts = load_cuts(c["manifests"], "fx", "train").to_eager()
    for i, cut in enumerate(sorted(cuts, key=lambda x: x.id)):
        if i in texts:
            cut.supervisions[0].text = texts[i]
    cuts.to_file(manifest_path(c["manifests"], "fx", "cuts", "train"))


# ----------------------------------------------------------------------------- point 2
def test_changed_transcripts_or_tokenizer_refuse_the_resume(corpus, tmp_path):
    c = _copy(corpus, tmp_path)
    exp = tmp_path / "exp"
    assert H.run_inprocess(exp, H.overrides(c, train__max_steps=2)) == 0
    _set_texts(c, {3: "NO NO NO"})  # same utterance, same duration, another text
    assert H.run_inprocess(exp, H.overrides(c, train__max_steps=3)) == 1
    log = _log(exp)
    assert "cannot resume from" in log and "transcripts of the training data changed" in log, log[-2000:]
    assert "training data changed (different utterances" not in log
    # the tokenizer file changes but keeps its vocabulary
    _set_texts(c, {3: _text_of(corpus, 3)})  # the original text back
    tok = tmp_path / "tokens.json"
    tok.write_text(json.dumps({"kind": "letters", "fold": "ascii"}))
    shutil.copy(corpus["tokens"], tmp_path / "orig_tokens.json")
    c2 = dict(c, tokens=tmp_path / "orig_tokens.json")
    exp2 = tmp_path / "exp2"
    assert H.run_inprocess(exp2, H.overrides(c2, train__max_steps=2)) == 0
    (tmp_path / "orig_tokens.json").write_text(tok.read_text())  # same path, other content
    assert H.run_inprocess(exp2, H.overrides(c2, train__max_steps=3)) == 1
    assert "tokenizer changed (the file at tokens.path differs)" in _log(exp2)
    shutil.copy(corpus["tokens"], tmp_path / "orig_tokens.json")
    assert H.run_inprocess(exp2, H.overrides(c2, train__max_steps=3)) == 0  # the original: resumes


def _text_of(corpus, i: int) -> str:
    from asrkit.data.manifests import load_cuts

    cuts = sorted(load_cuts(corpus["manifests"], "fx", "train"), key=lambda x: x.id)
    return cuts[i].supervisions[0].text


def test_checkpoint_without_the_new_fingerprints_still_resumes(corpus, tmp_path):
    exp = tmp_path / "exp"
    assert H.run_inprocess(exp, H.overrides(corpus, train__max_steps=2)) == 0
    (path,) = list_checkpoints(exp)
    st = torch.load(path, weights_only=False)
    for k in ("text_fingerprint", "tokenizer_fingerprint", "threads"):
        del st[k]
    torch.save(st, path)
    assert H.run_inprocess(exp, H.overrides(corpus, train__max_steps=3)) == 0
    assert "resumed from" in _log(exp) and "CPU thread" not in _log(exp)


# ----------------------------------------------------------------------------- point 3
def test_resume_with_another_thread_count_says_it_is_not_bitwise(corpus, tmp_path):
    exp = tmp_path / "exp"
    assert H.run_inprocess(exp, H.overrides(corpus, train__max_steps=2, train__threads=1)) == 0
    assert torch.load(list_checkpoints(exp)[-1], weights_only=False)["threads"] == 1
    assert H.run_inprocess(exp, H.overrides(corpus, train__max_steps=3, train__threads=2)) == 0
    log = _log(exp)
    assert log.count("CPU thread") == 1, log[-2000:]
    assert ("the checkpoint was trained with 1 CPU thread(s), this run uses 2 (train.threads; 0 = all cores): "
            "training continues correctly, but not bitwise like an uninterrupted run") in log
    assert "Set train.threads=1 for bitwise continuation" in log
    # same count: no warning
    assert H.run_inprocess(exp, H.overrides(corpus, train__max_steps=4, train__threads=2)) == 0
    assert _log(exp).count("CPU thread") == 1


# ----------------------------------------------------------------------------- point 9
def test_fold_ascii_maps_accented_letters_like_their_ascii_spelling():
    from asrkit.tokenizer import CharTokenizer

    plain, folded = CharTokenizer(), CharTokenizer("ascii")
    # invariance: the folded tokenizer encodes the accented text as the plain one its ASCII spelling
    assert folded.encode("CAFÉ NAÏVE ÜBER SEÑOR DON’T STRAẞE") == plain.encode("CAFE NAIVE UBER SENOR DON'T STRASSE")
    assert plain.decode(plain.encode("CAFÉ NAÏVE")) == "CAF NA VE"  # what happens without it
    assert plain.to_dict() == {"kind": "letters"}  # unchanged: existing tokenizer files keep their fingerprint


def test_fold_is_saved_and_read_back(tmp_path):
    from asrkit.tokenizer import CharTokenizer, load_tokenizer, save_tokenizer

    save_tokenizer(CharTokenizer("ascii"), tmp_path / "t.json")
    assert load_tokenizer(tmp_path / "t.json").fold == "ascii"
    (tmp_path / "bad.json").write_text('{"kind": "letters", "fold": "latin"}')
    with pytest.raises(ValueError, match="unknown fold 'latin'"):
        load_tokenizer(tmp_path / "bad.json")


def test_scoring_folds_references_like_the_tokenizer():
    from asrkit.scoring import score_pairs
    from asrkit.textnorm import corpus_normalizer, get_normalizer

    pairs = [{"id": "a", "ref": "CAFÉ NAÏVE", "hyp": "CAFE NAIVE", "duration": 1.0}]
    assert score_pairs(pairs, normalizer=get_normalizer("librispeech")).wer == 100.0
    assert score_pairs(pairs, normalizer=get_normalizer("librispeech+ascii")).wer == 0.0
    assert corpus_normalizer("librispeech", "ascii") == "librispeech+ascii"
    assert corpus_normalizer("tedlium3", "none") == "tedlium"


def test_tokens_and_training_report_letters_outside_the_alphabet(corpus, tmp_path, capsys):
    from asrkit.data.manifests import manifest_path
    from asrkit.tokenizer import main as tokens

    c = _copy(corpus, tmp_path)
    _set_texts(c, ACCENTED)
    cuts = manifest_path(c["manifests"], "fx", "cuts", "train")
    assert tokens(["--cuts", str(cuts), "--out", str(tmp_path / "plain.json")]) == 0
    err = capsys.readouterr().err
    assert "3 of 16 transcripts have letters, digits or apostrophes outside the tokenizer's alphabet" in err, err
    assert "é (1)" in err and "’ (1)" in err and "'CAFÉ NAÏVE' -> 'caf na ve'" in err
    assert "asrkit tokens --fold ascii" in err
    assert tokens(["--cuts", str(cuts), "--fold", "ascii", "--out", str(tmp_path / "ascii.json")]) == 0
    assert "outside the tokenizer's alphabet" not in capsys.readouterr().err
    # training: the same report, and the counts in train_info.json
    exp = tmp_path / "exp"
    assert H.run_inprocess(exp, H.overrides(c, train__max_steps=1)) == 0
    assert "fx/train: 3 of 16 transcripts have letters" in _log(exp)
    info = H.info(exp)["outside_alphabet"]
    assert info["utterances"] == 3 and info["fold"] == "none" and set(info["chars"]) == {"é", "ï", "ü", "ñ", "’"}
    exp2 = tmp_path / "exp2"
    assert H.run_inprocess(exp2, H.overrides(dict(c, tokens=tmp_path / "ascii.json"), train__max_steps=1)) == 0
    assert "outside the tokenizer's alphabet" not in _log(exp2)
    assert H.info(exp2)["outside_alphabet"]["utterances"] == 0
    # decoding that model scores with the references folded the same way
    from asrkit.decode.run import main as decode

    assert decode(["--exp-dir", str(exp2), "--sets", "dev"]) == 0
    wer = json.loads((exp2 / "decode_dev" / "wer.json").read_text())
    assert wer["normalizer"]["name"] == "none+ascii", wer["normalizer"]


def test_lm_text_is_folded_like_the_tokenizer(tmp_path):
    from asrkit.decode.lm import iter_sentences

    f = tmp_path / "t.txt"
    f.write_text("CAFÉ NAÏVE\n")
    assert list(iter_sentences([f])) == ["caf na ve"]
    assert list(iter_sentences([f], fold="ascii")) == ["cafe naive"]
