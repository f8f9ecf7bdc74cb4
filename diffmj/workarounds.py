"""Workarounds for torch.compile and torch.func, each named after what it works around.

The physics stages never call these for their own sake: they exist because of how
PyTorch 2.13 compiles or transforms the code, and each says which behaviour it
answers, so it can go when PyTorch changes. They give exactly the values the
plain code would.

* ``canonical_layout``: a compiled step fed its own output must not recompile.
* ``ScalarInputs``: 0-dim float64 inputs make a compiled function trace twice (pytorch/pytorch#140346).
* ``library_guard_filter``: a compiled step checks thousands of guards on library globals at every call.
* ``add_at_distinct`` / ``add_blocks`` / ``sum_at``: the scatter-adds of the physics,
  written so that no ``index_add`` reaches inductor's CPU code (pytorch/pytorch#191837). Nor does
  ``index_select`` appear in differentiated code: a backward mapped over rows of cotangents
  (reverse-mode Jacobians) is an index_add into an expanded zero tensor, which 2.13's inductor sums
  over the mapped rows; indexing and gather are compiled right (tests/test_math.py, test_collision_primitive.py).
* ``transform_active`` / ``all_true`` / ``unwrapped``: functorch's wrappers, read in eager mode only,
  for which no public API exists; ``derivative_requested``: whether autograd or a
  transform may differentiate, which under compile decides whether the implicit
  adjoint's correction is traced at all.
* ``bounded_loop``: a loop whose body Dynamo traces once (torch._higher_order_ops'
  while_loop / scan), so compile time does not grow with the iteration count.
* ``Literal`` / ``literal``: constant tables that inductor also compiles inside a loop's body.
* ``elementwise``: an explicit batch, for a while_loop that stops when the whole batch is done:
  2.13's while_loop has no vmap rule, so the loop runs over the batch and only its body's
  per-element pieces are vmapped (``torch.vmap`` of a step falls back to ``scan``'s full count);
  mapped at a functorch vmap level directly, as torch.vmap's pytree handling (which tensordict
  patches) cost more than the pieces; ``record_from_entries`` builds a Data without tensordict's checks,
  ``fields_read_directly`` reads its fields without them.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import TYPE_CHECKING, Callable, NamedTuple

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDict
from torch import Tensor
from torch._C._functorch import TransformType
from torch._functorch.predispatch import _add_batch_dim, _remove_batch_dim
from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter
from torch._functorch.vmap import vmap_increment_nesting
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

if TYPE_CHECKING:  # only annotations: this module sits below every physics module (math imports it)
    from diffmj.types import Data, Model


def canonical_layout(out: Data, d: Data) -> Data:
    """out with every field its own contiguous tensor, dependent on the state d (exactly: adds zeros).

    A compiled step guards on its inputs' strides and on none of them being the same tensor,
    so a step fed its own output compiles a second graph unless the output is laid out like
    make_data's. Under torch.vmap, an output may come back transposed (batched matmuls), and
    one that does not depend on the batch (a model constant in some models: joint
    transmissions' moment arms, fixed tendons' Jacobians, the static candidate contacts'
    parameters) comes back as a stride-0 expanded view. Fields equal to another (qacc,
    qacc_warmstart and, without constraints, qacc_smooth) would come back as one buffer if
    the zero added were a known constant: inductor drops `x + 0` and `clone` as no-ops and
    folds `t * 0` (an int zero) to 0, so the zero is d.time * 0.0, which it keeps (d.time detached:
    a field requires grad only where it did, so a step's input and output agree on that, another thing
    a compiled step guards on). An empty
    field (site_xmat of a model without sites) is passed through from d: inductor may give
    a fresh empty tensor stride 0, and it holds nothing.
    """
    zeros = {}

    def canonical(field: Tensor, like: Tensor) -> Tensor:
        if field.numel() == 0 and field.shape == like.shape and field.dtype == like.dtype:
            return like
        if field.dtype not in zeros:
            zeros[field.dtype] = (d.time.detach() * 0.0).to(field.dtype)
        return (field + zeros[field.dtype]).contiguous()

    def each_field(record, like):  # out.apply(canonical, d) at Data.replace's cost (a tenth, traced)
        changes = {}
        for field in dataclasses.fields(record):
            value, like_value = getattr(record, field.name), getattr(like, field.name)
            changes[field.name] = (canonical(value, like_value) if isinstance(value, Tensor)
                                   else each_field(value, like_value))  # the nested Contact
        return record.replace(**changes)

    return each_field(out, d)


def restarts_compile(x) -> bool:
    """Whether x, an input of a compiled function, makes torch 2.13 restart the compile (ScalarInputs)."""
    return isinstance(x, Tensor) and x.dim() == 0 and x.dtype == torch.float64 and x.device.type == "cpu"


def _with_fields(obj, changes: dict):
    """A frozen dataclass with some fields replaced, without its __init__: a Model's takes 0.4 ms."""
    new = copy.copy(obj)
    for name, value in changes.items():
        object.__setattr__(new, name, value)
    return new


