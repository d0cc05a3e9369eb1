//! A learner's estimate of one step's work, from its compiled graph: what
//! [`crate::threads::auto`] chooses the learner's threads from.

use super::algorithm::TraceState;
use super::compiler::EtraceGraph;
use super::state::ModelState;
use crate::tensor::Tensor;
use crate::threads::Work;

/// The work of one step of a learner of `eg` whose program carries
/// `traces` and whose algorithm owns `owned`:
///
/// * trace bytes — every trace the step streams once: the program's trace
///   tensors and the algorithm's own buffers (in their storage precision,
///   so `trace_dtype` BF16 halves them);
/// * multiply-adds — per relation and trainable, the trainable's elements
///   times the relation output's elements per output feature (`y`'s size
///   over its last axis: the batch, times the positions of a
///   convolution). A dense `x W` with `x` `(B, I)` and `W` `(I, O)`: `B·I·O`.
pub(crate) fn step_work(
    eg: &EtraceGraph,
    state: &ModelState,
    traces: &[Tensor],
    owned: &dyn TraceState,
) -> Work {
    let program: usize = traces
        .iter()
        .map(|t| t.size() * t.dtype().size_bytes())
        .sum();
    let g = eg.graph();
    let params = state.param_values();
    let macs = eg
        .relations()
        .iter()
        .map(|r| {
            let y = g.aval(r.y_var).shape();
            let per_feature = y.iter().product::<usize>() / y.last().copied().unwrap_or(1).max(1);
            r.trainables
                .iter()
                .map(|t| params[t.param].size() * per_feature)
                .sum::<usize>()
        })
        .sum();
    Work {
        trace_bytes: program + owned.trace_bytes(),
        macs,
    }
}
