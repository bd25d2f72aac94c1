"""Tiny model files (a user's own module, ``autoslapo.models.user``) for tests in any folder.

The file's text and a function that writes it, so a test of loading, of the service's module files
or of the CLI all use the same model: a stack of Linear + ReLU blocks and a Linear head scored by
mean squared error, with the ``build`` and ``batch`` functions a model file must define.
"""

from __future__ import annotations

from pathlib import Path

_NET = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear({width}, {width}) for _ in range({blocks}))
        self.out = nn.Linear({width}, 1)

    def forward(self, x, y):
        for b in self.blocks:
            x = torch.relu(b(x))
        return ((self.out(x) - y) ** 2).mean()

def build():
    return Net()

def batch(micro_batch, seed):
    g = torch.Generator().manual_seed(seed)
    return {{"x": torch.randn(micro_batch, {width}, generator=g), "y": torch.randn(micro_batch, 1, generator=g)}}
'''


def net_source(width: int = 8, blocks: int = 2, layers: str | None = None) -> str:
    """The text of a model file: ``blocks`` Linear(width, width) + ReLU blocks in ``Net.blocks``, then a
    Linear(width, 1) head; ``layers = "<layers>"`` at the end when ``layers`` is given."""
    text = _NET.format(width=width, blocks=blocks)
    return text if layers is None else f'{text}\nlayers = "{layers}"\n'


def write_model_file(folder: Path, text: str, name: str = "net.py") -> Path:
    """Write ``text`` to ``folder / name``; returns that path."""
    path = folder / name
    path.write_text(text)
    return path
