"""The cluster-link flags (``--intra-node-gbps --inter-node-gbps``), declared once for ``tune``,
``estimate`` and ``best``.

A device preset carries a DGX-like node's links (NVLink, one InfiniBand NIC a GPU); a cluster
whose nodes have fewer NICs, or PCIe between their devices, is described with these flags, and
the cost model prices its collectives and pipeline sends on them (``best`` keeps to the studies of
a cluster with those links).
"""

from __future__ import annotations

import argparse

from autoslapo.cluster import LINKS, link_overrides
from autoslapo.cluster import cli_flag as flag


def add_link_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--intra-node-gbps`` and ``--inter-node-gbps`` (None: the device preset's)."""
    for key, where in LINKS.items():
        parser.add_argument(flag(key), dest=key, type=float, metavar="GBPS", default=None,
                            help=f"GB/s a device, one direction, {where} (default: the device preset's)")


def link_args(args: argparse.Namespace) -> dict[str, float]:
    """The link flags given, checked (``ClusterSpec`` keyword arguments)."""
    return link_overrides({key: getattr(args, key, None) for key in LINKS}, flag)
