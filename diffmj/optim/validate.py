"""What the planners share at their public boundary: clear ValueErrors for bad input, the control bounds."""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import Data, Model


def check_start(m: Model, d: Data, plan: Tensor, what: str) -> None:
    """d: one unbatched Data; plan [K >= 1, nu] in the model's dtype (``what`` names it: ctrl, knots)."""
    if not isinstance(d, Data) or d.batch_dims:
        raise ValueError("d must be one unbatched diffmj.Data (the initial state)")
    if not isinstance(plan, Tensor) or plan.dim() != 2 or plan.shape[1] != m.nu or plan.shape[0] < 1:
        shape = tuple(plan.shape) if isinstance(plan, Tensor) else type(plan).__name__
        raise ValueError(f"{what} must be a tensor [>= 1, nu={m.nu}], got {shape}")
    if plan.dtype != m.dtype or d.qpos.dtype != m.dtype:
        raise ValueError(f"{what} is {plan.dtype} and d is {d.qpos.dtype}, the model is {m.dtype}")


def ctrl_bounds(m: Model) -> tuple[Tensor, Tensor]:
    """Lower and upper control bounds [nu]: ``actuator_ctrlrange`` of ctrl-limited actuators, -inf / inf of
    the others (MuJoCo clamps ctrl to them in every step)."""
    limited = torch.tensor(m.actuator_ctrllimited, dtype=torch.bool, device=m.device)
    inf = torch.full((m.nu,), torch.inf, dtype=m.dtype, device=m.device)
    return (torch.where(limited, m.actuator_ctrlrange[:, 0], -inf).detach(),
            torch.where(limited, m.actuator_ctrlrange[:, 1], inf).detach())
