//! `custom_jvp`: give a function its own forward-mode rule, as
//! `jax.custom_jvp` does. Under tracing a call is **one equation** holding
//! the traced primal graph and the rule; every transform then uses the rule
//! instead of differentiating the primal:
//!
//! * `eval` runs the primal graph; `lower` inlines it (recursively lowered),
//!   so `jit` executes core ops;
//! * `jvp` calls the rule `(primals, tangents) -> (outputs, output tangents)`;
//! * reverse mode (`vjp`, `grad`) linearises through the rule and transposes
//!   the ops it emitted for the tangents, so the tangent outputs must be
//!   *linear* in the tangents (products with functions of the primals, sums,
//!   linear ops) — a rule that is not gives a transpose error under `vjp`;
//! * `vmap` maps the primal graph and the rule.
//!
//! Values the function captures from an enclosing trace become extra
//! operands of the equation (closure conversion), so the equation stays
//! valid after that trace ends. The rule does not see them: differentiating
//! with respect to such a value is refused with an error, as in JAX; pass it
//! as an argument instead. The rule itself should capture only concrete
//! values.
//!
//! Batching a higher-order primitive needs the batching interpreter, so
//! this file calls `transform::vmap_graph` and `transform::vmap`: an arrow
//! up from `ops` to `transform`, which the primitive's place in the op
//! vocabulary asks for (JAX's custom-derivative module imports its batching
//! and AD interpreters the same way).

use crate::error::{Error, Result};
use crate::graph::{self, bind, Graph, Primitive};
use crate::ops::{bcast_to_batch, check_arity};
use crate::tensor::{Aval, Tensor};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A JVP rule: `(primals, tangents) -> (outputs, output tangents)`. Every
/// tangent is given (zeros where the caller has none) with its primal's
/// abstract value; each output tangent must have its output's abstract
/// value and be linear in the tangents.
pub type JvpRule = dyn Fn(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)> + Send + Sync;

/// The primal function of a [`CustomJvp`].
pub type PrimalFn = dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync;

/// A function with a user-supplied JVP rule.
///
/// ```
/// use braintrace_core::{grad, jvp, make_graph, transform::CustomJvp, Aval, DType, Tensor};
/// // x² whose derivative is declared to be 3x (deliberately not 2x).
/// let f = CustomJvp::new(
///     "square3",
///     |a: &[Tensor]| Ok(vec![a[0].square()?]),
///     |p: &[Tensor], t: &[Tensor]| {
///         Ok((vec![p[0].square()?], vec![t[0].mul(&p[0].mul_scalar(3.0)?)?]))
///     },
/// );
/// let x = Tensor::from_vec(vec![2.0], &[1])?;
/// assert_eq!(f.call(&[x.clone()])?[0].to_vec_f64()?, vec![4.0]);
/// let g = grad(|a: &[Tensor]| f.call(a)?[0].sum_all())(&[x])?;
/// assert_eq!(g[0].to_vec_f64()?, vec![6.0]);
/// let graph = make_graph(|a: &[Tensor]| f.call(a), &[Aval::new(&[1], DType::F64)])?;
/// assert_eq!(graph.primitive_names(), vec!["custom_jvp_call"]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone)]
pub struct CustomJvp {
    name: String,
    f: Arc<PrimalFn>,
    rule: Arc<JvpRule>,
}

impl fmt::Debug for CustomJvp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CustomJvp({})", self.name)
    }
}

