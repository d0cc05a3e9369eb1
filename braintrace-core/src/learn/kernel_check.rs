//! Which trace kernel a (relation, hidden group) pair runs: the one its
//! primitive declares, when the pair's shapes are the kernel's, once it
//! is checked against the primitive's own rules.
//!
//! A primitive's [`TraceKernel`] is a claim: "my rules compute this". The
//! learner trusts it only after running both on random inputs: two D-RTRL
//! steps from a zero trace (the second with random `D`, so the hidden
//! Jacobian's term is exercised, not only the instantaneous one) and the
//! gradient read from the updated trace, through the fused kernel and
//! through the rules (`yw_to_w`, `instant_drtrl` or `xy_to_dw`,
//! `solve_drtrl` or `yw_to_w`, composed as the learner's rule path composes
//! them), in f64. They must agree to `1e-9` relative to the values.
//!
//! When: at the first compile of a model whose relation declares a kernel,
//! once per primitive, params and shapes (cached for the process). Not at
//! registration: the built-ins and `#[etp_primitive]`s are registered
//! before `main` through `inventory`, where an error reaches nobody, the
//! kernel a primitive declares depends on an equation's params (`weight_fn`
//! may be unreadable, a convolution's layout not the default one), and the
//! kernels themselves live in the learner, above the registry. The shapes
//! are the relation's own, with the batch cut to two samples; a dense or
//! low-rank kernel (one formula at every size) is checked on them shrunk,
//! every size above 5 mapped in order to 6, 7, ... (the full shapes when
//! the rules reject the shrunk ones), so that a large model's compile does
//! not pay a large rule evaluation. Sparse, convolution and hand-written
//! kernels, whose loops depend on the sizes, are checked at full size.
//!
//! A kernel that disagrees is refused with [`Error::Etp`] naming the
//! primitive, and the compile fails: a learner never trains silently with
//! a kernel that computes something else than the rules. Compile with
//! `fast_paths(false)` to run the rules instead.

use super::compiler::{HiddenGroup, Relation};
use super::fast::{FastTrace, Solve};
use crate::error::{Error, Result};
use crate::etp::{EtpPrimitive, ParamType, Params, Role, TensorMap, TraceKernel};
use crate::graph::Graph;
use crate::prims::CsrStructure;
use crate::tensor::{Aval, DType, Tensor};
use crate::transform::vmap;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex};

