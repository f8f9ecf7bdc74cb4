"""diffmj.math's rotations and products against MuJoCo C's mju_ functions, to the bit.

MuJoCo 4 sums some of these in its own grouping ((a - b) + (c - d)); a formula
summed in another order differs in the last bit in most cases, which is enough
to make long rollouts drift apart.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

from diffmj import math

CASES = 300


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.normal(size=n)
    return x / np.linalg.norm(x)


def _mju(fn, size: int, *args: np.ndarray) -> np.ndarray:
    out = np.zeros(size)
    fn(out, *args)
    return out


@pytest.mark.parametrize("name", ["quat_mul", "rot_vec_quat", "quat_to_mat", "cross"])
def test_equals_mujoco_to_the_bit(name):
    rng = np.random.default_rng(0)
    cases = {
        "quat_mul": lambda: ((rng.normal(size=4), rng.normal(size=4)), mujoco.mju_mulQuat, 4),
        "rot_vec_quat": lambda: ((rng.normal(size=3), _unit(rng, 4)), mujoco.mju_rotVecQuat, 3),
        "quat_to_mat": lambda: ((_unit(rng, 4),), mujoco.mju_quat2Mat, 9),
        "cross": lambda: ((rng.normal(size=3), rng.normal(size=3)), mujoco.mju_cross, 3),
    }
    args, expected = [], []
    for _ in range(CASES):
        a, fn, size = cases[name]()
        args.append(a)
        expected.append(_mju(fn, size, *a))
    # all cases as one batch: the same values as one at a time
    batch = [torch.tensor(np.stack(column)) for column in zip(*args)]
    got = getattr(math, name)(*batch).reshape(CASES, -1).numpy()
    np.testing.assert_array_equal(got, np.stack(expected))


def test_broadcasting():
    """A vector [3] against quaternions [n, 4], as the stages call them, equals the per-row results."""
    rng = np.random.default_rng(1)
    v = torch.tensor(rng.normal(size=3))
    q = torch.tensor(np.stack([_unit(rng, 4) for _ in range(5)]))
    rows = torch.stack([math.rot_vec_quat(v, q[i]) for i in range(5)])
    assert torch.equal(math.rot_vec_quat(v, q), rows)
    assert torch.equal(math.quat_mul(q[:1], q), torch.stack([math.quat_mul(q[0], q[i]) for i in range(5)]))


def test_reverse_mode_jacobian_compiles_to_eager():
    """jacrev of the signed-sum products (transition Jacobians map a backward over rows so) compiled by
    inductor equals eager. Their factor gathers' backward, mapped over rows, must not be an index_add into
    an expanded zero tensor (index_select's): torch 2.13's inductor sums that over the rows (each row of the
    Jacobian was the sum of all of them); gathers by two separate index tables gave one-thread C++ that
    reads an index before declaring it."""
    rng = np.random.default_rng(2)
    q, v, i = (torch.tensor(rng.normal(size=n)) for n in (4, 3, 10))

    def products(q, v, i):
        r = math.quat_mul(q, q.flip(-1))
        w = math.rot_vec_quat(v, r)
        return torch.cat((math.quat_to_mat(r).flatten(), math.cross(w, v), math.inert_mul(i, torch.cat((w, v)))))

    def jacobian(q, v, i):
        return torch.func.jacrev(products, argnums=(0, 1, 2))(q, v, i)

    torch._dynamo.reset()
    compiled = torch.compile(jacobian, fullgraph=True)(q, v, i)
    for ours, eager in zip(compiled, jacobian(q, v, i)):
        torch.testing.assert_close(ours, eager, rtol=1e-14, atol=1e-14)
