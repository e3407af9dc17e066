"""TLG graph building (kaldifst / kaldilm) and WFST decoding (kaldi_decoder) of CTC output."""
from __future__ import annotations

import json

import pytest
import torch

from asrkit.decode import lm as lm_cli
from asrkit.decode.ctc import ctc_prefix_beam_search
from asrkit.decode.ngram import NgramLM
from asrkit.decode.wfst import WfstDecoder, add_disambig, build_tlg, make_lexicon

torch.set_num_threads(1)


from helpers_tokens import LetterTok, PieceTok  # noqa: E402


PIECES = ["\u2581the", "\u2581c", "\u2581k", "at", "\u2581sat", "\u2581a", "\u2581is", "\u2581name", "\u2581ran",
          "\u2581on", "\u2581mat", "\u2581dog", "\u2581b", "all", "\u2581t"]
LM_TEXT = (["the cat sat on the mat"] * 5 + ["the cat ran"] * 3 + ["a kat is a name"] * 2 + ["the dog sat"] * 2
           + ["a ball is at the mall", "the tall cat sat on a ball", "all is a name"])


def frame_logprobs(spec: list[dict[int, float]], V: int, floor: float = 1e-4) -> torch.Tensor:
    rows = []
    for d in spec:
        p = torch.full((V,), floor, dtype=torch.float64)
        for k, v in d.items():
            p[k] = v
        p[0] += max(0.0, 1.0 - float(p.sum()))
        rows.append((p / p.sum()).log())
    return torch.stack(rows).float()


def spell_frames(ids, amb=None, frames_per_token=1):
    spec = [{0: 0.9}]
    for i in ids:
        spec += [(amb or {}).get(i, {i: 0.99})] * frames_per_token + [{0: 0.9}]
    return spec