/// Whether the traces and parameters of a relation have the shapes
/// `kernel` is written for (`vs`: the hidden group's shape, batch
/// included; `keys`: the trace avals by trainable; `weights`: the parameter
/// avals). Every trace must be one the kernel names.
pub(crate) fn shapes_fit(
    kernel: &TraceKernel,
    x: Option<&Aval>,
    vs: &[usize],
    s: usize,
    keys: &[(String, Aval)],
    weights: &BTreeMap<String, Aval>,
    params: &Params,
) -> bool {
    let Some((&o, lead)) = vs.split_last() else {
        return false;
    };
    let bias_fits = |w: &Aval, trace: &Aval| -> bool {
        w.shape() == [o] && trace.shape() == [vs, &[s]].concat()
    };
    // x: (B?, I) with the hidden group's leading axes.
    let x_in = || -> Option<usize> {
        let (&i, xlead) = x?.shape().split_last()?;
        (xlead == lead).then_some(i)
    };
    // Every trace with its role and parameter aval.
    let Some(leaves) = keys
        .iter()
        .map(|(k, trace)| Some((kernel.role(k)?, weights.get(k)?, trace)))
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    match kernel {
        TraceKernel::Custom(k) => {
            let ws: Vec<(String, Aval)> = weights
                .iter()
                .map(|(n, a)| (n.clone(), a.clone()))
                .collect();
            k.0.fits(x, keys, &ws)
        }
        TraceKernel::Dense { .. } => {
            leaves.iter().all(
                |(role, w, trace)| match x.filter(|_| *role == Role::Weight) {
                    Some(_) => {
                        let Some(i) = x_in() else {
                            return false;
                        };
                        let want = [lead, &[i, o, s]].concat();
                        w.shape() == [i, o] && trace.shape() == want
                    }
                    None => bias_fits(w, trace),
                },
            )
        }
        TraceKernel::Sparse { structure, .. } => {
            let Some(st) = params.raw(structure).and_then(CsrStructure::from_param) else {
                return false;
            };
            let Some(i) = x_in() else {
                return false;
            };
            st.shape == (i, o)
                && leaves.iter().all(|(role, w, trace)| match role {
                    Role::Weight => {
                        w.shape() == [st.nnz()] && trace.shape() == [lead, &[st.nnz(), s]].concat()
                    }
                    Role::Bias => bias_fits(w, trace),
                    _ => false,
                })
        }
        TraceKernel::Lora { lora_b, lora_a, .. } => {
            let Some(i) = x_in() else {
                return false;
            };
            let (Some(b), Some(a)) = (weights.get(lora_b), weights.get(lora_a)) else {
                return false;
            };
            let [bi, r] = b.shape() else {
                return false;
            };
            if *bi != i || a.shape() != [*r, o] {
                return false;
            }
            leaves.iter().all(|(role, w, trace)| match role {
                Role::LoraB => trace.shape() == [lead, &[i, o, s]].concat(),
                Role::LoraA => trace.shape() == [lead, &[*r, o, s]].concat(),
                Role::Bias => bias_fits(w, trace),
                Role::Weight | Role::Custom => false,
            })
        }
        _ => {
            // Conv. vs = y: (B, O, so..); x: (B, C, si..) of the same rank.
            let (Some(x), true) = (x, vs.len() >= 3) else {
                return false;
            };
            let (xs, (b, och, so)) = (x.shape(), (vs[0], vs[1], &vs[2..]));
            if xs.len() != vs.len() || xs[0] != b {
                return false;
            }
            leaves.iter().all(|(role, w, trace)| match role {
                Role::Weight => {
                    let ws = w.shape();
                    ws.len() == vs.len()
                        && ws[0] == och
                        && ws[1] == xs[1]
                        && trace.shape() == [&[b], so, ws, &[s]].concat()
                }
                Role::Bias => w.shape() == [och] && trace.shape() == [vs, &[s]].concat(),
                _ => false,
            })
        }
    }
}

/// The trace kernel an equation of `prim` with `params` declares (not yet
/// checked against its rules; see [`kernel_for`]).
pub(crate) fn declared(prim: &EtpPrimitive, params: &Params) -> Option<TraceKernel> {
    prim.trace_kernel(params)
}

/// The trace kernel the learner runs for pair (`r`, group `grp`): the
/// primitive's declared kernel, checked against its rules on random inputs
/// of the pair's shapes the first time (see [`super::kernel_check`]).
/// `Ok(None)`: none declared, or the pair's shapes are not the kernel's
/// (the rules run). An error, naming the primitive, when the declared
/// kernel disagrees with the rules: the compile fails rather than train
/// with a kernel that computes something else.
pub(crate) fn kernel_for(
    r: &super::Relation,
    g: &crate::graph::Graph,
    grp: &super::HiddenGroup,
) -> Result<Option<TraceKernel>> {
    match declared(&r.primitive, &r.params) {
        Some(k) => super::kernel_check::checked(r, g, grp, k),
        None => Ok(None),
    }
}

/// What the check needs of a pair, with the batch cut.
struct Case {
    x: Option<Aval>,
    y: Aval,
    vs: Vec<usize>,
    s: usize,
    /// Parameter avals by trainable name.
    weights: BTreeMap<String, Aval>,
}

