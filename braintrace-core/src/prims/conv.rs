//! `etp_conv`: `y = conv(x, kernel_fn(K)) (+ bias_fn(b))`, 1-D/2-D/N-D, with
//! strides, SAME/VALID/explicit padding, lhs/rhs dilation and layouts
//! (default channel-first). The D-RTRL trace is kept per output position
//! (exact for a shared kernel), with `instant_drtrl` / `solve_drtrl`.
//! In order: params, impl, rules, initialisers, tests.

use super::common::{check_bias, leaf, trace_dtype, with_state};
use super::dense::y_trace;
use crate::error::{Error, Result};
use crate::etp::{apply_fn, times_derivative, AvalMap, ElemFn, ParamValue, TensorMap};
use crate::ops::conv::layout_perms;
use crate::ops::{conv_general, ConvDimensionNumbers, ConvPadding, ConvParams};
use crate::tensor::{Aval, DType, Tensor};
use crate::transform::vjp;
use braintrace_macros::{
    etp_primitive, init_drtrl, init_pp, instant_drtrl, solve_drtrl, xy_to_dw, yw_to_w,
};

const OP: &str = "etp_conv";

/// The parsed params of an `etp_conv` equation.
pub(crate) struct ConvSetup {
    pub(crate) conv: ConvParams,
    kernel_fn: Option<ElemFn>,
    bias_fn: Option<ElemFn>,
    /// canonical axis j of x / kernel / y is layout axis perm[j]
    lp: Vec<usize>,
    rp: Vec<usize>,
    op: Vec<usize>,
}

/// Read the params; `rank` is the rank of a batched `x`.
pub(crate) fn setup(p: &etp_conv::Params, rank: usize) -> Result<ConvSetup> {
    let d = rank.checked_sub(2).filter(|&d| d > 0).ok_or_else(|| {
        Error::etp(
            OP,
            "params",
            format!("x must have rank >= 3 (batch, channel, spatial...), got rank {rank}"),
        )
    })?;
    let strides = p.strides.clone().unwrap_or_else(|| vec![1; d]);
    let padding = match &p.padding {
        ParamValue::None => ConvPadding::Valid,
        ParamValue::Str(s) if s.eq_ignore_ascii_case("same") => ConvPadding::Same,
        ParamValue::Str(s) if s.eq_ignore_ascii_case("valid") => ConvPadding::Valid,
        v => {
            let pairs: Option<Vec<(i64, i64)>> = crate::etp::ParamType::from_param(v);
            ConvPadding::Explicit(pairs.ok_or_else(|| Error::Param {
                op: OP.into(),
                param: "padding".into(),
                reason: format!(
                    "expected \"SAME\", \"VALID\" or a list of (lo, hi) pairs, got {v}"
                ),
            })?)
        }
    };
    if p.batch_group_count != 1 {
        return Err(Error::etp(
            OP,
            "params",
            format!(
                "batch_group_count = {} is not supported (only 1)",
                p.batch_group_count
            ),
        ));
    }
    let dn = match &p.dimension_numbers {
        None => None,
        Some(v) if v.len() == 3 => Some(ConvDimensionNumbers {
            lhs: v[0].clone(),
            rhs: v[1].clone(),
            out: v[2].clone(),
        }),
        Some(v) => {
            return Err(Error::Param {
                op: OP.into(),
                param: "dimension_numbers".into(),
                reason: format!("expected three layout strings, got {v:?}"),
            })
        }
    };
    let (lp, rp, op) = match &dn {
        None => {
            let id: Vec<usize> = (0..rank).collect();
            (id.clone(), id.clone(), id)
        }
        Some(dn) => layout_perms(dn, rank, OP)?,
    };
    let conv = ConvParams {
        strides,
        padding,
        lhs_dilation: p.lhs_dilation.clone().unwrap_or_default(),
        rhs_dilation: p.rhs_dilation.clone().unwrap_or_default(),
        dimension_numbers: dn,
        feature_group_count: p.feature_group_count,
    };
    Ok(ConvSetup {
        conv,
        kernel_fn: p.kernel_fn.clone(),
        bias_fn: p.bias_fn.clone(),
        lp,
        rp,
        op,
    })
}

