//! The end-to-end golden checker (`"kind": "e2e"`, schema in the golden
//! README §6): builds the case's model from its dims and hyperparameters,
//! loads its weights, compiles the learner, runs `etrace_grad` and the BPTT
//! rollout and compares every recorded field. Unknown fields are failures;
//! every failure is collected.

use super::models::{DiagNet, GruNet, LeakyNet, LifNet};
use braintrace::learn::{
    bptt_grad, compile, Algorithm, DRtrl, DiagnosticKind, InStepPaths, Learner, Level, Model,
    ModelState, NonTemporal, PpProp, RandomProjection, Reduction, SnAp, TensorDict, Uoro,
    VjpMethod,
};
use braintrace::{DType, Tensor};
use serde_json::{Map, Value};

type R<T> = std::result::Result<T, String>;

/// Tolerance of the e2e comparisons: `|got − want| ≤ TOL·(1 + |want|)`.
pub const TOL: f64 = 1e-9;

fn obj<'a>(v: &'a Value, what: &str) -> R<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| format!("{what}: not an object"))
}
fn field<'a>(o: &'a Map<String, Value>, k: &str, what: &str) -> R<&'a Value> {
    o.get(k).ok_or_else(|| format!("{what}: missing `{k}`"))
}
fn num(v: &Value, what: &str) -> R<f64> {
    v.as_f64().ok_or_else(|| format!("{what}: not a number"))
}
fn usize_of(v: &Value, what: &str) -> R<usize> {
    v.as_u64()
        .map(|u| u as usize)
        .ok_or_else(|| format!("{what}: not an unsigned integer"))
}
fn str_of<'a>(v: &'a Value, what: &str) -> R<&'a str> {
    v.as_str().ok_or_else(|| format!("{what}: not a string"))
}
fn known(o: &Map<String, Value>, what: &str, keys: &[&str], fails: &mut Vec<String>) {
    for k in o.keys() {
        if !keys.contains(&k.as_str()) {
            fails.push(format!(
                "{what}: unknown field `{k}` (the checker does not know how to check it)"
            ));
        }
    }
}

/// An array object as an f64 tensor.
pub fn array(v: &Value, what: &str) -> R<Tensor> {
    let o = obj(v, what)?;
    let dt = str_of(field(o, "dtype", what)?, what)?;
    if dt != "float64" {
        return Err(format!("{what}: dtype {dt} (expected float64)"));
    }
    let shape: Vec<usize> = field(o, "shape", what)?
        .as_array()
        .ok_or_else(|| format!("{what}: shape"))?
        .iter()
        .map(|d| usize_of(d, what))
        .collect::<R<_>>()?;
    let mut data = Vec::new();
    fn flat(v: &Value, out: &mut Vec<f64>, what: &str) -> R<()> {
        match v {
            Value::Array(l) => l.iter().try_for_each(|x| flat(x, out, what)),
            Value::Number(n) => {
                out.push(n.as_f64().ok_or_else(|| format!("{what}: bad number"))?);
                Ok(())
            }
            _ => Err(format!("{what}: bad data")),
        }
    }
    flat(field(o, "data", what)?, &mut data, what)?;
    Tensor::from_vec(data, &shape).map_err(|e| format!("{what}: {e}"))
}

fn dict(v: &Value, what: &str) -> R<TensorDict> {
    obj(v, what)?
        .iter()
        .map(|(k, a)| Ok((k.clone(), array(a, &format!("{what}.{k}"))?)))
        .collect()
}

/// Compare element-wise; record the worst mismatch.
pub fn compare(what: &str, got: &Tensor, want: &Tensor, fails: &mut Vec<String>) {
    if got.shape() != want.shape() {
        fails.push(format!(
            "{what}: shape {:?}, expected {:?}",
            got.shape(),
            want.shape()
        ));
        return;
    }
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    let mut worst: Option<(usize, f64)> = None;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let err = (a - b).abs() / (1.0 + b.abs());
        if (err > TOL || err.is_nan()) && worst.is_none_or(|(_, e)| err > e) {
            worst = Some((i, err));
        }
    }
    if let Some((i, e)) = worst {
        fails.push(format!(
            "{what}: element {i} is {}, expected {} (relative error {e:e})",
            g[i], w[i]
        ));
    }
}

