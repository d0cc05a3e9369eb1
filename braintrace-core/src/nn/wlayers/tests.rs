//! Each layer's forward against the computation written out, the weight
//! standardisation's pullback against finite differences, the relations
//! the compiler finds, and the errors of bad sizes and hyperparameters.

use super::*;
use crate::learn::{bptt_grad, compile, DRtrl, Model, ModelState, Reduction, TensorDict};
use crate::nn::Linear;
use crate::ops::ConvPadding;
use crate::tensor::DType;

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn vals(n: usize, seed: f64) -> Vec<f64> {
    (0..n)
        .map(|i| ((i as f64 + 1.0) * seed).sin() * 1.3)
        .collect()
}

/// One step of `m` on `x` (batched) with the parameters `p`.
fn forward<M: Model>(m: &M, p: &[(String, Tensor)], x: &Tensor) -> Tensor {
    let mut st = ModelState::new(m, DType::F64, 0, Some(x.shape()[0])).unwrap();
    let d: TensorDict = p.iter().cloned().collect();
    st.set_params(&d).unwrap();
    let xs = x.expand_dims(0).unwrap();
    let ys = Tensor::zeros(&[1, 1], DType::F64);
    let out = bptt_grad(
        m,
        &st,
        &xs,
        &ys,
        |o: &Tensor, _| o.square()?.mean_all(),
        Reduction::Mean,
    )
    .unwrap();
    out.outputs.index_axis0(0).unwrap()
}

fn close(got: &Tensor, want: &[f64]) {
    let g = got.to_vec_f64().unwrap();
    assert_eq!(g.len(), want.len());
    for (a, b) in g.iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{g:?} vs {want:?}");
    }
}

fn invalid(e: Error) -> String {
    e.to_string()
}

/// `x (B, I) @ w (I, O)` written out.
fn mm(x: &[f64], w: &[f64], b: usize, i: usize, o: usize) -> Vec<f64> {
    let mut y = vec![0.0; b * o];
    for r in 0..b {
        for c in 0..o {
            y[r * o + c] = (0..i).map(|k| x[r * i + k] * w[k * o + c]).sum();
        }
    }
    y
}

#[test]
fn linear_mask_multiplies_the_weight() {
    let (i, o) = (3, 2);
    let (x, w, m) = (
        vals(2 * i, 0.7),
        vals(i * o, 1.1),
        [1.0, 0.0, 0.0, 1.0, 1.0, 0.5],
    );
    let l = Linear::new("l", i, o).with_mask(&t(&m, &[i, o])).unwrap();
    let p = vec![
        (l.weight_key(), t(&w, &[i, o])),
        (l.bias_key(), t(&[0.1, -0.2], &[o])),
    ];
    let y = forward(&l, &p, &t(&x, &[2, i]));
    let wm: Vec<f64> = w.iter().zip(&m).map(|(a, b)| a * b).collect();
    let mut want = mm(&x, &wm, 2, i, o);
    for (k, v) in want.iter_mut().enumerate() {
        *v += [0.1, -0.2][k % o];
    }
    close(&y, &want);
    let e = invalid(
        Linear::new("l", 3, 2)
            .with_mask(&t(&[1.0; 4], &[2, 2]))
            .unwrap_err(),
    );
    assert!(e.contains("Linear `l`") && e.contains("w_mask"), "{e}");
    let e = invalid(
        Linear::new("l", 1, 2)
            .with_mask(&t(&[1.0, f64::NAN], &[1, 2]))
            .unwrap_err(),
    );
    assert!(e.contains("finite"), "{e}");
}

#[test]
fn signed_w_linear_follows_dale() {
    let (i, o) = (3, 2);
    let (x, w) = (vals(2 * i, 0.3), vals(i * o, 0.9));
    let l = SignedWLinear::new("s", i, o).unwrap().dale(2).unwrap();
    let p = vec![(l.weight_key(), t(&w, &[i, o]))];
    let y = forward(&l, &p, &t(&x, &[2, i]));
    let ws: Vec<f64> = w
        .iter()
        .enumerate()
        .map(|(k, v)| v.abs() * if k / o < 2 { 1.0 } else { -1.0 })
        .collect();
    close(&y, &mm(&x, &ws, 2, i, o));
    // Without a sign: |W|.
    let l = SignedWLinear::new("s", i, o).unwrap();
    let y = forward(&l, &p, &t(&x, &[2, i]));
    let wa: Vec<f64> = w.iter().map(|v| v.abs()).collect();
    close(&y, &mm(&x, &wa, 2, i, o));
    for e in [
        SignedWLinear::new("s", 0, 2).unwrap_err(),
        SignedWLinear::new("s", 3, 2).unwrap().dale(4).unwrap_err(),
        SignedWLinear::new("s", 3, 2)
            .unwrap()
            .with_sign(&t(&[1.0; 3], &[3]))
            .unwrap_err(),
    ] {
        assert!(invalid(e).contains("SignedWLinear"));
    }
}

