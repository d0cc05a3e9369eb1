//! The spiking networks of the zoo golden cases (`tests/golden_snn`,
//! `scripts/golden_gen/generate_zoo_snn.py`), built from the case's
//! hyperparameters with the `nn::snn` layers:
//!
//! ```text
//! s_prev = neuron's spikes of its current V
//! i = syn_in([x, s_prev]);  i = synapse(i) (if any);  s = neuron(i)
//! s = plasticity(bitwise(s, s_prev)) (if any);  out = readout(s)
//! ```

use braintrace::learn::{Init, Model, StepCtx};
use braintrace::nn::{
    Alif, Alpha, BitwiseOp, DualExpon, Expon, If, LeakyRateReadout, Lif, Linear, SpikeBitwise,
    SpikeReset, Std, Stp,
};
use braintrace::{Result, Surrogate, Tensor};
use serde_json::{Map, Value};

type R<T> = std::result::Result<T, String>;

/// braintools' surrogate class `name` with `params` (its keyword arguments).
pub fn surrogate_from_braintools(name: &str, params: &Map<String, Value>) -> R<Surrogate> {
    let p = |k: &str| -> R<f64> {
        params
            .get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("surrogate {name}: parameter `{k}` missing"))
    };
    Ok(match name {
        "Sigmoid" => Surrogate::Sigmoid { alpha: p("alpha")? },
        "Arctan" => Surrogate::Arctan { alpha: p("alpha")? },
        "ReluGrad" => Surrogate::ReluGrad {
            alpha: p("alpha")?,
            width: p("width")?,
        },
        "PiecewiseQuadratic" => Surrogate::PiecewiseQuadratic { alpha: p("alpha")? },
        "PiecewiseExp" => Surrogate::PiecewiseExp { alpha: p("alpha")? },
        "SoftSign" => Surrogate::SoftSign { alpha: p("alpha")? },
        "ERF" => Surrogate::Erf { alpha: p("alpha")? },
        "GaussianGrad" => Surrogate::Gaussian {
            sigma: p("sigma")?,
            alpha: p("alpha")?,
        },
        "MultiGaussianGrad" => Surrogate::MultiGaussian {
            h: p("h")?,
            s: p("s")?,
            sigma: p("sigma")?,
            scale: p("scale")?,
        },
        "InvSquareGrad" => Surrogate::InvSquare { alpha: p("alpha")? },
        "SlayerGrad" => Surrogate::Slayer { alpha: p("alpha")? },
        "LeakyRelu" => Surrogate::LeakyRelu {
            alpha: p("alpha")?,
            beta: p("beta")?,
        },
        "QPseudoSpike" => Surrogate::QPseudoSpike { alpha: p("alpha")? },
        other => return Err(format!("unknown braintools surrogate `{other}`")),
    })
}

pub enum Neuron {
    If(If),
    Lif(Lif),
    Alif(Alif),
}

pub enum Synapse {
    None,
    Expon(Expon),
    Alpha(Alpha),
    DualExpon(DualExpon),
}

pub enum Plasticity {
    None,
    Std(Std),
    Stp(Stp),
}

pub struct SnnNet {
    pub syn_in: Linear,
    pub syn: Synapse,
    pub neu: Neuron,
    pub plasticity: Plasticity,
    pub bitwise: SpikeBitwise,
    pub readout: LeakyRateReadout,
}

/// Every hyperparameter key a zoo case may carry.
pub const HP_KEYS: &[&str] = &[
    "neuron",
    "synapse",
    "plasticity",
    "R",
    "tau",
    "tau_a",
    "V_th",
    "V_reset",
    "V_rest",
    "beta",
    "reset",
    "surrogate",
    "surrogate_params",
    "tau_syn",
    "tau_decay",
    "tau_rise",
    "amplitude",
    "tau_std",
    "tau_f",
    "tau_d",
    "U",
    "bitwise",
    "tau_out",
    "dt",
    "readout_decay",
];

