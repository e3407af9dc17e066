"""asrkit.reports.report (RESULTS.md) and asrkit.reports.compare (compare.md, compare.json, PNG plots)
on small fake experiments scored with the real scorer: intervals, seed groups, significance against a
baseline (identical systems: p = 1 and no mark; a planted difference: found), agreement of the
end-to-end p-values with NIST sc_stats (tests/fixtures/sclite/stats), decoding cost, window series."""
from __future__ import annotations

import json
import random
import re
import shutil
import statistics
from pathlib import Path

import pytest

from asrkit.reports import compare, report
from asrkit.reports.compare import compare_experiments
from asrkit.reports.report import write_results_md
from asrkit.reports.seeds import group_experiments, split_seed
from asrkit.reports.stats import seed_permutation_p
from asrkit.scoring import score_dir
from asrkit.scoring.significance import bootstrap_wer, speaker_of

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STATS = Path(__file__).parent / "fixtures" / "sclite" / "stats"

# decode_test of experiment A: one utterance per duration bin, durations on the bin edges.
TEST_A = [
    {"id": "t1", "ref": "a b c d", "hyp": "a b c d", "duration": 5.0},  # <10s: 0/4
    {"id": "t2", "ref": "a b c d", "hyp": "a x c d", "duration": 10.0},  # 10-15s: 1/4
    {"id": "t3", "ref": "a b", "hyp": "a", "duration": 15.0},  # 15-20s: 1/2
    {"id": "t4", "ref": "a b c d e", "hyp": "a b c d e f", "duration": 20.0},  # >=20s: 1/5
]  # overall 3 / 15 = 20 %
DEV_A = [{"id": "d1", "ref": "a b c d", "hyp": "a b", "duration": 3.0}]  # 50 %
LONG_A = [
    {"id": "l1", "ref": "a b c d", "hyp": "a b c", "duration": 10.0, "window": 10},  # 25 %
    {"id": "l2", "ref": "a b c d e f", "hyp": "a b c d e f", "duration": 20.0, "window": 20},
    {"id": "l3", "ref": "a b", "hyp": "x y", "duration": 30.0, "window": 30},  # 100 %
]  # overall 3 / 12
TEST_B = [dict(r, hyp=r["ref"]) for r in TEST_A]  # perfect: 0 % everywhere


def _decode_dir(exp, name, rows, info=None):
    d = exp / f"decode_{name}"
    d.mkdir(parents=True)
    (d / "hyp.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if info is not None:
        (d / "decode_info.json").write_text(json.dumps(info))
    score_dir(d)
    return d


@pytest.fixture()
def exps(tmp_path):
    a, b = tmp_path / "exp" / "cape", tmp_path / "exp" / "sinpos"
    _decode_dir(a, "test", TEST_A, {"set": "test", "rtf": 0.05})
    _decode_dir(a, "dev", DEV_A)
    _decode_dir(a, "long", LONG_A, {"set": "long", "audio_seconds": 60.0, "wall_seconds": 6.0,
                                    "decode_seconds": 4.5, "peak_rss_delta_bytes": 3 << 20})
    (a / "config.yaml").write_text("model: cape\n")
    _decode_dir(b, "test", TEST_B, {"set": "test", "rtf": 0.04})
    return a, b


def _tables(md: str, first_header: str) -> list[dict[str, dict[str, str]]]:
    """Every Markdown table whose first header cell is ``first_header``: [{row: {col: cell}}]."""
    lines = md.splitlines()
    out = []
    for start, ln in enumerate(lines):
        if not ln.startswith(f"| {first_header} |"):
            continue
        header = [c.strip() for c in ln.strip("|").split("|")]
        rows = {}
        for row in lines[start + 2:]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert len(cells) == len(header), row
            rows[cells[0]] = dict(zip(header, cells))
        out.append(rows)
    return out


def _section(md: str, name: str) -> str:
    """The text of ``## name`` up to the next section."""
    return md.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]