class ScalarInputs(NamedTuple):
    """The 0-dim float64 CPU tensors of a Model (``opt.timestep``, ...) and a Data (an unbatched ``time``), by
    field name, which a compiled function takes as [1] views (``lift``, outside) and reshapes back
    (``restore``, first thing inside).

    torch 2.13 gives each 0-dim float64 CPU input of a compiled graph a symbolic float, which the graph does
    not use; AOTAutograd's tensorify pass then specialises it by restarting the whole compile (Dynamo's trace
    and AOTAutograd's) once per process, until ``torch._dynamo.reset()`` (pytorch/pytorch#140346;
    ``TENSORIFY_PYTHON_SCALARS=0`` turns the pass off). For a contact model's step that is a quarter of an
    aot_eager compile and 25-37 s of the hopper's inductor compile (benchmarks/README.md, "Where compile
    time goes"). As [1] views they are plain inputs, differentiable through the view."""

    option: tuple[str, ...]
    model: tuple[str, ...]
    data: tuple[str, ...]

    @classmethod
    def of(cls, m: Model, d: Data) -> ScalarInputs:
        """The fields of m, m.opt and d that are 0-dim float64 tensors on the CPU."""

        def named(obj, names):
            return tuple(n for n in names if restarts_compile(getattr(obj, n)))

        data_names = (f.name for f in dataclasses.fields(d))
        return cls(named(m.opt, m.opt._data_names), named(m, m._data_names), named(d, data_names))

    def lift(self, m: Model, d: Data) -> tuple[Model, Data]:
        """m and d with those fields [] as [1] views (a shallow copy: 20 us for a hopper, a Model.replace 0.4 ms)."""
        if not any(self):  # float32, or a GPU
            return m, d
        lifted = lambda obj, names: {n: getattr(obj, n).reshape(1) for n in names}  # noqa: E731
        m = _with_fields(m, {**lifted(m, self.model), "opt": _with_fields(m.opt, lifted(m.opt, self.option))})
        return m, d.replace(**lifted(d, self.data)) if self.data else d

    def restore(self, m: Model, d: Data) -> tuple[Model, Data]:
        """lift's inverse: those fields [1] -> [] (traced once, inside the compiled function)."""
        if not any(self):
            return m, d
        restored = lambda obj, names: {n: getattr(obj, n).reshape(()) for n in names}  # noqa: E731
        m = m.replace(**restored(m, self.model), opt=m.opt.replace(**restored(m.opt, self.option)))
        return m, d.replace(**restored(d, self.data)) if self.data else d


_LIBRARIES = ("diffmj", "torch", "tensordict")
_GLOBAL = re.compile(r"G\['([^']+)'\]")  # the first global a guard's source reads, as Dynamo names it


