"""How to differentiate: transition Jacobians, checkpointed rollouts, and the memory a
tape keeps (``saved_tensor_bytes``).

The constraint solver's own derivative (the implicit adjoint) is part of the engine
(``diffmj.adjoint``), since every step uses it; this package builds on the public
step and imports nothing above it.
"""

from diffmj.grad.memory import saved_tensor_bytes
from diffmj.grad.transition import transition_jacobians

__all__ = ["saved_tensor_bytes", "transition_jacobians"]
