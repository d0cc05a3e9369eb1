//! Golden tests of the grouped-matmul (`etp_gmm`, `etp_gmv`) and embedding
//! (`etp_emb`, `etp_emb_v`) primitives and of the `GroupedLinear` and
//! `Embedding` layers, against `tests/golden_gprims` (recorded from
//! braintrace 0.2.6 by `scripts/golden_gen/generate_gprims.py`).
//!
//! * `prim__*` cases: the forward, JVP and VJP in the trainables, and
//!   braintrace's own rules (`dt_to_t` = `yw_to_w`, `xy_to_dw` for a batch,
//!   for one sample and, for the embedding, for a float input trace; the
//!   initialisers' shapes; the embedding's input representation) against
//!   ours, to 1e-9 in f64. Our JVP is also checked against central finite
//!   differences, and the VJP against the JVP (`⟨ct, J t⟩ = ⟨Jᵀ ct, t⟩`).
//!   The embedding's indices are given to our primitive one-hot encoded by
//!   `prims::embedding::one_hot_indices`, which is checked against
//!   braintrace's `pp_x_repr`.
//! * `e2e__gp_*` cases: two nets (`tests/learn_support/gprims.rs`), D-RTRL
//!   and pp_prop, single- and multi-step, batch 1 and 2, through the e2e
//!   checker (`tests/learn_support/e2e.rs`, `NonTemporal::Zero`), to 1e-9.
//!
//! Each kind has a can-fail check: a perturbed weight or a dropped
//! transform must make the comparison fail.

mod learn_support;

use braintrace::etp::{AvalMap, ElemFn, EtpPrimitive, Params, TensorMap};
use braintrace::prims::embedding::one_hot_indices;
use braintrace::prims::{etp_emb, etp_emb_v, etp_gmm, etp_gmv};
use braintrace::{jvp, vjp, DType, Tensor};
use learn_support::e2e::array;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

type R<T> = std::result::Result<T, String>;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden_gprims")
}

fn files(prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("tests/golden_gprims")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".json"))
        .collect();
    names.sort();
    names
}

fn load(name: &str) -> Value {
    let t = std::fs::read_to_string(dir().join(name)).expect("readable case");
    serde_json::from_str(&t).expect("json case")
}

fn obj<'a>(v: &'a Value, what: &str) -> R<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| format!("{what}: not an object"))
}

fn get<'a>(o: &'a Map<String, Value>, k: &str) -> R<&'a Value> {
    o.get(k).ok_or_else(|| format!("missing `{k}`"))
}

fn tree(v: &Value, what: &str) -> R<TensorMap> {
    obj(v, what)?
        .iter()
        .map(|(k, a)| Ok((k.clone(), array(a, &format!("{what}.{k}"))?)))
        .collect()
}

/// `|got - want| <= 1e-9 (1 + max|want|)` element-wise, same shape.
fn close(what: &str, got: &Tensor, want: &Tensor, fails: &mut Vec<String>) {
    if got.shape() != want.shape() {
        fails.push(format!(
            "{what}: shape {:?}, expected {:?}",
            got.shape(),
            want.shape()
        ));
        return;
    }
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let dev = g
        .iter()
        .zip(&w)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    if dev.is_nan() || dev > 1e-9 * (1.0 + scale) {
        fails.push(format!("{what}: deviates by {dev:.3e}"));
    }
}

fn close_map(what: &str, got: &TensorMap, want: &TensorMap, fails: &mut Vec<String>) {
    let (gk, wk): (Vec<_>, Vec<_>) = (got.keys().collect(), want.keys().collect());
    if gk != wk {
        fails.push(format!("{what}: keys {gk:?}, expected {wk:?}"));
        return;
    }
    for (k, w) in want {
        close(&format!("{what}.{k}"), &got[k], w, fails);
    }
}

fn elem_fn(v: &Value) -> R<Option<ElemFn>> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => ElemFn::builtin(s)
            .map(Some)
            .ok_or_else(|| format!("unknown function {s}")),
        other => Err(format!("bad function {other}")),
    }
}

/// One primitive case: the primitive, its params, `x` as our primitive
/// takes it, and the trainables in operand order.
struct Prim {
    p: EtpPrimitive,
    params: Params,
    x: Tensor,
    weights: TensorMap,
    /// Operand order of the trainables.
    order: Vec<&'static str>,
}

