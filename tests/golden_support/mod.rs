//! The golden-vector harness: reads the per-primitive case files recorded
//! from the reference library (schema in `tests/golden/README.md`) and
//! checks a registered ETP primitive against them: forward, JVP, VJP, vmap
//! (values and identity preservation) and every rule entry.
//!
//! Every check records a [`Failure`] instead of panicking, so one run shows
//! everything; a field the harness does not know how to check is a failure
//! too (never a silent skip).

#![allow(dead_code)]

use braintrace::etp::{
    as_etp_eqn, decomposition_warnings, lookup_primitive, AvalMap, EtpPrimitive, ParamValue,
    Params, TensorMap, ETP_RULES_INSTANT_DRTRL, ETP_RULES_SOLVE_DRTRL,
};
use braintrace::{make_graph, stack, vmap, vmap_out, Aval, DType, Tensor};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// Relative tolerance: `|got - want| <= RTOL * (1 + |want|)` elementwise.
pub const RTOL: f64 = 1e-10;

/// How many mismatching elements a single comparison lists.
const MAX_LISTED: usize = 3;

type R<T> = std::result::Result<T, String>;

/// Resolves a primitive name from a case file to a registered primitive.
pub type Resolver<'a> = &'a dyn Fn(&str) -> braintrace::Result<EtpPrimitive>;

/// The default resolver: the global registry.
pub fn registry_lookup(name: &str) -> braintrace::Result<EtpPrimitive> {
    lookup_primitive(name)
}

/// One failed check.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The case file.
    pub file: String,
    /// The entry, e.g. `forward.output` or `rules.by_num_hidden_state[1].init_pp`.
    pub entry: String,
    /// What went wrong.
    pub msg: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.file, self.entry, self.msg)
    }
}

/// The outcome of one case file.
#[derive(Debug, Default)]
pub struct CaseReport {
    /// The file name.
    pub file: String,
    /// Number of comparisons / structural checks made.
    pub checks: usize,
    /// Failures, in check order.
    pub failures: Vec<Failure>,
}

impl CaseReport {
    /// Failures whose entry starts with `prefix`.
    pub fn failures_in(&self, prefix: &str) -> Vec<&Failure> {
        self.failures
            .iter()
            .filter(|f| f.entry.starts_with(prefix))
            .collect()
    }
    /// One summary line.
    pub fn summary(&self) -> String {
        if self.failures.is_empty() {
            format!("golden: {}: ok ({} checks)", self.file, self.checks)
        } else {
            let mut entries: Vec<&str> = Vec::new();
            for f in &self.failures {
                if !entries.contains(&f.entry.as_str()) {
                    entries.push(&f.entry);
                }
            }
            format!(
                "golden: {}: FAIL ({} failures in {} checks; entries: {})",
                self.file,
                self.failures.len(),
                self.checks,
                entries.join(", ")
            )
        }
    }
}

struct Ctx {
    file: String,
    checks: usize,
    failures: Vec<Failure>,
}

impl Ctx {
    fn fail(&mut self, entry: &str, msg: impl Into<String>) {
        self.failures.push(Failure {
            file: self.file.clone(),
            entry: entry.to_string(),
            msg: msg.into(),
        });
    }

    /// Run one entry's check; an `Err` or a panic becomes a failure of that entry.
    fn run(&mut self, entry: &str, f: impl FnOnce(&mut Ctx) -> R<()>) {
        let r = catch_unwind(AssertUnwindSafe(|| f(self)));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail(entry, e),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "<non-string panic>".into());
                self.fail(entry, format!("panicked: {msg}"));
            }
        }
    }

    /// Fail for every key of `obj` outside `known`.
    fn known_keys(&mut self, entry: &str, obj: &Map<String, Value>, known: &[&str]) {
        for k in obj.keys() {
            if !known.contains(&k.as_str()) {
                self.fail(
                    entry,
                    format!("unknown field `{k}`: the harness does not know how to check it"),
                );
            }
        }
    }

    /// Compare one tensor with its expected value.
    fn compare(&mut self, entry: &str, leaf: &str, got: &Tensor, want: &Tensor) {
        self.checks += 1;
        let leaf_s = if leaf.is_empty() {
            String::new()
        } else {
            format!("leaf `{leaf}`: ")
        };
        if got.shape() != want.shape() {
            self.fail(
                entry,
                format!(
                    "{leaf_s}shape mismatch: got {:?}, want {:?}",
                    got.shape(),
                    want.shape()
                ),
            );
            return;
        }
        if got.dtype() != DType::F64 {
            self.fail(
                entry,
                format!("{leaf_s}dtype mismatch: got {}, want f64", got.dtype()),
            );
            return;
        }
        let g = match got.to_vec_f64() {
            Ok(g) => g,
            Err(e) => {
                self.fail(entry, format!("{leaf_s}cannot read the result: {e}"));
                return;
            }
        };
        let w = want.to_vec_f64().expect("expected values are concrete");
        let mut bad = Vec::new();
        let mut n_bad = 0usize;
        let mut max_err = 0.0f64;
        for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
            if !close(a, b) {
                n_bad += 1;
                let err = (a - b).abs();
                max_err = if err.is_nan() || max_err.is_nan() {
                    f64::NAN
                } else {
                    max_err.max(err)
                };
                if bad.len() < MAX_LISTED {
                    bad.push(format!(
                        "index {:?}: got {a:e}, want {b:e}",
                        unravel(i, want.shape())
                    ));
                }
            }
        }
        if n_bad > 0 {
            self.fail(
                entry,
                format!(
                    "{leaf_s}{n_bad} of {} elements differ (max abs err {max_err:e}, rtol {RTOL:e}); {}{}",
                    w.len(),
                    bad.join("; "),
                    if n_bad > MAX_LISTED { "; ..." } else { "" }
                ),
            );
        }
    }

    /// Compare two trees (same keys, each leaf close).
    fn compare_map(&mut self, entry: &str, got: &TensorMap, want: &TensorMap) {
        let gk: BTreeSet<&String> = got.keys().collect();
        let wk: BTreeSet<&String> = want.keys().collect();
        if gk != wk {
            self.checks += 1;
            self.fail(entry, format!("keys differ: got {gk:?}, want {wk:?}"));
        }
        for (k, w) in want {
            if let Some(g) = got.get(k) {
                self.compare(entry, k, g, w);
            }
        }
    }

    fn check_eq<T: PartialEq + fmt::Debug>(&mut self, entry: &str, what: &str, got: T, want: T) {
        self.checks += 1;
        if got != want {
            self.fail(entry, format!("{what}: got {got:?}, want {want:?}"));
        }
    }
}

