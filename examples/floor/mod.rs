//! The floors of a learning step, shared by `bench_floor` and `bench_learn
//! --floor`.
//!
//! [`TraceFloor`], D-RTRL's bandwidth floor: one plain single-threaded loop
//! (built with AVX2 where the CPU has it)
//! over the f32 weight traces of two `[I, O]` relations (`ε = ε·D + x⊗Df; ∇ += g·ε`, `I = n_in + n_rec`,
//! `O = n_rec`), with nothing else of a learner. It is the trace traffic of
//! both bench networks' D-RTRL: the GRU's two relations, or the LIF's one
//! relation with two states (whose readout relation, 4 outputs, is left
//! out). Each trace element is read and written once per step.
//!
//! [`ProductsFloor`], pp_prop's: the model's matrix products alone.

// Each example uses part of this module.
#![allow(dead_code)]

use braintrace::kernels::sgemm;
use braintrace::learn::pp_chunk_rows;
use ndarray::linalg::general_mat_mul;
use ndarray::Array2;

/// The buffers of the loop, allocated once; [`TraceFloor::step`] runs one
/// step over them.
pub struct TraceFloor {
    dims: (usize, usize, usize),
    traces: [Vec<f32>; 2],
    grads: [Vec<f32>; 2],
    d: Vec<f32>,
    f: Vec<f32>,
    g: Vec<f32>,
    x: Vec<f32>,
}

impl TraceFloor {
    pub fn new(n_in: usize, n_rec: usize, batch: usize) -> Self {
        let (b, i, o) = (batch, n_in + n_rec, n_rec);
        let n = b * i * o;
        // Huge pages where the OS grants them, as the learner's traces
        // (advised before the first write).
        let trace = |v: f32| {
            let mut t = vec![0f32; n];
            braintrace::kernels::pages::advise_huge(&mut t);
            t.fill(v);
            t
        };
        TraceFloor {
            dims: (b, i, o),
            traces: [trace(0.5), trace(0.25)],
            grads: [vec![0.0; i * o], vec![0.0; i * o]],
            d: vec![0.9; b * o],
            f: vec![0.1; b * o],
            g: vec![0.01; b * o],
            x: vec![0.3; b * i],
        }
    }

    /// Bytes the loop holds (traces, gradients and per-step operands).
    pub fn bytes(&self) -> usize {
        let n = |v: &Vec<f32>| v.len() * 4;
        self.traces.iter().chain(&self.grads).map(n).sum::<usize>()
            + [&self.d, &self.f, &self.g, &self.x]
                .into_iter()
                .map(n)
                .sum::<usize>()
    }

    /// Bytes of trace traffic per step: two traces, each read and written.
    pub fn bytes_per_step(&self) -> f64 {
        let (b, i, o) = self.dims;
        2.0 * 2.0 * (b * i * o) as f64 * 4.0
    }

    /// One step of the loop, in 256-bit vectors where the CPU has AVX2 (what
    /// the learner's trace kernel runs; as `target-cpu=native` would build
    /// it on a CPU without AVX-512). Without the features it compiled with
    /// SSE2 only, and the floor was up to 1.5x slower than that kernel. An
    /// AVX-512 build of the same loop was slower still on a Zen 5 (GRU
    /// 512x64: 11.2-13.9 ms against 7.5-8.8 with AVX2), so it is not used.
    pub fn step(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above), the
            // only requirement of a `target_feature` function.
            unsafe { self.step_avx2() };
            return;
        }
        self.step_plain();
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn step_avx2(&mut self) {
        self.step_plain();
    }

    /// The loop itself (inlined into [`TraceFloor::step_avx2`]'s build).
    #[inline(always)]
    fn step_plain(&mut self) {
        let (b, i, o) = self.dims;
        let (d, f, g, x) = (&self.d, &self.f, &self.g, &self.x);
        for (e, grad) in self.traces.iter_mut().zip(self.grads.iter_mut()) {
            for bb in 0..b {
                let (db, fb, gb) = (
                    &d[bb * o..(bb + 1) * o],
                    &f[bb * o..(bb + 1) * o],
                    &g[bb * o..(bb + 1) * o],
                );
                for ii in 0..i {
                    let xi = x[bb * i + ii];
                    let row = &mut e[(bb * i + ii) * o..(bb * i + ii + 1) * o];
                    let gr = &mut grad[ii * o..(ii + 1) * o];
                    for k in 0..o {
                        let v = db[k] * row[k] + xi * fb[k];
                        row[k] = v;
                        gr[k] += gb[k] * v;
                    }
                }
            }
        }
        std::hint::black_box(&self.grads);
    }
}