impl Prim {
    fn from_case(o: &Map<String, Value>) -> R<Prim> {
        let e = |e: braintrace::Error| e.to_string();
        let prm = obj(get(o, "params")?, "params")?;
        let wf = elem_fn(get(prm, "weight_fn")?)?;
        let bf = elem_fn(get(prm, "bias_fn")?)?;
        let has_bias = get(prm, "has_bias")?.as_bool().unwrap_or(false);
        let weights = tree(get(o, "weights")?, "weights")?;
        let name = get(o, "primitive")?.as_str().unwrap_or_default();
        let gparams = etp_gmm::Params {
            has_bias,
            weight_fn: wf.clone(),
            bias_fn: bf,
        }
        .to_params();
        let eparams = etp_emb::Params { weight_fn: wf }.to_params();
        let (p, params) = match name {
            "etp_gmm" => (etp_gmm::primitive(), gparams),
            "etp_gmv" => (etp_gmv::primitive(), gparams),
            "etp_emb" => (etp_emb::primitive(), eparams),
            "etp_emb_v" => (etp_emb_v::primitive(), eparams),
            other => return Err(format!("unknown primitive {other}")),
        };
        let x = if name.starts_with("etp_emb") {
            let idx: Vec<i64> = match get(o, "indices")? {
                Value::Array(l) => l.iter().map(|v| v.as_i64().unwrap_or(-1)).collect(),
                v => vec![v.as_i64().unwrap_or(-1)],
            };
            let shape: Vec<usize> = if get(o, "indices")?.is_array() {
                vec![idx.len()]
            } else {
                vec![]
            };
            let t = Tensor::from_vec_typed(idx, &shape).map_err(e)?;
            let v = weights["weight"].shape()[0];
            one_hot_indices("golden", &t, v, DType::F64).map_err(e)?
        } else {
            array(get(o, "x")?, "x")?
        };
        let order = if weights.contains_key("bias") {
            vec!["weight", "bias"]
        } else {
            vec!["weight"]
        };
        Ok(Prim {
            p,
            params,
            x,
            weights,
            order,
        })
    }
    fn args(&self, ws: &[Tensor]) -> Vec<Tensor> {
        std::iter::once(self.x.clone())
            .chain(ws.iter().cloned())
            .collect()
    }
    fn wvec(&self) -> Vec<Tensor> {
        self.order
            .iter()
            .map(|k| self.weights[*k].clone())
            .collect()
    }
    fn to_map(&self, v: Vec<Tensor>) -> TensorMap {
        self.order.iter().map(|k| k.to_string()).zip(v).collect()
    }
    fn bind(&self, ws: &[Tensor]) -> braintrace::Result<Tensor> {
        self.p.bind(&self.args(ws), &self.params)
    }
}

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    a.iter().zip(&b).map(|(x, y)| x * y).sum()
}

