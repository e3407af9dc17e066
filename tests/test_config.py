import pytest

from asrkit.config import ConfigError, dump_config, to_dict
from asrkit.training.checks import load_config, config_from_dict


def test_defaults_are_the_paper_model():
    cfg = load_config(None)
    assert (cfg.encoder.n_layers, cfg.encoder.d_model, cfg.encoder.n_heads, cfg.encoder.d_ff) == (36, 768, 4, 3072)
    assert cfg.frontend.kernel == 7 and cfg.frontend.stride == 3
    assert cfg.features.n_mels == 80 and cfg.features.hop == 0.010


def test_overrides_are_typed(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("encoder: {d_model: 128, n_heads: 4}\n")
    cfg = load_config(p, ["encoder.n_layers=3", "optim.lr=0.5", "data.train_sets=[a, b]", "encoder.pos_enc=nopos"])
    assert cfg.encoder.d_model == 128 and cfg.encoder.n_layers == 3 and cfg.optim.lr == 0.5
    assert cfg.data.train_sets == ["a", "b"] and cfg.encoder.pos_enc == "nopos"


def test_with_overrides_copies_types_and_validates():
    from asrkit.config import parse_overrides, with_overrides
    from asrkit.training.checks import validate_config

    cfg = load_config(None, ["decode.beam=5"])
    new = with_overrides(cfg, parse_overrides(["decode.beam=3", "decode.hop=0.02"]))
    assert (new.decode.beam, new.decode.hop) == (3, 0.02) and cfg.decode.beam == 5  # a copy
    with pytest.raises(ConfigError, match="decode.ctc_weight=1.5"):  # ranges: checked by the layer that reads them
        validate_config(with_overrides(cfg, [("decode.ctc_weight", 1.5)]))
    with pytest.raises(ConfigError, match="bem"):
        with_overrides(cfg, [("decode.bem", 3)])


def test_unknown_key_lists_valid_keys(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("encoder: {d_modle: 128}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "encoder.d_modle" in str(e.value) and "d_model" in str(e.value) and str(p) in str(e.value)
    with pytest.raises(ConfigError, match="unknown config key.*'trian'"):
        load_config(None, ["trian.seed=1"])


@pytest.mark.parametrize("override,needle", [
    ("encoder.d_model=abc", "encoder.d_model"),
    ("encoder.norm_first=3", "encoder.norm_first"),
    ("optim.name=sgd", "optim.name"),
    ("encoder.pos_enc=capee", "valid: "),
    ("encoder.dropout=1.5", "encoder.dropout"),
    ("encoder.n_heads=5", "divisible"),
    ("encoder.pos={foo: 1}", "encoder.pos.foo"),
])
def test_bad_values_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, [override])


def test_round_trip_through_yaml(tmp_path):
    cfg = load_config(None, ["encoder.n_layers=2", "encoder.pos_enc=nopos"])
    p = tmp_path / "resolved.yaml"
    p.write_text(dump_config(cfg))
    assert to_dict(load_config(p)) == to_dict(cfg)
    assert to_dict(config_from_dict(to_dict(cfg))) == to_dict(cfg)


def test_shipped_configs_validate():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    confs = list((root / "conf").glob("*.yaml")) + list((root / "egs").glob("*/asr1/conf/*.yaml"))
    assert confs
    for c in confs:
        if c.name in ("slurm.yaml",):
            continue
        load_config(c)


def test_retired_keys_of_old_checkpoints_still_load():
    """A checkpoint of asrkit 0.1 carries data.speed_perturb: [] (never implemented, since removed):
    it loads; a value that would have meant something is an error naming the key."""
    from asrkit.config import config_from_dict

    old = to_dict(load_config(None))
    old["data"]["speed_perturb"] = []
    assert to_dict(config_from_dict(old)) == to_dict(load_config(None))
    old["data"]["speed_perturb"] = [0.9, 1.1]
    with pytest.raises(ConfigError, match="'data.speed_perturb' was removed"):
        config_from_dict(old)


def test_bucketing_needs_two_buckets():
    """data.num_buckets=1 used to reach Lhotse's bare AssertionError; now a config error naming the key."""
    with pytest.raises(ConfigError, match="data.num_buckets=1"):
        load_config(None, ["data.num_buckets=1"])
    load_config(None, ["data.num_buckets=1", "data.sampler=padfree"])  # not read by the padding-free sampler


def test_bucket_order_is_checked_against_its_registry():
    with pytest.raises(ConfigError, match="'data.bucket_order': invalid value 'sorted'; valid: shuffle, sort"):
        load_config(None, ["data.bucket_order=sorted"])
    assert load_config(None, ["data.bucket_order=sort"]).data.bucket_order == "sort"


def test_experiment_config_reads_what_train_wrote_and_names_a_broken_file(tmp_path):
    from asrkit.config import experiment_config

    assert experiment_config(tmp_path) is None  # no config.yaml: nothing to go by
    (tmp_path / "config.yaml").write_text(dump_config(load_config(None, ["data.corpus=mini"])))
    assert experiment_config(tmp_path)["data"]["corpus"] == "mini"
    (tmp_path / "config.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match=str(tmp_path / "config.yaml")):
        experiment_config(tmp_path)