impl CustomJvp {
    /// A function `f` named `name` (printed in graphs) with the JVP rule
    /// `rule` (see [`JvpRule`]).
    pub fn new<F, R>(name: impl Into<String>, f: F, rule: R) -> Self
    where
        F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
        R: Fn(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)> + Send + Sync + 'static,
    {
        CustomJvp {
            name: name.into(),
            f: Arc::new(f),
            rule: Arc::new(rule),
        }
    }
    /// The name printed in graphs.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Apply the function: eagerly it is just `f(args)`; while tracing it is
    /// one `custom_jvp_call` equation.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        if !graph::is_tracing() {
            return (self.f)(args);
        }
        let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
        let f = &self.f;
        let g = graph::trace(|a: &[Tensor]| f(a), &avals)?;
        let (g, captured) = closure_convert(g);
        let prim = CustomJvpCall {
            name: self.name.clone(),
            graph: Arc::new(g),
            num_args: args.len(),
            rule: self.rule.clone(),
        };
        let operands: Vec<Tensor> = args.iter().cloned().chain(captured).collect();
        bind(Arc::new(prim), &operands)
    }
}

/// `custom_jvp(name, f, rule)`: `f` with the JVP rule `rule`, as a closure
/// (see [`CustomJvp`]).
pub fn custom_jvp<F, R>(
    name: impl Into<String>,
    f: F,
    rule: R,
) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Clone + Send + Sync
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    R: Fn(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)> + Send + Sync + 'static,
{
    let c = CustomJvp::new(name, f, rule);
    move |args: &[Tensor]| c.call(args)
}

/// Move the graph's symbolic constants (values captured from an enclosing
/// trace) to the end of its inputs; returns them as the extra operands.
fn closure_convert(mut g: Graph) -> (Graph, Vec<Tensor>) {
    let mut captured = Vec::new();
    let (mut constvars, mut consts) = (Vec::new(), Vec::new());
    for (v, c) in g.constvars.drain(..).zip(g.consts.drain(..)) {
        if c.is_symbolic() {
            g.invars.push(v);
            captured.push(c);
        } else {
            constvars.push(v);
            consts.push(c);
        }
    }
    g.constvars = constvars;
    g.consts = consts;
    (g, captured)
}

/// The equation of a [`CustomJvp`] call: the traced primal graph (inputs:
/// the arguments, then the captured values) and the rule.
#[derive(Clone)]
pub struct CustomJvpCall {
    name: String,
    graph: Arc<Graph>,
    num_args: usize,
    rule: Arc<JvpRule>,
}

impl fmt::Debug for CustomJvpCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomJvpCall")
            .field("name", &self.name)
            .field("num_args", &self.num_args)
            .field("graph", &self.graph.to_string())
            .finish()
    }
}

impl CustomJvpCall {
    /// The traced primal graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// The function's name.
    pub fn fun_name(&self) -> &str {
        &self.name
    }
    fn op(&self) -> String {
        format!("custom_jvp `{}`", self.name)
    }
}