/// `|got - want| <= RTOL * (1 + |want|)` (false for NaN).
fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= RTOL * (1.0 + want.abs())
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = i % n;
            i /= n;
        }
    }
    idx
}

// ---------------------------------------------------------------- JSON -> values

fn obj<'a>(v: &'a Value, what: &str) -> R<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| format!("{what}: expected a JSON object, got {}", short(v)))
}

fn field<'a>(o: &'a Map<String, Value>, key: &str, what: &str) -> R<&'a Value> {
    o.get(key)
        .ok_or_else(|| format!("{what}: missing field `{key}`"))
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        format!("{}...", &s[..80])
    } else {
        s
    }
}

fn as_usize(v: &Value, what: &str) -> R<usize> {
    v.as_u64()
        .map(|u| u as usize)
        .ok_or_else(|| format!("{what}: expected a non-negative integer, got {}", short(v)))
}

fn as_str<'a>(v: &'a Value, what: &str) -> R<&'a str> {
    v.as_str()
        .ok_or_else(|| format!("{what}: expected a string, got {}", short(v)))
}

fn as_bool(v: &Value, what: &str) -> R<bool> {
    v.as_bool()
        .ok_or_else(|| format!("{what}: expected a bool, got {}", short(v)))
}

fn str_list(v: &Value, what: &str) -> R<Vec<String>> {
    v.as_array()
        .ok_or_else(|| format!("{what}: expected a list, got {}", short(v)))?
        .iter()
        .map(|e| as_str(e, what).map(str::to_string))
        .collect()
}

fn shape_of(v: &Value, what: &str) -> R<Vec<usize>> {
    v.as_array()
        .ok_or_else(|| format!("{what}: shape must be a list, got {}", short(v)))?
        .iter()
        .map(|d| as_usize(d, what))
        .collect()
}

/// The element type a file names.
pub fn dtype_of(name: &str) -> R<DType> {
    match name {
        "float64" => Ok(DType::F64),
        "float32" => Ok(DType::F32),
        "int64" => Ok(DType::I64),
        "bool" => Ok(DType::Bool),
        other => Err(format!("unknown dtype `{other}`")),
    }
}

fn flatten(v: &Value, shape: &[usize], out: &mut Vec<f64>, what: &str) -> R<()> {
    match shape.split_first() {
        None => out.push(
            v.as_f64()
                .ok_or_else(|| format!("{what}: expected a number, got {}", short(v)))?,
        ),
        Some((&n, rest)) => {
            let l = v
                .as_array()
                .ok_or_else(|| format!("{what}: expected a nested list, got {}", short(v)))?;
            if l.len() != n {
                return Err(format!(
                    "{what}: a nested list has {} entries where the shape says {n}",
                    l.len()
                ));
            }
            for e in l {
                flatten(e, rest, out, what)?;
            }
        }
    }
    Ok(())
}

/// An array object `{dtype, shape, data}` as an f64 tensor.
pub fn array(v: &Value, what: &str) -> R<Tensor> {
    let o = obj(v, what)?;
    for k in o.keys() {
        if !["dtype", "shape", "data"].contains(&k.as_str()) {
            return Err(format!("{what}: unknown array field `{k}`"));
        }
    }
    let dt = as_str(field(o, "dtype", what)?, what)?;
    if dtype_of(dt)? != DType::F64 {
        return Err(format!(
            "{what}: dtype `{dt}` is not supported (the harness works in float64)"
        ));
    }
    let shape = shape_of(field(o, "shape", what)?, what)?;
    let mut data = Vec::with_capacity(shape.iter().product());
    flatten(field(o, "data", what)?, &shape, &mut data, what)?;
    Tensor::from_vec(data, &shape).map_err(|e| format!("{what}: {e}"))
}

/// An array, where `null` is an error (nothing here may be absent).
fn required_array(o: &Map<String, Value>, key: &str, what: &str) -> R<Tensor> {
    let v = field(o, key, what)?;
    if v.is_null() {
        return Err(format!("{what}: `{key}` is null"));
    }
    array(v, &format!("{what}.{key}"))
}

/// A tree of arrays `{name: array}`.
pub fn tree(v: &Value, what: &str) -> R<TensorMap> {
    let o = obj(v, what)?;
    o.iter()
        .map(|(k, a)| {
            if a.is_null() {
                return Err(format!("{what}: leaf `{k}` is null"));
            }
            Ok((k.clone(), array(a, &format!("{what}.{k}"))?))
        })
        .collect()
}

/// A JSON value as a param value (generic: null, bool, int, float, string, list, map).
pub fn param_value(v: &Value) -> ParamValue {
    match v {
        Value::Null => ParamValue::None,
        Value::Bool(b) => ParamValue::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                ParamValue::Int(i)
            } else if let Some(u) = n.as_u64() {
                ParamValue::Float(u as f64)
            } else {
                ParamValue::Float(n.as_f64().expect("a JSON number"))
            }
        }
        Value::String(s) => ParamValue::Str(s.clone()),
        Value::Array(l) => ParamValue::List(l.iter().map(param_value).collect()),
        Value::Object(m) => {
            ParamValue::Map(m.iter().map(|(k, v)| (k.clone(), param_value(v))).collect())
        }
    }
}

