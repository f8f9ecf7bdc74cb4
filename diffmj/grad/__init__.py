"""How to differentiate: the solver's implicit adjoint, transition Jacobians, checkpointing,
and the memory a tape keeps (``saved_tensor_bytes``).

The stages use ``adjoint`` (the solver's backward pass) while ``transition``
calls the stages, so the public names are resolved on first use (PEP 562)
to keep the import graph acyclic.
"""

from diffmj.grad.memory import saved_tensor_bytes

__all__ = ["saved_tensor_bytes", "transition_jacobians"]


def __getattr__(name: str):
    if name == "transition_jacobians":
        from diffmj.grad.transition import transition_jacobians

        return transition_jacobians
    raise AttributeError(f"module 'diffmj.grad' has no attribute {name!r}")
