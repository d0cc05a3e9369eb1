"""braintrace_rs: online learning of recurrent and spiking networks with
eligibility traces (D-RTRL, ES-D-RTRL / pp_prop), from Python, on numpy
arrays, with braintrace's names. The computation runs in Rust
(braintrace-rs); see the book's chapter "From Python".

Arrays go in as numpy float32/float64 arrays (copied once into the
library) and come out as new numpy arrays. Errors are Python exceptions:
``ValueError`` for shapes and values, ``TypeError`` for dtypes,
``MemoryError`` for allocation, each with the library's message.
"""

from . import nn, ops
from ._native import (
    D_RTRL,
    SGD,
    Adam,
    Algorithm,
    Init,
    Layer,
    Learner,
    StepCtx,
    Tensor,
    clip_grad_norm,
    compile,
    load_safetensors,
    pp_prop,
    save_safetensors,
    tensor,
)

#: braintrace's other name for pp_prop.
ES_D_RTRL = pp_prop

__all__ = [
    "D_RTRL",
    "ES_D_RTRL",
    "SGD",
    "Adam",
    "Algorithm",
    "Init",
    "Layer",
    "Learner",
    "StepCtx",
    "Tensor",
    "clip_grad_norm",
    "compile",
    "load_safetensors",
    "nn",
    "ops",
    "pp_prop",
    "save_safetensors",
    "tensor",
]
