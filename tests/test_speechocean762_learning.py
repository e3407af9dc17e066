"""A model learns real human speech and recognizes children it never heard.

Data: two slices of speechocean762 (CC BY 4.0): tests/corpora/speechocean762 and
tests/corpora/speechocean762_digits. Nine Mandarin-L1 children aged 6-9 reading digit strings train
(32 utterances, 91 s as recorded); three other children (speakers 1465, 0003, 0093: 17 utterances,
66 words, 52 s) are held out. Imported through ``asrkit prepare kaldi`` (Lhotse's importer), fbank
+ CMVN, letters tokenizer, ``asrkit train``, ``asrkit decode`` with a WFST restricted to the training
words (the ten digit words: a word unigram of the training text spelled in letters). The oracle is
the corpus's own transcripts, scored by ``jiwer``.

Training mixes the real utterances with six minutes of synthetic digit strings (espeak-ng through
:mod:`asrkit.data.synth`, many voices; none of the held-out children's strings), as the recipe's
``--synth_hours`` mixes synthetic speech of its training text. Real children's speech alone is too
little to generalize from: measured 2026-11-26 (3 x 96 CTC Transformer, 500-800 steps, the 12
utterances of the first slice only), the held-out child's digit strings were 81-89 % WER while the
training utterances reached 0 %.

Each training recording is placed at a random offset in 3.5 s of background noise at the level of
its own first 30 ms (the room noise before the child speaks), so the real training inputs have one
length and the model can tell them apart only by listening (tests/test_learning.py found that
utterances of different lengths are memorized from their lengths alone, even from all-zero
features). The held-out recordings are decoded as recorded.

Why these settings (issue 57: a learning test must hold on any CPU). Until 2026-11-29 the test
trained the post-LN Transformer of conf/ctc_tiny.yaml on the first slice alone (3 training
children, 1 held out, 26 held-out words: one word 3.8 points). On an Intel Xeon Ice Lake (family 6
model 106, no AMX) its seeds gave, training utterances / held-out child, WER %: seed 42 (this test,
2 threads) 21.7 / 34.6, seed 1 28.3 / 57.7, seed 3 23.9 / 53.8 and **seed 2 100 / 100: a model that
never left CTC's blank phase** (its loss 31-48 from step 100 to 1500), so a CPU whose rounding sent
the test's own seed that way would fail it whatever the bounds. Two changes, each measured:

* ``encoder.norm_first=true`` (pre-LN, the layer order of every mini and speechocean762 recipe
  model; post-LN at a peak learning rate of 0.005 after 20 warm-up steps is the unstable case of
  Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture"). On the first slice
  alone, seeds 1-7 and 42 all left the blank phase (seed 2: 10.9 / 53.8), but the held-out child
  still spread over 38.5-69.2 % (seed 3 and seed 42 with 2 threads: 69.2, at the 70 % bound);
  post-LN with both slices still left seed 2 in the blank phase (100 / 100 %), so this change is
  the one that removes that risk;
* six more training children and two more held-out children (the second slice): the model hears
  more voices, and a held-out word is 1.5 points instead of 3.8.

The spread behind the bounds, with both changes (2026-11-29, Intel Xeon Ice Lake, family 6 model
106, no AMX; this test's corpus and settings, seed / threads / instruction set changed;
/work/notes/s25/measure_learning.py), training utterances / held-out children, WER %:

| run (pre-LN, both slices) | training utterances | held-out children | speaker 1465 alone |
|---|---:|---:|---:|
| seed 42, 2 threads (this test) | 8.1 | 40.9 | 34.6 |
| seed 42, 1 thread | 5.7 | 43.9 | 42.3 |
| seed 42, 1 thread, AVX2 kernels* | 9.8 | 39.4 | 42.3 |
| seed 1 | 4.1 | 34.8 | 26.9 |
| seed 2 | 9.8 | 48.5 | 46.2 |
| seed 3 | 13.8 | 42.4 | 50.0 |
| seed 3, AVX2 kernels* | 11.4 | 37.9 | 42.3 |
| seeds 4 / 5 / 6 / 7 / 8 | 8.9 / 3.3 / 4.9 / 4.9 / 5.7 | 34.8 / 39.4 / 50.0 / 42.4 / 34.8 | |

(seeds 1-8 with 1 thread; 123 words of training utterances, 66 held-out words; *
``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 DNNL_MAX_CPU_ISA=AVX2``: torch's, MKL's and
oneDNN's AVX2 kernels, as on a CPU without AVX-512.) Over these 12 runs: training utterances
3.3-13.8 %, held-out children 34.8-50.0 %.

Break tried (the fbank zeroed in the training and decoding loaders: ``asrkit.data.dataset.fbank``
patched to return zeros; seed 42, 2 threads): 83.7 / 93.9 %, so both assertions fail. The bounds
(45 % and 70 %) sit about halfway between the worst run above and that break. On an AMD EPYC
without AVX-512 (2026-11-30, family 25 model 1, Zen 3; /work/notes/s32/measure_learning.py) this
test's run (seed 42, 2 threads) gave 9.8 / 43.9 % (speaker 1465 alone 30.8 %), inside the range
above; with 1 thread seeds 42 / 1 / 2 / 3 / 4 / 5 / 6 / 7 gave 8.1 / 4.1 / 7.3 / 17.1 / 5.7 / 4.9 /
6.5 / 6.5 % on training utterances and 42.4 / 34.8 / 37.9 / 47.0 / 39.4 / 45.5 / 37.9 / 39.4 % on the
held-out children (seed 1: Ice Lake's figures exactly). Over the 9 AMD runs: 4.1-17.1 % and
34.8-47.0 %; over all 21 runs on both CPU models 3.3-17.1 % and 34.8-50.0 %, against bounds of 45 and
70 %. Not measured: Intel AMX.
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

CORPORA = Path(__file__).resolve().parent / "corpora"
#: the speechocean762 slice (3 training children, held-out speaker 1465) and the learning test's
#: extra children of the same corpus (6 training, 2 held out); each a Kaldi data dir, CC BY 4.0
FIXTURES = (CORPORA / "speechocean762", CORPORA / "speechocean762_digits")
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
    train, test = [], []
    for i, fix in enumerate(FIXTURES):
        parts = prepare_kaldi(fix, root / f"import{i}", ["train", "test"], num_jobs=1, name="so762", wav_root=fix)
        train += list(parts["train"])
        test += list(parts["test"])
    assert len(train) == 32 and len({c.supervisions[0].speaker for c in train}) == 9
    assert len(test) == 17 and {c.supervisions[0].speaker for c in test} == {"1465", "0003", "0093"}
    assert not {c.supervisions[0].speaker for c in train} & {c.supervisions[0].speaker for c in test}
    held_out = {c.supervisions[0].text for c in test}
    write_part(root / "m", "so762", "heldout", RecordingSet.from_recordings(c.recording for c in test),
               SupervisionSet.from_segments(c.supervisions[0] for c in test))
    rng = np.random.default_rng(0)
    recs, sups = [], []
    for cut in sorted(train, key=lambda c: c.id):
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
    assert lmmod.main(["train", "--text", str(root / "m" / "so762_cuts_fixed.jsonl.gz"), "--order", "1",
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


def test_ctc_learns_real_childrens_speech_and_recognizes_new_children(corpus, tmp_path):
    ovr = {
        "data.manifest_dir": corpus / "m", "data.corpus": "so762", "data.train_sets": "[fixed,synth]",
        "data.dev_set": "", "data.max_duration": 40, "data.num_buckets": 2, "data.num_workers": 0,
        "tokens.path": corpus / "tokens.json", "specaug.enabled": "true", "train.device": "cpu",
        "train.threads": 2, "train.ckpt_every_steps": 0, "train.log_interval": 100, "train.max_epochs": 10000,
        "encoder.d_model": 96, "encoder.n_heads": 4, "encoder.d_ff": 192, "encoder.n_layers": 3,
        "encoder.norm_first": "true",  # pre-LN, as the recipe's models: post-LN left a seed in the blank phase
        "optim.lr": 0.005, "optim.schedule": "warmup_cosine", "optim.warmup_steps": 20, "train.max_steps": 1500,
    }
    exp = tmp_path / "exp"
    assert S.train(exp, S.CTC_CONF, [f"{k}={v}" for k, v in ovr.items()]) == 0
    wfst = ("decode.method=wfst", f"decode.lm={corpus / 'graph'}", "decode.lm_weight=0.5", "decode.blank_penalty=2.0")
    seen, new = _decode(exp, "fixed", *wfst), _decode(exp, "heldout", *wfst)
    assert len(seen) == 32 and sum(len(r["ref"].split()) for r in seen) == 123
    assert len(new) == 17 and sum(len(r["ref"].split()) for r in new) == 66
    table = "\n".join(f"{r['ref']} | {r['hyp']}" for r in seen + new)
    w_seen, w_new = S.wer(seen), S.wer(new)
    # measured (docstring): 3.3-17.1 % and 34.8-50.0 % over 21 runs (seeds, threads, AVX2 kernels, Ice Lake and AMD);
    # a model trained on zeroed features: 83.7 % and 93.9 %
    assert w_seen <= 45.0 and w_new <= 70.0, (
        f"WER training utterances {w_seen:.1f}%, new children {w_new:.1f}%:\n{table}")