fn standardized(w: &[f64], i: usize, o: usize, eps: f64) -> Vec<f64> {
    let mut s = vec![0.0; i * o];
    for c in 0..o {
        let col: Vec<f64> = (0..i).map(|r| w[r * o + c]).collect();
        let m = col.iter().sum::<f64>() / i as f64;
        let v = col.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / i as f64;
        let sc = 1.0 / (v * i as f64).max(eps).sqrt();
        for r in 0..i {
            s[r * o + c] = (w[r * o + c] - m) * sc;
        }
    }
    s
}

#[test]
fn scaled_ws_linear_standardizes_per_output() {
    let (i, o) = (4, 3);
    let (x, w) = (vals(2 * i, 0.4), vals(i * o, 1.7));
    let mask = [1.0, 0.0, 1.0, 1.0];
    let l = ScaledWsLinear::new("ws", i, o)
        .unwrap()
        .with_mask(&t(&mask, &[i, 1]))
        .unwrap();
    let (gain, bias) = ([1.5, -0.5, 2.0], [0.3, 0.0, -0.1]);
    let p = vec![
        (l.key("weight"), t(&w, &[i, o])),
        (l.key("gain"), t(&gain, &[1, o])),
        (l.key("bias"), t(&bias, &[o])),
    ];
    let y = forward(&l, &p, &t(&x, &[2, i]));
    let mut ws = standardized(&w, i, o, 1e-4);
    for (k, v) in ws.iter_mut().enumerate() {
        *v *= mask[k / o];
    }
    let mut want = mm(&x, &ws, 2, i, o);
    for (k, v) in want.iter_mut().enumerate() {
        *v = *v * gain[k % o] + bias[k % o];
    }
    close(&y, &want);
    assert!(invalid(
        ScaledWsLinear::new("ws", 2, 2)
            .unwrap()
            .with_eps(-1.0)
            .unwrap_err()
    )
    .contains("eps"));
    assert!(ScaledWsLinear::new("ws", 2, 0).is_err());
}

/// The pullback of the standardisation against central differences, with
/// the variance above `eps` and (a constant column) below it.
#[test]
fn standardization_pullback_matches_finite_differences() {
    let (i, o) = (4, 3);
    let mut w = vals(i * o, 0.8);
    for r in 0..i {
        w[r * o + 2] = 0.25; // a constant column: the floor eps is active
    }
    let g = vals(i * o, 2.3);
    let wt = t(&w, &[i, o]);
    let got = standardize_vjp(&wt, &t(&g, &[i, o]), 1e-4)
        .unwrap()
        .to_vec_f64()
        .unwrap();
    let f = |w: &[f64]| -> f64 {
        let s = standardize(&t(w, &[i, o]), 1e-4)
            .unwrap()
            .to_vec_f64()
            .unwrap();
        s.iter().zip(&g).map(|(a, b)| a * b).sum()
    };
    let h = 1e-6;
    for k in 0..i * o {
        let (mut a, mut b) = (w.clone(), w.clone());
        a[k] += h;
        b[k] -= h;
        let fd = (f(&a) - f(&b)) / (2.0 * h);
        assert!((got[k] - fd).abs() < 1e-6, "entry {k}: {} vs {fd}", got[k]);
    }
    close(
        &standardize(&wt, 1e-4).unwrap(),
        &standardized(&w, i, o, 1e-4),
    );
}

