//! The online learning algorithms with their options, under braintrace's
//! names: `D_RTRL`, `pp_prop` / `ES_D_RTRL`, `EProp`, `OSTLRecurrent`,
//! `OSTLFeedforward`, `ThreeFactor`, `SnAp`, `UORO`, `RandomProjection`,
//! and an algorithm by its axes (`ETraceConfig`). Each builder maps its
//! keywords onto the Rust configuration type of `braintrace_core::learn`
//! and returns an `Algorithm`; a bad option is a `ValueError` (a wrong
//! type a `TypeError`) naming the argument. `compile` also takes a name
//! (`algorithm_in`).
//!
//! Parameters without a relation to a hidden state (a readout) get
//! braintrace's exact zeros by default (`non_temporal="zero"`) in every
//! builder, so that the numbers are braintrace's; `"in_step"` gives them
//! their in-step gradient.

use crate::array::tensor_in;
use braintrace_core::learn::{
    rank_decay, Algorithm, DRtrl, EProp, EtraceConfig, Feedback, InStepPaths, LearningSignal,
    NonTemporal, OstlFeedforward, OstlRecurrent, PpProp, RandomProjection, RecurrenceScope, SnAp,
    ThreeFactor, TraceFactorization, Uoro, VjpMethod,
};
use braintrace_core::Error;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyTuple};

/// An online learning algorithm with its options.
#[pyclass(name = "Algorithm", module = "braintrace_rs", frozen)]
pub struct PyAlgorithm {
    pub algo: Algorithm,
}

/// The `ThreeFactor` configuration of `a`, or a `ValueError`.
pub fn three_factor(a: &Algorithm) -> PyResult<&ThreeFactor> {
    a.get::<ThreeFactor>().ok_or_else(|| {
        PyValueError::new_err(format!(
            "`modulator`: only ThreeFactor has a modulator; this algorithm is {}",
            a.name()
        ))
    })
}

#[pymethods]
impl PyAlgorithm {
    fn __repr__(&self) -> String {
        format!("{:?}", self.algo)
    }
    /// The algorithm's name (`"d_rtrl"`, `"pp_prop"`, `"eprop"`,
    /// `"ostl_recurrent"`, `"ostl_feedforward"`, `"three_factor"`, `"snap"`,
    /// `"uoro"`, `"random_projection"`).
    #[getter]
    fn name(&self) -> &'static str {
        self.algo.name()
    }
    /// `"single-step"` or `"multi-step"`.
    #[getter]
    fn vjp_method(&self) -> &'static str {
        match self.algo.vjp_method() {
            VjpMethod::SingleStep => "single-step",
            VjpMethod::MultiStep => "multi-step",
        }
    }
    /// `"zero"` or `"in_step"`.
    #[getter]
    fn non_temporal(&self) -> &'static str {
        match self.algo.non_temporal() {
            NonTemporal::Zero => "zero",
            NonTemporal::InStep => "in_step",
        }
    }
    /// ThreeFactor's standing modulator (a `ValueError` for the others).
    #[getter]
    fn modulator(&self) -> PyResult<f64> {
        Ok(three_factor(&self.algo)?.modulator())
    }
    /// Set ThreeFactor's standing modulator (finite); every learner
    /// compiled with this algorithm reads it from its next step on. A
    /// `ValueError` for another algorithm or a value that is not finite
    /// (the old value kept).
    fn set_modulator(&self, modulator: f64) -> PyResult<()> {
        three_factor(&self.algo)?
            .set_modulator(modulator)
            .map_err(|e| arg("modulator", e))
    }
}

/// A library error about the argument `name` as a `ValueError` naming it.
fn arg(name: &str, e: Error) -> PyErr {
    PyValueError::new_err(format!("`{name}`: {e}"))
}

pub fn vjp(name: &str) -> PyResult<VjpMethod> {
    match name {
        "single-step" | "single_step" => Ok(VjpMethod::SingleStep),
        "multi-step" | "multi_step" => Ok(VjpMethod::MultiStep),
        other => Err(PyValueError::new_err(format!(
            "`vjp_method`: {other:?}; use \"single-step\" or \"multi-step\""
        ))),
    }
}

