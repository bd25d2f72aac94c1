"""The shape of a WideResNet as plain numbers: stages, blocks, convolutions, parameters. Pure.

A ``wideresnet`` ``ModelSpec`` reads (see ``autoslapo.models.wideresnet``): ``hidden`` = the first
stage's output channels (256 in ResNet-50; the stem has ``hidden / 4``), ``ffn`` = the first stage's
bottleneck width (``hidden / 4`` x the width factor: 128 for wide_resnet50_2), both doubling at each
later stage; ``layers`` = bottleneck blocks ([3, 4, 6, 3] for 16); ``seq_len`` = the image side;
``vocab`` = the classes. The module, the spec's parameter count and the cost model all read these
functions, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoslapo.errors import ConfigError

__all__ = [
    "RESNET50_BLOCKS",
    "Conv",
    "block_convs",
    "stage_blocks",
    "stem_convs",
    "wrn_end_params",
    "wrn_params",
    "wrn_rank_params",
    "wrn_split_params",
]

#: torchvision's ResNet-50 depth: bottleneck blocks per stage.
RESNET50_BLOCKS = (3, 4, 6, 3)
EXPANSION = 4  # a bottleneck's output channels over its planes (and the stem's ``hidden / 4``)


def stage_blocks(layers: int) -> list[int]:
    """Blocks per stage for ``layers`` blocks: [3, 4, 6, 3] for 16 (ResNet-50).

    Four stages of at least one block each, the blocks beyond four shared in ResNet-50's proportions
    (2:3:5:2, largest remainder first); fewer than four blocks fill the first stages, one each
    (what ``autoslapo verify`` builds when it checks two layers).
    Raises: ConfigError for fewer than one block.
    """
    if layers < 1:
        raise ConfigError(f"a WideResNet needs at least one block: got layers={layers}; use --layers >= 1")
    if layers < len(RESNET50_BLOCKS):
        return [1] * layers
    extra = [b - 1 for b in RESNET50_BLOCKS]
    spare = layers - len(RESNET50_BLOCKS)
    share = [spare * e / sum(extra) for e in extra]
    out = [int(s) for s in share]
    by_remainder = sorted(range(len(out)), key=lambda i: (out[i] - share[i], i))
    for i in by_remainder[: spare - sum(out)]:
        out[i] += 1
    return [1 + n for n in out]


@dataclass(frozen=True)
class Conv:
    """One convolution (no bias) and the BatchNorm after it: channels, kernel side, output side.

    ``sharded``: ``"out"`` (column-parallel: output channels split over tp, with its BatchNorm),
    ``"in"`` (row-parallel: input channels split, partial sums all-reduced) or ``""`` (replicated).
    """

    cin: int
    cout: int
    k: int
    out_side: int
    sharded: str = ""

    @property
    def params(self) -> int:
        return self.k * self.k * self.cin * self.cout + 2 * self.cout  # weight + BatchNorm scale/shift

    @property
    def flops_per_sample(self) -> int:
        """Forward FLOPs for one image: 2 x K^2 x Cin x Cout x Hout x Wout."""
        return 2 * self.k * self.k * self.cin * self.cout * self.out_side**2


def _down(side: int, stride: int) -> int:
    # a k x k convolution with padding k // 2 (or a 1x1 one): ceil(side / stride)
    return (side + stride - 1) // stride


def stem_convs(hidden: int, image: int) -> tuple[Conv, int]:
    """The stem's 7x7/2 convolution and the side after its 3x3/2 max-pool."""
    side = _down(image, 2)
    return Conv(3, hidden // EXPANSION, 7, side), _down(side, 2)


def block_convs(hidden: int, ffn: int, layers: int, image: int) -> list[list[Conv]]:
    """Every bottleneck's convolutions in order (conv1, conv2, conv3, then the shortcut's if any)."""
    _, side = stem_convs(hidden, image)
    inplanes = hidden // EXPANSION
    out: list[list[Conv]] = []
    for s, n in enumerate(stage_blocks(layers)):
        width, cout = ffn * 2**s, hidden * 2**s
        for j in range(n):
            stride = 2 if (s > 0 and j == 0) else 1
            new_side = _down(side, stride)
            convs = [Conv(inplanes, width, 1, side, "out"), Conv(width, width, 3, new_side, "in"),
                     Conv(width, cout, 1, new_side)]
            if stride != 1 or inplanes != cout:
                convs.append(Conv(inplanes, cout, 1, new_side))
            out.append(convs)
            inplanes, side = cout, new_side
    return out


def wrn_end_params(hidden: int, layers: int, vocab: int) -> int:
    """Parameters outside the blocks: the stem's convolution and BatchNorm, the classifier."""
    stem, _ = stem_convs(hidden, 224)
    last = hidden * 2 ** (len(stage_blocks(layers)) - 1)
    return stem.params + last * vocab + vocab


def wrn_params(hidden: int, ffn: int, layers: int, vocab: int) -> int:
    """Parameters of the WideResNet (68,883,240 for wide_resnet50_2: 256, 128, 16, 1000)."""
    convs = sum(c.params for block in block_convs(hidden, ffn, layers, 224) for c in block)
    return convs + wrn_end_params(hidden, layers, vocab)


def wrn_split_params(hidden: int, ffn: int, layers: int) -> int:
    """Parameters tensor parallelism splits: every block's conv1 (with bn1) and conv2."""
    return sum(c.params for block in block_convs(hidden, ffn, layers, 224) for c in block if c.sharded)


def wrn_rank_params(hidden: int, ffn: int, layers: int, vocab: int, *, tp: int = 1, pp: int = 1,
                    chunks: int = 1) -> list[float]:
    """Parameters each pipeline rank holds, by rank: its chunks' blocks (chunk ``c`` on rank ``c % pp``;
    conv1 + bn1 and conv2 split over ``tp``), the stem on rank 0, the classifier on the last chunk's."""
    blocks = [sum(c.params / tp if c.sharded else c.params for c in convs)
              for convs in block_convs(hidden, ffn, layers, 224)]
    ranks = [0.0] * pp
    from autoslapo.layout import chunk_bounds  # imported here: layout imports the models package

    for c, (a, b) in enumerate(chunk_bounds(layers, chunks)):
        ranks[c % pp] += sum(blocks[a:b])
    stem, _ = stem_convs(hidden, 224)
    last = hidden * 2 ** (len(stage_blocks(layers)) - 1)
    ranks[0] += stem.params
    ranks[(chunks - 1) % pp] += last * vocab + vocab
    return ranks
