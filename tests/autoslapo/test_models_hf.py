"""A Hugging Face config.json becomes a ``ModelSpec`` whose model is exactly transformers' own for that
config, scheduled by its family's description; unsupported structures are refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers
from torch.utils.flop_counter import FlopCounterMode

from autoslapo.config import ScheduleConfig
from autoslapo.cost.flops import model_flops_per_sample
from autoslapo.cost.memory import stage_params
from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.build import build_config, build_model, example_batch
from autoslapo.models.families import family_description
from autoslapo.models.hf import (
    DEFAULT_SEQ_LEN,
    HF_CONFIG_KEY,
    HF_MODEL_TYPES,
    HFModelType,
    register_hf_model_type,
    spec_from_hf_config,
)
from autoslapo.models.resolve import resolve_model
from autoslapo.models.spec import ModelSpec

DATA = Path(__file__).parent / "data" / "hf"

_DECODER = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 512,
    "max_position_embeddings": 64,
}
_ENCODER = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 512,
}
# One small config per supported model_type, each with what makes it differ from its family's preset.
TINY: dict[str, dict[str, Any]] = {
    "llama": {
        **_DECODER,
        "model_type": "llama",
        "tie_word_embeddings": True,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "mistral": {**_DECODER, "model_type": "mistral", "sliding_window": 64, "head_dim": 16},
    "qwen2": {
        **_DECODER,
        "model_type": "qwen2",
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": 8,
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": None,
        "vocab_size": 512,
        "n_positions": 64,
        "n_ctx": 64,
    },
    "opt": {
        "model_type": "opt",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "ffn_dim": 256,
        "vocab_size": 512,
        "max_position_embeddings": 64,
        "word_embed_proj_dim": 64,
        "do_layer_norm_before": True,
    },
    "bert": {**_ENCODER, "model_type": "bert", "max_position_embeddings": 64, "type_vocab_size": 2},
    "albert": {**_ENCODER, "model_type": "albert", "max_position_embeddings": 64, "embedding_size": 32,
               "num_hidden_groups": 1, "inner_group_num": 1},
    "gpt_neo": {
        "model_type": "gpt_neo",
        "hidden_size": 64,
        "num_layers": 4,
        "num_heads": 4,
        "intermediate_size": None,
        "vocab_size": 512,
        "max_position_embeddings": 64,
        "window_size": 16,
        "attention_types": [[["global", "local"], 2]],
    },
    "roberta": {
        **_ENCODER,
        "model_type": "roberta",
        "max_position_embeddings": 66,
        "pad_token_id": 1,
        "type_vocab_size": 1,
    },
    # T5 v1.1's shape: gated-GeLU MLP, untied head; a deeper decoder and heads narrower than
    # hidden / heads, so every T5 key is read from the config and none is a default
    "t5": {
        "model_type": "t5",
        "d_model": 64,
        "num_layers": 2,
        "num_decoder_layers": 3,
        "num_heads": 4,
        "d_kv": 8,
        "d_ff": 96,
        "vocab_size": 512,
        "relative_attention_num_buckets": 16,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
        "eos_token_id": 1,
    },
}


def _write(tmp_path: Path, config: dict[str, Any], name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def _count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def test_every_registered_model_type_has_a_tiny_config_here() -> None:
    assert set(TINY) == set(HF_MODEL_TYPES)


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_the_built_model_is_transformers_own_model_of_the_config(model_type: str, tmp_path: Path) -> None:
    raw = TINY[model_type]
    spec = resolve_model(_write(tmp_path, raw))
    entry = HF_MODEL_TYPES[model_type]
    assert spec.family == entry.family and spec.preset == model_type
    model = build_model(spec)
    reference = getattr(transformers, entry.lm_class)(transformers.AutoConfig.for_model(**raw))
    assert type(model).__name__ == entry.lm_class
    # transformers 5 ties T5's head whatever the config says; build_model unties it as T5 v1.1 has it
    untied_t5 = spec.encoder_decoder and not spec.tied_head
    assert _count(model) == _count(reference) + (spec.vocab * spec.hidden if untied_t5 else 0)
    assert {k: v.shape for k, v in model.state_dict().items()} == {
        k: v.shape for k, v in reference.state_dict().items()
    }
    # the family's description (of each stack) finds every part it schedules
    for desc in family_description(spec).stacks():
        layer = model.get_submodule(desc.layer_path(0))
        for path in (*desc.qkv, desc.attn_out, *desc.mlp_in, desc.mlp_out, *desc.norms, *desc.cross_qkv):
            layer.get_submodule(path)
    assert model.config.use_cache is False


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_the_parameter_count_counts_biases_and_the_tied_head(model_type: str, tmp_path: Path) -> None:
    spec = resolve_model(_write(tmp_path, TINY[model_type]))
    exact = _count(build_model(spec))
    # num_params counts one norm of width hidden more than LLaMA has; every other term is exact
    assert spec.num_params() - exact == spec.hidden
    assert spec.tied_head == bool(TINY[model_type].get("tie_word_embeddings", False))


@pytest.mark.parametrize("name", ["mistral-tiny", "qwen2-tiny"])
def test_the_cost_model_counts_what_the_model_computes_and_holds(name: str) -> None:
    """FLOPs of one training step counted on CPU (eager attention, so the attention products are
    matmuls the counter sees) equal the cost model's; its parameter term holds the model's."""
    spec = resolve_model(str(DATA / f"{name}.json"), seq_len=64)
    model = build_model(spec, dropout=0.0, attn_kernel="eager")
    batch = example_batch(spec, 2)
    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    assert counter.get_total_flops() == pytest.approx(2 * model_flops_per_sample(spec), rel=1e-9)
    first, last = stage_params(spec, ScheduleConfig(precision="fp32"))
    assert first == last and 0 <= _count(model) - first <= spec.hidden  # the final norm


def test_mistral_7b_reports_its_shape_and_published_size() -> None:
    spec = resolve_model(str(DATA / "mistral-7b.json"))
    assert (spec.family, spec.hidden, spec.layers, spec.heads, spec.kv_heads, spec.ffn, spec.vocab) == (
        "llama",
        4096,
        32,
        32,
        8,
        14336,
        32000,
    )
    assert spec.max_positions == 32768 and spec.seq_len == DEFAULT_SEQ_LEN
    # Mistral-7B-v0.1 has 7,241,732,096 parameters
    assert spec.num_params() - 7_241_732_096 == spec.hidden
    same_shape = resolve_model("llama-7b", kv_heads=8, ffn=14336)
    assert spec.num_params() == same_shape.num_params()


def test_the_study_records_the_contents_not_the_path(tmp_path: Path) -> None:
    raw = TINY["mistral"]
    a = resolve_model(_write(tmp_path, raw, "a.json"))
    copy = {**raw, "transformers_version": "9.9", "_name_or_path": "elsewhere", "architectures": ["X"]}
    b = resolve_model(_write(tmp_path, copy, "b.json"))
    assert a == b and a.signature() == b.signature()
    assert str(tmp_path) not in json.dumps(a.to_dict())
    assert (
        a.extra[HF_CONFIG_KEY]["sliding_window"] == 64
        and "transformers_version" not in a.extra[HF_CONFIG_KEY]
    )
    assert ModelSpec.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    other = resolve_model(_write(tmp_path, {**raw, "rope_theta": 5e5}, "c.json"))
    assert other.signature() != a.signature()
    assert resolve_model(_write(tmp_path, raw, "d.json"), ffn=128).signature() != a.signature()


def test_shape_flags_override_the_config_and_reach_the_model(tmp_path: Path) -> None:
    spec = resolve_model(_write(tmp_path, TINY["qwen2"]), layers=3, seq_len=32, heads=8, kv_heads=4)
    model = build_model(spec)
    assert len(model.model.layers) == 3 and model.config.num_attention_heads == 8
    assert model.config.num_key_value_heads == 4 and spec.seq_len == 32
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q/k/v biases kept


def test_dropout_reaches_the_config_keys(tmp_path: Path) -> None:
    spec = resolve_model(_write(tmp_path, TINY["gpt2"]))
    config = build_config(spec, dropout=0.0)
    assert (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (0.0, 0.0, 0.0)


def test_an_unsupported_model_type_is_one_line_naming_the_supported_ones(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        resolve_model(_write(tmp_path, {**_DECODER, "model_type": "mixtral"}))
    text = str(err.value)
    assert "\n" not in text and "'mixtral'" in text
    for name in HF_MODEL_TYPES:
        assert name in text


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        ({**TINY["mistral"], "sliding_window": 16}, {}, "sliding_window must cover the sequence"),
        (TINY["mistral"], {"seq_len": 128, "max_positions": 128}, "sliding_window=64, seq_len=128"),
        ({**TINY["qwen2"], "use_sliding_window": True}, {}, "sliding_window=8, seq_len=64"),
        ({**TINY["mistral"], "head_dim": 32}, {}, "head_dim must equal hidden / heads"),
        ({**TINY["opt"], "word_embed_proj_dim": 32}, {}, "word_embed_proj_dim must equal hidden_size"),
        ({**TINY["bert"], "add_cross_attention": True}, {}, "no cross-attention"),
        (
            {k: v for k, v in TINY["llama"].items() if k != "hidden_size"},
            {},
            "needs an integer 'hidden_size'",
        ),
        ({k: v for k, v in TINY["qwen2"].items() if k != "intermediate_size"}, {}, "'intermediate_size'"),
    ],
)
def test_structures_the_family_does_not_follow_are_refused(
    config: dict[str, Any], overrides: dict[str, int], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_model(_write(tmp_path, config), **overrides)


def test_missing_optional_keys_take_the_family_defaults() -> None:
    raw = {k: v for k, v in TINY["llama"].items() if k != "num_key_value_heads"}
    spec = spec_from_hf_config({**raw, "max_position_embeddings": 8192})
    assert spec.kv_heads == spec.heads
    assert spec.seq_len == DEFAULT_SEQ_LEN and spec.max_positions == 8192
    assert spec_from_hf_config(TINY["gpt2"]).ffn == 4 * 64
    assert spec_from_hf_config(TINY["roberta"]).max_positions == 64  # the table's two padding rows


@pytest.mark.parametrize(
    ("text", "message"),
    [(None, "does not exist"), ("{not json", "is not JSON"), ("[1, 2]", "must hold a JSON object")],
)
def test_bad_files_are_usage_errors(text: str | None, message: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UsageError, match=message):
        resolve_model(str(path))


def test_a_file_that_is_not_utf8_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(UsageError, match="is not JSON \\(not UTF-8 text: byte 0\\)"):
        resolve_model(str(path))


@pytest.mark.parametrize("value", ["no", "false", 0, 1])
def test_tie_word_embeddings_must_be_a_json_boolean(value: object) -> None:
    with pytest.raises(ConfigError, match=f"'tie_word_embeddings' must be true or false: got {value!r}"):
        spec_from_hf_config({**TINY["llama"], "tie_word_embeddings": value})
    assert spec_from_hf_config({**TINY["llama"], "tie_word_embeddings": False}).extra["tie_word_embeddings"] is False


def test_a_preset_name_still_resolves_to_the_preset() -> None:
    assert resolve_model("llama-tiny", layers=4) == ModelSpec.from_name("llama-tiny", layers=4)


def test_the_registry_takes_one_reader_per_model_type(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = {
        "hidden": "d_model",
        "layers": "num_layers",
        "heads": "num_heads",
        "ffn": "d_ff",
        "vocab": "vocab_size",
    }
    entry = HFModelType("relpos", "gpt2", "GPT2LMHeadModel", keys, ("dropout_rate",), positions=512)
    monkeypatch.setitem(HF_MODEL_TYPES, "relpos", entry)
    assert register_hf_model_type(entry) is entry  # the same reader again is fine
    spec = spec_from_hf_config(
        {
            "model_type": "relpos",
            "d_model": 64,
            "num_layers": 2,
            "num_heads": 4,
            "d_ff": 128,
            "vocab_size": 512,
        }
    )
    assert (spec.max_positions, spec.seq_len, spec.ffn) == (512, 512, 128)
    with pytest.raises(ConfigError, match="already has a config reader"):
        register_hf_model_type(HFModelType("relpos", "gpt2", "GPT2Model", keys, (), positions=512))
    with pytest.raises(ConfigError, match="either a max_positions config key or positions > 0"):
        HFModelType("relpos", "gpt2", "GPT2LMHeadModel", keys, ())
    with pytest.raises(ConfigError, match="unknown family 'mamba'"):
        HFModelType("relpos", "mamba", "X", keys, (), positions=512)


def test_albert_and_gpt_neo_configs_carry_their_family_shape(tmp_path: Path) -> None:
    albert = resolve_model(_write(tmp_path, TINY["albert"]))
    assert albert.family == "albert" and albert.embedding_size == 32 and albert.shared_layers
    neo = resolve_model(_write(tmp_path, TINY["gpt_neo"]))
    assert neo.layer_attention_types() == ["global", "local", "global", "local"]
    assert neo.extra["window_size"] == 16 and neo.ffn == 4 * 64
    with pytest.raises(ConfigError, match="num_hidden_groups=1"):
        resolve_model(_write(tmp_path, {**TINY["albert"], "num_hidden_groups": 2}))
    with pytest.raises(ConfigError, match="'global' or 'local'"):
        resolve_model(_write(tmp_path, {**TINY["gpt_neo"], "attention_types": [[["sparse"], 4]]}))


def test_a_t5_config_reads_both_stacks_and_counts_what_the_model_holds() -> None:
    """Every T5 key of the config reaches the spec (and the spec's FLOPs and parameter count equal
    what the built model computes and holds); --layers moves both stacks, as for the presets."""
    spec = resolve_model(str(DATA / "t5-tiny.json"), seq_len=32)
    assert (spec.family, spec.hidden, spec.layers, spec.decoder_layers, spec.heads, spec.head_dim) == (
        "t5", 64, 2, 3, 4, 8)
    assert (spec.ffn, spec.vocab, spec.t5("buckets"), spec.gated_mlp, spec.tied_head) == (96, 512, 16, True, False)
    assert spec.decoder_seq_len == spec.seq_len == 32
    model = build_model(spec, dropout=0.0, attn_kernel="eager")
    assert _count(model) == spec.num_params()
    assert model.lm_head.weight is not model.shared.weight and not model.config.scale_decoder_outputs
    assert len(model.decoder.block) == 3 and model.encoder.block[0].layer[0].SelfAttention.q.weight.shape == (32, 64)
    with FlopCounterMode(display=False) as counter:
        model(**example_batch(spec, 2)).loss.backward()
    assert counter.get_total_flops() == pytest.approx(2 * model_flops_per_sample(spec), rel=1e-6)
    deeper = resolve_model(str(DATA / "t5-tiny.json"), layers=4)
    assert (deeper.layers, deeper.decoder_layers) == (4, 4)
    assert build_config(deeper).num_decoder_layers == 4
    with pytest.raises(ConfigError, match="is_encoder_decoder"):
        spec_from_hf_config({**TINY["t5"], "is_encoder_decoder": False})


@pytest.mark.parametrize(("change", "said"), [
    ({"num_attention_heads": 5}, "change hidden_size or num_attention_heads"),
    ({"num_key_value_heads": 3}, "use a divisor of 4 for num_key_value_heads"),
    ({"max_position_embeddings": -1}, "give a positive max_position_embeddings"),
    ({"num_attention_heads": "4"}, "got '4'; write it as a whole number (it is a str)"),
    ({"hidden_size": None}, "got null; write a whole number"),  # JSON's null, not Python's None
])
def test_a_config_shape_error_names_the_config_key_not_a_flag(change: dict[str, Any], said: str) -> None:
    """The shape rules named the CLI's flags (--heads, --kv-heads, --seq-len) that the user never passed,
    and a string where an integer belongs was "add it to the config" though it was there."""
    with pytest.raises(ConfigError) as e:
        spec_from_hf_config({"model_type": "llama", **_DECODER, **change})
    assert said in str(e.value) and "--" not in str(e.value), str(e.value)
