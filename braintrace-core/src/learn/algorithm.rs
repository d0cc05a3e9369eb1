//! The online learning algorithms and their options: D-RTRL (traces of
//! parameter dimension) and ES-D-RTRL / pp_prop (traces of input and output
//! dimension), each with a single-step or multi-step VJP.

use crate::error::{Error, Result};

/// How the learning signal of a step is obtained (braintrace's `vjp_method`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VjpMethod {
    /// `∂L_t/∂h_t` by perturbing each hidden state where it is produced;
    /// the gradient is `solve(ε_t, ∂L_t/∂h_t)` (braintrace's default).
    #[default]
    SingleStep,
    /// The reverse-mode gradient through the step with respect to every
    /// parameter and the entering hidden state `h_{t-1}`; the gradient is the
    /// in-step gradient plus `solve(ε_{t-1}, ∂L_t/∂h_{t-1})`.
    MultiStep,
}

/// What single-step learners give parameters that have no relation to a
/// hidden state (a readout, the GRU's `Wr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NonTemporal {
    /// Exactly zero, as braintrace 0.2.6 does (which lists it as a known
    /// limitation): such parameters never learn. Set it explicitly to
    /// compare numbers with braintrace.
    Zero,
    /// Their in-step gradient `∂L_t/∂θ` with `h_{t-1}` held fixed (the
    /// default). For a readout this is its exact gradient; for a weight that
    /// reaches the hidden state only through another weight (the GRU's
    /// `Wr`) it is the instantaneous part of it. The default because a
    /// readout that never learns caps what the network can do (a vanilla
    /// RNN on a recall task: 85% with `Zero`, 100% with `InStep`).
    #[default]
    InStep,
}

/// D-RTRL: eligibility traces with the dimension of the parameters, the
/// hidden-to-hidden Jacobian kept diagonal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DRtrl {
    /// Single-step (default) or multi-step learning signal.
    pub vjp_method: VjpMethod,
    /// Gradient of parameters without relation in single-step mode.
    pub non_temporal: NonTemporal,
    /// Use the fused in-place trace kernels where a primitive has one (the
    /// dense, element-wise, sparse, LoRA and channel-first conv built-ins,
    /// see [`TraceKernel`](crate::etp::TraceKernel)); `false` runs every relation
    /// through its registered rules. Default `true`; same numbers either way.
    pub fast_paths: bool,
}

impl Default for DRtrl {
    fn default() -> Self {
        DRtrl {
            vjp_method: VjpMethod::SingleStep,
            non_temporal: NonTemporal::InStep,
            fast_paths: true,
        }
    }
}

impl DRtrl {
    /// With or without the fused trace kernels.
    pub fn fast_paths(mut self, on: bool) -> Self {
        self.fast_paths = on;
        self
    }
    /// With this VJP method.
    pub fn vjp_method(mut self, m: VjpMethod) -> Self {
        self.vjp_method = m;
        self
    }
    /// With this treatment of non-temporal parameters.
    pub fn non_temporal(mut self, n: NonTemporal) -> Self {
        self.non_temporal = n;
        self
    }
}

/// ES-D-RTRL / pp_prop: a decaying input trace `x̄` per relation input and a
/// decaying output trace `f̄` per relation and group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PpProp {
    /// Decay of the input trace `x̄`.
    pub decay_x: f64,
    /// Decay of the output trace `f̄`.
    pub decay_f: f64,
    /// Single-step (default) or multi-step learning signal.
    pub vjp_method: VjpMethod,
    /// Gradient of parameters without relation in single-step mode.
    pub non_temporal: NonTemporal,
    /// Accumulate the weight gradients of relations with a registered
    /// [`TraceKernel::Dense`](crate::etp::TraceKernel::Dense) kernel in the learner,
    /// as one matrix product per chunk of steps (`Σ_t x̄_tᵀ g_t` with the
    /// steps stacked along the batch axis) instead of one `xy_to_dw` per
    /// step (on by default; the same sums, added in another order).
    pub fast_paths: bool,
}

