//! Tests of the non-temporal blocks: every activation and norm against an
//! explicit f64 computation, gradients against central finite differences,
//! pooling against explicit loops, dropout's statistics and evaluation
//! mode, `vmap`/`jit` through the blocks, and constructor errors.

use super::activation::{self as act, Activation, PRelu, SELU_ALPHA, SELU_SCALE};
use super::{
    Dropout, Flatten, GroupNorm, LayerNorm, Pool1d, Pool2d, RmsNorm, Sequential, Unflatten,
};
use crate::error::{Error, Result};
use crate::learn::{Model, ModelState};
use crate::random::Rng;
use crate::tensor::{DType, Tensor};
use crate::transform::{grad, jit, vmap};

fn draw(shape: &[usize], seed: u64, scale: f64) -> Tensor {
    let mut r = Rng::seed(seed);
    let n = shape.iter().product();
    // Keep entries away from the kinks at 0, ±0.5, ±1, ±3, 6 and 0.3.
    let kinks = [0.0, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, 6.0, 0.3];
    let v = (0..n)
        .map(|_| {
            let mut x = scale * r.normal();
            for k in kinks {
                if (x - k).abs() < 0.02 {
                    x = k + 0.02f64.copysign(x - k);
                }
            }
            x
        })
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

/// `grad f` at `x` against central differences of `f` (f64).
fn check_fd(name: &str, f: impl Fn(&Tensor) -> Result<Tensor>, x: &Tensor) {
    let cot = draw(f(x).unwrap().shape(), 99, 1.0);
    let loss = |a: &Tensor| f(a)?.mul(&cot)?.sum_all();
    let g = grad(|a: &[Tensor]| loss(&a[0]))(std::slice::from_ref(x)).unwrap()[0]
        .to_vec_f64()
        .unwrap();
    let v = x.to_vec_f64().unwrap();
    let eps = 1e-6;
    for i in 0..v.len() {
        let at = |d: f64| {
            let mut w = v.clone();
            w[i] += d;
            loss(&Tensor::from_vec(w, x.shape()).unwrap())
                .unwrap()
                .item()
                .unwrap()
        };
        let fd = (at(eps) - at(-eps)) / (2.0 * eps);
        assert!(
            (fd - g[i]).abs() <= 1e-6 * (1.0 + fd.abs()),
            "{name}: element {i} (x = {}): grad {} vs finite difference {fd}",
            v[i],
            g[i]
        );
    }
}

fn erf_ref(x: f64) -> f64 {
    // Reference by Simpson's rule on 2/√π e^{−t²} with 20 000 panels
    // (truncation error below 1e-16 for |x| ≤ 6, rounding of the 20 000-term
    // sum up to ~1e-14), independent of the op's series.
    let n = 20_000;
    let h = x / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x);
    for i in 1..n {
        let w = if i % 2 == 1 { 4.0 } else { 2.0 };
        s += w * f(i as f64 * h);
    }
    s * h / 3.0 * std::f64::consts::FRAC_2_SQRT_PI
}

#[test]
fn erf_op_matches_tabulated_values_and_quadrature() {
    let table = [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (2.5, 0.999_593_047_982_555),
        (3.0, 0.999_977_909_503_001_4),
        // C libm's erf (glibc, through Python's math.erf), both branches.
        (0.7, 0.677_801_193_837_418_4),
        (1.9, 0.992_790_429_235_257_5),
        (2.49, 0.999_570_712_132_266_1),
        (2.51, 0.999_614_294_518_275_8),
        (3.7, 0.999_999_832_848_942_1),
        (5.5, 0.999_999_999_999_992_7),
    ];
    for (x, want) in table {
        let got = Tensor::scalar(x).erf().unwrap().item().unwrap();
        assert!((got - want).abs() < 1e-15, "erf({x}) = {got} vs {want}");
        let neg = Tensor::scalar(-x).erf().unwrap().item().unwrap();
        assert_eq!(neg, -got);
    }
    for x in [0.05, 0.7, 1.9, 2.49, 2.51, 3.7, 5.5] {
        let got = Tensor::scalar(x).erf().unwrap().item().unwrap();
        let want = erf_ref(x);
        assert!((got - want).abs() < 5e-14, "erf({x}) = {got} vs {want}");
    }
    check_fd("erf", |a| a.erf(), &draw(&[40], 1, 2.0));
}

