//! A hand-written trace kernel ([`CustomTraceKernel`]) declared by a
//! macro-defined primitive through `trace_kernel = <fn>`: the learner keeps
//! the traces and the kernel advances them in place. With a correct kernel
//! D-RTRL gives the rule path's traces and gradients to 1e-12 in f64 (and
//! resumes from a checkpoint bit for bit); a wrong kernel is refused at
//! compile naming the primitive and the kernel; a kernel that changes its
//! buffer's shape, or a trace precision it cannot keep, is a clear error.

mod common;

use braintrace::etp::{CustomTraceKernel, TraceKernel, TraceStep};
use braintrace::learn::{
    compile, Algorithm, DRtrl, Init, Model, ModelState, PpProp, Reduction, StepCtx, TensorDict,
    TraceDType,
};
use braintrace::nn::checkpoint::Checkpoint;
use braintrace::nn::{Initializer, Sgd};
use braintrace::prelude::*;
use common::{assert_allclose, det};

// ------------------------------------------------ y = x @ w + b, its rules

fn outer(x: &Tensor, h: &Tensor) -> Result<Tensor> {
    if x.ndim() == 1 {
        x.expand_dims(1)?.matmul(&h.expand_dims(0)?)
    } else {
        x.transpose(&[1, 0])?.matmul(h)
    }
}

/// How the hand-written kernel errs (`Right`: it does not).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flaw {
    Right,
    /// The instantaneous term twice.
    Doubled,
    /// Replaces the trace by one of another shape.
    Reshaped,
}

/// `y = x @ w + b` with a hand-written dense D-RTRL kernel (`flaw` in the
/// `flaw` param: 0 right, 1 doubled, 2 reshaped).
#[etp_primitive(name = "etp_hand_dense", batched, x = x, weight = [weight, bias], trace_kernel = hand_kernel)]
fn hand_dense(x: &Tensor, weight: &Tensor, bias: &Tensor, #[param] flaw: i64) -> Result<Tensor> {
    let _ = flaw;
    x.matmul(weight)?.add(bias)
}

fn hand_kernel(p: &Params) -> Option<TraceKernel> {
    let flaw = match p.get::<i64>("etp_hand_dense", "flaw").ok()? {
        0 => Flaw::Right,
        1 => Flaw::Doubled,
        _ => Flaw::Reshaped,
    };
    Some(TraceKernel::custom(HandDense { flaw }))
}

#[yw_to_w(hand_dense)]
fn hand_dense_yw(h: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    trace
        .iter()
        .map(|(k, t)| {
            let f = if k == "bias" {
                t.mul(h)?
            } else {
                t.mul(&h.expand_dims(h.ndim() - 1)?)?
            };
            Ok((k.clone(), f))
        })
        .collect()
}

#[xy_to_dw(hand_dense)]
fn hand_dense_dw(x: &Tensor, h: &Tensor, _w: &TensorMap) -> Result<TensorMap> {
    let db = if h.ndim() == 2 {
        h.sum(&[0])?
    } else {
        h.clone()
    };
    Ok([
        ("weight".to_string(), outer(x, h)?),
        ("bias".to_string(), db),
    ]
    .into())
}

#[init_drtrl(hand_dense)]
fn hand_dense_init(_x: &Aval, y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
    let lead = &y.shape()[..y.ndim() - 1];
    Ok([
        (
            "weight".to_string(),
            Tensor::zeros(&[lead, w["weight"].shape(), &[n]].concat(), y.dtype()),
        ),
        (
            "bias".to_string(),
            Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()),
        ),
    ]
    .into())
}

