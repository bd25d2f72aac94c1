"""``ModelSpec`` shape rules: overrides stay consistent (MLP width, key/value heads) and bounded."""

from __future__ import annotations

import pytest

from autoslapo.errors import ConfigError
from autoslapo.models.spec import FAMILIES, PRESETS, SHAPE_LIMITS, ModelSpec, mlp_width


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_follows_its_mlp_rule(name: str) -> None:
    spec = PRESETS[name]
    assert mlp_width(spec.family, spec.hidden, name) == spec.ffn
    assert spec.with_overrides(hidden=spec.hidden) == spec


@pytest.mark.parametrize(("name", "hidden", "ffn"), [
    ("gpt2", 6144, 24576), ("bert", 2048, 8192), ("roberta-base", 1536, 6144), ("opt-125m", 3072, 12288),
    ("llama-7b", 8192, 22016),  # int(8 * 8192 / 3) = 21845, up to a multiple of 256
    ("llama-13b", 2560, 6912),
    ("llama-70b", 4096, 16384),  # its own rule: x1.3 = 14198, up to a multiple of 4096
])
def test_a_new_hidden_width_brings_the_family_mlp_width(name: str, hidden: int, ffn: int) -> None:
    assert ModelSpec.from_name(name, hidden=hidden).ffn == ffn


def test_an_explicit_ffn_wins() -> None:
    assert ModelSpec.from_name("gpt2", hidden=8192, heads=64, ffn=1000).ffn == 1000
    assert ModelSpec.from_name("llama-7b", hidden=8192, ffn=20000).ffn == 20000
    assert ModelSpec.from_name("gpt2", layers=4).ffn == 3072  # width unchanged: the preset's MLP stays


def test_kv_heads_override_on_a_grouped_query_family() -> None:
    spec = ModelSpec.from_name("llama-7b", kv_heads=8)
    assert (spec.heads, spec.kv_heads) == (32, 8) and spec.num_params() < PRESETS["llama-7b"].num_params()
    assert ModelSpec.from_name("llama-70b", heads=32).kv_heads == 8  # grouped already: kv kept
    assert ModelSpec.from_name("llama-7b", heads=16, hidden=2048).kv_heads == 16  # not grouped: follows


@pytest.mark.parametrize("family", [f for f, d in FAMILIES.items() if not d["gqa"]])
def test_families_without_gqa_keep_kv_heads_equal_to_heads(family: str) -> None:
    name = next(k for k, s in PRESETS.items() if s.family == family and "tiny" not in k)
    spec = ModelSpec.from_name(name, heads=8, hidden=1024)
    assert spec.kv_heads == spec.heads == 8
    assert ModelSpec.from_name(name, kv_heads=PRESETS[name].heads).kv_heads == PRESETS[name].heads
    with pytest.raises(ConfigError, match=r"kv_heads must equal heads for .*got kv_heads=2.*drop --kv-heads"):
        ModelSpec.from_name(name, kv_heads=2)


@pytest.mark.parametrize(("overrides", "match"), [
    ({"kv_heads": 5}, r"kv_heads must divide heads.*got kv_heads=5, heads=32; use a divisor of 32"),
    ({"kv_heads": 64}, r"kv_heads must divide heads.*got kv_heads=64"),
    ({"heads": 12}, r"hidden must be divisible by heads"),
])
def test_kv_heads_rules_name_rule_value_fix(overrides: dict[str, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelSpec.from_name("llama-7b", **overrides)


@pytest.mark.parametrize("name", list(SHAPE_LIMITS))
def test_absurd_shapes_are_refused(name: str) -> None:
    limit = SHAPE_LIMITS[name]
    d = {**PRESETS["bert-base"].to_dict(), "max_positions": 0, name: limit + 1}
    with pytest.raises(ConfigError, match=rf"{name} must be at most {limit:,}.*got {limit + 1:,}.*smaller"):
        ModelSpec.from_dict(d)
    if name not in ("kv_heads", "max_positions"):  # 0 there means "as heads" / "as seq_len"
        with pytest.raises(ConfigError, match=rf"{name} must be a positive integer.*got 0"):
            ModelSpec.from_dict({**PRESETS["bert-base"].to_dict(), name: 0})
    with pytest.raises(ConfigError, match=rf"{name} must be a positive integer.*got -1"):
        ModelSpec.from_dict({**PRESETS["bert-base"].to_dict(), name: -1})


def test_bounds_are_generous() -> None:
    """The largest published shapes pass: hidden 25,600, 128 heads, 256k vocab, 10M-token contexts."""
    big = ModelSpec.from_name("llama-70b", hidden=25600, heads=128, kv_heads=8, layers=160, vocab=256_000,
                              seq_len=10_000_000)
    assert big.ffn == mlp_width("llama", 25600, "llama-70b") and big.max_positions == 10_000_000