#[test]
fn sparse_linear_matches_the_dense_product() {
    let dense = [0.5, 0.0, 0.0, -1.0, 0.0, 2.0];
    let l = SparseLinear::from_dense("sp", &t(&dense, &[3, 2]))
        .unwrap()
        .with_bias(Initializer::Zeros);
    assert_eq!(l.structure.nnz(), 3);
    let x = vals(6, 0.5);
    let p = vec![
        (l.key("weight"), t(&[0.5, -1.0, 2.0], &[3])),
        (l.key("bias"), t(&[0.25, -0.75], &[2])),
    ];
    let y = forward(&l, &p, &t(&x, &[2, 3]));
    let mut want = mm(&x, &dense, 2, 3, 2);
    for (k, v) in want.iter_mut().enumerate() {
        *v += [0.25, -0.75][k % 2];
    }
    close(&y, &want);
    let s = l.structure.clone();
    let e = invalid(SparseLinear::new("sp", s, &t(&[1.0; 2], &[2])).unwrap_err());
    assert!(e.contains("SparseLinear `sp`"), "{e}");
    let empty = crate::prims::CsrStructure::from_dense_pattern(2, 2, |_, _| false);
    assert!(SparseLinear::new("sp", empty, &t(&[], &[0])).is_err());
}

#[test]
fn lora_is_the_scaled_low_rank_product() {
    let (i, r, o) = (3, 2, 4);
    let (x, a, b) = (vals(2 * i, 0.6), vals(i * r, 1.2), vals(r * o, 0.35));
    let l = Lora::new("lo", i, r, o).unwrap();
    let p = vec![
        (l.key("lora_a"), t(&a, &[i, r])),
        (l.key("lora_b"), t(&b, &[r, o])),
    ];
    let y = forward(&l, &p, &t(&x, &[2, i]));
    let xa = mm(&x, &a, 2, i, r);
    let want: Vec<f64> = mm(&xa, &b, 2, r, o).iter().map(|v| v / r as f64).collect();
    close(&y, &want);
    assert!(invalid(Lora::new("lo", 3, 0, 4).unwrap_err()).contains("lora_rank"));
}

/// Conv1d, channel-last, SAME padding, bias: the sum written out.
#[test]
fn conv1d_same_channel_last() {
    let (l, c, oc, k) = (5, 2, 3, 3);
    let conv = Conv1d::new("cv", &[l, c], oc, &[k])
        .unwrap()
        .with_bias(Initializer::Zeros);
    assert_eq!(conv.out_size(), vec![l, oc]);
    let (x, w, b) = (
        vals(2 * l * c, 0.45),
        vals(k * c * oc, 0.8),
        [0.1, 0.2, -0.3],
    );
    let p = vec![
        (conv.key("weight"), t(&w, &[k, c, oc])),
        (conv.key("bias"), t(&b, &[1, oc])),
    ];
    let y = forward(&conv, &p, &t(&x, &[2, l, c]));
    let mut want = vec![0.0; 2 * l * oc];
    for n in 0..2 {
        for p in 0..l {
            for o in 0..oc {
                let mut s = b[o];
                for kk in 0..k {
                    let q = p as i64 + kk as i64 - 1; // SAME: one on each side
                    if q < 0 || q >= l as i64 {
                        continue;
                    }
                    for ci in 0..c {
                        s += x[(n * l + q as usize) * c + ci] * w[(kk * c + ci) * oc + o];
                    }
                }
                want[(n * l + p) * oc + o] = s;
            }
        }
    }
    close(&y, &want);
}

#[test]
fn conv_hyperparameters_are_checked() {
    let e = |r: Result<Conv2d>| invalid(r.unwrap_err());
    assert!(e(Conv2d::new("c", &[4, 4], 2, &[3, 3])).contains("in_size"));
    assert!(e(Conv2d::new("c", &[4, 4, 3], 2, &[3])).contains("kernel_size"));
    assert!(e(Conv2d::new("c", &[4, 4, 3], 0, &[3, 3])).contains("out_channels"));
    assert!(
        e(Conv2d::new("c", &[4, 4, 3], 2, &[3, 3]).and_then(|c| c.with_groups(2)))
            .contains("groups")
    );
    assert!(e(
        Conv2d::new("c", &[4, 4, 3], 2, &[5, 5]).and_then(|c| c.with_padding(ConvPadding::Valid))
    )
    .contains("does not fit"));
    assert!(
        e(Conv2d::new("c", &[4, 4, 3], 2, &[3, 3]).and_then(|c| c.with_stride(&[0, 1])))
            .contains("stride")
    );
    let c = Conv3d::new("c", &[3, 4, 5, 2], 4, &[2, 2, 2])
        .unwrap()
        .with_stride(&[1, 2, 2])
        .unwrap();
    assert_eq!(c.out_size(), vec![3, 2, 3, 4]);
    // The fields are public: a layer changed after construction is checked
    // again when initialised (an error, not a panic).
    let mut c = Conv1d::new("c", &[5, 2], 3, &[3]).unwrap();
    c.0.in_size = vec![];
    c.0.stride = vec![0];
    assert_eq!(c.out_size(), vec![0, 3]);
    let e = invalid(ModelState::new(&c, DType::F64, 0, None).unwrap_err());
    assert!(e.contains("Conv1d `c`") && e.contains("in_size"), "{e}");
}

