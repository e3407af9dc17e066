"""``asrkit synth --text FILE``: synthetic speech of a given training text (e.g. a real corpus's
transcripts), to mix into that corpus's training."""
from __future__ import annotations

import re

from asrkit.data import synth

TEXT = """000010011 WE CALL IT BEAR
000010035 ZERO THREE FIVE ONE
000010053 IT'S A NICE DAY, ISN'T IT?
"""


def test_train_text_is_spoken_cycled_in_librispeech_layout(tmp_path):
    text = tmp_path / "text"
    text.write_text(TEXT)
    out = tmp_path / "synth"
    rc = synth.main(["--out", str(out), "--text", str(text), "--text-has-ids", "--train-hours", str(40 / 3600),
                     "--dev-minutes", "0", "--test-minutes", "0", "--longform-minutes", "0", "--jobs", "1"])
    assert rc == 0
    lines = [line for p in (out / "LibriSpeech" / "train").rglob("*.trans.txt") for line in p.read_text().splitlines()]
    said = [line.split(" ", 1)[1] for line in lines]
    want = {"WE CALL IT BEAR", "ZERO THREE FIVE ONE", "IT'S A NICE DAY ISN'T IT"}
    assert set(said) == want  # every sentence, and only these (punctuation dropped, ids not spoken)
    assert len(said) > len(want)  # cycled: repeats, each another voice / prosody
    assert all(re.fullmatch(r"\d+-\d+-\d{4}", line.split(" ", 1)[0]) for line in lines)
    flacs = list((out / "LibriSpeech" / "train").rglob("*.flac"))
    assert len(flacs) == len(lines)


def test_plan_cycles_each_pass_in_a_new_order():
    import numpy as np

    s = synth._TextSampler(np.random.default_rng(0), ["a", "b", "c", "d"])
    first, second = [s() for _ in range(4)], [s() for _ in range(4)]
    assert sorted(first) == sorted(second) == ["a", "b", "c", "d"]
    assert synth.normalize_sentence("It's  a NICE day, isn't it?") == "it's a nice day isn't it"