fn compare_dict(what: &str, got: &TensorDict, want: &TensorDict, fails: &mut Vec<String>) {
    for k in want.keys().chain(got.keys()) {
        match (got.get(k), want.get(k)) {
            (Some(g), Some(w)) => compare(&format!("{what}[{k}]"), g, w, fails),
            (None, Some(_)) => fails.push(format!("{what}: missing key `{k}`")),
            (Some(_), None) => fails.push(format!("{what}: unexpected key `{k}`")),
            (None, None) => unreachable!(),
        }
    }
}

fn mse(o: &Tensor, y: &Tensor) -> braintrace::Result<Tensor> {
    o.sub(y)?.square()?.mean_all()
}

type LossFn = fn(&Tensor, &Tensor) -> braintrace::Result<Tensor>;

/// The case's per-step loss: its `loss` field (absent: MSE against `ys`).
fn loss_of(o: &Map<String, Value>) -> R<LossFn> {
    match o.get("loss").map(|v| str_of(v, "loss")).transpose()? {
        None => Ok(mse),
        Some("softmax_cross_entropy_with_integer_labels") => {
            Ok(braintrace::nn::loss::softmax_cross_entropy_with_integer_labels)
        }
        Some(other) => Err(format!("unknown loss `{other}`")),
    }
}

/// A braintrace warning the checker skips: SnAp-n's position analysis
/// widening to all-to-all (ours always takes the whole group, no
/// diagnostic; the numbers must agree).
fn is_skipped_warning(w: &str) -> bool {
    w.contains("SnAp-n position analysis could not derive a pattern")
}

/// Warning kinds in braintrace's compile warnings.
fn warning_kind(w: &str) -> R<DiagnosticKind> {
    if w.contains("reaches a hidden state only through another trainable ETP primitive") {
        Ok(DiagnosticKind::ExcludedWeightToWeight)
    } else if w.contains("has no connected hidden states") {
        Ok(DiagnosticKind::ExcludedNonTemporal)
    } else if w.contains("through *both* a direct tail and another trainable ETP primitive") {
        // RELATION_PARTIAL_PATH: the MGU's `Wf`, which also reaches `h`
        // through `Wh`.
        Ok(DiagnosticKind::PartialPath)
    } else {
        Err(format!("unrecognised compile warning: {w}"))
    }
}

/// Check one e2e case; returns every failure.
/// Another precision for [`etrace_variant`]: the model's dtype and the
/// traces'.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub dtype: DType,
    pub trace: braintrace::learn::TraceDType,
}

thread_local! {
    /// The variant [`etrace_variant`] runs (none: the golden check).
    static VARIANT: std::cell::Cell<Option<Variant>> = const { std::cell::Cell::new(None) };
    /// Its result: the gradients got (in the variant) and the golden ones.
    static GOT: std::cell::RefCell<Option<(TensorDict, TensorDict)>> = const { std::cell::RefCell::new(None) };
}

/// Run case `file`'s `etrace_grad` with the model in `var.dtype` and the
/// traces in `var.trace` (D-RTRL and pp_prop cases), the case's weights,
/// hidden states and sequences cast to it; returns the gradients (in f64)
/// and the golden ones. No BPTT or graph check.
pub fn etrace_variant(file: &str, v: &Value, var: Variant) -> R<(TensorDict, TensorDict)> {
    VARIANT.set(Some(var));
    let mut fails = Vec::new();
    let r = run(file, v, &Algorithms::default(), &mut fails);
    VARIANT.set(None);
    r?;
    if !fails.is_empty() {
        return Err(fails.join("; "));
    }
    GOT.take().ok_or_else(|| format!("{file}: no gradients"))
}

pub fn check_e2e(file: &str, v: &Value) -> Vec<String> {
    check_e2e_with(file, v, &Algorithms::default())
}

/// Check the case files `names` of `dir` with `algos`, printing one line
/// per file; returns every failure.
pub fn check_files(dir: &std::path::Path, names: &[String], algos: &Algorithms<'_>) -> Vec<String> {
    let mut failures = Vec::new();
    for name in names {
        let fails = match std::fs::read_to_string(dir.join(name))
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        {
            Ok(v) => check_e2e_with(name, &v, algos),
            Err(e) => vec![format!("{name}: cannot read: {e}")],
        };
        let status = if fails.is_empty() {
            "ok".into()
        } else {
            format!("{} failure(s)", fails.len())
        };
        println!("{name}: {status}");
        failures.extend(fails);
    }
    failures
}

/// The algorithm of a case (its braintrace class name, its options, its
/// VJP method and the whole case), or `None` when the resolver does not
/// know the class.
pub type Resolve =
    dyn Fn(&str, &Map<String, Value>, VjpMethod, &Map<String, Value>) -> Option<R<Algorithm>>;

