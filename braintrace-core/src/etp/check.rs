//! `check_rules`: evaluate a primitive's rules against what autodiff of its
//! impl says, and report each rule with its largest deviation. Library
//! authors call it in their tests; the built-ins use it too.

use super::params::Params;
use super::primitive::EtpPrimitive;
use super::rules::{AvalMap, TensorMap};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use crate::transform::vjp;
use std::fmt;

/// The outcome of checking one rule.
#[derive(Clone, Debug)]
pub struct RuleCheck {
    /// The rule (`xy_to_dw`, `yw_to_w`, `init_drtrl`, `init_pp`, `solve_drtrl`).
    pub rule: String,
    /// Largest absolute deviation from the reference.
    pub max_abs_dev: f64,
    /// Whether the rule agreed within tolerance.
    pub passed: bool,
    /// What was compared (or why a leaf could not be).
    pub detail: String,
}

/// The result of [`check_rules`].
#[derive(Clone, Debug)]
pub struct RuleReport {
    /// The primitive checked.
    pub primitive: String,
    /// One entry per rule.
    pub checks: Vec<RuleCheck>,
}

impl RuleReport {
    /// Whether every rule passed.
    pub fn is_ok(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
    /// The failing rules.
    pub fn failures(&self) -> Vec<&RuleCheck> {
        self.checks.iter().filter(|c| !c.passed).collect()
    }
    /// The entry of one rule.
    pub fn get(&self, rule: &str) -> Option<&RuleCheck> {
        self.checks.iter().find(|c| c.rule == rule)
    }
    /// `Ok(self)` when every rule passed, else an error listing the failures.
    pub fn into_result(self) -> Result<Self> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(Error::etp(&self.primitive, "check_rules", self.to_string()))
        }
    }
}

impl fmt::Display for RuleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rule check of `{}`:", self.primitive)?;
        for c in &self.checks {
            writeln!(
                f,
                "  {:<12} {}  max deviation {:.3e}  ({})",
                c.rule,
                if c.passed { "ok  " } else { "FAIL" },
                c.max_abs_dev,
                c.detail
            )?;
        }
        Ok(())
    }
}

/// Deterministic values in [-1, 1] shaped like `like`.
fn pseudo_random(like: &Tensor, seed: u64) -> Result<Tensor> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let data: Vec<f64> = (0..like.size())
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(data, like.shape())?.cast(like.dtype())
}

fn max_abs(t: &Tensor) -> Result<f64> {
    Ok(t.to_vec_f64()?.iter().fold(0.0f64, |m, v| m.max(v.abs())))
}

fn tolerance(dtype: DType, scale: f64) -> f64 {
    let rel = if dtype == DType::F32 { 1e-4 } else { 1e-8 };
    rel * (1.0 + scale)
}

/// Compare two maps leaf by leaf; leaves whose shapes differ are named in the detail.
fn compare(rule: &str, got: &TensorMap, want: &TensorMap, what: &str) -> Result<RuleCheck> {
    let mut dev = 0.0f64;
    let mut passed = true;
    let mut notes = vec![what.to_string()];
    for (k, w) in want {
        let Some(g) = got.get(k) else {
            passed = false;
            notes.push(format!("`{k}` missing"));
            continue;
        };
        if g.shape() != w.shape() {
            passed = false;
            notes.push(format!(
                "`{k}` has shape {:?}, reference {:?}",
                g.shape(),
                w.shape()
            ));
            continue;
        }
        let d = max_abs(&g.sub(w)?)?;
        let tol = tolerance(w.dtype(), max_abs(w)?);
        // NaN deviations fail too.
        if d.is_nan() || d > tol {
            passed = false;
            notes.push(format!("`{k}` deviates by {d:.3e} (tolerance {tol:.1e})"));
        }
        dev = dev.max(d);
    }
    Ok(RuleCheck {
        rule: rule.into(),
        max_abs_dev: dev,
        passed,
        detail: notes.join("; "),
    })
}