#[init_pp(hand_dense)]
fn hand_dense_init_pp(_x: &Aval, y: &Aval, _w: &AvalMap, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

// ------------------------------------------------ the kernel, by hand

/// The dense D-RTRL update and solve written as loops: for the weight
/// trace `(B, I, O, S)`
/// `ε[b,i,o,a] ← Σ_c D[b,o,a,c] ε[b,i,o,c] + x[b,i] Df[b,o,a]`,
/// `∇[i,o] += Σ_{b,a} g[b,o,a] ε[b,i,o,a]`; the bias as a weight with `x = 1`.
struct HandDense {
    flaw: Flaw,
}

/// A tensor's elements (row-major) as f64.
fn vals(t: &Tensor) -> Result<Vec<f64>> {
    t.to_vec_f64()
}

/// Write `v` (row-major) into `t` in place, in its own dtype.
fn write(t: &mut Tensor, v: &[f64]) -> Result<()> {
    match t.dtype() {
        DType::F64 => t
            .array_mut::<f64>()?
            .iter_mut()
            .zip(v)
            .for_each(|(a, b)| *a = *b),
        _ => t
            .array_mut::<f32>()?
            .iter_mut()
            .zip(v)
            .for_each(|(a, b)| *a = *b as f32),
    }
    Ok(())
}

impl CustomTraceKernel for HandDense {
    fn name(&self) -> &str {
        "hand_dense_loops"
    }

    fn update(&self, key: &str, step: &TraceStep<'_>, trace: &mut Tensor) -> Result<()> {
        let ds = step.d.shape().to_vec(); // (B, O, S, S)
        let (b, o, s) = (ds[0], ds[1], ds[2]);
        let i = if key == "bias" {
            1
        } else {
            step.x.expect("x").shape()[1]
        };
        let x = match (key, step.x) {
            ("bias", _) | (_, None) => vec![1.0; b],
            (_, Some(x)) => vals(x)?,
        };
        let (d, df, eps) = (vals(step.d)?, vals(step.df)?, vals(trace)?);
        let times = if self.flaw == Flaw::Doubled { 2.0 } else { 1.0 };
        let mut new = vec![0.0; eps.len()];
        for bb in 0..b {
            for ii in 0..i {
                for oo in 0..o {
                    let at = |a: usize| ((bb * i + ii) * o + oo) * s + a;
                    for a in 0..s {
                        let mut v = times * x[bb * i + ii] * df[(bb * o + oo) * s + a];
                        for c in 0..s {
                            v += d[((bb * o + oo) * s + a) * s + c] * eps[at(c)];
                        }
                        new[at(a)] = v;
                    }
                }
            }
        }
        if self.flaw == Flaw::Reshaped {
            *trace = Tensor::from_vec(new, &[eps.len()])?;
            return Ok(());
        }
        write(trace, &new)
    }

    fn solve(
        &self,
        key: &str,
        g: &Tensor,
        _weights: &TensorMap,
        _params: &Params,
        trace: &Tensor,
        grad: &mut Tensor,
    ) -> Result<()> {
        let gs = g.shape().to_vec(); // (B, O, S)
        let (b, o, s) = (gs[0], gs[1], gs[2]);
        let i = if key == "bias" { 1 } else { grad.shape()[0] };
        let (g, eps, mut acc) = (vals(g)?, vals(trace)?, vals(grad)?);
        for bb in 0..b {
            for ii in 0..i {
                for oo in 0..o {
                    for a in 0..s {
                        acc[ii * o + oo] +=
                            g[(bb * o + oo) * s + a] * eps[((bb * i + ii) * o + oo) * s + a];
                    }
                }
            }
        }
        write(grad, &acc)
    }
}

// ------------------------------------------------ a recurrent model on it

/// `h' = 0.7 h + tanh(hand_dense([x, h]))`, output `h'`.
struct Rnn {
    flaw: i64,
    n_in: usize,
    n: usize,
}

impl Model for Rnn {
    fn init(&self, init: &mut Init) -> Result<()> {
        let (i, o) = (self.n_in + self.n, self.n);
        for (k, shape) in [("w", vec![i, o]), ("b", vec![o])] {
            let v = Initializer::Normal { std: 0.5 }.draw(&shape, init.dtype(), init.rng())?;
            init.param(k, None, v)?;
        }
        init.hidden("h", &[self.n])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("h")?;
        let xh = braintrace::concat(&[x.clone(), h.clone()], 1)?;
        let y = hand_dense(&xh, &ctx.param("w")?, &ctx.param("b")?, self.flaw)?;
        let h_new = h.mul_scalar(0.7)?.add(&y.tanh()?)?;
        ctx.set_hidden("h", h_new.clone())?;
        Ok(h_new)
    }
}

fn mse(o: &Tensor, y: &Tensor) -> Result<Tensor> {
    o.sub(y)?.square()?.mean_all()
}

const N_IN: usize = 3;
const N: usize = 5;
const B: usize = 2;

fn learner(flaw: i64, algo: Algorithm) -> Result<braintrace::learn::Learner<Rnn>> {
    let model = Rnn {
        flaw,
        n_in: N_IN,
        n: N,
    };
    let state = ModelState::new(&model, DType::F64, 3, Some(B))?;
    compile(
        model,
        state,
        algo,
        &Tensor::zeros(&[B, N_IN], DType::F64),
        Some(B),
    )
}

/// Gradients and traces over `t` steps, and the learner's account.
fn run(flaw: i64, algo: Algorithm, t: usize) -> Result<(TensorDict, Vec<Tensor>, String)> {
    let mut l = learner(flaw, algo)?;
    let xs = det(&[t, B, N_IN], 1, 1.0);
    let ys = det(&[t, B, N], 2, 1.0);
    let out = l.etrace_grad(&xs, &ys, mse, Reduction::Mean)?;
    Ok((out.grads, l.traces(), l.explain()))
}

fn assert_close(what: &str, a: &[Tensor], b: &[Tensor]) {
    assert_eq!(a.len(), b.len(), "{what}: counts");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.shape(), y.shape(), "{what}: shapes");
        let (x, y) = (x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap());
        assert!(y.iter().any(|v| v.abs() > 1e-6), "{what}: all zero");
        // |x - y| <= 1e-12 (1 + |y|)
        assert_allclose(what, &x, &y, 1e-12, 1e-12);
    }
}

