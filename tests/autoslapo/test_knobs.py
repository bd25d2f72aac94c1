"""Every knob's one declaration (``ScheduleConfig`` field metadata) against every consumer of knobs.

A new knob is declared once; these tests fail if any consumer (config checks, search spaces, the
cost model's sweep, the CLI flags, the tables, the perturbed simulator, the store's frames) misses it.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

import pytest

from autoslapo.cli import _knobs as cli_knobs
from autoslapo.cli import build_parser
from autoslapo.cluster import ClusterSpec
from autoslapo.config import KNOB, KNOBS, Knob, ScheduleConfig, config_hash, describe
from autoslapo.cost import candidate_configs
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from search_spaces import ORDINAL, TUNABLE, space_from_dict

#: A configuration where every knob is away from its default and matters (none is inert), valid for
#: MODEL on CLUSTER: each knob's pinned value below comes from here.
MODEL = ModelSpec.from_name("llama-7b")
CLUSTER = ClusterSpec(gpus=16, gpu_type="a100-80gb")
AWAY = ScheduleConfig(tp=2, pp=2, dp=4, micro_batch=2, grad_accum=4, ckpt_ratio=0.5, ckpt_placement="back",
                      zero_stage=1, attn_kernel="flash", fuse_bias_gelu=True, compile_layers=True,
                      sequence_parallel=True, pipeline_schedule="interleaved", virtual_stages=2,
                      precision="fp16", ckpt_granularity="selective", loss_kernel="chunked", norm_kernel="fused",
                      ).validate(MODEL, CLUSTER)
#: The same for the knobs of a convolutional family only (``Knob.conv_only``), which a transformer refuses.
CONV_MODEL = ModelSpec.from_name("resnet-50")
CONV_AWAY = ScheduleConfig(tp=2, pp=2, dp=4, micro_batch=2, grad_accum=4, precision="fp16",
                           channels_last=True).validate(CONV_MODEL, CLUSTER)


def away(k: Knob) -> ScheduleConfig:
    """The reference configuration that moves ``k``: CONV_AWAY for a convolutional family's knob."""
    return CONV_AWAY if k.conv_only else AWAY


def away_value(k: Knob) -> Any:
    return getattr(away(k), k.name)


def _bad(k: Knob) -> Any:
    if k.kind == "int" and k.choices:
        return max(k.choices) + 1
    return {"bool": "yes", "ratio": 1.5, "int": 0, "choice": "no-such-value"}[k.kind]


def test_every_field_is_a_declared_knob_and_the_reference_config_moves_each() -> None:
    assert [f.name for f in fields(ScheduleConfig)] == [k.name for k in KNOBS]
    for k in KNOBS:
        assert k.help and k.label and k.flag.startswith("--")
        assert away_value(k) != k.default, f"AWAY leaves {k.name} at its default"
        assert not (k.inert and k.inert(away(k).to_dict(), MODEL.layers)), f"{k.name} is inert in AWAY"
    assert all(getattr(AWAY, k.name) == k.default for k in KNOBS if k.conv_only)  # a transformer refuses them


@pytest.mark.parametrize("k", KNOBS, ids=lambda k: k.name)
def test_config_checks_every_knob(k: Knob) -> None:
    with pytest.raises(ConfigError, match=k.name):
        ScheduleConfig(**{k.name: _bad(k)})


@pytest.mark.parametrize("k", KNOBS, ids=lambda k: k.name)
def test_search_spaces_take_every_knob_but_the_derived(k: Knob) -> None:
    assert (k.name in TUNABLE) == (not k.derived)
    assert (k.name in ORDINAL) == (k.ordered and not k.derived)
    if k.derived:
        with pytest.raises(ConfigError, match="derived"):
            space_from_dict({"name": "x", "fixed": {k.name: away_value(k)}})
        return
    space = space_from_dict({"name": "x", "fixed": {k.name: away_value(k)}})
    assert space.fixed[k.name] == away_value(k)
    with pytest.raises(ConfigError, match=k.name):
        space_from_dict({"name": "x", "fixed": {k.name: _bad(k)}})


