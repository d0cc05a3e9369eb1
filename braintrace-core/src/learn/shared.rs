//! Small tensor helpers the algorithms' trace rules share: slicing and
//! stacking the trailing state axis, sums of products, maps of per-weight
//! tensors, and reducing a gradient to its parameter's shape.

use super::compiler::EtraceGraph;
use crate::error::{Error, Result};
use crate::etp::TensorMap;
use crate::tensor::{Aval, Tensor};
use std::collections::BTreeMap;

/// Slice the trailing axis at `i` (dropping it).
pub(crate) fn last(t: &Tensor, i: usize) -> Result<Tensor> {
    t.index_axis(t.ndim() - 1, i)
}

/// `Σ a ⊙ b` over `terms` (at least one), left to right.
pub(crate) fn sum_of_products<'a>(
    mut terms: impl Iterator<Item = (&'a Tensor, &'a Tensor)>,
) -> Result<Tensor> {
    let (a, b) = terms
        .next()
        .ok_or_else(|| Error::invalid("learning step", "a sum of no products"))?;
    terms.try_fold(a.mul(b)?, |acc, (a, b)| acc.add(&a.mul(b)?))
}

/// Stack on a new trailing axis.
pub(crate) fn stack_last(ts: &[Tensor]) -> Result<Tensor> {
    crate::ops::stack(ts, ts[0].ndim())
}

/// Sum leading axes until `t` has the shape `like`; then the axes along
/// which a parameter with size-1 axes broadcasts (a convolution bias of
/// shape `(1.., C)` against its per-position gradient, right-aligned), the
/// size-1 axes restored.
pub(crate) fn reduce_to(t: &Tensor, like: &[usize], what: &str) -> Result<Tensor> {
    let mut t = t.clone();
    if t.ndim() > like.len() {
        let axes: Vec<usize> = (0..t.ndim() - like.len()).collect();
        t = t.sum(&axes)?;
    }
    if t.shape() != like {
        let off = like.len() - t.ndim();
        let axes: Vec<usize> = (0..t.ndim())
            .filter(|&a| like[a + off] == 1 && t.shape()[a] != 1)
            .collect();
        let s = if axes.is_empty() {
            t.clone()
        } else {
            t.sum(&axes)?
        };
        let non1 = |v: &[usize]| v.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        let core = non1(like);
        if non1(s.shape()) == core {
            t = s.reshape(like)?;
        } else if t.ndim() > core.len() && t.shape()[t.ndim() - core.len()..] == core[..] {
            // Leading (batch) axes over a parameter whose size-1 axes are
            // not trailing (a channel-first bias `(1, C, 1..)`).
            let axes: Vec<usize> = (0..t.ndim() - core.len()).collect();
            t = t.sum(&axes)?.reshape(like)?;
        }
    }
    if t.shape() != like {
        return Err(Error::shapes(
            "etrace solve",
            [t.shape(), like],
            format!("the gradient of `{what}` (first) does not reduce to its parameter's shape (second)"),
        ));
    }
    Ok(t)
}

/// `a + b` key by key (a key in one only is kept as it is).
pub(crate) fn add_maps(a: Option<TensorMap>, b: TensorMap) -> Result<TensorMap> {
    match a {
        None => Ok(b),
        Some(mut a) => {
            for (k, v) in b {
                let s = match a.remove(&k) {
                    Some(x) => x.add(&v)?,
                    None => v,
                };
                a.insert(k, s);
            }
            Ok(a)
        }
    }
}

/// Relation `rel`'s trainables by name, with their values in `params`.
pub(crate) fn weights(eg: &EtraceGraph, rel: usize, params: &[Tensor]) -> TensorMap {
    eg.relations()[rel]
        .trainables
        .iter()
        .map(|t| (t.name.clone(), params[t.param].clone()))
        .collect()
}

/// Relation `rel`'s trainables by name, with their abstract values in the
/// step graph (what a rule's initialiser is given).
pub(crate) fn weight_avals(eg: &EtraceGraph, rel: usize) -> BTreeMap<String, Aval> {
    let g = eg.graph();
    eg.relations()[rel]
        .trainables
        .iter()
        .map(|t| (t.name.clone(), g.aval(g.invars()[t.param]).clone()))
        .collect()
}