pub fn non_temporal(name: &str) -> PyResult<NonTemporal> {
    match name {
        "zero" => Ok(NonTemporal::Zero),
        "in_step" | "in-step" => Ok(NonTemporal::InStep),
        other => Err(PyValueError::new_err(format!(
            "`non_temporal`: {other:?}; use \"zero\" (braintrace's exact zeros) or \"in_step\""
        ))),
    }
}

fn in_step_paths(name: &str) -> PyResult<InStepPaths> {
    match name {
        "twice" => Ok(InStepPaths::Twice),
        "once" => Ok(InStepPaths::Once),
        other => Err(PyValueError::new_err(format!(
            "`in_step_paths`: {other:?}; use \"twice\" (braintrace's learning signal) or \"once\" (each in-step path counted once)"
        ))),
    }
}

/// D-RTRL: eligibility traces of parameter size, the hidden-to-hidden
/// Jacobian kept diagonal. `non_temporal="zero"` gives parameters without
/// a relation to a hidden state (a readout) braintrace's exact zeros;
/// `"in_step"` their in-step gradient (what training usually wants).
/// `in_step_paths="twice"` is braintrace's learning signal, which counts an
/// in-step path between two states of a group (an LSTM's c → h, a LIF's
/// current → voltage) twice; `"once"` counts it once (exact where D-RTRL
/// is).
#[pyfunction]
#[pyo3(name = "D_RTRL", signature = (vjp_method="single-step", non_temporal="zero", fast_paths=true, in_step_paths="twice"))]
pub fn d_rtrl(
    vjp_method: &str,
    non_temporal: &str,
    fast_paths: bool,
    in_step_paths: &str,
) -> PyResult<PyAlgorithm> {
    let a = DRtrl::default()
        .vjp_method(vjp(vjp_method)?)
        .non_temporal(self::non_temporal(non_temporal)?)
        .in_step_paths(self::in_step_paths(in_step_paths)?)
        .fast_paths(fast_paths);
    Ok(PyAlgorithm { algo: a.into() })
}

/// A decay from a float decay or an int rank (`what` names the argument).
fn decay_of(v: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    if v.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "`{what}`: expected a float decay or an int rank, got a bool"
        )));
    }
    if v.is_instance_of::<PyInt>() {
        rank_decay(v.extract()?).map_err(|e| arg(what, e))
    } else {
        v.extract::<f64>().map_err(|_| {
            PyTypeError::new_err(format!("`{what}`: expected a float decay or an int rank"))
        })
    }
}

/// ES-D-RTRL / pp_prop with `decay_or_rank`: a float decay in [0, 1), an
/// int rank r (decay (r-1)/(r+1)), or a pair (input decay, output decay).
/// `in_step_paths` as for `D_RTRL`.
#[pyfunction]
#[pyo3(signature = (decay_or_rank, vjp_method="single-step", non_temporal="zero", fast_paths=true, in_step_paths="twice"))]
pub fn pp_prop(
    decay_or_rank: &Bound<'_, PyAny>,
    vjp_method: &str,
    non_temporal: &str,
    fast_paths: bool,
    in_step_paths: &str,
) -> PyResult<PyAlgorithm> {
    const W: &str = "decay_or_rank";
    let p = if let Ok(t) = decay_or_rank.cast::<PyTuple>() {
        if t.len() != 2 {
            return Err(PyValueError::new_err(
                "`decay_or_rank`: a pair (input decay, output decay)",
            ));
        }
        PpProp::decays(decay_of(&t.get_item(0)?, W)?, decay_of(&t.get_item(1)?, W)?)
    } else {
        PpProp::new(decay_of(decay_or_rank, W)?)
    }
    .map_err(|e| arg(W, e))?;
    let p = p
        .vjp_method(vjp(vjp_method)?)
        .non_temporal(self::non_temporal(non_temporal)?)
        .in_step_paths(self::in_step_paths(in_step_paths)?)
        .fast_paths(fast_paths);
    Ok(PyAlgorithm { algo: p.into() })
}

