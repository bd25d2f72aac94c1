"""What autograd keeps for backward, measured: the cost model's activation terms are checked against it."""

from __future__ import annotations

import torch


def saved_activation_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[int, torch.Tensor | None]:
    """Bytes of the distinct storages autograd saves in one forward of ``model(**batch)`` (parameters
    and buffers left out), and the forward's loss (``None`` when it returns none)."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in own:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(**batch)
    return sum(seen.values()), getattr(out, "loss", None)
