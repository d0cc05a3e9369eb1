//! Control flow inside a traced function, as closed-graph equations (like
//! JAX's `lax.cond`, `lax.scan` and `lax.while_loop`): [`cond`] / [`switch`]
//! select one of several graphs by a scalar predicate or index, [`scan`]
//! runs a body graph a fixed number of times over a carry and per-iteration
//! slices, [`while_loop`] runs a body graph while a condition graph holds.
//!
//! Each is one equation holding its graphs, so it stays one unit under
//! analysis and in the printed graph. Its rules are built from the
//! transforms of the held graphs: the JVP of a loop is a loop over the
//! JVP of its body, the transpose of a fixed-count scan is a scan in the
//! opposite direction over the transposed body, the batching rule is the
//! same construct over the vmapped graphs (a predicate that differs across
//! the batch turns a `cond` into a select and masks a `while` body).
//! A `while` has no transpose: its trip count is known only at run time, so
//! reverse mode through it is an error naming it (forward mode works).
//!
//! Closures may capture tensors of an enclosing trace: those captures become
//! explicit operands of the equation (closure conversion), so derivatives
//! and batching flow into them.

mod cond;
mod scan;
mod while_loop;

pub use cond::{as_cond, cond, switch, Branch, Cond};
pub use scan::{as_scan, scan, Scan};
pub use while_loop::{as_while, while_loop, While};

use super::batching::vmap_graph;
use crate::error::Result;
use crate::graph::{self, Graph};
use crate::ops::bcast_to_batch;
use crate::tensor::{Aval, Tensor};

/// Trace `f` on `avals` into a graph whose symbolic captures (tensors of an
/// enclosing trace) are leading inputs; returns the graph and the captured
/// tensors to pass for them. Concrete captures stay constants of the graph.
pub(crate) fn closed<F>(f: F, avals: &[Aval]) -> Result<(Graph, Vec<Tensor>)>
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let g = graph::trace(f, avals)?;
    let (mut lifted_vars, mut lifted) = (Vec::new(), Vec::new());
    let (mut constvars, mut consts) = (Vec::new(), Vec::new());
    for (&v, c) in g.constvars.iter().zip(&g.consts) {
        if c.is_symbolic() {
            lifted_vars.push(v);
            lifted.push(c.clone());
        } else {
            constvars.push(v);
            consts.push(c.clone());
        }
    }
    lifted_vars.extend(&g.invars);
    let closed = Graph {
        avals: g.avals,
        invars: lifted_vars,
        constvars,
        consts,
        eqns: g.eqns,
        outvars: g.outvars,
    };
    Ok((closed, lifted))
}

/// `g` with `extra` unused inputs inserted at position `at` (to give
/// branches traced apart one signature).
pub(crate) fn with_unused_inputs(g: &Graph, at: usize, extra: &[Aval]) -> Result<Graph> {
    let mut avals = g.in_avals();
    let tail = avals.split_off(at);
    let n_head = avals.len();
    avals.extend(extra.iter().cloned());
    avals.extend(tail);
    graph::trace(
        |a: &[Tensor]| {
            let args: Vec<Tensor> = a[..n_head]
                .iter()
                .chain(&a[n_head + extra.len()..])
                .cloned()
                .collect();
            g.eval(&args)
        },
        &avals,
    )
}

/// Which outputs of `g` depend on the inputs flagged in `lin` (a forward
/// reachability walk; any operand flagged flags all results).
pub(crate) fn dependent_outputs(g: &Graph, lin: &[bool]) -> Vec<bool> {
    let mut dep = vec![false; g.num_vars()];
    for (&v, &l) in g.invars().iter().zip(lin) {
        dep[v] = l;
    }
    for e in g.eqns() {
        if e.inputs().iter().any(|&v| dep[v]) {
            for &o in e.outputs() {
                dep[o] = true;
            }
        }
    }
    g.outvars().iter().map(|&v| dep[v]).collect()
}

/// The aval of a value batched on a new leading axis of `size`.
pub(crate) fn batched_aval(a: &Aval, size: usize) -> Aval {
    let mut s = vec![size];
    s.extend(a.shape());
    a.with_shape(&s)
}

/// `g` vmapped over the inputs flagged in `batched` (batch axis 0, of
/// `size`) as a new graph; outputs flagged in `force` are broadcast to the
/// batch when the vmapped graph leaves them unbatched. Returns the graph and
/// which outputs are batched.
pub(crate) fn vmapped(
    g: &Graph,
    batched: &[bool],
    size: usize,
    force: &[bool],
) -> Result<(Graph, Vec<bool>)> {
    let avals: Vec<Aval> = g
        .in_avals()
        .iter()
        .zip(batched)
        .map(|(a, &b)| if b { batched_aval(a, size) } else { a.clone() })
        .collect();
    let mut flags = Vec::new();
    let vg = graph::trace(
        |a: &[Tensor]| {
            let (outs, ob) = vmap_graph(g, a, batched, size)?;
            let mut res = Vec::with_capacity(outs.len());
            flags.clear();
            for (i, (o, b)) in outs.into_iter().zip(ob).enumerate() {
                let f = force.get(i).copied().unwrap_or(false);
                res.push(if f { bcast_to_batch(&o, b, size)? } else { o });
                flags.push(b || f);
            }
            Ok(res)
        },
        &avals,
    )?;
    Ok((vg, flags))
}

/// Move axis 1 to the front (`(T, B, ...)` <-> `(B, T, ...)`).
pub(crate) fn swap01(x: &Tensor) -> Result<Tensor> {
    let mut perm: Vec<usize> = (0..x.ndim()).collect();
    perm.swap(0, 1);
    x.transpose(&perm)
}

/// A graph as a parameter value: printed in full, so that the printer
/// shows the held graphs.
pub(crate) fn graph_param(g: &Graph) -> String {
    format!("{g}")
}

/// Reshape a batch-shaped mask `(B,)` so that it broadcasts against a
/// batched value of rank `ndim` (`(B, 1, 1, ...)`).
pub(crate) fn mask_for(mask: &Tensor, ndim: usize) -> Result<Tensor> {
    let mut s = vec![mask.shape()[0]];
    s.extend(std::iter::repeat_n(1, ndim.saturating_sub(1)));
    mask.reshape(&s)
}