/// Every activation of `Activation` against its definition in f64.
fn reference(a: &Activation, x: f64) -> f64 {
    use Activation::*;
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let sp = |x: f64| x.max(0.0) + (-x.abs()).exp().ln_1p();
    let r6 = |x: f64| x.clamp(0.0, 6.0);
    match *a {
        Identity => x,
        Relu => x.max(0.0),
        Relu6 => r6(x),
        Sigmoid => sig(x),
        Tanh => x.tanh(),
        HardSigmoid => r6(x + 3.0) / 6.0,
        HardSwish => x * r6(x + 3.0) / 6.0,
        Silu => x * sig(x),
        Mish => x * sp(x).tanh(),
        Elu { alpha } => {
            if x > 0.0 {
                x
            } else {
                alpha * x.exp_m1()
            }
        }
        Celu { alpha } => x.max(0.0) + alpha * (x.min(0.0) / alpha).exp_m1(),
        Selu => SELU_SCALE * if x > 0.0 { x } else { SELU_ALPHA * x.exp_m1() },
        Gelu { approximate: false } => 0.5 * x * (1.0 + erf_ref(x / 2f64.sqrt())),
        Gelu { approximate: true } => {
            let s = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (s * (x + 0.044715 * x * x * x)).tanh())
        }
        LeakyRelu { negative_slope } => {
            if x >= 0.0 {
                x
            } else {
                negative_slope * x
            }
        }
        LogSigmoid => sig(x).ln(),
        Softplus => sp(x),
        Softsign => x / (1.0 + x.abs()),
        Hardtanh { min_val, max_val } => x.clamp(min_val, max_val),
        Hardshrink { lambd } => {
            if x.abs() > lambd {
                x
            } else {
                0.0
            }
        }
        Softshrink { lambd } => {
            if x > lambd {
                x - lambd
            } else if x < -lambd {
                x + lambd
            } else {
                0.0
            }
        }
        Tanhshrink => x - x.tanh(),
        Threshold { threshold, value } => {
            if x > threshold {
                x
            } else {
                value
            }
        }
        Squareplus { b } => (x + (x * x + b).sqrt()) / 2.0,
        SparsePlus => {
            if x <= -1.0 {
                0.0
            } else if x >= 1.0 {
                x
            } else {
                (x + 1.0) * (x + 1.0) / 4.0
            }
        }
        SparseSigmoid => 0.5 * (x + 1.0).clamp(0.0, 2.0),
        Softmax { .. } | LogSoftmax { .. } | Softmin { .. } | Glu { .. } => unreachable!(),
    }
}

fn elementwise_activations() -> Vec<Activation> {
    use Activation::*;
    let mut v: Vec<Activation> = [
        "identity",
        "relu",
        "relu6",
        "sigmoid",
        "tanh",
        "hardsigmoid",
        "hardswish",
        "silu",
        "mish",
        "elu",
        "celu",
        "selu",
        "gelu",
        "leakyrelu",
        "logsigmoid",
        "softplus",
        "softsign",
        "hardtanh",
        "hardshrink",
        "softshrink",
        "tanhshrink",
        "squareplus",
        "sparse_plus",
        "sparse_sigmoid",
    ]
    .iter()
    .map(|n| Activation::by_name(n).unwrap_or_else(|| panic!("{n}")))
    .collect();
    v.extend([
        Gelu { approximate: true },
        Elu { alpha: 0.3 },
        Celu { alpha: 2.0 },
        Threshold {
            threshold: 0.3,
            value: -1.5,
        },
        Hardtanh {
            min_val: -3.0,
            max_val: 0.5,
        },
    ]);
    v
}

#[test]
fn elementwise_activations_match_their_definitions_and_finite_differences() {
    let x = draw(&[3, 7], 2, 3.0);
    let xv = x.to_vec_f64().unwrap();
    for a in elementwise_activations() {
        let y = a.apply(&x).unwrap().to_vec_f64().unwrap();
        for (i, (&yi, &xi)) in y.iter().zip(&xv).enumerate() {
            let want = reference(&a, xi);
            assert!(
                (yi - want).abs() <= 1e-12 * (1.0 + want.abs()),
                "{a:?}[{i}] at {xi}: {yi} vs {want}"
            );
        }
        check_fd(&format!("{a:?}"), |t| a.apply(t), &x);
    }
}

