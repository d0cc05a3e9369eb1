//! The D-RTRL bandwidth floor, shared by `bench_floor` and `bench_learn
//! --floor`: one plain single-threaded loop over the f32 weight traces of
//! two `[I, O]` relations (`ε = ε·D + x⊗Df; ∇ += g·ε`, `I = n_in + n_rec`,
//! `O = n_rec`), with nothing else of a learner. It is the trace traffic of
//! both bench networks' D-RTRL: the GRU's two relations, or the LIF's one
//! relation with two states (whose readout relation, 4 outputs, is left
//! out). Each trace element is read and written once per step.

// Each example uses part of this module.
#![allow(dead_code)]

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
        TraceFloor {
            dims: (b, i, o),
            traces: [vec![0.5; n], vec![0.25; n]],
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

    /// One step of the loop.
    pub fn step(&mut self) {
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