def test_a_space_canonicalises_every_inert_knob_to_its_default() -> None:
    bound = space_from_dict({"name": "x", "knobs": {"tp": [1, 2]}, "fixed": {
        k.name: getattr(AWAY, k.name) for k in KNOBS if not k.derived and k.name != "tp"}}).bind(
        MODEL, CLUSTER, global_batch=32)
    cfg = bound.derive({"tp": 1})
    assert isinstance(cfg, ScheduleConfig)
    for k in KNOBS:
        if k.inert and k.inert(cfg.to_dict(), MODEL.layers):
            assert getattr(cfg, k.name) == k.default


@pytest.mark.parametrize("k", KNOBS, ids=lambda k: k.name)
def test_the_cost_sweep_honours_every_pinned_knob(k: Knob) -> None:
    value = away_value(k)
    pins = {k.name: value}
    # Knobs that only mean something together with others are pinned with what they need.
    if k.name in ("virtual_stages", "pipeline_schedule"):
        pins.update(pipeline_schedule="interleaved", virtual_stages=2, pp=2, grad_accum=4)
    if k.name == "sequence_parallel":
        pins["tp"] = 2
    if k.name == "ckpt_placement":
        pins["ckpt_ratio"] = 0.5
    groups = list(candidate_configs(CONV_MODEL if k.conv_only else MODEL, CLUSTER, **pins))
    assert groups, f"pinning {k.name}={value!r} left no configuration"
    assert all(getattr(c, k.name) == value for g in groups for c in g)


def test_the_cost_sweep_refuses_an_unknown_knob() -> None:
    with pytest.raises(ConfigError, match="unknown knobs"):
        next(candidate_configs(MODEL, CLUSTER, tensor_parallel=2))


def _flag_args(k: Knob, value: Any) -> list[str]:
    if k.kind == "bool":
        return [k.flag, "on" if value else "off"]
    return [k.flag, str(value)]


@pytest.mark.parametrize("command", ["run", "estimate", "verify", "tune"])
def test_every_command_parses_its_knob_flags(command: cli_knobs.Command) -> None:
    taken = cli_knobs.knobs_for(command)
    expected = {"tune": [k for k in KNOBS if not k.derived], "run": [k for k in KNOBS if k.name != "dp"],
                "verify": [k for k in KNOBS if k.verify], "estimate": list(KNOBS)}[command]
    assert list(taken) == expected
    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = {s for a in sub._actions for s in a.option_strings}
    for k in taken:
        assert k.flag in flags, f"autoslapo {command} has no {k.flag}"
        args = sub.parse_args(["bert", "--gpus", "16", *_flag_args(k, away_value(k))]
                              if command != "verify" else ["bert", *_flag_args(k, away_value(k))])
        assert cli_knobs.knob_values(args, command)[k.name] == away_value(k)


def test_a_boolean_flag_alone_turns_its_knob_on() -> None:
    parser = build_parser(only="run")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    for k in (k for k in KNOBS if k.kind == "bool"):
        assert cli_knobs.knob_values(sub.parse_args(["bert", "--gpus", "2", k.flag]), "run")[k.name] is True


def test_tables_show_every_knob_that_is_set() -> None:
    for k in KNOBS:
        assert k.show(away_value(k)) in describe(away(k).to_dict()).split(), f"describe() hides {k.name}"


def test_the_perturbed_simulator_gives_every_effect_knob_a_hidden_effect() -> None:
    from tuner.evaluators import PerturbedSimEvaluator

    ev = PerturbedSimEvaluator(MODEL, CLUSTER, seed=3)
    base = ev.evaluate(AWAY).samples_per_s
    assert base > 0
    effect = {k.name for k in KNOBS if k.effect}
    assert {"tp", "pp", "micro_batch", "attn_kernel", "zero_stage"} <= effect
    for name in effect:
        assert ev._effect(name, getattr(AWAY, name)) != 1.0


def test_one_config_hash_for_the_tuner_and_the_store() -> None:
    from store import config_hash as store_hash

    d = AWAY.to_dict()
    assert AWAY.config_hash() == config_hash(d) == store_hash(d)