/// e-prop (braintrace's `EProp`): D-RTRL's per-parameter trace, low-pass
/// filtered with `kappa_filter_decay` κ ∈ [0, 1) (0: no filter), contracted
/// with the true learning signal (`feedback="symmetric"`) or its direction
/// projected through fixed random matrices (`feedback="random"`): drawn
/// from `random_feedback_key` (an int seed, 0 by default), or given as
/// `feedback_matrices`, a dict {hidden group index: `(w, w)` array} for
/// every group with a relation (braintrace's own draws, exported,
/// reproduce its numbers; checked at compile).
#[pyfunction]
#[pyo3(name = "EProp", signature = (feedback="symmetric", kappa_filter_decay=0.0, random_feedback_key=None, vjp_method="single-step", non_temporal="zero", fast_paths=true, feedback_matrices=None))]
pub fn eprop(
    feedback: &str,
    kappa_filter_decay: f64,
    random_feedback_key: Option<u64>,
    vjp_method: &str,
    non_temporal: &str,
    fast_paths: bool,
    feedback_matrices: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyAlgorithm> {
    let fb =
        match (feedback, random_feedback_key, feedback_matrices) {
            ("symmetric", None, None) => Feedback::Symmetric,
            ("symmetric", Some(_), _) => {
                return Err(PyValueError::new_err(
                    "`random_feedback_key`: set only with feedback=\"random\"",
                ))
            }
            ("symmetric", None, Some(_)) => {
                return Err(PyValueError::new_err(
                    "`feedback_matrices`: given only with feedback=\"random\"",
                ))
            }
            ("random", Some(_), Some(_)) => return Err(PyValueError::new_err(
                "`feedback_matrices`: either random_feedback_key or feedback_matrices, not both",
            )),
            ("random", seed, None) => Feedback::Random {
                seed: seed.unwrap_or(0),
            },
            ("random", None, Some(ms)) => {
                let mut v = Vec::new();
                for (g, b) in ms.iter() {
                    let g: usize = g.extract().map_err(|_| {
                        PyTypeError::new_err(
                            "`feedback_matrices`: keys are hidden group indices (ints)",
                        )
                    })?;
                    v.push((g, tensor_in(&b, &format!("feedback_matrices[{g}]"))?));
                }
                v.sort_by_key(|(g, _)| *g);
                Feedback::Matrices(v)
            }
            (other, _, _) => {
                return Err(PyValueError::new_err(format!(
                    "`feedback`: {other:?}; use \"symmetric\" or \"random\""
                )))
            }
        };
    let e = EProp::new()
        .kappa(kappa_filter_decay)
        .map_err(|e| arg("kappa_filter_decay", e))?
        .feedback(fb)
        .vjp_method(vjp(vjp_method)?)
        .non_temporal(self::non_temporal(non_temporal)?)
        .fast_paths(fast_paths);
    Ok(PyAlgorithm { algo: e.into() })
}

/// OSTL's "with H" regime (braintrace's `OSTLRecurrent`): D-RTRL with the
/// coupled per-position hidden-to-hidden Jacobian.
#[pyfunction]
#[pyo3(name = "OSTLRecurrent", signature = (vjp_method="single-step", non_temporal="zero", fast_paths=true))]
pub fn ostl_recurrent(
    vjp_method: &str,
    non_temporal: &str,
    fast_paths: bool,
) -> PyResult<PyAlgorithm> {
    let o = OstlRecurrent::default()
        .vjp_method(vjp(vjp_method)?)
        .non_temporal(self::non_temporal(non_temporal)?)
        .fast_paths(fast_paths);
    Ok(PyAlgorithm { algo: o.into() })
}

/// OSTL's "without H" regime (braintrace's `OSTLFeedforward`): pp_prop with
/// a negligible decay, `decay_or_rank` (1e-6 by default; a float in
/// [0, 1) or an int rank).
#[pyfunction]
#[pyo3(name = "OSTLFeedforward", signature = (decay_or_rank=None, vjp_method="single-step", non_temporal="zero"))]
pub fn ostl_feedforward(
    decay_or_rank: Option<&Bound<'_, PyAny>>,
    vjp_method: &str,
    non_temporal: &str,
) -> PyResult<PyAlgorithm> {
    let o = match decay_or_rank {
        None => OstlFeedforward::default(),
        Some(d) => OstlFeedforward::decay(decay_of(d, "decay_or_rank")?)
            .map_err(|e| arg("decay_or_rank", e))?,
    };
    let o = o
        .vjp_method(vjp(vjp_method)?)
        .non_temporal(self::non_temporal(non_temporal)?);
    Ok(PyAlgorithm { algo: o.into() })
}

/// Three-factor learning (braintrace's `ThreeFactor`): D-RTRL's trace
/// contracted with a scalar `modulator` (a reward, a neuromodulator) in
/// place of the learning signal. The modulator is a standing value, set
/// between calls with `Algorithm.set_modulator` or
/// `Learner.set_modulator`. Single-step only.
#[pyfunction]
#[pyo3(name = "ThreeFactor", signature = (modulator=1.0, vjp_method="single-step", non_temporal="zero", fast_paths=true))]
pub fn three_factor_fn(
    modulator: f64,
    vjp_method: &str,
    non_temporal: &str,
    fast_paths: bool,
) -> PyResult<PyAlgorithm> {
    if vjp(vjp_method)? != VjpMethod::SingleStep {
        return Err(PyValueError::new_err(
            "`vjp_method`: ThreeFactor is single-step only (as in braintrace)",
        ));
    }
    let t = ThreeFactor::new(modulator)
        .map_err(|e| arg("modulator", e))?
        .non_temporal(self::non_temporal(non_temporal)?)
        .fast_paths(fast_paths);
    Ok(PyAlgorithm { algo: t.into() })
}

/// SnAp-n (braintrace's `SnAp`): the influence matrix kept on the
/// positions a parameter reaches in fewer than `n` steps, `n` 1 (the
/// per-position blocks) or 2 (the whole group, braintrace's default).
#[pyfunction]
#[pyo3(name = "SnAp", signature = (n=None, vjp_method="single-step", non_temporal="zero"))]
pub fn snap(
    n: Option<&Bound<'_, PyAny>>,
    vjp_method: &str,
    non_temporal: &str,
) -> PyResult<PyAlgorithm> {
    let n = match n {
        None => 2,
        Some(v) if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() => {
            return Err(PyTypeError::new_err(format!(
                "`n`: expected an int order (1 or 2), got {}",
                v.get_type().name()?
            )))
        }
        Some(v) => {
            let i: i64 = v.extract()?;
            usize::try_from(i)
                .map_err(|_| PyValueError::new_err(format!("`n`: must be 1 or 2, got {i}")))?
        }
    };
    let s = SnAp::new(n)
        .map_err(|e| arg("n", e))?
        .vjp_method(vjp(vjp_method)?)
        .non_temporal(self::non_temporal(non_temporal)?);
    Ok(PyAlgorithm { algo: s.into() })
}

/// The UORO configuration of `UORO` and `RandomProjection`.
fn uoro_config(
    seed: u64,
    projection_eps: f64,
    vjp_method: &str,
    non_temporal: &str,
    draws: Option<&Bound<'_, PyAny>>,
) -> PyResult<Uoro> {
    let mut u = Uoro::default()
        .seed(seed)
        .eps(projection_eps)
        .map_err(|e| arg("projection_eps", e))?
        .vjp_method(vjp(vjp_method)?)
        .non_temporal(self::non_temporal(non_temporal)?);
    if let Some(d) = draws {
        let mut steps = Vec::new();
        for (t, row) in d.try_iter()?.enumerate() {
            let mut groups = Vec::new();
            for (g, a) in row?.try_iter()?.enumerate() {
                groups.push(tensor_in(&a?, &format!("draws[{t}][{g}]"))?);
            }
            steps.push(groups);
        }
        u = u.draws(steps);
    }
    Ok(u)
}

/// UORO (braintrace's `UORO`): each hidden group's influence matrix as one
/// rank-1 product re-randomised every step, unbiased in expectation. `seed`
/// (braintrace's `projection_key`) seeds the projection stream (a reset
/// re-derives it), `projection_eps` > 0 guards every norm; `draws` (a list
/// over steps of a list over hidden groups of arrays shaped like the
/// group's states with a trailing state axis) replaces the stream.
/// Multi-step by default.
#[pyfunction]
#[pyo3(name = "UORO", signature = (seed=42, projection_eps=1e-12, vjp_method="multi-step", non_temporal="zero", draws=None))]
pub fn uoro(
    seed: u64,
    projection_eps: f64,
    vjp_method: &str,
    non_temporal: &str,
    draws: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyAlgorithm> {
    let u = uoro_config(seed, projection_eps, vjp_method, non_temporal, draws)?;
    Ok(PyAlgorithm { algo: u.into() })
}

/// braintrace's `RandomProjectionVjpAlgorithm` under its factorization's
/// name: the engine `UORO` is the preset of, with the same options and
/// numbers.
#[pyfunction]
#[pyo3(name = "RandomProjection", signature = (seed=42, projection_eps=1e-12, vjp_method="multi-step", non_temporal="zero", draws=None))]
pub fn random_projection(
    seed: u64,
    projection_eps: f64,
    vjp_method: &str,
    non_temporal: &str,
    draws: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyAlgorithm> {
    let u = uoro_config(seed, projection_eps, vjp_method, non_temporal, draws)?;
    Ok(PyAlgorithm {
        algo: RandomProjection(u).into(),
    })
}

/// `a` with its non-temporal treatment set to `nt` (the algorithms an
/// `ETraceConfig` maps to).
fn with_non_temporal(a: Algorithm, nt: NonTemporal) -> Algorithm {
    if let Some(d) = a.get::<DRtrl>() {
        return (*d).non_temporal(nt).into();
    }
    if let Some(e) = a.get::<EProp>() {
        return e.clone().non_temporal(nt).into();
    }
    if let Some(o) = a.get::<OstlRecurrent>() {
        return (*o).non_temporal(nt).into();
    }
    if let Some(t) = a.get::<ThreeFactor>() {
        return t.clone().non_temporal(nt).into();
    }
    if let Some(p) = a.get::<PpProp>() {
        return (*p).non_temporal(nt).into();
    }
    if let Some(s) = a.get::<SnAp>() {
        return (*s).non_temporal(nt).into();
    }
    if let Some(r) = a.get::<RandomProjection>() {
        return RandomProjection(r.0.clone().non_temporal(nt)).into();
    }
    a
}

/// An online learning rule by its axes (braintrace's `ETraceConfig`):
/// `trace_factorization` (`"per_param"`, `"io_factorized"`,
/// `"random_projection"`), `recurrence_scope` (`"diagonal"`, `"coupled"`,
/// `"sparse_n"` with `sparse_n`), `learning_signal` (`"symmetric"`,
/// `"random_feedback"` with `random_feedback_key`, `"modulatory"`,
/// `"bootstrapped"`), `trace_filter` (`"none"`, `"kappa"` with `kappa`),
/// `decay` (a float or an (x, f) pair, for `"io_factorized"`). Checked at
/// construction as braintrace checks it (a `ValueError` naming the
/// field); `compile` runs the algorithm braintrace runs for it
/// (`algorithm()`), with `non_temporal` as the builders have it.
#[pyclass(name = "ETraceConfig", module = "braintrace_rs", frozen)]
pub struct PyEtraceConfig {
    cfg: EtraceConfig,
    non_temporal: NonTemporal,
}

fn pick<T: Copy>(what: &str, v: &str, table: &[(&str, T)]) -> PyResult<T> {
    table
        .iter()
        .find(|(n, _)| *n == v)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            let names: Vec<String> = table.iter().map(|(n, _)| format!("{n:?}")).collect();
            PyValueError::new_err(format!("`{what}`: {v:?}; use one of {}", names.join(", ")))
        })
}

fn decay_pair(d: &Bound<'_, PyAny>) -> PyResult<(f64, f64)> {
    if let Ok(t) = d.cast::<PyTuple>() {
        if t.len() == 2 {
            return Ok((t.get_item(0)?.extract()?, t.get_item(1)?.extract()?));
        }
        return Err(PyValueError::new_err(
            "`decay`: a float or a pair (x decay, f decay)",
        ));
    }
    let v: f64 = d
        .extract()
        .map_err(|_| PyTypeError::new_err("`decay`: expected a float or a pair of floats"))?;
    Ok((v, v))
}

impl PyEtraceConfig {
    /// The algorithm braintrace runs for this coordinate.
    pub fn to_algorithm(&self) -> PyResult<Algorithm> {
        let a = self
            .cfg
            .algorithm()
            .map_err(|e| PyValueError::new_err(format!("`algorithm`: {e}")))?;
        Ok(with_non_temporal(a, self.non_temporal))
    }
}

#[pymethods]
impl PyEtraceConfig {
    #[new]
    #[pyo3(signature = (trace_factorization="per_param", recurrence_scope="diagonal", learning_signal="symmetric", trace_filter="none", decay=None, kappa=None, sparse_n=None, random_feedback_key=None, non_temporal="zero"))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        trace_factorization: &str,
        recurrence_scope: &str,
        learning_signal: &str,
        trace_filter: &str,
        decay: Option<&Bound<'_, PyAny>>,
        kappa: Option<f64>,
        sparse_n: Option<usize>,
        random_feedback_key: Option<u64>,
        non_temporal: &str,
    ) -> PyResult<Self> {
        use TraceFactorization as F;
        let tf = pick(
            "trace_factorization",
            trace_factorization,
            &[
                ("per_param", F::PerParam),
                ("io_factorized", F::IoFactorized),
                ("random_projection", F::RandomProjection),
            ],
        )?;
        let scope = match (recurrence_scope, sparse_n) {
            ("sparse_n", Some(n)) => RecurrenceScope::SparseN(n),
            ("sparse_n", None) => {
                return Err(PyValueError::new_err(
                    "`sparse_n`: recurrence_scope=\"sparse_n\" needs its order sparse_n",
                ))
            }
            (s, None) => pick(
                "recurrence_scope",
                s,
                &[
                    ("diagonal", RecurrenceScope::Diagonal),
                    ("coupled", RecurrenceScope::Coupled),
                ],
            )?,
            (s, Some(n)) => {
                return Err(PyValueError::new_err(format!(
                    "`sparse_n`: {n} is set but recurrence_scope is {s:?}, not \"sparse_n\""
                )))
            }
        };
        let signal = match (learning_signal, random_feedback_key) {
            ("random_feedback", seed) => LearningSignal::RandomFeedback {
                seed: seed.unwrap_or(0),
            },
            (s, None) => pick(
                "learning_signal",
                s,
                &[
                    ("symmetric", LearningSignal::Symmetric),
                    ("modulatory", LearningSignal::Modulatory),
                    ("bootstrapped", LearningSignal::Bootstrapped),
                ],
            )?,
            (s, Some(_)) => {
                return Err(PyValueError::new_err(format!(
                "`random_feedback_key`: set but learning_signal is {s:?}, not \"random_feedback\""
            )))
            }
        };
        let kappa = match (trace_filter, kappa) {
            ("kappa", Some(k)) => Some(k),
            ("kappa", None) => {
                return Err(PyValueError::new_err(
                    "`kappa`: trace_filter=\"kappa\" needs its coefficient kappa",
                ))
            }
            ("none", None) => None,
            ("none", Some(k)) => {
                return Err(PyValueError::new_err(format!(
                    "`kappa`: {k} is set but trace_filter is \"none\", not \"kappa\""
                )))
            }
            (other, _) => {
                return Err(PyValueError::new_err(format!(
                    "`trace_filter`: {other:?}; use \"none\" or \"kappa\""
                )))
            }
        };
        let cfg = EtraceConfig {
            trace_factorization: tf,
            recurrence_scope: scope,
            learning_signal: signal,
            kappa,
            decay: decay.map(decay_pair).transpose()?,
        };
        let cfg = cfg
            .canonical()
            .map_err(|e| PyValueError::new_err(format!("`ETraceConfig`: {e}")))?;
        Ok(PyEtraceConfig {
            cfg,
            non_temporal: self::non_temporal(non_temporal)?,
        })
    }

    /// The trace's storage: `"per_param"`, `"io_factorized"` or
    /// `"random_projection"`.
    #[getter]
    fn trace_factorization(&self) -> &'static str {
        match self.cfg.trace_factorization {
            TraceFactorization::PerParam => "per_param",
            TraceFactorization::IoFactorized => "io_factorized",
            TraceFactorization::RandomProjection => "random_projection",
        }
    }
    /// `"diagonal"`, `"coupled"` or `"sparse_n"` (canonical: SnAp-1 is
    /// `"coupled"`).
    #[getter]
    fn recurrence_scope(&self) -> &'static str {
        match self.cfg.recurrence_scope {
            RecurrenceScope::Diagonal => "diagonal",
            RecurrenceScope::Coupled => "coupled",
            RecurrenceScope::SparseN(_) => "sparse_n",
        }
    }
    /// SnAp's order under `"sparse_n"`, else None.
    #[getter]
    fn sparse_n(&self) -> Option<usize> {
        match self.cfg.recurrence_scope {
            RecurrenceScope::SparseN(n) => Some(n),
            _ => None,
        }
    }
    /// `"symmetric"`, `"random_feedback"`, `"modulatory"` or
    /// `"bootstrapped"`.
    #[getter]
    fn learning_signal(&self) -> &'static str {
        match self.cfg.learning_signal {
            LearningSignal::Symmetric => "symmetric",
            LearningSignal::RandomFeedback { .. } => "random_feedback",
            LearningSignal::Modulatory => "modulatory",
            LearningSignal::Bootstrapped => "bootstrapped",
        }
    }
    /// `"kappa"` or `"none"` (canonical: κ = 0 is `"none"`).
    #[getter]
    fn trace_filter(&self) -> &'static str {
        if self.cfg.kappa.is_some() {
            "kappa"
        } else {
            "none"
        }
    }
    /// The filter's coefficient, or None.
    #[getter]
    fn kappa(&self) -> Option<f64> {
        self.cfg.kappa
    }
    /// The (x, f) decays of `"io_factorized"`, or None.
    #[getter]
    fn decay(&self) -> Option<(f64, f64)> {
        self.cfg.decay
    }
    /// The algorithm braintrace runs for this coordinate (a `ValueError`
    /// when no algorithm of this build implements it).
    fn algorithm(&self) -> PyResult<PyAlgorithm> {
        Ok(PyAlgorithm {
            algo: self.to_algorithm()?,
        })
    }
    fn __repr__(&self) -> String {
        format!("ETraceConfig({:?})", self.cfg)
    }
}