impl ConvSetup {
    fn d(&self) -> usize {
        self.lp.len() - 2
    }
    /// The channel axis of a (batched) y.
    fn y_channel_axis(&self) -> usize {
        self.op[1]
    }
    /// `b` reshaped to broadcast along y's channel axis (`rank` = y's rank).
    fn bias_shape(&self, b: &Tensor, rank: usize, batched: bool) -> Result<Tensor> {
        let ch = if batched {
            self.y_channel_axis()
        } else {
            self.y_channel_axis() - 1
        };
        let mut shape = vec![1; rank];
        shape[ch] = b.size();
        b.reshape(&shape)
    }
    /// y spatial axes (layout positions) of a batched y, in y order; and the
    /// canonical spatial index of each.
    fn y_spatial_order(&self) -> Vec<usize> {
        let mut js: Vec<usize> = (0..self.d()).collect();
        js.sort_by_key(|&j| self.op[2 + j]);
        js
    }
    /// Canonical `(B, O, s...)` from a batched y-layout tensor.
    fn y_to_canonical(&self, y: &Tensor) -> Result<Tensor> {
        y.transpose(&self.op)
    }
    /// `h` (batched, y layout) arranged as `(B, s..(y order).., k-layout with O, others 1)`.
    fn h_over_kernel(&self, h: &Tensor, k_rank: usize) -> Result<Tensor> {
        let hc = self.y_to_canonical(h)?;
        let d = self.d();
        let mut perm = vec![0];
        perm.extend(self.y_spatial_order().iter().map(|j| j + 2));
        perm.push(1);
        let h2 = hc.transpose(&perm)?;
        let mut shape = h2.shape()[..1 + d].to_vec();
        for i in 0..k_rank {
            shape.push(if i == self.rp[0] {
                h2.shape()[1 + d]
            } else {
                1
            });
        }
        h2.reshape(&shape)
    }
}

fn add_batch(t: &Tensor, batched: bool) -> Result<Tensor> {
    if batched {
        Ok(t.clone())
    } else {
        t.expand_dims(0)
    }
}

fn drop_batch(t: Tensor, batched: bool) -> Result<Tensor> {
    if batched {
        Ok(t)
    } else {
        t.squeeze(&[0])
    }
}

/// The fused trace kernel covers the default channel-first layout without
/// feature groups; any other convolution runs its rules.
fn conv_trace_kernel(p: &crate::etp::Params) -> Option<crate::etp::TraceKernel> {
    let default_layout = matches!(
        p.raw("dimension_numbers"),
        None | Some(crate::etp::ParamValue::None)
    );
    let groups = p.get::<usize>(OP, "feature_group_count").ok();
    (default_layout && groups == Some(1)).then(|| crate::etp::TraceKernel::Conv {
        weight: "weight".into(),
        bias: Some("bias".into()),
        weight_scale: crate::etp::Scale::Fn("kernel_fn".into()),
        bias_scale: crate::etp::Scale::Fn("bias_fn".into()),
    })
}

/// `y = conv(x, kernel_fn(K)) (+ bias_fn(b))`; `x` carries the batch axis.
#[allow(clippy::too_many_arguments)]
#[etp_primitive(name = "etp_conv", crate = "crate", batched, exact_dw_shapes = false, x = x, weight = [weight, bias], trace_kernel = conv_trace_kernel)]
pub fn etp_conv(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    #[param] has_bias: bool,
    #[param] strides: Option<Vec<usize>>,
    #[param] padding: ParamValue,
    #[param] lhs_dilation: Option<Vec<usize>>,
    #[param] rhs_dilation: Option<Vec<usize>>,
    #[param] feature_group_count: usize,
    #[param] batch_group_count: usize,
    #[param] dimension_numbers: Option<Vec<String>>,
    #[param] kernel_fn: Option<ElemFn>,
    #[param] bias_fn: Option<ElemFn>,
) -> Result<Tensor> {
    check_bias(OP, has_bias, bias)?;
    let p = etp_conv::Params {
        has_bias,
        strides,
        padding,
        lhs_dilation,
        rhs_dilation,
        feature_group_count,
        batch_group_count,
        dimension_numbers,
        kernel_fn,
        bias_fn,
    };
    let s = setup(&p, x.ndim())?;
    let k = apply_fn(&s.kernel_fn, weight)?;
    let y = conv_general(x, &k, &s.conv)?;
    match bias {
        Some(b) => y.add(&s.bias_shape(&apply_fn(&s.bias_fn, b)?, y.ndim(), true)?),
        None => Ok(y),
    }
}