impl Primitive for CustomJvpCall {
    fn name(&self) -> String {
        "custom_jvp_call".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        let mut p = vec![
            ("name".into(), self.name.clone()),
            ("eqns".into(), self.graph.eqns.len().to_string()),
        ];
        let captured = self.graph.invars.len() - self.num_args;
        if captured > 0 {
            p.push(("captured".into(), captured.to_string()));
        }
        p
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let op = self.op();
        check_arity(&op, inputs, self.graph.invars.len())?;
        for (i, (a, e)) in inputs.iter().zip(self.graph.in_avals()).enumerate() {
            if *a != e {
                return Err(Error::shapes(
                    op,
                    [a.shape(), e.shape()],
                    format!("argument {i} is {a} but the function was traced with {e}"),
                ));
            }
        }
        Ok(self.graph.out_avals())
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.graph.eval(inputs)
    }
    fn jvp(
        &self,
        primals: &[Tensor],
        tangents: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let op = self.op();
        check_arity(&op, primals, self.graph.invars.len())?;
        check_arity(&op, tangents, self.graph.invars.len())?;
        if tangents[self.num_args..].iter().any(Option::is_some) {
            return Err(Error::invalid(
                op,
                "differentiated with respect to a value the function captures from an \
                 enclosing trace; the rule only covers the explicit arguments, so pass \
                 that value as an argument",
            ));
        }
        let args = &primals[..self.num_args];
        if tangents.iter().all(Option::is_none) {
            let outs = bind(Arc::new(self.clone()), primals)?;
            let n = outs.len();
            return Ok((outs, vec![None; n]));
        }
        let tans: Vec<Tensor> = args
            .iter()
            .zip(tangents)
            .map(|(p, t)| t.clone().unwrap_or_else(|| p.zeros_like()))
            .collect();
        let (outs, touts) = (self.rule)(args, &tans)?;
        let want = self.graph.out_avals();
        if outs.len() != want.len() || touts.len() != want.len() {
            return Err(Error::invalid(
                op,
                format!(
                    "the JVP rule returned {} outputs and {} tangents; the function has {} outputs",
                    outs.len(),
                    touts.len(),
                    want.len()
                ),
            ));
        }
        for (i, ((o, t), w)) in outs.iter().zip(&touts).zip(&want).enumerate() {
            if o.aval() != *w || t.aval() != *w {
                return Err(Error::shapes(
                    op,
                    [o.shape(), t.shape(), w.shape()],
                    format!(
                        "output {i}: the JVP rule gives {} with tangent {} but the function \
                         gives {w}; the rule's outputs and tangents must match the function's",
                        o.aval(),
                        t.aval()
                    ),
                ));
            }
        }
        Ok((outs, touts.into_iter().map(Some).collect()))
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let n = self.num_args;
        // The rule cannot see captured values: when one of them is mapped,
        // run the call example by example (each example's call is unbatched).
        if batched[n..].iter().any(|&b| b) || !batched[..n].iter().any(|&b| b) {
            return crate::ops::batch_by_loop(self, args, batched, size);
        }
        let in_avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
        let inner = self.graph.clone();
        let flags = batched.to_vec();
        let g = graph::trace(
            |xs: &[Tensor]| {
                let (outs, obs) = super::vmap_graph(&inner, xs, &flags, size)?;
                outs.iter()
                    .zip(obs)
                    .map(|(o, b)| bcast_to_batch(o, b, size))
                    .collect()
            },
            &in_avals,
        )?;
        let (g, captured) = closure_convert(g);
        if !captured.is_empty() {
            // Not reached: the inner graph's constants are concrete.
            return Err(Error::invalid(
                self.op(),
                "batched primal captured a tracer",
            ));
        }
        let rule = self.rule.clone();
        let arg_flags: Vec<bool> = batched[..n].to_vec();
        let batched_rule = move |p: &[Tensor], t: &[Tensor]| {
            let in_axes: Vec<Option<usize>> = arg_flags
                .iter()
                .chain(&arg_flags)
                .map(|&b| b.then_some(0))
                .collect();
            let rule = rule.clone();
            let flat = move |xs: &[Tensor]| -> Result<Vec<Tensor>> {
                let (o, t) = rule(&xs[..n], &xs[n..])?;
                Ok(o.into_iter().chain(t).collect())
            };
            let all: Vec<Tensor> = p.iter().chain(t).cloned().collect();
            let mut outs = super::vmap(flat, in_axes)(&all)?;
            let touts = outs.split_off(outs.len() / 2);
            Ok((outs, touts))
        };
        let prim = CustomJvpCall {
            name: self.name.clone(),
            graph: Arc::new(g),
            num_args: n,
            rule: Arc::new(batched_rule),
        };
        let outs = bind(Arc::new(prim), args)?;
        let k = outs.len();
        Ok((outs, vec![true; k]))
    }
    fn lower(&self, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
        Some(
            self.graph
                .eval_with(inputs, |e, ins| match e.prim.lower(ins) {
                    Some(r) => r,
                    None => bind(e.prim.clone(), ins),
                }),
        )
    }
    fn cse_key(&self) -> Option<String> {
        // Name and params do not identify the held graph and rule closure:
        // two calls are the same computation only when they share both.
        Some(format!(
            "custom_jvp_call@{:p}@{:p}",
            Arc::as_ptr(&self.graph),
            Arc::as_ptr(&self.rule) as *const ()
        ))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