/// Algorithms a test adds to the checker's D-RTRL and pp_prop: how to
/// build them, and the option and case fields they read.
#[derive(Default)]
pub struct Algorithms<'a> {
    /// Builds the algorithm of a class the checker does not know.
    pub resolve: Option<&'a Resolve>,
    /// Further `algorithm_options` fields.
    pub option_keys: &'a [&'a str],
    /// Further case fields.
    pub case_keys: &'a [&'a str],
}

/// [`check_e2e`] for a case whose algorithm `algos` builds.
pub fn check_e2e_with(file: &str, v: &Value, algos: &Algorithms<'_>) -> Vec<String> {
    let mut fails = Vec::new();
    if let Err(e) = run(file, v, algos, &mut fails) {
        fails.push(format!("{file}: {e}"));
    }
    fails.into_iter().map(|f| format!("{file}: {f}")).collect()
}

fn run(file: &str, v: &Value, algos: &Algorithms<'_>, fails: &mut Vec<String>) -> R<()> {
    let o = obj(v, file)?;
    known(
        o,
        "case",
        &[
            &[
                "schema_version",
                "kind",
                "case_id",
                "model",
                "dims",
                "hyperparams",
                "algorithm",
                "algorithm_options",
                "vjp_method",
                "compile_call",
                "etrace_grad_call",
                "weights",
                "initial_hidden",
                "xs",
                "ys",
                "etrace",
                "bptt",
                "max_abs_diff_etrace_vs_bptt",
                "graph",
                "compile_warnings",
                "run_warnings",
                "spike_threshold_margin",
                "generator",
                "projection_draws",
                "loss",
            ][..],
            algos.case_keys,
        ]
        .concat(),
        fails,
    );
    let dims = obj(field(o, "dims", "case")?, "dims")?;
    known(dims, "dims", &["n_in", "n_rec", "n_out", "T", "B"], fails);
    let d = |k: &str| usize_of(field(dims, k, "dims")?, k);
    let (n_in, n_rec, n_out, _t, b) = (d("n_in")?, d("n_rec")?, d("n_out")?, d("T")?, d("B")?);
    let hp = obj(field(o, "hyperparams", "case")?, "hyperparams")?;
    let h = |k: &str| num(field(hp, k, "hyperparams")?, k);
    let model_name = str_of(field(o, "model", "case")?, "model")?;
    let opts = obj(field(o, "algorithm_options", "case")?, "algorithm_options")?;
    known(
        opts,
        "algorithm_options",
        &[&["decay_or_rank", "vjp_method", "n"][..], algos.option_keys].concat(),
        fails,
    );
    let vjp = match str_of(field(o, "vjp_method", "case")?, "vjp_method")? {
        "single-step" => VjpMethod::SingleStep,
        "multi-step" => VjpMethod::MultiStep,
        other => return Err(format!("unknown vjp_method {other}")),
    };
    let algo: Algorithm = match str_of(field(o, "algorithm", "case")?, "algorithm")? {
        // braintrace 0.2.6 gives parameters without a relation zeros and
        // counts in-step paths between a group's states twice; ours default
        // to the in-step gradient and to counting them once, so the
        // comparison asks for braintrace's behaviour.
        "D_RTRL" => DRtrl::default()
            .vjp_method(vjp)
            .non_temporal(NonTemporal::Zero)
            .in_step_paths(InStepPaths::Twice)
            .trace_dtype(VARIANT.get().map(|v| v.trace).unwrap_or_default())
            .into(),
        "pp_prop" | "ES_D_RTRL" => {
            let p = match opts.get("decay_or_rank") {
                Some(Value::Number(n)) if n.is_u64() => PpProp::rank(n.as_u64().unwrap() as usize),
                Some(Value::Number(n)) => PpProp::new(n.as_f64().unwrap()),
                Some(Value::Array(l)) if l.len() == 2 => {
                    let dec = |x: &Value| -> R<f64> {
                        match x.as_u64() {
                            Some(r) => {
                                braintrace::learn::rank_decay(r as usize).map_err(|e| e.to_string())
                            }
                            None => num(x, "decay"),
                        }
                    };
                    PpProp::decays(dec(&l[0])?, dec(&l[1])?)
                }
                other => return Err(format!("unsupported decay_or_rank {other:?}")),
            }
            .map_err(|e| e.to_string())?;
            p.vjp_method(vjp)
                .non_temporal(NonTemporal::Zero)
                .in_step_paths(InStepPaths::Twice)
                .trace_dtype(VARIANT.get().map(|v| v.trace).unwrap_or_default())
                .into()
        }
        "SnAp" => {
            let n = opts
                .get("n")
                .and_then(Value::as_u64)
                .ok_or("SnAp without `n`")?;
            SnAp::new(n as usize)
                .map_err(|e| e.to_string())?
                .vjp_method(vjp)
                .non_temporal(NonTemporal::Zero)
                .into()
        }
        name @ ("UORO" | "RandomProjectionVjpAlgorithm") => {
            // braintrace's draws, recorded per step and hidden group.
            let rows = field(o, "projection_draws", "case")?
                .as_array()
                .ok_or("projection_draws")?;
            let draws = rows
                .iter()
                .map(|r| {
                    r.as_array()
                        .ok_or("projection_draws row")?
                        .iter()
                        .map(|t| array(t, "projection_draws"))
                        .collect::<R<Vec<_>>>()
                })
                .collect::<R<Vec<_>>>()?;
            let u = Uoro::default()
                .draws(draws)
                .vjp_method(vjp)
                .non_temporal(NonTemporal::Zero);
            if name == "UORO" {
                u.into()
            } else {
                RandomProjection(u).into()
            }
        }
        other => match algos.resolve.and_then(|f| f(other, opts, vjp, o)) {
            Some(a) => a?,
            None => return Err(format!("unknown algorithm {other}")),
        },
    };
    if model_name.starts_with("snn_") {
        // The spiking zoo (`tests/golden_snn`): one network family.
        known(hp, "hyperparams", super::snn_models::HP_KEYS, fails);
        let net = super::snn_models::SnnNet::from_hp(hp, n_in, n_rec, n_out)?;
        return check_model(net, o, algo, b, fails);
    }
    let hp_keys: &[&str] = match model_name {
        "gru" | "diag" => &[],
        "leaky" => &["alpha", "tau_out", "dt", "readout_decay"],
        "lif" => &["beta", "gamma", "v_th", "tau_out", "dt", "readout_decay"],
        m if super::zoo::is_zoo(m) => &[],
        m if super::wlayers::is_wlayers(m) => &[],
        m if super::gprims::is_gprims(m) => &[],
        other => return Err(format!("unknown model `{other}`")),
    };
    known(hp, "hyperparams", hp_keys, fails);
    match model_name {
        "gru" => check_model(GruNet::new(n_in, n_rec, n_out), o, algo, b, fails),
        "leaky" => check_model(
            LeakyNet::new(n_in, n_rec, n_out, h("alpha")?, h("readout_decay")?),
            o,
            algo,
            b,
            fails,
        ),
        "lif" => check_model(
            LifNet::new(
                n_in,
                n_rec,
                n_out,
                h("beta")?,
                h("gamma")?,
                h("v_th")?,
                h("readout_decay")?,
            ),
            o,
            algo,
            b,
            fails,
        ),
        "diag" => check_model(DiagNet::new(n_in, n_rec), o, algo, b, fails),
        m if super::wlayers::is_wlayers(m) => {
            super::wlayers::check(m, (n_in, n_rec, n_out), o, algo, b, fails)
        }
        m if super::gprims::is_gprims(m) => {
            super::gprims::check(m, (n_in, n_rec, n_out), o, algo, b, fails)
        }
        m => super::zoo::check(m, (n_in, n_rec, n_out), o, algo, b, fails),
    }
}