/// The patches of a batched, canonical (`N C spatial…`) `x` for a kernel
/// of spatial shape `ks`: `(B, C·U, so..)`, channel `c·U + u` holding what
/// kernel offset `u` of input channel `c` sees at each output position.
fn canonical_patches(s: &ConvSetup, xc: &Tensor, ks: &[usize]) -> Result<Tensor> {
    let c = xc.shape()[1];
    let u: usize = ks.iter().product();
    // Identity kernel: output channel c*U + u reads input channel c at offset u.
    let mut eye = vec![0.0; c * u * u];
    for ci in 0..c {
        for ui in 0..u {
            eye[(ci * u + ui) * u + ui] = 1.0;
        }
    }
    let e = Tensor::from_vec(eye, &[&[c * u, 1][..], ks].concat())?.cast(xc.dtype())?;
    let mut pc = s.conv.clone();
    pc.dimension_numbers = None;
    pc.feature_group_count = c;
    conv_general(xc, &e, &pc)
}

/// For the fused D-RTRL kernel: the patches of a batched `x` in the default
/// (channel-first) layout of an `etp_conv` equation with `params` and
/// kernel spatial shape `ks`, as `(B, C·U, P)` (`P` output positions,
/// row-major).
pub(crate) fn default_layout_patches(
    params: &crate::etp::Params,
    x: &Tensor,
    ks: &[usize],
) -> Result<Tensor> {
    let p = etp_conv::Params::from_params(params)?;
    let s = setup(&p, x.ndim())?;
    if s.conv.dimension_numbers.is_some() || s.conv.feature_group_count != 1 {
        return Err(Error::etp(
            OP,
            "D-RTRL fused kernel",
            "only the default layout without feature groups",
        ));
    }
    let pt = canonical_patches(&s, x, ks)?;
    let (b, cu) = (pt.shape()[0], pt.shape()[1]);
    pt.reshape(&[b, cu, pt.size() / (b * cu).max(1)])
}

/// Per-position instantaneous kernel term of a batched `x`, `h`:
/// `(B, s.., <kernel layout>)` with `inst = patch · h`, times `kernel_fn'(K)`.
fn instant_kernel(s: &ConvSetup, x: &Tensor, h: &Tensor, k: &Tensor) -> Result<Tensor> {
    if s.conv.feature_group_count != 1 {
        return Err(Error::etp(OP, "D-RTRL trace", format!("grouped convolutions (feature_group_count = {}) are not supported by the per-position D-RTRL trace", s.conv.feature_group_count)));
    }
    let d = s.d();
    let xc = x.transpose(&s.lp)?;
    let kc = k.transpose(&s.rp)?;
    let (c, ks) = (xc.shape()[1], kc.shape()[2..].to_vec());
    let patches = canonical_patches(s, &xc, &ks)?; // (B, C*U, so..)
    let (b, so) = (patches.shape()[0], patches.shape()[2..].to_vec());
    let patches = patches.reshape(&[&[b, 1, c][..], &ks, &so].concat())?; // (B, 1, C, ks.., so..)
    let hc = s.y_to_canonical(h)?; // (B, O, so..)
    let o = hc.shape()[1];
    let hc = hc.reshape(&[&[b, o, 1][..], &vec![1; d], &so].concat())?;
    let inst = patches.mul(&hc)?; // (B, O, C, ks.., so..)
    let mut inv_rp = vec![0; d + 2];
    for (j, &i) in s.rp.iter().enumerate() {
        inv_rp[i] = j;
    }
    let mut perm = vec![0];
    perm.extend(s.y_spatial_order().iter().map(|j| 3 + d + j));
    perm.extend(inv_rp.iter().map(|j| 1 + j));
    let inst = inst.transpose(&perm)?;
    times_derivative(&s.kernel_fn, k, &inst)
}