/// `h' = tanh(W([x, h]))`: the layer as a recurrent weight.
#[derive(Clone, Debug)]
struct Rnn<L> {
    w: L,
    shape: Vec<usize>,
    /// Concatenate on axis 1 (channel-first) rather than the last.
    channel_first: bool,
}

impl<L: Model> Model for Rnn<L> {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.w.init(init)?;
        init.hidden("h", &self.shape)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("h")?;
        let axis = if self.channel_first { 1 } else { x.ndim() - 1 };
        let xh = crate::ops::concat(&[x.clone(), h], axis)?;
        let h2 = self.w.step(ctx, &xh)?.tanh()?;
        ctx.set_hidden("h", h2.clone())?;
        Ok(h2)
    }
}

/// The primitive of the one relation the compiler finds in `m`, and
/// whether D-RTRL runs it through a fused trace kernel or its rules.
fn relation_of<L: Model + Clone>(w: L, x_shape: &[usize], shape: &[usize]) -> String {
    let m = Rnn {
        w,
        shape: shape.to_vec(),
        channel_first: false,
    };
    let st = ModelState::new(&m, DType::F64, 1, Some(2)).unwrap();
    let l = compile(
        m,
        st,
        DRtrl::default(),
        &Tensor::zeros(x_shape, DType::F64),
        Some(2),
    )
    .unwrap();
    let rels = l.graph().relations();
    assert_eq!(rels.len(), 1, "{}", l.explain());
    let lines = l.report().algorithm_lines.join("; ");
    let fused = lines.contains("fused trace kernels: 1 of 1");
    format!(
        "{} ({})",
        rels[0].primitive.name(),
        if fused { "fused" } else { "rules" }
    )
}

#[test]
fn the_compiler_finds_each_layers_relation() {
    let k = 2 + 3;
    let mask = t(&vals(k * 3, 0.2), &[k, 3]);
    assert_eq!(
        relation_of(
            Linear::new("W", k, 3).with_mask(&mask).unwrap(),
            &[2, 2],
            &[3]
        ),
        "etp_mm (fused)"
    );
    let s = SignedWLinear::new("W", k, 3).unwrap().dale(3).unwrap();
    assert_eq!(relation_of(s, &[2, 2], &[3]), "etp_mm (fused)");
    let ws = ScaledWsLinear::new("W", k, 3).unwrap();
    assert_eq!(relation_of(ws, &[2, 2], &[3]), "etp_mm (rules)");
    let dense = t(&vals(k * 3, 0.9), &[k, 3]).relu().unwrap();
    let sp = SparseLinear::from_dense("W", &dense).unwrap();
    assert_eq!(relation_of(sp, &[2, 2], &[3]), "etp_sp_mm (fused)");
    assert_eq!(
        relation_of(Lora::new("W", k, 2, 3).unwrap(), &[2, 2], &[3]),
        "etp_lora_mm (fused)"
    );
    let c = Conv2d::new("W", &[3, 3, k], 3, &[2, 2]).unwrap();
    assert_eq!(
        relation_of(c, &[2, 3, 3, 2], &[3, 3, 3]),
        "etp_conv (rules)"
    );
}

/// One step from a zero state, where D-RTRL and pp_prop are exact: every
/// gradient (the structured weight, a convolution's bias of brainstate's
/// shape, `ScaledWsLinear`'s gain and bias, which have no relation and
/// take the in-step gradient) equals BPTT's.
fn one_step_is_exact<L: Model + Clone>(w: L, x_shape: &[usize], shape: &[usize]) {
    one_step_exact_in(w, x_shape, shape, false)
}

