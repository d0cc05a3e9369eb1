//! `cond` / `switch`: select one of several closed graphs by a scalar
//! predicate or index (JAX's `lax.cond` / `lax.switch`). Only the selected
//! branch runs; under `vmap` with a predicate that differs across the batch
//! every branch runs and the results are selected element-wise.

use super::{closed, graph_param, mask_for, vmapped, with_unused_inputs};
use crate::error::{Error, Result};
use crate::graph::{self, Graph, LinearArg, Primitive};
use crate::ops::{bcast_to_batch, where_};
use crate::tensor::{Aval, DType, Tensor};
use crate::transform::{jvp_graph, transpose as transpose_graph, vmap_graph};
use std::any::Any;
use std::sync::Arc;

const OP: &str = "cond";

/// A branch function of [`switch`].
pub type Branch<'a> = &'a dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>;

/// The cond primitive: operands `index ++ args`, results those of the
/// selected branch. The index is a boolean scalar (`false` selects branch
/// 0, `true` branch 1) or an `i64` scalar, clamped to the branches' range
/// as JAX's `switch` clamps it. Every branch takes the same operands and
/// returns the same avals.
#[derive(Clone, Debug)]
pub struct Cond {
    branches: Vec<Arc<Graph>>,
}

/// The [`Cond`] behind a graph equation, if it is one.
pub fn as_cond(prim: &dyn Primitive) -> Option<&Cond> {
    prim.as_any().downcast_ref::<Cond>()
}

/// `if pred { true_fn(args) } else { false_fn(args) }` as one `cond`
/// equation (JAX's `lax.cond`); `pred` is a boolean scalar. Both branches
/// must return the same shapes and dtypes.
///
/// ```
/// use braintrace_core::transform::cond;
/// use braintrace_core::{DType, Tensor};
/// let x = Tensor::from_vec(vec![1.0, -2.0], &[2])?;
/// let pred = Tensor::scalar(1.0).cast(DType::Bool)?;
/// let y = cond(
///     &pred,
///     |a: &[Tensor]| Ok(vec![a[0].mul_scalar(2.0)?]),
///     |a: &[Tensor]| Ok(vec![a[0].neg()?]),
///     &[x],
/// )?;
/// assert_eq!(y[0].to_vec_f64()?, vec![2.0, -4.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn cond<T, F>(pred: &Tensor, true_fn: T, false_fn: F, args: &[Tensor]) -> Result<Vec<Tensor>>
where
    T: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    if pred.ndim() != 0 || pred.dtype() != DType::Bool {
        return Err(Error::shapes(
            OP,
            [pred.shape()],
            format!(
                "argument pred must be a boolean scalar, got {}",
                pred.aval()
            ),
        ));
    }
    build(pred, &[&false_fn, &true_fn], args)
}

