//! An algorithm by its axes ([`EtraceConfig`], braintrace's
//! `ETraceConfig`): an online rule as a point in a space of independent
//! choices — how the trace is stored, how much of the hidden-to-hidden
//! Jacobian it keeps, where the learning signal comes from, whether the
//! trace is filtered — checked as braintrace checks it and mapped to the
//! algorithm braintrace's `compile(model, config)` runs for it.

use super::algorithm::Algorithm;
use super::{DRtrl, EProp, Feedback, OstlRecurrent, PpProp, SnAp, ThreeFactor};
use crate::error::{Error, Result};

/// How the eligibility trace is stored (braintrace's `trace_factorization`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum TraceFactorization {
    /// One trace per parameter element (D-RTRL's engine), `O(P·H)`.
    #[default]
    PerParam,
    /// An input and an output factor (pp_prop's engine), `O(I + O)`; needs
    /// [`EtraceConfig::decay`].
    IoFactorized,
    /// A rank-1 random projection (UORO's estimator).
    RandomProjection,
}

/// How much hidden-to-hidden coupling the Jacobian `D` keeps
/// (braintrace's `recurrence_scope`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum RecurrenceScope {
    /// Each state's own recurrence, recurrent weight operations cut.
    #[default]
    Diagonal,
    /// The per-position block of the whole step's Jacobian (OSTL).
    Coupled,
    /// SnAp-n's `n`-step neighbourhood (`n = 1` is [`Coupled`](Self::Coupled)).
    SparseN(usize),
}

/// Where the learning signal comes from (braintrace's `learning_signal`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum LearningSignal {
    /// The true `∂L/∂h`.
    #[default]
    Symmetric,
    /// Its direction through fixed random matrices drawn with `seed`.
    RandomFeedback {
        /// The seed of the draws.
        seed: u64,
    },
    /// A caller-supplied modulator ([`ThreeFactor`]).
    Modulatory,
    /// A learned estimate of the future gradient (DNI).
    Bootstrapped,
}

/// An online learning rule by its axes (braintrace's `ETraceConfig`, with
/// its `temporal_recursion` fixed to the Jacobian and its `update_schedule`
/// to every step, the coordinates braintrace 0.2.6 implements presets
/// for).
///
/// ```
/// use braintrace_core::learn::{EtraceConfig, RecurrenceScope, TraceFactorization};
///
/// assert_eq!(EtraceConfig::default().algorithm()?.name(), "d_rtrl");
/// let pp = EtraceConfig { trace_factorization: TraceFactorization::IoFactorized,
///                         decay: Some((0.9, 0.9)), ..Default::default() };
/// assert_eq!(pp.algorithm()?.name(), "pp_prop");
/// let ostl = EtraceConfig { recurrence_scope: RecurrenceScope::Coupled, ..Default::default() };
/// assert_eq!(ostl.algorithm()?.name(), "ostl_recurrent");
/// let eprop = EtraceConfig { kappa: Some(0.5), ..Default::default() };
/// assert_eq!(eprop.algorithm()?.name(), "eprop");
/// let snap = EtraceConfig { recurrence_scope: RecurrenceScope::SparseN(2), ..Default::default() };
/// assert_eq!(snap.algorithm()?.name(), "snap");
/// // A coefficient outside its range, or without its axis, is an error.
/// assert!(EtraceConfig { kappa: Some(1.5), ..Default::default() }.algorithm().is_err());
/// assert!(EtraceConfig { decay: Some((0.9, 0.9)), ..Default::default() }.algorithm().is_err());
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EtraceConfig {
    /// How the trace is stored.
    pub trace_factorization: TraceFactorization,
    /// How much of the Jacobian it keeps.
    pub recurrence_scope: RecurrenceScope,
    /// Where the learning signal comes from.
    pub learning_signal: LearningSignal,
    /// e-prop's filter `ē ← κ ē + e` (`trace_filter='kappa'`), `κ ∈ [0, 1)`;
    /// `Some(0.0)` is no filter.
    pub kappa: Option<f64>,
    /// The input- and output-side decays of
    /// [`IoFactorized`](TraceFactorization::IoFactorized), each in `[0, 1)`.
    pub decay: Option<(f64, f64)>,
}

fn bad(reason: String) -> Error {
    Error::invalid("EtraceConfig", reason)
}

