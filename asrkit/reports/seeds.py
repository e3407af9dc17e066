"""Experiments that differ only by their training seed, grouped for ``asrkit compare``.

An experiment named ``<base>_seed<N>`` (its directory name, or its ``--names`` label) is seed
``N`` of configuration ``<base>``; all experiments with the same ``<base>`` form one group, shown
as one row of the comparison tables (mean and spread over the seeds). An experiment without the
suffix is a group of its own. The names only propose the grouping; the configs confirm it: the
``config.yaml`` of the members must be identical apart from :data:`SEED_KEYS` (the seed and
settings that change neither the model nor the data it sees), and their ``train.seed`` values
must differ. Settings that do not act are not differences: a key one config lacks (added to
asrkit since that run) compares as its default, the sub-settings of a feature switched off in
both (``specaug.*`` with ``specaug.enabled: false``) are skipped, and two spellings of one path
(``a/../b`` and ``b``) are equal. Otherwise the experiments are not seeds of one configuration: each stays a row of
its own (under its full name) and a warning names the two directories and the keys that differ,
so nothing that differs in more than the seed is ever averaged. (Members without a
``config.yaml`` are grouped by name alone, with a warning.)

Some studies seed more than the training: a fine-tuned model whose pretrained start was itself
trained with that seed (each seed's ``train.init_from`` names another model). ``seed_keys``
(``asrkit compare --seed-keys train.init_from``) adds such keys to those that may differ; they
must be config keys, and the comparison records them.

The recipes name their experiment dirs this way: ``run.sh --seeds "1 2 3" --tag T`` trains
``exp/T_seed1``... with ``train.seed=1``...
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

__all__ = ["SEED_KEYS", "Member", "Group", "split_seed", "check_seed_keys", "group_experiments"]

logger = logging.getLogger(__name__)

Pathlike = Union[str, Path]

#: config keys that may differ between seeds of one configuration
SEED_KEYS = frozenset({"train.seed", "train.threads", "data.num_workers", "train.log_interval",
                       "train.ckpt_every_steps", "train.keep_last"})

_SEED = re.compile(r"^(?P<base>.+)_seed(?P<seed>\d+)$")


def split_seed(name: str) -> tuple[str, Optional[int]]:
    """``("cape", 2)`` for ``cape_seed2``; ``(name, None)`` without the suffix."""
    m = _SEED.match(name)
    return (m["base"], int(m["seed"])) if m else (name, None)


@dataclass
class Member:
    """One experiment: its label, directory and seed (from the name; ``None`` without one)."""

    name: str
    dir: Path
    seed: Optional[int]

    @property
    def key(self) -> str:
        """How the member is named among its group's seeds: the seed, or else its name."""
        return str(self.seed) if self.seed is not None else self.name


@dataclass
class Group:
    """Experiments of one configuration (one or more seeds)."""

    name: str
    members: list[Member] = field(default_factory=list)

    @property
    def seeds(self) -> list[str]:
        return [m.key for m in self.members]


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out if d else {prefix: {}}


def _config(exp: Path) -> Optional[dict[str, Any]]:
    from asrkit.config import experiment_config

    raw = experiment_config(exp)
    if raw is None:
        return None
    try:  # every key, those added since the run at their defaults
        from asrkit.config import config_from_dict, to_dict

        raw = to_dict(config_from_dict(raw))
    except Exception:  # noqa: BLE001 - not a config of this asrkit (or a partial one): compared as written
        pass
    return {k.rstrip("."): v for k, v in _flat(raw).items()}


def _differences(a: dict[str, Any], b: dict[str, Any], extra: frozenset = frozenset()) -> list[str]:
    """The keys (outside :data:`SEED_KEYS` and ``extra``) whose values differ in a way that acts
    (module docstring)."""
    off = {k[: -len("enabled")] for k in a if k.endswith(".enabled") and a[k] is False and b.get(k) is False}

    def same(x: Any, y: Any) -> bool:
        if x == y:
            return True
        return isinstance(x, str) and isinstance(y, str) and "/" in x + y and os.path.normpath(x) == os.path.normpath(y)

    return sorted(k for k in set(a) | set(b)
                  if k not in SEED_KEYS and k not in extra and not any(k.startswith(p) for p in off) and not same(a.get(k), b.get(k)))


