"""Implicit adjoint of the constraint solver: one Hessian solve at the optimum.

At the solution, the residual r(qacc, theta) = M qacc - qfrc_smooth - J' force(J qacc
- aref) vanishes (theta: M, qfrc_smooth, J, aref, D, R, frictionloss, contact
friction). The implicit function theorem gives

    d qacc = -H^-1 (dr/dtheta) d theta,    H = dr/dqacc = M + J' D J (+ cone terms),

the Newton Hessian. The backward pass solves H lambda = dL/dqacc once and pulls
-lambda back through r with one vector-Jacobian product, so its memory and time
do not depend on how many iterations the forward solve took. Forward mode
(``jvp``) applies the same identity to a tangent.

Under ``torch.compile``, PyTorch 2.13 does not apply a custom autograd.Function's
backward inside ``torch.func`` transforms (it differentiates the traced forward
instead, silently) and rejects a custom ``jvp``. There the same adjoint is
written with plain operations: qacc* + c - stop_gradient(c), with the Newton
correction c = -H^-1 r(qacc*, theta) (H and qacc* held constant; r = 0 at the
optimum so the value is unchanged) has exactly the derivative -H^-1 dr/dtheta.
The correction is traced only when a derivative may be asked for (an input
requires grad, or a torch.func transform is active): a compiled step without
gradients neither compiles nor runs it.

An explicit batch (solver.solve_qacc's ``batched``: its loops run over the whole batch, which
an autograd.Function's generated vmap rule cannot hold) takes the same correction, eager and
compiled, mapped over the batch with torch.vmap.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from diffmj.solver import (Inputs, Settings, finish, hessian_factor, input_dims, residual, settings_and_inputs,
                           solve_qacc)
from diffmj.types import Data, Model
from diffmj.workarounds import derivative_requested, elementwise


def residual_inputs(settings: Settings, x: Inputs) -> tuple[str, ...]:
    """The inputs the residual depends on: not M_chol, qacc_smooth, the warm start or the
    tolerances; frictionloss only with frictionloss rows; R only through the elliptic cones'
    friction (it otherwise just picks states). An input it does not read has no gradient, and
    torch.func.vjp's zeros for it fail inside nested transforms (a tensor of an exited level)."""
    names = ("M", "qfrc_smooth", "J", "aref", "D") + (("frictionloss",) if settings.nf else ())
    return names + ("R", "cone_friction") if x.cone_rows else names


def _residual_of(settings: Settings, x: Inputs, qacc: Tensor):
    """r(qacc, theta) as a function of the inputs named by residual_inputs."""
    names = residual_inputs(settings, x)

    def r(*theta):
        return residual(settings, x._replace(**dict(zip(names, theta))), qacc)

    return r


def _flat_like(x: Inputs, values: dict) -> list:
    """Per-leaf list in Inputs' flattening order: ``values[field]`` where given, else None."""
    out = []
    for field in Inputs._fields:
        value = values.get(field)
        if isinstance(getattr(x, field), tuple):
            out.extend(value if value is not None else [None] * len(getattr(x, field)))
        else:
            out.append(value)
    return out


@dataclass(frozen=True)
class _Static:
    """ImplicitSolve's non-tensor arguments as one pytree leaf.

    Under vmap of jvp (``jacfwd`` of a batched rollout), torch 2.13's generated vmap rule
    flattens a namedtuple argument (Settings) into its fields for the in_dims but passes one
    tangent for it, and fails on the count; a dataclass is a single leaf to both.
    """

    settings: Settings
    spec: pytree.TreeSpec


class ImplicitSolve(torch.autograd.Function):
    """qacc = argmin of MuJoCo's constrained problem, with the implicit adjoint as its derivative."""

    generate_vmap_rule = True

    @staticmethod
    def forward(static: _Static, *flat: Tensor) -> Tensor:
        return solve_qacc(static.settings, pytree.tree_unflatten(list(flat), static.spec))

    @staticmethod
    def setup_context(ctx, inputs, output):
        static, *flat = inputs
        ctx.settings, ctx.spec = static.settings, static.spec
        ctx.save_for_backward(output, *flat)
        ctx.save_for_forward(output, *flat)

    @staticmethod
    def backward(ctx, grad_qacc: Tensor):
        qacc, *flat = ctx.saved_tensors
        settings, x = ctx.settings, pytree.tree_unflatten(flat, ctx.spec)
        lam = torch.cholesky_solve(grad_qacc[..., None], hessian_factor(settings, x, qacc))[..., 0]
        names = residual_inputs(settings, x)
        _, vjp = torch.func.vjp(_residual_of(settings, x, qacc), *(getattr(x, f) for f in names))
        grads = dict(zip(names, vjp(-lam)))
        return (None, *_flat_like(x, grads))

    @staticmethod
    def jvp(ctx, _static, *tangents: Tensor | None):
        qacc, *flat = ctx.saved_tensors
        settings, x = ctx.settings, pytree.tree_unflatten(flat, ctx.spec)
        dx = pytree.tree_unflatten(list(tangents), ctx.spec)
        primals, dirs = [], []
        for field in residual_inputs(settings, x):
            value, tangent = getattr(x, field), getattr(dx, field)
            if isinstance(value, tuple):
                tangent = tuple(torch.zeros_like(v) if t is None else t for v, t in zip(value, tangent))
            elif tangent is None:
                tangent = torch.zeros_like(value)
            primals.append(value)
            dirs.append(tangent)
        _, dr = torch.func.jvp(_residual_of(settings, x, qacc), tuple(primals), tuple(dirs))
        return -torch.cholesky_solve(dr[..., None], hessian_factor(settings, x, qacc))[..., 0]


def _correction(settings: Settings, x: Inputs, constant: Inputs, qacc: Tensor) -> Tensor:
    """The Newton correction -H^-1 r(qacc, theta), H from the constant inputs. [nv]"""
    chol = hessian_factor(settings, constant, qacc)
    return -torch.cholesky_solve(residual(settings, x, qacc)[..., None], chol)[..., 0]


def _implicit_by_correction(settings: Settings, inputs: Inputs, batched: bool) -> Tensor:
    """The implicit adjoint with plain operations (see the module docstring). [nv] ([B, nv] batched)"""
    constant = pytree.tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, inputs)
    qacc = solve_qacc(settings, constant, batched=batched)
    if not derivative_requested(t for t in pytree.tree_leaves(inputs) if isinstance(t, Tensor)):
        return qacc  # without it the graph has no Hessian factor and residual to compile and run
    dims = input_dims(len(inputs.cone_rows))
    correction = elementwise(functools.partial(_correction, settings), batched, (dims, dims, 0))(inputs, constant, qacc)
    return qacc + (correction - correction.detach())


def solve_implicit(m: Model, d: Data, batched: bool = False) -> Data:
    """The constraint solve whose gradient is the implicit adjoint (BackwardMode.IMPLICIT); batched: of a
    batch [B] (solver.solve_qacc's explicit batch)."""
    settings, inputs = settings_and_inputs(m, d, batched)
    if batched or torch.compiler.is_compiling():
        qacc = _implicit_by_correction(settings, inputs, batched)
    else:
        flat, spec = pytree.tree_flatten(inputs)
        qacc = ImplicitSolve.apply(_Static(settings, spec), *flat)
    return finish(settings, inputs, qacc, d, batched)
