from asrkit.tokenizer import CharTokenizer, load_tokenizer, save_tokenizer, train_tokenizer


def test_letters_round_trip():
    tok = CharTokenizer()
    assert tok.vocab_size == 29 and tok.tokens[0] == "<blank>"
    ids = tok.encode("It's a  TEST, ok")
    assert 0 not in ids
    assert [tok.tokens[i] for i in ids] == list("it's|a|test|ok")
    assert tok.decode(ids) == "IT'S A TEST OK"


def test_sentencepiece_round_trip(tmp_path):
    texts = [f"the quick brown fox number {w} jumps over the lazy dog" for w in ["one", "two", "three", "four"]] * 50
    tok = train_tokenizer(texts, "bpe", 60)
    assert tok.tokens[0] == "<blank>"
    for t in ["THE QUICK BROWN FOX", "LAZY DOG JUMPS OVER", "it's new"]:
        ids = tok.encode(t)
        assert ids and 0 not in ids
        assert tok.decode(ids) == t.upper()
    p = tmp_path / "tok.json"
    save_tokenizer(tok, p)
    tok2 = load_tokenizer(p)
    assert tok2.tokens == tok.tokens and tok2.encode("the lazy fox") == tok.encode("the lazy fox")
    uni = train_tokenizer(texts, "unigram", 40)
    assert uni.decode(uni.encode("the lazy dog")) == "THE LAZY DOG"
