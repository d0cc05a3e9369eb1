//! Heap allocations in the steady state, counted by this test binary's own
//! global allocator (per thread, so that tests running side by side do not
//! count each other's).
//!
//! The planned executor keeps its buffers, its block buffers and its
//! operands' lists from call to call: once warm, a call of a jitted
//! program of fused element-wise groups, matrix products, joins and a
//! reshape allocates its list of results and nothing per op. A learner's
//! step writes its rows of `xs` and `ys` in place and keeps the D-RTRL
//! kernels' operands; what is left is bookkeeping per step (lists of the
//! program's arguments and results), the same at every hidden size. Before, a GRU pp_prop step allocated 66 times (six per
//! fused group) and a LIF D-RTRL step 122.

mod learn_support;

use braintrace::learn::{
    compile, Algorithm, DRtrl, Model, ModelState, NonTemporal, PpProp, Reduction,
};
use braintrace::nn::{Chain, GruCell, LeakyRateReadout, LifCell, Linear};
use braintrace::prelude::*;
use learn_support::{draw, mse};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the slot may be gone while the thread exits.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(p, l, size) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations on this thread while `f` runs, and its result.
fn allocations<R>(f: impl FnOnce() -> R) -> (usize, R) {
    let before = ALLOCATIONS.with(Cell::get);
    let r = f();
    (ALLOCATIONS.with(Cell::get) - before, r)
}

/// A GRU-like step, `f32`: two joins, three products, gates and the new
/// state in fused groups, a reshape; the state comes back as an argument.
fn gru_step(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (wz, wh, x, h) = (&a[0], &a[1], &a[2], &a[3]);
    let xh = concat(&[x.clone(), h.clone()], 1)?;
    let z = xh.matmul(wz)?.sigmoid()?;
    let rh = z.mul(h)?;
    let c = concat(&[x.clone(), rh], 1)?.matmul(wh)?.tanh()?;
    let h_new = z.mul(h)?.add(&z.neg()?.add_scalar(1.0)?.mul(&c)?)?;
    let flat = h_new.reshape(&[h_new.shape().iter().product()])?;
    Ok(vec![h_new, flat.mul_scalar(2.0)?])
}

#[test]
fn a_warm_planned_program_allocates_only_its_result_list() {
    let (b, n_in, n) = (4, 8, 32);
    let f = |shape: &[usize], seed| draw(shape, seed).cast(DType::F32).unwrap();
    let (wz, wh, x) = (f(&[n_in + n, n], 1), f(&[n_in + n, n], 2), f(&[b, n_in], 3));
    let step = Jit::new(gru_step);
    let mut h = f(&[b, n], 4);
    let mut per_call = Vec::new();
    for _ in 0..8 {
        let args = vec![wz.clone(), wh.clone(), x.clone(), h];
        let (n_alloc, out) = allocations(|| step.call_owned(args));
        let mut out = out.unwrap();
        out.truncate(1);
        h = out.pop().unwrap();
        per_call.push(n_alloc);
    }
    // The first calls trace, stage and fill the pool; the last ones reuse.
    let warm = &per_call[4..];
    assert!(
        warm.iter().all(|&n| n <= 1),
        "allocations per call {per_call:?}: a warm call should allocate its result list alone"
    );
}

fn gru() -> Chain<GruCell, Linear> {
    Chain::new(GruCell::new("rnn", 16, 32), Linear::new("out", 32, 4))
}

fn lif() -> Chain<LifCell, LeakyRateReadout> {
    Chain::new(
        LifCell::new("", 16, 32, 0.8, 0.6, 1.0),
        LeakyRateReadout::new("readout", 32, 4, 5.0, 1.0),
    )
}

fn per_step<M: Model>(model: impl Fn() -> M, algo: impl Fn() -> Algorithm) -> f64 {
    let (b, n_in, n_out) = (1, 16, 4);
    let state = ModelState::new(&model(), DType::F32, 3, Some(b)).unwrap();
    let x0 = Tensor::zeros(&[b, n_in], DType::F32);
    let mut learner = compile(model(), state, algo(), &x0, Some(b)).unwrap();
    let mut run = |t: usize| {
        let xs = draw(&[t, b, n_in], t as u64).cast(DType::F32).unwrap();
        let ys = draw(&[t, b, n_out], 100 + t as u64)
            .cast(DType::F32)
            .unwrap();
        allocations(|| learner.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap()).0
    };
    run(3);
    let (short, long) = (run(4), run(24));
    (long as f64 - short as f64) / 20.0
}

#[test]
fn a_learner_step_allocates_a_bounded_few_times() {
    // Measured when written: GRU pp_prop 8, D-RTRL 7; LIF pp_prop 8,
    // D-RTRL 7 (hidden 32, batch 1). The bound leaves room for a change of
    // the step's bookkeeping, not for an allocation per op.
    let bound = 16.0;
    // braintrace's zeros for parameters without a relation: the planned
    // path. (`NonTemporal::InStep`, the default since issue 33, computes the
    // readout's in-step gradient through a path not yet planned: about 45
    // allocations a GRU pp_prop step.)
    let zero = NonTemporal::Zero;
    let cases: [(&str, f64); 4] = [
        (
            "gru pp_prop",
            per_step(gru, || PpProp::new(0.95).unwrap().non_temporal(zero).into()),
        ),
        (
            "gru d_rtrl",
            per_step(gru, || DRtrl::default().non_temporal(zero).into()),
        ),
        (
            "lif pp_prop",
            per_step(lif, || PpProp::new(0.95).unwrap().non_temporal(zero).into()),
        ),
        (
            "lif d_rtrl",
            per_step(lif, || DRtrl::default().non_temporal(zero).into()),
        ),
    ];
    for (what, n) in cases {
        eprintln!("{what}: {n} allocations per step");
        assert!(
            n <= bound,
            "{what}: {n} allocations per step (bound {bound})"
        );
    }
}