#: The knobs of the first knob set, as stored trials' digests were computed with them. A knob added
#: later must carry ``since > 1`` (left out of a digest while at its default); one that forgot it
#: would join this set and change every stored trial's digest (``--resume`` and the duplicate check
#: would then miss every stored trial): the golden digest below fails it.
FIRST_KNOBS = ("attn_kernel", "ckpt_placement", "ckpt_ratio", "compile_layers", "dp", "fuse_bias_gelu", "grad_accum",
               "micro_batch", "pipeline_schedule", "pp", "precision", "sequence_parallel", "tp", "virtual_stages",
               "zero_stage")
#: ``ScheduleConfig().config_hash()`` as every store has it: never to change.
DEFAULT_DIGEST = "df4225e35d2601b9c8bc7e2cccba095abcd1976f274a4c7042bc0a22ec1f9209"


def test_a_default_config_keeps_the_digest_every_store_has() -> None:
    assert sorted(k.name for k in KNOBS if k.since == 1) == sorted(FIRST_KNOBS), (
        "a knob added after the first set needs since= one more than the highest (see README, Adding a knob)")
    assert ScheduleConfig().config_hash() == DEFAULT_DIGEST


def test_knobs_added_later_leave_earlier_digests_alone() -> None:
    later = [k for k in KNOBS if k.since > 1]
    d = ScheduleConfig().to_dict()
    first = {k: v for k, v in d.items() if KNOB[k].since == 1}
    assert config_hash(d) == config_hash(first)
    for k in later:
        assert config_hash({**d, k.name: away_value(k)}) != config_hash(d)


def test_the_store_frame_has_a_column_for_every_knob() -> None:
    from autoslapo.result import TrialResult
    from store import open_store

    store = open_store("sqlite://")
    store.create_study("s", model=MODEL.to_dict(), cluster=CLUSTER.to_dict(), space_name="x", space_version="1",
                       objective="samples_per_s", backend="sim", model_signature=MODEL.signature(),
                       cluster_fingerprint=CLUSTER.fingerprint())
    store.add_new_trials("s", [(AWAY.to_dict(), TrialResult.failure("failed", "x").to_dict())])
    frame = store.to_dataframe("s")
    assert {f"config.{k.name}" for k in KNOBS} <= set(frame.columns)
    store.close()


def test_flash_attention_needs_sixteen_bit_inputs() -> None:
    # FlashAttention has fp16 and bf16 kernels only: an fp32 schedule with it would fail at its first step
    with pytest.raises(ConfigError, match=r"attn_kernel flash needs 16-bit inputs.*precision=fp32"):
        AWAY.with_(precision="fp32").validate(MODEL, CLUSTER)
    AWAY.with_(precision="bf16").validate(MODEL, CLUSTER)
    AWAY.with_(precision="fp32", attn_kernel="sdpa").validate(MODEL, CLUSTER)


def test_tables_leave_out_the_knobs_a_family_has_not() -> None:
    """``attn=sdpa`` was printed for a convolutional model, which has no attention."""
    config = ScheduleConfig(tp=1, pp=1, dp=2, micro_batch=4, grad_accum=1).to_dict()
    assert "attn=sdpa" in describe(config) and "attn=sdpa" in describe(config, "llama")
    assert "attn=" not in describe(config, "wideresnet") and "mb=4" in describe(config, "wideresnet")


def test_a_knob_reaches_a_model_file_only_where_it_says_so() -> None:
    """A knob added without ``user_file`` was searched on a user's model file, where its schedule never
    applies it: real trials spent on values that change nothing (a contributor's no-dropout knob)."""
    from dataclasses import replace as replace_spec

    from autoslapo.layout import inapplicable_knobs, user_unsupported

    user = replace_spec(MODEL, family="user")
    off = {k.name for k in KNOBS if not k.user_file}
    assert {"sequence_parallel", "loss_kernel", "compile_layers", "norm_kernel", "channels_last"} <= off
    assert off <= set(inapplicable_knobs(user, KNOBS))  # spaces and sweeps keep them at their defaults
    assert not off & set(inapplicable_knobs(MODEL, KNOBS)) - {"channels_last"}
    for k in KNOBS:
        if not k.user_file:  # and a config that sets one is refused for a file, naming it
            assert any(s.split("=")[0] == k.name for s in user_unsupported(away(k))), k.name