def _iv(errors, words) -> str:
    iv = bootstrap_wer(errors, words)
    return f"{iv.wer:.2f} [{iv.low:.1f}, {iv.high:.1f}]"


# --------------------------------------------------------------------------------- RESULTS.md


def test_results_md(exps):
    a, _ = exps
    (a / "decode_unscored").mkdir()  # a decode dir without wer.json is listed, not tabled
    path = write_results_md(a)
    assert path == a / "RESULTS.md"
    md = path.read_text()
    assert f"`{a / 'config.yaml'}`" in md
    rows = _tables(md, "Test set")[0]
    assert list(rows) == ["dev", "long", "test"]
    t = rows["test"]
    assert t["WER"] == _iv([0, 1, 1, 1], [4, 4, 2, 5]) and t["Snt / Wrd"] == "4 / 15"
    assert t["WER"].startswith("20.00 [")
    assert t["WER <10s"] == "0.00 [0.0, 0.0] (1)"
    assert t["WER 10-15s"] == "25.00 [25.0, 25.0] (1)"  # one utterance: every resample is the same
    assert t["WER 15-20s"] == "50.00 [50.0, 50.0] (1)"
    assert t["WER >=20s"] == "20.00 [20.0, 20.0] (1)"
    assert t["RTF"] == "0.0500" and t["Norm"] == "none/v1" and t["Decode s"] == "-"
    d = rows["dev"]
    assert d["WER"] == "50.00 [50.0, 50.0]" and d["WER 10-15s"] == "- (0)" and d["RTF"] == "-"
    assert rows["long"]["RTF"] == "0.1000"  # wall / audio
    assert rows["long"]["Decode s"] == "4.5" and rows["long"]["Peak MiB"] == "3"
    # Long-form table: WER per window size, ascending.
    lf = _tables(md.split("## Long-form")[1], "Test set")[0]
    assert list(lf) == ["long"]
    assert lf["long"]["WER"] == _iv([1, 0, 2], [4, 6, 2])
    assert (lf["long"]["WER 10s"], lf["long"]["WER 20s"], lf["long"]["WER 30s"]) == (
        "25.00 [25.0, 25.0] (1)",
        "0.00 [0.0, 0.0] (1)",
        "100.00 [100.0, 100.0] (1)",
    )
    assert "Not scored (no wer.json): unscored" in md
    assert not list(a.glob(".*.tmp"))


def test_results_md_without_long_form_or_config(exps, capsys):
    _, b = exps
    assert report.main([str(b)]) == 0
    md = (b / "RESULTS.md").read_text()
    assert "config.yaml" not in md and "Long-form" not in md
    assert _tables(md, "Test set")[0]["test"]["WER"] == "0.00 [0.0, 0.0]"
    assert "| test |" in capsys.readouterr().out
    assert report.main([str(b / "missing")]) == 1