/// The case's `params` object as `Params`.
pub fn params(v: &Value) -> R<Params> {
    let o = obj(v, "params")?;
    let mut p = Params::new();
    for (k, v) in o {
        p.insert(k, param_value(v));
    }
    Ok(p)
}

fn err(e: braintrace::Error) -> String {
    e.to_string()
}

// ---------------------------------------------------------------- folder

/// The golden folder: `BRAINTRACE_GOLDEN_DIR` when it is set (it must then
/// be a directory), otherwise the copy vendored in the repository at
/// `tests/golden` (so a fresh clone needs nothing beside it).
pub fn golden_dir() -> R<PathBuf> {
    if let Ok(d) = std::env::var("BRAINTRACE_GOLDEN_DIR") {
        let p = PathBuf::from(d);
        return if p.is_dir() {
            Ok(p)
        } else {
            Err(format!(
                "BRAINTRACE_GOLDEN_DIR={} is not a directory",
                p.display()
            ))
        };
    }
    let vendored = vendored_golden_dir();
    if vendored.is_dir() {
        Ok(vendored)
    } else {
        Err(format!(
            "no golden folder: set BRAINTRACE_GOLDEN_DIR or restore the vendored set at {}",
            vendored.display()
        ))
    }
}

/// The golden set vendored in the repository: `<root>/tests/golden`.
pub fn vendored_golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
}

// ---------------------------------------------------------------- the case

/// Top-level fields a primitive case may have.
const TOP_FIELDS: &[&str] = &[
    "schema_version",
    "kind",
    "case_id",
    "primitive",
    "batched_primitive",
    "batched_counterpart",
    "user_api",
    "user_api_jaxpr_primitives",
    "arg_names",
    "float_arg_names",
    "x_invar_index",
    "trainable_invars",
    "params",
    "inputs",
    "forward",
    "jvp",
    "vjp",
    "vmap",
    "rules",
    "warnings",
    "generator",
];

/// What a case provides to the individual checks.
struct Case<'a> {
    p: EtpPrimitive,
    params: Params,
    arg_names: Vec<String>,
    float_args: Vec<String>,
    /// Operands in `arg_names` order.
    args: Vec<Tensor>,
    /// Trainables keyed by name, from `inputs` via `trainable_invars`.
    weights: TensorMap,
    /// `x` from `inputs` (None when the primitive has none).
    x: Option<Tensor>,
    y_shape: Option<Vec<usize>>,
    root: &'a Map<String, Value>,
}

impl Case<'_> {
    fn f(&self) -> impl Fn(&[Tensor]) -> braintrace::Result<Vec<Tensor>> + '_ {
        move |a: &[Tensor]| Ok(vec![self.p.bind(a, &self.params)?])
    }
}

type SectionCheck = fn(&mut Ctx, &Case, &Value) -> R<()>;

/// Check one case file (already parsed) against the primitives `resolve` finds.
pub fn check_case(file: &str, v: &Value, resolve: Resolver) -> CaseReport {
    let mut ctx = Ctx {
        file: file.to_string(),
        checks: 0,
        failures: Vec::new(),
    };
    let mut case: Option<Case> = None;
    ctx.run("case", |ctx| {
        case = Some(prepare(ctx, file, v, resolve)?);
        Ok(())
    });
    if let Some(c) = case {
        let root = c.root;
        let sections: [(&str, SectionCheck); 5] = [
            ("forward", check_forward),
            ("jvp", check_jvp),
            ("vjp", check_vjp),
            ("vmap", check_vmap),
            ("rules", check_rules),
        ];
        for (name, f) in sections {
            match root.get(name) {
                None => ctx.fail(name, "missing required section"),
                Some(sec) => ctx.run(name, |ctx| f(ctx, &c, sec)),
            }
        }
    }
    CaseReport {
        file: file.to_string(),
        checks: ctx.checks,
        failures: ctx.failures,
    }
}

/// Parse a case from its JSON text and check it.
pub fn check_case_str(file: &str, text: &str, resolve: Resolver) -> CaseReport {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => check_case(file, &v, resolve),
        Err(e) => CaseReport {
            file: file.to_string(),
            checks: 0,
            failures: vec![Failure {
                file: file.to_string(),
                entry: "json".into(),
                msg: format!("cannot parse: {e}"),
            }],
        },
    }
}