fn decay_in_range(what: &str, d: f64) -> Result<f64> {
    if !(0.0..1.0).contains(&d) {
        return Err(bad(format!("{what} must be in [0, 1), got {d}")));
    }
    Ok(d)
}

impl EtraceConfig {
    /// The configuration with equivalent spellings collapsed (κ = 0 is no
    /// filter, SnAp-1 is the coupled scope), checked as braintrace checks it.
    pub fn canonical(&self) -> Result<Self> {
        let mut c = *self;
        if let Some(k) = c.kappa {
            decay_in_range("kappa", k)?;
            if k == 0.0 {
                c.kappa = None;
            }
        }
        match c.recurrence_scope {
            RecurrenceScope::SparseN(0) => {
                return Err(bad("sparse_n must be at least 1, got 0".into()));
            }
            RecurrenceScope::SparseN(1) => c.recurrence_scope = RecurrenceScope::Coupled,
            _ => {}
        }
        let io = c.trace_factorization == TraceFactorization::IoFactorized;
        match (io, c.decay) {
            (true, None) => {
                return Err(bad(
                    "trace_factorization IoFactorized is defined by its decays: decay is required"
                        .into(),
                ))
            }
            (false, Some(d)) => {
                return Err(bad(format!(
                    "decay {d:?} is set but trace_factorization is {:?}, which has no decay",
                    c.trace_factorization
                )))
            }
            (true, Some((x, f))) => {
                decay_in_range("decay (x side)", x)?;
                decay_in_range("decay (f side)", f)?;
            }
            (false, None) => {}
        }
        if c.kappa.is_some() && c.trace_factorization != TraceFactorization::PerParam {
            return Err(bad(format!(
                "the kappa filter needs trace_factorization PerParam, not {:?}: a factorised trace cannot hold the filtered sum",
                c.trace_factorization
            )));
        }
        if matches!(c.recurrence_scope, RecurrenceScope::SparseN(_))
            && c.trace_factorization != TraceFactorization::PerParam
        {
            return Err(bad(
                "recurrence_scope SparseN needs trace_factorization PerParam".into(),
            ));
        }
        if c.trace_factorization == TraceFactorization::RandomProjection
            && c.recurrence_scope != RecurrenceScope::Coupled
        {
            return Err(bad(format!(
                "trace_factorization RandomProjection needs recurrence_scope Coupled, not {:?}",
                c.recurrence_scope
            )));
        }
        Ok(c)
    }