/// The shared shape of `instant_drtrl` and `xy_to_dw`: `kernel` computes
/// the weight leaf from the setup, the batched `x` and `h`, the kernel and
/// whether the call was batched; the bias leaf is `h ⊙ g'(b)` per position.
fn weight_and_bias_terms(
    x: &Tensor,
    hidden: &Tensor,
    ws: &TensorMap,
    p: &etp_conv::Params,
    kernel: impl Fn(&ConvSetup, Tensor, Tensor, &Tensor, bool) -> Result<Tensor>,
) -> Result<TensorMap> {
    let w = leaf(ws, OP, "weight")?;
    let batched = x.ndim() == w.ndim();
    let s = setup(p, w.ndim())?;
    let mut out = TensorMap::new();
    out.insert(
        "weight".into(),
        kernel(
            &s,
            add_batch(x, batched)?,
            add_batch(hidden, batched)?,
            w,
            batched,
        )?,
    );
    if let Some(b) = ws.get("bias") {
        out.insert(
            "bias".into(),
            times_derivative(
                &s.bias_fn,
                &s.bias_shape(b, hidden.ndim(), batched)?,
                hidden,
            )?,
        );
    }
    Ok(out)
}

/// `instant_drtrl` (per sample): weight `(s.., <kernel>)`, bias `h ⊙ g'` per position.
#[instant_drtrl(etp_conv)]
fn conv_instant_drtrl(
    x: &Tensor,
    hidden: &Tensor,
    ws: &TensorMap,
    p: &etp_conv::Params,
) -> Result<TensorMap> {
    weight_and_bias_terms(x, hidden, ws, p, |s, xb, hb, w, batched| {
        drop_batch(instant_kernel(s, &xb, &hb, w)?, batched)
    })
}

/// `xy_to_dw`: kernel = VJP of `K -> conv(x, kernel_fn(K))` at `h` (sums over
/// batch and positions); bias = `h ⊙ g'(b)` per position (not summed).
#[xy_to_dw(etp_conv)]
fn conv_xy_to_dw(
    x: &Tensor,
    hidden: &Tensor,
    ws: &TensorMap,
    p: &etp_conv::Params,
) -> Result<TensorMap> {
    weight_and_bias_terms(x, hidden, ws, p, |s, xb, hb, w, _| {
        let (kf, conv) = (s.kernel_fn.clone(), s.conv.clone());
        let (_, pb) = vjp(
            move |k: &[Tensor]| Ok(vec![conv_general(&xb, &apply_fn(&kf, &k[0])?, &conv)?]),
            std::slice::from_ref(w),
        )?;
        Ok(pb.apply(&[hb])?.remove(0))
    })
}

/// `yw_to_w`: `trace_K[b, s, k, ...] *= h[b, s, k]`, `trace_b *= h` (no spatial sums).
#[yw_to_w(etp_conv)]
fn conv_yw_to_w(hidden: &Tensor, trace: &TensorMap, p: &etp_conv::Params) -> Result<TensorMap> {
    let tk = leaf(trace, OP, "weight")?;
    // trace_K is (B?, s.., kernel); y is (B?, y-layout); the kernel has rank d + 2.
    let k_rank = tk.ndim() + 1 - hidden.ndim(); // kernel rank = d + 2
    let batched = hidden.ndim() == k_rank;
    let s = setup(p, k_rank)?;
    let hb = add_batch(hidden, batched)?;
    let h2 = drop_batch(s.h_over_kernel(&hb, k_rank)?, batched)?;
    let mut out = TensorMap::new();
    for (k, t) in trace {
        out.insert(
            k.clone(),
            if k == "bias" {
                t.mul(hidden)?
            } else {
                t.mul(&h2)?
            },
        );
    }
    Ok(out)
}

/// `solve_drtrl` (per sample): `dK = Σ_s trace_K[s, ..] g[s, o]`, `db = Σ_s trace_b g`.
#[solve_drtrl(etp_conv)]
fn conv_solve_drtrl(
    g: &Tensor,
    trace: &TensorMap,
    _ws: &TensorMap,
    p: &etp_conv::Params,
) -> Result<TensorMap> {
    let tk = leaf(trace, OP, "weight")?;
    let k_rank = tk.ndim() + 1 - g.ndim();
    let s = setup(p, k_rank)?;
    let d = s.d();
    let h2 = s.h_over_kernel(&g.expand_dims(0)?, k_rank)?.squeeze(&[0])?;
    let spatial: Vec<usize> = (0..d).collect();
    let mut out = TensorMap::new();
    out.insert("weight".into(), tk.mul(&h2)?.sum(&spatial)?);
    if let Some(tb) = trace.get("bias") {
        let ch = s.y_channel_axis() - 1;
        let axes: Vec<usize> = (0..g.ndim()).filter(|&a| a != ch).collect();
        out.insert("bias".into(), tb.mul(g)?.sum(&axes)?);
    }
    Ok(out)
}

