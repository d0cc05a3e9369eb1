//! The `Primitive` trait: what every op — core or ETP — supplies to each
//! interpreter (evaluation, shape inference, JVP, transpose, batching).

use super::BlockOp;
use crate::error::{Error, Result};
use crate::tensor::{Aval, Tensor};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// An argument of a linear (transposed) equation: either a value known at
/// transpose time (a residual), or a linear input whose cotangent is wanted.
#[derive(Clone, Debug)]
pub enum LinearArg {
    /// A known value (the equation is not linear in it).
    Known(Tensor),
    /// A linear input, of which only the abstract value is known.
    Linear(Aval),
}

impl LinearArg {
    /// The known value, or an error naming `op` when the argument is linear.
    pub fn known(&self, op: &str) -> Result<&Tensor> {
        match self {
            LinearArg::Known(t) => Ok(t),
            LinearArg::Linear(a) => Err(Error::invalid(
                op,
                format!("transpose needs this operand ({a}) to be a known value, but it is linear"),
            )),
        }
    }
    /// Whether this argument is linear.
    pub fn is_linear(&self) -> bool {
        matches!(self, LinearArg::Linear(_))
    }
    /// The abstract value of the argument.
    pub fn aval(&self) -> Aval {
        match self {
            LinearArg::Known(t) => t.aval(),
            LinearArg::Linear(a) => a.clone(),
        }
    }
}

/// Cloning a primitive into a shared handle (blanket-implemented for every
/// `Primitive + Clone`).
pub trait PrimitiveClone {
    /// A shared handle to a copy of this primitive.
    fn clone_arc(&self) -> Arc<dyn Primitive>;
}

impl<T: Primitive + Clone> PrimitiveClone for T {
    fn clone_arc(&self) -> Arc<dyn Primitive> {
        Arc::new(self.clone())
    }
}

/// One primitive operation: a core op, or an ETP primitive bound with params.
///
/// Implementations are small structs whose fields are the op's static
/// parameters; an equation of a graph holds one of them.
pub trait Primitive: PrimitiveClone + Send + Sync + fmt::Debug + 'static {
    /// For a binary op, the constant that leaves the other operand
    /// unchanged when it stands on the left / on the right (`0 + x`, `x - 0`,
    /// `1 * x`, `x / 1`): [`Graph::simplify_identities`](super::Graph::simplify_identities)
    /// drops such equations. `[None, None]` (the default) for every other op.
    fn neutral_operands(&self) -> [Option<f64>; 2] {
        [None, None]
    }
    /// The name printed in graphs (`mul`, `matmul`, `etp_mm`, ...).
    fn name(&self) -> String;
    /// Static parameters as `key=value` pairs, printed in graphs.
    fn params(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Shape and dtype inference; validates the operands.
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>>;
    /// Evaluate on concrete operands.
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>>;
    /// Forward-mode rule. `tangents[i]` is `None` for a (symbolic) zero.
    /// Returns the primal outputs and their tangents (`None` = zero).
    fn jvp(
        &self,
        primals: &[Tensor],
        tangents: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)>;
    /// Transpose rule for the operands marked [`LinearArg::Linear`]: given the
    /// output cotangents (`None` = zero), return one cotangent per operand
    /// (`None` for known operands or zero cotangents).
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let _ = (cts, args);
        Err(Error::MissingRule {
            primitive: self.name(),
            rule: "transpose".into(),
            detail: " (it is not linear)".into(),
        })
    }
    /// Batching rule. Batched operands carry the batch axis at position 0
    /// (`batched[i]`), all of size `size`. Returns outputs and whether each
    /// is batched (at axis 0). `crate::ops::batch_by_loop` is a correct
    /// (slow) rule any op can fall back on.
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)>;
    /// Lowering: primitives defined by an implementation in terms of other
    /// primitives (ETP primitives) apply it here, so that a lowered graph
    /// holds core ops only. `None` (the default) means "already core".
    fn lower(&self, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
        let _ = inputs;
        None
    }
    /// The identity used by common-subexpression elimination
    /// ([`crate::Graph::cse`]): two equations with equal keys and equal
    /// operands compute the same values. The default is the name with the
    /// printed params. Return `None` when that does not identify the
    /// computation — a primitive holding a closure or a graph, or one with
    /// effects or randomness — and the equation is never merged.
    fn cse_key(&self) -> Option<String> {
        let params: Vec<String> = self
            .params()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        Some(format!("{}[{}]", self.name(), params.join(" ")))
    }
    /// The element-wise computation of this primitive, if it is one: a
    /// single float output of its operands' common shape and dtype, each
    /// element a function of the operands' elements at the same position
    /// (operands of one element broadcast). The planned executor behind
    /// [`crate::Jit`] fuses chains of such equations into one loop over
    /// blocks of the output. `None` (the default): not element-wise.
    fn elementwise(&self) -> Option<&dyn Elementwise> {
        None
    }
    /// What this primitive computes, when it is one of the operations the
    /// planned executor behind [`crate::Jit`] runs itself into recycled
    /// buffers (a matrix product, a transpose, a concatenation, a sum, a
    /// reshape; see [`Planned`]) instead of calling [`Primitive::eval`].
    /// The executor still checks the equation's avals (float dtypes, ranks,
    /// sizes) and runs `eval` when they do not fit. `None` (the default):
    /// always `eval`.
    fn planned(&self) -> Option<Planned<'_>> {
        None
    }
    /// For downcasting (the ETP layer recognises its own equations).
    fn as_any(&self) -> &dyn Any;
}