#[test]
fn softmax_family_and_glu_match_explicit_rows() {
    let x = draw(&[2, 3, 4], 3, 2.0);
    let v = x.to_vec_f64().unwrap();
    // Rows along the last axis.
    let sm = |r: &[f64]| {
        let m = r.iter().cloned().fold(f64::MIN, f64::max);
        let s: f64 = r.iter().map(|a| (a - m).exp()).sum();
        r.iter().map(|a| (a - m).exp() / s).collect::<Vec<_>>()
    };
    let got = act::softmax(&x, -1).unwrap().to_vec_f64().unwrap();
    let lsm = act::log_softmax(&x, -1).unwrap().to_vec_f64().unwrap();
    let smin = act::softmin(&x, 2).unwrap().to_vec_f64().unwrap();
    for r in 0..6 {
        let row = &v[r * 4..r * 4 + 4];
        let want = sm(row);
        let neg: Vec<f64> = row.iter().map(|a| -a).collect();
        let want_min = sm(&neg);
        for c in 0..4 {
            assert!((got[r * 4 + c] - want[c]).abs() < 1e-14);
            assert!((lsm[r * 4 + c] - want[c].ln()).abs() < 1e-13);
            assert!((smin[r * 4 + c] - want_min[c]).abs() < 1e-14);
        }
    }
    // Softmax over axis 1 (a middle axis): columns of 3.
    let mid = act::softmax(&x, 1).unwrap().to_vec_f64().unwrap();
    for b in 0..2 {
        for c in 0..4 {
            let col: Vec<f64> = (0..3).map(|j| v[b * 12 + j * 4 + c]).collect();
            let want = sm(&col);
            for j in 0..3 {
                assert!((mid[b * 12 + j * 4 + c] - want[j]).abs() < 1e-14);
            }
        }
    }
    // GLU halves the last axis: a · σ(b).
    let g = act::glu(&x, -1).unwrap();
    assert_eq!(g.shape(), &[2, 3, 2]);
    let gv = g.to_vec_f64().unwrap();
    for r in 0..6 {
        for c in 0..2 {
            let (a, b) = (v[r * 4 + c], v[r * 4 + 2 + c]);
            assert!((gv[r * 2 + c] - a / (1.0 + (-b).exp())).abs() < 1e-14);
        }
    }
    for a in [
        Activation::Softmax { axis: -1 },
        Activation::LogSoftmax { axis: 1 },
        Activation::Softmin { axis: 0 },
        Activation::Glu { axis: -1 },
    ] {
        check_fd(&format!("{a:?}"), |t| a.apply(t), &x);
    }
    assert!(act::glu(&draw(&[3], 1, 1.0), 0).is_err());
    assert!(act::softmax(&x, 3).is_err());
}

/// LayerNorm / RmsNorm / GroupNorm by explicit loops (two-pass variance).
fn norm_ref(v: &[f64], groups: &[Vec<usize>], eps: f64, rms: bool) -> Vec<f64> {
    let mut out = vec![0.0; v.len()];
    for g in groups {
        let n = g.len() as f64;
        let mean = if rms {
            0.0
        } else {
            g.iter().map(|&i| v[i]).sum::<f64>() / n
        };
        let var = g.iter().map(|&i| (v[i] - mean).powi(2)).sum::<f64>() / n;
        for &i in g {
            out[i] = (v[i] - mean) / (var + eps).sqrt();
        }
    }
    out
}

fn eval(model: &dyn Model, x: &Tensor) -> (ModelState, Tensor) {
    let st = ModelState::new(model, DType::F64, 0, None).unwrap();
    let y = st.step(model, x).unwrap().0;
    (st, y)
}

