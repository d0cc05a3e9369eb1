//! Reverse mode: linearize (trace the JVP, evaluate the part that does not
//! depend on tangents, keep the linear rest) and transpose the linear part.

use super::{jvp_graph, make_graph};
use crate::error::{Error, Result};
use crate::graph::{self, LinearArg, Primitive, VarId};
use crate::ops::elementwise::add_opt;
use crate::tensor::{Aval, Tensor};
use std::sync::Arc;

/// An operand of a linear equation: a residual value or a linear variable.
#[derive(Clone, Debug)]
enum Operand {
    Known(Tensor),
    Linear(VarId),
}

#[derive(Clone, Debug)]
struct LinEqn {
    prim: Arc<dyn Primitive>,
    inputs: Vec<Operand>,
    outputs: Vec<VarId>,
}

/// The pullback returned by [`vjp`]: call [`VjpFn::apply`] with one
/// cotangent per output of the function to get one per input.
#[derive(Clone, Debug)]
pub struct VjpFn {
    avals: Vec<Aval>,
    in_vars: Vec<Option<VarId>>,
    in_avals: Vec<Aval>,
    out_vars: Vec<Option<VarId>>,
    out_avals: Vec<Aval>,
    eqns: Vec<LinEqn>,
}

impl VjpFn {
    /// Cotangents of the inputs given cotangents of the outputs.
    pub fn apply(&self, cotangents: &[Tensor]) -> Result<Vec<Tensor>> {
        if cotangents.len() != self.out_avals.len() {
            return Err(Error::transform(
                "vjp",
                format!(
                    "the function has {} outputs but {} cotangents were given",
                    self.out_avals.len(),
                    cotangents.len()
                ),
            ));
        }
        for (i, (c, a)) in cotangents.iter().zip(&self.out_avals).enumerate() {
            if c.aval() != *a {
                return Err(Error::transform(
                    "vjp",
                    format!("cotangent {i} is {} but the output is {a}", c.aval()),
                ));
            }
        }
        let mut ct: Vec<Option<Tensor>> = vec![None; self.avals.len()];
        for (v, c) in self.out_vars.iter().zip(cotangents) {
            if let Some(v) = v {
                ct[*v] = add_opt(ct[*v].take(), Some(c.clone()))?;
            }
        }
        for e in self.eqns.iter().rev() {
            let cts: Vec<Option<Tensor>> = e.outputs.iter().map(|&v| ct[v].take()).collect();
            if cts.iter().all(Option::is_none) {
                continue;
            }
            let args: Vec<LinearArg> = e
                .inputs
                .iter()
                .map(|o| match o {
                    Operand::Known(t) => LinearArg::Known(t.clone()),
                    Operand::Linear(v) => LinearArg::Linear(self.avals[*v].clone()),
                })
                .collect();
            let res = e.prim.transpose(&cts, &args)?;
            for (o, r) in e.inputs.iter().zip(res) {
                if let (Operand::Linear(v), Some(r)) = (o, r) {
                    ct[*v] = add_opt(ct[*v].take(), Some(r))?;
                }
            }
        }
        Ok(self
            .in_vars
            .iter()
            .zip(&self.in_avals)
            .map(|(v, a)| {
                v.and_then(|v| ct[v].clone())
                    .unwrap_or_else(|| Tensor::zeros_aval(a))
            })
            .collect())
    }
}