/// `init_drtrl`: `{weight (B, s.., *K.shape, S), bias (*y.shape, S)}`.
#[init_drtrl(etp_conv)]
fn conv_init_drtrl(
    x: &Aval,
    y: &Aval,
    ws: &AvalMap,
    st: usize,
    p: &etp_conv::Params,
) -> Result<TensorMap> {
    let dt: DType = trace_dtype(Some(x), y, ws);
    let s = setup(p, y.ndim())?;
    if s.conv.feature_group_count != 1 {
        return Err(Error::etp(OP, "rule init_drtrl", format!("grouped convolutions (feature_group_count = {}) are not supported by the per-position D-RTRL trace", s.conv.feature_group_count)));
    }
    let mut lead = vec![y.shape()[s.op[0]]];
    lead.extend(s.y_spatial_order().iter().map(|&j| y.shape()[s.op[2 + j]]));
    ws.iter()
        .map(|(k, w)| {
            let shape = if k == "bias" {
                with_state(y.shape(), st)
            } else {
                with_state(&[&lead[..], w.shape()].concat(), st)
            };
            Ok((k.clone(), Tensor::try_zeros("init_drtrl", &shape, dt)?))
        })
        .collect()
}

#[init_pp(etp_conv)]
fn conv_init_pp(_x: &Aval, y: &Aval, _ws: &AvalMap, num_hidden_state: usize) -> Result<Tensor> {
    y_trace(y, num_hidden_state)
}

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etp::check_rules;
    use crate::prims::common::test_tensor;

    fn params(layout: Option<[&str; 3]>, padding: &str) -> crate::etp::Params {
        etp_conv::Params {
            has_bias: true,
            strides: Some(vec![2, 1]),
            padding: ParamValue::Str(padding.into()),
            lhs_dilation: None,
            rhs_dilation: Some(vec![1, 2]),
            feature_group_count: 1,
            batch_group_count: 1,
            dimension_numbers: layout.map(|l| l.iter().map(|s| s.to_string()).collect()),
            kernel_fn: ElemFn::builtin("tanh"),
            bias_fn: None,
        }
        .to_params()
    }

    #[test]
    fn conv_rules_channel_first() {
        let args = [
            test_tensor(&[2, 3, 6, 5], 1),
            test_tensor(&[7, 3, 2, 2], 2),
            test_tensor(&[7], 3),
        ];
        let r = check_rules(&etp_conv::primitive(), &args, &params(None, "SAME")).unwrap();
        assert!(r.is_ok(), "{r}");
    }

    #[test]
    fn conv_rules_channel_last() {
        let args = [
            test_tensor(&[2, 6, 5, 3], 1),
            test_tensor(&[2, 2, 3, 7], 2),
            test_tensor(&[7], 3),
        ];
        let r = check_rules(
            &etp_conv::primitive(),
            &args,
            &params(Some(["NHWC", "HWIO", "NHWC"]), "VALID"),
        )
        .unwrap();
        assert!(r.is_ok(), "{r}");
    }

    #[test]
    fn conv_trace_is_per_position() {
        let p = params(None, "SAME");
        let mut ws = AvalMap::new();
        ws.insert("weight".into(), Aval::new(&[7, 3, 2, 2], DType::F64));
        ws.insert("bias".into(), Aval::new(&[7], DType::F64));
        let x = Aval::new(&[2, 3, 6, 5], DType::F64);
        let y = Aval::new(&[2, 7, 3, 5], DType::F64);
        let t = etp_conv::primitive()
            .init_drtrl(Some(&x), &y, &ws, 2, &p)
            .unwrap();
        assert_eq!(t["weight"].shape(), &[2, 3, 5, 7, 3, 2, 2, 2]);
        assert_eq!(t["bias"].shape(), &[2, 7, 3, 5, 2]);
    }
}