/// `branches[index](args)` as one `cond` equation (JAX's `lax.switch`);
/// `index` is an `i64` scalar, clamped to `0..branches.len()`.
pub fn switch(index: &Tensor, branches: &[Branch<'_>], args: &[Tensor]) -> Result<Vec<Tensor>> {
    if index.ndim() != 0 || index.dtype() != DType::I64 {
        return Err(Error::shapes(
            "switch",
            [index.shape()],
            format!("argument index must be an i64 scalar, got {}", index.aval()),
        ));
    }
    if branches.is_empty() {
        return Err(Error::invalid("switch", "argument branches is empty"));
    }
    build(index, branches, args)
}

fn build(index: &Tensor, fns: &[Branch<'_>], args: &[Tensor]) -> Result<Vec<Tensor>> {
    let avals = crate::ops::avals(args);
    let mut traced = Vec::with_capacity(fns.len());
    for f in fns {
        traced.push(closed(|a: &[Tensor]| f(a), &avals)?);
    }
    let out0 = traced[0].0.out_avals();
    for (k, (g, _)) in traced.iter().enumerate().skip(1) {
        let out = g.out_avals();
        if out != out0 {
            let shapes: Vec<Vec<usize>> = out0
                .iter()
                .chain(&out)
                .map(|a| a.shape().to_vec())
                .collect();
            return Err(Error::shapes(
                OP,
                shapes,
                format!(
                    "branch {k} returns ({}) but branch 0 returns ({}); every branch must return the same shapes and dtypes",
                    list(&out),
                    list(&out0)
                ),
            ));
        }
    }
    // One signature for all: every branch's captures, then the arguments.
    let cap_avals: Vec<Vec<Aval>> = traced.iter().map(|(_, c)| crate::ops::avals(c)).collect();
    let mut branches = Vec::with_capacity(traced.len());
    for (k, (g, caps)) in traced.iter().enumerate() {
        let before: Vec<Aval> = cap_avals[..k].concat();
        let after: Vec<Aval> = cap_avals[k + 1..].concat();
        let g = with_unused_inputs(g, caps.len(), &after)?;
        let g = with_unused_inputs(&g, 0, &before)?;
        branches.push(Arc::new(g));
    }
    let mut ops = vec![index.clone()];
    for (_, c) in &traced {
        ops.extend(c.iter().cloned());
    }
    ops.extend(args.iter().cloned());
    Cond { branches }.bind(&ops)
}

fn list(avals: &[Aval]) -> String {
    avals
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The branch an index value selects (clamped).
fn branch_of(index: &Tensor, n: usize) -> Result<usize> {
    let v = index.item()?;
    Ok((v.max(0.0) as usize).min(n - 1))
}

impl Cond {
    /// A cond over `branches` (at least one, all of one signature).
    pub fn new(branches: Vec<Graph>) -> Result<Cond> {
        let first = branches
            .first()
            .ok_or_else(|| Error::invalid(OP, "argument branches is empty"))?;
        let (ins, outs) = (first.in_avals(), first.out_avals());
        for (k, b) in branches.iter().enumerate().skip(1) {
            if b.in_avals() != ins || b.out_avals() != outs {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "branch {k} is ({}) -> ({}) but branch 0 is ({}) -> ({})",
                        list(&b.in_avals()),
                        list(&b.out_avals()),
                        list(&ins),
                        list(&outs)
                    ),
                ));
            }
        }
        Ok(Cond {
            branches: branches.into_iter().map(Arc::new).collect(),
        })
    }
    /// The branch graphs (branch 0 is selected by `false` / index 0).
    pub fn branches(&self) -> Vec<&Graph> {
        self.branches.iter().map(|b| &**b).collect()
    }
    /// Every branch evaluated on `args` (`index ++ operands`) and the
    /// selected results kept by `select` (if-conversion: the learning
    /// compiler inlines a cond this way, as braintrace's
    /// `ControlFlowPolicy(cond='convert')` does). Values and tangents equal
    /// the cond's; a branch that is not finite where it is not selected
    /// can still spoil reverse-mode gradients (`0 · NaN`).
    pub fn if_converted(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&crate::ops::avals(args))?;
        let index = &args[0];
        let mut results = Vec::with_capacity(self.branches.len());
        for b in &self.branches {
            results.push(b.eval(&args[1..])?);
        }
        let n = results.len();
        let mut acc = results[0].clone();
        for (k, outs) in results.iter().enumerate().skip(1) {
            let mask = if index.dtype() == DType::Bool {
                index.clone()
            } else {
                let k_t = Tensor::scalar_of(k as f64, DType::I64);
                if k == n - 1 {
                    index.ge(&k_t)?
                } else {
                    index.eq_elem(&k_t)?
                }
            };
            for (a, o) in acc.iter_mut().zip(outs) {
                *a = where_(&mask, o, a)?;
            }
        }
        Ok(acc)
    }
    /// Bind on `index ++ args`.
    pub fn bind(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        graph::bind(Arc::new(self.clone()), args)
    }
}