/// Reverse-mode derivative: `(f(primals), pullback)`.
///
/// ```
/// use braintrace_core::{vjp, Tensor};
/// let x = Tensor::from_vec(vec![1.0, 2.0], &[2])?;
/// let (y, pullback) = vjp(|a: &[Tensor]| Ok(vec![a[0].square()?]), &[x])?;
/// let g = pullback.apply(&[y[0].ones_like()])?;
/// assert_eq!(g[0].to_vec_f64()?, vec![2.0, 4.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn vjp<F>(f: F, primals: &[Tensor]) -> Result<(Vec<Tensor>, VjpFn)>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let in_avals = crate::ops::avals(primals);
    let g = make_graph(f, &in_avals)?;
    let n_out = g.outvars.len();
    let diff: Vec<bool> = in_avals.iter().map(|a| a.dtype().is_float()).collect();
    let tan_avals: Vec<Aval> = in_avals
        .iter()
        .zip(&diff)
        .filter(|(_, &d)| d)
        .map(|(a, _)| a.clone())
        .collect();
    // Trace the JVP with the primals captured as constants and the tangents as inputs.
    let j = graph::trace(
        |tans: &[Tensor]| {
            let mut it = tans.iter();
            let t: Vec<Option<Tensor>> = diff
                .iter()
                .map(|&d| if d { it.next().cloned() } else { None })
                .collect();
            let (outs, touts) = jvp_graph(&g, primals, &t)?;
            let touts: Vec<Tensor> = outs
                .iter()
                .zip(touts)
                .map(|(o, t)| t.unwrap_or_else(|| o.zeros_like()))
                .collect();
            Ok(outs.into_iter().chain(touts).collect())
        },
        &tan_avals,
    )?;
    // Partial evaluation: known equations run now; linear ones are kept.
    let mut known: Vec<Option<Tensor>> = vec![None; j.avals.len()];
    let mut linear = vec![false; j.avals.len()];
    for &v in &j.invars {
        linear[v] = true;
    }
    for (&v, c) in j.constvars.iter().zip(&j.consts) {
        known[v] = Some(c.clone());
    }
    let mut eqns = Vec::new();
    for e in &j.eqns {
        if e.inputs.iter().any(|&v| linear[v]) {
            let inputs = e
                .inputs
                .iter()
                .map(|&v| {
                    if linear[v] {
                        Operand::Linear(v)
                    } else {
                        Operand::Known(known[v].clone().expect("known"))
                    }
                })
                .collect();
            for &v in &e.outputs {
                linear[v] = true;
            }
            eqns.push(LinEqn {
                prim: e.prim.clone(),
                inputs,
                outputs: e.outputs.clone(),
            });
        } else {
            let ins: Vec<Tensor> = e
                .inputs
                .iter()
                .map(|&v| known[v].clone().expect("known"))
                .collect();
            for (&v, o) in e.outputs.iter().zip(graph::bind(e.prim.clone(), &ins)?) {
                known[v] = Some(o);
            }
        }
    }
    let outs: Vec<Tensor> = j.outvars[..n_out]
        .iter()
        .map(|&v| {
            known[v]
                .clone()
                .ok_or_else(|| Error::transform("vjp", "a primal output depends on tangents"))
        })
        .collect::<Result<_>>()?;
    let out_vars = j.outvars[n_out..]
        .iter()
        .map(|&v| linear[v].then_some(v))
        .collect();
    let mut inv = j.invars.iter();
    let in_vars = diff
        .iter()
        .map(|&d| if d { inv.next().copied() } else { None })
        .collect();
    let out_avals = g.out_avals();
    Ok((
        outs,
        VjpFn {
            avals: j.avals.clone(),
            in_vars,
            in_avals,
            out_vars,
            out_avals,
            eqns,
        },
    ))
}

fn scalar_out(f_out: Tensor) -> Result<Tensor> {
    if f_out.ndim() != 0 {
        return Err(Error::transform(
            "grad",
            format!("the function must return a scalar (shape []), got shape {:?}; reduce it (e.g. sum_all) or use vjp", f_out.shape()),
        ));
    }
    if !f_out.dtype().is_float() {
        return Err(Error::transform(
            "grad",
            format!("the output must be a float, got {}", f_out.dtype()),
        ));
    }
    Ok(f_out)
}

/// `value_and_grad(f)(args) = (f(args), [∂f/∂arg for each arg])` for a scalar `f`.
pub fn value_and_grad<F>(f: F) -> impl Fn(&[Tensor]) -> Result<(Tensor, Vec<Tensor>)>
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
{
    move |args: &[Tensor]| {
        let (outs, pb) = vjp(|a: &[Tensor]| Ok(vec![scalar_out(f(a)?)?]), args)?;
        let y = outs.into_iter().next().expect("one output");
        let g = pb.apply(&[y.ones_like()])?;
        Ok((y, g))
    }
}

/// [`value_and_grad`] in the composable `Vec` form: the value first, then
/// one gradient per argument, so it nests in `jit` and `vmap`.
pub fn value_and_grad_vec<F>(f: F) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>>
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
{
    let vg = value_and_grad(f);
    move |args: &[Tensor]| {
        let (v, g) = vg(args)?;
        Ok(std::iter::once(v).chain(g).collect())
    }
}

/// `grad(f)(args)`: the gradient of a scalar function with respect to every
/// argument (integer arguments get zeros).
///
/// ```
/// use braintrace_core::{grad, Tensor};
/// let df = grad(|a: &[Tensor]| a[0].square()?.sum_all());
/// let g = df(&[Tensor::from_vec(vec![3.0], &[1])?])?;
/// assert_eq!(g[0].to_vec_f64()?, vec![6.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn grad<F>(f: F) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>>
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
{
    let vg = value_and_grad(f);
    move |args: &[Tensor]| Ok(vg(args)?.1)
}

/// `grad` of a function written in the common `Vec`-returning form, whose
/// single output must be a scalar.
pub fn grad_scalar<F>(f: F) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    grad(move |a: &[Tensor]| {
        let mut o = f(a)?;
        if o.len() != 1 {
            return Err(Error::transform(
                "grad",
                format!(
                    "the function must return exactly one output, got {}",
                    o.len()
                ),
            ));
        }
        Ok(o.remove(0))
    })
}