type Key = (EtpPrimitive, Params, Vec<Vec<usize>>);
static CHECKED: LazyLock<Mutex<HashMap<Key, Result<bool>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// `k` for pair (`r`, `grp`) once it is checked against the rules (cached);
/// `None` when the pair's shapes are not the kernel's.
pub(crate) fn checked(
    r: &Relation,
    g: &Graph,
    grp: &HiddenGroup,
    k: TraceKernel,
) -> Result<Option<TraceKernel>> {
    let batched = r.primitive.is_batched();
    let cut = |shape: &[usize]| -> Vec<usize> {
        let mut v = shape.to_vec();
        if let Some(b) = v.first_mut() {
            *b = (*b).min(2);
        }
        v
    };
    let y = g.aval(r.y_var);
    let mut vs = grp.varshape.clone();
    let (mut x, mut y_shape) = (
        r.x_var.map(|v| g.aval(v).shape().to_vec()),
        y.shape().to_vec(),
    );
    if batched {
        vs = cut(&vs);
        x = x.map(|x| cut(&x));
        y_shape = cut(&y_shape);
    } else if r.x_var.is_none() && vs.len() > y_shape.len() {
        // An element-wise weight over a batched hidden group.
        vs = cut(&vs);
    }
    let f64_aval = |s: &[usize]| Aval::new(s, DType::F64);
    let case = Case {
        x: x.as_deref().map(f64_aval),
        y: f64_aval(&y_shape),
        vs,
        s: grp.num_state(),
        weights: r
            .trainables
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    f64_aval(g.aval(g.invars()[t.param]).shape()),
                )
            })
            .collect(),
    };
    // A primitive whose D-RTRL traces cannot be laid out at these shapes
    // (pp_prop asks too) runs its rules.
    let Ok(keys) = trace_keys(&r.primitive, &r.params, &case) else {
        return Ok(None);
    };
    if !shapes_fit(
        &k,
        case.x.as_ref(),
        &case.vs,
        case.s,
        &keys,
        &case.weights,
        &r.params,
    ) {
        return Ok(None);
    }
    // A dense or low-rank kernel is one formula whatever the sizes: its
    // declaration is checked on the pair's shapes shrunk (every size above
    // 5 mapped, in order, to 6, 7, ...), which keeps a compile at hidden
    // 512 from spending 100 ms on the check's rule evaluation. Shapes the
    // shrinking does not suit (the rules reject them) fall back to the
    // full ones; a disagreement at the small shapes is a refusal.
    if matches!(k, TraceKernel::Dense { .. } | TraceKernel::Lora { .. }) {
        let small = shrunk(&case);
        if let Ok(small_keys) = trace_keys(&r.primitive, &r.params, &small) {
            let fits = shapes_fit(
                &k,
                small.x.as_ref(),
                &small.vs,
                small.s,
                &small_keys,
                &small.weights,
                &r.params,
            );
            if fits {
                match verdict(r, &k, &small, &small_keys) {
                    Ok(true) => return Ok(Some(k)),
                    Err(e) if e.to_string().contains(REFUSAL) => return Err(e),
                    _ => {}
                }
            }
        }
    }
    Ok(verdict(r, &k, &case, &keys)?.then_some(k))
}

/// What a refusal's message says (to tell it from an evaluation error).
const REFUSAL: &str = "trace kernel disagrees with the primitive's rules";

/// `case` with every size above 5 mapped, in increasing order, to 6, 7,
/// ... (equal sizes stay equal, order is kept; the batch is already cut).
fn shrunk(case: &Case) -> Case {
    let mut big: Vec<usize> = case
        .x
        .iter()
        .chain([&case.y])
        .chain(case.weights.values())
        .flat_map(|a| a.shape().iter().copied())
        .chain(case.vs.iter().copied())
        .filter(|&n| n > 5)
        .collect();
    big.sort_unstable();
    big.dedup();
    let map = |n: usize| big.binary_search(&n).map_or(n, |i| 6 + i);
    let aval = |a: &Aval| {
        Aval::new(
            &a.shape().iter().map(|&n| map(n)).collect::<Vec<_>>(),
            a.dtype(),
        )
    };
    Case {
        x: case.x.as_ref().map(aval),
        y: aval(&case.y),
        vs: case.vs.iter().map(|&n| map(n)).collect(),
        s: case.s,
        weights: case
            .weights
            .iter()
            .map(|(k, a)| (k.clone(), aval(a)))
            .collect(),
    }
}