@pytest.fixture(scope="module")
def arpa(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm") / "lm.arpa"
    NgramLM.train(LM_TEXT, order=3).write_arpa(path)
    return path


@pytest.fixture(scope="module")
def letter_graph(arpa, tmp_path_factory):
    return build_tlg(LetterTok(), None, arpa, tmp_path_factory.mktemp("graph") / "letters")


def _decode(graph, tok, text, amb=None, **kw):
    lp = frame_logprobs(spell_frames(tok.encode(text), amb), tok.vocab_size)[None]
    return WfstDecoder(graph, **kw).decode(lp, torch.tensor([lp.shape[1]]))[0], lp


def test_lm_decides_acoustically_ambiguous_word(letter_graph):
    tok = LetterTok()
    k, c = tok.ids["k"], tok.ids["c"]
    words, lp = _decode(letter_graph, tok, "the kat sat", {k: {k: 0.5, c: 0.4}})
    assert words == ["the", "cat", "sat"]
    # with the LM nearly switched off the (slightly) better acoustics win
    assert _decode(letter_graph, tok, "the kat sat", {k: {k: 0.5, c: 0.4}}, lm_scale=0.01)[0] == ["the", "kat", "sat"]
    # prefix beam search with the same LM makes the same choice
    arpa_lm = NgramLM.from_arpa(json.loads((letter_graph / "graph.json").read_text())["arpa"])
    h = ctc_prefix_beam_search(lp, torch.tensor([lp.shape[1]]), beam=8, lm=arpa_lm, lm_weight=1.0, tokenizer=tok)[0]
    assert tok.decode(h.tokens) == "the cat sat"


@pytest.mark.parametrize("text", ["the kat sat", "a cat is a name", "the tall ball is at the mall", "all a at"])
def test_clear_logits_give_their_reading(letter_graph, text):
    """Clear acoustics win over the LM; double letters (blank between), word prefixes ('a'/'at',
    'all'/'ball') and n-grams the LM never saw decode as spelled."""
    assert _decode(letter_graph, LetterTok(), text)[0] == text.split()


def test_boundary_tokens_at_the_edges(letter_graph):
    """A leading, trailing or doubled '|' (blank-separated) still reads as the same words."""
    tok = LetterTok()
    bar = tok.ids["|"]
    ids = [bar] + tok.encode("the cat") + [bar, bar] + tok.encode("sat") + [bar]
    lp = frame_logprobs(spell_frames(ids), tok.vocab_size)[None]
    assert WfstDecoder(letter_graph).decode(lp, torch.tensor([lp.shape[1]]))[0] == ["the", "cat", "sat"]


def test_batch_with_padding(letter_graph):
    tok = LetterTok()
    texts = ["the cat sat on the mat", "a dog", "the tall cat"]
    seqs = [frame_logprobs(spell_frames(tok.encode(t), frames_per_token=2), tok.vocab_size) for t in texts]
    T = max(len(s) for s in seqs)
    lp = torch.randn(len(seqs), T, tok.vocab_size).log_softmax(-1)  # junk padding
    for b, s in enumerate(seqs):
        lp[b, : len(s)] = s
    lengths = torch.tensor([len(s) for s in seqs])
    dec = WfstDecoder(letter_graph, beam=10.0, max_active=200)
    assert dec.decode(lp, lengths) == [t.split() for t in texts]
    with pytest.raises(ValueError, match=r"\[T, 29\]"):
        dec.decode(lp[:, :, :20], lengths)


def test_graph_cache_and_atomicity(arpa, tmp_path):
    tok = LetterTok()
    out = tmp_path / "g"
    build_tlg(tok, ["the", "cat", "sat", "x-ray"], arpa, out)
    meta = json.loads((out / "graph.json").read_text())
    assert meta["num_words"] == 3 and meta["skipped_words"] == 1  # "x-ray" cannot be spelled
    stamp = (out / "TLG.fst").stat().st_mtime_ns
    build_tlg(tok, ["x-ray", "sat", "cat", "the", "cat"], arpa, out)  # same inputs: reused
    assert (out / "TLG.fst").stat().st_mtime_ns == stamp
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    build_tlg(tok, ["the", "cat", "sat", "on"], arpa, out)  # new inputs: rebuilt
    assert json.loads((out / "graph.json").read_text())["num_words"] == 4
    (out / "graph.json").unlink()  # an interrupted build is not a graph
    with pytest.raises(FileNotFoundError, match="asrkit lm graph"):
        WfstDecoder(out)


def test_sentencepiece_lexicon(arpa, tmp_path):
    tok = PieceTok(PIECES)
    lex, bad = make_lexicon(tok, ["the", "cat", "kat", "at", "ball", "zzz"])
    assert bad == ["at", "zzz"] and lex["cat"] == [tok.encode("cat")]  # no piece spells "▁at"
    graph = build_tlg(tok, None, arpa, tmp_path / "sp")
    k, c = tok.ids["\u2581k"], tok.ids["\u2581c"]
    assert _decode(graph, tok, "the kat sat", {k: {k: 0.5, c: 0.4}})[0] == ["the", "cat", "sat"]
    assert _decode(graph, tok, "a kat is a name")[0] == ["a", "kat", "is", "a", "name"]


def test_disambiguation_symbols():
    lex = {"a": [[1]], "at": [[1, 2]], "b": [[3]], "bee": [[3]], "c": [[4], [1, 2]]}
    d, top = add_disambig(lex)
    assert d == {("a", 0): 1, ("at", 0): 1, ("b", 0): 1, ("bee", 0): 2, ("c", 0): 0, ("c", 1): 2} and top == 2


def test_cli_graph(arpa, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lm_cli, "load_tokenizer", lambda path: LetterTok())
    words = tmp_path / "words.txt"
    words.write_text("the 1\ncat 2\nsat 3\n")
    out = tmp_path / "graph"
    argv = ["graph", "--tokens", "unused", "--arpa", str(arpa), "--words", str(words), "--out", str(out)]
    assert lm_cli.main(argv) == 0
    assert "3 words" in capsys.readouterr().out
    assert _decode(out, LetterTok(), "the cat sat")[0] == ["the", "cat", "sat"]


# A 4-gram graph: the word after "a b" depends on the word before them, which only a 4-gram sees
# ("p a b cat", "q a b kat"); acoustics lean slightly the other way each time.
LM4_TEXT = ["p a b cat"] * 4 + ["q a b kat"] * 4 + ["a b cat is", "a b kat is", "p a", "q a", "b is a b"]
AMBIG4 = [("p a b kat", "k", "c", ["p", "a", "b", "cat"]), ("q a b cat", "c", "k", ["q", "a", "b", "kat"])]


@pytest.mark.parametrize("order", [3, 4])
def test_four_gram_graph_uses_three_words_of_context(order, tmp_path):
    """With the 4-gram graph the LM picks cat after 'p a b' and kat after 'q a b' against slightly
    better acoustics; a trigram sees only 'a b' (cat / kat equally likely), so the acoustics win.
    The prefix beam search with the same ARPA LM agrees with the graph."""
    arpa = tmp_path / f"{order}.arpa"
    NgramLM.train(LM4_TEXT, order=order).write_arpa(arpa)
    lm = NgramLM.from_arpa(arpa)
    assert lm.order == order and (order < 4 or ("p", "a", "b", "cat") in lm._logp)
    tok = LetterTok()
    graph = build_tlg(tok, None, arpa, tmp_path / f"g{order}")
    assert json.loads((graph / "graph.json").read_text())["num_words"] == 7
    for spelled, good, bad, lm_choice in AMBIG4:
        amb = {tok.ids[good]: {tok.ids[good]: 0.5, tok.ids[bad]: 0.4}}
        words, lp = _decode(graph, tok, spelled, amb)
        expected = lm_choice if order == 4 else spelled.split()
        assert words == expected, (order, spelled, words)
        h = ctc_prefix_beam_search(lp, torch.tensor([lp.shape[1]]), beam=8, lm=lm, lm_weight=1.0, tokenizer=tok)[0]
        assert tok.decode(h.tokens).split() == expected


def test_search_beam_and_max_active_come_from_the_config(letter_graph):
    """``decode.search_beam`` / ``decode.max_active`` reach kaldi-decoder's options (the beam divided
    by the LM scale, as the costs are); kaldi-decoder's own limits are config errors, not crashes."""
    from asrkit.config import load_config
    from asrkit.decode.methods import Wfst, validate_decode_config
    from asrkit.schema import ConfigError

    cfg = load_config(None, ["decode.method=wfst", f"decode.lm={letter_graph}", "decode.lm_weight=0.5",
                             "decode.search_beam=10", "decode.max_active=300"])
    validate_decode_config(cfg)
    opts = Wfst(None, cfg, LetterTok()).wfst.options
    assert (opts.beam, opts.max_active, opts.min_active) == (20.0, 300, 20)
    # the smallest max_active kaldi-decoder takes (min_active follows it down) still reads clear speech
    assert _decode(letter_graph, LetterTok(), "the cat sat on the mat", max_active=2)[0] == "the cat sat on the mat".split()
    for bad, message in (("decode.max_active=1", r"decode.max_active=1 must be >= 2"),
                         ("decode.search_beam=0", r"decode.search_beam=0.0 must be > 0")):
        with pytest.raises(ConfigError, match=message):
            validate_decode_config(load_config(None, ["decode.method=wfst", f"decode.lm={letter_graph}", bad]))