#[test]
fn norms_match_explicit_loops_and_finite_differences() {
    let x = draw(&[3, 6], 4, 1.5).add_scalar(0.4).unwrap();
    let v = x.to_vec_f64().unwrap();
    let rows: Vec<Vec<usize>> = (0..3).map(|r| (r * 6..r * 6 + 6).collect()).collect();
    let groups3: Vec<Vec<usize>> = (0..3)
        .flat_map(|r| (0..3).map(move |g| (r * 6 + 2 * g..r * 6 + 2 * g + 2).collect()))
        .collect();
    let cases: Vec<(Box<dyn Model>, Vec<f64>)> = vec![
        (
            Box::new(LayerNorm::new("ln", 6).with_eps(1e-3)),
            norm_ref(&v, &rows, 1e-3, false),
        ),
        (
            Box::new(RmsNorm::new("rms", 6)),
            norm_ref(&v, &rows, 1e-6, true),
        ),
        (
            Box::new(GroupNorm::new("gn", 6, 3)),
            norm_ref(&v, &groups3, 1e-6, false),
        ),
    ];
    for (m, want) in &cases {
        let (st, y) = eval(m.as_ref(), &x);
        let y = y.to_vec_f64().unwrap();
        for (a, b) in y.iter().zip(want) {
            assert!(
                (a - b).abs() < 1e-12,
                "{m:?}: {a} vs {b}",
                m = st.params().keys()
            );
        }
        let infos = st.param_infos().to_vec();
        let pv = st.param_values().to_vec();
        check_fd(
            "norm",
            |t| Ok(crate::learn::step_values(m.as_ref(), &infos, &pv, &[], &[], t)?.0),
            &x,
        );
    }
    // Parameter keys as brainstate names them.
    let (st, _) = eval(&LayerNorm::new("ln", 6), &x);
    assert_eq!(
        st.params().keys().cloned().collect::<Vec<_>>(),
        ["ln/weight/bias", "ln/weight/scale"]
    );
    let (st, _) = eval(&RmsNorm::new("rms", 6), &x);
    assert_eq!(
        st.params().keys().cloned().collect::<Vec<_>>(),
        ["rms/scale/scale"]
    );
}

#[test]
fn pooling_matches_explicit_loops() {
    // (batch 2, L 7, C 3): max with kernel 3 stride 2 padding 1, avg the same
    // (counting only non-padded positions).
    let x = draw(&[2, 7, 3], 5, 1.0);
    let v = x.to_vec_f64().unwrap();
    let at = |b: usize, l: isize, c: usize| -> Option<f64> {
        (0..7).contains(&l).then(|| v[b * 21 + l as usize * 3 + c])
    };
    let mp = Pool1d::max([3])
        .with_stride([2])
        .with_padding(1)
        .apply(&x)
        .unwrap();
    let ap = Pool1d::avg([3])
        .with_stride([2])
        .with_padding(1)
        .apply(&x)
        .unwrap();
    assert_eq!(mp.shape(), &[2, 4, 3]);
    let (mv, av) = (mp.to_vec_f64().unwrap(), ap.to_vec_f64().unwrap());
    for b in 0..2 {
        for o in 0..4 {
            for c in 0..3 {
                let win: Vec<f64> = (0..3)
                    .filter_map(|j| at(b, (o * 2 + j) as isize - 1, c))
                    .collect();
                let m = win.iter().cloned().fold(f64::MIN, f64::max);
                let a = win.iter().sum::<f64>() / win.len() as f64;
                assert!((mv[b * 12 + o * 3 + c] - m).abs() < 1e-15);
                assert!((av[b * 12 + o * 3 + c] - a).abs() < 1e-15);
            }
        }
    }
    // 2-D: (H 4, W 5, C 2), kernel 2, stride 1, no padding.
    let x2 = draw(&[4, 5, 2], 6, 1.0);
    let v2 = x2.to_vec_f64().unwrap();
    let y2 = Pool2d::max([2, 2]).with_stride([1, 1]).apply(&x2).unwrap();
    assert_eq!(y2.shape(), &[3, 4, 2]);
    let y2v = y2.to_vec_f64().unwrap();
    for i in 0..3 {
        for j in 0..4 {
            for c in 0..2 {
                let m = [(0, 0), (0, 1), (1, 0), (1, 1)]
                    .iter()
                    .map(|(a, b)| v2[(i + a) * 10 + (j + b) * 2 + c])
                    .fold(f64::MIN, f64::max);
                assert_eq!(y2v[i * 8 + j * 2 + c], m);
            }
        }
    }
    check_fd(
        "avgpool2d",
        |t| {
            Pool2d::avg([2, 3])
                .with_stride([2, 1])
                .with_padding(1)
                .apply(t)
        },
        &x2,
    );
    check_fd("maxpool1d", |t| Pool1d::max([2]).apply(t), &x);
}