def test_results_md_rejects_corrupt_wer_json(exps):
    a, _ = exps
    (a / "decode_dev" / "wer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"decode_dev/wer\.json"):
        write_results_md(a)


# --------------------------------------------------------------------------------- compare: tables


def test_compare_tables_and_plots(exps, tmp_path):
    a, b = exps
    out = tmp_path / "cmp"
    md_path = compare_experiments([a, b], out, names=["CAPE", "sinpos"])
    assert md_path == out / "compare.md"
    md = md_path.read_text()
    test = _tables(_section(md, "test"), "Experiment")[0]
    assert list(test) == ["CAPE", "sinpos"]
    cape, sin = test["CAPE"], test["sinpos"]
    assert cape["all"] == _iv([0, 1, 1, 1], [4, 4, 2, 5]) and sin["all"] == "0.00 [0.0, 0.0]"
    assert cape["10-15s"] == "25.00 [25.0, 25.0]" and cape["15-20s"] == "50.00 [50.0, 50.0]"
    assert cape["seeds"] == sin["seeds"] == "-"
    dev = _tables(_section(md, "dev"), "Experiment")[0]
    assert dev["CAPE"]["all"] == "50.00 [50.0, 50.0]" and dev["CAPE"]["10-15s"] == "-"  # empty bin
    assert dev["sinpos"]["all"] == "-" and dev["sinpos"]["<10s"] == "-"  # missing test set
    lf = _tables(_section(md, "long windows"), "Experiment")[0]
    assert lf["CAPE"]["10s"] == "25.00 [25.0, 25.0]" and lf["CAPE"]["30s"] == "100.00 [100.0, 100.0]"
    assert lf["sinpos"]["20s"] == "-"
    cost = _tables(_section(md, "long"), "Decoding")[0]
    assert cost["CAPE"]["all"] == "0.075 / 3"  # 4.5 decode s / 60 audio s, 3 MiB
    assert "Against" not in md  # no baseline: no tests
    for png in ("wer_vs_duration.png", "wer_vs_window.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
        assert f"]({png})" in md
    doc = json.loads((out / "compare.json").read_text())
    assert [t["name"] for t in doc["tables"]] == ["dev", "long", "test", "long windows"]  # decode dir order
    cell = doc["tables"][2]["rows"]["CAPE"]["all"]
    assert cell["wer"] == pytest.approx(20.0) and cell["n_words"] == 15 and cell["n_seeds"] == 1
    assert cell["seeds"]["CAPE"]["wer"] == pytest.approx(20.0)


def test_compare_cli_sets_and_names(exps, tmp_path, capsys):
    a, b = exps
    out = tmp_path / "cmp2"
    assert compare.main([str(a), str(b), "--out", str(out), "--sets", "test"]) == 0
    md = (out / "compare.md").read_text()
    rows = _tables(md, "Experiment")
    assert len(rows) == 1 and list(rows[0]) == ["cape", "sinpos"]  # default names: the directory names
    assert set(rows[0]["cape"]) == {"Experiment", "seeds", "all", "<10s", "10-15s", "15-20s", ">=20s"}
    assert (out / "wer_vs_duration.png").stat().st_size > 0
    assert not (out / "wer_vs_window.png").exists()  # no long-form set selected
    assert "windows" not in md
    capsys.readouterr()
    assert compare.main([str(a), str(b), "--out", str(out), "--names", "only-one"]) == 1
    assert "1 name(s)" in capsys.readouterr().err
    assert compare.main([str(a), str(b), "--out", str(out), "--baseline", "nopos"]) == 1
    assert "--baseline 'nopos' is none of the experiments (cape, sinpos)" in capsys.readouterr().err


def test_stale_wer_json_is_an_error(exps, tmp_path):
    a, b = exps
    hyp = a / "decode_test" / "hyp.jsonl"
    hyp.write_text(hyp.read_text().replace('"hyp": "a b c d"', '"hyp": "x x x x"'))  # decoded again, not scored
    with pytest.raises(ValueError, match=r"decode_test/wer\.json: its counts .* rerun asrkit score"):
        compare_experiments([a, b], tmp_path / "cmp")


def test_window_sets_decoded_one_size_each_form_one_series(tmp_path):
    """``test-longform10``, ``test-longform20`` and ``test-longformwhole`` (one window size per decoded
    set, as ``asrkit longform`` writes them) become one long-form table: one row per experiment, one
    column per window size, whole recordings last; the decoding cost of each from its decode_info."""
    exps = []
    for name, errs in (("nopos", (0, 1, 2)), ("cape", (1, 2, 3))):
        e = tmp_path / name
        for w, n_err in zip(("10", "20", "whole"), errs):
            rows = [{"id": f"u{w}", "ref": "a b c d", "hyp": " ".join(["x"] * n_err + list("abcd"[n_err:])),
                     "duration": 10.0 if w == "whole" else float(w)}]
            if w != "whole":
                rows[0]["window"] = int(w)
            info = {"audio_seconds": 10.0, "wall_seconds": 2.0, "decode_seconds": 1.0 + n_err,
                    "peak_rss_delta_bytes": (10 + n_err) << 20}
            _decode_dir(e, f"test-longform{w}", rows, info)
        exps.append(e)
    md = compare_experiments(exps, tmp_path / "cmp").read_text()
    assert "## test-longform10" not in md  # joined into the series
    sec = _section(md, "test-longform windows")
    lf = _tables(sec, "Experiment")[0]
    assert list(lf["cape"]) == ["Experiment", "seeds", "10s", "20s", "whole"]
    assert lf["nopos"]["10s"] == "0.00 [0.0, 0.0]" and lf["cape"]["20s"] == "50.00 [50.0, 50.0]"
    assert lf["cape"]["whole"] == "75.00 [75.0, 75.0]"
    cost = _tables(sec, "Decoding")[0]
    assert cost["nopos"]["whole"] == "0.300 / 12" and cost["cape"]["10s"] == "0.200 / 11"
    assert (tmp_path / "cmp" / "wer_vs_window.png").read_bytes().startswith(PNG_MAGIC)


# --------------------------------------------------------------------------------- seeds and tests

WORDS = [f"w{i}" for i in range(40)]


def _synthetic_exp(exp: Path, p_err: float, seed: int, n: int = 150, train_seed=None, extra: str = ""):
    """A scored decode_test of ``n`` utterances (fixed references, durations over all bins) whose
    hypotheses substitute each word with probability ``p_err`` (random stream ``seed``)."""
    refs, rnd = random.Random(7), random.Random(seed)
    rows = []
    for i in range(n):
        ref = [refs.choice(WORDS) for _ in range(refs.randint(4, 14))]
        rows.append({"id": f"{100 + i % 9}-1-{i:04d}", "ref": " ".join(ref), "duration": refs.uniform(2.0, 40.0),
                     "hyp": " ".join(w if rnd.random() >= p_err else "oops" for w in ref)})
    _decode_dir(exp, "test", rows)
    (exp / "config.yaml").write_text(f"encoder: {{pos_enc: x}}\ntrain: {{seed: {train_seed or seed}, threads: {seed}}}\n{extra}")
    return exp


def _vs(doc: dict, table: str, baseline: str, row: str, col: str = "all") -> dict:
    t = next(t for t in doc["tables"] if t["name"] == table)
    return t["vs"][baseline][row][col]


def test_identical_systems_p_one_and_no_mark(tmp_path):
    """Two experiment dirs with the same hyp.jsonl: Δ = 0 with a zero-width interval, p = 1 for
    every test, no significance mark, in the table and in compare.json; the same for 3 seeds each."""
    base = _synthetic_exp(tmp_path / "one" / "base", 0.3, seed=1)
    same = tmp_path / "one" / "same"
    shutil.copytree(base, same)
    md = compare_experiments([base, same], tmp_path / "cmp1", baselines=["base"]).read_text()
    row = _tables(_section(md, "test"), "vs base")[0]["same"]
    for col in ("all", "<10s", "10-15s", "15-20s", ">=20s"):
        assert row[col] == "+0.00 [0.0, 0.0] p 1.000 / 1.000", col  # no mark
    c = _vs(json.loads((tmp_path / "cmp1" / "compare.json").read_text()), "test", "base", "same")
    assert (c["delta"], c["low"], c["high"]) == (0.0, 0.0, 0.0)
    assert c["p_bootstrap"] == c["mapsswe_p"] == c["sign_p"] == c["seeds_p"] == 1.0
    assert c["mark"] == "" and not c["significant"] and not c["test_holds"]

    dirs = []
    for s in (1, 2, 3):
        b = _synthetic_exp(tmp_path / "three" / f"base_seed{s}", 0.3, seed=s)
        shutil.copytree(b, tmp_path / "three" / f"same_seed{s}")
        dirs += [b, tmp_path / "three" / f"same_seed{s}"]
    doc_md = compare_experiments(dirs, tmp_path / "cmp3", baselines=["base"]).read_text()
    doc = json.loads((tmp_path / "cmp3" / "compare.json").read_text())
    c = _vs(doc, "test", "base", "same")
    assert (c["delta"], c["low"], c["high"], c["mapsswe_p"], c["seeds_p"], c["mark"]) == (0.0, 0.0, 0.0, 1.0, 1.0, "")
    assert len(c["pairs"]) == 9  # every pair of seeds tested
    assert " * " not in doc_md.split("## test")[1] and "°" not in doc_md.split("## test")[1]


def test_planted_difference_found_and_rule(tmp_path):
    """A candidate that makes a third of the baseline's errors, 3 seeds each: significant (*) in every
    column; with one seed each only the test holds (°); with one bad seed the seeds overlap (°)."""
    dirs = []
    for s in (1, 2, 3):
        dirs.append(_synthetic_exp(tmp_path / f"base_seed{s}", 0.30, seed=s))
        dirs.append(_synthetic_exp(tmp_path / f"good_seed{s}", 0.10, seed=10 + s, train_seed=s))
        dirs.append(_synthetic_exp(tmp_path / f"mixed_seed{s}", 0.10 if s < 3 else 0.45, seed=20 + s, train_seed=s))
    md = compare_experiments(dirs, tmp_path / "cmp", baselines=["base"]).read_text()
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    good = _vs(doc, "test", "base", "good")
    assert good["significant"] and good["mark"] == "*" and good["delta"] < -15
    assert good["high"] < 0 and good["mapsswe_p"] < 1e-3 and good["seeds_p"] == pytest.approx(1 / 20)
    assert all(p["mapsswe"]["p_value"] < 0.05 and p["paired_bootstrap"]["delta"] < 0 for p in good["pairs"])
    vs = _tables(_section(md, "test"), "vs base")[0]
    assert vs["good"]["all"].endswith(" *") and vs["good"]["all"].startswith("-")
    mixed = _vs(doc, "test", "base", "mixed")
    assert mixed["mark"] in ("°", "") and not mixed["significant"] and mixed["seeds_p"] > 0.05
    # the seed spread: mean, std, min and max of the per-seed WERs
    cell = next(t for t in doc["tables"] if t["name"] == "test")["rows"]["mixed"]["all"]
    wers = [cell["seeds"][k]["wer"] for k in ("1", "2", "3")]
    assert cell["wer"] == pytest.approx(statistics.fmean(wers)) and cell["std"] == pytest.approx(statistics.stdev(wers))
    assert (cell["min"], cell["max"]) == (min(wers), max(wers))
    row = _tables(_section(md, "test"), "Experiment")[0]["mixed"]
    assert row["seeds"] == "1,2,3"
    assert row["all"].endswith(f"±{cell['std']:.1f} ({min(wers):.1f}-{max(wers):.1f})")
    # plots mark the significant points
    assert (tmp_path / "cmp" / "wer_vs_duration.png").read_bytes().startswith(PNG_MAGIC)
    assert "significant against `base` (*)" in md

    one = compare_experiments([dirs[0], dirs[1]], tmp_path / "cmp1", names=["base", "good"], baselines=["base"])
    c = _vs(json.loads((tmp_path / "cmp1" / "compare.json").read_text()), "test", "base", "good")
    assert c["test_holds"] and not c["significant"] and c["mark"] == "°" and c["seeds_p"] == 0.5
    assert " °" in _tables(_section(one.read_text(), "test"), "vs base")[0]["good"]["all"]


def test_end_to_end_p_values_agree_with_sc_stats(tmp_path):
    """sc_stats's fixture systems as experiments: compare's MAPSSWE and per-speaker sign-test p-values
    (as sc_stats prints them) are the ones in tests/fixtures/sclite/stats/sc_stats.unified."""
    def trn(name):
        return {m[2]: m[1].strip() for m in re.finditer(r"(.*)\((\S+)\)", (STATS / name).read_text())}

    refs = trn("ref.trn")
    for name in ("sysA", "sysB", "sysC"):
        hyps = trn(f"{name}.trn")
        _decode_dir(tmp_path / name, "test", [{"id": u, "ref": r, "hyp": hyps[u], "duration": 1.0} for u, r in refs.items()])
    compare_experiments([tmp_path / n for n in ("sysA", "sysB", "sysC")], tmp_path / "cmp",
                        baselines=["sysA"], sign_unit="speaker", n_boot=200)
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    lines = (STATS / "sc_stats.unified").read_text().splitlines()
    k = next(i for i, ln in enumerate(lines) if re.match(r"\|\s+MP\s+\|\| sysA\.trn", ln))
    # row sysA of the composite report: MP (MAPSSWE) then SI (sign test per speaker); cells after the
    # row name: sysA, sysB, sysC, sysD
    printed = {test: lines[k + i].split("||")[1].split("|")[1:] for i, test in enumerate(("MP", "SI"))}
    for col, name in ((1, "sysB"), (2, "sysC")):
        pair = _vs(doc, "test", "sysA", name)["pairs"][0]
        for test, ours in (("MP", pair["mapsswe"]["p_value_sctk"]), ("SI", pair["sign"]["p_value"])):
            theirs = re.search(r"<0\.001|\d\.\d{3}", printed[test][col])[0]
            if theirs == "<0.001":
                assert ours < 0.001, (test, name)
            else:
                assert ours == pytest.approx(float(theirs), abs=5e-4), (test, name)
        assert _vs(doc, "test", "sysA", name)["sign_unit"] == "speaker"


def test_speaker_blocks_from_hyp_jsonl_when_the_ids_name_none(tmp_path, caplog):
    """Ids without '-' or '_' (speechocean762's ``000030012``) name no speaker under sc_stats's rule. With
    the speaker recorded in hyp.jsonl (the decoder writes the cut's), the sign test's blocks are those
    speakers, and its figures are those of the same systems with speaker-prefixed ids (whose p-values
    the test above checks against sc_stats); without it every utterance is its own block, and compare
    says so in its log and in compare.md."""
    def trn(name):
        return {m[2]: m[1].strip() for m in re.finditer(r"(.*)\((\S+)\)", (STATS / name).read_text())}

    refs = trn("ref.trn")
    plain = {u: f"{k:06d}" for k, u in enumerate(refs)}  # spk00-01 -> 000001: no separator
    ids = {"prefixed": lambda u: {"id": u}, "recorded": lambda u: {"id": plain[u], "speaker": speaker_of(u)},
           "bare": lambda u: {"id": plain[u]}}
    cells = {}
    for variant, row_id in ids.items():
        root = tmp_path / variant
        for name in ("sysA", "sysB", "sysC"):
            hyps = trn(f"{name}.trn")
            _decode_dir(root / name, "test", [{**row_id(u), "ref": r, "hyp": hyps[u], "duration": 1.0}
                                              for u, r in refs.items()])
        caplog.clear()
        compare_experiments([root / n for n in ("sysA", "sysB", "sysC")], root / "cmp", baselines=["sysA"],
                            sign_unit="speaker", n_boot=200)
        doc = json.loads((root / "cmp" / "compare.json").read_text())
        cells[variant] = {n: _vs(doc, "test", "sysA", n) for n in ("sysB", "sysC")}
        lone = variant == "bare"
        assert ("every utterance is its own block" in (root / "cmp" / "compare.md").read_text()) is lone
        assert any("every utterance is its own block" in r.message for r in caplog.records) is lone
    n_speakers = len({speaker_of(u) for u in refs})
    assert 1 < n_speakers < len(refs)
    for name in ("sysB", "sysC"):
        recorded, prefixed, bare = (cells[v][name] for v in ("recorded", "prefixed", "bare"))
        assert recorded["pairs"][0]["sign"] == prefixed["pairs"][0]["sign"]
        assert recorded["pairs"][0]["sign"]["n_blocks"] == n_speakers and recorded["sign_unit"] == "speaker"
        assert bare["pairs"][0]["sign"]["n_blocks"] == len(refs) and bare["sign_unit"].startswith("utterance (no speakers")


def test_seed_groups_from_names_and_configs(tmp_path, caplog):
    dirs = [_synthetic_exp(tmp_path / f"cape_seed{s}", 0.2, seed=s) for s in (1, 2)] + [
        _synthetic_exp(tmp_path / "nopos", 0.2, seed=5)]
    groups = group_experiments(dirs, [d.name for d in dirs])
    assert [(g.name, g.seeds) for g in groups] == [("cape", ["1", "2"]), ("nopos", ["nopos"])]
    assert split_seed("rope+cape_seed12") == ("rope+cape", 12) and split_seed("seedless") == ("seedless", None)
    assert [g.name for g in group_experiments(dirs, [d.name for d in dirs], by_seed=False)] == [
        "cape_seed1", "cape_seed2", "nopos"]
    # a config that differs in more than the seed (train.threads may differ: it is in SEED_KEYS): no group
    other = _synthetic_exp(tmp_path / "x" / "cape_seed3", 0.2, seed=3, extra="optim: {lr: 0.1}\n")
    with caplog.at_level("WARNING"):
        groups = group_experiments(dirs[:2] + [other], ["cape_seed1", "cape_seed2", "cape_seed3"])
    assert [(g.name, g.seeds) for g in groups] == [
        ("cape_seed1", ["cape_seed1"]), ("cape_seed2", ["cape_seed2"]), ("cape_seed3", ["cape_seed3"])]
    assert re.search(r"cape_seed1 and .*cape_seed3 are named as seeds of 'cape' .* differ in optim\.lr", caplog.text)
    assert "--seed-keys" not in caplog.text  # no advice to pool a real difference
    same_seed = _synthetic_exp(tmp_path / "y" / "cape_seed4", 0.2, seed=4, train_seed=1)
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert len(group_experiments([dirs[0], same_seed], ["cape_seed1", "cape_seed4"])) == 2
    assert "both trained with train.seed=1" in caplog.text
    assert len(group_experiments([dirs[0], dirs[1]], ["cape_seed1", "cape_seed01"])) == 2
    # in the table: one row per experiment, never a mean over different configs
    md = compare_experiments(dirs[:2] + [other], tmp_path / "cmp", names=["cape_seed1", "cape_seed2", "cape_seed3"])
    assert list(_tables(md.read_text(), "Experiment")[0]) == ["cape_seed1", "cape_seed2", "cape_seed3"]


def test_seed_permutation_p():
    assert seed_permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(1 / 20)  # complete separation
    assert seed_permutation_p([4.0, 5.0, 6.0], [1.0, 2.0, 3.0]) == pytest.approx(1 / 20)  # either direction
    assert seed_permutation_p([1.0, 5.0, 3.0], [4.0, 2.0, 6.0]) > 0.05
    assert seed_permutation_p([2.0, 2.0], [2.0, 2.0]) == 1.0 and seed_permutation_p([1.0], [2.0]) == 0.5
    assert seed_permutation_p([1.0, 2.0], [3.0, 4.0]) == pytest.approx(1 / 6)  # 2 + 2 seeds never reach 0.05


def test_seed_groups_ignore_settings_that_do_not_act(tmp_path, caplog):
    """Seeds of one configuration whose config.yaml differ only where nothing acts are one group:
    SpecAugment's mask sizes with SpecAugment off in both, a key added to asrkit since one run (at
    its default in the other), and two spellings of one ``train.init_from`` path. A real difference
    next to those still splits the group."""
    base = ("specaug: {{enabled: false, freq_width: {fw}, time_masks: {tm}}}\n"
            "train: {{seed: {seed}, init_from: {init}}}\n{extra}")
    a = tmp_path / "run_seed1"
    b = tmp_path / "run_seed2"
    c = tmp_path / "c" / "run_seed3"
    for d, text in ((a, base.format(fw=27, tm=4, seed=1, init="/r/egs/x/asr1/../../mini/asr1/exp/m", extra="")),
                    (b, base.format(fw=30, tm=10, seed=2, init="/r/egs/mini/asr1/exp/m",
                                    extra="decode: {blank_penalty: 0.0}\n")),
                    (c, base.format(fw=30, tm=10, seed=3, init="/r/egs/mini/asr1/exp/m",
                                    extra="optim: {lr: 0.1}\n"))):
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(text)
    assert [(g.name, g.seeds) for g in group_experiments([a, b], ["run_seed1", "run_seed2"])] == [("run", ["1", "2"])]
    with caplog.at_level("WARNING"):
        groups = group_experiments([a, c], ["run_seed1", "run_seed3"])
    assert len(groups) == 2 and re.search(r"differ in optim\.lr \(besides the seed\)", caplog.text)
    # SpecAugment on in one of them: its sizes act, the group splits
    (b / "config.yaml").write_text(base.format(fw=30, tm=10, seed=2, init="/r/egs/mini/asr1/exp/m", extra="")
                                   .replace("enabled: false", "enabled: true"))
    assert len(group_experiments([a, b], ["run_seed1", "run_seed2"])) == 2


def test_seed_keys_let_seeds_differ_in_their_start(tmp_path, caplog):
    """Seeds of a whole pipeline (each fine-tuned from a pretrained model of its own seed) differ in
    ``train.init_from``: one row only when ``--seed-keys train.init_from`` says so; a key that is
    not a config key is refused, naming its section's keys."""
    dirs = []
    for s in (1, 2):
        d = tmp_path / f"ft_seed{s}"
        d.mkdir()
        (d / "config.yaml").write_text(f"train: {{seed: {s}, init_from: /r/mini/exp/m_s{s}}}\n")
        dirs.append(d)
    names = [d.name for d in dirs]
    with caplog.at_level("WARNING"):
        assert len(group_experiments(dirs, names)) == 2
    assert ("differ in train.init_from (besides the seed); if each seed started from a model of its own "
            "seed, give --seed-keys train.init_from") in caplog.text
    assert [(g.name, g.seeds) for g in group_experiments(dirs, names, seed_keys=["train.init_from"])] == [
        ("ft", ["1", "2"])]
    with pytest.raises(ValueError, match=r"'train.initfrom' is not a config key; the train\.\* keys are .*train\.init_from"):
        group_experiments(dirs, names, seed_keys=["train.initfrom"])
    # through the command line: the row, and the setting in compare.json / compare.md
    out = tmp_path / "cmp"
    exps = [_synthetic_exp(tmp_path / "x" / f"ft_seed{s}", 0.2, seed=s) for s in (1, 2)]
    for s, e in zip((1, 2), exps):
        (e / "config.yaml").write_text(f"train: {{seed: {s}, init_from: /m_s{s}}}\n")
    assert compare.main([*map(str, exps), "--out", str(out), "--seed-keys", "train.init_from"]) == 0
    doc = json.loads((out / "compare.json").read_text())
    assert doc["settings"]["seed_keys"] == ["train.init_from"] and list(doc["experiments"]) == ["ft"]
    assert "may also differ in `train.init_from`" in (out / "compare.md").read_text()
    assert compare.main([*map(str, exps), "--out", str(tmp_path / "bad"), "--seed-keys", "nope"]) == 1