pub(super) fn check_model<M: Model>(
    model: M,
    o: &Map<String, Value>,
    algo: Algorithm,
    b: usize,
    fails: &mut Vec<String>,
) -> R<()> {
    let e = |e: braintrace::Error| e.to_string();
    if let Some(var) = VARIANT.get() {
        return variant(model, o, algo, b, var);
    }
    let loss = loss_of(o)?;
    let mut state = ModelState::new(&model, DType::F64, 0, Some(b)).map_err(e)?;
    let weights = dict(field(o, "weights", "case")?, "weights")?;
    let declared: Vec<String> = state.param_infos().iter().map(|p| p.key.clone()).collect();
    let mut wk: Vec<String> = weights.keys().cloned().collect();
    let mut dk = declared.clone();
    wk.sort();
    dk.sort();
    if wk != dk {
        fails.push(format!("weights: keys {wk:?}, model declares {dk:?}"));
    }
    state.set_params(&weights).map_err(e)?;
    let init_h = dict(field(o, "initial_hidden", "case")?, "initial_hidden")?;
    let xs = array(field(o, "xs", "case")?, "xs")?;
    let ys = array(field(o, "ys", "case")?, "ys")?;

    // BPTT reference rollout (before compiling: compile resets hidden states).
    state.reset_hidden(Some(b)).map_err(e)?;
    for (k, t) in &init_h {
        state.set_hidden(k, t).map_err(e)?;
    }
    let bp = obj(field(o, "bptt", "case")?, "bptt")?;
    known(
        bp,
        "bptt",
        &["objective", "grads", "losses", "outputs", "hidden"],
        fails,
    );
    let bptt = bptt_grad(&model, &state, &xs, &ys, loss, Reduction::Mean).map_err(e)?;
    compare_dict(
        "bptt.grads",
        &bptt.grads,
        &dict(field(bp, "grads", "bptt")?, "bptt.grads")?,
        fails,
    );
    compare(
        "bptt.losses",
        &bptt.losses,
        &array(field(bp, "losses", "bptt")?, "bptt.losses")?,
        fails,
    );
    compare(
        "bptt.outputs",
        &bptt.outputs,
        &array(field(bp, "outputs", "bptt")?, "bptt.outputs")?,
        fails,
    );
    compare_dict(
        "bptt.hidden",
        &bptt.hidden,
        &dict(field(bp, "hidden", "bptt")?, "bptt.hidden")?,
        fails,
    );

    let x0 = xs.index_axis0(0).map_err(e)?;
    let mut learner: Learner<M> =
        compile(model, state, algo, &x0.zeros_like(), Some(b)).map_err(e)?;
    for (k, t) in &init_h {
        learner.state_mut().set_hidden(k, t).map_err(e)?;
    }
    check_graph(&learner, o, fails)?;
    let et = obj(field(o, "etrace", "case")?, "etrace")?;
    known(et, "etrace", &["grads", "grad_dtypes", "losses"], fails);
    let out = learner
        .etrace_grad(&xs, &ys, loss, Reduction::Mean)
        .map_err(e)?;
    compare_dict(
        "etrace.grads",
        &out.grads,
        &dict(field(et, "grads", "etrace")?, "etrace.grads")?,
        fails,
    );
    compare(
        "etrace.losses",
        &out.losses,
        &array(field(et, "losses", "etrace")?, "etrace.losses")?,
        fails,
    );
    for (k, dt) in obj(field(et, "grad_dtypes", "etrace")?, "grad_dtypes")? {
        if dt.as_str() != Some("float64") || out.grads.get(k).map(Tensor::dtype) != Some(DType::F64)
        {
            fails.push(format!(
                "etrace.grad_dtypes[{k}]: {dt} vs {:?}",
                out.grads.get(k).map(Tensor::dtype)
            ));
        }
    }
    let rw = field(o, "run_warnings", "case")?
        .as_array()
        .ok_or("run_warnings")?;
    if !rw.is_empty() {
        fails.push(format!(
            "run_warnings: the case records {} warning(s), which the checker does not model",
            rw.len()
        ));
    }
    Ok(())
}

