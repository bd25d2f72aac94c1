"""fuse: Linear + GeLU and bias + GeLU regions, eager by default; compiled ones are slow tests."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoslapo.errors import ScheduleError
from autoslapo.primitives.fuse import FusedLinearGelu
from autoslapo.schedule import create_schedule
from tests.autoslapo.test_trace import BiasGelu, Net, _bert_intermediate


def _same_function(ref: nn.Module, new: nn.Module, params: dict[str, nn.Parameter], x: torch.Tensor) -> None:
    """Outputs and every parameter gradient agree (fp32 tolerance).

    ``params`` are the scheduled model's parameters by their names before scheduling: fusion moves
    them to new attribute names but keeps the very same objects.
    """
    out_r, out_n = ref(x), new(x)
    torch.testing.assert_close(out_n, out_r)
    out_r.square().sum().backward()
    out_n.square().sum().backward()
    assert {id(p) for p in new.parameters()} == {id(p) for p in params.values()}
    for n, p in ref.named_parameters():
        torch.testing.assert_close(params[n].grad, p.grad, msg=f"grad of {n}")


def test_fuse_linear_gelu_in_mlp_eager() -> None:
    torch.manual_seed(0)
    net = Net()
    ref = copy.deepcopy(net)
    params = dict(net.named_parameters())
    sch = create_schedule(net)
    sch["mlp"].trace()
    (m,) = sch["mlp"].find((nn.Linear, (nn.GELU, F.gelu)))
    fused = sch["mlp"].fuse(m)
    assert isinstance(fused, FusedLinearGelu)
    assert isinstance(net.mlp.get_submodule("fused"), FusedLinearGelu)
    assert "mlp.fused" in sch and "mlp.fc1" not in sch
    assert sch["mlp"].meta["fused"] == [{"path": "fused", "kind": "linear_gelu", "compiler": "eager"}]
    _same_function(ref, net, params, torch.randn(4, 16))


def test_fuse_shares_parameters() -> None:
    net = Net()
    w = net.mlp.fc1.weight
    sch = create_schedule(net)
    sch["mlp"].trace()
    fused = sch["mlp"].fuse(sch["mlp"].find((nn.Linear, nn.GELU))[0])
    assert fused.weight is w


def test_fuse_bias_gelu_region_eager() -> None:
    torch.manual_seed(0)
    mod = BiasGelu()
    ref = copy.deepcopy(mod)
    params = dict(mod.named_parameters())
    sch = create_schedule(mod)
    sch.trace()
    (m,) = sch.find(lambda x, b: F.gelu(x + b))
    sch.fuse(m, name="bias_gelu")
    assert "bias_gelu" in sch and sch.meta["fused"][0]["kind"] == "region"
    _same_function(ref, sch.mod, params, torch.randn(3, 16))


def test_fuse_bert_intermediate_eager() -> None:
    block = _bert_intermediate()
    ref = copy.deepcopy(block)
    params = dict(block.named_parameters())
    sch = create_schedule(block)
    sch.trace()
    (m,) = sch.find((nn.Linear, F.gelu))
    assert isinstance(sch.fuse(m), FusedLinearGelu)
    _same_function(ref, sch.mod, params, torch.randn(2, 8, 64))


def test_fuse_misuse_errors() -> None:
    sch = create_schedule(Net())
    with pytest.raises(ScheduleError, match="unknown fuse compiler 'tvm'"):
        sch["mlp"].fuse(compiler="tvm")
    with pytest.raises(ScheduleError, match="needs a compiler"):
        sch["mlp"].fuse()
    other = create_schedule(Net())
    other["mlp"].trace()
    (m,) = other["mlp"].find("fc1")
    with pytest.raises(ScheduleError, match=r"trace\(\)"):
        sch["mlp"].fuse(m)
    with pytest.raises(ScheduleError, match="needs a Linear with a bias"):
        FusedLinearGelu(nn.Linear(2, 2, bias=False))


@pytest.mark.slow
def test_fuse_compiled_inductor() -> None:
    torch.manual_seed(0)
    net = Net()
    ref = copy.deepcopy(net)
    params = dict(net.named_parameters())
    sch = create_schedule(net)
    sch["mlp"].trace()
    sch["mlp"].fuse(sch["mlp"].find((nn.Linear, nn.GELU))[0], compiler="inductor")
    _same_function(ref, net, params, torch.randn(4, 16))

    mod = Net()
    ref2 = copy.deepcopy(mod)
    params2 = dict(mod.named_parameters())
    msch = create_schedule(mod)
    assert msch["mlp"].fuse(compiler="inductor") is mod.mlp
    _same_function(ref2, mod, params2, torch.randn(4, 16))