#[test]
fn flatten_and_unflatten() {
    let x = draw(&[2, 3, 4, 5], 7, 1.0);
    assert_eq!(Flatten::new(3).apply(&x).unwrap().shape(), &[2, 60]);
    assert_eq!(
        Flatten::new(3).with_axes(0, 1).apply(&x).unwrap().shape(),
        &[2, 12, 5]
    );
    let y = Unflatten::new(-1, &[5, 1]).apply(&x).unwrap();
    assert_eq!(y.shape(), &[2, 3, 4, 5, 1]);
    let back = Unflatten::new(1, &[3, 20])
        .apply(&Flatten::new(3).apply(&x).unwrap())
        .unwrap();
    assert_eq!(back.to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
    assert!(Unflatten::new(-1, &[2, 3]).apply(&x).is_err());
    assert!(Flatten::new(2).with_axes(1, 0).apply(&x).is_err());
}

#[test]
fn dropout_keeps_the_right_fraction_and_is_the_identity_when_evaluating() {
    let d = Dropout::new(0.3, 11).unwrap();
    let x = draw(&[200, 100], 8, 1.0);
    let y = d.apply(&x).unwrap().to_vec_f64().unwrap();
    let xv = x.to_vec_f64().unwrap();
    let kept = y.iter().filter(|&&a| a != 0.0).count() as f64 / y.len() as f64;
    // 20 000 Bernoulli(0.7) draws: standard error 0.0032; 5 of them.
    assert!((kept - 0.7).abs() < 0.016, "kept {kept}");
    for (a, b) in y.iter().zip(&xv) {
        assert!(*a == 0.0 || (a - b / 0.7).abs() < 1e-12);
    }
    // Another input draws another mask.
    let y2 = d
        .apply(&x.mul_scalar(1.1).unwrap())
        .unwrap()
        .to_vec_f64()
        .unwrap();
    let same = y
        .iter()
        .zip(&y2)
        .filter(|(a, b)| (**a == 0.0) == (**b == 0.0))
        .count() as f64
        / y.len() as f64;
    assert!(same < 0.7, "masks agree on {same}");
    // Another seed too.
    let y3 = Dropout::new(0.3, 12)
        .unwrap()
        .apply(&x)
        .unwrap()
        .to_vec_f64()
        .unwrap();
    assert_ne!(y, y3);
    // Gradient: 1/q on the kept entries, 0 on the dropped ones (the mask is
    // a hash of the input, so finite differences would redraw it).
    let small = draw(&[4, 5], 9, 1.0);
    let ys = d.apply(&small).unwrap().to_vec_f64().unwrap();
    let g = grad(|a: &[Tensor]| d.apply(&a[0])?.sum_all())(std::slice::from_ref(&small)).unwrap()
        [0]
    .to_vec_f64()
    .unwrap();
    for (gi, yi) in g.iter().zip(&ys) {
        assert_eq!(*gi, if *yi == 0.0 { 0.0 } else { 1.0 / 0.7 });
    }
    // Evaluating (through a clone: the flag is shared).
    let e = d.clone();
    e.set_training(false);
    assert!(!d.training());
    assert_eq!(d.apply(&x).unwrap().to_vec_f64().unwrap(), xv);
    for p in [-0.1, 1.0, 1.5, f64::NAN] {
        let err = Dropout::new(p, 0).unwrap_err();
        assert!(err.to_string().contains("Dropout"), "{err}");
    }
}

#[test]
fn blocks_go_through_vmap_and_jit() {
    let x = draw(&[4, 6], 10, 1.5);
    let model = Sequential::new()
        .push(LayerNorm::new("ln", 6))
        .push(Activation::Gelu { approximate: false })
        .push(Activation::Softmax { axis: -1 });
    let st = ModelState::new(&model, DType::F64, 0, None).unwrap();
    let want = st.step(&model, &x).unwrap().0.to_vec_f64().unwrap();
    let f = |a: &[Tensor]| Ok(vec![st.step(&model, &a[0])?.0]);
    // vmap over rows of x equals the batched step.
    let rows = vmap(f, vec![Some(0)])(std::slice::from_ref(&x)).unwrap();
    let got = rows[0].to_vec_f64().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-14);
    }
    let jitted = jit(f)(std::slice::from_ref(&x)).unwrap();
    for (a, b) in jitted[0].to_vec_f64().unwrap().iter().zip(&want) {
        assert!((a - b).abs() < 1e-14);
    }
}

