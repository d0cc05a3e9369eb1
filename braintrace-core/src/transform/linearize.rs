//! Reverse mode as programs. [`linearize`] splits a graph into a primal
//! graph that also returns the residuals and a linear graph of the tangents;
//! [`transpose`] turns a linear graph into the graph of its transpose;
//! [`vjp_graph`] / [`vjp_graph_of`] / [`vjp_graph_at`] stage a whole VJP as
//! one graph that can be printed, jitted and run on new inputs. [`vjp`],
//! [`grad`] and [`value_and_grad`] are built on the same two steps.
//!
//! Linearisation traces the JVP of the graph with symbolic primals and
//! tangents, then walks that joint graph with the interpreter, marking each
//! value *known* (depends on primals only) or *linear* (depends on
//! tangents): known equations are evaluated (or recorded into the active
//! trace), linear ones are kept, and the known values they read are the
//! residuals.

use super::{jvp_graph, make_graph};
use crate::error::{Error, Result};
use crate::graph::{self, Eqn, Graph, LinearArg, VarId};
use crate::ops::elementwise::{add_opt, Binary, BinaryOp};
use crate::tensor::{Aval, Tensor};
use std::sync::Arc;

/// The two halves of a linearised graph (see [`linearize`]).
#[derive(Clone, Debug)]
pub struct Linearized {
    /// `primals -> outputs ++ residuals`.
    pub primal: Graph,
    /// `residuals ++ tangents -> output tangents`, linear in the tangents.
    /// One tangent per input of the original graph; the tangents of
    /// non-float inputs are ignored.
    pub linear: Graph,
    /// How many residuals the primal graph returns after the outputs (and
    /// the linear graph takes before the tangents).
    pub num_residuals: usize,
}

/// The joint JVP graph `(primals, tangents) -> (outputs, output tangents)`;
/// tangents of non-float inputs are inputs that are never read.
fn jvp_joint(g: &Graph) -> Result<Graph> {
    let in_avals = g.in_avals();
    let n = in_avals.len();
    let diff: Vec<bool> = in_avals.iter().map(|a| a.dtype().is_float()).collect();
    let avals: Vec<Aval> = in_avals.iter().chain(&in_avals).cloned().collect();
    graph::trace(
        |args: &[Tensor]| {
            let tans: Vec<Option<Tensor>> = args[n..]
                .iter()
                .zip(&diff)
                .map(|(t, &d)| d.then(|| t.clone()))
                .collect();
            let (outs, touts) = jvp_graph(g, &args[..n], &tans)?;
            let touts: Vec<Tensor> = outs
                .iter()
                .zip(touts)
                .map(|(o, t)| t.unwrap_or_else(|| o.zeros_like()))
                .collect();
            Ok(outs.into_iter().chain(touts).collect())
        },
        &avals,
    )
}

/// A value during partial evaluation.
#[derive(Clone)]
enum Pe {
    /// Depends on the primals only; `true` when it is one of the joint
    /// graph's own constants (those become constants of the linear graph
    /// instead of residuals).
    Known(Tensor, bool),
    /// Depends on the tangents.
    Linear,
}

/// The linear graph's known operands, collected while walking.
#[derive(Default)]
struct Residuals {
    seen: Vec<bool>,
    vars: Vec<VarId>,
    vals: Vec<Tensor>,
    constvars: Vec<VarId>,
    consts: Vec<Tensor>,
}

impl Residuals {
    fn add(&mut self, v: VarId, t: &Tensor, is_const: bool) {
        if std::mem::replace(&mut self.seen[v], true) {
            return;
        }
        if is_const {
            self.constvars.push(v);
            self.consts.push(t.clone());
        } else {
            self.vars.push(v);
            self.vals.push(t.clone());
        }
    }
}