/// The pp_prop products floor: the products a pp_prop step cannot avoid,
/// with the learner's own matrix products (one thread): the forward product
/// `[B, I]·[I, O]` of each of `n_fwd` dense weights (`kernels::sgemm` on
/// the weight's panels, packed once, for up to 128 rows, as the planned
/// executor runs it; matrixmultiply otherwise), and the weight gradient
/// `x̄ᵀ g` of each of `n_grad` relations, one `[I, rows]·[rows, O]` product
/// per chunk of [`pp_chunk_rows`] rows of steps × batch, as the learner
/// gathers and multiplies them (`kernels::sgemm::add_product`). The bench nets:
/// GRU 3 and 2 (as `explain()` counts its relations), LIF 1 and 1; the
/// readout's products (output size 4) are left out.
pub struct ProductsFloor {
    batch: usize,
    n_grad: usize,
    x: Array2<f32>,
    weights: Vec<(Array2<f32>, Option<sgemm::PackedB>)>,
    y: Array2<f32>,
    xbar: Array2<f32>,
    g: Array2<f32>,
    grads: Vec<Array2<f32>>,
    /// Chunk rows (a multiple of the batch) and the rows gathered so far.
    cap: usize,
    rows: usize,
}

impl ProductsFloor {
    pub fn new(n_in: usize, n_rec: usize, batch: usize, n_fwd: usize, n_grad: usize) -> Self {
        let (b, i, o) = (batch, n_in + n_rec, n_rec);
        let x = Array2::from_elem((b, i), 0.3f32);
        let fits = sgemm::applies(&x.view(), o);
        let weights = (0..n_fwd)
            .map(|k| {
                let w = Array2::from_elem((i, o), 0.01 * (k + 1) as f32);
                let panels = fits.then(|| sgemm::PackedB::new(&w.view()));
                (w, panels)
            })
            .collect();
        let cap = pp_chunk_rows(i, o, b);
        ProductsFloor {
            batch,
            n_grad,
            x,
            weights,
            y: Array2::zeros((b, o)),
            xbar: Array2::from_elem((cap, i), 0.2f32),
            g: Array2::from_elem((cap, o), 0.01f32),
            grads: (0..n_grad).map(|_| Array2::zeros((i, o))).collect(),
            cap,
            rows: 0,
        }
    }

    /// Multiply-adds × 2 of one step (forward products and the step's
    /// share of the gradient products).
    pub fn flop_per_step(&self) -> f64 {
        let (b, i) = self.x.dim();
        let o = self.y.dim().1;
        2.0 * ((self.weights.len() + self.n_grad) * b * i * o) as f64
    }

    /// Bytes the products hold.
    pub fn bytes(&self) -> usize {
        let mut n = self.x.len() + self.y.len() + self.xbar.len() + self.g.len();
        n += self.grads.iter().map(|g| g.len()).sum::<usize>();
        n += self.weights.iter().map(|(w, _)| 2 * w.len()).sum::<usize>();
        n * 4
    }

    /// Steps per gradient chunk.
    pub fn steps_per_chunk(&self) -> usize {
        self.cap / self.batch.max(1)
    }

    /// The forward product of weight `k`.
    pub fn forward(&mut self, k: usize) {
        let (w, panels) = &self.weights[k];
        match panels {
            Some(p) => sgemm::gemm(&self.x.view(), p, self.y.as_slice_mut().expect("row-major")),
            None => general_mat_mul(1.0, &self.x, w, 0.0, &mut self.y),
        }
        std::hint::black_box(&self.y);
    }

    /// The chunk's gradient products, one per relation.
    pub fn gradient_chunk(&mut self) {
        for grad in &mut self.grads {
            sgemm::add_product(&self.xbar.t(), &self.g.view(), grad);
        }
        std::hint::black_box(&self.grads);
    }

    /// One step: every forward product, and a chunk's gradient products
    /// every [`ProductsFloor::steps_per_chunk`] steps.
    pub fn step(&mut self) {
        for k in 0..self.weights.len() {
            self.forward(k);
        }
        self.rows += self.batch;
        if self.rows >= self.cap {
            self.gradient_chunk();
            self.rows = 0;
        }
    }
}