fn values(d: &TensorDict) -> Vec<Tensor> {
    d.values().cloned().collect()
}

#[test]
fn a_hand_written_kernel_runs_and_equals_the_rules() {
    let (g_k, tr_k, explain) = run(0, DRtrl::default().into(), 6).unwrap();
    assert!(explain.contains("fused trace kernels: 1 of 1"), "{explain}");
    let (g_r, tr_r, explain) = run(0, DRtrl::default().fast_paths(false).into(), 6).unwrap();
    assert!(explain.contains("fused trace kernels: 0 of 1"), "{explain}");
    assert_close("gradients", &values(&g_k), &values(&g_r));
    assert_close("traces", &tr_k, &tr_r);
    // The multi-step method reads the gradient before the update.
    let multi = || DRtrl::default().vjp_method(braintrace::learn::VjpMethod::MultiStep);
    let (g_k, tr_k, _) = run(0, multi().into(), 6).unwrap();
    let (g_r, tr_r, _) = run(0, multi().fast_paths(false).into(), 6).unwrap();
    assert_close("multi-step gradients", &values(&g_k), &values(&g_r));
    assert_close("multi-step traces", &tr_k, &tr_r);
}

#[test]
fn pp_prop_runs_its_rules_beside_a_hand_written_kernel() {
    // pp_prop has its own dense path only; a custom kernel leaves it the rules.
    let pp = PpProp::new(0.9).unwrap();
    let (g_k, _, explain) = run(0, pp.into(), 5).unwrap();
    assert!(explain.contains("(pp_prop): 0 of 1"), "{explain}");
    let (g_r, _, _) = run(0, pp.fast_paths(false).into(), 5).unwrap();
    assert_close("pp_prop gradients", &values(&g_k), &values(&g_r));
}

#[test]
fn a_wrong_hand_written_kernel_is_refused_naming_the_primitive() {
    let e = run(1, DRtrl::default().into(), 3).expect_err("refused");
    match &e {
        Error::Etp { primitive, .. } => assert_eq!(primitive, "etp_hand_dense"),
        other => panic!("not an ETP error: {other}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("`custom` trace kernel disagrees"), "{msg}");
    // The rules alone are fine.
    run(1, DRtrl::default().fast_paths(false).into(), 3).unwrap();
}

#[test]
fn a_kernel_that_replaces_its_buffer_is_an_error_naming_it() {
    let e = run(2, DRtrl::default().into(), 3).expect_err("refused");
    let msg = e.to_string();
    assert!(msg.contains("etp_hand_dense"), "{msg}");
    assert!(
        msg.contains("hand_dense_loops") && msg.contains("writes values in place"),
        "{msg}"
    );
}

#[test]
fn a_trace_precision_the_kernel_cannot_keep_is_refused_naming_it() {
    let algo = DRtrl::default().trace_dtype(TraceDType::F32);
    let e = match learner(0, algo.into()) {
        Ok(_) => panic!("f32 traces of an f64 model accepted for a custom kernel"),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(
        msg.contains("hand_dense_loops") && msg.contains("f32"),
        "{msg}"
    );
}

#[test]
fn a_learner_on_a_hand_written_kernel_resumes_exactly() {
    let xs = det(&[6, B, N_IN], 3, 1.0);
    let ys = det(&[6, B, N], 4, 1.0);
    let first = |t: usize| xs.slice_axis(0, 0, t).unwrap();
    let rest = |t: usize| xs.slice_axis(0, t, 6).unwrap();
    let (ys1, ys2) = (
        ys.slice_axis(0, 0, 3).unwrap(),
        ys.slice_axis(0, 3, 6).unwrap(),
    );
    let opt = Sgd::new(0.1).unwrap();
    // Uninterrupted.
    let mut a = learner(0, DRtrl::default().into()).unwrap();
    a.etrace_grad(&first(3), &ys1, mse, Reduction::Mean)
        .unwrap();
    let ga = a.etrace_grad(&rest(3), &ys2, mse, Reduction::Mean).unwrap();
    // Checkpointed after 3 steps, restored into a fresh learner.
    let mut b = learner(0, DRtrl::default().into()).unwrap();
    b.etrace_grad(&first(3), &ys1, mse, Reduction::Mean)
        .unwrap();
    let ck = Checkpoint::capture_learner(&b, &opt);
    let mut c = learner(0, DRtrl::default().into()).unwrap();
    let mut opt2 = Sgd::new(0.1).unwrap();
    ck.restore_learner(&mut c, &mut opt2).unwrap();
    let gc = c.etrace_grad(&rest(3), &ys2, mse, Reduction::Mean).unwrap();
    for (x, y) in values(&ga.grads).iter().zip(&values(&gc.grads)) {
        assert_eq!(x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap());
    }
    for (x, y) in a.traces().iter().zip(&c.traces()) {
        assert_eq!(x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap());
    }
}