/// The header: primitive, layout, params, operands.
fn prepare<'a>(ctx: &mut Ctx, file: &str, v: &'a Value, resolve: Resolver) -> R<Case<'a>> {
    let root = obj(v, "case")?;
    ctx.known_keys("case", root, TOP_FIELDS);
    if let Some(sv) = root.get("schema_version") {
        ctx.check_eq("schema_version", "schema version", sv.as_i64(), Some(1));
    }
    let kind = as_str(field(root, "kind", "case")?, "kind")?;
    if kind != "primitive" {
        return Err(format!(
            "kind `{kind}` is not a primitive case (etp_* files must be \"kind\": \"primitive\")"
        ));
    }
    if let Some(id) = root.get("case_id") {
        let stem = file.strip_suffix(".json").unwrap_or(file);
        ctx.check_eq(
            "case_id",
            "case_id vs file name",
            as_str(id, "case_id")?,
            stem,
        );
    }
    let name = as_str(field(root, "primitive", "case")?, "primitive")?;
    let p = resolve(name).map_err(|e| format!("unknown primitive `{name}`: {e}"))?;

    // Informational fields, sanity-checked.
    if let Some(u) = root.get("user_api") {
        as_str(u, "user_api")?;
    }
    if let Some(u) = root.get("user_api_jaxpr_primitives") {
        let l = str_list(u, "user_api_jaxpr_primitives")?;
        ctx.check_eq(
            "user_api_jaxpr_primitives",
            "contains the primitive",
            l.iter().any(|n| n == name),
            true,
        );
    }
    if let Some(w) = root.get("warnings") {
        fn empty(w: &Value) -> bool {
            match w {
                Value::Null => true,
                Value::Object(m) => m.values().all(empty),
                Value::Array(l) => l.is_empty(),
                _ => false,
            }
        }
        let empty = empty(w);
        if !empty {
            ctx.fail(
                "warnings",
                format!(
                    "the reference recorded warnings for forward/jvp/vjp, which the harness does not know how to check: {}",
                    short(w)
                ),
            );
        }
    }

    // Layout.
    let arg_names = str_list(field(root, "arg_names", "case")?, "arg_names")?;
    let float_args = match root.get("float_arg_names") {
        Some(v) => str_list(v, "float_arg_names")?,
        None => arg_names.clone(),
    };
    for f in &float_args {
        if !arg_names.contains(f) {
            return Err(format!(
                "float_arg_names lists `{f}`, which is not in arg_names"
            ));
        }
    }
    if let Some(b) = root.get("batched_primitive") {
        ctx.check_eq(
            "batched_primitive",
            "primitive is batched",
            p.is_batched(),
            as_bool(b, "batched_primitive")?,
        );
    }
    let xi = match root.get("x_invar_index") {
        None | Some(Value::Null) => None,
        Some(v) => Some(as_usize(v, "x_invar_index")?),
    };
    if root.contains_key("x_invar_index") {
        ctx.check_eq("x_invar_index", "x operand index", p.x_index(), xi);
    }
    if let Some(c) = root.get("batched_counterpart") {
        let want = match c {
            Value::Null => None,
            v => Some(as_str(v, "batched_counterpart")?.to_string()),
        };
        let got = p.batched_counterpart().map(|q| q.name().to_string());
        ctx.check_eq("batched_counterpart", "batched counterpart", got, want);
    }
    if let Some(n) = p.num_args() {
        ctx.check_eq("arg_names", "operand count", arg_names.len(), n);
    }

    let params = params(field(root, "params", "case")?)?;

    // Operands.
    let inputs = obj(field(root, "inputs", "case")?, "inputs")?;
    for k in inputs.keys() {
        if !arg_names.contains(k) {
            ctx.fail(
                "inputs",
                format!("input `{k}` is not in arg_names {arg_names:?}"),
            );
        }
    }
    let args: Vec<Tensor> = arg_names
        .iter()
        .map(|a| required_array(inputs, a, "inputs"))
        .collect::<R<_>>()?;
    // The primitive's layout, restricted to the operands this bind has
    // (an optional trailing bias may be left out).
    let layout: BTreeMap<String, usize> = p
        .trainables()
        .iter()
        .filter(|(_, i)| *i < args.len())
        .cloned()
        .collect();
    let trainables = match root.get("trainable_invars") {
        Some(t) => {
            let want: BTreeMap<String, usize> = obj(t, "trainable_invars")?
                .iter()
                .map(|(k, v)| Ok((k.clone(), as_usize(v, "trainable_invars")?)))
                .collect::<R<_>>()?;
            ctx.check_eq(
                "trainable_invars",
                "trainable operands present in this bind",
                &layout,
                &want,
            );
            want
        }
        None => layout,
    };
    let mut weights = TensorMap::new();
    for (k, i) in &trainables {
        let t = args.get(*i).ok_or_else(|| {
            format!(
                "trainable `{k}` is operand {i}, but the case has {} operands",
                args.len()
            )
        })?;
        weights.insert(k.clone(), t.clone());
    }
    let x = match p.x_index() {
        Some(i) => Some(
            args.get(i)
                .ok_or_else(|| {
                    format!("x is operand {i}, but the case has {} operands", args.len())
                })?
                .clone(),
        ),
        None => None,
    };
    let y_shape = root
        .get("forward")
        .and_then(Value::as_object)
        .and_then(|f| f.get("output"))
        .and_then(Value::as_object)
        .and_then(|o| o.get("shape"))
        .map(|s| shape_of(s, "forward.output.shape"))
        .transpose()?;
    Ok(Case {
        p,
        params,
        arg_names,
        float_args,
        args,
        weights,
        x,
        y_shape,
        root,
    })
}

fn check_forward(ctx: &mut Ctx, c: &Case, v: &Value) -> R<()> {
    let o = obj(v, "forward")?;
    ctx.known_keys("forward", o, &["output"]);
    let want = required_array(o, "output", "forward")?;
    let got = c.p.bind(&c.args, &c.params).map_err(err)?;
    ctx.compare("forward.output", "", &got, &want);
    Ok(())
}

fn check_jvp(ctx: &mut Ctx, c: &Case, v: &Value) -> R<()> {
    let o = obj(v, "jvp")?;
    ctx.known_keys("jvp", o, &["tangents", "primal_out", "tangent_out"]);
    let tans = tree(field(o, "tangents", "jvp")?, "jvp.tangents")?;
    let want_keys: BTreeSet<&String> = c.float_args.iter().collect();
    let got_keys: BTreeSet<&String> = tans.keys().collect();
    if want_keys != got_keys {
        return Err(format!(
            "tangents are given for {got_keys:?}, but the float args are {want_keys:?}"
        ));
    }
    let tangents: Vec<Tensor> = c
        .arg_names
        .iter()
        .zip(&c.args)
        .map(|(n, a)| tans.get(n).cloned().unwrap_or_else(|| a.zeros_like()))
        .collect();
    let (po, to) = braintrace::jvp(c.f(), &c.args, &tangents).map_err(err)?;
    let want_p = required_array(o, "primal_out", "jvp")?;
    let want_t = required_array(o, "tangent_out", "jvp")?;
    ctx.compare("jvp.primal_out", "", &po[0], &want_p);
    ctx.compare("jvp.tangent_out", "", &to[0], &want_t);
    Ok(())
}

