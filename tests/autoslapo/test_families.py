"""Family descriptions: one per family, every path real, and the pipeline adapter equals the model."""

from __future__ import annotations

import pytest
import torch

from autoslapo.errors import ConfigError
from autoslapo.models.adapters import pipeline_adapter
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.families import FamilyDescription, get_family, list_families
from autoslapo.models.spec import FAMILIES, ModelSpec, is_convolutional

# The transformer families, each described by a FamilyDescription; a convolutional one (WideResNet)
# has no attention, MLP or vocabulary to describe (its schedule: autoslapo.conv_plan).
DESCRIBED = sorted(f for f in FAMILIES if not is_convolutional(f))


def test_every_family_is_described_and_unknown_lists_valid() -> None:
    assert list_families() == DESCRIBED
    with pytest.raises(ConfigError, match=f"valid families are {', '.join(DESCRIBED)}") as e:
        get_family("gtp2")
    assert "did you mean 'gpt2'" in str(e.value)


def test_description_rejects_inconsistent_qkv() -> None:
    base = get_family("opt")
    with pytest.raises(ConfigError, match="three paths"):
        FamilyDescription(**{**base.__dict__, "qkv": ("self_attn.q_proj",)})
    with pytest.raises(ConfigError, match="fused"):
        FamilyDescription(**{**base.__dict__, "qkv_chunks": 3})


@pytest.mark.parametrize("family", DESCRIBED)
def test_paths_exist_in_the_built_model(family: str) -> None:
    spec = ModelSpec.from_name(f"{family}-tiny")
    model = build_model(spec)
    desc = get_family(family)
    assert desc.model_type == model.config.model_type
    modules = dict(model.named_modules())
    layers = modules[desc.layers]
    assert isinstance(layers, torch.nn.ModuleList) and len(layers) == spec.stored_layers
    for path in (desc.embed_tokens, desc.lm_head, *desc.embeddings, *desc.final):
        assert path in modules, path
    assert (modules[desc.lm_head].weight is modules[desc.embed_tokens].weight) == desc.head_tied
    layer = dict(layers[0].named_modules())
    for path in (
        desc.attention,
        *desc.qkv,
        desc.attn_out,
        desc.mlp_input,
        *desc.mlp_in,
        desc.mlp_out,
        *desc.norms,
    ):
        assert path in layer, path
    for attr in desc.attention_attrs:
        assert isinstance(getattr(layer[desc.attention], attr), int), attr
    if desc.bias_gelu is not None:
        assert desc.bias_gelu in layer


@pytest.mark.parametrize("family", [f for f in DESCRIBED if not FAMILIES[f].get("encoder_decoder")])
def test_pipeline_adapter_reproduces_the_model(family: str) -> None:
    """embed -> every layer with the rebuilt context -> final modules == the model's own logits."""
    spec = ModelSpec.from_name(f"{family}-tiny")
    model = build_model(spec, dropout=0.0, attn_kernel="eager").eval()
    ids = example_batch(spec, 2, 12)["input_ids"]
    adapter = pipeline_adapter(model)
    desc = get_family(family)
    parts = {p: model.get_submodule(p) for p in (*adapter.first_paths, *adapter.last_paths)}
    with torch.no_grad():
        hidden = adapter.embed(parts, ids)
        ctx = adapter.context(hidden)
        stored = model.get_submodule(desc.layers)
        for i in range(spec.layers):  # a shared layer (ALBERT) runs once per layer call
            hidden = adapter.layer(stored[min(i, len(stored) - 1)], hidden, ctx)
        got = adapter.head(parts, hidden)
        want = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
