"""Compiled functions saved to disk, so that a new process loads them in seconds instead of compiling.

``torch.compile`` keeps the kernels it generates in inductor's cache (``TORCHINDUCTOR_CACHE_DIR``,
by default ``/tmp/torchinductor_$USER``), but every new process traces the Python function again
(Dynamo, then AOTAutograd): 20-50 s for a contact model's step, every time. ``precompiled`` traces
once with ``torch.compile(fn, fullgraph=True).aot_compile`` and saves the traced, compiled function
in ``cache_dir``; a later process asking for the same function on arguments of the same structure
loads it instead. The load takes seconds when inductor's cache from the first compile is still
there (the file holds the generated code, the cache its built kernels; without the cache the
kernels are built again, minutes).

A file is found by a hash of what the compiled code assumed: the function (module, name,
closure), the arguments' pytree structure (a Model's structure, every tensor's shape, dtype and
device), torch's and Python's versions, and the global state its guards check (torch's thread
count, grad mode, default dtype). The saved guards check only tensor metadata and global state
(``torch.compiler.keep_portable_guards_unsafe``: guards on Python objects cannot be saved), so
the key stands in for the others. A file is used only if every source file the trace read
(diffmj's, torch's, the caller's) is unchanged since it was written; otherwise it is compiled and
written again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import os
import pathlib
import re
import sys
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree


def _describe(value: Any) -> str:
    """A description of ``value`` that is equal in two processes when it computes the same."""
    if isinstance(value, functools.partial):
        return f"partial({_describe(value.func)}, {_describe(value.args)}, {_describe(value.keywords)})"
    if inspect.isfunction(value):
        cells = [_describe(c.cell_contents) for c in value.__closure__ or ()]
        return f"{value.__module__}.{value.__qualname__}({', '.join(cells)})"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}({', '.join(_describe(v) for v in value)})"
    if isinstance(value, dict):
        return f"dict({', '.join(f'{k!r}: {_describe(v)}' for k, v in value.items())})"
    if isinstance(value, torch.Tensor):
        return f"Tensor({tuple(value.shape)}, {value.dtype}, {value.device}, {value.requires_grad})"
    return repr(value)


def _key(fn: Callable, example_args: tuple) -> str:
    leaves, spec = pytree.tree_flatten(example_args)
    # the global state its guards check: a new process with another thread count compiles its own
    state = (torch.get_num_threads(), torch.is_grad_enabled(), torch.get_default_dtype())
    text = "\n".join((torch.__version__, sys.version, repr(state), _describe(fn), str(spec), _describe(leaves)))
    text = re.sub(r" at 0x[0-9a-f]+", "", text)  # objects' addresses (a Data's constructor) differ per process
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _sources_unchanged(compiled) -> bool:
    """Whether every module the trace read still has the source it had then."""
    for source in compiled.source_info().inlined_sources:
        try:
            current = inspect.getsource(importlib.import_module(source.module))
        except (ImportError, OSError, TypeError):
            return False
        if current != source.content:
            return False
    return True


def _aot_compile(fn: Callable, example_args: tuple):
    compiled = torch.compile(fn, fullgraph=True,
                             options={"guard_filter_fn": torch.compiler.keep_portable_guards_unsafe})
    try:
        return compiled.aot_compile((example_args, {}))
    except torch._dynamo.exc.TensorifyScalarRestartAnalysis:
        # torch.compile restarts its analysis once when it specialises 0-dim float inputs
        # (opt.timestep, time); aot_compile raises instead, and the retry starts from that decision
        return compiled.aot_compile((example_args, {}))


def precompiled(fn: Callable, example_args: tuple, cache_dir: str | os.PathLike) -> Callable:
    """``torch.compile(fn, fullgraph=True)`` for arguments shaped like ``example_args``, saved in ``cache_dir``.

    Loads the function from ``cache_dir`` when an earlier process compiled it for arguments of the
    same structure (and the sources it traced are unchanged), else compiles it and writes it
    there. ``fn`` must be a Python function (``diffmj.step``, ``torch.vmap(diffmj.step, in_dims=(None, 0))``,
    a function of your own): its globals resolve the saved code's names.

    The result takes arguments of ``example_args``' structure (same shapes, dtypes, devices; values
    may differ) and raises RuntimeError naming the failed guard for others: call ``precompiled``
    again for another batch size or model.
    """
    if not callable(fn) or not hasattr(fn, "__globals__"):
        raise ValueError(f"precompiled needs a Python function, got {type(fn).__name__}")
    path = pathlib.Path(cache_dir) / f"{getattr(fn, '__name__', 'fn')}-{_key(fn, example_args)}.pt2"
    if path.exists():
        with open(path, "rb") as file:
            compiled = torch.compiler.load_compiled_function(file, f_globals=fn.__globals__)
        if _sources_unchanged(compiled):
            return compiled
    compiled = _aot_compile(fn, example_args)
    path.parent.mkdir(parents=True, exist_ok=True)
    compiled.save_compiled_function(str(path))
    return compiled
