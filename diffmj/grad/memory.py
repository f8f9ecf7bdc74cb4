"""How much memory a differentiable computation keeps for its backward pass."""

from __future__ import annotations

from typing import Callable

import torch


def saved_tensor_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs.

    Counted with ``torch.autograd.graph.saved_tensors_hooks``: every saved tensor counts in full,
    views and tensors saved twice included, so it bounds the tape's own memory from above.
    """
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total