/// What a primitive computes, for the planned executor (see
/// [`Primitive::planned`]). Each is a promise about [`Primitive::eval`]: the
/// executor computes the same thing itself, bit for bit as the core op of
/// that kind does, so a primitive should declare one only when its `eval`
/// gives exactly that result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Planned<'a> {
    /// `inputs[0] @ inputs[1]`: the matrix product of two operands
    /// (planned for two 2-D float operands of one dtype).
    Matmul,
    /// The one operand with its axes permuted: result axis `k` is operand
    /// axis `perm[k]`.
    Transpose {
        /// The permutation.
        perm: &'a [usize],
    },
    /// The operands joined along `axis`, in order.
    Concat {
        /// The axis they are joined along.
        axis: usize,
    },
    /// The sum of the one operand's elements over `axes` (planned when
    /// the result has one element, the sum of all of them, and when the
    /// axes lead and the operand is a fused loop's result; added in the
    /// order of the core `reduce_sum`).
    Sum {
        /// The summed axes, sorted and distinct.
        axes: &'a [usize],
    },
    /// The one operand's elements, in row-major order, in the output's
    /// shape.
    Reshape,
    /// The one operand repeated to the output's shape (each output element
    /// is the operand element its index maps to; no arithmetic). Not run
    /// by the executor itself today; `jit`'s simplification reads a
    /// broadcast of one element as that element.
    Broadcast,
}

/// An element-wise primitive's kernel on one block of elements (see
/// [`Primitive::elementwise`]).
///
/// `ins` holds one slice per operand, all of the length of `out`; the
/// kernel must compute exactly what the primitive's `eval` computes for
/// those elements (the fused executor is checked against it), so that
/// fusing never changes a result.
pub trait Elementwise: Send + Sync {
    /// The number of operands.
    fn arity(&self) -> usize;
    /// `out[i] = f(ins[0][i], ins[1][i], ...)` on `f32` elements.
    fn block_f32(&self, ins: &[&[f32]], out: &mut [f32]);
    /// `out[i] = f(ins[0][i], ins[1][i], ...)` on `f64` elements.
    fn block_f64(&self, ins: &[&[f64]], out: &mut [f64]);
    /// The core op this kernel computes, if it is one: a fused loop then
    /// calls that op's block kernel directly (and may fold a `mul` or
    /// `mul_scalar` into the `add` that reads it). `None` (the default):
    /// the loop calls [`Elementwise::block_f32`] or
    /// [`Elementwise::block_f64`].
    fn block_op(&self) -> Option<BlockOp> {
        None
    }
}