impl Primitive for Cond {
    fn name(&self) -> String {
        OP.into()
    }
    fn params(&self) -> Vec<(String, String)> {
        self.branches
            .iter()
            .enumerate()
            .map(|(k, b)| (format!("branch{k}"), graph_param(b)))
            .collect()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let want = self.branches[0].in_avals();
        if inputs.len() != want.len() + 1 {
            return Err(Error::arity(OP, want.len() + 1, inputs.len()));
        }
        let p = &inputs[0];
        if p.ndim() != 0 || !matches!(p.dtype(), DType::Bool | DType::I64) {
            return Err(Error::shapes(
                OP,
                [p.shape()],
                format!("the predicate must be a boolean or i64 scalar, got {p}"),
            ));
        }
        for (i, (a, w)) in inputs[1..].iter().zip(&want).enumerate() {
            if a != w {
                return Err(Error::shapes(
                    OP,
                    [a.shape(), w.shape()],
                    format!("operand {i} is {a} but the branches take {w}"),
                ));
            }
        }
        Ok(self.branches[0].out_avals())
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.abstract_eval(&crate::ops::avals(inputs))?;
        let k = branch_of(&inputs[0], self.branches.len())?;
        self.branches[k].eval(&inputs[1..])
    }
    fn jvp(
        &self,
        primals: &[Tensor],
        tangents: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let args = &primals[1..];
        let n = args.len();
        let has: Vec<bool> = tangents[1..]
            .iter()
            .zip(args)
            .map(|(t, a)| t.is_some() && a.dtype().is_float())
            .collect();
        let out_float: Vec<bool> = self.branches[0]
            .out_avals()
            .iter()
            .map(|a| a.dtype().is_float())
            .collect();
        let avals: Vec<Aval> = args
            .iter()
            .map(Tensor::aval)
            .chain(
                args.iter()
                    .zip(&has)
                    .filter(|(_, &h)| h)
                    .map(|(a, _)| a.aval()),
            )
            .collect();
        let mut jbranches = Vec::with_capacity(self.branches.len());
        for b in &self.branches {
            jbranches.push(Arc::new(graph::trace(
                |a: &[Tensor]| {
                    let mut t = a[n..].iter();
                    let tans: Vec<Option<Tensor>> = has
                        .iter()
                        .map(|&h| if h { t.next().cloned() } else { None })
                        .collect();
                    let (outs, touts) = jvp_graph(b, &a[..n], &tans)?;
                    Ok(outs
                        .iter()
                        .zip(touts)
                        .zip(&out_float)
                        .filter(|(_, &f)| f)
                        .map(|((o, t), _)| t.unwrap_or_else(|| o.zeros_like()))
                        .collect())
                },
                &avals,
            )?));
        }
        let outs = self.bind(primals)?;
        let ops: Vec<Tensor> = primals
            .iter()
            .cloned()
            .chain(
                tangents[1..]
                    .iter()
                    .zip(&has)
                    .filter(|(_, &h)| h)
                    .filter_map(|(t, _)| t.clone()),
            )
            .collect();
        let mut res = Cond {
            branches: jbranches,
        }
        .bind(&ops)?
        .into_iter();
        let touts = out_float
            .iter()
            .map(|&f| if f { res.next() } else { None })
            .collect();
        Ok((outs, touts))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let index = args[0].known(OP)?.clone();
        let lin: Vec<bool> = args[1..].iter().map(LinearArg::is_linear).collect();
        if cts.iter().all(Option::is_none) || !lin.iter().any(|&l| l) {
            return Ok(vec![None; args.len()]);
        }
        let mut tbranches = Vec::with_capacity(self.branches.len());
        for b in &self.branches {
            tbranches.push(Arc::new(transpose_graph(b, &lin)?));
        }
        let mut ops = vec![index];
        for a in &args[1..] {
            if let LinearArg::Known(t) = a {
                ops.push(t.clone());
            }
        }
        for (c, a) in cts.iter().zip(self.branches[0].out_avals()) {
            ops.push(c.clone().unwrap_or_else(|| Tensor::zeros_aval(&a)));
        }
        let mut res = Cond {
            branches: tbranches,
        }
        .bind(&ops)?
        .into_iter();
        Ok(std::iter::once(None)
            .chain(lin.iter().map(|&l| if l { res.next() } else { None }))
            .collect())
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let flags = &batched[1..];
        if !batched[0] {
            // One predicate for the whole batch: a cond of vmapped branches,
            // an output batched in any branch batched in all.
            let mut force = vec![false; self.branches[0].outvars().len()];
            for b in &self.branches {
                let (_, ob) = vmapped(b, flags, size, &[])?;
                for (f, o) in force.iter_mut().zip(ob) {
                    *f |= o;
                }
            }
            let mut branches = Vec::with_capacity(self.branches.len());
            for b in &self.branches {
                branches.push(Arc::new(vmapped(b, flags, size, &force)?.0));
            }
            let outs = Cond { branches }.bind(args)?;
            return Ok((outs, force));
        }
        // A predicate per example: run every branch and select.
        let index = &args[0];
        let mut results: Vec<Vec<Tensor>> = Vec::with_capacity(self.branches.len());
        for b in &self.branches {
            let (outs, ob) = vmap_graph(b, &args[1..], flags, size)?;
            results.push(
                outs.iter()
                    .zip(ob)
                    .map(|(o, b)| bcast_to_batch(o, b, size))
                    .collect::<Result<_>>()?,
            );
        }
        let n = results.len();
        let mut acc = results[0].clone();
        for (k, outs) in results.iter().enumerate().skip(1) {
            let mask = if index.dtype() == DType::Bool {
                index.clone()
            } else {
                let k_t = Tensor::scalar_of(k as f64, DType::I64);
                if k == n - 1 {
                    index.ge(&k_t)?
                } else {
                    index.eq_elem(&k_t)?
                }
            };
            for (a, o) in acc.iter_mut().zip(outs) {
                *a = where_(&mask_for(&mask, o.ndim())?, o, a)?;
            }
        }
        let m = acc.len();
        Ok((acc, vec![true; m]))
    }
    fn cse_key(&self) -> Option<String> {
        let ptrs: Vec<String> = self
            .branches
            .iter()
            .map(|b| format!("{:p}", Arc::as_ptr(b)))
            .collect();
        Some(format!("cond@[{}]", ptrs.join(" ")))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
