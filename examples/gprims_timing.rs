//! Time per step of D-RTRL and pp_prop on two small nets with the new
//! primitives, beside their dense equivalents (f32, CPU time per step,
//! median of 3 runs):
//!
//! * `grouped`: `h' = tanh(inp(x) + rec(h))` with `GroupedLinear`s of
//!   `G = 8` blocks of 16 (hidden 128), vs `dense`: the same with `Linear`s
//!   128 → 128 (the D-RTRL trace of `rec` is `G` times larger);
//! * `emb`: `h' = tanh(Embedding(tok) + rec(h))`, vocabulary 256, hidden 64.
//!
//! ```text
//! cargo run --release --example gprims_timing
//! ```
//!
//! One run on the shared 2-core machine (load about 19), T = 50, B = 16:
//!
//! ```text
//! grouped  d_rtrl   wall_ms/step 1.324  (fused trace kernels: 0 of 2)
//! dense    d_rtrl   wall_ms/step 0.644  (fused trace kernels: 2 of 2)
//! emb      d_rtrl   wall_ms/step 0.584  (fused trace kernels: 2 of 2)
//! grouped  pp_prop  wall_ms/step 0.130  (fused dense gradients: 0 of 2)
//! dense    pp_prop  wall_ms/step 0.124  (fused dense gradients: 2 of 2)
//! emb      pp_prop  wall_ms/step 0.296  (fused dense gradients: 2 of 2)
//! ```
//!
//! The grouped layers run the generic rule path (no built-in trace kernel
//! has their group axis), so their 8 times smaller D-RTRL trace does not
//! yet make them faster than the fused dense path.

use braintrace::learn::{
    compile, Algorithm, DRtrl, Init, Model, ModelState, PpProp, Reduction, StepCtx,
};
use braintrace::nn::{Embedding, GroupedLinear, Linear};
use braintrace::{DType, Result, Tensor};
use std::time::Instant;

const B: usize = 16;
const T: usize = 50;

enum Rec {
    Grouped(GroupedLinear, GroupedLinear),
    Dense(Linear, Linear),
    Emb(Embedding, Linear),
}

struct Net {
    rec: Rec,
    hidden: Vec<usize>,
}

impl Model for Net {
    fn init(&self, init: &mut Init) -> Result<()> {
        match &self.rec {
            Rec::Grouped(a, b) => {
                a.init(init)?;
                b.init(init)?
            }
            Rec::Dense(a, b) => {
                a.init(init)?;
                b.init(init)?
            }
            Rec::Emb(a, b) => {
                a.init(init)?;
                b.init(init)?
            }
        }
        init.hidden("h", &self.hidden)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("h")?;
        let (a, r) = match &self.rec {
            Rec::Grouped(a, b) => (a.step(ctx, x)?, b.step(ctx, &h)?),
            Rec::Dense(a, b) => (a.step(ctx, x)?, b.step(ctx, &h)?),
            Rec::Emb(a, b) => (a.step(ctx, x)?, b.step(ctx, &h)?),
        };
        let h = a.add(&r)?.tanh()?;
        ctx.set_hidden("h", h.clone())?;
        h.sum_all()
    }
}

fn cpu_ms() -> f64 {
    let mut total = 0.0;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0);
            }
        }
    }
    total / 1e6
}

fn time(name: &str, algo: &str, make: impl Fn() -> Net, xs: &Tensor) -> Result<()> {
    let net = make();
    let state = ModelState::new(&net, DType::F32, 0, Some(B))?;
    let a: Algorithm = if algo == "d_rtrl" {
        DRtrl::default().into()
    } else {
        PpProp::new(0.95)?.into()
    };
    let mut l = compile(net, state, a, &xs.index_axis0(0)?, Some(B))?;
    let ys = Tensor::zeros(&[T], DType::F32);
    let loss = |o: &Tensor, y: &Tensor| o.sub(y)?.square();
    l.etrace_grad(
        &xs.slice_axis(0, 0, 3)?,
        &ys.slice_axis(0, 0, 3)?,
        loss,
        Reduction::Mean,
    )?;
    let mut runs = Vec::new();
    let mut walls = Vec::new();
    for _ in 0..3 {
        let (c0, w0) = (cpu_ms(), Instant::now());
        l.etrace_grad(xs, &ys, loss, Reduction::Mean)?;
        runs.push((cpu_ms() - c0) / T as f64);
        walls.push(w0.elapsed().as_secs_f64() * 1e3 / T as f64);
    }
    runs.sort_by(|a, b| a.total_cmp(b));
    walls.sort_by(|a, b| a.total_cmp(b));
    let fused = l.explain().lines().nth(1).unwrap_or_default().to_string();
    println!(
        "{name:8} {algo:8} cpu_ms/step {:.3}  wall_ms/step {:.3}  ({fused})",
        runs[1], walls[1]
    );
    Ok(())
}

fn main() -> Result<()> {
    let (g, k) = (8, 16);
    let n = g * k;
    let xs_g = Tensor::ones(&[T, B, g, k], DType::F32).mul_scalar(0.1)?;
    let xs_d = Tensor::ones(&[T, B, n], DType::F32).mul_scalar(0.1)?;
    let toks: Vec<f64> = (0..T * B).map(|i| ((i * 37) % 256) as f64).collect();
    let xs_e = Tensor::from_vec(toks, &[T, B])?.cast(DType::F32)?;
    for algo in ["d_rtrl", "pp_prop"] {
        time(
            "grouped",
            algo,
            || Net {
                rec: Rec::Grouped(
                    GroupedLinear::new("inp", g, k, k).unwrap(),
                    GroupedLinear::new("rec", g, k, k).unwrap(),
                ),
                hidden: vec![g, k],
            },
            &xs_g,
        )?;
        time(
            "dense",
            algo,
            || Net {
                rec: Rec::Dense(Linear::new("inp", n, n), Linear::new("rec", n, n)),
                hidden: vec![n],
            },
            &xs_d,
        )?;
        time(
            "emb",
            algo,
            || Net {
                rec: Rec::Emb(
                    Embedding::new("emb", 256, 64).unwrap(),
                    Linear::new("rec", 64, 64),
                ),
                hidden: vec![64],
            },
            &xs_e,
        )?;
    }
    Ok(())
}
