//! Transforms built on the tracer: `make_graph`, `eval_shape`, `jvp`,
//! `vjp` (linearize + transpose), `grad`, `value_and_grad`, `vmap`, `jit`.
//!
//! Every transform first traces the function into a [`Graph`], then
//! interprets that graph with its own rule per equation. Interpreting binds
//! through the same [`crate::graph::bind`], so a transform applied inside
//! another transform's trace simply records equations there: transforms
//! nest in any order, and closures may capture tensors of an enclosing trace.

mod batching;
mod call;
pub mod control;
mod custom_jvp;
mod jit;
mod linearize;
mod simplify;

pub use batching::{vmap, vmap_graph, vmap_out};
pub use call::{as_call, call, Call};
pub use control::{cond, scan, switch, while_loop};
pub use custom_jvp::{custom_jvp, CustomJvp, CustomJvpCall, JvpRule, PrimalFn};
pub(crate) use jit::Staged;
pub use jit::{jit, Jit};
pub use linearize::{
    grad, grad_scalar, linearize, transpose, value_and_grad, value_and_grad_vec, vjp, vjp_graph,
    vjp_graph_at, vjp_graph_of, vjp_of_graph, Linearized, VjpFn,
};

use crate::error::{Error, Result};
use crate::graph::{self, Graph};
use crate::tensor::{Aval, Tensor};

/// Trace `f` on symbolic inputs with the given abstract values.
///
/// ```
/// use braintrace_core::{make_graph, Aval, DType, Tensor};
/// let g = make_graph(|x: &[Tensor]| Ok(vec![x[0].tanh()?.mul_scalar(2.0)?]), &[Aval::new(&[3], DType::F32)])?;
/// assert_eq!(g.primitive_names(), vec!["tanh", "mul_scalar"]);
/// println!("{g}");
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn make_graph<F>(f: F, avals: &[Aval]) -> Result<Graph>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    graph::trace(f, avals)
}

/// Output abstract values of `f` without computing anything.
pub fn eval_shape<F>(f: F, avals: &[Aval]) -> Result<Vec<Aval>>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    Ok(make_graph(f, avals)?.out_avals())
}

/// Forward-mode derivative: `(f(primals), J·tangents)`.
///
/// ```
/// use braintrace_core::{jvp, Tensor};
/// let x = Tensor::from_vec(vec![0.5], &[1])?;
/// let (y, t) = jvp(|a: &[Tensor]| Ok(vec![a[0].square()?]), &[x.clone()], &[x.ones_like()])?;
/// assert_eq!(t[0].to_vec_f64()?, vec![1.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn jvp<F>(f: F, primals: &[Tensor], tangents: &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    if primals.len() != tangents.len() {
        return Err(Error::transform(
            "jvp",
            format!("{} primals but {} tangents", primals.len(), tangents.len()),
        ));
    }
    for (i, (p, t)) in primals.iter().zip(tangents).enumerate() {
        if p.aval() != t.aval() {
            return Err(Error::transform(
                "jvp",
                format!("tangent {i} is {} but its primal is {}", t.aval(), p.aval()),
            ));
        }
    }
    let g = make_graph(f, &crate::ops::avals(primals))?;
    let tans: Vec<Option<Tensor>> = tangents.iter().cloned().map(Some).collect();
    let (outs, touts) = jvp_graph(&g, primals, &tans)?;
    let touts = outs
        .iter()
        .zip(touts)
        .map(|(o, t)| t.unwrap_or_else(|| o.zeros_like()))
        .collect();
    Ok((outs, touts))
}

/// Interpret a graph with JVP rules. `None` tangents are symbolic zeros.
pub fn jvp_graph(
    g: &Graph,
    primals: &[Tensor],
    tangents: &[Option<Tensor>],
) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
    if primals.len() != g.invars.len() || tangents.len() != g.invars.len() {
        return Err(Error::arity(
            "jvp",
            format!("{} primals and as many tangents", g.invars.len()),
            primals.len().min(tangents.len()),
        ));
    }
    let inputs: Vec<(Tensor, Option<Tensor>)> = primals
        .iter()
        .cloned()
        .zip(tangents.iter().cloned())
        .collect();
    let outs = graph::interpret(
        g,
        inputs,
        |c| (c.clone(), None),
        |e, args: Vec<(Tensor, Option<Tensor>)>| {
            let (ins, tins): (Vec<Tensor>, Vec<Option<Tensor>>) = args.into_iter().unzip();
            let (outs, touts) = if tins.iter().all(Option::is_none) {
                let outs = graph::bind(e.prim().clone(), &ins)?;
                let n = outs.len();
                (outs, vec![None; n])
            } else {
                e.prim().jvp(&ins, &tins)?
            };
            if touts.len() != outs.len() {
                return Err(Error::invalid(
                    e.prim().name(),
                    format!(
                        "the JVP rule returned {} tangent(s) for {} output(s)",
                        touts.len(),
                        outs.len()
                    ),
                ));
            }
            Ok(outs.into_iter().zip(touts).collect())
        },
    )?;
    Ok(outs.into_iter().unzip())
}
