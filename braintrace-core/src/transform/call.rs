//! The closed-graph call: one equation that holds a whole graph (like JAX's
//! `pjit` or autodidax's `xla_call`), so a staged sub-program stays one
//! equation under analysis. Its rules are the transforms of the inner graph,
//! staged as new calls (`jvp(name)`, `transpose(name)`, `vmap(name)`); its
//! lowering inlines the inner graph, and lowering recurses into it.
//!
//! Known cost: the JVP keeps the primal call and adds a tangent call that
//! recomputes the primal values it needs (there is no partial evaluation
//! *inside* a call yet), so differentiating a call evaluates its primal part
//! twice.

use super::batching::vmap_graph;
use super::jvp_graph;
use super::linearize::transpose;
use crate::error::{Error, Result};
use crate::graph::{self, Graph, LinearArg, Primitive};
use crate::tensor::{Aval, Tensor};
use std::any::Any;
use std::sync::Arc;

/// A closed-graph call primitive: `outputs = call[name](inputs)` runs the
/// held graph.
///
/// ```
/// use braintrace_core::transform::call;
/// use braintrace_core::{make_graph, Aval, DType, Tensor};
/// let f = |a: &[Tensor]| call("softplus", |b: &[Tensor]| Ok(vec![b[0].exp()?.add_scalar(1.0)?.log()?]), a);
/// let g = make_graph(f, &[Aval::new(&[3], DType::F64)])?;
/// assert_eq!(g.primitive_names(), vec!["call"]); // one equation
/// assert_eq!(g.lower()?.primitive_names(), vec!["exp", "add_scalar", "log"]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Call {
    name: String,
    graph: Arc<Graph>,
}

impl Call {
    /// A call of `graph`, printed with `name`.
    pub fn new(name: impl Into<String>, graph: Graph) -> Call {
        Call {
            name: name.into(),
            graph: Arc::new(graph),
        }
    }
    /// The held graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// The call's name.
    pub fn call_name(&self) -> &str {
        &self.name
    }
    /// Bind the call on `args` (one equation while tracing; evaluates the
    /// graph eagerly otherwise).
    pub fn bind(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        graph::bind(Arc::new(self.clone()), args)
    }
}

/// Trace `f` on the avals of `args` into a graph and bind it as one
/// [`Call`] equation named `name`.
pub fn call<F>(name: &str, f: F, args: &[Tensor]) -> Result<Vec<Tensor>>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let g = super::make_graph(f, &crate::ops::avals(args))?;
    Call::new(name, g).bind(args)
}

/// The [`Call`] behind a graph equation, if it is one.
pub fn as_call(prim: &dyn Primitive) -> Option<&Call> {
    prim.as_any().downcast_ref::<Call>()
}

impl Primitive for Call {
    fn name(&self) -> String {
        "call".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![
            ("name".into(), self.name.clone()),
            ("eqns".into(), self.graph.eqns().len().to_string()),
        ]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        let want = self.graph.in_avals();
        if inputs.len() != want.len() {
            return Err(Error::arity(
                format!("call {}", self.name),
                want.len(),
                inputs.len(),
            ));
        }
        for (i, (a, w)) in inputs.iter().zip(&want).enumerate() {
            if a != w {
                return Err(Error::invalid(
                    format!("call {}", self.name),
                    format!("argument {i} is {a} but the called graph takes {w}"),
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
        let n = primals.len();
        let mask: Vec<bool> = tangents.iter().map(Option::is_some).collect();
        let avals: Vec<Aval> = primals
            .iter()
            .map(Tensor::aval)
            .chain(tangents.iter().flatten().map(Tensor::aval))
            .collect();
        // The primal stays this call; the tangents are a second call of the
        // JVP graph that returns tangents only, so that linearisation sees
        // the primal outputs as known values. (The tangent call recomputes
        // the primal values it needs.)
        let mut out_mask = Vec::new();
        let jg = graph::trace(
            |args: &[Tensor]| {
                let mut t = args[n..].iter();
                let tans: Vec<Option<Tensor>> = mask
                    .iter()
                    .map(|&m| if m { t.next().cloned() } else { None })
                    .collect();
                let (_, touts) = jvp_graph(&self.graph, &args[..n], &tans)?;
                out_mask = touts.iter().map(Option::is_some).collect();
                Ok(touts.into_iter().flatten().collect())
            },
            &avals,
        )?;
        let outs = self.bind(primals)?;
        let args: Vec<Tensor> = primals
            .iter()
            .cloned()
            .chain(tangents.iter().flatten().cloned())
            .collect();
        let mut res = Call::new(format!("jvp({})", self.name), jg)
            .bind(&args)?
            .into_iter();
        let touts = out_mask
            .iter()
            .map(|&m| if m { res.next() } else { None })
            .collect();
        Ok((outs, touts))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let linear: Vec<bool> = args.iter().map(LinearArg::is_linear).collect();
        let tg = transpose(&self.graph, &linear)?;
        let mut ins = Vec::with_capacity(args.len() + cts.len());
        for a in args {
            if let LinearArg::Known(t) = a {
                ins.push(t.clone());
            }
        }
        for (c, a) in cts.iter().zip(self.graph.out_avals()) {
            ins.push(c.clone().unwrap_or_else(|| Tensor::zeros_aval(&a)));
        }
        let mut res = Call::new(format!("transpose({})", self.name), tg)
            .bind(&ins)?
            .into_iter();
        Ok(linear
            .iter()
            .map(|&l| if l { res.next() } else { None })
            .collect())
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let mut out_batched = Vec::new();
        let bg = graph::trace(
            |a: &[Tensor]| {
                let (outs, ob) = vmap_graph(&self.graph, a, batched, size)?;
                out_batched = ob;
                Ok(outs)
            },
            &crate::ops::avals(args),
        )?;
        let outs = Call::new(format!("vmap({})", self.name), bg).bind(args)?;
        Ok((outs, out_batched))
    }
    fn lower(&self, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
        Some(self.graph.eval(inputs))
    }
    fn cse_key(&self) -> Option<String> {
        // Two calls are the same computation when they hold the same graph.
        Some(format!("call@{:p}", Arc::as_ptr(&self.graph)))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
