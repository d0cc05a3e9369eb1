//! pp_prop's learner-side state: the weight gradients of dense relations
//! accumulated over chunks of steps ([`crate::learn::pp_fast`]) from each
//! step's `x̄` and summed signal ([`DenseRows`]), one accumulator per such
//! relation and `etrace_grad` call.

use crate::error::Result;
use crate::learn::algorithm::TraceState;
use crate::learn::pp_fast::{Leaf, PpDense};
use crate::tensor::{DType, Tensor};

/// What the solve gives one dense pair per step.
pub(super) struct DenseRows {
    /// The input trace `x̄`, or a placeholder scalar without an input.
    pub x: Tensor,
    /// The summed, corrected signal `Σ_a f̄[a] g[a] / c`.
    pub g: Tensor,
}

impl DenseRows {
    /// Append to a program's extra results (two tensors).
    pub(super) fn push_to(self, v: &mut Vec<Tensor>) {
        v.extend([self.x, self.g]);
    }
    /// Read [`push_to`](Self::push_to)'s tensors back, pair by pair: `(x̄, g)`.
    fn read(v: &[Tensor]) -> impl Iterator<Item = (&Tensor, &Tensor)> {
        v.chunks_exact(2).map(|c| (&c[0], &c[1]))
    }
}

/// pp_prop's [`TraceState`]: its traces all live in the step program; the
/// accumulators of the current `etrace_grad` call live here.
pub(super) struct PpState {
    /// Per dense pair, its trainables.
    leaves: Vec<Vec<Leaf>>,
    dtype: DType,
    /// This call's accumulators (empty between calls).
    acc: Vec<PpDense>,
}

impl PpState {
    pub(super) fn new(leaves: Vec<Vec<Leaf>>, dtype: DType) -> Self {
        PpState {
            leaves,
            dtype,
            acc: Vec::new(),
        }
    }
}

impl TraceState for PpState {
    fn begin_grad(&mut self, _params: &[Tensor]) -> Result<()> {
        self.acc = self
            .leaves
            .iter()
            .map(|l| PpDense::new(l.clone(), self.dtype))
            .collect();
        Ok(())
    }

    fn step(&mut self, _fwd: &[Tensor], grad: Option<&[Tensor]>) -> Result<()> {
        let Some(rows) = grad else {
            return Ok(());
        };
        for (acc, (x, g)) in self.acc.iter_mut().zip(DenseRows::read(rows)) {
            acc.push(x, g)?;
        }
        Ok(())
    }

    fn take_grads(&mut self, params: &[Tensor]) -> Result<Vec<(usize, Tensor)>> {
        let mut v = Vec::new();
        for acc in &mut self.acc {
            v.extend(acc.take(params)?);
        }
        self.acc.clear();
        Ok(v)
    }

    fn drop_grads(&mut self) -> Result<()> {
        self.acc.clear();
        Ok(())
    }
}