impl SnnNet {
    /// The network of a case's hyperparameters.
    pub fn from_hp(hp: &Map<String, Value>, n_in: usize, n_rec: usize, n_out: usize) -> R<Self> {
        let s = |k: &str| -> R<&str> {
            hp.get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| format!("hyperparams: `{k}` missing"))
        };
        let f = |k: &str| -> R<f64> {
            hp.get(k)
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("hyperparams: `{k}` missing"))
        };
        let e = |e: braintrace::Error| e.to_string();
        let dt = f("dt")?;
        let surrogate = surrogate_from_braintools(
            s("surrogate")?,
            hp.get("surrogate_params")
                .and_then(Value::as_object)
                .ok_or("hyperparams: surrogate_params")?,
        )?;
        let reset = match s("reset")? {
            "soft" => SpikeReset::Soft,
            "hard" => SpikeReset::Hard,
            other => return Err(format!("unknown reset {other}")),
        };
        let lif = |v_reset: f64, v_rest: f64| -> R<Lif> {
            Ok(Lif::new("neu", n_rec, f("tau")?, dt)
                .map_err(e)?
                .with_resistance(f("R")?)
                .with_threshold(f("V_th")?, v_reset)
                .with_rest(v_rest)
                .with_surrogate(surrogate)
                .with_reset(reset))
        };
        let neu = match s("neuron")? {
            "IF" => Neuron::If(If(lif(0.0, 0.0)?)),
            "LIF" => Neuron::Lif(lif(f("V_reset")?, f("V_rest")?)?),
            "ALIF" => Neuron::Alif(Alif {
                lif: lif(f("V_reset")?, f("V_rest")?)?,
                tau_a: f("tau_a")?,
                beta: f("beta")?,
            }),
            other => return Err(format!("unknown neuron {other}")),
        };
        let syn = match s("synapse")? {
            "none" => Synapse::None,
            "Expon" => Synapse::Expon(Expon::new("syn", n_rec, f("tau_syn")?, dt).map_err(e)?),
            "Alpha" => Synapse::Alpha(Alpha::new("syn", n_rec, f("tau_syn")?, dt).map_err(e)?),
            "DualExpon" => Synapse::DualExpon(
                DualExpon::new("syn", n_rec, f("tau_decay")?, f("tau_rise")?, dt)
                    .map_err(e)?
                    .with_amplitude(f("amplitude")?),
            ),
            other => return Err(format!("unknown synapse {other}")),
        };
        let plasticity = match s("plasticity")? {
            "none" => Plasticity::None,
            "STD" => {
                Plasticity::Std(Std::new("std", n_rec, f("tau_std")?, f("U")?, dt).map_err(e)?)
            }
            "STP" => Plasticity::Stp(
                Stp::new("stp", n_rec, f("U")?, f("tau_f")?, f("tau_d")?, dt).map_err(e)?,
            ),
            other => return Err(format!("unknown plasticity {other}")),
        };
        let bitwise = match hp.get("bitwise").and_then(Value::as_str) {
            Some(op) => SpikeBitwise::new(BitwiseOp::from_name(op).map_err(e)?),
            None => SpikeBitwise::default(),
        };
        let mut readout = LeakyRateReadout::new("readout", n_rec, n_out, 1.0, 1.0);
        readout.decay = f("readout_decay")?;
        Ok(SnnNet {
            syn_in: Linear::new("syn_in", n_in + n_rec, n_rec),
            syn,
            neu,
            plasticity,
            bitwise,
            readout,
        })
    }
}

impl Model for SnnNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.syn_in.init(init)?;
        // In the order the step reads them (the neuron's spikes come first):
        // a hidden group lists its states in declaration order.
        match &self.neu {
            Neuron::If(m) => m.init(init)?,
            Neuron::Lif(m) => m.init(init)?,
            Neuron::Alif(m) => m.init(init)?,
        }
        match &self.syn {
            Synapse::None => {}
            Synapse::Expon(m) => m.init(init)?,
            Synapse::Alpha(m) => m.init(init)?,
            Synapse::DualExpon(m) => m.init(init)?,
        }
        match &self.plasticity {
            Plasticity::None => {}
            Plasticity::Std(m) => m.init(init)?,
            Plasticity::Stp(m) => m.init(init)?,
        }
        self.readout.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let s_prev = match &self.neu {
            Neuron::If(m) => m.spikes(ctx)?,
            Neuron::Lif(m) => m.spikes(ctx)?,
            Neuron::Alif(m) => m.spikes(ctx)?,
        };
        let xs = braintrace::concat(&[x.clone(), s_prev.clone()], x.ndim() - 1)?;
        let mut i = self.syn_in.step(ctx, &xs)?;
        i = match &self.syn {
            Synapse::None => i,
            Synapse::Expon(m) => m.step(ctx, &i)?,
            Synapse::Alpha(m) => m.step(ctx, &i)?,
            Synapse::DualExpon(m) => m.step(ctx, &i)?,
        };
        let mut s = match &self.neu {
            Neuron::If(m) => m.step(ctx, &i)?,
            Neuron::Lif(m) => m.step(ctx, &i)?,
            Neuron::Alif(m) => m.step(ctx, &i)?,
        };
        s = match &self.plasticity {
            Plasticity::None => s,
            Plasticity::Std(m) => m.step(ctx, &self.bitwise.apply(&s, &s_prev)?)?,
            Plasticity::Stp(m) => m.step(ctx, &self.bitwise.apply(&s, &s_prev)?)?,
        };
        self.readout.step(ctx, &s)
    }
}