def library_guard_filter(fn: Callable) -> Callable[[list], list[bool]]:
    """``torch.compile(fn, options={"guard_filter_fn": library_guard_filter(fn)})``: the compiled fn skips the
    guards on diffmj's, torch's and tensordict's module globals and on Python's builtins, and keeps all others
    (on fn's arguments, its closure, global state, and every other module's globals: a user's policy reading a
    global gain still recompiles when the gain changes).

    Dynamo guards every global a traced function reads, and checks them all at every call: the tables and
    constants of ``diffmj.math``, every function it inlined, tensordict's internals. For the hopper's step
    that is 2.4k of 4.2k guards, 0.6-0.7 ms of a 2.3 ms compiled B=1 step (benchmarks/README.md, "Guards").
    Skipped, they assume what diffmj never does: that those modules are not changed after the compile.
    Dynamo names a global G['__import_<module, dots as _dot_>'] when reached through a module, G['<name>']
    when it is fn's own module's, and G['__builtins_dict___<k>'] for builtins; a name of any other form is kept.
    """
    own = fn.__module__.split(".")[0] in _LIBRARIES

    def library(name: str) -> bool:
        match = _GLOBAL.search(name)
        if match is None:
            return False
        root = match.group(1)
        if root.startswith("__builtins_dict__"):
            return True
        if root.startswith("__import_"):
            return root.removeprefix("__import_").replace("_dot_", ".").split(".")[0] in _LIBRARIES
        return own and root.isidentifier() and not root.startswith("_")

    return lambda entries: [not (entry.is_global and library(entry.name)) for entry in entries]


