//! Three-factor learning (braintrace's `ThreeFactor`): D-RTRL's
//! per-parameter eligibility trace (the two local factors) contracted with
//! a third, global factor the caller supplies — a reward, a
//! neuromodulator — in place of `∂L/∂h`. The modulator *replaces* the
//! learning signal (it does not scale it): set it to `∂L/∂h` and the rule
//! is D-RTRL.
//!
//! Here the modulator is a scalar, broadcast to every hidden state of
//! every group (braintrace also accepts an array shaped like a group). It
//! is a standing value, read at every step of
//! [`etrace_grad`](crate::learn::Learner::etrace_grad) and changed between
//! calls with [`ThreeFactor::set_modulator`]; the step programs take it as
//! an input, so a new value stages nothing. Single-step only, as in
//! braintrace.

use super::algorithm::{
    Algorithm, Layout, Named, NonTemporal, OnlineAlgorithm, SolveIn, Solved, StepEval, TraceRule,
    TraceState, Update, VjpMethod,
};
use super::boilerplate::{algorithm_methods, delegate_trace_rule, option_builders};
use super::compiler::EtraceGraph;
use super::drtrl::DrtrlRule;
use super::state::ModelState;
use super::DRtrl;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Reward-modulated eligibility-trace learning (braintrace's `ThreeFactor`).
///
/// ```
/// use braintrace_core::learn::{Algorithm, ThreeFactor};
///
/// let tf = ThreeFactor::new(0.5)?;
/// let a: Algorithm = tf.clone().into();
/// assert_eq!(a.name(), "three_factor");
/// // The learner's copy shares the standing modulator.
/// a.get::<ThreeFactor>().unwrap().set_modulator(-1.0)?;
/// assert_eq!(tf.modulator(), -1.0);
/// assert!(tf.set_modulator(f64::NAN).is_err());
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone)]
pub struct ThreeFactor {
    /// The standing modulator (`f64` bits), shared by every clone.
    modulator: Arc<AtomicU64>,
    /// Gradient of parameters without relation (their in-step gradient of
    /// the loss by default; `Zero` as braintrace).
    pub non_temporal: NonTemporal,
    /// D-RTRL's fused trace kernels where a primitive has one.
    pub fast_paths: bool,
}

fn check(m: f64) -> Result<f64> {
    if !m.is_finite() {
        return Err(Error::invalid(
            "ThreeFactor",
            format!("modulator must be finite, got {m}"),
        ));
    }
    Ok(m)
}

impl ThreeFactor {
    /// With this standing modulator (finite).
    pub fn new(modulator: f64) -> Result<Self> {
        Ok(ThreeFactor {
            modulator: Arc::new(AtomicU64::new(check(modulator)?.to_bits())),
            non_temporal: NonTemporal::InStep,
            fast_paths: true,
        })
    }
    /// The standing modulator.
    pub fn modulator(&self) -> f64 {
        f64::from_bits(self.modulator.load(Ordering::Relaxed))
    }
    /// Set the standing modulator (for this configuration and every clone
    /// of it, the learner's included); an error when it is not finite,
    /// the old value kept.
    pub fn set_modulator(&self, m: f64) -> Result<()> {
        self.modulator
            .store(check(m)?.to_bits(), Ordering::Relaxed);
        Ok(())
    }
    option_builders! {
        non_temporal: NonTemporal, "With this treatment of non-temporal parameters.";
        fast_paths: bool, "With or without the fused trace kernels.";
    }
}

impl fmt::Debug for ThreeFactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreeFactor")
            .field("modulator", &self.modulator())
            .field("non_temporal", &self.non_temporal)
            .field("fast_paths", &self.fast_paths)
            .finish()
    }
}

impl PartialEq for ThreeFactor {
    /// The same options and the same (shared) modulator.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.modulator, &other.modulator)
            && self.non_temporal == other.non_temporal
            && self.fast_paths == other.fast_paths
    }
}

impl OnlineAlgorithm for ThreeFactor {
    algorithm_methods!(
        ThreeFactor,
        "three_factor",
        |_: &Self| VjpMethod::SingleStep,
        |s: &Self| s.non_temporal
    );
    fn plan(&self, eg: &Arc<EtraceGraph>, layout: &Layout) -> Result<Box<dyn TraceRule>> {
        let d = DRtrl {
            vjp_method: VjpMethod::SingleStep,
            non_temporal: self.non_temporal,
            fast_paths: self.fast_paths,
            ..DRtrl::default()
        };
        Ok(Box::new(ModulatedRule {
            inner: DrtrlRule::plan(&d, eg, layout)?,
            modulator: self.modulator.clone(),
        }))
    }
}

impl Named for ThreeFactor {
    const NAMES: &'static [&'static str] = &["three_factor"];
    /// A modulator of 1 until one is set.
    fn named() -> Self {
        ThreeFactor::new(1.0).expect("1 is finite")
    }
}

impl From<ThreeFactor> for Algorithm {
    fn from(a: ThreeFactor) -> Self {
        Algorithm::new(a)
    }
}

/// D-RTRL's rule with the learning signal replaced by the modulator,
/// which reaches the step program as its scalar input.
struct ModulatedRule {
    inner: DrtrlRule,
    modulator: Arc<AtomicU64>,
}

impl TraceRule for ModulatedRule {
    delegate_trace_rule!(inner: zeros, state, in_program, stacked, forward_extra, public);
    fn update(&self, step: &StepEval<'_>, traces: &[Tensor]) -> Result<Update> {
        self.inner.update(step, traces)
    }
    fn solve(&self, s: &SolveIn<'_>) -> Result<Solved> {
        let m = s.scalar.cast(s.signal.first().map_or(s.scalar.dtype(), Tensor::dtype))?;
        let signal: Vec<Tensor> = s
            .signal
            .iter()
            .map(|g| m.broadcast_to(g.shape()))
            .collect::<Result<_>>()?;
        self.inner.solve(&SolveIn {
            params: s.params,
            traces: s.traces,
            signal: &signal,
            scalar: s.scalar,
        })
    }
    fn scalar(&self, _n: usize) -> f64 {
        f64::from_bits(self.modulator.load(Ordering::Relaxed))
    }
    fn explain(&self) -> Vec<String> {
        let mut v = self.inner.explain();
        v.push("three-factor: the learning signal is the standing modulator".into());
        v
    }
}