/// The algorithm `compile` was given: an `Algorithm`, an `ETraceConfig`,
/// or braintrace's name with the library's default options.
pub fn algorithm_in(a: &Bound<'_, PyAny>) -> PyResult<Algorithm> {
    if let Ok(p) = a.cast::<PyAlgorithm>() {
        return Ok(p.get().algo.clone());
    }
    if let Ok(c) = a.cast::<PyEtraceConfig>() {
        return c.get().to_algorithm();
    }
    match a.extract::<String>().ok().as_deref() {
        Some("d_rtrl" | "D_RTRL" | "d-rtrl") => Ok(DRtrl::default().into()),
        Some(n) if n.eq_ignore_ascii_case("pp_prop") || n.eq_ignore_ascii_case("es_d_rtrl") => {
            Err(PyValueError::new_err(format!(
                "`algorithm`: {n} needs its decay_or_rank: use braintrace_rs.pp_prop(decay_or_rank)"
            )))
        }
        // Every other algorithm by braintrace's name with its defaults
        // (`eprop`, `ostl_recurrent`, `uoro`, ...); an unknown name lists
        // the known ones.
        Some(other) => Algorithm::by_name(other)
            .map_err(|e| PyValueError::new_err(format!("`algorithm`: {e}"))),
        None => Err(PyTypeError::new_err(
            "`algorithm`: expected an algorithm (D_RTRL(...), EProp(...), ...), an ETraceConfig or a name",
        )),
    }
}
