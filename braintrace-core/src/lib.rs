//! braintrace-core: the tracing core (tensors, core ops, graph IR,
//! transforms), the ETP primitive framework and the built-in primitives.
//! Users normally depend on the `braintrace` facade instead.

#![warn(missing_docs)]
// unsafe code lives in `kernels/` and the executor's buffers only (see
// tests/layers.rs), each block with a `// SAFETY:` comment saying why it holds.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod dtype;
pub mod error;
pub mod etp;
pub mod exec;
pub mod graph;
pub mod kernels;
pub mod learn;
pub mod nn;
pub mod ops;
pub mod prims;
pub mod random;
pub mod tensor;
pub mod threads;
pub mod transform;

pub use error::{Error, Result};
pub use graph::{Graph, LinearArg, Primitive};
pub use ops::{avals, concat, spike, stack, where_, Surrogate};
pub use tensor::{ArrayData, ArrayElement, Aval, DType, Tensor};
pub use transform::{cond, scan, switch, while_loop};
pub use transform::{custom_jvp, CustomJvp};
pub use transform::{
    eval_shape, grad, grad_scalar, jit, jvp, make_graph, value_and_grad, value_and_grad_vec, vjp,
    vmap, vmap_out, Jit, VjpFn,
};

/// Items the macros' generated code uses. Not part of the public API.
#[doc(hidden)]
pub mod __private;
