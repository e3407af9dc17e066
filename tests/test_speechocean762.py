"""egs/speechocean762/asr1 on a slice of the real corpus (tests/corpora/speechocean762: 19 real
utterances, 4 speakers, the corpus's own layout and lines; licence and source in its README).

* every stage of ``run.sh`` (tiny config, 4 steps): the five sets' manifests, the Kaldi data dirs
  of the split that another toolkit trains on, the long-form recordings, the decoding and
  RESULTS.md with duration bins, and a rerun that skips every stage;
* the long-form recordings are the corpus files concatenated sample for sample (oracle: the WAV
  files themselves, read with soundfile), in utterance-id order, 20-45 s, or the whole session;
* the dev split rule (README.md of the recipe) and the 20-45 s grouping as properties;
* stage 0: a download from a local HTTP server (with Range support) that drops the first
  connection half-way and is resumed, and a wrong checksum that is refused;
* no corpus: one clear error saying how to get it.
"""
from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "corpora" / "speechocean762"
VENV = Path(sys.executable).parents[1]
RECIPE = REPO / "egs" / "speechocean762" / "asr1"
PARTS = ("train", "dev", "test", "test_longform", "test_session")

pytestmark = pytest.mark.timeout(600)


def read_jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def table(path: Path) -> dict[str, str]:
    return dict((line.split(maxsplit=1) + [""])[:2] for line in path.read_text().splitlines() if line.strip())


def copy_recipe(tmp_path: Path) -> Path:
    dst = tmp_path / "egs" / "speechocean762" / "asr1"
    shutil.copytree(RECIPE, dst, ignore=shutil.ignore_patterns("data", "exp", "downloads"))
    return dst