fn check_vjp(ctx: &mut Ctx, c: &Case, v: &Value) -> R<()> {
    let o = obj(v, "vjp")?;
    ctx.known_keys("vjp", o, &["cotangent", "grads"]);
    let ct = required_array(o, "cotangent", "vjp")?;
    let want = tree(field(o, "grads", "vjp")?, "vjp.grads")?;
    let (_, pb) = braintrace::vjp(c.f(), &c.args).map_err(err)?;
    let g = pb.apply(&[ct]).map_err(err)?;
    let got: TensorMap = c
        .arg_names
        .iter()
        .zip(g)
        .filter(|(n, _)| c.float_args.contains(n))
        .map(|(n, t)| (n.clone(), t))
        .collect();
    ctx.compare_map("vjp.grads", &got, &want);
    Ok(())
}

fn check_vmap(ctx: &mut Ctx, c: &Case, v: &Value) -> R<()> {
    let o = obj(v, "vmap")?;
    ctx.known_keys(
        "vmap",
        o,
        &[
            "mapped_arg",
            "axis_size",
            "in_axes",
            "mapped_input",
            "output",
            "jaxpr_primitives",
            "warnings",
        ],
    );
    let mapped = as_str(field(o, "mapped_arg", "vmap")?, "vmap.mapped_arg")?;
    let mi = c
        .arg_names
        .iter()
        .position(|n| n == mapped)
        .ok_or_else(|| format!("mapped_arg `{mapped}` is not in arg_names"))?;
    let input = required_array(o, "mapped_input", "vmap")?;
    let raw_axes = field(o, "in_axes", "vmap")?
        .as_array()
        .ok_or("vmap.in_axes must be a list")?;
    if raw_axes.len() != c.args.len() {
        return Err(format!(
            "in_axes has {} entries for {} operands",
            raw_axes.len(),
            c.args.len()
        ));
    }
    let mut args = c.args.clone();
    args[mi] = input.clone();
    let mut in_axes = Vec::new();
    for (i, a) in raw_axes.iter().enumerate() {
        let ax = match a {
            Value::Null => None,
            v => {
                let ax = v
                    .as_i64()
                    .ok_or("vmap.in_axes entries must be ints or null")?;
                let rank = args[i].ndim() as i64;
                let ax = if ax < 0 { ax + rank } else { ax };
                if ax < 0 || ax >= rank {
                    return Err(format!("in_axes[{i}] = {v} is out of range"));
                }
                Some(ax as usize)
            }
        };
        if ax.is_some() != (i == mi) {
            return Err(format!(
                "in_axes {} map operands other than mapped_arg `{mapped}`; the harness maps exactly one",
                short(field(o, "in_axes", "vmap")?)
            ));
        }
        in_axes.push(ax);
    }
    let size = input.shape()[in_axes[mi].expect("mapped")];
    if let Some(s) = o.get("axis_size") {
        ctx.check_eq(
            "vmap.axis_size",
            "mapped axis size",
            size,
            as_usize(s, "axis_size")?,
        );
    }
    let want = required_array(o, "output", "vmap")?;
    let vf = vmap(c.f(), in_axes.clone());
    let got = vf(&args).map_err(err)?;
    ctx.compare("vmap.output", "", &got[0], &want);

    // Identity preservation, on the graph of the vmapped function.
    let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
    let g = make_graph(vmap(c.f(), in_axes.clone()), &avals).map_err(err)?;
    let names = g.primitive_names();
    let etp: Vec<String> = g
        .eqns()
        .iter()
        .filter(|e| as_etp_eqn(&**e.prim()).is_some())
        .map(|e| e.prim().name())
        .collect();
    // The counterpart is re-bound only when x alone is mapped; mapping any
    // other operand decomposes (README section 7.2).
    let file_cp = c
        .root
        .get("batched_counterpart")
        .and_then(Value::as_str)
        .filter(|_| c.p.x_index() == Some(mi));
    let jp = match o.get("jaxpr_primitives") {
        Some(v) => Some(str_list(v, "vmap.jaxpr_primitives")?),
        None => None,
    };
    ctx.checks += 1;
    match file_cp {
        Some(cp) => {
            if let Some(jp) = &jp {
                if jp.iter().all(|n| n != cp) {
                    ctx.fail(
                        "vmap.jaxpr_primitives",
                        format!(
                            "the file names counterpart `{cp}` but its vmapped jaxpr is {jp:?}"
                        ),
                    );
                }
            }
            let per_example: Vec<Aval> = c.args.iter().map(Tensor::aval).collect();
            let core = make_graph(
                |a: &[Tensor]| Ok(vec![c.p.call_impl(a, &c.params)?]),
                &per_example,
            )
            .map_err(err)?
            .primitive_names();
            let leaked: Vec<&String> = names.iter().filter(|n| core.contains(n)).collect();
            if etp != [cp.to_string()] || !leaked.is_empty() {
                ctx.fail(
                    "vmap.identity",
                    format!(
                        "vmap over `{mapped}` must re-bind the counterpart `{cp}` as the one ETP equation without decomposing; the graph's ETP equations are {etp:?}, core ops of the decomposition present: {leaked:?} (graph: {names:?})"
                    ),
                );
            }
        }
        None => {
            if let Some(jp) = &jp {
                if jp.iter().any(|n| n.starts_with("etp_")) {
                    ctx.fail(
                        "vmap.jaxpr_primitives",
                        format!("ETP primitives {jp:?} in the reference's vmapped jaxpr, where no counterpart re-bind is expected (no batched_counterpart, or an operand other than x is mapped): the harness does not know how to check this"),
                    );
                }
            }
            if names.iter().any(|n| n == c.p.name()) {
                ctx.fail(
                    "vmap.identity",
                    format!(
                        "vmap over `{mapped}` has no batched counterpart, so `{}` must decompose, but the graph still contains it: {names:?}",
                        c.p.name()
                    ),
                );
            }
        }
    }
    if let Some(w) = o.get("warnings") {
        let ws = str_list(w, "vmap.warnings")?;
        for msg in ws {
            ctx.checks += 1;
            if msg.contains("was decomposed") {
                if !decomposition_warnings().iter().any(|n| n == c.p.name()) {
                    ctx.fail(
                        "vmap.warnings",
                        format!(
                            "the reference warned that `{}` was decomposed under vmap; braintrace recorded no decomposition warning for it (decomposition_warnings() = {:?})",
                            c.p.name(),
                            decomposition_warnings()
                        ),
                    );
                }
            } else {
                ctx.fail(
                    "vmap.warnings",
                    format!(
                        "unrecognised warning, the harness does not know how to check it: {msg}"
                    ),
                );
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- rules

const RULE_FIELDS: &[&str] = &[
    "xy_to_dw",
    "xy_to_dw_slice",
    "dt_to_t",
    "dt_to_t_slice",
    "instant_drtrl",
    "solve_drtrl",
    "by_num_hidden_state",
];

fn check_rules(ctx: &mut Ctx, c: &Case, v: &Value) -> R<()> {
    let o = obj(v, "rules")?;
    ctx.known_keys("rules", o, RULE_FIELDS);
    for req in ["xy_to_dw", "dt_to_t", "by_num_hidden_state"] {
        if !o.contains_key(req) {
            ctx.fail(&format!("rules.{req}"), "missing required rule entry");
        }
    }
    for (k, e) in o {
        let entry = format!("rules.{k}");
        match k.as_str() {
            "xy_to_dw" | "xy_to_dw_slice" => {
                ctx.run(&entry, |ctx| rule_xy_to_dw(ctx, c, &entry, e, false))
            }
            "instant_drtrl" => ctx.run(&entry, |ctx| rule_xy_to_dw(ctx, c, &entry, e, true)),
            "dt_to_t" | "dt_to_t_slice" => ctx.run(&entry, |ctx| rule_dt_to_t(ctx, c, &entry, e)),
            "solve_drtrl" => ctx.run(&entry, |ctx| rule_solve(ctx, c, &entry, e)),
            "by_num_hidden_state" => {
                let l = e
                    .as_array()
                    .ok_or("rules.by_num_hidden_state must be a list")?;
                for (i, s) in l.iter().enumerate() {
                    let entry = format!("rules.by_num_hidden_state[{i}]");
                    ctx.run(&entry, |ctx| by_num_hidden_state(ctx, c, &entry, s));
                }
            }
            _ => {} // reported by known_keys
        }
    }
    Ok(())
}

/// The `weights` of a rule entry (checked against the ones built from `inputs`),
/// or the ones built from `inputs` when the entry has none.
fn entry_weights(ctx: &mut Ctx, c: &Case, entry: &str, o: &Map<String, Value>) -> R<TensorMap> {
    match o.get("weights") {
        None => Ok(c.weights.clone()),
        Some(w) => {
            let w = tree(w, &format!("{entry}.weights"))?;
            ctx.compare_map(&format!("{entry}.weights (vs inputs)"), &w, &c.weights);
            Ok(w)
        }
    }
}

/// `x` of a rule entry: null only when the primitive has no `x`.
fn entry_x(c: &Case, entry: &str, o: &Map<String, Value>) -> R<Option<Tensor>> {
    let v = field(o, "x", entry)?;
    match (v.is_null(), c.p.x_index()) {
        (true, None) => Ok(None),
        (false, Some(_)) => Ok(Some(array(v, &format!("{entry}.x"))?)),
        (true, Some(i)) => Err(format!(
            "x is null, but the primitive reads x at operand {i}"
        )),
        (false, None) => Err("x is given, but the primitive has no x operand".into()),
    }
}

fn rule_xy_to_dw(ctx: &mut Ctx, c: &Case, entry: &str, v: &Value, instant: bool) -> R<()> {
    let o = obj(v, entry)?;
    ctx.known_keys(
        entry,
        o,
        &["context", "x", "hidden_dim", "weights", "output"],
    );
    let x = entry_x(c, entry, o)?;
    let hd = required_array(o, "hidden_dim", entry)?;
    let w = entry_weights(ctx, c, entry, o)?;
    let want = tree(field(o, "output", entry)?, &format!("{entry}.output"))?;
    let got = if instant {
        let r = ETP_RULES_INSTANT_DRTRL.get(&c.p).ok_or_else(|| {
            format!(
                "`{}` has no instant_drtrl rule registered (ETP_RULES_INSTANT_DRTRL)",
                c.p.name()
            )
        })?;
        r.call(x.as_ref(), &hd, &w, &c.params).map_err(err)?
    } else {
        c.p.xy_to_dw(x.as_ref(), &hd, &w, &c.params).map_err(err)?
    };
    ctx.compare_map(&format!("{entry}.output"), &got, &want);
    Ok(())
}

fn rule_dt_to_t(ctx: &mut Ctx, c: &Case, entry: &str, v: &Value) -> R<()> {
    let o = obj(v, entry)?;
    ctx.known_keys(entry, o, &["context", "hidden_dim", "trace", "output"]);
    let hd = required_array(o, "hidden_dim", entry)?;
    let trace = tree(field(o, "trace", entry)?, &format!("{entry}.trace"))?;
    let want = tree(field(o, "output", entry)?, &format!("{entry}.output"))?;
    let got = c.p.yw_to_w(&hd, &trace, &c.params).map_err(err)?;
    ctx.compare_map(&format!("{entry}.output"), &got, &want);
    Ok(())
}

fn rule_solve(ctx: &mut Ctx, c: &Case, entry: &str, v: &Value) -> R<()> {
    let o = obj(v, entry)?;
    ctx.known_keys(
        entry,
        o,
        &["context", "dg_hidden", "trace", "weights", "output"],
    );
    let dg = required_array(o, "dg_hidden", entry)?;
    let trace = tree(field(o, "trace", entry)?, &format!("{entry}.trace"))?;
    let w = entry_weights(ctx, c, entry, o)?;
    let want = tree(field(o, "output", entry)?, &format!("{entry}.output"))?;
    if !ETP_RULES_SOLVE_DRTRL.contains(&c.p) {
        return Err(format!(
            "`{}` has no solve_drtrl rule registered (ETP_RULES_SOLVE_DRTRL)",
            c.p.name()
        ));
    }
    let got = c.p.solve_drtrl(&dg, &trace, &w, &c.params).map_err(err)?;
    ctx.compare_map(&format!("{entry}.output"), &got, &want);
    Ok(())
}

/// `{shape, dtype, all_zero}` against a produced tensor.
fn check_init_leaf(ctx: &mut Ctx, entry: &str, leaf: &str, got: &Tensor, v: &Value) -> R<()> {
    let o = obj(v, entry)?;
    ctx.known_keys(entry, o, &["shape", "dtype", "all_zero"]);
    let shape = shape_of(field(o, "shape", entry)?, entry)?;
    let dtype = dtype_of(as_str(field(o, "dtype", entry)?, entry)?)?;
    let all_zero = as_bool(field(o, "all_zero", entry)?, entry)?;
    let what = |w: &str| {
        if leaf.is_empty() {
            w.to_string()
        } else {
            format!("leaf `{leaf}` {w}")
        }
    };
    ctx.check_eq(entry, &what("shape"), got.shape().to_vec(), shape);
    ctx.check_eq(entry, &what("dtype"), got.dtype(), dtype);
    let zero = got.to_vec_f64().map_err(err)?.iter().all(|&e| e == 0.0);
    ctx.check_eq(entry, &what("all_zero"), zero, all_zero);
    Ok(())
}

fn by_num_hidden_state(ctx: &mut Ctx, c: &Case, entry: &str, v: &Value) -> R<()> {
    let o = obj(v, entry)?;
    ctx.known_keys(
        entry,
        o,
        &[
            "num_hidden_state",
            "init_drtrl",
            "init_pp",
            "dt_to_t_vmapped",
            "drtrl_instant_vmapped",
        ],
    );
    let s = as_usize(field(o, "num_hidden_state", entry)?, entry)?;
    let y_shape = c
        .y_shape
        .clone()
        .ok_or("forward.output is needed for the output aval")?;
    let x_aval = c.x.as_ref().map(Tensor::aval);
    let y_aval = Aval::new(&y_shape, DType::F64);
    let w_avals: AvalMap = c
        .weights
        .iter()
        .map(|(k, t)| (k.clone(), t.aval()))
        .collect();

    if let Some(e) = o.get("init_drtrl") {
        let en = format!("{entry}.init_drtrl");
        ctx.run(&en, |ctx| {
            let got =
                c.p.init_drtrl(x_aval.as_ref(), &y_aval, &w_avals, s, &c.params)
                    .map_err(err)?;
            let want = obj(e, &en)?;
            let gk: BTreeSet<&String> = got.keys().collect();
            let wk: BTreeSet<&String> = want.keys().collect();
            ctx.check_eq(&en, "keys", gk, wk);
            for (k, spec) in want {
                if let Some(t) = got.get(k) {
                    check_init_leaf(ctx, &en, k, t, spec)?;
                }
            }
            Ok(())
        });
    }
    if let Some(e) = o.get("init_pp") {
        let en = format!("{entry}.init_pp");
        ctx.run(&en, |ctx| {
            let got =
                c.p.init_pp(x_aval.as_ref(), &y_aval, &w_avals, s, &c.params)
                    .map_err(err)?;
            check_init_leaf(ctx, &en, "", &got, e)
        });
    }
    if let Some(e) = o.get("dt_to_t_vmapped") {
        let en = format!("{entry}.dt_to_t_vmapped");
        ctx.run(&en, |ctx| dt_to_t_vmapped(ctx, c, &en, e));
    }
    if let Some(e) = o.get("drtrl_instant_vmapped") {
        let en = format!("{entry}.drtrl_instant_vmapped");
        ctx.run(&en, |ctx| drtrl_instant_vmapped(ctx, c, &en, e, s));
    }
    for req in [
        "init_drtrl",
        "init_pp",
        "dt_to_t_vmapped",
        "drtrl_instant_vmapped",
    ] {
        if !o.contains_key(req) {
            ctx.fail(&format!("{entry}.{req}"), "missing entry");
        }
    }
    Ok(())
}

/// `vmap(yw_to_w, in_axes=-1, out_axes=-1)(hd, trace)`.
fn dt_to_t_vmapped(ctx: &mut Ctx, c: &Case, entry: &str, v: &Value) -> R<()> {
    let o = obj(v, entry)?;
    ctx.known_keys(entry, o, &["context", "hidden_dim", "trace", "output"]);
    let hd = required_array(o, "hidden_dim", entry)?;
    let trace = tree(field(o, "trace", entry)?, &format!("{entry}.trace"))?;
    let want = tree(field(o, "output", entry)?, &format!("{entry}.output"))?;
    let keys: Vec<String> = trace.keys().cloned().collect();
    let last = |t: &Tensor| -> R<usize> {
        t.ndim()
            .checked_sub(1)
            .ok_or_else(|| "a scalar has no trailing state axis".to_string())
    };
    let mut in_axes = vec![Some(last(&hd)?)];
    let mut args = vec![hd.clone()];
    let mut out_axes = Vec::new();
    for k in &keys {
        let t = &trace[k];
        in_axes.push(Some(last(t)?));
        out_axes.push(last(t)?);
        args.push(t.clone());
    }
    let p = &c.p;
    let params = &c.params;
    let keys_c = keys.clone();
    let f = move |a: &[Tensor]| -> braintrace::Result<Vec<Tensor>> {
        let tr: TensorMap = keys_c.iter().cloned().zip(a[1..].iter().cloned()).collect();
        let out = p.yw_to_w(&a[0], &tr, params)?;
        keys_c
            .iter()
            .map(|k| {
                out.get(k).cloned().ok_or_else(|| {
                    braintrace::Error::invalid("golden", format!("yw_to_w result lacks `{k}`"))
                })
            })
            .collect()
    };
    let outs = vmap_out(f, in_axes, Some(out_axes))(&args).map_err(err)?;
    let got: TensorMap = keys.into_iter().zip(outs).collect();
    ctx.compare_map(&format!("{entry}.output"), &got, &want);
    Ok(())
}

/// The instantaneous D-RTRL term per state (and batch row), stacked back.
fn drtrl_instant_vmapped(ctx: &mut Ctx, c: &Case, entry: &str, v: &Value, s: usize) -> R<()> {
    let o = obj(v, entry)?;
    ctx.known_keys(
        entry,
        o,
        &["rule", "context", "x", "df", "weights", "output"],
    );
    let rule = as_str(field(o, "rule", entry)?, entry)?;
    match rule {
        "instant_drtrl" => {
            if !ETP_RULES_INSTANT_DRTRL.contains(&c.p) {
                return Err(format!(
                    "the reference uses instant_drtrl, but `{}` has none registered",
                    c.p.name()
                ));
            }
        }
        "xy_to_dw" => {}
        other => return Err(format!("unknown rule `{other}`")),
    }
    let x = entry_x(c, entry, o)?;
    let df = required_array(o, "df", entry)?;
    let w = entry_weights(ctx, c, entry, o)?;
    let want = tree(field(o, "output", entry)?, &format!("{entry}.output"))?;
    let last = df
        .ndim()
        .checked_sub(1)
        .ok_or("df must have a trailing state axis")?;
    ctx.check_eq(
        entry,
        "df's trailing axis is num_hidden_state",
        df.shape()[last],
        s,
    );
    let batched = c.p.is_batched();
    let mut per_state: Vec<TensorMap> = Vec::new();
    for si in 0..df.shape()[last] {
        let d = df.index_axis(last, si).map_err(err)?;
        let m = if batched {
            let n = d
                .shape()
                .first()
                .copied()
                .ok_or("batched df without a batch axis")?;
            let mut rows: Vec<TensorMap> = Vec::new();
            for b in 0..n {
                let xb = match &x {
                    Some(x) => Some(x.index_axis(0, b).map_err(err)?),
                    None => None,
                };
                let db = d.index_axis(0, b).map_err(err)?;
                rows.push(
                    c.p.instant_drtrl(xb.as_ref(), &db, &w, &c.params)
                        .map_err(err)?,
                );
            }
            stack_maps(&rows, |_| 0)?
        } else {
            c.p.instant_drtrl(x.as_ref(), &d, &w, &c.params)
                .map_err(err)?
        };
        per_state.push(m);
    }
    let got = stack_maps(&per_state, |t| t.ndim())?;
    ctx.compare_map(&format!("{entry}.output"), &got, &want);
    Ok(())
}

/// Stack maps leaf by leaf along `axis(first leaf)`.
fn stack_maps(ms: &[TensorMap], axis: impl Fn(&Tensor) -> usize) -> R<TensorMap> {
    let first = ms.first().ok_or("nothing to stack")?;
    first
        .iter()
        .map(|(k, t0)| {
            let leaves: Vec<Tensor> = ms
                .iter()
                .map(|m| {
                    m.get(k)
                        .cloned()
                        .ok_or_else(|| format!("leaf `{k}` missing in one slice"))
                })
                .collect::<R<_>>()?;
            Ok((k.clone(), stack(&leaves, axis(t0)).map_err(err)?))
        })
        .collect()
}

// ---------------------------------------------------------------- the folder

/// The outcome of a folder.
#[derive(Debug, Default)]
pub struct FolderReport {
    /// Per-case reports.
    pub cases: Vec<CaseReport>,
    /// `e2e__*` files, checked by the e2e checker (`tests/learn_support/e2e.rs`).
    pub deferred: Vec<String>,
    /// Failures not tied to one case (folder, manifest, unknown files).
    pub failures: Vec<Failure>,
}

/// Check every `*.json` case file in `dir` (except `MANIFEST.json`).
pub fn check_folder(dir: &Path, resolve: Resolver) -> FolderReport {
    let mut rep = FolderReport::default();
    let folder_fail = |rep: &mut FolderReport, msg: String| {
        rep.failures.push(Failure {
            file: dir.display().to_string(),
            entry: "folder".into(),
            msg,
        })
    };
    let mut files: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json") && n != "MANIFEST.json")
            .collect(),
        Err(e) => {
            folder_fail(&mut rep, format!("cannot read the folder: {e}"));
            return rep;
        }
    };
    files.sort();

    let manifest = dir.join("MANIFEST.json");
    if manifest.exists() {
        let listed = std::fs::read_to_string(&manifest)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| e.to_string()))
            .and_then(|v| {
                v.get("files")
                    .map(|f| str_list(f, "MANIFEST.json files"))
                    .unwrap_or_else(|| Err("MANIFEST.json has no `files` list".into()))
            });
        match listed {
            Ok(l) => {
                for f in l {
                    if !files.contains(&f) {
                        folder_fail(
                            &mut rep,
                            format!("MANIFEST.json lists `{f}`, which is missing"),
                        );
                    }
                }
            }
            Err(e) => folder_fail(&mut rep, format!("MANIFEST.json: {e}")),
        }
    }

    for f in files {
        if f.starts_with("e2e__") {
            rep.deferred.push(f);
        } else if f.starts_with("etp_") {
            let r = match std::fs::read_to_string(dir.join(&f)) {
                Ok(text) => check_case_str(&f, &text, resolve),
                Err(e) => CaseReport {
                    file: f.clone(),
                    checks: 0,
                    failures: vec![Failure {
                        file: f.clone(),
                        entry: "file".into(),
                        msg: format!("cannot read: {e}"),
                    }],
                },
            };
            rep.cases.push(r);
        } else {
            rep.failures.push(Failure {
                file: f.clone(),
                entry: "file".into(),
                msg: "not a recognised case file (expected etp_*.json or e2e__*.json)".into(),
            });
        }
    }
    if rep.cases.is_empty() {
        folder_fail(&mut rep, "no etp_*.json case files found".into());
    }
    rep
}