class Literal(NamedTuple):
    """A constant table (torch.tensor(values)): its values, flat, and its shape; traced, it is built
    from 1-D pieces of at most 8 values.

    Inside a while_loop / scan body, torch 2.13's inductor never sets the body's tensor constants in
    the generated module (a SubgraphLowering keeps its own, which the parent does not pass on), so the
    compiled body fails ("_torchinductor_pyobject_tensor_data_ptr: non-tensor input"); 1-D constants of
    at most 8 values are the exception, inlined into kernels. RK4's later stages run a whole forward
    pass as such a body, so every table the physics builds in traced code is made of those pieces.
    """

    values: tuple  # flat, row-major
    shape: tuple[int, ...]
    eager: dict  # (dtype, device) -> the tensor made for eager calls, made once: a constant, never written to

    @staticmethod
    def of(values) -> Literal:
        """The table of nested lists / tuples of numbers (rectangular); make it once (at import) where
        it is used often: building it is Python work that torch.compile traces at every call."""
        shape, flat = [], list(values)
        shape.append(len(flat))
        while flat and isinstance(flat[0], (list, tuple)):
            shape.append(len(flat[0]))
            flat = [x for row in flat for x in row]
        return Literal(tuple(flat), tuple(shape), {})

    def tensor(self, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Tensor:
        """torch.tensor(values, dtype=dtype, device=device); traced, from pieces of at most 8 values."""
        if not torch.compiler.is_compiling():  # eager: one tensor, made at the first call
            key = (dtype, device)
            if key not in self.eager:
                # usable outside the inference_mode block or functorch transform (jacrev's level) it was
                # first made in: a plain tensor, not one wrapped for a level that later ends
                with torch.inference_mode(False), torch._C._DisableFuncTorch():
                    table = torch.tensor(self.values, dtype=dtype, device=device).reshape(self.shape)
                if type(table) is not torch.Tensor:  # a fake or other subclass tensor (tracing): not kept
                    return table
                self.eager[key] = table
            return self.eager[key]
        pieces = [torch.tensor(self.values[i:i + 8], dtype=dtype, device=device)
                  for i in range(0, len(self.values), 8)]
        if not pieces:
            return torch.zeros(self.shape, dtype=dtype, device=device)
        return (pieces[0] if len(pieces) == 1 else torch.cat(pieces)).reshape(self.shape)


def literal(values, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Tensor:
    """torch.tensor(values, dtype=dtype, device=device) for nested lists of numbers, compilable inside a
    loop body (see Literal)."""
    return Literal.of(values).tensor(dtype, device)


def add_at_distinct(target: Tensor, index: Tensor, values: Tensor) -> Tensor:
    """target with values[k] added to target[index[k]], for distinct indices (out of place).

    Equal to target.index_add(0, index, values), written as a gather and a copy: inductor's
    CPU code for an index_add fused into a 2D-tiled loop writes out of bounds when torch runs
    on more than one thread (pytorch/pytorch#191837; ant's joint springs hit it).
    """
    return target.index_copy(0, index, target[index] + values)


def add_blocks(target: Tensor, adr: Tensor, values: Tensor) -> Tensor:
    """target with values[k] [width] added to target[adr[k] : adr[k] + width], for disjoint blocks."""
    index = adr[:, None] + torch.arange(values.shape[-1], device=adr.device)
    return add_at_distinct(target, index.reshape(-1), values.reshape(-1))


def sum_at(size: int, index: Tensor, values: Tensor) -> Tensor:
    """Sums of values [k, ...] by index [k] into size rows, repeats allowed: [size, ...].

    Equal to zeros(size, ...).index_add(0, index, values), written as a masked sum over a
    [size, k] selection so that no index_add reaches inductor (pytorch/pytorch#191837, see
    add_at_distinct). Meant for short static index lists: tendon wraps, sensors, contact slots.
    """
    select = index == torch.arange(size, device=index.device)[:, None]
    select = select.reshape(select.shape + (1,) * (values.dim() - 1))
    return torch.where(select, values, 0.0).sum(1)


def transform_active(tensors) -> bool:
    """Whether a torch.func transform or torch.compile is tracing, or any tensor is a
    functorch wrapper (then plain autograd cannot be used on them)."""
    return (
        torch.compiler.is_compiling()
        or torch._C._functorch.maybe_current_level() is not None
        or any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)
    )


def all_true(done: Tensor) -> bool:
    """Whether every element of ``done`` holds, read in eager mode only (False under compile).

    Under vmap / grad the flag is a functorch wrapper; its unwrapped tensor holds every
    batch element, so a loop asking this stops once all are done.
    """
    return not torch.compiler.is_compiling() and bool(unwrapped(done).all())


def unwrapped(x: Tensor) -> Tensor:
    """x without functorch's wrappers: under vmap the tensor of every batch element (the batch dims
    where functorch keeps them), read in eager mode only."""
    while torch._C._functorch.is_functorch_wrapped_tensor(x):
        x = torch._C._functorch.get_unwrapped(x)
    return x


def derivative_requested(tensors) -> bool:
    """Whether a derivative of a computation on ``tensors`` may be asked for, readable under Dynamo.

    A jvp or grad transform is active (forward-mode tangents flow under no_grad too: sysid's stepwise
    Jacobian runs jvp under no_grad), or with grad mode on: any tensor requires grad, or vmap is
    active (its wrappers never report requires_grad).
    """
    if not _only_vmap_active():
        return True
    if not torch.is_grad_enabled():
        return False
    return torch._C._are_functorch_transforms_active() or any(t.requires_grad for t in tensors)


def _only_vmap_active() -> bool:
    """Whether every active functorch transform is vmap (none is grad or jvp), readable under Dynamo."""
    if not torch._C._are_functorch_transforms_active():
        return True
    interpreter = retrieve_current_functorch_interpreter()
    if interpreter.key() != TransformType.Vmap:
        return False
    with interpreter.lower():
        return _only_vmap_active()


def elementwise(piece: Callable, batched: bool, in_dims=0, out_dims=0) -> Callable:
    """piece mapped over a leading batch dimension, as torch.vmap(piece, in_dims, out_dims) maps it, when
    ``batched``, else piece itself: one code path for one element and for an explicit batch.

    A piece must take every batched tensor it reads as an argument: one it closes over is seen whole by
    the map (all B elements at once), not per element. Arguments and results are tensors, records
    (``Data``, ``Contact``: dim 0), tuples and NamedTuples of them (dims as nested tuples), or anything
    else, which passes as it is (the Model). The map is functorch's own (a vmap level, each tensor's
    batch dim added and removed), without torch.vmap's pytree handling: tensordict patches that to
    check every leaf of every argument, and a Data crosses each stage's boundary whole, so that
    handling was half of an eager batched step of a small model and ~95 % of the Python Dynamo traced
    for a compiled one (hopper, B = 4: 0.95M bytecodes, 25k of them the physics).
    """
    if not batched:
        return piece

    def mapped(*args):
        leaves, dims = [], []
        rebuild_args = _flatten(args, in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args),
                                leaves, dims)
        size = next(leaf.shape[dim] for leaf, dim in zip(leaves, dims) if dim is not None)
        with vmap_increment_nesting(size, "error") as level:
            inner = [leaf if dim is None else _add_batch_dim(leaf, dim, level) for leaf, dim in zip(leaves, dims)]
            out = piece(*rebuild_args(iter(inner), lambda batch: batch[1:]))
            out_leaves, out_dims_flat = [], []
            rebuild_out = _flatten(out, out_dims, out_leaves, out_dims_flat)
            outer = [leaf if dim is None else _remove_batch_dim(leaf, level, size, dim)
                     for leaf, dim in zip(out_leaves, out_dims_flat)]
        return rebuild_out(iter(outer), lambda batch: (size, *batch))

    return mapped