    /// The algorithm braintrace runs for this coordinate, with its
    /// options; an error when the configuration is illegal, or legal but
    /// implemented by no algorithm of this build (the error says which).
    pub fn algorithm(&self) -> Result<Algorithm> {
        use LearningSignal as L;
        use RecurrenceScope as S;
        use TraceFactorization as F;
        let c = self.canonical()?;
        let feedback = match c.learning_signal {
            L::RandomFeedback { seed } => Some(Feedback::Random { seed }),
            _ => None,
        };
        Ok(match (c.trace_factorization, c.recurrence_scope, c.learning_signal) {
            (F::PerParam, S::Diagonal, L::Symmetric) if c.kappa.is_none() => {
                DRtrl::default().into()
            }
            (F::PerParam, S::Diagonal, L::Symmetric | L::RandomFeedback { .. }) => {
                EProp::new()
                    .kappa(c.kappa.unwrap_or(0.0))?
                    .feedback(feedback.unwrap_or_default())
                    .into()
            }
            (F::PerParam, S::Coupled, L::Symmetric) if c.kappa.is_none() => {
                OstlRecurrent::default().into()
            }
            (F::PerParam, S::Diagonal, L::Modulatory) if c.kappa.is_none() => {
                ThreeFactor::new(1.0)?.into()
            }
            (F::IoFactorized, S::Diagonal, L::Symmetric) => {
                let (x, f) = c.decay.expect("checked by canonical");
                PpProp::decays(x, f)?.into()
            }
            (F::RandomProjection, _, L::Symmetric) => Algorithm::by_name("random_projection")?,
            // braintrace runs this coordinate as its `SnAp(n)` preset does
            // (`SnAp` builds exactly this config); n = 1 became `Coupled` above.
            (F::PerParam, S::SparseN(n), L::Symmetric) if c.kappa.is_none() => {
                if n > 2 {
                    return Err(bad(format!(
                        "recurrence_scope SparseN({n}): this build's SnAp implements the orders 1 and 2 only"
                    )));
                }
                SnAp::new(n)?.into()
            }
            (F::PerParam, S::SparseN(_), _) | (F::PerParam, _, L::Bootstrapped) => {
                return Err(bad(format!(
                    "{c:?} is legal but no algorithm of this build implements it (SnAp takes no filter or feedback; DNI needs its options: configure it directly)"
                )))
            }
            _ => {
                return Err(bad(format!(
                    "{c:?} is legal but no algorithm of this build implements it"
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_map_as_braintrace() {
        let d = EtraceConfig::default();
        assert_eq!(d.algorithm().unwrap(), DRtrl::default().into());
        // κ = 0 collapses onto D-RTRL (braintrace's EProp(kappa=0)).
        let k0 = EtraceConfig {
            kappa: Some(0.0),
            ..d
        };
        assert_eq!(k0.algorithm().unwrap().name(), "d_rtrl");
        let rf = EtraceConfig {
            learning_signal: LearningSignal::RandomFeedback { seed: 3 },
            kappa: Some(0.25),
            ..d
        };
        let a = rf.algorithm().unwrap();
        let e = a.get::<EProp>().unwrap();
        assert_eq!(
            (e.kappa, &e.feedback),
            (0.25, &Feedback::Random { seed: 3 })
        );
        let snap1 = EtraceConfig {
            recurrence_scope: RecurrenceScope::SparseN(1),
            ..d
        };
        assert_eq!(snap1.algorithm().unwrap().name(), "ostl_recurrent");
        // sparse_n = 2 is braintrace's `SnAp(n=2)` (whose constructor builds
        // exactly this config), with SnAp's defaults.
        let snap2 = EtraceConfig {
            recurrence_scope: RecurrenceScope::SparseN(2),
            ..d
        };
        assert_eq!(snap2.algorithm().unwrap(), SnAp::new(2).unwrap().into());
        assert_ne!(snap2.algorithm().unwrap(), SnAp::new(1).unwrap().into());
        let m = EtraceConfig {
            learning_signal: LearningSignal::Modulatory,
            ..d
        };
        assert_eq!(m.algorithm().unwrap().name(), "three_factor");
        let io = EtraceConfig {
            trace_factorization: TraceFactorization::IoFactorized,
            decay: Some((0.5, 0.75)),
            ..d
        };
        let p = io.algorithm().unwrap();
        let p = p.get::<PpProp>().unwrap();
        assert_eq!((p.decay_x, p.decay_f), (0.5, 0.75));
    }

    #[test]
    fn illegal_coordinates_are_errors() {
        let d = EtraceConfig::default();
        let cases = [
            EtraceConfig {
                kappa: Some(1.0),
                ..d
            },
            EtraceConfig {
                kappa: Some(-0.1),
                ..d
            },
            EtraceConfig {
                decay: Some((0.5, 0.5)),
                ..d
            },
            EtraceConfig {
                trace_factorization: TraceFactorization::IoFactorized,
                ..d
            },
            EtraceConfig {
                trace_factorization: TraceFactorization::IoFactorized,
                decay: Some((0.5, 1.5)),
                ..d
            },
            EtraceConfig {
                trace_factorization: TraceFactorization::IoFactorized,
                decay: Some((0.5, 0.5)),
                kappa: Some(0.5),
                ..d
            },
            EtraceConfig {
                trace_factorization: TraceFactorization::RandomProjection,
                ..d
            },
            EtraceConfig {
                recurrence_scope: RecurrenceScope::SparseN(0),
                ..d
            },
            // legal in braintrace, but beyond this build's SnAp, or SnAp
            // with e-prop's filter
            EtraceConfig {
                recurrence_scope: RecurrenceScope::SparseN(3),
                ..d
            },
            EtraceConfig {
                recurrence_scope: RecurrenceScope::SparseN(2),
                kappa: Some(0.5),
                ..d
            },
            // SnAp-n widens a per-parameter trace only
            EtraceConfig {
                trace_factorization: TraceFactorization::IoFactorized,
                decay: Some((0.5, 0.5)),
                recurrence_scope: RecurrenceScope::SparseN(2),
                ..d
            },
        ];
        for c in cases {
            let e = c.algorithm().unwrap_err();
            assert!(matches!(e, Error::Invalid { .. }), "{c:?}: {e}");
        }
    }
}