impl PpProp {
    /// One decay `α ∈ [0, 1)` for both traces (`decay_or_rank` as a float).
    pub fn new(decay: f64) -> Result<Self> {
        Self::decays(decay, decay)
    }
    /// The decay of a rank `r ≥ 1`: `α = (r − 1)/(r + 1)` (`decay_or_rank` as an int).
    pub fn rank(r: usize) -> Result<Self> {
        let a = rank_decay(r)?;
        Self::decays(a, a)
    }
    /// Separate decays for the input and output traces (`decay_or_rank` as a pair).
    pub fn decays(decay_x: f64, decay_f: f64) -> Result<Self> {
        for (name, d) in [("decay_x", decay_x), ("decay_f", decay_f)] {
            if !(0.0..1.0).contains(&d) {
                return Err(Error::invalid(
                    "PpProp",
                    format!("{name} must be in [0, 1), got {d}"),
                ));
            }
        }
        Ok(PpProp {
            decay_x,
            decay_f,
            vjp_method: VjpMethod::SingleStep,
            non_temporal: NonTemporal::InStep,
            fast_paths: true,
        })
    }
    /// With the fused weight-gradient accumulation on or off (see
    /// [`fast_paths`](Self::fast_paths)).
    pub fn fast_paths(mut self, on: bool) -> Self {
        self.fast_paths = on;
        self
    }
    /// With this VJP method.
    pub fn vjp_method(mut self, m: VjpMethod) -> Self {
        self.vjp_method = m;
        self
    }
    /// With this treatment of non-temporal parameters.
    pub fn non_temporal(mut self, n: NonTemporal) -> Self {
        self.non_temporal = n;
        self
    }
    /// The bias correction of call `n` (counted from 0): `max(1 − α_f^{n+1}, 1e−8)`
    /// for `n < 1000`, else 1 (as braintrace 0.2.6).
    pub fn correction(&self, n: usize) -> f64 {
        if n < 1000 {
            (1.0 - self.decay_f.powi(n as i32 + 1)).max(1e-8)
        } else {
            1.0
        }
    }
}

/// `α = (r − 1)/(r + 1)` for a rank `r ≥ 1`.
pub fn rank_decay(r: usize) -> Result<f64> {
    if r == 0 {
        return Err(Error::invalid(
            "PpProp::rank",
            "the rank must be at least 1",
        ));
    }
    Ok((r as f64 - 1.0) / (r as f64 + 1.0))
}

/// An online learning algorithm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    /// D-RTRL.
    DRtrl(DRtrl),
    /// ES-D-RTRL / pp_prop.
    PpProp(PpProp),
}

impl Algorithm {
    /// The VJP method.
    pub fn vjp_method(&self) -> VjpMethod {
        match self {
            Algorithm::DRtrl(a) => a.vjp_method,
            Algorithm::PpProp(a) => a.vjp_method,
        }
    }
    /// The treatment of non-temporal parameters.
    pub fn non_temporal(&self) -> NonTemporal {
        match self {
            Algorithm::DRtrl(a) => a.non_temporal,
            Algorithm::PpProp(a) => a.non_temporal,
        }
    }
    /// A short name (`d_rtrl`, `pp_prop`).
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::DRtrl(_) => "d_rtrl",
            Algorithm::PpProp(_) => "pp_prop",
        }
    }
}

impl From<DRtrl> for Algorithm {
    fn from(a: DRtrl) -> Self {
        Algorithm::DRtrl(a)
    }
}

impl From<PpProp> for Algorithm {
    fn from(a: PpProp) -> Self {
        Algorithm::PpProp(a)
    }
}

/// How `etrace_grad` reduces the per-step gradients over time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// Divide the sum by the number of steps (braintrace's default).
    #[default]
    Mean,
    /// The sum over steps.
    Sum,
}