/// The check of `k` on `case` (cached per primitive, params and shapes).
fn verdict(r: &Relation, k: &TraceKernel, case: &Case, keys: &[(String, Aval)]) -> Result<bool> {
    let shapes: Vec<Vec<usize>> = [case.x.as_ref().map_or(vec![], |a| a.shape().to_vec())]
        .into_iter()
        .chain([case.y.shape().to_vec(), case.vs.clone(), vec![case.s]])
        .chain(case.weights.values().map(|a| a.shape().to_vec()))
        .collect();
    let key = (r.primitive.clone(), r.params.clone(), shapes);
    let cached = CHECKED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned();
    match cached {
        Some(v) => v,
        None => {
            let v = compare(&r.primitive, &r.params, k, case, keys);
            CHECKED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, v.clone());
            v
        }
    }
}

/// The D-RTRL traces of a pair: keys and avals, as the learner lays them out.
fn trace_keys(p: &EtpPrimitive, params: &Params, c: &Case) -> Result<Vec<(String, Aval)>> {
    let init = p.init_drtrl(c.x.as_ref(), &c.y, &c.weights, c.s, params)?;
    Ok(init
        .into_iter()
        .filter(|(k, _)| c.weights.contains_key(k))
        .map(|(k, t)| {
            let a = if c.x.is_none() {
                Aval::new(&[&c.vs[..], &[c.s]].concat(), DType::F64)
            } else {
                Aval::new(t.shape(), DType::F64)
            };
            (k, a)
        })
        .collect())
}

/// Uniform draws in `[lo, hi)`, shaped.
fn draw(rng: &mut StdRng, shape: &[usize], lo: f64, hi: f64) -> Result<Tensor> {
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| lo + (hi - lo) * rng.random::<f64>())
        .collect();
    Tensor::from_vec(v, shape)
}

/// One step's random operands: `x`, `D (V.., S, S)`, `Df (V.., S)`.
fn operands(rng: &mut StdRng, c: &Case) -> Result<(Option<Tensor>, Tensor, Tensor)> {
    let x =
        c.x.as_ref()
            .map(|a| draw(rng, a.shape(), -1.0, 1.0))
            .transpose()?;
    let d = draw(rng, &[&c.vs[..], &[c.s, c.s]].concat(), -0.6, 0.6)?;
    let df = draw(rng, &[&c.vs[..], &[c.s]].concat(), -1.0, 1.0)?;
    Ok((x, d, df))
}