def _flatten(x, dim, leaves: list, dims: list) -> Callable:
    """Appends the tensors of x that are mapped (``dim`` not None, broadcast over x's structure) to
    ``leaves`` and their dims to ``dims``; returns rebuild(leaf iterator, batch -> new batch of records)
    -> x's structure with the next leaves. What is not mapped (dim None: the Model, shared tensors)
    passes as it is; records (``Data``, ``Contact``) are taken apart here, other pytrees by torch's."""
    if dim is None:
        return lambda it, batch: x
    if isinstance(x, Tensor):
        leaves.append(x)
        dims.append(dim)
        return lambda it, batch: next(it)
    if isinstance(getattr(x, "_tensordict", None), TensorDict):  # a tensorclass record
        if dim != 0:
            raise ValueError(f"a {type(x).__name__} is mapped over its first dimension (dim 0), not {dim}")
        storage = x._tensordict
        entries = storage._tensordict
        nested = {}  # the entries that are records themselves (Data.contact); the others tensors
        for name, value in entries.items():
            if isinstance(value, Tensor):
                leaves.append(value)
                dims.append(dim)
            else:
                nested[name] = _flatten(value, dim, leaves, dims)
        names, cls, size, device = tuple(entries), type(x), storage._batch_size, storage._device

        def rebuild(it, batch):
            values = {name: nested[name](it, batch) if name in nested else next(it) for name in names}
            return record_from_entries(cls, values, torch.Size(batch(size)), device)
        return rebuild
    if isinstance(x, (tuple, list)):
        inner = dim if isinstance(dim, (tuple, list)) else (dim,) * len(x)
        parts = [_flatten(value, d, leaves, dims) for value, d in zip(x, inner)]
        make = (lambda values: type(x)(*values)) if hasattr(x, "_fields") else type(x)
        return lambda it, batch: make([part(it, batch) for part in parts])
    children, spec = pytree.tree_flatten(x)  # dicts, dataclasses, ...: every tensor mapped over dim
    if spec.is_leaf():
        return lambda it, batch: x  # numbers, strings, ...
    parts = [_flatten(child, dim, leaves, dims) for child in children]
    return lambda it, batch: pytree.tree_unflatten([part(it, batch) for part in parts], spec)


def fields_read_directly(cls):
    """cls (a tensorclass: Data, Contact) with each field read straight from its storage's dict.

    tensorclass serves field reads by ``__getattr__``, which looks for non-tensor entries and shadowed
    names at every read: ~9 us eager (a hopper step reads ~270 fields) and Python that Dynamo traces
    at each read. Construction and writes stay tensorclass's.
    """
    for name in cls.__expected_keys__:
        setattr(cls, name, property(_field_reader(name)))
    return cls


def _field_reader(name: str) -> Callable:
    """record -> its field ``name`` (a closure, not functools.partial: Dynamo cannot wrap a partial made
    outside the traced code as a property's getter)."""

    def read(record):
        storage = record._tensordict
        return storage._tensordict[name] if type(storage) is TensorDict else storage.get(name)
    return read


def record_from_entries(cls, entries: dict, batch: torch.Size, device=None, dim_names=None):
    """A tensorclass record (``cls``: Data, Contact) holding ``entries`` as they are, with batch size
    ``batch`` (and tensordict's batch dim names, if any): what ``TensorDict._new_unsafe`` and
    tensorclass's ``_from_tensordict`` set, without their per-entry checks (the caller's entries are
    already shaped and placed)."""
    storage = TensorDict.__new__(TensorDict)
    object.__setattr__(storage, "_tensordict", entries)
    object.__setattr__(storage, "_batch_size", batch)
    object.__setattr__(storage, "_device", device)
    object.__setattr__(storage, "_td_dim_names", dim_names)
    record = cls.__new__(cls)
    object.__setattr__(record, "_tensordict", storage)
    object.__setattr__(record, "_non_tensordict", {})
    return record


