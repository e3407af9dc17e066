"""The command-line conventions every ``asrkit <command>`` parser shares: one name per concept
(:data:`CONVENTIONS`: the canonical option and the old names that still parse, hidden in help).

:class:`Parser` is an ``argparse.ArgumentParser`` whose help shows every option's default,
hides the old names, and has no reStructuredText markup; its ``parse_args`` merges the two
spellings of overrides into ``args.overrides`` and resolves the experiment dir.
Standard library only: every layer may import it.
"""
from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path
from typing import Any, Optional, Sequence

#: (concept, canonical form, old forms still accepted) -- docs/cli.md shows this table
CONVENTIONS: list[tuple[str, str, str]] = [
    ("parallelism", "--nj N", "--num-jobs N, --jobs N"),
    ("experiment dir", "--exp-dir DIR", "a positional EXPDIR where a command took one (asrkit report)"),
    ("output", "--out PATH", "--output-dir (asrkit transcribe)"),
    ("input manifests", "--manifest-dir DIR", "--manifests (asrkit longform)"),
    ("sets", "--sets SET [SET ...]", "--set SET (one set, a value without '=': tune, padfree, analysis)"),
    ("config / decoding overrides", "KEY=VALUE (positional) or --set KEY=VALUE (repeatable)",
     "either form in every command that takes overrides; positional ones first"),
]

#: attribute of an argparse action listing its option strings kept for old scripts (hidden in help)
_ALIASES = "_asrkit_aliases"
_SET_DEST = "_asrkit_set_overrides"
_EXP_POS = "_asrkit_exp_dir_pos"


def plain(text: Optional[str]) -> Optional[str]:
    """``text`` without reStructuredText markup: ``:mod:`x``` -> ``x``, double back-quotes -> none."""
    if not text:
        return text
    text = re.sub(r":[a-z]+(?::[a-z]+)?:`~?([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", text)
    return re.sub(r"``([^`]*)``", r"\1", text)


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (markup stripped by :class:`Parser`); every option's help ends with its
    default unless the text already says it; old option names are hidden."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or "%(default)" in text:
            return text
        d = action.default
        if d is None or d is argparse.SUPPRESS or d is False or (isinstance(d, (str, list, tuple)) and not d):
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        return f"{text} (default: {_show(d).replace('%', '%%')})"

    def _format_action_invocation(self, action: argparse.Action) -> str:
        hidden = getattr(action, _ALIASES, ())
        if hidden:
            action = copy.copy(action)
            action.option_strings = [s for s in action.option_strings if s not in hidden]
        return super()._format_action_invocation(action)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with asrkit's conventions (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        if "description" in kwargs:
            kwargs["description"] = plain(kwargs["description"])
        if "epilog" in kwargs:
            kwargs["epilog"] = plain(kwargs["epilog"])
        super().__init__(*args, **kwargs)
        self._exp_dir_required = False
        self._legacy_set_dest: Optional[str] = None
        self._sets_required = False

    def add_subparsers(self, **kwargs: Any):  # subcommands: the same parser class and formatter
        kwargs.setdefault("parser_class", Parser)
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args: Optional[Sequence[str]] = None, namespace: Any = None):  # type: ignore[override]
        ns, extras = super().parse_known_args(args, namespace)
        if hasattr(ns, _SET_DEST):
            extra = getattr(ns, _SET_DEST) or []
            delattr(ns, _SET_DEST)
            if self._legacy_set_dest is not None:  # `--set DEV`: the old spelling of --sets DEV
                names = [v for v in extra if "=" not in v]
                extra = [v for v in extra if "=" in v]
                if names:
                    if getattr(ns, self._legacy_set_dest):
                        self.error(f"--set {names[0]}: give the set once, as --sets")
                    setattr(ns, self._legacy_set_dest, names)
            else:
                bad = [v for v in extra if "=" not in v]
                if bad:
                    self.error(f"--set {bad[0]}: expected key=value, e.g. --set decode.beam=8")
            ns.overrides = list(getattr(ns, "overrides", None) or []) + list(extra)
        if self._legacy_set_dest is not None and self._sets_required and not getattr(ns, self._legacy_set_dest):
            self.error("the following arguments are required: --sets")
        if hasattr(ns, _EXP_POS):
            pos = getattr(ns, _EXP_POS)
            delattr(ns, _EXP_POS)
            if pos is not None and ns.exp_dir is not None and Path(pos) != Path(ns.exp_dir):
                self.error(f"two experiment dirs: {pos} and --exp-dir {ns.exp_dir}; give one")
            ns.exp_dir = ns.exp_dir if ns.exp_dir is not None else (Path(pos) if pos is not None else None)
            if ns.exp_dir is None and self._exp_dir_required:
                self.error("the following arguments are required: --exp-dir")
        return ns, extras


