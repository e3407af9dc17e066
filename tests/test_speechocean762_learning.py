"""A model learns real human speech and recognizes a speaker it never heard.

Data: the speechocean762 slice (tests/corpora/speechocean762, CC BY 4.0): three Mandarin-L1
children reading digit strings (12 training utterances, 36 s) and a fourth child (speaker 1465,
7 utterances, 23.5 s) held out. Imported through ``asrkit prepare kaldi`` (Lhotse's importer),
fbank + CMVN, letters tokenizer, ``asrkit train``, ``asrkit decode`` with a WFST restricted to the
training words (the ten digit words: a word unigram of the training text spelled
in letters). The oracle is the corpus's own transcripts, scored by ``jiwer``.

Training mixes the 12 real utterances with six minutes of synthetic digit strings (espeak-ng
through :mod:`asrkit.data.synth`, many voices; none of the held-out speaker's strings), as the
recipe's ``--synth_hours`` mixes synthetic speech of its training text. 36 s of children's speech
alone is too little to generalize from: measured 2026-11-26 (3 x 96 CTC Transformer, 500-800
steps, real utterances only), the held-out child's digit strings were 81-89 % WER (WFST) while
the training utterances reached 0 %. With the synthetic mix (2026-11-27, Intel AMX VM, WFST with
blank penalty 2): this test 34.6 % on the held-out child and 21.7 % on the training utterances;
the same settings with other synthetic strings, one thread and training seeds 1 / 2 / 3: held-out
46.2 / 46.2 / 53.8 %, training utterances 2.2 / 8.7 / 39.1 %. The bounds (70 % and 60 %) sit
about halfway between the worst of those and a model that does not hear (below).

The spread on a second CPU (2026-11-29, Intel Xeon Ice Lake, family 6 model 106, no AMX; this
test's corpus and settings, /work/notes/s24/measure_learning.py, training utterances / held-out
child): seed 42 with 2 threads (this test) 21.7 / 34.6 %, the AMX figures exactly; seed 1 (1
thread) 28.3 / 57.7; seed 3 23.9 / 53.8; **seed 2 100 / 100 %: that model never leaves CTC's blank
phase** (its training loss 31-48 at every 100th step from 100 to 1500; the other seeds' falls to
10-20 between steps 300 and 900; on the AMX VM seed 2 learned, with other synthetic strings). So a
CPU whose rounding sends this test's own seed the same way would fail it, whatever the bounds.
Tried against it, one run each: warmup 150 steps instead of 20 (seed 2: 13.0 / 57.7, seed 42: 15.2
/ 65.4), peak learning rate 0.002 instead of 0.005 (seed 2: 6.5 / 61.5, seed 42: 10.9 / **80.8**),
0.25 h of synthetic speech instead of 0.1 (seed 2 still 100 / 100), and that without SpecAugment
(seed 42: 0.0 / 69.2): each either leaves seed 2 in the blank phase or moves the held-out child
near or past the bound, so none was taken; the test keeps its settings (it passed on the three CPU
models it has run on: Intel AMX, Cascade Lake, Ice Lake) and the open risk is in issue 57.

Each training recording is placed at a random offset in 3.5 s of background noise at the level of
its own first 30 ms (the room noise before the child speaks), so the real training inputs have one
length and the model can tell them apart only by listening (tests/test_learning.py found that
utterances of different lengths are memorized from their lengths alone, even from all-zero
features). The held-out recordings are decoded as recorded.

Break tried (2026-11-27): the fbank zeroed in the training loader (asrkit.data.dataset.fbank
patched to return zeros; the seed-1 settings above): held-out 88.5 %, training utterances 82.6 %
(every utterance decoded as FIVE FIVE), so both assertions fail.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

import helpers_speech as S

# a hang guard, not a speed target: 1500 steps of a 3 x 96 model on 40 s batches, a few minutes
# alone; 22 minutes on the 2-core VM beside three other trainings, and 1660 s (92 % of the former
# 1800 s guard) in a whole CI run beside two un-niced CPU-bound trainings (2026-11-28, Cascade Lake:
# its 2 threads oversubscribed), hence twice that
pytestmark = pytest.mark.timeout(3600)

FIX = Path(__file__).resolve().parent / "corpora" / "speechocean762"
SECONDS = 3.5
DIGITS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()


def _digit_strings(n: int, avoid: set[str], seed: int = 0) -> tuple[str, ...]:
    """``n`` random strings of 2-4 digit words, none of them in ``avoid``."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        s = " ".join(rng.choice(DIGITS) for _ in range(rng.randint(2, 4)))
        if s not in avoid:
            out.append(s)
    return tuple(out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import numpy as np
    import soundfile as sf
    from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet
    from lhotse.recipes import prepare_librispeech

    from asrkit.data.kaldi import prepare_kaldi
    from asrkit.data.manifests import write_part
    from asrkit.data.synth import SynthConfig, synthesize_corpus
    from asrkit.decode import lm as lmmod
    from asrkit.tokenizer import CharTokenizer, save_tokenizer

    root = tmp_path_factory.mktemp("so762_learn")
    parts = prepare_kaldi(FIX, root / "m", ["train", "test"], num_jobs=1, name="so762", wav_root=FIX)
    held_out = {c.supervisions[0].text for c in parts["test"]}
    assert len(parts["test"]) == 7 and {c.supervisions[0].speaker for c in parts["test"]} == {"1465"}
    rng = np.random.default_rng(0)
    recs, sups = [], []
    for cut in sorted(parts["train"], key=lambda c: c.id):
        x = cut.load_audio()[0].astype(np.float64)
        sr = cut.sampling_rate
        floor = max(float(np.sqrt(np.mean(x[: int(0.03 * sr)] ** 2))), 1e-4)
        slack = int(SECONDS * sr) - x.size
        assert slack >= 0, f"{cut.id} is longer than {SECONDS} s"
        lead = int(rng.integers(0, slack + 1))
        y = np.concatenate([rng.normal(0, floor, lead), x, rng.normal(0, floor, slack - lead)])
        path = root / f"{cut.id}.flac"
        sf.write(path, y.astype(np.float32), sr)
        rec = Recording.from_file(path, recording_id=cut.id)
        recs.append(rec)
        sups.append(SupervisionSegment(id=cut.id, recording_id=cut.id, start=0.0, duration=rec.duration,
                                       text=cut.supervisions[0].text, speaker=cut.supervisions[0].speaker))
    write_part(root / "m", "so762", "fixed", RecordingSet.from_recordings(recs), SupervisionSet.from_segments(sups))
    # six minutes of synthetic digit strings, many voices, none of them a held-out string
    config = SynthConfig(seed=0, train_hours=0.1, dev_minutes=0, test_minutes=0, longform_minutes=0, jobs=2,
                         train_text=_digit_strings(400, held_out))
    libri = synthesize_corpus(root / "synth", config=config)
    synth = prepare_librispeech(libri, dataset_parts=["train"], output_dir=None, num_jobs=1)["train"]
    assert not held_out & {s.text for s in synth["supervisions"]}
    write_part(root / "m", "so762", "synth", synth["recordings"], synth["supervisions"])
    save_tokenizer(CharTokenizer(), root / "tokens.json")
    assert lmmod.main(["train", "--text", str(root / "m" / "so762_cuts_train.jsonl.gz"), "--order", "1",
                       "--out", str(root / "lm.arpa")]) == 0
    assert lmmod.main(["graph", "--tokens", str(root / "tokens.json"), "--arpa", str(root / "lm.arpa"),
                       "--out", str(root / "graph")]) == 0
    return root


def _decode(exp: Path, part: str, *args: str) -> list[dict]:
    from asrkit.decode import run

    suffix = args[0].split("=")[1]
    with S._restored_logging_and_threads():
        assert run.main(["--exp-dir", str(exp), "--sets", part, "--no-score", "--suffix", suffix, *args]) == 0
    return S.hyps(exp / f"decode_{part}_{suffix}")


def test_ctc_learns_real_childrens_speech_and_recognizes_a_new_child(corpus, tmp_path):
    ovr = {
        "data.manifest_dir": corpus / "m", "data.corpus": "so762", "data.train_sets": "[fixed,synth]",
        "data.dev_set": "", "data.max_duration": 40, "data.num_buckets": 2, "data.num_workers": 0,
        "tokens.path": corpus / "tokens.json", "specaug.enabled": "true", "train.device": "cpu",
        "train.threads": 2, "train.ckpt_every_steps": 0, "train.log_interval": 100, "train.max_epochs": 10000,
        "encoder.d_model": 96, "encoder.n_heads": 4, "encoder.d_ff": 192, "encoder.n_layers": 3,
        "optim.lr": 0.005, "optim.schedule": "warmup_cosine", "optim.warmup_steps": 20, "train.max_steps": 1500,
    }
    exp = tmp_path / "exp"
    assert S.train(exp, S.CTC_CONF, [f"{k}={v}" for k, v in ovr.items()]) == 0
    wfst = ("decode.method=wfst", f"decode.lm={corpus / 'graph'}", "decode.lm_weight=0.5", "decode.blank_penalty=2.0")
    seen, new = _decode(exp, "fixed", *wfst), _decode(exp, "test", *wfst)
    assert len(seen) == 12 and sum(len(r["ref"].split()) for r in seen) == 46
    assert len(new) == 7 and sum(len(r["ref"].split()) for r in new) == 26
    table = "\n".join(f"{r['ref']} | {r['hyp']}" for r in seen + new)
    w_seen, w_new = S.wer(seen), S.wer(new)
    # measured 21.7 % and 34.6 % (AMX and Ice Lake alike; other seeds: up to 39.1 % and 57.7 %, and
    # one seed on Ice Lake stuck in the blank phase at 100 %); a model trained on zeroed features:
    # 82.6 % and 88.5 % (docstring)
    assert w_seen <= 60.0 and w_new <= 70.0, f"WER training utterances {w_seen:.1f}%, new child {w_new:.1f}%:\n{table}"
