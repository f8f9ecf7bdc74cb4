"""Planners over a batch of initial states: each element planned on its own, the results stacked.

Every planner of ``diffmj.optim`` accepts d with leading batch dimensions S (``make_data(m, batch_shape=S)``,
``torch.stack`` of Data) and returns, for each element, what the unbatched planner returns for it, with S
prepended to every field:

- tensors and Data: ``ctrl`` [*S, T, nu], ``trajectory`` [*S, T], ``cost`` [*S], ``gains`` [*S, T, nu, ns], ...;
- ``cost_history`` [*S, I + 1], I the most iterations any element ran: an element that stopped earlier
  repeats its final cost;
- Python numbers (``iterations``, ``converged``, ``regularization``): tensors [*S] (int64, bool, float64);
- ``wall_time``: seconds for the whole batch.

The starting plan (ctrl or knots) is [K, nu], shared by every element, or [*S, K, nu], one per element.

Why not ``torch.vmap`` over the planners: iLQR's line search and regularisation schedule, predictive
sampling's choice of the best candidate and every planner's early stop are data-dependent Python control
flow (``.item()``, ``int(argmin)``), which vmap cannot trace, and ``mujoco.rollout`` is no torch operation.
Writing batched variants of those algorithms would duplicate them. So ``over_initial_states`` loops over
the elements (equal to the user's own loop by construction: the same calls in the same order, sharing
a ``torch.Generator`` as that loop would); ``gradient_shooting`` instead evaluates every element's cost and
gradient in one vmapped rollout per iteration, since a batched eager rollout costs a fraction of B single ones.
"""

from __future__ import annotations

import functools
import time
from typing import Callable, Sequence, TypeVar

import torch
from torch import Tensor

from diffmj import Data

Result = TypeVar("Result", bound=tuple)  # a planner's NamedTuple


def split_initial_states(d: Data, plan: Tensor) -> tuple[tuple[int, ...], list[Data], list[Tensor]]:
    """d's batch shape S, its elements (row-major) and each element's starting plan.

    plan: [K, nu] (shared) or [*S, K, nu]. Anything else is passed on to every element unchanged, for the
    planner's own checks to refuse.
    """
    batch = tuple(d.batch_size)
    count = len(d.reshape(-1))
    if not isinstance(plan, Tensor) or plan.dim() < 2:
        return batch, list(d.reshape(-1)), [plan] * count
    if plan.dim() > 2 and tuple(plan.shape[:-2]) != batch:
        raise ValueError(f"the starting plan has batch shape {tuple(plan.shape[:-2])}, the initial states {batch}: "
                         "give one plan [K, nu] for all of them or one per initial state")
    return batch, list(d.reshape(-1)), list(plan.expand(*batch, *plan.shape[-2:]).reshape(-1, *plan.shape[-2:]))


def stack_results(results: Sequence[Result], batch: tuple[int, ...], wall_time: float) -> Result:
    """One result with batch shape S from the results of the elements (row-major), as the module describes."""
    fields = {}
    for name, values in zip(results[0]._fields, zip(*results)):
        if name == "wall_time":
            fields[name] = wall_time
        elif name == "cost_history":
            longest = max(len(history) for history in values)
            padded = [torch.cat((history, history[-1:].expand(longest - len(history)))) for history in values]
            fields[name] = torch.stack(padded).reshape(*batch, longest)
        elif isinstance(values[0], Data):
            fields[name] = torch.stack(list(values)).reshape(*batch, *values[0].batch_size)
        elif isinstance(values[0], Tensor):
            fields[name] = torch.stack(list(values)).reshape(*batch, *values[0].shape)
        else:
            fields[name] = torch.tensor(values).reshape(batch)
    return type(results[0])(**fields)


def over_initial_states(planner: Callable[..., Result]) -> Callable[..., Result]:
    """planner(m, d, plan, ...) written for one unbatched d, extended to d with batch dimensions by a loop
    over its elements (every other argument passed to each call as given)."""

    @functools.wraps(planner)
    def mapped(m, d, plan, *args, **kwargs) -> Result:
        if not isinstance(d, Data) or not d.batch_dims:
            return planner(m, d, plan, *args, **kwargs)
        start = time.perf_counter()
        batch, states, plans = split_initial_states(d, plan)
        results = [planner(m, state, start_plan, *args, **kwargs) for state, start_plan in zip(states, plans)]
        return stack_results(results, batch, time.perf_counter() - start)

    return mapped