def _check_group(g: Group, extra: frozenset = frozenset()) -> Optional[str]:
    """Why the members of ``g`` are not seeds of one configuration (``None`` if they are)."""
    configs = {m.name: _config(m.dir) for m in g.members}
    missing = [m.dir for m in g.members if configs[m.name] is None]
    if missing:
        logger.warning("%s: no config.yaml in %s; grouped as seeds of %r by name only",
                       g.name, ", ".join(map(str, missing)), g.name)
    have = [m for m in g.members if configs[m.name] is not None]
    for m in have[1:]:
        a, b = configs[have[0].name], configs[m.name]
        diff = _differences(a, b, extra)
        if diff:
            # only a different start (train.init_from...) can be part of a seed: advise pooling then
            hint = (f"; if each seed started from a model of its own seed, give --seed-keys {','.join(diff)}"
                    if all(k.startswith("train.init") for k in diff) else "")
            return (f"{have[0].dir} and {m.dir} are named as seeds of {g.name!r} but their config.yaml "
                    f"differ in {', '.join(diff[:8])}{' ...' if len(diff) > 8 else ''} (besides the seed){hint}")
    seeds: dict[Any, Path] = {}
    for m in have:
        s = configs[m.name].get("train.seed")
        if s in seeds:
            return f"{seeds[s]} and {m.dir} both trained with train.seed={s}: they are not different seeds"
        seeds[s] = m.dir
        if m.seed is not None and s != m.seed:
            logger.warning("%s: named seed %d but trained with train.seed=%s", m.dir, m.seed, s)
    return None


def check_seed_keys(keys: Sequence[str]) -> frozenset:
    """``keys`` as a set, after checking each is a config key (``ValueError`` naming the first that
    is not, with the valid keys of its section)."""
    from asrkit.config import Config, to_dict

    valid = {k.rstrip(".") for k in _flat(to_dict(Config()))}
    for k in keys:
        if k not in valid:
            section = k.split(".")[0]
            near = sorted(v for v in valid if v.split(".")[0] == section)
            raise ValueError(f"--seed-keys: {k!r} is not a config key"
                             + (f"; the {section}.* keys are {', '.join(near)}" if near else
                                f"; config sections: {', '.join(sorted({v.split('.')[0] for v in valid}))}"))
    return frozenset(keys)


def group_experiments(
    exp_dirs: Sequence[Pathlike], names: Sequence[str], by_seed: bool = True, seed_keys: Sequence[str] = ()
) -> list[Group]:
    """Groups of ``exp_dirs`` (labelled ``names``), in order of first appearance; see the module
    docstring. With ``by_seed`` False every experiment is a group of its own; ``seed_keys``: config
    keys that may differ between seeds besides :data:`SEED_KEYS`."""
    extra = check_seed_keys(seed_keys)
    groups: dict[str, Group] = {}
    for name, d in zip(names, exp_dirs):
        base, seed = split_seed(name) if by_seed else (name, None)
        groups.setdefault(base, Group(base)).members.append(Member(name, Path(d), seed))
    out: list[Group] = []
    for g in groups.values():
        g.members.sort(key=lambda m: (m.seed is None, m.seed or 0))
        why = None
        if len(g.members) > 1 and any(m.seed is None for m in g.members):
            why = f"{g.name!r} is both an experiment name and the base name of seeds"
        elif len({m.seed for m in g.members}) < len(g.members):
            why = f"two experiments are the same seed of {g.name!r}"
        elif len(g.members) > 1:
            why = _check_group(g, extra)
        if why is None:
            out.append(g)
        else:
            logger.warning("%s: not grouped as seeds, one row each (%s)", why,
                           ", ".join(m.name for m in g.members))
            out += [Group(m.name, [Member(m.name, m.dir, None)]) for m in g.members]
    names = [g.name for g in out]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"experiment name(s) {', '.join(clash)} name both a seed group and an experiment; "
                         "give distinct --names")
    return out
