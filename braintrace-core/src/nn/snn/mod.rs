//! braintrace 0.2.6's spiking neurons and synapses (brainpy.state's
//! equations and defaults; braintrace forwards `nn.IF`, `nn.LIF`, … there):
//! the neurons [`If`], [`Lif`], [`Alif`]; the synapses [`Expon`], [`Alpha`],
//! [`DualExpon`]; the short-term plasticity [`Stp`] and [`Std`]; and
//! [`SpikeBitwise`], the logic of two spike trains.
//!
//! Every linear ODE is stepped as brainstate's exponential Euler steps it,
//! exactly: `x' = x + (1 − e^(−dt/τ))·(x∞ − x)`, written with decays so the
//! learning compiler sees element-wise relations. Hidden states are named as
//! brainpy.state names them (`V`, `a`, `g`, `h`, `g_rise`, `g_decay`, `u`,
//! `x`) under the layer's path. Constructors check sizes and time constants
//! and [`Model::init`](crate::learn::Model::init) checks every
//! hyperparameter again (fields are public), each with an
//! [`Error::Param`] naming the layer and the value.

mod bitwise;
mod neurons;
mod plasticity;
mod synapses;

pub use bitwise::{BitwiseOp, SpikeBitwise};
pub use neurons::{Alif, If, Lif};
pub use plasticity::{Std, Stp};
pub use synapses::{Alpha, DualExpon, Expon};

use crate::error::{Error, Result};

/// How a neuron's membrane potential is reset after a spike (brainpy.state's
/// `spk_reset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SpikeReset {
    /// Subtract the threshold distance: `V − (V_th − V_reset)·s`; the
    /// gradient flows through the spike.
    #[default]
    Soft,
    /// Set to `V_reset`: `V − (sg(V) − V_reset)·s` with `sg` the stop
    /// gradient, so only the spike's surrogate carries a gradient.
    Hard,
}

fn bad(layer: &str, param: &str, reason: String) -> Error {
    Error::Param {
        op: layer.to_string(),
        param: param.to_string(),
        reason,
    }
}

/// A layer of `n` units needs at least one.
pub(crate) fn check_size(layer: &str, n: usize) -> Result<()> {
    if n == 0 {
        return Err(bad(layer, "size", "must be at least 1, got 0".into()));
    }
    Ok(())
}

/// A time constant or step: finite and positive.
pub(crate) fn check_time(layer: &str, param: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        return Err(bad(
            layer,
            param,
            format!("a time constant must be finite and positive, got {v}"),
        ));
    }
    Ok(())
}

/// Any finite value.
pub(crate) fn check_finite(layer: &str, param: &str, v: f64) -> Result<()> {
    if !v.is_finite() {
        return Err(bad(layer, param, format!("must be finite, got {v}")));
    }
    Ok(())
}

/// A fraction in `[0, 1]` (a release probability).
pub(crate) fn check_fraction(layer: &str, param: &str, v: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&v) {
        return Err(bad(layer, param, format!("must lie in [0, 1], got {v}")));
    }
    Ok(())
}

/// A threshold above the reset potential (the spike's scale
/// `V_th − V_reset` divides).
pub(crate) fn check_threshold(layer: &str, v_th: f64, v_reset: f64) -> Result<()> {
    check_finite(layer, "V_th", v_th)?;
    check_finite(layer, "V_reset", v_reset)?;
    if v_th <= v_reset {
        return Err(bad(
            layer,
            "V_th",
            format!("must lie above V_reset = {v_reset}, got {v_th}"),
        ));
    }
    Ok(())
}

