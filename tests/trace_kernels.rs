//! Trace kernels declared by macro-defined primitives: with a correct
//! declaration the fused kernel runs and gives the rule path's traces and
//! gradients to 1e-12 in f64 (D-RTRL and pp_prop); a wrong declaration is
//! refused at compile with an error naming the primitive; a kernel chosen
//! per equation by a function is used only where it says.

use braintrace::etp::{ElemFn, Scale, TraceKernel};
use braintrace::learn::{
    compile, Algorithm, DRtrl, Init, Model, ModelState, PpProp, Reduction, StepCtx, TensorDict,
};
use braintrace::nn::Initializer;
use braintrace::prelude::*;
use braintrace::prims::{lora_matmul, matmul, sparse_matmul, CsrStructure, Transforms};

// ------------------------------------------------ y = scale * (x @ w)

/// `xᵀ h` for a batch (`x (B, I)`, `h (B, O)`) or one sample (the
/// learner calls a batched primitive's rules per sample).
fn outer(x: &Tensor, h: &Tensor) -> Result<Tensor> {
    if x.ndim() == 1 {
        x.expand_dims(1)?.matmul(&h.expand_dims(0)?)
    } else {
        x.transpose(&[1, 0])?.matmul(h)
    }
}

/// `Σ_batch h` for a batch, `h` for one sample.
fn over_batch(h: &Tensor) -> Result<Tensor> {
    if h.ndim() == 2 {
        h.sum(&[0])
    } else {
        Ok(h.clone())
    }
}

/// `trace[..., i, o] * h[..., o]`.
fn spread(trace: &Tensor, hidden: &Tensor) -> Result<Tensor> {
    trace.mul(&hidden.expand_dims(hidden.ndim() - 1)?)
}

fn zeros_w(y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
    let lead = &y.shape()[..y.shape().len() - 1];
    Ok(Tensor::zeros(&[lead, w.shape(), &[n]].concat(), y.dtype()))
}

fn zeros_y(y: &Aval, n: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
}

/// Declared right: the product's per-element scale is the `scale` param.
#[etp_primitive(name = "etp_tk_scaled", batched, x = x, weight = w, trace_kernel = dense(scale = scale))]
fn tk_scaled(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}

#[yw_to_w(tk_scaled)]
fn tk_scaled_yw(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    spread(trace, hidden)
}

#[xy_to_dw(tk_scaled)]
fn tk_scaled_dw(x: &Tensor, hidden: &Tensor, _w: &Tensor, p: &tk_scaled::Params) -> Result<Tensor> {
    outer(x, hidden)?.mul_scalar(p.scale)
}

#[init_drtrl(tk_scaled)]
fn tk_scaled_init(_x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
    zeros_w(y, w, n)
}

#[init_pp(tk_scaled)]
fn tk_scaled_init_pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
    zeros_y(y, n)
}

/// Declared wrong: the same op, but `dense` without its scale.
#[etp_primitive(name = "etp_tk_wrong", batched, x = x, weight = w, trace_kernel = dense)]
fn tk_wrong(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}

#[yw_to_w(tk_wrong)]
fn tk_wrong_yw(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
    spread(trace, hidden)
}

#[xy_to_dw(tk_wrong)]
fn tk_wrong_dw(x: &Tensor, hidden: &Tensor, _w: &Tensor, p: &tk_wrong::Params) -> Result<Tensor> {
    outer(x, hidden)?.mul_scalar(p.scale)
}

#[init_drtrl(tk_wrong)]
fn tk_wrong_init(_x: &Aval, y: &Aval, w: &Aval, n: usize) -> Result<Tensor> {
    zeros_w(y, w, n)
}

#[init_pp(tk_wrong)]
fn tk_wrong_init_pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
    zeros_y(y, n)
}

/// The kernel chosen per equation: only for a positive scale (a stand-in
/// for a declaration that covers some params only).
fn positive_scale(p: &Params) -> Option<TraceKernel> {
    let s = p.get::<f64>("etp_tk_chosen", "scale").ok()?;
    (s > 0.0).then(|| TraceKernel::Dense {
        weight: "weight".into(),
        bias: Some("bias".into()),
        weight_scale: Scale::Param("scale".into()),
        bias_scale: Scale::One,
    })
}