fn one_step_exact_in<L: Model + Clone>(w: L, x_shape: &[usize], shape: &[usize], cf: bool) {
    let m = Rnn {
        w,
        shape: shape.to_vec(),
        channel_first: cf,
    };
    let b = x_shape[0];
    let n: usize = x_shape.iter().product();
    let xs = t(&vals(n, 0.37), &[&[1], x_shape].concat());
    let h: usize = shape.iter().product();
    let ys = t(&vals(b * h, 0.71), &[&[1, b][..], shape].concat());
    let sq = |o: &Tensor, y: &Tensor| o.sub(y)?.square()?.mean_all();
    let st = ModelState::new(&m, DType::F64, 3, Some(b)).unwrap();
    let want = bptt_grad(&m, &st, &xs, &ys, sq, Reduction::Mean).unwrap();
    for algo in [
        crate::learn::Algorithm::from(DRtrl::default()),
        crate::learn::PpProp::new(0.9).unwrap().into(),
    ] {
        let st = ModelState::new(&m, DType::F64, 3, Some(b)).unwrap();
        let x0 = xs.index_axis0(0).unwrap().zeros_like();
        let mut l = compile(m.clone(), st, algo, &x0, Some(b)).unwrap();
        let got = l.etrace_grad(&xs, &ys, sq, Reduction::Mean).unwrap();
        assert_eq!(got.grads.len(), want.grads.len());
        for (k, g) in &want.grads {
            let (a, e) = (got.grads[k].to_vec_f64().unwrap(), g.to_vec_f64().unwrap());
            assert_eq!(got.grads[k].shape(), g.shape(), "{k}");
            for (u, v) in a.iter().zip(&e) {
                assert!((u - v).abs() < 1e-12 * (1.0 + v.abs()), "{k}: {u} vs {v}");
            }
        }
    }
}

#[test]
fn one_step_gradients_equal_bptt() {
    let k = 2 + 3;
    let mask = t(&vals(k * 3, 0.2), &[k, 3]);
    one_step_is_exact(
        Linear::new("W", k, 3).with_mask(&mask).unwrap(),
        &[2, 2],
        &[3],
    );
    one_step_is_exact(
        SignedWLinear::new("W", k, 3).unwrap().dale(2).unwrap(),
        &[2, 2],
        &[3],
    );
    one_step_is_exact(ScaledWsLinear::new("W", k, 3).unwrap(), &[2, 2], &[3]);
    let dense = t(&vals(k * 3, 0.9), &[k, 3]).relu().unwrap();
    let sp = SparseLinear::from_dense("W", &dense)
        .unwrap()
        .with_bias(Initializer::Normal { std: 0.5 });
    one_step_is_exact(sp, &[2, 2], &[3]);
    one_step_is_exact(Lora::new("W", k, 2, 3).unwrap(), &[2, 2], &[3]);
    let bias = Initializer::Normal { std: 0.5 };
    let c1 = Conv1d::new("W", &[4, k], 3, &[3]).unwrap().with_bias(bias);
    one_step_is_exact(c1, &[2, 4, 2], &[4, 3]);
    let c2 = Conv2d::new("W", &[3, 3, k], 3, &[2, 2])
        .unwrap()
        .with_bias(bias);
    one_step_is_exact(c2, &[2, 3, 3, 2], &[3, 3, 3]);
    let c3 = Conv3d::new("W", &[2, 2, 2, k], 3, &[2, 2, 2])
        .unwrap()
        .with_bias(bias);
    one_step_is_exact(c3, &[2, 2, 2, 2, 2], &[2, 2, 2, 3]);
    // Channel-first: in_size (C, W), bias (1, C, 1).
    let c1 = Conv1d::new("W", &[k, 4], 3, &[3])
        .unwrap()
        .channel_first()
        .unwrap()
        .with_bias(bias);
    assert_eq!(c1.out_size(), vec![3, 4]);
    one_step_exact_in(c1, &[2, 2, 4], &[3, 4], true);
}

/// A transform that is not element-wise has a pullback, no derivative, and
/// the fused trace kernels decline it.
#[test]
fn a_mapping_transform_runs_the_rules() {
    let f = ScaledWsLinear::new("ws", 3, 2)
        .unwrap()
        .transform()
        .unwrap();
    assert!(!f.is_elementwise());
    let w = t(&vals(6, 0.5), &[3, 2]);
    assert!(f.derivative(&w).is_err());
    assert_eq!(f.pullback(&w, &w).unwrap().shape(), &[3, 2]);
    let k = crate::etp::TraceKernel::dense_with_fns("weight", None, "weight_fn", "bias_fn");
    let p = |f: ElemFn| crate::etp::Params::new().with("weight_fn", f);
    assert!(!k.readable(&p(f)));
    assert!(k.readable(&p(ElemFn::builtin("tanh").unwrap())));
}
