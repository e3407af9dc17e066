"""The documentation says each thing once and names only what the code has.

* No run of 40 words (outside code blocks and tables) stands in two places of the Markdown files users read
  (README.md, docs/, egs/*/asr1/README.md and RESULTS.md): a figure or paragraph has one source,
  and the others link to it. A copy that was edited since (an out-of-date duplicate) still shares
  40-word runs with its source, so it is caught too.
* The counts and names the docs state are the code's: the positional encodings (registry), the
  recipes (egs/), the `asrkit` commands (cli.COMMANDS), the mini corpus's words and voices.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHINGLE = 40  # words: about three lines of text


def user_docs() -> list[Path]:
    """The Markdown files a user reads (tracked or new), generated references excluded."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    keep = []
    for rel in sorted(set(out)):
        if rel.startswith("tests/") or rel in ("docs/cli.md", "docs/config.md"):
            continue
        if rel == "README.md" or rel.startswith("docs/") or re.match(r"egs/[^/]+/asr1/(README|RESULTS)\.md$", rel):
            if (REPO / rel).is_file():
                keep.append(REPO / rel)
    return keep


def prose(text: str) -> str:
    """The text without fenced code blocks and table rows (a table may repeat its baseline's row;
    inline code is kept: names are part of a sentence)."""
    text = re.sub(r"^```.*?^```", " ", text, flags=re.S | re.M)
    return re.sub(r"^\s*\|.*$", " ", text, flags=re.M)


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9_%.,'()\[\]/-]+", prose(text).lower())


def duplicates(texts: dict[str, str], n: int = SHINGLE) -> list[tuple[str, str, str]]:
    """(place, other place, the words) for every n-word run that occurs twice; places are
    'file' or 'file (again)' for a repeat inside one file. One entry per pair of files."""
    seen: dict[tuple[str, ...], str] = {}
    found: dict[tuple[str, str], str] = {}
    for name, text in texts.items():
        w = words(text)
        mine: set[tuple[str, ...]] = set()
        last_repeat = -n
        for i in range(len(w) - n + 1):
            key = tuple(w[i:i + n])
            if key in mine and i - last_repeat >= n:
                found.setdefault((name, name + " (again)"), " ".join(key))
                last_repeat = i
            mine.add(key)
            other = seen.get(key)
            if other is not None and other != name:
                found.setdefault((other, name), " ".join(key))
        for key in mine:
            seen.setdefault(key, name)
    return [(a, b, s) for (a, b), s in found.items()]


def test_no_paragraph_stands_in_two_places():
    texts = {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in user_docs()}
    assert "README.md" in texts and len(texts) > 5
    dups = duplicates(texts)
    assert not dups, "the same text in two places (keep one, link to it from the other):\n" + "\n".join(
        f"  {a} and {b}: \"{s[:160]}...\"" for a, b, s in dups)


def test_the_check_fails_on_a_duplicated_paragraph():
    para = ("Training is budgeted in steps, not minutes, so the same command and seed give the same model on any "
            "CPU, and the figures below are what every user gets; the maximum number of minutes stays available "
            "as a cap, and the run's information file says which limit stopped a run, and why.")
    assert len(words(para)) > SHINGLE
    assert duplicates({"a.md": "intro\n\n" + para, "b.md": "other text"}) == []
    # verbatim in two files
    assert [d[:2] for d in duplicates({"a.md": para, "b.md": "see also\n\n" + para})] == [("a.md", "b.md")]
    # a copy edited since (one word changed near the end) is still caught
    edited = para.replace("and why", "and how")
    assert [d[:2] for d in duplicates({"a.md": para, "b.md": edited})] == [("a.md", "b.md")]
    # twice in one file
    assert [d[:2] for d in duplicates({"a.md": para + "\n\n" + para})] == [("a.md", "a.md (again)")]
    # code blocks are not prose: a command may be shown twice
    block = "```bash\n" + para + "\n```\n"
    assert duplicates({"a.md": block, "b.md": block}) == []


# -- counts and names ----------------------------------------------------------------------------

def _readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def test_readme_lists_every_positional_encoding_and_only_those():
    from asrkit.model.posenc import POS_ENCODINGS
    m = re.search(r"one of the (\d+) encodings: (.*)", _readme())
    assert m, "README.md: the line 'one of the N encodings: `a`, `b`, ...' is missing"
    assert int(m.group(1)) == len(POS_ENCODINGS)
    assert re.findall(r"`([a-z_]+)`", m.group(2)) == list(POS_ENCODINGS)


def test_no_doc_states_another_number_of_encodings():
    from asrkit.model.posenc import POS_ENCODINGS
    for p in [REPO / "README.md", REPO / "docs" / "README.md", REPO / "docs" / "recipes.md",
              REPO / "docs" / "getting_started.md", REPO / "docs" / "adding_a_positional_encoding.md"]:
        for m in re.finditer(r"\b(\d+) (?:positional )?encodings\b", p.read_text(encoding="utf-8")):
            assert int(m.group(1)) == len(POS_ENCODINGS), f"{p.relative_to(REPO)}: '{m.group(0)}'"


def test_recipes_table_is_the_recipes_on_disk():
    have = sorted(p.parent.parent.name for p in (REPO / "egs").glob("*/asr1/run.sh"))
    table = re.search(r"^\| recipe \|.*?(?=^\s*$)", _readme(), flags=re.S | re.M)
    assert table, "README.md: the recipes table (first column 'recipe') is missing"
    listed = sorted(re.findall(r"^\| \[`([a-z0-9]+)`\]", table.group(0), flags=re.M))
    assert listed == have