def bounded_loop(body: Callable[[tuple], tuple], carry: tuple, iterations: int, unroll: bool = False,
                 early_exit: bool = True) -> tuple:
    """carry = body(carry) at most ``iterations`` times, stopping once all of carry[0] (bool ``done``) holds.

    ``body`` must freeze done elements (torch.where), so stopping early or not gives the same
    carry. Eager, and wherever ``unroll`` (differentiating through the iterations), a Python
    loop that stops when all_true(done). Under torch.compile Dynamo would unroll that loop, so
    compile time would grow with ``iterations``; the body is traced once instead:

    * no functorch transform: ``while_loop``, which stops when done (without ``early_exit``:
      ``scan`` for the full count, as under vmap); with an explicit batch (``elementwise``
      pieces inside ``body``, done [B, ...]) it stops once every element is done;
    * only vmap: ``scan`` for the full count (2.13's while_loop has no vmap rule); the carry's
      initial values must be batched like the body's outputs;
    * grad / jvp transforms: the Python loop (2.13's scan and while_loop fail under them:
      "Expected FakeTensor, got <class 'torch.Tensor'>").

    Without ``early_exit`` every path runs the full count and never reads ``done`` on the host
    (eager: no all_true, so no device synchronisation; what CUDA-graph capture needs; compiled,
    torch 2.13's inductor still reads each scan iteration's counter on the host).
    """
    compiling = torch.compiler.is_compiling()
    if unroll or not compiling or not _only_vmap_active() or iterations == 0:
        # 0 iterations (the steps diffmj.grad.solution differentiates): no while_loop, its copies and condition traced
        for _ in range(iterations):
            if early_exit and all_true(carry[0]):  # done elements are frozen: stopping changes nothing
                break
            carry = body(carry)
        return carry
    # copies: the loops refuse a carry that aliases another input, and a vmapped piece may pass one of
    # the body's inputs through (without warm start the first iterate is qacc_smooth itself)
    carry = tuple(c.clone() for c in carry)
    if early_exit and not torch._C._are_functorch_transforms_active():
        count = torch.zeros((), dtype=torch.int64, device=carry[0].device)

        def cond(i, *c):
            return (i < iterations) & ~c[0].all()

        def step(i, *c):
            return (i + 1, *body(c))

        return tuple(while_loop(cond, step, (count, *carry))[1:])

    def scan_step(c, _):
        return tuple(body(c)), c[0].new_zeros(())  # scan needs an output per step: a dummy

    return tuple(scan(scan_step, tuple(carry), torch.arange(iterations, device=carry[0].device))[0])


def bounded_row_loop(body: Callable[[tuple, Tensor | None], tuple], carry: tuple, iterations: int) -> tuple:
    """``bounded_loop`` over independent rows: every carry tensor is [A, ...], one row per element
    (carry[0]: done [A]), and ``body(carry, rows)`` advances the rows ``rows`` [a] given only their
    carry, or every row (``rows`` None).

    Eager without torch.func transforms, each iteration advances only the rows not yet done, at most
    ``ROW_CHUNK`` at a time: a search whose rows mostly finish in a few steps (the mesh hill climbs)
    costs what its remaining rows cost, and its temporaries stay bounded. Otherwise ``bounded_loop``
    over every row. Rows are independent and done rows frozen, so both give the same carry.
    """
    if transform_active(carry):
        return bounded_loop(lambda c: body(c, None), carry, iterations)
    active = torch.arange(carry[0].shape[0], device=carry[0].device)
    for _ in range(iterations):
        active = active[~carry[0][active]]
        if not active.numel():
            break
        for rows in active.split(ROW_CHUNK):
            advanced = body(tuple(c[rows] for c in carry), rows)
            carry = tuple(c.index_copy(0, rows, a) for c, a in zip(carry, advanced))
    return carry


ROW_CHUNK = 1 << 15  # rows bounded_row_loop advances at once, eager (a mesh search's: ~100 MB of temporaries)
