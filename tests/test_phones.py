"""Phone targets: a Kaldi lexicon.txt read into a phone tokenizer (tokens.kind=phones), its TLG
graph (every pronunciation of every word, homophones and prefixes disambiguated), decoding phones
into words, and the refusals (a word outside the lexicon, greedy decoding of a phone model).

The lexicon is real: lines of speechocean762's resource/lexicon.txt (tests/fixtures/lexicon,
licence and source in its README)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asrkit.config import Config
from asrkit.decode.methods import Decoder
from asrkit.decode.ngram import NgramLM
from asrkit.decode.wfst import WfstDecoder, build_tlg, make_lexicon
from asrkit.schema import ConfigError
from asrkit.tokenizer import (CharTokenizer, PhoneTokenizer, load_tokenizer, read_lexicon, reference_for_greedy,
                              save_tokenizer, train_tokenizer)

from test_wfst import frame_logprobs, spell_frames

LEX = Path(__file__).parent / "fixtures" / "lexicon" / "speechocean762_excerpt.txt"


def test_read_lexicon_of_the_corpus():
    lex = read_lexicon(LEX)
    assert len(lex) == 20 and lex["cat"] == [("K", "AE", "T")]  # stress digits removed, words as transcripts
    assert lex["is"] == [("AH", "Z"), ("IH", "Z"), ("S",), ("Z",)] and lex["a"] == [("AH",), ("EY",)]
    assert lex["don't"] == [("D", "OW", "N", "T")]
    assert read_lexicon(LEX, stress=True)["cat"] == [("K", "AE0", "T")]


def test_read_lexicon_errors_name_file_and_line(tmp_path):
    p = tmp_path / "lexicon.txt"
    p.write_text("FOO F UW1\nFOO F UW0\nBAR\n")
    with pytest.raises(ValueError, match=r"lexicon.txt:3: word 'BAR' has no phones"):
        read_lexicon(p)
    p.write_text("FOO F UW1\nFOO F UW0\n")
    assert read_lexicon(p) == {"foo": [("F", "UW")]}  # the same once stress is gone: kept once
    p.write_text("FOO F UW1\nR2D2 AA R\n")
    with pytest.raises(ValueError, match=r"lexicon.txt:2: word 'R2D2' is not one word"):
        read_lexicon(p)
    with pytest.raises(FileNotFoundError, match="nothere.txt does not exist"):
        read_lexicon(tmp_path / "nothere.txt")


def test_tokenizer_encodes_first_pronunciations_and_round_trips(tmp_path):
    tok = train_tokenizer(["THE CAT RAN"], "phones", lexicon=LEX)
    assert tok.tokens[0] == "<blank>" and tok.tokens[1:] == sorted(tok.tokens[1:]) and tok.vocab_size == 23  # 22 phones
    ids = tok.encode("The cat, ran!")
    assert tok.decode(ids) == "DH AH K AE T R AE N" and tok.decode([0] + ids + [0]) == "DH AH K AE T R AE N"
    with pytest.raises(KeyError, match="'zebra' is not in the phone tokenizer's lexicon"):
        tok.encode("the zebra")
    save_tokenizer(tok, tmp_path / "phones.json")
    back = load_tokenizer(tmp_path / "phones.json")
    assert isinstance(back, PhoneTokenizer) and back.tokens == tok.tokens and back.lexicon == tok.lexicon
    assert back.encode("is a dog") == tok.encode("is a dog")


def test_training_text_outside_the_lexicon_is_refused_with_the_words():
    with pytest.raises(ValueError, match=r"3 words .* not in the lexicon .*speechocean762_excerpt.txt, e.g. zebra \(2\), "
                                         r"and \(1\), yak \(1\): add their pronunciations"):
        train_tokenizer(["the zebra", "a zebra and", "yak"], "phones", lexicon=LEX)
    with pytest.raises(ValueError, match="needs a pronunciation lexicon"):
        train_tokenizer(["the cat"], "phones")


LM_TEXT = ["see the dog"] * 3 + ["the sea is red"] * 3 + ["the cat ran to the ball"] * 3 + ["a dog is at the mall"] * 2 \
    + ["read the name", "two cats", "the cat is too red", "all the cat"]


@pytest.fixture(scope="module")
def phone_graph(tmp_path_factory):
    d = tmp_path_factory.mktemp("phones")
    NgramLM.train(LM_TEXT, order=3).write_arpa(d / "lm.arpa")
    tok = PhoneTokenizer(read_lexicon(LEX))
    return tok, build_tlg(tok, None, d / "lm.arpa", d / "graph")


def _decode_phones(graph, tok, phones: str):
    ids = [tok.tokens.index(p) for p in phones.split()]
    lp = frame_logprobs(spell_frames(ids), tok.vocab_size)[None]
    return WfstDecoder(graph).decode(lp, torch.tensor([lp.shape[1]]))[0]


def test_graph_has_every_pronunciation_and_words_outside_the_lexicon_left_out(phone_graph):
    tok, _ = phone_graph
    lex, bad = make_lexicon(tok, ["is", "cats", "sea"])
    assert lex["is"] == [tok.encode("is"), [tok.tokens.index("IH"), tok.tokens.index("Z")],
                         [tok.tokens.index("S")], [tok.tokens.index("Z")]]
    assert bad == ["cats"]


@pytest.mark.parametrize("phones, words", [
    ("DH IY K AE T R AE N T UW DH AH B AO L", "the cat ran to the ball"),  # THE and TO: second pronunciations
    ("S IY DH AH D AO G", "see the dog"),  # homophones SEA / SEE: the LM decides
    ("DH AH S IY Z R EH D", "the sea is red"),  # IS as Z
    ("EY D AH G S AE T DH AH M AO L", "a dog is at the mall"),  # A as EY, IS as S
])
def test_phones_decode_to_words_through_the_lexicon(phone_graph, phones, words):
    tok, graph = phone_graph
    assert _decode_phones(graph, tok, phones) == words.split()


def test_greedy_output_of_a_phone_model_is_scored_over_phones_and_word_decoding_needs_the_graph():
    tok = PhoneTokenizer(read_lexicon(LEX))
    assert reference_for_greedy(tok, "The cat ran.") == "DH AH K AE T R AE N"
    assert reference_for_greedy(CharTokenizer(), "The cat ran.") == "The cat ran."
    cfg = Config()
    for method in ("greedy", "prefix_beam"):
        cfg.decode.method = method
        with pytest.raises(ConfigError, match=f"decode.method={method} writes phones, not words.*decode.method=wfst"):
            Decoder(None, cfg, tok)


def test_word_times_of_a_phone_transcript_group_each_words_phones():
    from asrkit.inference.align import TokenTime, words_from_tokens

    tok = PhoneTokenizer(read_lexicon(LEX))
    ids = tok.encode("the cat")  # DH AH | K AE T
    aligned = [TokenTime(i, 0.1 * k, 0.1 * k + 0.05) for k, i in enumerate(ids)]
    words = words_from_tokens(tok, aligned, "THE CAT")
    assert [(w.word, round(w.start, 6), round(w.end, 6), len(w.tokens)) for w in words] == [("THE", 0.0, 0.15, 2), ("CAT", 0.2, 0.45, 3)]


def test_word_times_of_a_phone_transcript_follow_the_pronunciation_the_model_heard():
    """TLG decoding returns words; a word with several pronunciations (THE, DOG, IS here) is
    aligned with the one whose CTC path scores best, not with the lexicon's first, so its phones
    and times are those spoken."""
    from asrkit.inference.align import best_pronunciations, ctc_align, token_times, words_from_tokens

    tok = PhoneTokenizer(read_lexicon(LEX))
    spoken = [tok.tokens.index(p) for p in "DH IY D AO G S R EH D".split()]  # THE DOG IS RED, 2nd / 2nd / 3rd
    lp = frame_logprobs(spell_frames(spoken, frames_per_token=2), tok.vocab_size)
    prons = best_pronunciations(lp, tok, "THE DOG IS RED")
    assert [" ".join(tok.tokens[i] for i in p) for p in prons] == ["DH IY", "D AO G", "S", "R EH D"]
    assert tok.encode("THE DOG IS RED") != spoken  # the first pronunciations: DH AH D AH G AH Z R EH D
    ids = [i for p in prons for i in p]
    times = torch.arange(lp.shape[0]).float() * 0.04
    aligned = token_times(ctc_align(lp, ids), ids, times, 0.04)
    words = words_from_tokens(tok, aligned, "THE DOG IS RED", [len(p) for p in prons])
    # frame layout: a blank, then every phone 2 frames + a blank: S (phone 5) at frames 16-17
    assert [(w.word, round(w.start, 2), round(w.end, 2)) for w in words] == [
        ("THE", 0.04, 0.24), ("DOG", 0.28, 0.60), ("IS", 0.64, 0.72), ("RED", 0.76, 1.08)]
    first = tok.encode("THE DOG IS RED")  # what the aligner used before: THE as DH AH, whose AH
    before = words_from_tokens(tok, token_times(ctc_align(lp, first), first, times, 0.04), "THE DOG IS RED")
    assert (round(before[0].start, 2), round(before[0].end, 2)) == (0.04, 0.20)  # takes one frame of IY