def shell_blocks(text: str) -> list[str]:
    """The fenced code blocks of a Markdown text whose language is bash, sh or none."""
    blocks, cur, lang = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            if cur is None:
                cur, lang = [], line[3:].strip()
            else:
                if lang in ("", "bash", "sh", "console"):
                    blocks.append("\n".join(cur))
                cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def test_every_asrkit_command_named_in_the_docs_exists():
    """`asrkit X` in inline code, and command lines of code blocks, name commands that exist."""
    from asrkit.cli import COMMANDS
    bad = []
    for p in user_docs():
        text = p.read_text(encoding="utf-8")
        named = re.findall(r"`asrkit ([a-z][a-z_-]*)", text)
        for block in shell_blocks(text):
            named += re.findall(r"(?:^|&&|\||;|\$\()\s*asrkit ([a-z][a-z_-]*)", block, flags=re.M)
        bad += [f"{p.relative_to(REPO)}: asrkit {w}" for w in named if w not in COMMANDS]
    assert not bad, "commands that asrkit does not have:\n" + "\n".join(sorted(set(bad)))


def test_mini_corpus_figures_are_the_generators():
    from asrkit.data.synth import VOICES, WORDS
    for rel in ("docs/getting_started.md", "egs/mini/asr1/README.md", "egs/mini/asr1/run.sh"):
        text = (REPO / rel).read_text(encoding="utf-8")
        assert re.search(rf"\b{len(WORDS)} common English words", text), f"{rel}: the word count"
        assert re.search(rf"\b{len(VOICES)} voice", text), f"{rel}: the voice count"
        for m in re.finditer(r"\b(\d+)\+? (common English words|voices?\b)", text):
            want = len(WORDS) if m.group(2).startswith("common") else len(VOICES)
            assert int(m.group(1)) == want, f"{rel}: '{m.group(0)}' (the generator has {want})"


@pytest.mark.parametrize("page", ["README.md"])
def test_readme_is_a_product_page(page):
    text = (REPO / page).read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 220, f"{page}: {len(lines)} lines; move details to docs/"
    longest = max(len(line) for line in lines if not line.startswith("|"))
    assert longest <= 400, f"{page}: a line of {longest} characters"
    # a table cell answers in a sentence; the figures behind it live on the page it links to
    cells = [c.strip() for line in lines if line.startswith("|") for c in line.strip().strip("|").split("|")]
    widest = max(cells, key=len)
    assert len(widest) <= 300, f"{page}: a table cell of {len(widest)} characters ({widest[:60]}...); move it to docs/"
    # no dated measurements: they live on docs/results/ pages
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{page}: a dated measurement; move it to docs/results/"
    for internal in ("the issue", "issue's", "study paused"):
        assert internal not in text, f"{page}: internal wording {internal!r}"


def test_every_relative_link_resolves():
    bad = []
    for p in user_docs():
        for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", p.read_text(encoding="utf-8")):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            if not (p.parent / target).exists():
                bad.append(f"{p.relative_to(REPO)} -> {target}")
    assert not bad, "links to files that do not exist:\n" + "\n".join(bad)


def test_the_example_encoding_of_the_guide_works(monkeypatch):
    """docs/adding_a_positional_encoding.md's example, run as written: registered, it builds through
    the config, trains a step, and a padded batch gives each utterance its own outputs."""
    import torch

    from asrkit.model import build_model, posenc
    from asrkit.training.checks import load_config

    page = (REPO / "docs" / "adding_a_positional_encoding.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(# asrkit/model/posenc/logbias.py.*?)```", page, flags=re.S).group(1)
    import sys
    import types
    module = types.ModuleType("asrkit.model.posenc.logbias")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dataclasses look their module up
    exec(compile(code, "docs/adding_a_positional_encoding.md", "exec"), module.__dict__)
    cls = module.LogBias
    monkeypatch.setitem(posenc.POS_ENCODINGS, cls.name, cls)
    torch.manual_seed(0)
    cfg = load_config(None, ["encoder.pos_enc=logbias", "encoder.pos.c=5.0", "encoder.d_model=32",
                             "encoder.n_layers=2", "encoder.n_heads=2", "encoder.d_ff=64", "features.n_mels=8"])
    model = build_model(cfg, vocab_size=10)
    assert isinstance(model.encoder.pos, cls) and model.encoder.pos.opts.c == 5.0
    lengths = [96, 61]
    feats = torch.randn(2, 96, 8) * (torch.arange(96)[None, :, None] < torch.tensor(lengths)[:, None, None])
    lens = torch.tensor(lengths)
    times = torch.arange(96, dtype=torch.float32)[None, :].repeat(2, 1) * 0.01
    h, out_lens, _, _ = model.encoder(feats, lens, times)
    h.sum().backward()  # it trains: the learned rates get a gradient
    assert model.encoder.pos.rate.grad is not None and model.encoder.pos.rate.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        h, out_lens, _, _ = model.encoder(feats, lens, times)
        for b, n in enumerate(lengths):
            h1, l1, _, _ = model.encoder(feats[b:b + 1, :n], lens[b:b + 1], times[b:b + 1, :n])
            torch.testing.assert_close(h[b, :int(l1)], h1[0], atol=2e-5, rtol=1e-4)
