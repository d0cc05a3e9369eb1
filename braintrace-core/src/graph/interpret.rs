//! The one forward interpreter over a [`Graph`]: a walk in equation order
//! over an environment of values, generic in what a value is (a tensor, a
//! primal with its tangent, a value with its batch flag, a known-or-linear
//! mark) and in what each equation does. Evaluation, JVP, batching and
//! linearisation are all this walk with a different value type and rule.
//!
//! Values are dropped right after their last use, and an operand read for
//! the last time is moved (not cloned) into the rule, so a rule that receives
//! the only handle to a tensor may reuse its buffer.

use super::{Eqn, Graph, VarId};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Walk `g` in equation order.
///
/// `inputs` holds one value per graph input; `lift` turns each captured
/// constant into a value; `rule` computes an equation's output values from
/// its operand values (one per [`Eqn::inputs`], in order) and must return
/// one value per [`Eqn::outputs`]. Returns one value per graph output.
///
/// Errors (never panics) when the arity of `inputs` or of a rule's result is
/// wrong, or when the graph reads a variable before defining it (graphs from
/// [`super::trace`] and [`super::GraphBuilder`] never do).
///
/// ```
/// use braintrace_core::graph::interpret;
/// use braintrace_core::{make_graph, Aval, DType, Tensor};
/// let g = make_graph(|x: &[Tensor]| Ok(vec![x[0].exp()?.tanh()?]), &[Aval::new(&[2], DType::F32)])?;
/// // Count equations on the way: the value type is a plain counter.
/// let out = interpret(&g, vec![0usize], |_| 0, |_, args: Vec<usize>| Ok(vec![args[0] + 1]))?;
/// assert_eq!(out, vec![2]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn interpret<V, L, R>(g: &Graph, inputs: Vec<V>, mut lift: L, mut rule: R) -> Result<Vec<V>>
where
    V: Clone,
    L: FnMut(&Tensor) -> V,
    R: FnMut(&Eqn, Vec<V>) -> Result<Vec<V>>,
{
    if inputs.len() != g.invars.len() {
        return Err(Error::arity(
            "graph evaluation",
            g.invars.len(),
            inputs.len(),
        ));
    }
    let last_use = g.last_uses();
    let mut env: Vec<Option<V>> = vec![None; g.avals.len()];
    for (&v, x) in g.invars.iter().zip(inputs) {
        env[v] = Some(x);
    }
    for (&v, c) in g.constvars.iter().zip(&g.consts) {
        env[v] = Some(lift(c));
    }
    for (i, e) in g.eqns.iter().enumerate() {
        let mut args = Vec::with_capacity(e.inputs.len());
        for (j, &v) in e.inputs.iter().enumerate() {
            // Move on the last read of the last use; clone otherwise.
            let last = last_use[v] == i && !e.inputs[j + 1..].contains(&v);
            let slot = if last { env[v].take() } else { env[v].clone() };
            args.push(slot.ok_or_else(|| undefined(e, v))?);
        }
        let outs = rule(e, args)?;
        if outs.len() != e.outputs.len() {
            return Err(Error::invalid(
                e.prim.name(),
                format!(
                    "the interpreter's rule returned {} value(s) for an equation with {} output(s)",
                    outs.len(),
                    e.outputs.len()
                ),
            ));
        }
        for (&v, x) in e.outputs.iter().zip(outs) {
            // Results nobody reads are dropped at once.
            if last_use[v] != NEVER_READ {
                env[v] = Some(x);
            }
        }
    }
    g.outvars
        .iter()
        .map(|&v| {
            env[v].clone().ok_or_else(|| {
                Error::invalid(
                    "graph evaluation",
                    format!("output variable {} is never defined", super::var_name(v)),
                )
            })
        })
        .collect()
}

/// `last_uses` value of a variable no equation or output reads.
pub(crate) const NEVER_READ: usize = usize::MAX - 1;

fn undefined(e: &Eqn, v: VarId) -> Error {
    Error::invalid(
        e.prim.name(),
        format!(
            "operand {} is read before it is defined (the graph is not in SSA order; check it with Graph::validate)",
            super::var_name(v)
        ),
    )
}

impl Graph {
    /// For each variable, the index of the last equation reading it
    /// (`usize::MAX` for graph outputs, [`NEVER_READ`] when nothing reads
    /// it).
    pub(crate) fn last_uses(&self) -> Vec<usize> {
        let mut last = vec![NEVER_READ; self.avals.len()];
        for (i, e) in self.eqns.iter().enumerate() {
            for &v in &e.inputs {
                if let Some(l) = last.get_mut(v) {
                    *l = i;
                }
            }
        }
        for &v in &self.outvars {
            if let Some(l) = last.get_mut(v) {
                *l = usize::MAX;
            }
        }
        last
    }
}
