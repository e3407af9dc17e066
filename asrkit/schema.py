"""Typed option sections from plain mappings: the one place that turns YAML/override values into
dataclasses and says what is wrong with them. Imports nothing from asrkit (the bottom layer).

    @dataclass
    class Options:
        width: int = 3

    opts = from_dict(Options, {"width": 5}, "encoder.options.")   # ConfigError names the key

Every section of :class:`asrkit.config.Config` and every component's own options (positional
encodings, conv encoders, decoders) are read with :func:`from_dict`: unknown keys are errors that
list the valid ones, values are coerced to the field's type or rejected naming the key.
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config key or value is invalid. The message names the key (and the file, where there is one)."""


_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def _number_from_str(value: str) -> Any:
    """``"1e-3"`` -> 0.001, ``"1e6"`` -> 1000000.0: YAML 1.1 (PyYAML) reads exponents without a dot
    as strings, the most common way to write a learning rate; anything else stays as it is."""
    s = value.strip()
    if _NUMBER.match(s):
        return float(s)
    return value


def coerce(value: Any, typ: Any, key: str) -> Any:
    """Check/convert ``value`` to the dataclass field type ``typ``; :class:`ConfigError` names ``key``."""
    origin = typing.get_origin(typ)
    if typ is Any:
        return value
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        return None if value is None else coerce(value, args[0], key)
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key!r}: expected true/false, got {value!r}")
    if isinstance(value, str) and typ in (int, float):
        value = _number_from_str(value)
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"config key {key!r}: expected an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key!r}: expected a number, got {value!r}")
        if not math.isfinite(float(value)):
            raise ConfigError(f"config key {key!r}: expected a finite number, got {value!r}")
        return float(value)
    if typ is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"config key {key!r}: expected a string, got {value!r}")
        return str(value)
    if typ is list or origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"config key {key!r}: expected a list, got {value!r}")
        return value
    if typ is dict or origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r}: expected a mapping, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping (nested dataclass fields from nested mappings).
    ``prefix`` (``"encoder.pos."``) is how the section's keys are named in errors."""
    if not isinstance(data, dict):
        raise ConfigError(f"config section {prefix.rstrip('.') or '<root>'!r}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        where = prefix.rstrip(".") or "top level"
        raise ConfigError(
            f"unknown config key(s) {', '.join(repr(prefix + str(k)) for k in unknown)} in {where}; "
            f"valid keys: {', '.join(names)}"
        )
    kwargs = {}
    for name in names:
        if name not in data:
            continue
        typ = hints[name]
        if dataclasses.is_dataclass(typ):
            kwargs[name] = from_dict(typ, data[name] or {}, f"{prefix}{name}.")
        else:
            kwargs[name] = coerce(data[name], typ, prefix + name)
    return cls(**kwargs)


def set_nested(d: dict, dotted: str, value: Any) -> None:
    """``set_nested(d, "a.b.c", v)``: ``d["a"]["b"]["c"] = v``, creating sections as needed."""
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"override key {dotted!r} has an empty part; write section.key=value, e.g. optim.lr=0.001")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {dotted!r}: {p!r} is not a section")
        cur = nxt
    cur[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """``["a.b=1", "c.d=[1, 2]"]`` -> ``[("a.b", 1), ("c.d", [1, 2])]`` (values parsed as YAML).
    A value that is not valid YAML is a :class:`ConfigError` naming the override."""
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. optim.lr=0.001)")
        key, raw = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if not key:
            raise ConfigError(f"override {item!r} has no key before '='")
        try:
            value = parse_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            first = (e.problem if isinstance(e, yaml.MarkedYAMLError) and e.problem else
                     str(e).strip().splitlines()[0])
            raise ConfigError(f"override {item!r}: the value {raw!r} is not valid YAML ({first}); quote it, e.g. "
                              f"{key}='\"{raw}\"', or fix the brackets") from None
        out.append((key, value))
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys in a mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1}); keep one", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# YAML 1.1 (PyYAML) reads 1e-3, 3e1 or 1.0e5 as strings (it wants a dot and a signed exponent);
# YAML 1.2 and everyone writing a learning rate mean numbers: so do we, nested options included
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)[eE][-+]?\d+$"),
    list("-+0123456789."))


def parse_yaml(text: str):
    """YAML as asrkit reads it (configs and override values): exponent floats without a dot are
    numbers, duplicate keys are errors (``yaml.YAMLError``)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """``line L, column C: what`` of a YAML error, on one line."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        m = e.problem_mark
        what = " ".join(x for x in (e.context, e.problem) if x)
        return f"line {m.line + 1}, column {m.column + 1}: {what}"
    return " ".join(str(e).split())


def load_yaml_mapping(text: str, where: str) -> dict:
    """Parse YAML text whose top level must be a mapping (or empty); duplicate keys are errors.
    ``where`` (a file name) starts every error message."""
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML ({_yaml_problem(e)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of sections (features:, encoder:, ...), "
                          f"got a {type(data).__name__}")
    return data
