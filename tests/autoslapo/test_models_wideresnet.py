"""WideResNet written in the project: torchvision's shapes and parameter count, the spec's reading of
it, its batch and loss, and how a spec's depth spreads over the four stages."""

from __future__ import annotations

import pytest
import torch

from autoslapo.errors import ConfigError
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.spec import ModelSpec
from autoslapo.models.wideresnet import WideResNet, stage_shapes
from autoslapo.models.wrn_shape import stage_blocks

# torchvision.models.wide_resnet50_2(): sum(p.numel() for p in m.parameters()) (its model card too).
TORCHVISION_WIDE_RESNET50_2 = 68_883_240


def test_wideresnet_50_2_has_torchvisions_parameter_count() -> None:
    spec = ModelSpec.from_name("wideresnet-50-2")
    assert spec.num_params() == TORCHVISION_WIDE_RESNET50_2
    with torch.device("meta"):
        model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_WIDE_RESNET50_2
    assert ModelSpec.from_name("wide_resnet50_2") == spec  # the torchvision name is an alias


def test_resnet_50_is_torchvisions_resnet50() -> None:
    """torchvision.models.resnet50(): 25,557,032 parameters (its model card); the family at width 1."""
    spec = ModelSpec.from_name("resnet50")
    assert spec.preset == "resnet-50" and spec.family == "wideresnet" and spec.ffn == 64
    with torch.device("meta"):
        model = build_model(spec)
    assert spec.num_params() == sum(p.numel() for p in model.parameters()) == 25_557_032
    assert tuple(model.blocks[0].conv2.weight.shape) == (64, 64, 3, 3)


@pytest.mark.parametrize("preset", ["wideresnet-tiny", "wideresnet-50-4", "wideresnet-50-8"])
def test_spec_parameter_count_is_the_modules(preset: str) -> None:
    spec = ModelSpec.from_name(preset)
    with torch.device("meta"):
        model = build_model(spec)
    assert spec.num_params() == sum(p.numel() for p in model.parameters())
    assert spec.layers * spec.layer_params() + spec.embedding_params() <= spec.num_params()


def test_wider_presets_grow_with_the_width_factor() -> None:
    n = [ModelSpec.from_name(f"wideresnet-50-{k}").num_params() for k in (2, 4, 8)]
    assert n[0] < n[1] < n[2]
    assert n[2] > 10 * n[0]  # the bottleneck convs dominate and grow with the width squared


def test_torchvision_layout_of_wide_resnet50_2() -> None:
    spec = ModelSpec.from_name("wideresnet-50-2")
    assert stage_shapes(spec) == [(3, 128, 256), (4, 256, 512), (6, 512, 1024), (3, 1024, 2048)]
    with torch.device("meta"):
        model = WideResNet(spec)
    first, second = model.blocks[0], model.blocks[3]
    assert tuple(model.stem.conv1.weight.shape) == (64, 3, 7, 7)
    assert tuple(first.conv1.weight.shape) == (128, 64, 1, 1) and first.downsample is not None
    assert second.conv2.stride == (2, 2) and second.conv1.stride == (1, 1)  # ResNet V1.5
    assert tuple(model.fc.weight.shape) == (1000, 2048)


@pytest.mark.parametrize(
    ("layers", "blocks"), [(16, [3, 4, 6, 3]), (4, [1, 1, 1, 1]), (2, [1, 1]), (1, [1]), (8, [2, 2, 3, 1])]
)
def test_stage_blocks(layers: int, blocks: list[int]) -> None:
    assert stage_blocks(layers) == blocks
    assert sum(stage_blocks(layers)) == layers


def test_stage_blocks_refuses_no_blocks() -> None:
    with pytest.raises(ConfigError, match="at least one block"):
        stage_blocks(0)


def test_image_batch_and_loss() -> None:
    spec = ModelSpec.from_name("wideresnet-tiny")
    batch = example_batch(spec, 3, seed=1)
    assert set(batch) == {"images", "labels"}
    assert batch["images"].shape == (3, 3, spec.seq_len, spec.seq_len) and batch["images"].dtype == torch.float32
    assert batch["labels"].dtype == torch.int64 and int(batch["labels"].max()) < spec.vocab
    assert torch.equal(example_batch(spec, 3, seed=1)["images"], batch["images"])
    model = build_model(spec, seed=0)
    out = model(**batch)
    assert out.logits.shape == (3, spec.vocab)
    assert float(out.loss) == pytest.approx(float(torch.nn.functional.cross_entropy(out.logits, batch["labels"])))
    assert model(batch["images"]).loss is None
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_same_seed_same_weights() -> None:
    spec = ModelSpec.from_name("wideresnet-tiny")
    a, b = build_model(spec, seed=3), build_model(spec, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.fc.weight, build_model(spec, seed=4).fc.weight)