/// [`check_model`] for [`etrace_variant`].
fn variant<M: Model>(
    model: M,
    o: &Map<String, Value>,
    algo: Algorithm,
    b: usize,
    var: Variant,
) -> R<()> {
    let e = |e: braintrace::Error| e.to_string();
    let cast = |d: TensorDict| -> R<TensorDict> {
        d.into_iter()
            .map(|(k, t)| Ok((k, t.cast(var.dtype).map_err(e)?)))
            .collect()
    };
    let loss = loss_of(o)?;
    let mut state = ModelState::new(&model, var.dtype, 0, Some(b)).map_err(e)?;
    state
        .set_params(&cast(dict(field(o, "weights", "case")?, "weights")?)?)
        .map_err(e)?;
    let init_h = cast(dict(field(o, "initial_hidden", "case")?, "initial_hidden")?)?;
    let xs = array(field(o, "xs", "case")?, "xs")?
        .cast(var.dtype)
        .map_err(e)?;
    let ys = array(field(o, "ys", "case")?, "ys")?
        .cast(var.dtype)
        .map_err(e)?;
    let x0 = xs.index_axis0(0).map_err(e)?;
    let mut learner: Learner<M> =
        compile(model, state, algo, &x0.zeros_like(), Some(b)).map_err(e)?;
    for (k, t) in &init_h {
        learner.state_mut().set_hidden(k, t).map_err(e)?;
    }
    let out = learner
        .etrace_grad(&xs, &ys, loss, Reduction::Mean)
        .map_err(e)?;
    let et = obj(field(o, "etrace", "case")?, "etrace")?;
    let want = dict(field(et, "grads", "etrace")?, "etrace.grads")?;
    let got = out
        .grads
        .into_iter()
        .map(|(k, t)| Ok((k, t.cast(DType::F64).map_err(e)?)))
        .collect::<R<TensorDict>>()?;
    GOT.set(Some((got, want)));
    Ok(())
}