/// For primitives whose `xy_to_dw` leaves are per position (conv's bias):
/// sum a leaf over every axis but the one matching a 1-D reference. A leaf
/// whose reference is not 1-D, or whose matching axis is ambiguous, is left
/// as is (and the comparison then reports the shape difference).
fn reduce_per_position(mut got: TensorMap, reference: &TensorMap) -> Result<TensorMap> {
    for (k, want) in reference {
        let Some(g) = got.get(k) else { continue };
        if g.shape() == want.shape() || want.ndim() != 1 {
            continue;
        }
        let n = want.shape()[0];
        let axes: Vec<usize> = (0..g.ndim()).filter(|&a| g.shape()[a] == n).collect();
        if axes.len() == 1 {
            let others: Vec<usize> = (0..g.ndim()).filter(|&a| a != axes[0]).collect();
            let r = g.sum(&others)?;
            got.insert(k.clone(), r);
        }
    }
    Ok(got)
}

/// Per-sample instantaneous term stacked over the batch (or unbatched).
fn instant(
    p: &EtpPrimitive,
    x: Option<&Tensor>,
    h: &Tensor,
    w: &TensorMap,
    params: &Params,
) -> Result<TensorMap> {
    if !p.is_batched() {
        return p.instant_drtrl(x, h, w, params);
    }
    let b = h.shape()[0];
    let mut per: Vec<TensorMap> = Vec::with_capacity(b);
    for i in 0..b {
        let xi = x.map(|x| x.index_axis0(i)).transpose()?;
        per.push(p.instant_drtrl(xi.as_ref(), &h.index_axis0(i)?, w, params)?);
    }
    let mut out = TensorMap::new();
    for k in per[0].keys() {
        let leaves: Vec<Tensor> = per.iter().map(|m| m[k].clone()).collect();
        out.insert(k.clone(), crate::ops::stack(&leaves, 0)?);
    }
    Ok(out)
}

