"""``python -m autoslapo`` runs the CLI."""

from autoslapo.cli import entry

entry()
