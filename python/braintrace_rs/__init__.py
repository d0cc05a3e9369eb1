"""braintrace_rs: online learning of recurrent and spiking networks with
eligibility traces, from Python, on numpy arrays, with braintrace's names.
The algorithms: ``D_RTRL``, ``pp_prop`` / ``ES_D_RTRL``, ``EProp`` /
``eprop``, ``OSTLRecurrent``, ``OSTLFeedforward``, ``ThreeFactor``,
``SnAp``, ``UORO``, ``RandomProjection``, or one by its axes
(``ETraceConfig``); ``compile`` also takes their names. The computation runs in Rust
(braintrace-rs); see the book's chapter "From Python".

Arrays go in as numpy float32/float64 arrays (copied once into the
library) and come out as new numpy arrays. Errors are Python exceptions:
``ValueError`` for shapes and values, ``TypeError`` for dtypes,
``MemoryError`` for allocation, each with the library's message.

A learner's checkpoint (``save_checkpoint`` / ``restore_checkpoint``, or
``checkpoint_bytes`` / ``restore_checkpoint_bytes`` in memory) holds its
parameters, hidden states, eligibility traces, step counter and the
optimiser's state: a run resumed from it ends with the bits of an
uninterrupted one. ``braintrace_rs.distributed`` (needs ``ray``) runs
data-parallel online learning over Ray actors.
"""

from . import nn, ops
from ._native import (
    D_RTRL,
    SGD,
    UORO,
    Adam,
    Algorithm,
    EProp,
    ETraceConfig,
    OSTLFeedforward,
    OSTLRecurrent,
    RandomProjection,
    SnAp,
    ThreeFactor,
    Init,
    Layer,
    Learner,
    StepCtx,
    Tensor,
    checkpoint_bytes,
    clip_grad_norm,
    compile,
    load_checkpoint,
    load_safetensors,
    pp_prop,
    restore_checkpoint,
    restore_checkpoint_bytes,
    save_checkpoint,
    save_safetensors,
    tensor,
)

#: braintrace's other name for pp_prop.
ES_D_RTRL = pp_prop

#: e-prop by its lower-case name (``EProp``).
eprop = EProp

__all__ = [
    "D_RTRL",
    "ES_D_RTRL",
    "EProp",
    "ETraceConfig",
    "OSTLFeedforward",
    "OSTLRecurrent",
    "RandomProjection",
    "SGD",
    "SnAp",
    "ThreeFactor",
    "UORO",
    "Adam",
    "Algorithm",
    "Init",
    "Layer",
    "Learner",
    "StepCtx",
    "Tensor",
    "checkpoint_bytes",
    "clip_grad_norm",
    "compile",
    "eprop",
    "load_checkpoint",
    "load_safetensors",
    "nn",
    "ops",
    "pp_prop",
    "restore_checkpoint",
    "restore_checkpoint_bytes",
    "save_checkpoint",
    "save_safetensors",
    "tensor",
]