/// Check one primitive case; returns the failures.
fn check_prim(name: &str, v: &Value, tamper: impl Fn(&mut Prim)) -> R<Vec<String>> {
    let e = |e: braintrace::Error| e.to_string();
    let o = obj(v, name)?;
    let mut pc = Prim::from_case(o)?;
    tamper(&mut pc);
    let mut fails = Vec::new();
    let ws = pc.wvec();
    let y = pc.bind(&ws).map_err(e)?;
    close("y", &y, &array(get(o, "y")?, "y")?, &mut fails);

    // JVP and VJP in the trainables.
    let jv = obj(get(o, "jvp")?, "jvp")?;
    let tang = tree(get(jv, "tangents")?, "tangents")?;
    let tv: Vec<Tensor> = pc.order.iter().map(|k| tang[*k].clone()).collect();
    let f = |w: &[Tensor]| Ok(vec![pc.bind(w)?]);
    let (_, ydot) = jvp(f, &ws, &tv).map_err(e)?;
    close(
        "jvp",
        &ydot[0],
        &array(get(jv, "y_dot")?, "y_dot")?,
        &mut fails,
    );
    let vj = obj(get(o, "vjp")?, "vjp")?;
    let ct = array(get(vj, "cotangent")?, "cotangent")?;
    let (_, pb) = vjp(f, &ws).map_err(e)?;
    let g = pc.to_map(pb.apply(std::slice::from_ref(&ct)).map_err(e)?);
    close_map("vjp", &g, &tree(get(vj, "grads")?, "grads")?, &mut fails);
    // The JVP against central differences, the VJP against the JVP.
    let eps = 1e-6;
    let shifted = |s: f64| -> braintrace::Result<Tensor> {
        let w: Vec<Tensor> = ws
            .iter()
            .zip(&tv)
            .map(|(w, t)| w.add(&t.mul_scalar(s)?))
            .collect::<braintrace::Result<_>>()?;
        pc.bind(&w)
    };
    let fd = shifted(eps)
        .map_err(e)?
        .sub(&shifted(-eps).map_err(e)?)
        .map_err(e)?
        .mul_scalar(0.5 / eps)
        .map_err(e)?;
    let dev = ydot[0]
        .sub(&fd)
        .map_err(e)?
        .to_vec_f64()
        .map_err(e)?
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs()));
    if dev.is_nan() || dev > 1e-6 {
        fails.push(format!("jvp vs finite differences: {dev:.3e}"));
    }
    let lhs = dot(&ct, &ydot[0]);
    let rhs: f64 = pc.order.iter().map(|k| dot(&g[*k], &tang[*k])).sum();
    if (lhs - rhs).abs() > 1e-10 * (1.0 + lhs.abs()) {
        fails.push(format!("<ct, J t> = {lhs} but <J^T ct, t> = {rhs}"));
    }

    // braintrace's rules.
    let dt = obj(get(o, "dt_to_t")?, "dt_to_t")?;
    let got =
        pc.p.yw_to_w(
            &array(get(dt, "hidden")?, "hidden")?,
            &tree(get(dt, "trace")?, "trace")?,
            &pc.params,
        )
        .map_err(e)?;
    close_map("dt_to_t", &got, &tree(get(dt, "out")?, "out")?, &mut fails);
    let xy = obj(get(o, "xy_to_dw")?, "xy_to_dw")?;
    let got =
        pc.p.xy_to_dw(
            Some(&pc.x),
            &array(get(xy, "hidden")?, "hidden")?,
            &pc.weights,
            &pc.params,
        )
        .map_err(e)?;
    close_map("xy_to_dw", &got, &tree(get(xy, "out")?, "out")?, &mut fails);
    if let Some(s) = o.get("xy_to_dw_sample") {
        let s = obj(s, "xy_to_dw_sample")?;
        let got =
            pc.p.xy_to_dw(
                Some(&pc.x.index_axis0(0).map_err(e)?),
                &array(get(s, "hidden")?, "hidden")?,
                &pc.weights,
                &pc.params,
            )
            .map_err(e)?;
        close_map(
            "xy_to_dw (one sample)",
            &got,
            &tree(get(s, "out")?, "out")?,
            &mut fails,
        );
    }
    if let Some(s) = o.get("xy_to_dw_float_x") {
        let s = obj(s, "xy_to_dw_float_x")?;
        let got =
            pc.p.xy_to_dw(
                Some(&array(get(s, "x")?, "x")?),
                &array(get(s, "hidden")?, "hidden")?,
                &pc.weights,
                &pc.params,
            )
            .map_err(e)?;
        close_map(
            "xy_to_dw (float x)",
            &got,
            &tree(get(s, "out")?, "out")?,
            &mut fails,
        );
    }
    if let Some(r) = o.get("pp_x_repr") {
        close("pp_x_repr", &pc.x, &array(r, "pp_x_repr")?, &mut fails);
    }
    let wav: AvalMap = pc
        .weights
        .iter()
        .map(|(k, t)| (k.clone(), t.aval()))
        .collect();
    let init =
        pc.p.init_drtrl(Some(&pc.x.aval()), &y.aval(), &wav, 2, &pc.params)
            .map_err(e)?;
    let got: BTreeMap<String, Vec<usize>> = init
        .iter()
        .map(|(k, t)| (k.clone(), t.shape().to_vec()))
        .collect();
    let want: BTreeMap<String, Vec<usize>> =
        serde_json::from_value(get(o, "init_drtrl_shapes")?.clone()).map_err(|e| e.to_string())?;
    if got != want {
        fails.push(format!("init_drtrl shapes {got:?}, expected {want:?}"));
    }
    let pp =
        pc.p.init_pp(Some(&pc.x.aval()), &y.aval(), &wav, 2, &pc.params)
            .map_err(e)?;
    let want: Vec<usize> =
        serde_json::from_value(get(o, "init_pp_shape")?.clone()).map_err(|e| e.to_string())?;
    if pp.shape() != want.as_slice() {
        fails.push(format!("init_pp shape {:?}, expected {want:?}", pp.shape()));
    }
    Ok(fails)
}