/// Partially evaluate the joint graph `j` (of a graph with `n_in` inputs and
/// `n_out` outputs) at `primals`: returns the outputs, the residual values
/// and the linear graph `residuals ++ tangents -> output tangents`.
fn partial_eval(
    j: &Graph,
    n_in: usize,
    n_out: usize,
    primals: &[Tensor],
) -> Result<(Vec<Tensor>, Vec<Tensor>, Graph)> {
    let mut res = Residuals {
        seen: vec![false; j.num_vars()],
        ..Residuals::default()
    };
    let mut eqns: Vec<Eqn> = Vec::new();
    let inputs: Vec<Pe> = primals
        .iter()
        .map(|p| Pe::Known(p.clone(), false))
        .chain(std::iter::repeat_n(Pe::Linear, n_in))
        .collect();
    let outs = graph::interpret(
        j,
        inputs,
        |c| Pe::Known(c.clone(), true),
        |e, args: Vec<Pe>| {
            if args.iter().all(|a| matches!(a, Pe::Known(..))) {
                let ins: Vec<Tensor> = args
                    .into_iter()
                    .filter_map(|a| match a {
                        Pe::Known(t, _) => Some(t),
                        Pe::Linear => None,
                    })
                    .collect();
                let outs = graph::bind(e.prim().clone(), &ins)?;
                return Ok(outs.into_iter().map(|o| Pe::Known(o, false)).collect());
            }
            for (&v, a) in e.inputs().iter().zip(&args) {
                if let Pe::Known(t, c) = a {
                    res.add(v, t, *c);
                }
            }
            eqns.push(e.clone());
            Ok(vec![Pe::Linear; e.outputs().len()])
        },
    )?;
    let mut primal_outs = Vec::with_capacity(n_out);
    for o in &outs[..n_out] {
        match o {
            Pe::Known(t, _) => primal_outs.push(t.clone()),
            Pe::Linear => {
                return Err(Error::transform(
                    "linearize",
                    "a primal output depends on tangents (a JVP rule is wrong)",
                ))
            }
        }
    }
    for (&v, o) in j.outvars()[n_out..].iter().zip(&outs[n_out..]) {
        if let Pe::Known(t, c) = o {
            res.add(v, t, *c);
        }
    }
    let invars: Vec<VarId> = res
        .vars
        .iter()
        .chain(&j.invars()[n_in..])
        .copied()
        .collect();
    let linear = Graph {
        avals: j.avals.clone(),
        invars,
        constvars: res.constvars,
        consts: res.consts,
        eqns,
        outvars: j.outvars()[n_out..].to_vec(),
    };
    Ok((primal_outs, res.vals, linear))
}

/// Linearise `g`: the primal graph `primals -> outputs ++ residuals` and the
/// linear graph `residuals ++ tangents -> output tangents` (one tangent per
/// input; those of non-float inputs are ignored).
///
/// ```
/// use braintrace_core::transform::linearize;
/// use braintrace_core::{make_graph, Aval, DType, Tensor};
/// let g = make_graph(|a: &[Tensor]| Ok(vec![a[0].sin()?]), &[Aval::new(&[], DType::F64)])?;
/// let lin = linearize(&g)?;
/// let x = Tensor::scalar(0.5);
/// let pr = lin.primal.eval(&[x])?; // [sin x, cos x]
/// let mut args = pr[1..].to_vec();
/// args.push(Tensor::scalar(2.0)); // tangent
/// let t = lin.linear.eval(&args)?;
/// assert!((t[0].item()? - 2.0 * 0.5f64.cos()).abs() < 1e-12);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn linearize(g: &Graph) -> Result<Linearized> {
    let n_in = g.invars().len();
    let n_out = g.outvars().len();
    let j = jvp_joint(g)?;
    let mut linear = None;
    let mut num_residuals = 0;
    let primal = graph::trace(
        |p: &[Tensor]| {
            let (outs, res, l) = partial_eval(&j, n_in, n_out, p)?;
            num_residuals = res.len();
            linear = Some(l);
            Ok(outs.into_iter().chain(res).collect())
        },
        &g.in_avals(),
    )?;
    let linear =
        linear.ok_or_else(|| Error::transform("linearize", "partial evaluation did not run"))?;
    Ok(Linearized {
        primal,
        linear,
        num_residuals,
    })
}