/// `y = scale * (x @ w) + b`, kernel chosen by [`positive_scale`].
#[etp_primitive(name = "etp_tk_chosen", batched, x = x, weight = [weight, bias], trace_kernel = positive_scale)]
fn tk_chosen(x: &Tensor, weight: &Tensor, bias: &Tensor, #[param] scale: f64) -> Result<Tensor> {
    x.matmul(weight)?.mul_scalar(scale)?.add(bias)
}

#[yw_to_w(tk_chosen)]
fn tk_chosen_yw(hidden: &Tensor, trace: &TensorMap) -> Result<TensorMap> {
    trace
        .iter()
        .map(|(k, t)| {
            let v = if k == "bias" {
                t.mul(hidden)?
            } else {
                spread(t, hidden)?
            };
            Ok((k.clone(), v))
        })
        .collect()
}

#[xy_to_dw(tk_chosen)]
fn tk_chosen_dw(
    x: &Tensor,
    hidden: &Tensor,
    _w: &TensorMap,
    p: &tk_chosen::Params,
) -> Result<TensorMap> {
    Ok([
        ("weight".to_string(), outer(x, hidden)?.mul_scalar(p.scale)?),
        ("bias".to_string(), over_batch(hidden)?),
    ]
    .into())
}

#[init_drtrl(tk_chosen)]
fn tk_chosen_init(_x: &Aval, y: &Aval, w: &AvalMap, n: usize) -> Result<TensorMap> {
    Ok([
        ("weight".to_string(), zeros_w(y, &w["weight"], n)?),
        ("bias".to_string(), zeros_y(y, n)?),
    ]
    .into())
}

#[init_pp(tk_chosen)]
fn tk_chosen_init_pp(_x: &Aval, y: &Aval, _w: &AvalMap, n: usize) -> Result<Tensor> {
    zeros_y(y, n)
}

// ------------------------------------------------ a recurrent model

#[derive(Clone, Copy)]
enum Which {
    Scaled,
    Wrong,
    Chosen(f64),
    /// `etp_mm` with weight and bias transforms.
    Dense,
    /// `etp_sp_mm`.
    Sparse,
    /// `etp_lora_mm`.
    Lora,
}

/// A fixed sparse pattern over `[x, h]` (8 inputs) × 5 outputs.
fn pattern() -> CsrStructure {
    CsrStructure::from_dense_pattern(8, 5, |r, c| (r + 2 * c) % 3 != 0)
}

/// `h' = 0.7 h + tanh(op([x, h]))`, output `h'`.
struct Rnn {
    which: Which,
    n_in: usize,
    n: usize,
}

impl Model for Rnn {
    fn init(&self, init: &mut Init) -> Result<()> {
        let (i, o) = (self.n_in + self.n, self.n);
        let mut params: Vec<(&str, Vec<usize>)> = match self.which {
            Which::Sparse => vec![("w", vec![pattern().nnz()])],
            Which::Lora => vec![("w", vec![i, 2]), ("a", vec![2, o])],
            _ => vec![("w", vec![i, o])],
        };
        if matches!(
            self.which,
            Which::Chosen(_) | Which::Dense | Which::Sparse | Which::Lora
        ) {
            params.push(("b", vec![o]));
        }
        for (k, shape) in params {
            let v = Initializer::Normal { std: 0.5 }.draw(&shape, init.dtype(), init.rng())?;
            init.param(k, None, v)?;
        }
        init.hidden("h", &[self.n])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("h")?;
        let xh = braintrace::concat(&[x.clone(), h.clone()], 1)?;
        let w = ctx.param("w")?;
        let y = match self.which {
            Which::Scaled => tk_scaled(&xh, &w, 0.8)?,
            Which::Wrong => tk_wrong(&xh, &w, 0.8)?,
            Which::Chosen(s) => tk_chosen(&xh, &w, &ctx.param("b")?, s)?,
            Which::Dense => {
                let t = Transforms {
                    weight_fn: ElemFn::builtin("tanh"),
                    bias_fn: ElemFn::builtin("softplus"),
                    ..Transforms::default()
                };
                matmul(&xh, &w, Some(&ctx.param("b")?), &t)?
            }
            Which::Sparse => {
                let t = Transforms {
                    weight_fn: ElemFn::builtin("sigmoid"),
                    ..Transforms::default()
                };
                sparse_matmul(&xh, &w, &pattern(), Some(&ctx.param("b")?), &t)?
            }
            Which::Lora => {
                let t = Transforms {
                    a_fn: ElemFn::builtin("tanh"),
                    b_fn: ElemFn::builtin("sigmoid"),
                    ..Transforms::default()
                };
                lora_matmul(&xh, &w, &ctx.param("a")?, 0.5, Some(&ctx.param("b")?), &t)?
            }
        };
        let h_new = h.mul_scalar(0.7)?.add(&y.tanh()?)?;
        ctx.set_hidden("h", h_new.clone())?;
        Ok(h_new)
    }
}

