//! braintrace: eligibility-trace propagation (ETP) primitives, defined
//! declaratively, on a small JAX-like tracing core.

pub use braintrace_core::*;

/// Everything a user of the library usually needs.
pub mod prelude {
    pub use braintrace_core::{
        concat, eval_shape, grad, jit, jvp, make_graph, stack, value_and_grad, vjp, vmap, vmap_out,
        where_, Aval, DType, Error, Graph, Result, Tensor, VjpFn,
    };
}
