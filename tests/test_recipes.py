"""The corpus recipes egs/{wsj,tedlium2,tedlium3,librispeech}/asr1: stages 1-2 of each ``run.sh``
(``asrkit prepare`` + ``asrkit cuts``) on miniature corpora in the real layouts, run as the user
runs them, from a copy of the recipe dir in tmp_path (``ASRKIT_ROOT`` points at this repo, the
corpus path comes through the environment variable that ``db.sh`` reads).

Checked: manifest names and utterance counts, long-form window manifests, ``.done`` markers and
skipping on rerun, incomplete corpora (a missing WSJ disc, a missing transcript, a corrupt or
missing audio file) failing the stage with a message naming the file, the run continuing where it
stopped once the corpus is fixed, corpus-specific ``asrkit prepare`` flags reaching the preparer,
strict option parsing (exit code 2 naming the option), and that every remedy an error message
prints ("..., run (from the recipe directory): ./run.sh ...") works exactly as printed
(:func:`run_remedy`: the WSJ partial corpus and bad-audio skips, stage 2's ``--on_bad skip``).

``tools/setup.sh`` is not run by these recipe calls (``ASRKIT_SETUP_DONE`` is set: pytest already
runs from the set-up venv, and each set-up check costs several seconds of Python start-up);
:func:`test_path_sh_runs_setup_once` checks path.sh's set-up logic with a stand-in setup.sh.
Manifests are read as plain gzip JSON lines, so this file needs neither lhotse nor torch itself.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.corpora.librispeech import make_librispeech
from tests.corpora.tedlium import espnet_text, make_tedlium
from tests.corpora.wsj import make_wsj

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("ASRKIT_VENV", REPO / ".venv"))
RECIPES = ("wsj", "tedlium2", "tedlium3", "librispeech")
WINDOWS = (10, 15, 20, 25, 30, 35, 40, 45)


# ---------------------------------------------------------------------------------- helpers


def copy_recipe(tmp_path: Path, corpus: str) -> Path:
    """A copy of egs/<corpus>/asr1 (without any data/ or exp/ of a real run) in tmp_path."""
    dst = tmp_path / "egs" / corpus / "asr1"
    shutil.copytree(REPO / "egs" / corpus / "asr1", dst, ignore=shutil.ignore_patterns("data", "exp", "downloads"))
    return dst


def run_recipe(recipe: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(
        PATH=f"{VENV / 'bin'}{os.pathsep}{e.get('PATH', '')}",
        ASRKIT_ROOT=str(REPO),
        ASRKIT_SETUP_DONE=str(VENV),  # see the module docstring
        OMP_NUM_THREADS="1",
    )
    e.pop("ASRKIT_BACKEND", None)
    e.pop("ASRKIT_RECIPE_CMD", None)
    e.update(env or {})
    p = subprocess.run(["bash", str(recipe / "run.sh"), *args], env=e, capture_output=True, text=True, timeout=600)
    p.all = p.stdout + p.stderr  # type: ignore[attr-defined]
    return p


REMEDY = re.compile(r"run \(from the recipe directory\): (.+)$", re.M)


def run_remedy(recipe: Path, failed: subprocess.CompletedProcess, env: dict) -> subprocess.CompletedProcess:
    """Run, exactly as printed and from the recipe directory, the one remedy the failed run's
    error message printed."""
    cmds = REMEDY.findall(failed.stderr)
    assert len(cmds) == 1, failed.stderr[-3000:]
    e = dict(os.environ)
    e.update(PATH=f"{VENV / 'bin'}{os.pathsep}{e.get('PATH', '')}", ASRKIT_ROOT=str(REPO), ASRKIT_SETUP_DONE=str(VENV),
             OMP_NUM_THREADS="1")
    e.pop("ASRKIT_BACKEND", None)
    e.pop("ASRKIT_RECIPE_CMD", None)
    e.update(env)
    p = subprocess.run(["bash", "-c", cmds[0]], cwd=recipe, env=e, capture_output=True, text=True, timeout=600)
    p.all = p.stdout + p.stderr  # type: ignore[attr-defined]
    p.cmd = cmds[0]  # type: ignore[attr-defined]
    return p


def read_jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def manifests(recipe: Path, corpus: str, kind: str, part: str) -> list[dict]:
    path = recipe / "data" / "manifests" / f"{corpus}_{kind}_{part}.jsonl.gz"
    assert path.is_file(), f"{path} missing; have: {sorted(p.name for p in path.parent.glob('*'))}"
    return read_jsonl(path)


def cut_ids(recipe: Path, corpus: str, part: str) -> list[str]:
    return sorted(c["id"] for c in manifests(recipe, corpus, "cuts", part))


def assert_part(recipe: Path, corpus: str, part: str, expected_ids) -> list[dict]:
    """All three manifests of a part exist, with exactly the expected utterances."""
    cuts = manifests(recipe, corpus, "cuts", part)
    sups = manifests(recipe, corpus, "supervisions", part)
    recs = manifests(recipe, corpus, "recordings", part)
    assert sorted(c["id"] for c in cuts) == sorted(expected_ids), part
    assert sorted(s["id"] for s in sups) == sorted(expected_ids), part
    assert {s["recording_id"] for s in sups} <= {r["id"] for r in recs}
    return cuts


def assert_longform(recipe: Path, corpus: str, part: str) -> None:
    """Every window size has a manifest, and each covers every segment of the part exactly once."""
    seg_ids = cut_ids(recipe, corpus, part)
    for w in WINDOWS:
        windows = manifests(recipe, corpus, "cuts", f"{part}-longform{w}")
        assert windows, (part, w)
        info = [c.get("custom") or c["tracks"][0]["cut"]["custom"] for c in windows]  # MonoCut / MixedCut
        assert sorted(s for i in info for s in i["segments"]) == seg_ids, (part, w)
        assert all(i["window"] == w for i in info)
    assert len(windows) < len(seg_ids)  # 45 s windows hold several segments


def assert_stages_done(recipe: Path, *stages: int) -> None:
    for n in stages:
        assert (recipe / "data" / ".done" / f"stage{n}.done").is_file(), f"stage {n} has no .done marker"


def assert_stored_fbank(recipe: Path, corpus: str, parts: list[str], others: list[str]) -> None:
    """Stage 2 stored the fbank of exactly the training and dev ``parts`` (data/fbank/<config>/),
    one feature matrix per utterance of the part, with as many frames as its duration gives."""
    (store,) = (recipe / "data" / "fbank").glob("fbank*")
    for part in parts:
        cuts = read_jsonl(store / f"{corpus}_cuts_{part}.jsonl.gz")
        assert sorted(c["id"] for c in cuts) == cut_ids(recipe, corpus, part), part
        for c in cuts:
            f = c["features"]
            assert f["type"] == "asrkit-fbank" and f["start"] == c["start"] and f["frame_shift"] == 0.01
            assert f["num_frames"] == int((round(c["duration"] * 16000) + 80) // 160)
            assert (store / f["storage_path"]).is_file()
    for part in others:
        assert not (store / f"{corpus}_cuts_{part}.jsonl.gz").exists(), part


def assert_rerun_skips(recipe: Path, env: dict, *args: str) -> None:
    """A rerun of stages 1-2 skips both (done markers) and rewrites nothing."""
    files = {p: p.stat().st_mtime_ns for p in (recipe / "data" / "manifests").iterdir()}
    r = run_recipe(recipe, "--stage", "1", "--stop_stage", "2", *args, env=env)
    assert r.returncode == 0, r.all
    for n in (1, 2):
        assert re.search(rf"stage {n} \([^)]*\): done before \(\S*stage{n}\.done\), skipping", r.stdout), r.all
    assert "asrkit prepare" not in r.all and "utterances with readable audio" not in r.all
    assert {p: p.stat().st_mtime_ns for p in (recipe / "data" / "manifests").iterdir()} == files


def assert_failed(r: subprocess.CompletedProcess, *names: str) -> None:
    assert r.returncode != 0, r.all
    assert "Traceback" not in r.stderr, r.stderr  # a message, not a crash
    for name in names:
        assert name in r.stderr, (name, r.stderr[-3000:])


# ---------------------------------------------------------------------------------- WSJ


def test_wsj_recipe(tmp_path):
    """An incomplete WSJ (disc 13-2.1 missing, a .dot line missing, a corrupt .wv1): stage 1 fails
    naming the missing disc and what it holds; the printed remedy (a partial corpus) runs as
    printed and fails naming the corrupt file; its printed remedy (skip bad audio) completes the
    stage, the FLAC cache of run.sh kept (--prepare_args accumulates)."""
    fx = make_wsj(tmp_path / "corpus", missing_discs=["13-2.1"], drop_transcripts=["46ac0202"], corrupt=["4k0c0302"], lm=False)
    recipe = copy_recipe(tmp_path, "wsj")
    env = {"WSJ": str(tmp_path / "corpus")}
    flac = recipe / "data" / "flac"

    r = run_recipe(recipe, "--stage", "1", "--stop_stage", "2", "--nj", "1", env=env)
    assert_failed(r, "13-2.1: 1 utterance of train_si284", str(tmp_path / "corpus"))
    assert not (recipe / "data" / ".done" / "stage1.done").exists()
    assert not (recipe / "data" / "manifests").exists() or not list((recipe / "data" / "manifests").iterdir())

    r = run_remedy(recipe, r, env)  # ./run.sh --stage 1 --stop_stage 2 --nj 1 --stage 1 --prepare_args "--allow-missing-discs"
    assert '--prepare_args "--allow-missing-discs"' in r.cmd
    assert_failed(r, str(fx.paths["4k0c0302"]), "test_dev93")
    assert not (recipe / "data" / ".done" / "stage1.done").exists()
    assert not (recipe / "data" / "manifests" / "wsj_cuts_test_dev93.jsonl.gz").exists()
    # the incomplete parts are reported by name: the missing disc and the .dot file lacking a line
    assert "missing discs: 13-2.1 (1 utterances)" in r.stderr
    assert re.search(r"no transcript for 1 utterance\(s\) 46ac0202 in \S*46ac0200\.dot", r.stderr), r.stderr
    train = ["011c0201", "011c0202", "40ac0201", "40ac0202", "46ac0201"]  # 401 excluded, 46bc0201 on 13-2.1
    assert_part(recipe, "wsj", "train_si284", train)  # done before the failure: kept, not redone

    r = run_remedy(recipe, r, env)  # ... --prepare_args "--allow-missing-discs" --stage 1 --prepare_args "--skip-bad-audio"
    assert r.returncode == 0, r.all
    assert "wsj/train_si284: manifests exist, skipping" in r.stderr
    assert "bad audio" in r.stderr and "4k0c0302" in r.stderr
    assert_part(recipe, "wsj", "train_si284", train)
    assert_part(recipe, "wsj", "test_dev93", ["4k0c0301"])
    assert_part(recipe, "wsj", "test_eval92", ["440c0201", "440c0202"])
    assert_stages_done(recipe, 1, 2)
    assert_stored_fbank(recipe, "wsj", ["train_si284", "test_dev93"], ["test_eval92"])
    assert not list((recipe / "data" / "manifests").glob("*longform*"))
    # recordings point at the FLAC cache (db.sh's WSJ_FLAC default), kept through the remedies
    for part in ("test_dev93", "test_eval92"):
        for rec in manifests(recipe, "wsj", "recordings", part):
            assert rec["sources"][0]["source"] == str(flac / f"{rec['id']}.flac")
    # si284 transcripts in the CAPE setting: words of letters and apostrophes only
    texts = {s["id"]: s["text"] for s in manifests(recipe, "wsj", "supervisions", "train_si284")}
    assert texts["40ac0201"] == "MISTER SMITH WHO DECLINED TO COMMENT SAID IT WAS FINE"
    assert all(re.fullmatch(r"[A-Z']*[A-Z][A-Z']*", w) for t in texts.values() for w in t.split()), texts
    assert_rerun_skips(recipe, env)


# ---------------------------------------------------------------------------------- TED-LIUM


def _tedlium_expected(fx, version: int, part: str) -> list[str]:
    """ESPnet's utterance ids of the fixture (tests/corpora/tedlium_espnet_text.json), less the
    ones asrkit drops by design: no words once non-speech tokens are removed, or starting after
    the audio ends (docs/corpora.md)."""
    ids = []
    for uid, text in espnet_text(version)[part].items():
        talk, start = uid.rsplit("-", 2)[0], int(uid.rsplit("-", 2)[1]) / 100
        words = [w for w in text.split() if not w.startswith(("[", "<unk>"))]
        if words and start < len(fx.audio[(part, talk)]) / 16000:
            ids.append(uid)
    return ids


@pytest.mark.parametrize(
    "version,broken",
    [(2, {"corrupt": ("DanaRoe_2012",)}), (3, {"drop_sph": ("EvaPoe_2013",)})],
    ids=["tedlium2-truncated-sph", "tedlium3-missing-sph"],
)
def test_tedlium_recipe(tmp_path, version, broken):
    """TED-LIUM with a truncated (v2, dev) or missing (v3, test) .sph: stage 1 fails naming it;
    with the file back, the run continues (train kept) and builds dev/test long-form windows."""
    corpus = f"tedlium{version}"
    fx = make_tedlium(tmp_path / "corpus", version, **broken)
    recipe = copy_recipe(tmp_path, corpus)
    env = {f"TEDLIUM{version}": str(tmp_path / "corpus")}
    bad_talk = next(iter(broken.values()))[0]
    bad_part = "dev" if "corrupt" in broken else "test"

    r = run_recipe(recipe, "--stage", "1", "--stop_stage", "2", "--nj", "1", env=env)
    assert_failed(r, f"{bad_talk}.sph", str(fx.root))
    assert not (recipe / "data" / ".done" / "stage1.done").exists()
    assert not (recipe / "data" / "manifests" / f"{corpus}_cuts_{bad_part}.jsonl.gz").exists()

    shutil.rmtree(tmp_path / "corpus")
    fx = make_tedlium(tmp_path / "corpus", version)  # the same corpus, complete (same seed)
    r = run_recipe(recipe, "--stage", "1", "--stop_stage", "2", "--nj", "1", env=env)
    assert r.returncode == 0, r.all
    assert f"{corpus}/train: manifests exist, skipping" in r.stderr
    for part in ("train", "dev", "test"):
        cuts = assert_part(recipe, corpus, part, _tedlium_expected(fx, version, part))
        sups = [c["supervisions"][0] for c in cuts]
        if part == "dev":  # the dev STMs' labels <F0_M> / <F0_F>
            assert {s["custom"]["label"] for s in sups} == {"<F0_M>", "<F0_F>"}
            assert {s["gender"] for s in sups} == {"M", "F"}
    for part in ("dev", "test"):
        assert_longform(recipe, corpus, part)
    assert not list((recipe / "data" / "manifests").glob(f"{corpus}_cuts_train-longform*"))
    assert_stages_done(recipe, 1, 2)
    assert_stored_fbank(recipe, corpus, ["train", "dev"], ["test"])
    # run.sh's --pad-segments reached the preparer: training segments start 0.15 s early
    first = min(manifests(recipe, corpus, "cuts", "train"), key=lambda c: c["id"])
    assert first["id"].startswith("AlexSmith_2009-0000050-")  # ids keep the STM times
    assert first["start"] == pytest.approx(0.5 - 0.15)
    assert "duplicated STM line: 1" in r.stderr
    first = min(manifests(recipe, corpus, "cuts", "dev"), key=lambda c: c["id"])
    assert first["id"].startswith("CarlDoe_2010-0000050-") and first["start"] == pytest.approx(0.5)  # not padded
    # audio of this release only (v2 and v3 have different audio for the same talks)
    for rec in manifests(recipe, corpus, "recordings", "dev"):
        assert os.path.realpath(rec["sources"][0]["source"]).startswith(str(fx.root.resolve()) + os.sep)
    assert_rerun_skips(recipe, env)


# ---------------------------------------------------------------------------------- LibriSpeech

LIBRI_PARTS = {
    "train-clean-100": {"19": {"198": 3}},
    "train-clean-360": {"100": {"121669": 2}},
    "train-other-500": {"20": {"205": 2}},
    "dev-clean": {"84": {"121123": 6}, "174": {"50561": 4}},
    "test-clean": {"1089": {"134686": 5}},
    "test-other": {"1688": {"142285": 5}},
}


def test_librispeech_recipe(tmp_path):
    """LibriSpeech (train-960 = the three training parts, a FLAC listed but missing, an
    untranscribed FLAC): stage 1 fails naming the missing file; once it is there the run continues
    and builds long-form windows; a FLAC corrupted later fails stage 2 naming it."""
    kw = dict(parts=LIBRI_PARTS, dur=(1.0, 4.0), no_transcript=("84-121123-0002",))
    fx = make_librispeech(tmp_path / "corpus", drop_audio=("1688-142285-0003",), **kw)
    recipe = copy_recipe(tmp_path, "librispeech")
    env = {"LIBRISPEECH": str(tmp_path / "corpus")}

    r = run_recipe(recipe, "--stage", "1", "--stop_stage", "2", "--nj", "1", env=env)
    assert_failed(r, str(fx.utts["1688-142285-0003"][2]))
    assert not (recipe / "data" / ".done" / "stage1.done").exists()
    assert "84-121123-0002" in r.stderr  # the untranscribed FLAC is reported

    fx = make_librispeech(tmp_path / "corpus", **kw)  # same seed: the same corpus, complete
    r = run_recipe(recipe, "--stage", "1", "--stop_stage", "2", "--nj", "1", env=env)
    assert r.returncode == 0, r.all
    assert "librispeech/dev-clean: manifests exist, skipping" in r.stderr
    for part, speakers in LIBRI_PARTS.items():
        ids = [u for u in fx.utts if u.split("-")[0] in speakers and u != "84-121123-0002"]
        cuts = assert_part(recipe, "librispeech", part, ids)
        if part == "test-clean":
            assert {c["supervisions"][0]["text"] for c in cuts} == {fx.utts[u][0] for u in ids}
    for part in ("dev-clean", "test-clean", "test-other"):
        assert_longform(recipe, "librispeech", part)
    assert_stages_done(recipe, 1, 2)
    assert_stored_fbank(recipe, "librispeech", ["train-clean-100", "train-clean-360", "train-other-500", "dev-clean"],
                        ["test-clean", "test-other"])
    assert_rerun_skips(recipe, env)

    bad = fx.utts["1688-142285-0001"][2]
    bad.write_bytes(b"fLaC" + b"\x00garbage" * 20)
    r = run_recipe(recipe, "--stage", "2", "--stop_stage", "2", "--nj", "1", "--force", "true", env=env)
    assert_failed(r, str(bad), "test-other")
    # the printed remedy (stage 2 with --on_bad skip), run exactly as printed, drops that utterance
    r = run_remedy(recipe, r, env)
    assert r.cmd.endswith("--stage 2 --on_bad skip") and r.cmd.startswith("./run.sh --stage 2 --stop_stage 2")
    assert r.returncode == 0, r.all
    assert "test-other: 4 utterances with readable audio, 1 dropped" in r.stdout
    assert "1688-142285-0001" not in cut_ids(recipe, "librispeech", "test-other")
    assert (recipe / "data" / "manifests" / "librispeech_bad_audio_test-other.txt").read_text().startswith("1688-142285-0001\t")


# ---------------------------------------------------------------------------------- options


@pytest.mark.parametrize("corpus", RECIPES)
def test_unknown_option_is_an_error(tmp_path, corpus):
    recipe = copy_recipe(tmp_path, corpus)
    r = run_recipe(recipe, "--stage", "1", "--no_such_option", "3")
    assert r.returncode == 2, r.all
    assert "unknown option --no-such-option" in r.stderr
    assert not (recipe / "data").exists()  # nothing ran


def test_librispeech_train_set_option(tmp_path):
    recipe = copy_recipe(tmp_path, "librispeech")
    r = run_recipe(recipe, "--train_set", "train-clean-999")
    assert r.returncode == 2 and "--train_set train-clean-999" in r.stderr and "train-clean-100" in r.stderr
    r = run_recipe(recipe, "--stage", "1", "--train-set")
    assert r.returncode == 2 and "--train_set needs a value" in r.stderr
    # a valid one reaches asr.sh: shown by --help's list of current option values
    r = run_recipe(recipe, "--train_set=train-clean-100", "--help")
    assert r.returncode == 0, r.all
    assert re.search(r"--train_sets train-clean-100\n", r.stdout) and "--tag train_clean100" in r.stdout


def test_prepare_flags_are_checked_per_corpus(tmp_path, capsys):
    from asrkit.data.prepare import main

    with pytest.raises(SystemExit) as e:
        main(["librispeech", "--corpus-dir", str(tmp_path), "--out", str(tmp_path / "m"), "--pad-segments"])
    assert e.value.code == 2 and "--pad-segments applies to tedlium2 and tedlium3 only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tedlium3", "--corpus-dir", str(tmp_path), "--out", str(tmp_path / "m"), "--skip-bad-audio"])
    assert "--skip-bad-audio applies to wsj only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["librispeech", "--corpus-dir", str(tmp_path), "--out", str(tmp_path / "m"), "--allow-missing-discs"])
    assert "--allow-missing-discs applies to wsj only" in capsys.readouterr().err


def test_prepare_args_accumulate_and_on_bad_is_an_option(tmp_path):
    """--prepare_args given by run.sh and again by the user: both reach asrkit prepare (shown by
    --help's list of values); --on_bad is a recipe option (the remedy stage 2 prints)."""
    recipe = copy_recipe(tmp_path, "tedlium3")
    r = run_recipe(recipe, "--prepare_args", "--keep-unk", "--on-bad", "skip", "--help")
    assert r.returncode == 0, r.all
    assert "--prepare_args --pad-segments --keep-unk\n" in r.stdout and "--on_bad skip\n" in r.stdout


def test_path_sh_runs_setup_once(tmp_path):
    """path.sh runs tools/setup.sh once per run (run.sh and asr.sh both source it) and puts the
    venv on PATH; checked with a stand-in root whose setup.sh only logs that it ran."""
    root = tmp_path / "root"
    (root / "tools").mkdir(parents=True)
    (root / "tools" / "setup.sh").write_text('#!/usr/bin/env bash\necho "setup ran" >> "$SETUP_LOG"\n')
    (root / "tools" / "setup.sh").chmod(0o755)
    (root / "egs").symlink_to(REPO / "egs")  # the shared egs/TEMPLATE/asr1/path.sh
    for corpus in RECIPES + ("mini",):
        log = tmp_path / f"{corpus}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("ASRKIT_SETUP_DONE", "ASRKIT_VENV")}
        env.update(ASRKIT_ROOT=str(root), SETUP_LOG=str(log))
        script = f'. {REPO}/egs/{corpus}/asr1/path.sh; bash -c ". {REPO}/egs/{corpus}/asr1/path.sh"; echo "$PATH"'
        r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert log.read_text() == "setup ran\n", corpus
        assert r.stdout.split(os.pathsep)[0] == str(root / ".venv" / "bin")