fn draw(shape: &[usize], seed: u64) -> Tensor {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

fn mse(o: &Tensor, y: &Tensor) -> Result<Tensor> {
    o.sub(y)?.square()?.mean_all()
}

/// Gradients and traces over 5 steps, and the learner's account.
fn run(which: Which, algo: Algorithm) -> Result<(TensorDict, Vec<Tensor>, String)> {
    let (n_in, n, b, t) = (3, 5, 2, 5);
    let model = Rnn { which, n_in, n };
    let state = ModelState::new(&model, DType::F64, 3, Some(b))?;
    let xs = draw(&[t, b, n_in], 1);
    let ys = draw(&[t, b, n], 2);
    let mut learner = compile(model, state, algo, &xs.index_axis0(0)?, Some(b))?;
    let out = learner.etrace_grad(&xs, &ys, mse, Reduction::Mean)?;
    Ok((out.grads, learner.traces(), learner.explain()))
}

fn assert_close(what: &str, a: &[Tensor], b: &[Tensor]) {
    assert_eq!(a.len(), b.len(), "{what}: counts");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.shape(), y.shape(), "{what}: shapes");
        let (x, y) = (x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap());
        assert!(y.iter().any(|v| v.abs() > 1e-6), "{what}: all zero");
        for (p, q) in x.iter().zip(&y) {
            assert!(
                (p - q).abs() <= 1e-12 * (1.0 + q.abs()),
                "{what}: {p} vs {q}"
            );
        }
    }
}

fn grads(d: &TensorDict) -> Vec<Tensor> {
    d.values().cloned().collect()
}

#[test]
fn a_declared_dense_kernel_runs_and_equals_the_rules_in_drtrl() {
    let (g_fast, tr_fast, explain) = run(Which::Scaled, DRtrl::default().into()).unwrap();
    assert!(explain.contains("fused trace kernels: 1 of 1"), "{explain}");
    let (g_rules, tr_rules, explain) =
        run(Which::Scaled, DRtrl::default().fast_paths(false).into()).unwrap();
    assert!(explain.contains("fused trace kernels: 0 of 1"), "{explain}");
    assert_close("gradients", &grads(&g_fast), &grads(&g_rules));
    assert_close("traces", &tr_fast, &tr_rules);
}

#[test]
fn a_declared_dense_kernel_runs_and_equals_the_rules_in_pp_prop() {
    let pp = PpProp::new(0.9).unwrap();
    let (g_fast, tr_fast, explain) = run(Which::Scaled, pp.into()).unwrap();
    assert!(explain.contains("(pp_prop): 1 of 1"), "{explain}");
    let (g_rules, tr_rules, explain) = run(Which::Scaled, pp.fast_paths(false).into()).unwrap();
    assert!(explain.contains("(pp_prop): 0 of 1"), "{explain}");
    assert_close("gradients", &grads(&g_fast), &grads(&g_rules));
    assert_close("traces", &tr_fast, &tr_rules);
}

