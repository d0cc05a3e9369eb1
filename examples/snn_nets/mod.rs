//! Recurrent spiking networks of `nn::snn` layers, shared by the
//! `bench_learn` models `lif_syn` and `alif` and by `train_alif`:
//!
//! ```text
//! s_prev = cell's spikes of its current V
//! i = syn_in([x, s_prev]);  i = Expon(i) (if any);  s = cell(i);  out = readout(s)
//! ```
//!
//! and the soft-target cross-entropy the benchmark trains them with.

#![allow(dead_code)]

use braintrace::learn::{Init, Model, StepCtx};
use braintrace::nn::{Alif, Expon, LeakyRateReadout, Lif, Linear};
use braintrace::{Result, Tensor};

/// The spiking cell of a [`RecurrentSnn`].
#[derive(Clone, Debug)]
pub enum Cell {
    /// Leaky integrate-and-fire (state `V`).
    Lif(Lif),
    /// Adaptive LIF (states `V`, `a`).
    Alif(Alif),
}

/// A layer of spiking cells with recurrent spikes, an optional
/// exponential synapse on its input current and a leaky rate readout.
#[derive(Clone, Debug)]
pub struct RecurrentSnn {
    /// The input and recurrent weights over `[x, s_prev]` (`syn_in`).
    pub syn_in: Linear,
    /// The synapse filtering the current (`syn`), if any.
    pub syn: Option<Expon>,
    /// The neurons (`neu`).
    pub cell: Cell,
    /// The readout of the spikes (`readout`).
    pub readout: LeakyRateReadout,
}

impl RecurrentSnn {
    /// `lif_syn`: LIF (τ = 10, threshold 1, `ReluGrad`) behind an
    /// exponential synapse (τ = 5), readout τ = 5; `dt = 1`.
    pub fn lif_syn(n_in: usize, n_rec: usize, n_out: usize) -> Result<Self> {
        Ok(RecurrentSnn {
            syn_in: Linear::new("syn_in", n_in + n_rec, n_rec),
            syn: Some(Expon::new("syn", n_rec, 5.0, 1.0)?),
            cell: Cell::Lif(Lif::new("neu", n_rec, 10.0, 1.0)?),
            readout: LeakyRateReadout::new("readout", n_rec, n_out, 5.0, 1.0),
        })
    }
    /// `alif`: ALIF (τ = 10, τ_a = 100, β = 0.1, threshold 1, `ReluGrad`)
    /// without a synapse, readout τ = 5; `dt = 1`.
    pub fn alif(n_in: usize, n_rec: usize, n_out: usize) -> Result<Self> {
        Ok(RecurrentSnn {
            syn_in: Linear::new("syn_in", n_in + n_rec, n_rec),
            syn: None,
            cell: Cell::Alif(Alif::new("neu", n_rec, 10.0, 100.0, 1.0)?),
            readout: LeakyRateReadout::new("readout", n_rec, n_out, 5.0, 1.0),
        })
    }
}

impl Model for RecurrentSnn {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.syn_in.init(init)?;
        match &self.cell {
            Cell::Lif(c) => c.init(init)?,
            Cell::Alif(c) => c.init(init)?,
        }
        if let Some(s) = &self.syn {
            s.init(init)?;
        }
        self.readout.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let s_prev = match &self.cell {
            Cell::Lif(c) => c.spikes(ctx)?,
            Cell::Alif(c) => c.spikes(ctx)?,
        };
        let xs = braintrace::concat(&[x.clone(), s_prev], x.ndim() - 1)?;
        let mut i = self.syn_in.step(ctx, &xs)?;
        if let Some(s) = &self.syn {
            i = s.step(ctx, &i)?;
        }
        let s = match &self.cell {
            Cell::Lif(c) => c.step(ctx, &i)?,
            Cell::Alif(c) => c.step(ctx, &i)?,
        };
        self.readout.step(ctx, &s)
    }
}

/// Cross-entropy of logits `o` `(B, C)` against the soft targets
/// `softmax(y)`, summed over classes and averaged over the batch:
/// `mean_b Σ_k p_k (logsumexp(o) − o_k)`.
pub fn soft_cross_entropy(o: &Tensor, y: &Tensor) -> Result<Tensor> {
    let ey = y.exp()?;
    let p = ey.div(&ey.sum(&[1])?.expand_dims(1)?)?;
    let lse = o.exp()?.sum(&[1])?.log()?.expand_dims(1)?;
    let b = o.shape()[0] as f64;
    p.mul(&lse.sub(o)?)?.sum_all()?.mul_scalar(1.0 / b)
}