/// Run both paths; `Ok(true)` when they agree, the refusal when not.
fn compare(
    p: &EtpPrimitive,
    params: &Params,
    k: &TraceKernel,
    c: &Case,
    keys: &[(String, Aval)],
) -> Result<bool> {
    let mut rng = StdRng::seed_from_u64(0x7ace);
    // Positive parameters keep every built-in transform's derivative
    // smooth (relu, square) away from its kinks.
    let weights: TensorMap = c
        .weights
        .iter()
        .map(|(n, a)| Ok((n.clone(), draw(&mut rng, a.shape(), 0.2, 1.0)?)))
        .collect::<Result<_>>()?;
    let steps = [operands(&mut rng, c)?, operands(&mut rng, c)?];
    let g = draw(&mut rng, &[&c.vs[..], &[c.s]].concat(), -1.0, 1.0)?;

    // The rules.
    let mut eps: TensorMap = keys
        .iter()
        .map(|(n, a)| (n.clone(), Tensor::zeros_aval(a)))
        .collect();
    for (x, d, df) in &steps {
        eps = rule_update(p, params, &weights, x.as_ref(), d, df, &eps, c.s)?;
    }
    let rule_grads = rule_solve(p, params, &weights, &g, &eps, c.s)?;

    // The kernel.
    let names: Vec<String> = weights.keys().cloned().collect();
    let index: BTreeMap<String, usize> = names.iter().cloned().zip(0..).collect();
    let param_list: Vec<Tensor> = weights.values().cloned().collect();
    let refuse = |what: String| {
        Err(Error::etp(
            p.name(),
            "trace kernel check",
            format!("the declared `{}` trace kernel disagrees with the primitive's rules: {what}; fix the declaration (or the rules), or compile with `fast_paths(false)` to run the rules", k.kind()),
        ))
    };
    for (key, aval) in keys {
        let mut t = FastTrace::for_leaf(
            k,
            key,
            c.x.is_some(),
            aval.shape(),
            c.weights[key].shape(),
            DType::F64,
            crate::kernels::trace::Storage::F64,
            params,
            &index,
        )
        .map_err(|e| Error::etp_wrap(p.name(), "trace kernel check", e))?;
        let [(x0, d0, df0), (x1, d1, df1)] = &steps;
        // The kernel's own errors (a hand-written one's included) name the primitive.
        t.prepare(&param_list)
            .and_then(|()| t.step(x0.as_ref(), d0, df0, None, Solve::None))
            .and_then(|()| t.step(x1.as_ref(), d1, df1, Some(&g), Solve::After))
            .map_err(|e| Error::etp_wrap(p.name(), "trace kernel check", e))?;
        let trace = t.tensor();
        if let Some(what) = differs(&trace, &eps[key])? {
            return refuse(format!("trace `{key}` {what}"));
        }
        let grad = t.take_grad()?;
        let want = reduce_to(&rule_grads[key], c.weights[key].shape())?;
        if let Some(what) = differs(&grad, &want)? {
            return refuse(format!("gradient of `{key}` {what}"));
        }
    }
    Ok(true)
}

/// Where `a` and `b` differ by more than `1e-9` of their scale, said.
fn differs(a: &Tensor, b: &Tensor) -> Result<Option<String>> {
    if a.shape() != b.shape() {
        return Ok(Some(format!(
            "is shaped {:?} by the kernel, {:?} by the rules",
            a.shape(),
            b.shape()
        )));
    }
    let (av, bv) = (a.to_vec_f64()?, b.to_vec_f64()?);
    let scale = bv.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let worst = av
        .iter()
        .zip(&bv)
        .enumerate()
        .map(|(i, (x, y))| (i, (x - y).abs()))
        .fold(
            (0, 0.0f64),
            |w, e| if e.1 > w.1 || e.1.is_nan() { e } else { w },
        );
    Ok((worst.1 > 1e-9 * scale || worst.1.is_nan()).then(|| {
        format!(
            "differs at element {}: {} by the kernel, {} by the rules",
            worst.0, av[worst.0], bv[worst.0]
        )
    }))
}

/// Sum leading axes until `t` is shaped `like`.
fn reduce_to(t: &Tensor, like: &[usize]) -> Result<Tensor> {
    if t.ndim() > like.len() {
        let axes: Vec<usize> = (0..t.ndim() - like.len()).collect();
        return t.sum(&axes);
    }
    Ok(t.clone())
}

fn last(t: &Tensor, i: usize) -> Result<Tensor> {
    t.index_axis(t.ndim() - 1, i)
}

fn add_maps(a: Option<TensorMap>, b: TensorMap) -> Result<TensorMap> {
    let Some(mut a) = a else { return Ok(b) };
    for (k, v) in b {
        let s = match a.remove(&k) {
            Some(x) => x.add(&v)?,
            None => v,
        };
        a.insert(k, s);
    }
    Ok(a)
}