#[test]
fn a_wrongly_declared_kernel_is_refused_naming_the_primitive() {
    for algo in [DRtrl::default().into(), PpProp::new(0.9).unwrap().into()] {
        let e = run(Which::Wrong, algo).expect_err("refused");
        match &e {
            Error::Etp { primitive, .. } => assert_eq!(primitive, "etp_tk_wrong"),
            other => panic!("not an ETP error: {other}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("trace kernel") && msg.contains("disagrees"),
            "{msg}"
        );
    }
    // The rules alone are fine.
    run(Which::Wrong, DRtrl::default().fast_paths(false).into()).unwrap();
}

#[test]
fn a_chosen_kernel_runs_only_where_its_function_says() {
    let (g_fast, _, explain) = run(Which::Chosen(0.8), DRtrl::default().into()).unwrap();
    assert!(explain.contains("fused trace kernels: 1 of 1"), "{explain}");
    let (g_rules, _, _) = run(
        Which::Chosen(0.8),
        DRtrl::default().fast_paths(false).into(),
    )
    .unwrap();
    assert_close("gradients", &grads(&g_fast), &grads(&g_rules));
    let (_, _, explain) = run(Which::Chosen(-0.8), DRtrl::default().into()).unwrap();
    assert!(explain.contains("fused trace kernels: 0 of 1"), "{explain}");
}

#[test]
fn the_builtin_kernels_run_and_equal_the_rules() {
    for which in [Which::Dense, Which::Sparse, Which::Lora] {
        let (g_fast, tr_fast, explain) = run(which, DRtrl::default().into()).unwrap();
        assert!(explain.contains("fused trace kernels: 1 of 1"), "{explain}");
        let (g_rules, tr_rules, _) = run(which, DRtrl::default().fast_paths(false).into()).unwrap();
        assert_close("gradients", &grads(&g_fast), &grads(&g_rules));
        assert_close("traces", &tr_fast, &tr_rules);
    }
}

// ------------------------------------------------ allocations per step

mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Counting;

    thread_local! {
        pub static BYTES: Cell<usize> = const { Cell::new(0) };
    }

    fn count(n: usize) {
        // `try_with`: the slot may be gone while the thread exits.
        let _ = BYTES.try_with(|c| c.set(c.get() + n));
    }

    // SAFETY: every call is passed on to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            count(l.size());
            unsafe { System.alloc(l) }
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            count(l.size());
            unsafe { System.alloc_zeroed(l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, size: usize) -> *mut u8 {
            count(size);
            unsafe { System.realloc(p, l, size) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            unsafe { System.dealloc(p, l) }
        }
    }
}

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

/// Bytes allocated on this thread per warm `etrace_grad` step of the
/// scaled RNN at hidden `n`, batch `b` (20 steps more against 4).
fn bytes_per_step(which: Which, algo: impl Fn() -> Algorithm, n: usize, b: usize) -> f64 {
    let n_in = 8;
    let model = || Rnn { which, n_in, n };
    let state = ModelState::new(&model(), DType::F64, 3, Some(b)).unwrap();
    let mut learner = compile(
        model(),
        state,
        algo(),
        &Tensor::zeros(&[b, n_in], DType::F64),
        Some(b),
    )
    .unwrap();
    let mut run = |t: usize| {
        let xs = draw(&[t, b, n_in], t as u64);
        let ys = draw(&[t, b, n], 100 + t as u64);
        let before = counting::BYTES.with(|c| c.get());
        learner.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap();
        counting::BYTES.with(|c| c.get()) - before
    };
    run(3);
    let (short, long) = (run(4), run(24));
    (long as f64 - short as f64) / 20.0
}

#[test]
fn a_declared_kernel_step_allocates_as_the_builtin_does() {
    // Bytes per warm step at hidden 32 and 128 (a trace grows 14-fold):
    // the macro primitive's declared kernel allocates what the built-in
    // `etp_mm`'s does (parameter-sized bookkeeping, no trace), and far less
    // than a trace; the rule path allocates several traces per step
    // (measured when written: 5.5 traces at hidden 128).
    let b = 4;
    let trace = |n: usize| (b * (8 + n) * n * 8) as f64;
    let fast = |n| bytes_per_step(Which::Scaled, || DRtrl::default().into(), n, b);
    let rules = |n| {
        bytes_per_step(
            Which::Scaled,
            || DRtrl::default().fast_paths(false).into(),
            n,
            b,
        )
    };
    let builtin = |n| bytes_per_step(Which::Dense, || DRtrl::default().into(), n, b);
    for n in [32, 128] {
        let (f, r, bi) = (fast(n), rules(n), builtin(n));
        eprintln!(
            "hidden {n}, bytes per step: declared kernel {f}, built-in etp_mm {bi}, rules {r} (a trace {})",
            trace(n)
        );
        assert!(
            f <= 1.05 * bi + 1024.0,
            "declared kernel {f} vs built-in {bi} bytes per step"
        );
        assert!(f < trace(n) / 2.0, "declared kernel: {f} bytes per step");
    }
}
