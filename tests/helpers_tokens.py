"""Stand-in tokenizers for the decoding tests (the CTC/WFST decoders only use this protocol)."""
from __future__ import annotations


class LetterTok:
    """Stand-in letter tokenizer: blank, '|', apostrophe, a-z."""

    def __init__(self) -> None:
        self.tokens = ["<blank>", "|", "'"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
        self.blank_id = 0
        self.vocab_size = len(self.tokens)
        self.ids = {t: i for i, t in enumerate(self.tokens)}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for i, w in enumerate(text.lower().split()):
            if i:
                out.append(self.ids["|"])
            out += [self.ids[c] for c in w]
        return out

    def decode(self, ids) -> str:
        return " ".join(w for w in "".join(self.tokens[i] for i in ids if i).split("|") if w)


class PieceTok:
    """Stand-in sentencepiece tokenizer: greedy longest match, '▁' starts a word."""

    def __init__(self, pieces: list[str]) -> None:
        self.tokens = ["<blank>"] + pieces
        self.blank_id = 0
        self.vocab_size = len(self.tokens)
        self.ids = {t: i for i, t in enumerate(self.tokens)}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for w in text.lower().split():
            s = "\u2581" + w
            while s:
                for n in range(len(s), 0, -1):
                    if s[:n] in self.ids:
                        out.append(self.ids[s[:n]])
                        s = s[n:]
                        break
                else:
                    raise KeyError(s)
        return out

    def decode(self, ids) -> str:
        return "".join(self.tokens[i] for i in ids if i).replace("\u2581", " ").strip()