#[test]
fn golden_gprims_primitives() {
    let names = files("prim__");
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for name in &names {
        let v = load(name);
        let prim = v["primitive"].as_str().unwrap_or_default().to_string();
        *per.entry(prim).or_default() += 1;
        match check_prim(name, &v, |_| {}) {
            Ok(f) => failures.extend(f.into_iter().map(|f| format!("{name}: {f}"))),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    println!("golden gprims: {} primitive cases {per:?}", names.len());
    for p in ["etp_gmm", "etp_gmv", "etp_emb", "etp_emb_v"] {
        assert!(per.contains_key(p), "no case of {p}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The primitive check can fail: a perturbed weight breaks the forward and
/// `xy_to_dw` (through `f'(W)`), a dropped weight transform the forward and
/// the VJP.
#[test]
fn golden_gprims_primitives_can_fail() {
    for name in [
        "prim__etp_gmm__tanh_softplus.json",
        "prim__etp_emb__tanh.json",
    ] {
        let v = load(name);
        let f = check_prim(name, &v, |p| {
            let w = p.weights["weight"].clone();
            let bumped = w.add(&w.ones_like().mul_scalar(1e-6).unwrap()).unwrap();
            p.weights.insert("weight".into(), bumped);
        })
        .unwrap();
        assert!(f.iter().any(|f| f.starts_with("y:")), "{name}: {f:?}");
        assert!(f.iter().any(|f| f.starts_with("xy_to_dw")), "{name}: {f:?}");
        let f = check_prim(name, &v, |p| {
            p.params = if p.p.name().starts_with("etp_emb") {
                etp_emb::Params { weight_fn: None }.to_params()
            } else {
                etp_gmm::Params {
                    has_bias: true,
                    weight_fn: None,
                    bias_fn: ElemFn::builtin("softplus"),
                }
                .to_params()
            };
        })
        .unwrap();
        assert!(f.iter().any(|f| f.starts_with("y:")), "{name}: {f:?}");
        assert!(f.iter().any(|f| f.starts_with("vjp")), "{name}: {f:?}");
    }
}

#[test]
fn golden_gprims_e2e() {
    let names = files("e2e__gp_");
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for name in &names {
        let net = name["e2e__gp_".len()..].split("__").next().unwrap_or("");
        *per.entry(net.to_string()).or_default() += 1;
    }
    println!("golden gprims: {} e2e cases {per:?}", names.len());
    for net in ["grouped", "emb"] {
        assert!(
            per.get(net).copied().unwrap_or(0) >= 6,
            "fewer than 6 cases for `{net}`"
        );
    }
    let failures = learn_support::e2e::check_files(&dir(), &names, &Default::default());
    assert!(
        failures.is_empty(),
        "golden gprims:\n{}",
        failures.join("\n")
    );
}

/// The e2e check can fail: one weight entry moved by 1e-6 changes the
/// recorded gradients and losses beyond 1e-9.
#[test]
fn golden_gprims_e2e_can_fail() {
    for name in ["e2e__gp_grouped__d_rtrl.json", "e2e__gp_emb__pp_prop.json"] {
        let mut v = load(name);
        let data = &mut v["weights"]["rec/weight/weight"]["data"];
        let mut first = &mut *data;
        while first.is_array() {
            first = &mut first[0];
        }
        *first = Value::from(first.as_f64().unwrap() + 1e-6);
        let f = learn_support::e2e::check_e2e(name, &v);
        assert!(
            f.iter().any(|f| f.contains("etrace.grads")),
            "{name}: {f:?}"
        );
    }
}

/// Bad input reaching a compiled learner: a token outside `[0, V)` (or not
/// an integer) is an error naming the layer, the token and the table
/// size, under D-RTRL and pp_prop, and the learner's hidden states,
/// traces and step counter stay as they were.
#[test]
fn embedding_learner_refuses_bad_tokens() {
    use braintrace::learn::{compile, Algorithm, DRtrl, ModelState, PpProp};
    let algos: [Algorithm; 2] = [DRtrl::default().into(), PpProp::new(0.9).unwrap().into()];
    for algo in algos {
        let net = learn_support::gprims::EmbNet::new(5, 3, 2).unwrap();
        let state = ModelState::new(&net, DType::F64, 0, Some(2)).unwrap();
        let x0 = Tensor::zeros(&[2], DType::F64);
        let mut l = compile(net, state, algo, &x0, Some(2)).unwrap();
        // The embedding declares the dense trace kernel: both relations fused.
        let ex = l.explain();
        assert!(ex.contains(": 2 of 2 relation-group pairs"), "{ex}");
        l.update(&Tensor::from_vec(vec![1.0, 4.0], &[2]).unwrap())
            .unwrap();
        let (h, tr, n) = (
            l.state().hidden_values().to_vec(),
            l.traces(),
            l.running_index(),
        );
        for bad in [5.0, -1.0, 2.5] {
            let e = l
                .update(&Tensor::from_vec(vec![1.0, bad], &[2]).unwrap())
                .unwrap_err()
                .to_string();
            println!("token {bad}: {e}");
            assert!(
                e.contains("Embedding `emb`")
                    && e.contains(&format!("index {bad}"))
                    && e.contains("[0, 5)"),
                "{e}"
            );
            assert_eq!(l.running_index(), n);
            for (a, b) in l.state().hidden_values().iter().zip(&h) {
                assert_eq!(a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
            }
            for (a, b) in l.traces().iter().zip(&tr) {
                assert_eq!(a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
            }
        }
    }
}

/// Bad sizes: a group count that does not divide the features, size 0,
/// and an input of the wrong groups, each an error naming the layer, the
/// argument and the value.
#[test]
fn layer_sizes_are_checked() {
    use braintrace::nn::{Embedding, GroupedLinear};
    let e = GroupedLinear::from_features("rec", 3, 6, 8)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("GroupedLinear `rec`") && e.contains("total_out = 8"),
        "{e}"
    );
    let e = GroupedLinear::new("rec", 2, 0, 3).unwrap_err().to_string();
    assert!(
        e.contains("GroupedLinear `rec`") && e.contains("in_features"),
        "{e}"
    );
    let e = Embedding::new("emb", 0, 3).unwrap_err().to_string();
    assert!(
        e.contains("Embedding `emb`") && e.contains("num_embeddings"),
        "{e}"
    );
    let e = braintrace::prims::embedding(
        &Tensor::from_vec(vec![7.0], &[1]).unwrap(),
        &Tensor::zeros(&[4, 2], DType::F64),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("index 7") && e.contains("[0, 4)"), "{e}");
}

/// The embedding's declared dense kernel (fused D-RTRL and pp_prop paths)
/// gives the rule path's gradients: each `gp_emb` golden case's data run
/// with fast paths off and on, to 1e-12.
#[test]
fn embedding_fused_paths_equal_the_rule_path() {
    use braintrace::learn::{compile, Algorithm, DRtrl, ModelState, PpProp, Reduction};
    use learn_support::gprims::EmbNet;
    let v = load("e2e__gp_emb__d_rtrl.json");
    let w: TensorMap = tree(&v["weights"], "weights").unwrap();
    let xs = array(&v["xs"], "xs").unwrap();
    let ys = array(&v["ys"], "ys").unwrap();
    type Make = fn(bool) -> Algorithm;
    let algos: [Make; 2] = [
        |f| DRtrl::default().fast_paths(f).into(),
        |f| PpProp::new(0.9).unwrap().fast_paths(f).into(),
    ];
    for make in algos {
        let run = |fast: bool| {
            let net = EmbNet::new(5, 3, 2).unwrap();
            let mut state = ModelState::new(&net, DType::F64, 0, Some(2)).unwrap();
            state.set_params(&w).unwrap();
            let x0 = xs.index_axis0(0).unwrap();
            let mut l = compile(net, state, make(fast), &x0, Some(2)).unwrap();
            let want = if fast { "2 of 2" } else { "0 of 2" };
            assert!(l.explain().contains(want), "{}", l.explain());
            l.etrace_grad(&xs, &ys, learn_support::mse, Reduction::Mean)
                .unwrap()
                .grads
        };
        let (slow, fast) = (run(false), run(true));
        for (k, a) in &slow {
            let (a, b) = (a.to_vec_f64().unwrap(), fast[k].to_vec_f64().unwrap());
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-12 * (1.0 + x.abs()), "{k}: {x} vs {y}");
            }
        }
        assert!(slow["emb/weight"]
            .to_vec_f64()
            .unwrap()
            .iter()
            .any(|&g| g != 0.0));
    }
}