def alias(action: argparse.Action, aliases: Sequence[str]) -> argparse.Action:
    """Mark option strings of ``action`` as old names: accepted, hidden in help."""
    setattr(action, _ALIASES, tuple(aliases))
    return action


def add_nj(p: Any, default: int = 1, help: str = "parallel processes",
           aliases: Sequence[str] = ("--num-jobs", "--jobs")) -> argparse.Action:
    """``--nj N`` (old names ``--num-jobs``, ``--jobs``); the value is ``args.nj``."""
    return alias(p.add_argument("--nj", *aliases, dest="nj", type=int, default=default, metavar="N", help=help),
                  aliases)


def add_out(p: Any, help: str, aliases: Sequence[str] = (), **kwargs: Any) -> argparse.Action:
    """``--out PATH`` (where to write; old names in ``aliases``); the value is ``args.out``."""
    kwargs.setdefault("type", Path)
    return alias(p.add_argument("--out", *aliases, dest="out", help=help, **kwargs), aliases)


def add_exp_dir(p: Parser, required: bool = True, positional: bool = False,
                help: str = "experiment directory (config, checkpoints, decode_* dirs)") -> argparse.Action:
    """``--exp-dir DIR``; with ``positional`` also a positional ``EXPDIR`` (the old form). ``args.exp_dir``."""
    if not positional:
        return p.add_argument("--exp-dir", type=Path, required=required, metavar="DIR", help=help)
    p._exp_dir_required = required
    p.add_argument(_EXP_POS, nargs="?", default=None, metavar="EXPDIR", help="the same as --exp-dir (old form)")
    return p.add_argument("--exp-dir", type=Path, default=None, metavar="DIR", help=help)


def add_sets(p: Parser, help: str, one: bool = False, required: bool = True, legacy_set: bool = False,
             **kwargs: Any) -> argparse.Action:
    """``--sets SET [SET ...]`` (``one``: exactly one set, still a list in ``args.sets``). With
    ``legacy_set`` the old ``--set SET`` (a value without ``=``) is accepted too (needs
    :func:`add_overrides` on the same parser)."""
    if legacy_set:
        p._legacy_set_dest, p._sets_required = "sets", required
        required = False
    return p.add_argument("--sets", nargs=1 if one else "+", required=required, metavar="SET", help=help, **kwargs)


def add_overrides(p: Any, help: str = "decode.* overrides, e.g. decode.method=prefix_beam decode.beam=8",
                  positional: bool = True) -> None:
    """``key=value`` overrides, positional and/or ``--set key=value`` (repeatable), merged into
    ``args.overrides`` (positional ones first)."""
    if positional:
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=help)
    p.add_argument("--set", dest=_SET_DEST, action="append", default=[], metavar="KEY=VALUE",
                   help="an override as an option (repeatable); the same as the positional KEY=VALUE")


def iter_parsers(parser: argparse.ArgumentParser, prefix: str = ""):
    """``(name, parser)`` for a parser and its subcommands' parsers, depth first."""
    yield prefix or parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from iter_parsers(sub, f"{prefix or parser.prog} {name}")