/// The decay of one exponential-Euler step, `exp(−dt/τ)`.
pub(crate) fn decay(dt: f64, tau: f64) -> f64 {
    (-dt / tau).exp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::ModelState;
    use crate::tensor::DType;

    fn param_error(r: Result<impl std::fmt::Debug>, layer: &str, param: &str) {
        match r {
            Err(Error::Param { op, param: p, .. }) => {
                assert_eq!((op.as_str(), p.as_str()), (layer, param))
            }
            other => panic!("expected a parameter error of {layer}.{param}, got {other:?}"),
        }
    }

    #[test]
    fn constructors_name_the_layer_and_the_bad_value() {
        param_error(Lif::new("l", 0, 5.0, 1.0), "Lif", "size");
        param_error(Lif::new("l", 3, -5.0, 1.0), "Lif", "tau");
        param_error(Lif::new("l", 3, 5.0, f64::NAN), "Lif", "dt");
        param_error(If::new("i", 3, 0.0, 1.0), "If", "tau");
        param_error(Alif::new("a", 3, 5.0, -1.0, 1.0), "Alif", "tau_a");
        param_error(Expon::new("e", 0, 5.0, 1.0), "Expon", "size");
        param_error(Alpha::new("e", 2, -1.0, 1.0), "Alpha", "tau");
        param_error(
            DualExpon::new("d", 2, 3.0, 3.0, 1.0),
            "DualExpon",
            "tau_rise",
        );
        param_error(Std::new("s", 2, 10.0, 1.5, 1.0), "Std", "U");
        param_error(Stp::new("s", 2, -0.1, 10.0, 10.0, 1.0), "Stp", "U");
        param_error(Stp::new("s", 2, 0.1, 10.0, -3.0, 1.0), "Stp", "tau_d");
        param_error(BitwiseOp::from_name("nand"), "SpikeBitwise", "op");
        // Fields set after construction are checked by `init`.
        let bad = Lif::new("l", 3, 5.0, 1.0).unwrap().with_threshold(0.0, 0.5);
        param_error(ModelState::new(&bad, DType::F64, 0, None), "Lif", "V_th");
        let bad = If::new("i", 3, 5.0, 1.0)
            .unwrap()
            .with_surrogate(crate::ops::Surrogate::Erf { alpha: -1.0 });
        param_error(ModelState::new(&bad, DType::F64, 0, None), "If", "alpha");
    }

    #[test]
    fn plasticity_resources_start_full_on_every_reset() {
        let stp = Stp::new("stp", 3, 0.2, 10.0, 5.0, 1.0).unwrap();
        let mut st = ModelState::new(&stp, DType::F32, 0, Some(2)).unwrap();
        for _ in 0..2 {
            let h = st.hidden();
            assert_eq!(h["stp/x"].to_vec_f64().unwrap(), vec![1.0; 6]);
            let u = h["stp/u"].to_vec_f64().unwrap();
            assert!(u.iter().all(|v| (v - 0.2).abs() < 1e-7), "{u:?}");
            assert_eq!(h["stp/x"].dtype(), DType::F32);
            st.reset_hidden(Some(2)).unwrap();
        }
    }

    #[test]
    fn layers_step_as_their_equations_written_out() {
        // One eager step of each layer against its equations in plain f64.
        use crate::tensor::Tensor;
        let x = Tensor::from_vec(vec![0.3, 1.4, -0.6], &[3]).unwrap();
        let xv = x.to_vec_f64().unwrap();
        let run = |m: &dyn crate::learn::Model, h: &[(&str, Vec<f64>)], x: &Tensor| {
            let mut st = ModelState::new(m, DType::F64, 0, None).unwrap();
            for (k, v) in h {
                st.set_hidden(k, &Tensor::from_vec(v.clone(), &[3]).unwrap())
                    .unwrap();
            }
            let out = st.advance(m, x).unwrap().to_vec_f64().unwrap();
            (out, st.hidden())
        };
        // LIF, hard reset: V = [1.2 (spikes), 0.5, -0.3].
        let lif = Lif::new("n", 3, 4.0, 1.0)
            .unwrap()
            .with_threshold(1.0, -0.5)
            .with_rest(0.1)
            .with_resistance(2.0)
            .with_reset(SpikeReset::Hard);
        let v0 = [1.2, 0.5, -0.3];
        let (out, h) = run(&lif, &[("n/V", v0.to_vec())], &x);
        let e = (-0.25f64).exp();
        for i in 0..3 {
            let s = if v0[i] > 1.0 { 1.0 } else { 0.0 };
            let v1 = v0[i] - (v0[i] + 0.5) * s;
            let v = v1 + (1.0 - e) * (0.1 + 2.0 * xv[i] - v1);
            assert!((h["n/V"].to_vec_f64().unwrap()[i] - v).abs() < 1e-14);
            assert_eq!(out[i], if v > 1.0 { 1.0 } else { 0.0 });
        }
        // Alpha synapse.
        let a = Alpha::new("s", 3, 3.0, 1.0).unwrap();
        let (g0, h0) = ([0.2, -0.1, 0.7], [1.0, 0.4, -0.2]);
        let (out, h) = run(&a, &[("s/g", g0.to_vec()), ("s/h", h0.to_vec())], &x);
        let e = (-1.0f64 / 3.0).exp();
        for i in 0..3 {
            let g = g0[i] + (1.0 - e) * (h0[i] - g0[i]);
            assert!((out[i] - g).abs() < 1e-14);
            let hh = e * h0[i] + xv[i];
            assert!((h["s/h"].to_vec_f64().unwrap()[i] - hh).abs() < 1e-14);
        }
        // STD on spikes [1, 0, 1].
        let sp = Tensor::from_vec(vec![1.0, 0.0, 1.0], &[3]).unwrap();
        let d = Std::new("d", 3, 10.0, 0.3, 1.0).unwrap();
        let x0 = [0.9, 0.5, 0.2];
        let (out, h) = run(&d, &[("d/x", x0.to_vec())], &sp);
        let e = (-0.1f64).exp();
        for (i, s) in [1.0, 0.0, 1.0].iter().enumerate() {
            let x1 = x0[i] + (1.0 - e) * (1.0 - x0[i]);
            assert!((out[i] - x1 * s).abs() < 1e-14);
            let xn = x1 - 0.3 * x0[i] * s;
            assert!((h["d/x"].to_vec_f64().unwrap()[i] - xn).abs() < 1e-14);
        }
    }
}
