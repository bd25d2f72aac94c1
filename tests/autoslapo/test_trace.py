"""trace / find / replace_subgraph on a plain MLP and a tiny HF BERT intermediate block."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from autoslapo.errors import ScheduleError
from autoslapo.schedule import create_schedule


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP()
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mlp(x))


class BiasGelu(nn.Module):
    """Megatron-style: bias kept apart from the matmul, added before GeLU."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 32, bias=False)
        self.bias = nn.Parameter(torch.randn(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x) + self.bias)


def _bert_intermediate() -> nn.Module:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertIntermediate

    torch.manual_seed(0)
    return BertIntermediate(BertConfig(hidden_size=64, intermediate_size=128))


def test_trace_swaps_graph_into_model_and_keeps_function() -> None:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 16)
    ref = net(x)
    params = {n: p for n, p in net.named_parameters()}
    sch = create_schedule(net)
    sch["mlp"].meta["mark"] = 1
    gm = sch["mlp"].trace()
    assert isinstance(net.mlp, fx.GraphModule) and net.mlp is gm and sch["mlp"].mod is gm
    assert sch["mlp"].meta["mark"] == 1 and sch["mlp"].meta["traced"]["class"] == "MLP"
    assert set(sch["mlp"].children) == {"fc1", "act", "fc2"}
    assert all(p is params[n] for n, p in net.named_parameters())
    torch.testing.assert_close(net(x), ref)
    assert sch["mlp"].trace() is gm  # idempotent


def test_find_regex_chain_and_pattern() -> None:
    sch = create_schedule(Net())
    sch["mlp"].trace()
    assert [m.targets for m in sch["mlp"].find(r"^fc\d")] == [("fc1",), ("fc2",)]
    chain = sch["mlp"].find((nn.Linear, (nn.GELU, F.gelu)))
    assert len(chain) == 1 and chain[0].targets == ("fc1", "act")
    assert [n.name for n in chain[0].inputs] == ["x"]

    bsch = create_schedule(BiasGelu())
    bsch.trace()
    found = bsch.find(lambda x, b: F.gelu(x + b))
    assert len(found) == 1 and [n.name for n in found[0].inputs] == ["proj", "bias"]


def test_replace_subgraph_with_module() -> None:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 16)
    ref = net(x)
    sch = create_schedule(net)
    sch["mlp"].trace()
    (m,) = sch["mlp"].find((nn.Linear, nn.GELU))

    class LinGelu(nn.Module):
        def __init__(self, lin: nn.Linear) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return F.gelu(self.lin(h))

    path = sch["mlp"].replace_subgraph(m, LinGelu(net.mlp.fc1), name="lin_gelu")
    assert path == "lin_gelu" and "mlp.lin_gelu" in sch and "mlp.act" not in sch
    torch.testing.assert_close(net(x), ref)
    with pytest.raises(ScheduleError, match="stale"):
        sch["mlp"].replace_subgraph(m, nn.Identity())


def test_bert_intermediate_trace_find_and_decompose() -> None:
    block = _bert_intermediate()
    x = torch.randn(2, 8, 64)
    ref = block(x)
    sch = create_schedule(block)
    sch.trace()
    (m,) = sch.find((nn.Linear, F.gelu))
    assert m.targets == ("dense", "gelu")
    torch.testing.assert_close(sch.mod(x), ref)

    sch2 = create_schedule(_bert_intermediate())
    sch2.trace(decompose=(nn.Linear,))
    found = sch2.find(lambda x, w, b: F.gelu(F.linear(x, w, b)))
    assert len(found) == 1 and found[0].targets == ("linear", "gelu")


def test_trace_export_and_leaf_modules() -> None:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 16)
    ref = net(x)
    sch2 = create_schedule(Net())
    sch2.trace(leaf_modules=["mlp"])
    assert [m.targets for m in sch2.find("mlp")] == [("mlp",)]
    sch4 = create_schedule(Net())
    sch4.trace(leaf_modules=[MLP])
    assert [m.targets for m in sch4.find("mlp")] == [("mlp",)]
    sch3 = create_schedule(net)
    sch3["mlp"].trace(method="export", example_inputs=(x,))
    torch.testing.assert_close(net(x), ref)


def test_trace_find_misuse_errors() -> None:
    sch = create_schedule(Net())
    with pytest.raises(ScheduleError, match=r"trace\(\) first"):
        sch["mlp"].find("fc")
    with pytest.raises(ScheduleError, match="'fx' or 'export'"):
        sch["mlp"].trace(method="jit")
    with pytest.raises(ScheduleError, match="example inputs"):
        sch["mlp"].trace(method="export")
    sch["mlp"].trace()
    with pytest.raises(ScheduleError, match="not a valid regex"):
        sch["mlp"].find("fc(")
    with pytest.raises(ScheduleError, match="empty op chain"):
        sch["mlp"].find(())
    other = create_schedule(Net())
    other["mlp"].trace()
    (m,) = other["mlp"].find("fc1")
    with pytest.raises(ScheduleError, match="another graph"):
        sch["mlp"].replace_subgraph(m, nn.Identity())
    (m2,) = sch["mlp"].find("fc1")
    with pytest.raises(ScheduleError, match=r"nn\.Module"):
        sch["mlp"].replace_subgraph(m2, "not a module")