fn check_graph<M: Model>(
    learner: &Learner<M>,
    o: &Map<String, Value>,
    fails: &mut Vec<String>,
) -> R<()> {
    let g = obj(field(o, "graph", "case")?, "graph")?;
    known(g, "graph", &["hidden_groups", "relations"], fails);
    let eg = learner.graph();
    let groups = field(g, "hidden_groups", "graph")?
        .as_array()
        .ok_or("hidden_groups")?;
    if groups.len() != eg.groups().len() {
        fails.push(format!(
            "graph.hidden_groups: {} groups, expected {}",
            eg.groups().len(),
            groups.len()
        ));
    }
    for (i, (want, got)) in groups.iter().zip(eg.groups()).enumerate() {
        let w = obj(want, "hidden_group")?;
        known(
            w,
            "hidden_group",
            &["index", "hidden_paths", "varshape", "num_state"],
            fails,
        );
        let paths: Vec<String> = serde_json::from_value(field(w, "hidden_paths", "group")?.clone())
            .map_err(|e| e.to_string())?;
        let varshape: Vec<usize> = serde_json::from_value(field(w, "varshape", "group")?.clone())
            .map_err(|e| e.to_string())?;
        let ns = usize_of(field(w, "num_state", "group")?, "num_state")?;
        let idx = usize_of(field(w, "index", "group")?, "index")?;
        if idx != got.index
            || paths != got.hidden_paths
            || varshape != got.varshape
            || ns != got.num_state()
        {
            fails.push(format!(
                "graph.hidden_groups[{i}]: got index {} {:?} {:?} S={}, expected index {idx} {paths:?} {varshape:?} S={ns}",
                got.index, got.hidden_paths, got.varshape, got.num_state()
            ));
        }
    }
    let rels = field(g, "relations", "graph")?
        .as_array()
        .ok_or("relations")?;
    if rels.len() != eg.relations().len() {
        fails.push(format!(
            "graph.relations: {} relations, expected {}",
            eg.relations().len(),
            rels.len()
        ));
    }
    for (i, (want, got)) in rels.iter().zip(eg.relations()).enumerate() {
        let w = obj(want, "relation")?;
        known(
            w,
            "relation",
            &["primitive", "trainable", "hidden_groups"],
            fails,
        );
        let prim = str_of(field(w, "primitive", "relation")?, "primitive")?;
        let mut trainable: Vec<(String, String)> =
            obj(field(w, "trainable", "relation")?, "trainable")?
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect();
        trainable.sort();
        let mut got_t = got.trainable_paths();
        got_t.sort();
        let hg: Vec<usize> = serde_json::from_value(field(w, "hidden_groups", "relation")?.clone())
            .map_err(|e| e.to_string())?;
        if prim != got.primitive.name() || trainable != got_t || hg != got.groups {
            fails.push(format!(
                "graph.relations[{i}]: got {} {got_t:?} {:?}, expected {prim} {trainable:?} {hg:?}",
                got.primitive.name(),
                got.groups
            ));
        }
    }
    let mut want_kinds: Vec<String> = field(o, "compile_warnings", "case")?
        .as_array()
        .ok_or("compile_warnings")?
        .iter()
        .filter(|w| !is_skipped_warning(w.as_str().unwrap_or_default()))
        .map(|w| warning_kind(w.as_str().unwrap_or_default()).map(|k| format!("{k:?}")))
        .collect::<R<_>>()?;
    let mut got_kinds: Vec<String> = eg
        .diagnostics()
        .iter()
        .filter(|d| d.level == Level::Warning)
        .map(|d| format!("{:?}", d.kind))
        .collect();
    want_kinds.sort();
    got_kinds.sort();
    if want_kinds != got_kinds {
        fails.push(format!(
            "compile_warnings: got kinds {got_kinds:?}, expected {want_kinds:?}"
        ));
    }
    Ok(())
}
