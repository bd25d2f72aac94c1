"""build_model / example_batch: every family's tiny preset builds, runs and is reproducible."""

from __future__ import annotations

import pytest
import torch

from autoslapo.errors import ConfigError
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.spec import FAMILIES, ModelSpec, is_convolutional

TINY = [f"{f}-tiny" for f in FAMILIES if not is_convolutional(f)]  # WideResNet: test_models_wideresnet.py
CLASSES = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "gpt2": "GPT2LMHeadModel",
    "opt": "OPTForCausalLM",
    "llama": "LlamaForCausalLM",
    "t5": "T5ForConditionalGeneration",
    "albert": "AlbertForMaskedLM",
    "gpt_neo": "GPTNeoForCausalLM",
}


@pytest.mark.parametrize("name", TINY)
def test_tiny_preset_builds_and_runs(name: str) -> None:
    spec = ModelSpec.from_name(name)
    model = build_model(spec, dropout=0.0)
    assert type(model).__name__ == CLASSES[spec.family]
    assert model.config.hidden_size == spec.hidden and model.config.num_hidden_layers == spec.layers
    batch = example_batch(spec, 2, 16)
    out = model(**batch)
    target = spec.decoder_seq_len if spec.encoder_decoder else 16  # T5 predicts the target sequence
    assert out.logits.shape == (2, target, spec.vocab)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_same_seed_same_weights_other_seed_differs() -> None:
    spec = ModelSpec.from_name("llama-tiny")
    a, b, c = build_model(spec, seed=3), build_model(spec, seed=3), build_model(spec, seed=4)
    pa, pb, pc = dict(a.named_parameters()), dict(b.named_parameters()), dict(c.named_parameters())
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert not torch.equal(
        pa["model.layers.0.self_attn.q_proj.weight"], pc["model.layers.0.self_attn.q_proj.weight"]
    )


def test_build_does_not_move_callers_rng() -> None:
    torch.manual_seed(11)
    want = torch.rand(3)
    torch.manual_seed(11)
    build_model(ModelSpec.from_name("gpt2-tiny"))
    assert torch.equal(torch.rand(3), want)


def test_llama_gqa_shapes() -> None:
    spec = ModelSpec.from_name("llama-tiny")
    model = build_model(spec)
    attn = model.model.layers[0].self_attn
    assert model.config.num_key_value_heads == spec.kv_heads == 2
    assert attn.k_proj.weight.shape == (spec.kv_heads * spec.head_dim, spec.hidden)
    assert attn.q_proj.weight.shape == (spec.hidden, spec.hidden)


def test_meta_device_builds_big_presets_without_memory() -> None:
    with torch.device("meta"):
        model = build_model(ModelSpec.from_name("llama-70b"))
    assert all(p.is_meta for p in model.parameters())
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - ModelSpec.from_name("llama-70b").num_params()) / n < 0.01
    m2 = build_model(ModelSpec.from_name("opt-1.3b"), device="meta")
    assert next(m2.parameters()).is_meta


def test_overrides_dropout_dtype_and_kernel() -> None:
    spec = ModelSpec.from_name("bert-tiny", layers=1, heads=2)
    model = build_model(spec, dropout=0.0, dtype=torch.float64, attn_kernel="eager")
    assert len(model.bert.encoder.layer) == 1 and model.config.num_attention_heads == 2
    assert model.config.hidden_dropout_prob == 0.0 and next(model.parameters()).dtype == torch.float64
    assert model.config._attn_implementation == "eager"
    assert build_model(ModelSpec.from_name("bert-tiny")).config.hidden_dropout_prob == 0.1  # family default
    with pytest.raises(ConfigError, match="attn_kernel must be one of"):
        build_model(spec, attn_kernel="fast")


def test_example_batch_labels() -> None:
    causal = example_batch(ModelSpec.from_name("gpt2-tiny"), 3, 10, seed=1)
    assert causal["input_ids"].shape == (3, 10) and torch.equal(causal["labels"], causal["input_ids"])
    assert int(causal["input_ids"].min()) >= 3
    mlm = example_batch(ModelSpec.from_name("bert-tiny"), 3, 10, seed=1)
    labelled = mlm["labels"] != -100
    assert labelled[:, 0].all() and not labelled.all()
    assert torch.equal(mlm["labels"][labelled], mlm["input_ids"][labelled])
    assert torch.equal(
        example_batch(ModelSpec.from_name("bert-tiny"), 3, 10, seed=1)["labels"], mlm["labels"]
    )
    with pytest.raises(ConfigError, match="seq_len"):
        example_batch(ModelSpec.from_name("gpt2-tiny"), 1, 5000)
