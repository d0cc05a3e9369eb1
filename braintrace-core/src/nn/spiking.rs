//! Spiking layers: an exponential synapse and a current-based LIF cell with
//! recurrent spikes, soft reset and a surrogate spike gradient.

use super::layers::{cat_last, check_features, decay_open, layer_op, size_at_least_one, Linear};
use super::snn::SpikeReset;
use crate::error::Error;
use crate::error::Result;
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::ops::Surrogate;
use crate::tensor::Tensor;

/// An exponential synapse: `g' = exp(−dt/τ)·g + input`; hidden `<path>/g`.
#[derive(Clone, Debug)]
pub struct ExpSynapse {
    /// The synapse's path.
    pub path: String,
    /// Number of units.
    pub n: usize,
    /// Decay per step.
    pub decay: f64,
}

impl ExpSynapse {
    /// A synapse of `n` units with time constant `tau` and step `dt`.
    pub fn new(path: &str, n: usize, tau: f64, dt: f64) -> Self {
        ExpSynapse {
            path: path.to_string(),
            n,
            decay: (-dt / tau).exp(),
        }
    }
    /// The hidden state's path (`<path>/g`).
    pub fn hidden_path(&self) -> String {
        join_path(&self.path, "g")
    }
}

impl Model for ExpSynapse {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("ExpSynapse", &self.path);
        size_at_least_one(&op, "n", self.n)?;
        decay_open(&op, "decay", self.decay)?;
        init.hidden(&self.hidden_path(), &[self.n])
    }
    fn step(&self, ctx: &mut StepCtx, input: &Tensor) -> Result<Tensor> {
        let g = ctx.hidden(&self.hidden_path())?;
        let g_new = g.mul_scalar(self.decay)?.add(input)?;
        ctx.set_hidden(&self.hidden_path(), g_new.clone())?;
        Ok(g_new)
    }
}

/// A current-based LIF cell with recurrent spikes and soft reset (the golden
/// `lif` model):
///
/// ```text
/// s  = S(v − v_th)                      (previous spikes)
/// i' = γ·i + [x, s] @ W + b             (Linear `<path>/rec`)
/// v' = β·(v − v_th·s) + i'              (soft reset; hard: β·(v − sg(v)·s) + i')
/// out = S(v' − v_th)
/// ```
///
/// Hidden states `<path>/i` and `<path>/v` (one group of two states).
#[derive(Clone, Debug)]
pub struct LifCell {
    /// The cell's path (may be empty).
    pub path: String,
    /// The recurrent input layer over `[x, s]`.
    pub rec: Linear,
    /// Number of neurons.
    pub n_rec: usize,
    /// Membrane decay β.
    pub beta: f64,
    /// Current decay γ.
    pub gamma: f64,
    /// Threshold.
    pub v_th: f64,
    /// The spike's surrogate derivative (default: braintrace's arctan,
    /// `1 / (1 + (πu)²)`).
    pub surrogate: Surrogate,
    /// braintrace's reset modes: soft (subtract `v_th`, the default) or
    /// hard (to 0, the gradient through the spike only).
    pub reset: SpikeReset,
}

impl LifCell {
    /// A cell with `n_in` inputs and `n_rec` neurons.
    pub fn new(path: &str, n_in: usize, n_rec: usize, beta: f64, gamma: f64, v_th: f64) -> Self {
        LifCell {
            path: path.to_string(),
            rec: Linear::new(&join_path(path, "rec"), n_in.saturating_add(n_rec), n_rec),
            n_rec,
            beta,
            gamma,
            v_th,
            surrogate: Surrogate::default(),
            reset: SpikeReset::Soft,
        }
    }
    /// The current's path.
    pub fn current_path(&self) -> String {
        join_path(&self.path, "i")
    }
    /// The membrane potential's path.
    pub fn voltage_path(&self) -> String {
        join_path(&self.path, "v")
    }
}

impl Model for LifCell {
    fn init(&self, init: &mut Init) -> Result<()> {
        let op = layer_op("LifCell", &self.path);
        size_at_least_one(&op, "n_rec", self.n_rec)?;
        // β = 1 (no leak, an integrate-and-fire neuron) and γ = 0 (a
        // current that lasts one step) are models too; outside [0, 1] the
        // state grows without bound or flips sign every step.
        for (name, d) in [("beta", self.beta), ("gamma", self.gamma)] {
            if !(0.0..=1.0).contains(&d) {
                return Err(Error::invalid(
                    &op,
                    format!("the decay {name} must be in [0, 1], got {d}"),
                ));
            }
        }
        if !self.v_th.is_finite() {
            return Err(Error::invalid(
                &op,
                format!("the threshold v_th must be finite, got {}", self.v_th),
            ));
        }
        self.rec.init(init)?;
        init.hidden(&self.current_path(), &[self.n_rec])?;
        init.hidden(&self.voltage_path(), &[self.n_rec])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let n_in = self.rec.n_in.saturating_sub(self.n_rec);
        check_features(&layer_op("LifCell", &self.path), x, n_in)?;
        let i = ctx.hidden(&self.current_path())?;
        let v = ctx.hidden(&self.voltage_path())?;
        let s = v.sub_scalar(self.v_th)?.spike(self.surrogate)?;
        let y = self.rec.step(ctx, &cat_last(x, &s)?)?;
        let i_new = i.mul_scalar(self.gamma)?.add(&y)?;
        let drop = match self.reset {
            SpikeReset::Soft => s.mul_scalar(self.v_th)?,
            SpikeReset::Hard => v.stop_gradient()?.mul(&s)?,
        };
        let v_new = v.sub(&drop)?.mul_scalar(self.beta)?.add(&i_new)?;
        ctx.set_hidden(&self.current_path(), i_new)?;
        ctx.set_hidden(&self.voltage_path(), v_new.clone())?;
        v_new.sub_scalar(self.v_th)?.spike(self.surrogate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::ModelState;
    use crate::tensor::DType;

    #[test]
    fn hard_reset_sets_spiking_membranes_to_zero() {
        // One step from v = [1.5 (spikes), 0.4] with zero weights: soft
        // gives β(v − v_th s), hard β(v − v s) = β·0 where it spiked.
        for (reset, want) in [
            (SpikeReset::Soft, [0.8 * 0.5, 0.8 * 0.4]),
            (SpikeReset::Hard, [0.0, 0.8 * 0.4]),
        ] {
            let mut cell = LifCell::new("", 1, 2, 0.8, 0.6, 1.0);
            cell.reset = reset;
            let mut st = ModelState::new(&cell, DType::F64, 0, None).unwrap();
            st.set_param(&cell.rec.weight_key(), &Tensor::zeros(&[3, 2], DType::F64))
                .unwrap();
            st.set_hidden("v", &Tensor::from_vec(vec![1.5, 0.4], &[2]).unwrap())
                .unwrap();
            st.advance(&cell, &Tensor::zeros(&[1], DType::F64)).unwrap();
            let v = st.hidden()["v"].to_vec_f64().unwrap();
            assert!(
                (v[0] - want[0]).abs() < 1e-15 && (v[1] - want[1]).abs() < 1e-15,
                "{reset:?}: {v:?}"
            );
        }
    }
}
