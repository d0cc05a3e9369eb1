//! The coupled hidden-to-hidden Jacobian (braintrace's
//! `recurrence_scope='coupled'`): per position `q` of a hidden group, the
//! `S × S` block `D[q, a, b] = ∂h_{q,a}/∂h^{t−1}_{q,b}` of the *whole*
//! step, recurrent weight operations included (the default, diagonal
//! scope cuts the paths through them).
//!
//! braintrace takes the blocks out of the full `(V·S) × (V·S)` Jacobian.
//! Here the tangents are colour masks (SnAp-1's blocks,
//! [`coupled`](crate::learn::snap::jacobian::coupled)): `S · V/B` of them,
//! batched into a few vmapped JVPs.

use crate::error::Result;
use crate::learn::compiler::EtraceGraph;
use crate::learn::snap::jacobian::coupled;
use crate::tensor::Tensor;

/// The coupled `D`, `(V.., S, S)`, of every group of `eg`, at the step
/// inputs `inputs` (parameters, hidden states, `x`).
pub(super) fn coupled_jacobians(eg: &EtraceGraph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    (0..eg.groups().len())
        .map(|gi| coupled(eg, gi, inputs, eg.batch()))
        .collect()
}
