"""Differentiating a step whose constraint solution is already known.

The implicit adjoint's derivative of the solver's qacc needs only the solution, not the
iterations that found it. Under a functorch transform (jvp, jacfwd, jacrev) the solver's loops
are Python loops (``workarounds.bounded_loop``: torch 2.13's while_loop and scan fail there),
which torch.compile unrolls to ``opt.iterations`` x ``opt.ls_iterations`` line-search steps in
one graph, and which eager runs again from the warm start. So solve the step without a
transform first, then differentiate a step that starts from that solution (its warm start) and
runs no iterations. The solver keeps a warm start whose cost is at most qacc_smooth's (it
descends from the better of the two; at the solution, up to roundoff, it is), so the
differentiated step returns the same qacc, with the implicit adjoint's tangent.
"""

from __future__ import annotations

from diffmj.types import BackwardMode, DisableBit, IntegratorType, Model


def reuses_solution(m: Model, mode: BackwardMode) -> bool:
    """Whether a step of m can be differentiated from its known solution: there are constraint rows to
    solve, the derivative is the implicit adjoint's (an unrolled one follows the iterations), and the
    integrator is not RK4 (its later stages solve at states that no earlier step solved)."""
    return m.constraint_plan.nefc > 0 and mode == BackwardMode.IMPLICIT and m.opt.integrator != IntegratorType.RK4


def from_solution(m: Model) -> Model:
    """m set to take a step's constraint solution from ``d.qacc_warmstart``: the warm start on, no solver
    iterations. Step it from ``d.replace(qacc_warmstart=solved.qacc)``, where ``solved`` is the step of m
    from d, already taken (where ``reuses_solution``)."""
    # plain ints: Dynamo cannot build a DisableBit from a symbolic int, which disableflags becomes once a compiled
    # function has seen two models that differ in it
    flags = int(m.opt.disableflags) & ~int(DisableBit.WARMSTART)
    return m.replace(opt=m.opt.replace(iterations=0, disableflags=flags))