#[test]
fn pooling_goes_through_vmap_and_jit() {
    // (batch 3, L 7, C 2); strided windows are gathers (`take`).
    let x = draw(&[3, 7, 2], 13, 1.0);
    for p in [
        Pool1d::avg([3]).with_stride([2]).with_padding(1),
        Pool1d::max([2]).with_stride([3]),
    ] {
        let want = p.apply(&x).unwrap().to_vec_f64().unwrap();
        let f = |a: &[Tensor]| Ok(vec![p.apply(&a[0])?]);
        let v = vmap(f, vec![Some(0)])(std::slice::from_ref(&x)).unwrap();
        assert_eq!(v[0].to_vec_f64().unwrap(), want);
        let j = jit(f)(std::slice::from_ref(&x)).unwrap();
        assert_eq!(j[0].to_vec_f64().unwrap(), want);
        check_fd(
            "pool under jit",
            |t| Ok(jit(f)(std::slice::from_ref(t))?.remove(0)),
            &x,
        );
    }
}

#[test]
fn prelu_learns_its_slope() {
    let p = PRelu::new("act", 3);
    let x = draw(&[4, 3], 12, 1.0);
    let st = ModelState::new(&p, DType::F64, 0, None).unwrap();
    assert_eq!(
        st.param("act/weight").unwrap().to_vec_f64().unwrap(),
        [0.25; 3]
    );
    let infos = st.param_infos().to_vec();
    let g = grad(|a: &[Tensor]| {
        crate::learn::step_values(&p, &infos, &a[1..], &[], &[], &a[0])?
            .0
            .sum_all()
    })(&[x.clone(), st.param("act/weight").unwrap().clone()])
    .unwrap();
    // d/da Σ prelu = Σ over rows of min(x, 0).
    let xv = x.to_vec_f64().unwrap();
    for c in 0..3 {
        let want: f64 = (0..4).map(|r| xv[r * 3 + c].min(0.0)).sum();
        assert!((g[1].to_vec_f64().unwrap()[c] - want).abs() < 1e-14);
    }
}

#[test]
fn constructors_refuse_bad_hyperparameters() {
    let expect = |m: &dyn Model, layer: &str, value: &str| {
        let e = ModelState::new(m, DType::F64, 0, None).unwrap_err();
        let s = e.to_string();
        assert!(matches!(e, Error::Invalid { .. }), "{s}");
        assert!(s.contains(layer) && s.contains(value), "{s}");
    };
    expect(&LayerNorm::new("ln", 0), "LayerNorm `ln`", "0");
    expect(
        &LayerNorm::new("ln", 4).with_eps(0.0),
        "LayerNorm `ln`",
        "eps",
    );
    expect(&RmsNorm::new("r", 4).with_eps(-1.0), "RmsNorm `r`", "-1");
    expect(&GroupNorm::new("g", 6, 4), "GroupNorm `g`", "num_groups 4");
    expect(&GroupNorm::new("g", 6, 0), "GroupNorm `g`", "num_groups");
    expect(&PRelu::new("p", 0), "PRelu `p`", "num_parameters");
    expect(&Activation::Celu { alpha: 0.0 }, "Celu", "alpha");
    expect(
        &Activation::Hardtanh {
            min_val: 1.0,
            max_val: -1.0,
        },
        "Hardtanh",
        "min_val 1",
    );
    expect(&Pool1d::max([0]), "MaxPool1d", "kernel");
    expect(&Pool2d::avg([2, 2]).with_padding(2), "AvgPool2d", "padding");
    expect(&Sequential::new(), "Sequential", "no layers");
    expect(&Unflatten::new(0, &[]), "Unflatten", "[]");
    // A wrong input width names the layer and the shape.
    let ln = LayerNorm::new("ln", 4);
    let st = ModelState::new(&ln, DType::F64, 0, None).unwrap();
    let e = st
        .step(&ln, &Tensor::zeros(&[2, 5], DType::F64))
        .unwrap_err();
    assert!(
        e.to_string().contains("LayerNorm `ln`") && e.to_string().contains("[2, 5]"),
        "{e}"
    );
}