def run(recipe: Path, *args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(PATH=f"{VENV / 'bin'}{os.pathsep}{e.get('PATH', '')}", ASRKIT_ROOT=str(REPO), ASRKIT_SETUP_DONE=str(VENV),
             OMP_NUM_THREADS="1", SPEECHOCEAN762=str(FIX))
    for k in ("ASRKIT_BACKEND", "ASRKIT_RECIPE_CMD", "SPEECHOCEAN762_SHA256", "SPEECHOCEAN762_URL"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run(["bash", str(recipe / "run.sh"), *args], env=e, capture_output=True, text=True, timeout=timeout)
    p.all = p.stdout + p.stderr  # type: ignore[attr-defined]
    return p


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    d = copy_recipe(tmp_path_factory.mktemp("so762"))
    p = run(d, "--train_config", "conf/train_smoke.yaml", "--nj", "1")
    assert p.returncode == 0, p.all[-6000:]
    return d


def test_all_stages(recipe):
    m = recipe / "data" / "manifests"
    ids = {p: sorted(c["id"] for c in read_jsonl(m / f"speechocean762_cuts_{p}.jsonl.gz")) for p in PARTS}
    text_train, text_test = table(FIX / "train" / "text"), table(FIX / "test" / "text")
    # dev: speaker 1092, the middle one of the 3 (all children) training speakers
    assert ids["dev"] == sorted(u for u in text_train if u.startswith("01092"))
    assert ids["train"] == sorted(u for u in text_train if not u.startswith("01092"))
    assert ids["test"] == sorted(text_test)
    assert ids["test_longform"] == ["014650032_lf7"] and ids["test_session"] == ["014650032_session"]
    # the Kaldi data dirs of the split: absolute paths, the corpus's (upper-case) text
    k = recipe / "data" / "kaldi"
    for part in PARTS:
        d = k / part
        assert sorted(f.name for f in d.iterdir()) == ["spk2gender", "spk2utt", "text", "utt2spk", "wav.scp"], part
        wav, text, utt2spk = table(d / "wav.scp"), table(d / "text"), table(d / "utt2spk")
        assert sorted(wav) == sorted(text) == sorted(utt2spk) == ids[part]
        assert all(Path(p).is_absolute() and Path(p).is_file() for p in wav.values())
        spk2utt = table(d / "spk2utt")
        assert {u: s for s, us in spk2utt.items() for u in us.split()} == utt2spk
        if part in ("train", "dev", "test"):
            src = text_train if part != "test" else text_test
            assert text == {u: src[u] for u in text}
            assert all(Path(wav[u]).samefile(FIX / table(FIX / ("test" if part == "test" else "train") / "wav.scp")[u])
                       for u in wav)
    session = table(k / "test_session" / "text")["014650032_session"]
    assert session == " ".join(text_test[u] for u in sorted(text_test)) and session.isupper()
    # decoded and scored with duration bins; the recipe's RESULTS.md
    exp = recipe / "exp" / "train_smoke"
    utt2spk_test = table(k / "test" / "utt2spk")
    for s in ("test", "test_longform", "test_session"):
        wer = json.loads((exp / f"decode_{s}" / "wer.json").read_text())
        assert wer["overall"]["snt"] == len(ids[s]) and [b["label"] for b in wer["bins"]] == ["<10s", "10-15s", "15-20s", ">=20s"]
        # each utterance's speaker (the ids 000030012 name none): the blocks of asrkit compare's sign test
        rows = [json.loads(line) for line in (exp / f"decode_{s}" / "hyp.jsonl").read_text().splitlines()]
        assert [r["speaker"] for r in rows] == [utt2spk_test[r["id"].split("_")[0]] for r in rows], rows
    bins = {b["label"]: b["snt"] for b in json.loads((exp / "decode_test_longform" / "wer.json").read_text())["bins"]}
    assert bins[">=20s"] == 1
    assert "WER per test set and duration bin" in (exp / "RESULTS.md").read_text()
    assert (recipe / "exp" / "RESULTS.md").is_file()
    # the LM weight and blank penalty chosen on dev (stage 5, asrkit tune) are the ones the test sets used
    tuned = json.loads((exp / "tune_dev" / "tune.json").read_text())
    assert tuned["set"] == "dev" and len(tuned["points"]) == 30 and tuned["points"][0]["words"] > 0
    best = dict(tuned["points"][tuned["best"]]["values"])
    assert (exp / "tune_dev" / "best.args").read_text().split() == [f"{k}={v}" for k, v in best.items()]
    for s in ("test", "test_longform", "test_session"):
        info = json.loads((exp / f"decode_{s}" / "decode_info.json").read_text())
        assert (info["lm_weight"], info["blank_penalty"]) == (best["decode.lm_weight"], best["decode.blank_penalty"])
    assert "decoding weights chosen on dev (`asrkit tune`, 30 points" in (exp / "RESULTS.md").read_text()
    # rerun: every stage skipped
    p = run(recipe, "--train_config", "conf/train_smoke.yaml", "--nj", "1")
    assert p.returncode == 0 and p.stdout.count("skipping") == 6, p.all[-3000:]


def test_phone_targets_of_the_corpus_lexicon_decode_to_words(recipe):
    p = run(recipe, "--stage", "3", "--stop_stage", "6", "--token_type", "phones", "--tag", "phones",
            "--train_config", "conf/train_smoke.yaml", "--nj", "1")
    assert p.returncode == 0, p.all[-6000:]
    tok = json.loads((recipe / "data" / "tokens" / "phones.json").read_text())
    lexicon = {line.split()[0].lower() for line in (FIX / "resource" / "lexicon.txt").read_text().splitlines()}
    assert tok["kind"] == "phones" and set(tok["lexicon"]) == lexicon  # the corpus's own lexicon, by default
    assert tok["lexicon"]["zero"] == ["Z IH AH OW", "Z IH ER OW", "Z IH R OW"]  # stress removed
    graph = json.loads((recipe / "data" / "lm" / "graph_phones_3gram" / "graph.json").read_text())
    assert graph["kind"] == "phone" and graph["num_words"] == 10
    exp = recipe / "exp" / "phones"
    for s in ("test", "test_longform"):
        hyps = [json.loads(line)["hyp"] for line in (exp / f"decode_{s}" / "hyp.jsonl").read_text().splitlines()]
        assert all(w.lower() in lexicon for h in hyps for w in h.split()), hyps  # words, not phones
        assert json.loads((exp / f"decode_{s}" / "wer.json").read_text())["overall"]["snt"] >= 1
    # transcribing with the model: words through the graph; without it, the advice
    wav = sorted((FIX / "WAVE" / "SPEAKER1465").glob("*.WAV"))[0]
    cmd = [str(VENV / "bin" / "asrkit"), "transcribe", str(wav), "--model", str(exp), "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t = subprocess.run(cmd + ["--method", "wfst", "--set", f"decode.lm={recipe / 'data/lm/graph_phones_3gram'}"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert t.returncode == 0 and all(w.lower() in lexicon for w in t.stdout.split()), t.stdout + t.stderr[-2000:]
    t = subprocess.run(cmd + ["--method", "greedy"], capture_output=True, text=True, env=env, timeout=300)
    assert t.returncode != 0 and "decode.method=greedy writes phones, not words" in t.stderr, t.stderr[-2000:]


def test_longform_audio_is_the_files_joined(recipe):
    import numpy as np
    import soundfile as sf

    wav = table(FIX / "test" / "wav.scp")
    utts = sorted(wav)
    parts = [sf.read(str(FIX / wav[u]), dtype="int16")[0] for u in utts]
    assert sum(len(x) for x in parts) / 16000 > 20
    for part, rid in (("test_longform", "014650032_lf7"), ("test_session", "014650032_session")):
        path = Path(table(recipe / "data" / "kaldi" / part / "wav.scp")[rid])
        assert path.is_relative_to(recipe / "data")
        got, sr = sf.read(str(path), dtype="int16")
        assert sr == 16000 and np.array_equal(got, np.concatenate(parts)), part
        sup = read_jsonl(recipe / "data" / "manifests" / f"speechocean762_supervisions_{part}.jsonl.gz")[0]
        assert sup["custom"]["segments"] == utts and sup["speaker"] == "1465"


# --------------------------------------------------------------------------- rules as properties


def test_dev_speakers_rule():
    from asrkit.data.speechocean762 import dev_speakers

    ages = table(FIX / "train" / "spk2age")
    assert dev_speakers({s: int(a) for s, a in ages.items()}) == ["1092"]
    # 58 children and 67 adults (the corpus's counts): 6 + 7, evenly spaced in id order
    spk = {f"c{i:03d}": 8 for i in range(58)} | {f"a{i:03d}": 30 for i in range(67)}
    dev = dev_speakers(spk)
    assert len([s for s in dev if s[0] == "c"]) == 6 and len([s for s in dev if s[0] == "a"]) == 7
    assert [s for s in dev if s[0] == "c"] == ["c004", "c014", "c024", "c033", "c043", "c053"]


@settings(derandomize=True, database=None, max_examples=150, deadline=None)
@given(st.lists(st.floats(min_value=1.5, max_value=12.0), min_size=1, max_size=30))
def test_group_20_45_properties(durs):
    from asrkit.data.speechocean762 import group_20_45

    groups = group_20_45(durs)
    total = sum(durs)
    if total < 20:
        assert groups == []
        return
    assert groups and groups[0][0] == 0
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))  # contiguous, in order
    for i, j in groups:
        assert 20 - 1e-6 <= sum(durs[i:j]) <= 45 + 1e-6
    # only a tail that cannot be placed is left out, and it is shorter than the minimum
    assert sum(durs[groups[-1][1]:]) < 20 or groups[-1][1] == len(durs)


# ----------------------------------------------------------------------------- stage 0: download


class _Server:
    """An HTTP server on 127.0.0.1 serving one file with Range support; the first ``drop``
    responses stop after half the bytes (the connection closes); counts the Range requests."""

    def __init__(self, data: bytes, drop: int = 1):
        self.data, self.drop, self.ranges = data, drop, []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                start = 0
                rng = self.headers.get("Range")
                if rng:
                    start = int(rng.split("=")[1].split("-")[0])
                    outer.ranges.append(start)
                body = outer.data[start:]
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(outer.data) - 1}/{len(outer.data)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if outer.drop > 0:
                    outer.drop -= 1
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/speechocean762.tar.gz"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def tarball(tmp_path):
    tb = tmp_path / "speechocean762.tar.gz"
    with tarfile.open(tb, "w:gz") as tf:
        tf.add(FIX, arcname="speechocean762", filter=lambda ti: None if ti.name.endswith("README.md") else ti)
    return tb.read_bytes()


def test_download_resumes_and_verifies(tmp_path, tarball):
    recipe = copy_recipe(tmp_path)
    srv = _Server(tarball, drop=1)
    try:
        sha = hashlib.sha256(tarball).hexdigest()
        env = {"SPEECHOCEAN762_URL": srv.url, "SPEECHOCEAN762": str(tmp_path / "nowhere")}
        p = run(recipe, "--download", "true", "--download_sha256", sha, "--stop_stage", "1", env=env)
        assert p.returncode == 0, p.all[-4000:]
        assert srv.ranges == [len(tarball) // 2], srv.ranges  # the second request resumed where the first stopped
        dl = recipe / "downloads"
        assert (dl / "speechocean762.tar.gz").read_bytes() == tarball and not (dl / "speechocean762.tar.gz.part").exists()
        assert sorted(table(dl / "speechocean762" / "test" / "text")) == sorted(table(FIX / "test" / "text"))
        assert len(read_jsonl(recipe / "data" / "manifests" / "speechocean762_cuts_test.jsonl.gz")) == 7
        # stage 0 again: done before, skipped
        p = run(recipe, "--download", "true", "--stop_stage", "0", env=env)
        assert p.returncode == 0 and "stage 0 (download): done before" in p.stdout, p.all
    finally:
        srv.close()


def test_download_wrong_checksum_refused(tmp_path, tarball):
    recipe = copy_recipe(tmp_path)
    srv = _Server(tarball, drop=0)
    try:
        env = {"SPEECHOCEAN762_URL": srv.url}
        p = run(recipe, "--download", "true", "--download_sha256", "0" * 64, "--stop_stage", "1", env=env)
        assert p.returncode == 1, p.all
        err = [line for line in p.stderr.splitlines() if line.startswith("download: error:")]
        assert len(err) == 1 and f"is not the expected {'0' * 64}" in err[0] and "rerun to download it again" in err[0]
        dl = recipe / "downloads"
        assert sorted(f.name for f in dl.iterdir()) == []  # neither the bad file nor a part is kept
        assert not (recipe / "data").exists()
    finally:
        srv.close()


def test_no_corpus_says_how_to_get_it(tmp_path):
    recipe = copy_recipe(tmp_path)
    p = run(recipe, "--stop_stage", "1", env={"SPEECHOCEAN762": str(tmp_path / "nowhere")})
    assert p.returncode == 1
    assert f"speechocean762 is not at {tmp_path / 'nowhere'}" in p.stderr and "./run.sh --download true" in p.stderr
    assert not (recipe / "data").exists()


def test_pretrained_starts_training_from_another_run(recipe):
    """``--pretrained EXP``: stage 4 starts from that run's weights (``train.init_from``), and the
    user's own ``--train_args`` are kept beside it."""
    p = run(recipe, "--train_config", "conf/train_smoke.yaml", "--nj", "1", "--stage", "4", "--stop_stage", "4",
            "--tag", "ft", "--train_args", "train.max_steps=2", "--pretrained", "exp/train_smoke")
    assert p.returncode == 0, p.all[-3000:]
    src = (recipe / "exp" / "train_smoke").resolve()
    assert f"initialized from {src}/checkpoints/" in (recipe / "exp" / "ft" / "train.log").read_text()
    cfg = yaml.safe_load((recipe / "exp" / "ft" / "config.yaml").read_text())
    assert cfg["train"]["init_from"] == str(src) and cfg["train"]["max_steps"] == 2


def test_pretrained_missing_says_what_to_run(tmp_path):
    p = run(copy_recipe(tmp_path), "--stage", "4", "--pretrained", "nowhere")
    assert p.returncode == 2 and "--pretrained nowhere does not exist" in p.stderr
    assert "cd ../../mini/asr1 && ./run.sh" in p.stderr


def test_synth_hours_mixes_synthetic_speech_of_the_training_text(recipe):
    """``--synth_hours H`` after the data stages ran: stages 1-2 run again for ``train_synth``
    alone (espeak-ng speech of the train part's transcripts, speakers ``synth-*``, its fbank
    stored), training reads ``[train, train_synth]``, and the tokenizer and LM of stage 3 (the
    real training text's) are left as they were."""
    arpa = recipe / "data" / "lm" / "3gram.arpa"
    before = arpa.stat().st_mtime_ns
    p = run(recipe, "--train_config", "conf/train_smoke.yaml", "--nj", "1", "--stop_stage", "4", "--tag", "mix",
            "--synth_hours", "0.01")
    assert p.returncode == 0, p.all[-4000:]
    assert "stages 1-2 for the new training part(s) train_synth" in p.stdout
    assert "stage 3 (tokens (letters)): done before" in p.stdout and arpa.stat().st_mtime_ns == before
    m = recipe / "data" / "manifests"
    synth = read_jsonl(m / "speechocean762_cuts_train_synth.jsonl.gz")
    train_text = {" ".join(c["supervisions"][0]["text"].lower().replace(",", " ").replace(".", " ").split())
                  for c in read_jsonl(m / "speechocean762_cuts_train.jsonl.gz")}
    sups = [s for c in synth for s in c["supervisions"]]
    assert sum(c["duration"] for c in synth) >= 0.01 * 3600 * 0.8
    assert all(s["speaker"].startswith("synth-") for s in sups)
    spoken = {" ".join(s["text"].lower().split()) for s in sups}
    assert spoken and all(any(t in u or u in t for u in train_text) for t in spoken), (spoken, train_text)
    store = next((recipe / "data" / "fbank").iterdir())
    assert (store / "speechocean762_cuts_train_synth.jsonl.gz").is_file()
    cfg = yaml.safe_load((recipe / "exp" / "mix" / "config.yaml").read_text())
    assert cfg["data"]["train_sets"] == ["train", "train_synth"]
    # the part is made only when asked for, with an amount
    from asrkit.data.speechocean762 import prepare

    with pytest.raises(ValueError, match="--synth-hours H"):
        prepare(FIX, recipe / "data" / "manifests", parts=["train_synth"])


def test_subset_of_training_speakers_trains_on_that_subset_alone(recipe):
    """``local/subset_train.py`` (the learning curve of docs/results/speechocean762.md): every
    KEEP-th training speaker, children and adults taken apart; the new part's manifest and stored
    features are the selected speakers' cuts of ``train`` with the same features, and stage 4 with
    ``--train_sets`` trains on them alone."""
    env = dict(os.environ, SPEECHOCEAN762=str(FIX))
    p = subprocess.run([sys.executable, "local/subset_train.py", "--keep", "2", "--name", "train_half"], cwd=recipe,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    train = read_jsonl(recipe / "data" / "manifests" / "speechocean762_cuts_train.jsonl.gz")
    speakers = sorted({c["supervisions"][0]["speaker"] for c in train})
    ages = table(FIX / "train" / "spk2age")
    kids = [s for s in speakers if int(ages[s]) < 18]
    adults = [s for s in speakers if int(ages[s]) >= 18]
    keep = set(kids[::2]) | set(adults[::2])
    assert 0 < len(keep) < len(speakers)
    want = [c for c in train if c["supervisions"][0]["speaker"] in keep]
    half = read_jsonl(recipe / "data" / "manifests" / "speechocean762_cuts_train_half.jsonl.gz")
    assert half == want
    assert f"train_half: {len(keep)} of {len(speakers)} speakers" in p.stdout
    store = next((recipe / "data" / "fbank").iterdir())
    stored = {c["id"]: c["features"] for c in read_jsonl(store / "speechocean762_cuts_train.jsonl.gz")}
    stored_half = read_jsonl(store / "speechocean762_cuts_train_half.jsonl.gz")
    assert [c["id"] for c in stored_half] == [c["id"] for c in want]
    assert all(c["features"] == stored[c["id"]] for c in stored_half)
    p = run(recipe, "--train_config", "conf/train_smoke.yaml", "--nj", "1", "--stage", "4", "--stop_stage", "4",
            "--tag", "half", "--train_sets", "train_half", "--train_args", "train.max_steps=2")
    assert p.returncode == 0, p.all[-3000:]
    cfg = yaml.safe_load((recipe / "exp" / "half" / "config.yaml").read_text())
    assert cfg["data"]["train_sets"] == ["train_half"]
    info = json.loads((recipe / "exp" / "half" / "train_info.json").read_text())
    assert info["outside_alphabet"]["of"] == len(want) < len(train)  # the utterances it trained on


def test_plot_learning_curve_fits_a_power_law(tmp_path):
    """``local/plot_learning_curve.py`` on a compare.json whose WERs follow WER = 80 * hours^-0.2
    exactly: the fit gives b = -0.200 and 30 % at (30 / 80)^(1 / -0.2) = 134 h; the PNG is written."""
    hours = {"q": 0.5, "h": 1.0, "f": 2.0}
    rows = {k: {"all": {"wer": 80 * h ** -0.2, "low": 80 * h ** -0.2 - 2, "high": 80 * h ** -0.2 + 2}}
            for k, h in hours.items()}
    (tmp_path / "compare.json").write_text(json.dumps({"tables": [{"name": "test", "rows": rows}]}))
    out = tmp_path / "curve.png"
    p = subprocess.run([sys.executable, str(RECIPE / "local" / "plot_learning_curve.py"), "--compare",
                        str(tmp_path / "compare.json"), "--hours", *(f"{k}={h}" for k, h in hours.items()),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"| test | {80 * 0.5 ** -0.2:.2f} | 80.00 | {80 * 2 ** -0.2:.2f} | b = -0.200 | {(30 / 80) ** -5:.0f} |" in p.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
