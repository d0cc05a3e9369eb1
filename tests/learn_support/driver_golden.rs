//! The sequence driver's golden cases (`tests/golden_driver`, written by
//! `scripts/golden_gen/generate_driver.py` with braintrace 0.2.6): each
//! case's model, weights and driver call rebuilt here, every recorded
//! value compared (`|got − want| ≤ 1e-9·(1 + |want|)`). Unknown fields are
//! failures.

use super::e2e::{array, compare};
use super::models::{GruNet, LifNet};
use super::{dims_and_hyperparams, get, known, mse};
use braintrace::learn::{
    compile, Algorithm, DRtrl, EtraceOpts, EvolveOpts, Model, ModelState, NonTemporal, PpProp,
    Reduction, TensorDict, VjpMethod,
};
use braintrace::{DType, Result as BtResult, Tensor};
use serde_json::{Map, Value};

type R<T> = std::result::Result<T, String>;

/// Check one case file; the failures.
pub fn check(file: &str, v: &Value) -> Vec<String> {
    let mut fails = Vec::new();
    if let Err(e) = run(v, &mut fails) {
        fails.push(e);
    }
    fails.into_iter().map(|f| format!("{file}: {f}")).collect()
}

fn run(v: &Value, fails: &mut Vec<String>) -> R<()> {
    let o = v.as_object().ok_or("not an object")?;
    known(
        o,
        "case",
        &[
            "kind",
            "case_id",
            "model",
            "dims",
            "hyperparams",
            "algorithm",
            "algorithm_options",
            "driver",
            "weights",
            "xs",
            "ys",
            "zs",
            "expect",
            "generator",
        ],
        fails,
    );
    let ((n_in, n_rec, n_out, b), h) = dims_and_hyperparams(o)?;
    let opts = get(o, "algorithm_options")?
        .as_object()
        .ok_or("algorithm_options")?;
    known(
        opts,
        "algorithm_options",
        &["decay_or_rank", "vjp_method"],
        fails,
    );
    let vjp = match opts.get("vjp_method").and_then(Value::as_str) {
        None => VjpMethod::SingleStep,
        Some("multi-step") => VjpMethod::MultiStep,
        Some(m) => return Err(format!("vjp_method {m}")),
    };
    // braintrace gives parameters without a relation zeros.
    let algo: Algorithm = match get(o, "algorithm")?.as_str() {
        Some("D_RTRL") => DRtrl::default()
            .vjp_method(vjp)
            .non_temporal(NonTemporal::Zero)
            .into(),
        Some("pp_prop") => {
            let decay = get(opts, "decay_or_rank")?
                .as_f64()
                .ok_or("decay_or_rank")?;
            PpProp::new(decay)
                .map_err(|e| e.to_string())?
                .vjp_method(vjp)
                .non_temporal(NonTemporal::Zero)
                .into()
        }
        other => return Err(format!("algorithm {other:?}")),
    };
    match get(o, "model")?.as_str() {
        Some("gru") => check_model(GruNet::new(n_in, n_rec, n_out), o, algo, b, fails),
        Some("lif") => check_model(
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
        other => Err(format!("model {other:?}")),
    }
}

fn check_model<M: Model>(
    model: M,
    o: &Map<String, Value>,
    algo: Algorithm,
    b: usize,
    fails: &mut Vec<String>,
) -> R<()> {
    let e = |e: braintrace::Error| e.to_string();
    let mut state = ModelState::new(&model, DType::F64, 0, Some(b)).map_err(e)?;
    let weights: TensorDict = get(o, "weights")?
        .as_object()
        .ok_or("weights")?
        .iter()
        .map(|(k, a)| Ok((k.clone(), array(a, k)?)))
        .collect::<R<_>>()?;
    state.set_params(&weights).map_err(e)?;
    let (mut xs, mut ys, zs) = (
        array(get(o, "xs")?, "xs")?,
        array(get(o, "ys")?, "ys")?,
        array(get(o, "zs")?, "zs")?,
    );
    let x0 = Tensor::zeros(&xs.shape()[1..], DType::F64);
    let mut l = compile(model, state, algo, &x0, Some(b)).map_err(e)?;
    let drv = get(o, "driver")?.as_object().ok_or("driver")?;
    known(
        drv,
        "driver",
        &["mask", "reduction", "evolve", "chunk", "aux2"],
        fails,
    );
    let ex = get(o, "expect")?.as_object().ok_or("expect")?;
    known(
        ex,
        "expect",
        &[
            "grads",
            "losses",
            "running_index",
            "masked",
            "scalar",
            "evolve_outputs",
            "aux",
        ],
        fails,
    );
    let mut opts = EtraceOpts::new();
    if let Some(n) = drv.get("evolve").and_then(Value::as_u64) {
        let n = n as usize;
        let outs = l
            .evolve(
                &xs.slice_axis(0, 0, n).map_err(e)?,
                &EvolveOpts::new().outputs(true),
            )
            .map_err(e)?
            .ok_or("evolve returned no outputs")?;
        compare(
            "evolve_outputs",
            &outs,
            &array(get(ex, "evolve_outputs")?, "evolve_outputs")?,
            fails,
        );
        let t = xs.shape()[0];
        xs = xs.slice_axis(0, n, t).map_err(e)?;
        ys = ys.slice_axis(0, n, t).map_err(e)?;
    }
    if let Some(m) = drv.get("mask").and_then(Value::as_array) {
        let m: Vec<f64> = m.iter().map(|v| v.as_f64().unwrap_or(f64::NAN)).collect();
        let n = m.len();
        opts = opts.mask(&Tensor::from_vec(m, &[n]).map_err(e)?);
    }
    match drv.get("reduction").and_then(Value::as_str) {
        None | Some("mean") => {}
        Some("sum") => opts = opts.reduction(Reduction::Sum),
        Some(r) => return Err(format!("reduction {r}")),
    }
    if let Some(k) = drv.get("chunk").and_then(Value::as_u64) {
        opts = opts.chunk_size(k as usize);
    }
    let out = if drv.get("aux2").and_then(Value::as_bool) == Some(true) {
        let loss = |o: &Tensor, y: &[Tensor]| -> BtResult<(Tensor, Vec<Tensor>)> {
            let l = mse(o, &y[0])?.add(&o.mul(&y[1])?.mean_all()?)?;
            Ok((l, vec![o.mean_all()?, y[1].sum_all()?]))
        };
        let out = l
            .etrace_grad_with(&xs, &[ys.clone(), zs.clone()], loss, &opts)
            .map_err(e)?;
        let want = get(ex, "aux")?.as_array().ok_or("aux")?;
        if want.len() != out.aux.len() {
            fails.push(format!(
                "aux: {} values, want {}",
                out.aux.len(),
                want.len()
            ));
        }
        for (i, (g, w)) in out.aux.iter().zip(want).enumerate() {
            compare(&format!("aux[{i}]"), g, &array(w, "aux")?, fails);
        }
        out
    } else {
        l.etrace_grad_with(&xs, std::slice::from_ref(&ys), |o, y| mse(o, &y[0]), &opts)
            .map_err(e)?
    };
    for (k, w) in get(ex, "grads")?.as_object().ok_or("grads")? {
        match out.grads.get(k) {
            Some(g) => compare(&format!("grads.{k}"), g, &array(w, k)?, fails),
            None => fails.push(format!("grads: no `{k}`")),
        }
    }
    compare(
        "losses",
        &out.losses,
        &array(get(ex, "losses")?, "losses")?,
        fails,
    );
    if let Some(m) = ex.get("masked") {
        compare("masked", &out.masked, &array(m, "masked")?, fails);
    }
    if let Some(s) = ex.get("scalar").and_then(Value::as_f64) {
        if (out.objective - s).abs() > 1e-9 * (1.0 + s.abs()) {
            fails.push(format!("scalar: {} vs {s}", out.objective));
        }
    }
    let ri = get(ex, "running_index")?.as_u64().ok_or("running_index")? as usize;
    if l.running_index() != ri {
        fails.push(format!("running_index {} vs {ri}", l.running_index()));
    }
    Ok(())
}
