"""Config precedence and validation (pure)."""

import os

import pytest

from launcher.config.schema import Config, ScriptConfig, load_config, to_yaml
from launcher.config.secrets import redact
from launcher.errors import ConfigError


def test_defaults_have_the_documented_keys():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert (cfg.seed, cfg.output_dir, cfg.trainer.strategy, cfg.model.name, cfg.wandb.mode) == (0, "launcher_runs", "ddp", "mlp", "offline")
    assert cfg.trainer.steps > 0 and cfg.trainer.lr > 0 and cfg.data.batch_size > 0


def test_precedence_defaults_then_yaml_then_overrides(tmp_path):
    yaml = tmp_path / "c.yaml"
    yaml.write_text("seed: 7\ntrainer:\n  steps: 11\n  lr: 0.5\n")
    cfg = load_config(str(yaml), ["trainer.steps=3"])
    assert cfg.seed == 7  # from YAML
    assert cfg.trainer.steps == 3  # override beats YAML
    assert cfg.trainer.lr == 0.5  # YAML beats default
    assert cfg.data.batch_size == Config().data.batch_size  # default stays


def test_later_override_wins():
    assert load_config(None, ["seed=1", "seed=2"]).seed == 2


def test_shipped_config_by_name():
    assert load_config("quick").trainer.steps == 20


@pytest.mark.parametrize("override, words", [
    (["nosuch=1"], "unknown config key 'nosuch'"),
    (["trainer.stepz=1"], "unknown config key 'trainer.stepz'"),
    (["trainer.steps=abc"], "wrong type for 'trainer.steps'"),
    (["nodes=0"], "--nodes=0 must be at least 1"),
    (["wandb.mode=sometimes"], "wandb.mode=sometimes is not one of"),
    (["trainer.strategy=magic"], "trainer.strategy=magic is not one of"),
    (["trainer.lr=-1"], "must be positive"),
    (["data.dataset_size=10"], "smaller than one global batch"),
    (["justaword"], "is not key=value"),
])
def test_bad_values_name_the_problem(override, words):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(None, override)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_a_script_is_held_to_none_of_the_built_in_trainers_rules(tmp_path):
    """data.* and trainer.* are the built-in trainer's: a script run at 300 workers is no 'dataset too small'."""
    script = tmp_path / "train.py"
    script.write_text("")
    cfg = load_config(None, ["gpus=300", "data.dataset_size=10"], script=ScriptConfig(path=str(script)))
    assert cfg.script.path == str(script) and cfg.gpus == 300
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(None, [], script=ScriptConfig(path=str(tmp_path / "nosuch.py")))


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("text, words", [
    ("", "is empty"), ("# only a comment\n", "is empty"), ("- a\n- b\n", "holds a list at the top level"),
    ("3.5\n", "holds a single value (float)"), ("just words\n", "holds a single value (str)"),
])
def test_a_config_file_must_be_a_mapping(tmp_path, text, words):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as info:
        load_config(str(path))
    assert words in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("override, words", [
    (["wandb.tags=[a,b"], "do not balance"), (["slurm.extra={a: [1, 2}"], "do not balance"),
    (["trainer.lr=nan"], "not a finite number"), (["trainer.lr=-inf"], "not a finite number"),
    (["checkpoint.every_seconds=inf"], "not a finite number"), (["output_dir=~/x"], "'~' is not expanded"),
    (["run_id=../x"], "is not a name"), (["run_id=a\tb"], "control characters"),
])
def test_malformed_values_name_the_problem(override, words):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(None, override)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_balanced_lists_and_maps_still_load():
    cfg = load_config(None, ["wandb.tags=[a,b]", "slurm.extra={reservation: r1, nodes: [1, 2]}", "run_id=my.run-1_x"])
    assert cfg.wandb.tags == ["a", "b"] and cfg.slurm.extra == {"reservation": "r1", "nodes": [1, 2]}


def test_secrets_are_redacted():
    assert redact({"wandb": {"api_key": "abc", "project": "p"}}) == {"wandb": {"api_key": "<redacted>", "project": "p"}}
    assert "abc" not in to_yaml(load_config())


def test_a_recorded_config_reads_back_a_non_utf8_script_argument(tmp_path):
    """config.yaml writes such an argument as a \\uDCxx escape (libyaml cannot) and reads it back unchanged."""
    from launcher.config.schema import ScriptConfig, to_yaml

    raw = os.fsdecode(b"\xff-arg")
    cfg = load_config(None, [], script=ScriptConfig(path=__file__, args=[raw, "1e-3", "true"]))
    (tmp_path / "config.yaml").write_text(to_yaml(cfg, recorded=True), encoding="utf-8")
    assert load_config(str(tmp_path / "config.yaml")).script.args == [raw, "1e-3", "true"]


@pytest.mark.parametrize("source", ["defaults", "mlp_ddp", "quick", "overrides"])
def test_the_shipped_dict_is_omegaconfs_own_and_reads_back_equal(source, tmp_path):
    """to_dict (what workers, SLURM and Ray nodes get) is plain dataclasses.asdict: it must stay what OmegaConf
    would make of the schema, and from_dict must rebuild the same Config."""
    from omegaconf import OmegaConf

    from launcher.config.schema import from_dict, to_dict

    overrides = ["rdzv.conf={last_call_timeout: 3}", "slurm.extra={exclusive: true, nodelist: [a, b]}",
                 "trainer.steps=7", "wandb.mode=disabled"]
    cfg = {"defaults": lambda: load_config(), "overrides": lambda: load_config(overrides=overrides)}.get(
        source, lambda: load_config(source))()
    shipped = to_dict(cfg)
    assert repr(shipped) == repr(OmegaConf.to_container(OmegaConf.structured(cfg)))
    assert from_dict(shipped) == cfg
