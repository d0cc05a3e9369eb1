//! pp_prop's dense weight gradients accumulated by the learner over chunks
//! of steps (`PpProp::fast_paths`) equal the rule path (`xy_to_dw` per step)
//! in f64, on every model family of the golden cases, both VJP methods,
//! across `update` calls and several `etrace_grad` calls, with sequences
//! long enough that a chunk is flushed in the middle of a call.

mod learn_support;

use braintrace::etp::ElemFn;
use braintrace::learn::{
    compile, Init, Model, ModelState, PpProp, Reduction, StepCtx, TensorDict, VjpMethod,
};
use braintrace::nn::Initializer;
use braintrace::prelude::*;
use braintrace::prims::{matmul, Transforms};
use learn_support::models::{DiagNet, GruNet, LeakyNet, LifNet};
use learn_support::{draw, mse};

/// `h' = 0.7 h + tanh([x, h] @ tanh(W) + softplus(b))`: a dense relation
/// with weight and bias transforms.
struct Hooked {
    n_in: usize,
    n_rec: usize,
}

impl Model for Hooked {
    fn init(&self, init: &mut Init) -> Result<()> {
        let w = Initializer::Normal { std: 0.6 }.draw(
            &[self.n_in + self.n_rec, self.n_rec],
            init.dtype(),
            init.rng(),
        )?;
        init.param("W", None, w)?;
        let b = Initializer::Normal { std: 0.6 }.draw(&[self.n_rec], init.dtype(), init.rng())?;
        init.param("b", None, b)?;
        init.hidden("h", &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("h")?;
        let t = Transforms {
            weight_fn: ElemFn::builtin("tanh"),
            bias_fn: ElemFn::builtin("softplus"),
            ..Transforms::default()
        };
        let xh = braintrace::concat(&[x.clone(), h.clone()], 1)?;
        let y = matmul(&xh, &ctx.param("W")?, Some(&ctx.param("b")?), &t)?;
        let h_new = h.mul_scalar(0.7)?.add(&y.tanh()?)?;
        ctx.set_hidden("h", h_new.clone())?;
        Ok(h_new)
    }
}

fn close(what: &str, got: &TensorDict, want: &TensorDict, tol: f64) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (k, w) in want {
        let (g, w) = (got[k].to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
        assert_eq!(g.len(), w.len(), "{what}[{k}]");
        let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-3);
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= tol * scale,
                "{what}[{k}] element {i}: fast {a} vs rules {b}"
            );
        }
    }
}

/// Run `update`, then `etrace_grad` over `t1` and `t2` steps, with the
/// fused accumulation on and off; gradients, losses and traces must agree.
fn check<M: Model, F: Fn() -> M>(make: F, batch: usize, n_in: usize, base: PpProp, t1: usize) {
    let seed = 11 + t1 as u64;
    let run = |fast: bool| {
        let model = make();
        let state = ModelState::new(&model, DType::F64, seed, Some(batch)).unwrap();
        let x0 = draw(&[batch, n_in], seed);
        let (out, _) = state.step(&model, &x0).unwrap();
        let n_out = out.shape()[1];
        let mut l = compile(model, state, base.fast_paths(fast), &x0, Some(batch)).unwrap();
        let explained = l.explain();
        l.update(&draw(&[batch, n_in], seed + 1)).unwrap();
        let mut gs = Vec::new();
        for (k, t) in [t1, 3].into_iter().enumerate() {
            let xs = draw(&[t, batch, n_in], seed + 2 + k as u64);
            let ys = draw(&[t, batch, n_out], seed + 5 + k as u64);
            let g = l.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap();
            gs.push((g.grads, g.losses.to_vec_f64().unwrap()));
        }
        (gs, l.traces(), explained)
    };
    let (fast, tr_fast, ex_fast) = run(true);
    let (slow, tr_slow, ex_slow) = run(false);
    // The fast run really took the fused path, the other did not.
    assert!(
        !ex_fast.contains("fused dense gradients (pp_prop): 0 of"),
        "{ex_fast}"
    );
    assert!(
        ex_slow.contains("fused dense gradients (pp_prop): 0 of"),
        "{ex_slow}"
    );
    for ((gf, lf), (gs, ls)) in fast.iter().zip(&slow) {
        close("grads", gf, gs, 1e-12);
        assert_eq!(lf, ls, "losses");
    }
    for (a, b) in tr_fast.iter().zip(&tr_slow) {
        assert_eq!(a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap(), "traces");
    }
}

#[test]
fn pp_chunk_rows_follow_the_sizes() {
    use braintrace::learn::pp_chunk_rows;
    // 2·144·128/272 = 135.5: 135 rows, rounded down to batches of 16.
    assert_eq!(pp_chunk_rows(144, 128, 16), 128);
    assert_eq!(pp_chunk_rows(144, 128, 64), 128);
    // 2·528·512/1040 = 519.9: at most 512.
    assert_eq!(pp_chunk_rows(528, 512, 16), 512);
    assert_eq!(pp_chunk_rows(4096, 4096, 1), 512);
    // Small relations: at least 64 rows (63 in batches of 3).
    assert_eq!(pp_chunk_rows(8, 5, 3), 63);
    // At least one step, however large the batch.
    assert_eq!(pp_chunk_rows(144, 128, 1000), 1000);
    assert_eq!(pp_chunk_rows(0, 0, 0), 64);
}

#[test]
fn pp_dense_accumulation_equals_the_rules() {
    for base in [
        PpProp::new(0.9).unwrap(),
        PpProp::decays(0.5, 0.8)
            .unwrap()
            .vjp_method(VjpMethod::MultiStep),
    ] {
        // 100 steps of batch 3: 300 rows, more than one chunk.
        check(|| GruNet::new(3, 5, 2), 3, 3, base, 100);
        // Batch 32: a chunk of two steps, so a product per step instead.
        check(|| GruNet::new(3, 5, 2), 32, 3, base, 5);
        check(|| GruNet::new(2, 4, 3), 1, 2, base, 7);
        // Two states per group.
        check(|| LifNet::new(3, 5, 2, 0.8, 0.6, 0.3, 0.8), 2, 3, base, 9);
        // A readout relation and a recurrent one over [x, h].
        check(|| LeakyNet::new(2, 4, 2, 0.7, 0.9), 2, 2, base, 6);
        // etp_elemwise without input, without and with weight_fn.
        check(|| DiagNet::identity(3, 4), 2, 3, base, 6);
        check(|| DiagNet::new(3, 4), 2, 3, base, 6);
        // Dense with weight and bias transforms (f'(W) once per call).
        check(|| Hooked { n_in: 2, n_rec: 4 }, 2, 2, base, 8);
    }
}

#[test]
fn pp_dense_accumulation_in_f32_agrees_with_f64() {
    // Hidden 6: the chunk product runs on matrixmultiply; hidden 16 and
    // 32 (one and two column panels of 16): on the crate's kernel
    // (`sgemm::add_product` picks `gemm_acc`; 64-row chunks, 40 steps of
    // batch 2 flush a full chunk and a partial one).
    for n_rec in [6, 16, 32] {
        learn_support::assert_learner_f32_matches_f64(
            || GruNet::new(3, n_rec, 2),
            || PpProp::new(0.9).unwrap().into(),
            Some(2),
            40,
            (&[2, 3], &[2, 2]),
            |_| {},
        );
    }
}
