"""diffmj: MuJoCo's physics pipeline in PyTorch, differentiable end to end."""

from diffmj.contacts import contact_force, contact_slots
from diffmj.forward import forward, step
from diffmj.io import get_data, get_data_into, load, make_data, put_data, put_model
from diffmj.params import get_param, set_param
from diffmj.rollout import rollout
from diffmj.state import State, differentiate_pos, get_state, integrate_pos, set_state, state_size
from diffmj import grad
from diffmj.types import (
    BackwardMode,
    BiasType,
    ConeType,
    Data,
    DisableBit,
    DynType,
    EnableBit,
    GainType,
    GeomType,
    IntegratorType,
    JointType,
    Model,
    Option,
    SolverType,
    TrnType,
)

__all__ = [
    "BackwardMode",
    "BiasType",
    "ConeType",
    "Data",
    "DisableBit",
    "DynType",
    "EnableBit",
    "GainType",
    "GeomType",
    "IntegratorType",
    "JointType",
    "Model",
    "Option",
    "SolverType",
    "State",
    "TrnType",
    "contact_force",
    "contact_slots",
    "differentiate_pos",
    "forward",
    "grad",
    "get_data",
    "get_data_into",
    "get_param",
    "get_state",
    "integrate_pos",
    "load",
    "make_data",
    "put_data",
    "put_model",
    "rollout",
    "set_param",
    "set_state",
    "state_size",
    "step",
]