/// A rule call per sample for a batched primitive (as the learner does).
fn per_sample(
    p: &EtpPrimitive,
    keys: Vec<String>,
    args: Vec<Tensor>,
    f: impl Fn(&EtpPrimitive, &[Tensor]) -> Result<TensorMap> + 'static,
) -> Result<TensorMap> {
    let p2 = p.clone();
    let g = move |a: &[Tensor]| -> Result<Vec<Tensor>> { Ok(f(&p2, a)?.into_values().collect()) };
    let outs = vmap(g, vec![Some(0); args.len()])(&args)?;
    Ok(keys.into_iter().zip(outs).collect())
}

/// One D-RTRL trace update through the rules:
/// `ε[a] ← Σ_b yw_to_w(D[.., a, b], ε[b]) + instant(x, Df[a])`.
#[allow(clippy::too_many_arguments)]
fn rule_update(
    p: &EtpPrimitive,
    params: &Params,
    weights: &TensorMap,
    x: Option<&Tensor>,
    d: &Tensor,
    df: &Tensor,
    eps: &TensorMap,
    s: usize,
) -> Result<TensorMap> {
    let mut per_a: Vec<TensorMap> = Vec::with_capacity(s);
    for a in 0..s {
        let d_a = d.index_axis(d.ndim() - 2, a)?;
        let mut acc: Option<TensorMap> = None;
        for b in 0..s {
            let eps_b: TensorMap = eps
                .iter()
                .map(|(k, t)| Ok((k.clone(), last(t, b)?)))
                .collect::<Result<_>>()?;
            acc = Some(add_maps(acc, p.yw_to_w(&last(&d_a, b)?, &eps_b, params)?)?);
        }
        let df_a = last(df, a)?;
        let inst = match (p.is_batched(), x) {
            (true, Some(x)) => {
                let (w, prm) = (weights.clone(), params.clone());
                per_sample(
                    p,
                    weights.keys().cloned().collect(),
                    vec![x.clone(), df_a],
                    move |p, a| p.instant_drtrl(Some(&a[0]), &a[1], &w, &prm),
                )?
            }
            _ => p.instant_drtrl(x, &df_a, weights, params)?,
        };
        per_a.push(add_maps(acc, inst)?);
    }
    eps.keys()
        .map(|k| {
            let parts: Vec<Tensor> = per_a
                .iter()
                .map(|m| {
                    m.get(k).cloned().ok_or_else(|| {
                        Error::etp(
                            p.name(),
                            "trace kernel check",
                            format!("rules returned no `{k}`"),
                        )
                    })
                })
                .collect::<Result<_>>()?;
            Ok((k.clone(), crate::ops::stack(&parts, parts[0].ndim())?))
        })
        .collect()
}

/// The gradient read from `eps` through the rules: `Σ_a solve(g[a], ε[a])`.
fn rule_solve(
    p: &EtpPrimitive,
    params: &Params,
    weights: &TensorMap,
    g: &Tensor,
    eps: &TensorMap,
    s: usize,
) -> Result<TensorMap> {
    let mut acc: Option<TensorMap> = None;
    for a in 0..s {
        let g_a = last(g, a)?;
        let eps_a: TensorMap = eps
            .iter()
            .map(|(k, t)| Ok((k.clone(), last(t, a)?)))
            .collect::<Result<_>>()?;
        let res = if p.is_batched() {
            let ks: Vec<String> = eps_a.keys().cloned().collect();
            let (w, prm) = (weights.clone(), params.clone());
            let mut args = vec![g_a];
            args.extend(eps_a.values().cloned());
            per_sample(p, weights.keys().cloned().collect(), args, move |p, a| {
                let tr: TensorMap = ks.iter().cloned().zip(a[1..].iter().cloned()).collect();
                p.solve_drtrl(&a[0], &tr, &w, &prm)
            })?
        } else {
            p.solve_drtrl(&g_a, &eps_a, weights, params)?
        };
        acc = Some(add_maps(acc, res)?);
    }
    Ok(acc.unwrap_or_default())
}