/// Check a primitive's rules at `example_args` (f64 recommended):
///
/// * `xy_to_dw` equals the VJP of the impl w.r.t. the trainables at a
///   random cotangent `hidden`;
/// * `yw_to_w` agrees with the chain rule: spreading `hidden` onto the
///   instantaneous trace taken at factor 1 equals the instantaneous trace
///   taken at factor `hidden`;
/// * the D-RTRL solve of that trace with a signal `g` equals
///   `xy_to_dw(x, g ⊙ hidden)`;
/// * `init_drtrl` returns zeros shaped like the trace plus the state axis,
///   `init_pp` zeros of shape `(*y.shape, S)` and `y`'s dtype.
pub fn check_rules(
    p: &EtpPrimitive,
    example_args: &[Tensor],
    params: &Params,
) -> Result<RuleReport> {
    let (x, w) = p.split_args(example_args)?;
    let y = p.bind(example_args, params)?;
    let hidden = pseudo_random(&y, 17)?;
    let signal = pseudo_random(&y, 29)?;
    let mut checks = Vec::new();

    // xy_to_dw against autodiff of the impl.
    let names: Vec<(String, usize)> = p.present_trainables(example_args.len());
    let wvals: Vec<Tensor> = names
        .iter()
        .map(|(_, i)| example_args[*i].clone())
        .collect();
    let f = |ws: &[Tensor]| {
        let mut full = example_args.to_vec();
        for ((_, i), t) in names.iter().zip(ws) {
            full[*i] = t.clone();
        }
        Ok(vec![p.call_impl(&full, params)?])
    };
    let (_, pb) = vjp(f, &wvals)?;
    let auto: TensorMap = names
        .iter()
        .map(|(k, _)| k.clone())
        .zip(pb.apply(std::slice::from_ref(&hidden))?)
        .collect();
    let mut dw = p.xy_to_dw(x.as_ref(), &hidden, &w, params)?;
    if !p.exact_dw_shapes() {
        dw = reduce_per_position(dw, &auto)?;
    }
    checks.push(compare(
        "xy_to_dw",
        &dw,
        &auto,
        "vs VJP of the impl at cotangent `hidden`",
    )?);

    // yw_to_w: chain rule on the instantaneous trace.
    let ones = y.ones_like();
    let iota1 = instant(p, x.as_ref(), &ones, &w, params)?;
    let iota_h = instant(p, x.as_ref(), &hidden, &w, params)?;
    let spread = p.yw_to_w(&hidden, &iota1, params)?;
    checks.push(compare(
        "yw_to_w",
        &spread,
        &iota_h,
        "yw_to_w(hidden, ι(1)) vs ι(hidden)",
    )?);

    // Solve: Σ_b solve(g, ι(hidden)) == xy_to_dw(x, g ⊙ hidden).
    let want = p.xy_to_dw(x.as_ref(), &signal.mul(&hidden)?, &w, params)?;
    let solved = if p.is_batched() {
        let mut acc: Option<TensorMap> = None;
        for b in 0..y.shape()[0] {
            let tb: TensorMap = iota_h
                .iter()
                .map(|(k, t)| Ok((k.clone(), t.index_axis0(b)?)))
                .collect::<Result<_>>()?;
            let s = p.solve_drtrl(&signal.index_axis0(b)?, &tb, &w, params)?;
            acc = Some(match acc {
                None => s,
                Some(a) => a
                    .into_iter()
                    .map(|(k, v)| Ok((k.clone(), v.add(&s[&k])?)))
                    .collect::<Result<_>>()?,
            });
        }
        acc.unwrap_or_default()
    } else {
        p.solve_drtrl(&signal, &iota_h, &w, params)?
    };
    let want = if p.exact_dw_shapes() {
        want
    } else {
        reduce_per_position(want, &solved)?
    };
    checks.push(compare(
        "solve_drtrl",
        &solved,
        &want,
        "Σ_batch solve(g, ι(hidden)) vs xy_to_dw(x, g ⊙ hidden)",
    )?);

    // Initialisers.
    let wav: AvalMap = w.iter().map(|(k, t)| (k.clone(), t.aval())).collect();
    let xav = x.as_ref().map(Tensor::aval);
    for s in [1usize, 2] {
        let init = p.init_drtrl(xav.as_ref(), &y.aval(), &wav, s, params)?;
        let mut passed = true;
        let mut notes = vec![format!("S = {s}")];
        let mut dev = 0.0f64;
        for (k, t) in &init {
            dev = dev.max(max_abs(t)?);
            let want: Vec<usize> = iota1
                .get(k)
                .map(|i| i.shape().iter().copied().chain([s]).collect())
                .unwrap_or_default();
            if t.shape() != want.as_slice() {
                passed = false;
                notes.push(format!(
                    "`{k}` has shape {:?}, the trace needs {want:?}",
                    t.shape()
                ));
            }
            if !t.dtype().is_float() {
                passed = false;
                notes.push(format!("`{k}` has dtype {}", t.dtype()));
            }
        }
        if dev != 0.0 {
            passed = false;
            notes.push("not all zeros".into());
        }
        checks.push(RuleCheck {
            rule: "init_drtrl".into(),
            max_abs_dev: dev,
            passed,
            detail: notes.join("; "),
        });

        let pp = p.init_pp(xav.as_ref(), &y.aval(), &wav, s, params)?;
        let dev = max_abs(&pp)?;
        let ok = dev == 0.0 && pp.dtype() == y.dtype();
        checks.push(RuleCheck {
            rule: "init_pp".into(),
            max_abs_dev: dev,
            passed: ok,
            detail: format!(
                "S = {s}; shape {:?}, dtype {} (y: {})",
                pp.shape(),
                pp.dtype(),
                y.dtype()
            ),
        });
    }
    Ok(RuleReport {
        primitive: p.name().to_string(),
        checks,
    })
}