/// Run the transpose of the linear graph `l`: `known` holds the values of
/// its non-linear inputs (those with `linear[i] == false`, in order), `cts`
/// one cotangent per output. Returns one cotangent per linear input (`None`
/// for a zero). Equations of `l` that read no linear value are evaluated
/// forward first.
pub(crate) fn transpose_eval(
    l: &Graph,
    linear: &[bool],
    known: &[Tensor],
    cts: &[Tensor],
) -> Result<Vec<Option<Tensor>>> {
    let n = l.num_vars();
    let mut val: Vec<Option<Tensor>> = vec![None; n];
    let mut lin = vec![false; n];
    let mut k = known.iter();
    for (&v, &is_lin) in l.invars().iter().zip(linear) {
        if is_lin {
            lin[v] = true;
        } else {
            val[v] = Some(
                k.next()
                    .ok_or_else(|| {
                        Error::arity("transpose", "one value per non-linear input", known.len())
                    })?
                    .clone(),
            );
        }
    }
    for (&v, c) in l.constvars().iter().zip(l.consts()) {
        val[v] = Some(c.clone());
    }
    let missing = |v: VarId| {
        Error::transform(
            "transpose",
            format!("the linear graph reads variable {v} before defining it"),
        )
    };
    let mut lin_eqns = Vec::new();
    for e in l.eqns() {
        if e.inputs().iter().any(|&v| lin[v]) {
            for &v in e.outputs() {
                lin[v] = true;
            }
            lin_eqns.push(e);
        } else {
            let ins = e
                .inputs()
                .iter()
                .map(|&v| val[v].clone().ok_or_else(|| missing(v)))
                .collect::<Result<Vec<_>>>()?;
            for (&v, o) in e.outputs().iter().zip(graph::bind(e.prim().clone(), &ins)?) {
                val[v] = Some(o);
            }
        }
    }
    let mut ct: Vec<Option<Tensor>> = vec![None; n];
    for (&v, c) in l.outvars().iter().zip(cts) {
        if lin[v] {
            ct[v] = add_opt(ct[v].take(), Some(c.clone()))?;
        }
    }
    for e in lin_eqns.into_iter().rev() {
        let couts: Vec<Option<Tensor>> = e.outputs().iter().map(|&v| ct[v].take()).collect();
        if couts.iter().all(Option::is_none) {
            continue;
        }
        let args = e
            .inputs()
            .iter()
            .map(|&v| {
                if lin[v] {
                    Ok(LinearArg::Linear(l.aval(v).clone()))
                } else {
                    val[v]
                        .clone()
                        .map(LinearArg::Known)
                        .ok_or_else(|| missing(v))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let cins = e.prim().transpose(&couts, &args)?;
        if cins.len() != args.len() {
            return Err(Error::invalid(
                e.prim().name(),
                format!(
                    "the transpose rule returned {} cotangent(s) for {} operand(s)",
                    cins.len(),
                    args.len()
                ),
            ));
        }
        for (&v, c) in e.inputs().iter().zip(cins) {
            if lin[v] && c.is_some() {
                ct[v] = add_opt(ct[v].take(), c)?;
            }
        }
    }
    Ok(l.invars()
        .iter()
        .zip(linear)
        .filter(|(_, &is_lin)| is_lin)
        .map(|(&v, _)| ct[v].take())
        .collect())
}

/// The transpose of a graph that is linear in the inputs marked in
/// `linear` (one flag per input): a graph taking the other inputs (in
/// order) followed by one cotangent per output, and returning one
/// cotangent per linear input.
pub fn transpose(l: &Graph, linear: &[bool]) -> Result<Graph> {
    if linear.len() != l.invars().len() {
        return Err(Error::arity(
            "transpose",
            format!("{} linearity flags (one per input)", l.invars().len()),
            linear.len(),
        ));
    }
    let in_avals = l.in_avals();
    let known_avals: Vec<Aval> = in_avals
        .iter()
        .zip(linear)
        .filter(|(_, &b)| !b)
        .map(|(a, _)| a.clone())
        .collect();
    let nk = known_avals.len();
    let lin_avals: Vec<Aval> = in_avals
        .iter()
        .zip(linear)
        .filter(|(_, &b)| b)
        .map(|(a, _)| a.clone())
        .collect();
    let avals: Vec<Aval> = known_avals.into_iter().chain(l.out_avals()).collect();
    graph::trace(
        |args: &[Tensor]| {
            let cts = transpose_eval(l, linear, &args[..nk], &args[nk..])?;
            Ok(cts
                .into_iter()
                .zip(&lin_avals)
                .map(|(c, a)| c.unwrap_or_else(|| Tensor::zeros_aval(a)))
                .collect())
        },
        &avals,
    )
}

/// The pullback returned by [`vjp`]: call [`VjpFn::apply`] with one
/// cotangent per output of the function to get one per input. It holds the
/// linear graph and the residuals; [`VjpFn::graph`] stages it as a graph.
#[derive(Clone, Debug)]
pub struct VjpFn {
    linear: Arc<Graph>,
    residuals: Vec<Tensor>,
    in_avals: Vec<Aval>,
    out_avals: Vec<Aval>,
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
        let cts = transpose_eval(
            &self.linear,
            &self.linear_mask(),
            &self.residuals,
            cotangents,
        )?;
        Ok(cts
            .into_iter()
            .zip(&self.in_avals)
            .map(|(c, a)| c.unwrap_or_else(|| Tensor::zeros_aval(a)))
            .collect())
    }
    fn linear_mask(&self) -> Vec<bool> {
        let nr = self.residuals.len();
        (0..self.linear.invars().len()).map(|i| i >= nr).collect()
    }
    /// The linear graph `residuals ++ tangents -> output tangents`.
    pub fn linear_graph(&self) -> &Graph {
        &self.linear
    }
    /// The residual values the pullback closes over.
    pub fn residuals(&self) -> &[Tensor] {
        &self.residuals
    }
    /// The pullback as a graph: `residuals ++ output cotangents -> input
    /// cotangents` (see [`transpose`]).
    pub fn graph(&self) -> Result<Graph> {
        transpose(&self.linear, &self.linear_mask())
    }
}

/// `vjp` of an already traced graph.
pub fn vjp_of_graph(g: &Graph, primals: &[Tensor]) -> Result<(Vec<Tensor>, VjpFn)> {
    if primals.len() != g.invars().len() {
        return Err(Error::arity("vjp", g.invars().len(), primals.len()));
    }
    for (i, (p, a)) in primals.iter().zip(g.in_avals()).enumerate() {
        if p.aval() != a {
            return Err(Error::transform(
                "vjp",
                format!("primal {i} is {} but the graph takes {a}", p.aval()),
            ));
        }
    }
    let j = jvp_joint(g)?;
    let (outs, residuals, linear) = partial_eval(&j, g.invars().len(), g.outvars().len(), primals)?;
    Ok((
        outs,
        VjpFn {
            linear: Arc::new(linear),
            residuals,
            in_avals: g.in_avals(),
            out_avals: g.out_avals(),
        },
    ))
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
    let g = make_graph(f, &crate::ops::avals(primals))?;
    vjp_of_graph(&g, primals)
}

/// The VJP of `f` at inputs of the given avals, staged as one graph:
/// `primals ++ output cotangents -> outputs ++ input cotangents`. Print it,
/// [`crate::jit`] it, run it on new inputs: nothing is re-traced.
///
/// ```
/// use braintrace_core::transform::vjp_graph;
/// use braintrace_core::{Aval, DType, Tensor};
/// let g = vjp_graph(|a: &[Tensor]| Ok(vec![a[0].square()?]), &[Aval::new(&[2], DType::F64)])?;
/// let x = Tensor::from_vec(vec![1.0, 3.0], &[2])?;
/// let out = g.eval(&[x.clone(), x.ones_like()])?; // [x², 2x]
/// assert_eq!(out[1].to_vec_f64()?, vec![2.0, 6.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn vjp_graph<F>(f: F, avals: &[Aval]) -> Result<Graph>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    vjp_graph_of(&make_graph(f, avals)?)
}

/// [`vjp_graph`] of an already traced graph.
pub fn vjp_graph_of(g: &Graph) -> Result<Graph> {
    let n = g.invars().len();
    let avals: Vec<Aval> = g.in_avals().into_iter().chain(g.out_avals()).collect();
    graph::trace(
        |args: &[Tensor]| {
            let (outs, pb) = vjp_of_graph(g, &args[..n])?;
            let cts = pb.apply(&args[n..])?;
            Ok(outs.into_iter().chain(cts).collect())
        },
        &avals,
    )
}

/// The VJP of `g` that also returns the cotangents at the chosen
/// intermediate variables: `primals ++ output cotangents -> outputs ++
/// input cotangents ++ one cotangent per entry of vars`.
///
/// The cotangent at `v` is the gradient of the outputs (weighted by their
/// cotangents) with respect to a perturbation added right after `v`: the
/// graph is rewritten with `v' = v + p` ([`Graph::insert_after`]) and `p`
/// differentiated at zero. This is the learning signal `∂L/∂h` of a hidden
/// state `h`.
pub fn vjp_graph_at(g: &Graph, vars: &[VarId]) -> Result<Graph> {
    let n = g.invars().len();
    let mut pg = g.clone();
    let mut p_avals = Vec::with_capacity(vars.len());
    for &v in vars {
        if v >= g.num_vars() {
            return Err(Error::transform(
                "vjp_graph_at",
                format!(
                    "variable {v} does not exist (the graph has {} variables)",
                    g.num_vars()
                ),
            ));
        }
        let a = g.aval(v).clone();
        let p = pg.add_input(a.clone());
        pg.insert_after(v, Arc::new(Binary(BinaryOp::Add)), &[p])?;
        p_avals.push(a);
    }
    let avals: Vec<Aval> = g.in_avals().into_iter().chain(g.out_avals()).collect();
    graph::trace(
        |args: &[Tensor]| {
            let primals: Vec<Tensor> = args[..n]
                .iter()
                .cloned()
                .chain(p_avals.iter().map(Tensor::zeros_aval))
                .collect();
            let (outs, pb) = vjp_of_graph(&pg, &primals)?;
            let cts = pb.apply(&args[n..])?;
            Ok(outs.into_iter().chain(cts).collect())
        },
        &avals,
    )
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
