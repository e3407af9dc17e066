"""Generate the two reference pages from the code: ``docs/cli.md`` (every command's ``--help``,
from the parsers of :data:`asrkit.cli.COMMANDS`) and ``docs/config.md`` (every config key with
its type, default and doc, from the Config dataclasses).

    python -m asrkit.cli_docs            # rewrite both
    python -m asrkit.cli_docs --check    # exit 1 naming the stale file(s) (tests/test_cli.py does this)

The output does not depend on the terminal: help is formatted 100 columns wide.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WIDTH = "100"
REGENERATE = "python -m asrkit.cli_docs"


def _help(parser: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return parser.format_help().rstrip() + "\n"
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def cli_md() -> str:
    """docs/cli.md: the top-level help, the naming conventions, then every command's --help."""
    from asrkit import cliargs
    from asrkit.cli import COMMANDS, GROUPS, build_parser, usage

    out = ["# Command-line reference", "",
           f"Generated from the parsers by `{REGENERATE}`; do not edit by hand (tests/test_cli.py fails when "
           "this page differs from what the code prints). Each section is `asrkit <command> --help`.", "",
           "```text", usage(), "```", "", "## Names shared by every command", ""]
    out += ["| concept | canonical | also accepted (old names, not shown in help) |", "| :--- | :--- | :--- |"]
    out += [f"| {c} | `{new}` | {old} |" for c, new, old in cliargs.CONVENTIONS]
    out += [""]
    for group, title in GROUPS.items():
        out += [f"## {title[0].upper()}{title[1:]}", ""]
        for name, cmd in COMMANDS.items():
            if cmd.group != group:
                continue
            out += [f"### asrkit {name}", "", cmd.help[0].upper() + cmd.help[1:] + ".", ""]
            for prog, parser in cliargs.iter_parsers(build_parser(name), f"asrkit {name}"):
                if prog != f"asrkit {name}":
                    out += [f"#### {prog}", ""]
                out += ["```text", _help(parser).rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def _cell(value: Any) -> str:
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text


def config_md() -> str:
    """docs/config.md: every key of every section, with type, default and doc."""
    from asrkit import cliargs
    from asrkit.config import config_keys

    out = ["# Configuration reference", "",
           f"Generated from the Config dataclasses (asrkit/config.py) by `{REGENERATE}`; do not edit by hand. "
           "A config is YAML with these sections; any key can also be given as `key=value` on the command line "
           "(`asrkit train --config conf/train.yaml encoder.pos_enc=cape`, or `--set encoder.pos_enc=cape`); "
           "`asrkit config FILE [key=value ...]` prints the resolved config. Unknown keys and wrong types are "
           "errors naming the key; what a value means is checked by the layer that reads it.", ""]
    section = None
    for k in config_keys():
        sec = k["key"].split(".")[0]
        if sec != section:
            section = sec
            doc = " ".join((cliargs.plain(k["section_doc"]) or "").split())
            out += ["", f"## {sec}", ""] + ([doc, ""] if doc else [])
            out += ["| key | type | default | what |", "| :--- | :--- | :--- | :--- |"]
        default = k["default"]
        shown = f"`{default!r}`" if isinstance(default, str) else f"`{default}`"
        out.append(f"| `{k['key']}` | {k['type']} | {_cell(shown)} | {_cell(cliargs.plain(k['doc']) or '')} |")
    return "\n".join(out).strip() + "\n"


def pages() -> dict[Path, str]:
    """Path (under the repository) -> generated text."""
    return {Path("docs/cli.md"): cli_md(), Path("docs/config.md"): config_md()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asrkit.cli_docs", description="Write docs/cli.md and docs/config.md.")
    p.add_argument("--check", action="store_true", help="only check that the committed pages are current")
    args = p.parse_args(argv)
    stale = []
    for rel, text in pages().items():
        path = REPO / rel
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(rel))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {rel}")
    if stale:
        print(f"stale: {', '.join(stale)}; regenerate with: {REGENERATE}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
