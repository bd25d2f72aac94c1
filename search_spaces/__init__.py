"""Search spaces: one per model family (and a default), plus user files (``--space PATH``).

Pure: importing this package pulls in no optuna, ray or sqlalchemy.
"""

from __future__ import annotations

import difflib

from autoslapo.errors import UsageError
from search_spaces.bert import BERT
from search_spaces.default import DEFAULT
from search_spaces.gpt2 import GPT2
from search_spaces.llama import LLAMA
from search_spaces.space import (
    AUTO,
    ORDINAL,
    TUNABLE,
    BoundSpace,
    Invalid,
    SearchSpace,
    load_space,
    on_pace,
    space_from_dict,
)
from search_spaces.t5 import T5
from search_spaces.user import USER
from search_spaces.wideresnet import WIDERESNET

#: Family (or space name) -> its space. Families not listed use ``default``.
SPACES: dict[str, SearchSpace] = {
    "default": DEFAULT,
    "bert": BERT,
    "roberta": BERT,
    "gpt2": GPT2,
    "opt": GPT2,
    "llama": LLAMA,
    "t5": T5,
    "user": USER,
    "gpt_neo": GPT2,  # a GELU decoder like GPT-2 (pp, sp, fusion); ALBERT takes the default
    "wideresnet": WIDERESNET,
}


def get_space(name: str) -> SearchSpace:
    """The space for a family or space name (``bert``, ``llama``, ``default``...).

    Raises UsageError listing the valid names.
    """
    if name in SPACES:
        return SPACES[name]
    close = difflib.get_close_matches(name, list(SPACES), n=2, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(f"unknown search space {name!r}: valid spaces are {', '.join(SPACES)}{hint}")


def space_for(family: str, path: str | None = None) -> SearchSpace:
    """The space a study uses: the user's file if given, else the family's, else the default."""
    if path:
        return load_space(path)
    return SPACES.get(family, DEFAULT)


__all__ = [
    "AUTO", "ORDINAL", "SPACES", "TUNABLE", "BoundSpace", "Invalid", "SearchSpace", "get_space",
    "load_space", "on_pace", "space_for", "space_from_dict",
]
