//! Integration tests of the convolution op: forward against a naive loop,
//! derivatives against central finite differences, the adjoint identities
//! of the three conv primitives, second order (transposes of transposes),
//! vmap against explicit loops, graph params and error cases.
//!
//! The references here never call the code under test to compute an
//! expected value: the naive convolution is an independent loop, finite
//! differences only evaluate the function, and layouts are built by
//! permuting ndarray data directly.

use braintrace::kernels::conv::ConvGeometry;
use braintrace::ops::conv::{conv_raw, conv_transpose_lhs_raw, conv_transpose_rhs_raw};
use braintrace::ops::{conv_general, ConvPadding, ConvParams};
use braintrace::{grad, jvp, make_graph, vjp, vmap, Aval, DType, Error, Tensor};
use ndarray::{ArrayD, Dimension, IxDyn};

// ------------------------------------------------------------------ helpers

struct Lcg(u64);

impl Lcg {
    fn new(seed: u64) -> Self {
        Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(7))
    }
    fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as f64 / (1u64 << 31) as f64
    }
    fn array(&mut self, shape: &[usize]) -> ArrayD<f64> {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| 2.0 * self.unit() - 1.0).collect();
        ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
    }
}

fn t(a: &ArrayD<f64>) -> Tensor {
    Tensor::from_array(a.as_standard_layout().into_owned())
}

fn arr(x: &Tensor) -> ArrayD<f64> {
    x.to_array_f64().unwrap()
}

/// Permute axes: axis i of the result is axis `perm[i]` of `a`.
fn permute(a: &ArrayD<f64>, perm: &[usize]) -> ArrayD<f64> {
    a.clone()
        .permuted_axes(IxDyn(perm))
        .as_standard_layout()
        .into_owned()
}

fn assert_close(got: &ArrayD<f64>, want: &ArrayD<f64>, rel: f64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shapes differ");
    let scale = want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(want.iter())
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        err <= rel * scale.max(1.0e-12),
        "{what}: max abs error {err:e} exceeds {rel:e} * scale {scale:e}\n got {got:?}\nwant {want:?}"
    );
}

/// Canonical geometry of the naive reference.
#[derive(Clone, Debug)]
struct Geo {
    strides: Vec<usize>,
    pad: Vec<(i64, i64)>,
    ld: Vec<usize>,
    rd: Vec<usize>,
    groups: usize,
}

impl Geo {
    fn plain(d: usize) -> Geo {
        Geo {
            strides: vec![1; d],
            pad: vec![(0, 0); d],
            ld: vec![1; d],
            rd: vec![1; d],
            groups: 1,
        }
    }
    fn params(&self) -> ConvParams {
        ConvParams::default_for(self.strides.len())
            .with_strides(&self.strides)
            .with_padding(ConvPadding::Explicit(self.pad.clone()))
            .with_lhs_dilation(&self.ld)
            .with_rhs_dilation(&self.rd)
            .with_groups(self.groups)
    }
}

/// SAME padding per JAX, written out independently: out = ceil(n/s) on the
/// (lhs-dilated) input size n, total = max((out-1)*s + (k-1)*d + 1 - n, 0).
fn same_pad(n: usize, ld: usize, k: usize, s: usize, rd: usize) -> (i64, i64) {
    let n = if n == 0 { 0 } else { ((n - 1) * ld + 1) as i64 };
    let (k, s, rd) = (k as i64, s as i64, rd as i64);
    let out = (n + s - 1) / s;
    let total = ((out - 1) * s + (k - 1) * rd + 1 - n).max(0);
    (total / 2, total - total / 2)
}

/// The naive convolution on canonical layouts: x (N, C, s..), k (O, C/G, k..).
fn naive(x: &ArrayD<f64>, k: &ArrayD<f64>, g: &Geo) -> ArrayD<f64> {
    let d = x.ndim() - 2;
    let (n, c, o) = (x.shape()[0], x.shape()[1], k.shape()[0]);
    let (cg, og) = (c / g.groups, o / g.groups);
    assert_eq!(k.shape()[1], cg);
    let mut ys = vec![n, o];
    let mut dil_in = vec![0i64; d];
    #[allow(clippy::needless_range_loop)]
    for i in 0..d {
        let ni = x.shape()[2 + i] as i64;
        dil_in[i] = if ni == 0 {
            0
        } else {
            (ni - 1) * g.ld[i] as i64 + 1
        };
        let padded = dil_in[i] + g.pad[i].0 + g.pad[i].1;
        let dk = (k.shape()[2 + i] as i64 - 1) * g.rd[i] as i64 + 1;
        ys.push(if padded >= dk {
            ((padded - dk) / g.strides[i] as i64 + 1) as usize
        } else {
            0
        });
    }
    let mut y = ArrayD::<f64>::zeros(IxDyn(&ys));
    let kspatial: Vec<usize> = k.shape()[2..].to_vec();
    for (idx, v) in y.indexed_iter_mut() {
        let (bn, bo) = (idx[0], idx[1]);
        let grp = bo / og;
        let mut acc = 0.0;
        for ci in 0..cg {
            for u in ndarray::indices(IxDyn(&kspatial)) {
                let mut xi = vec![bn, grp * cg + ci];
                let mut ok = true;
                for i in 0..d {
                    let q = idx[2 + i] as i64 * g.strides[i] as i64 + u[i] as i64 * g.rd[i] as i64
                        - g.pad[i].0;
                    if q < 0 || q >= dil_in[i] || q % g.ld[i] as i64 != 0 {
                        ok = false;
                        break;
                    }
                    xi.push((q / g.ld[i] as i64) as usize);
                }
                if ok {
                    let mut ki = vec![bo, ci];
                    ki.extend(u.as_array_view().iter());
                    acc += x[IxDyn(&xi)] * k[IxDyn(&ki)];
                }
            }
        }
        *v = acc;
    }
    y
}

fn dot(a: &ArrayD<f64>, b: &ArrayD<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter().zip(b.iter()).map(|(x, y)| x * y).sum()
}

/// Central-difference gradient of a scalar function of several arrays.
fn fd_grad(f: &dyn Fn(&[ArrayD<f64>]) -> f64, args: &[ArrayD<f64>], h: f64) -> Vec<ArrayD<f64>> {
    let mut out = Vec::new();
    for i in 0..args.len() {
        let mut g = ArrayD::<f64>::zeros(args[i].raw_dim());
        for j in 0..args[i].len() {
            let mut a = args.to_vec();
            let base = a[i].as_slice_mut().unwrap()[j];
            a[i].as_slice_mut().unwrap()[j] = base + h;
            let fp = f(&a);
            a[i].as_slice_mut().unwrap()[j] = base - h;
            let fm = f(&a);
            g.as_slice_mut().unwrap()[j] = (fp - fm) / (2.0 * h);
        }
        out.push(g);
    }
    out
}

// ------------------------------------------------------------------ forward

fn check_forward_canonical(xs: &[usize], ks: &[usize], g: &Geo, seed: u64) {
    let mut r = Lcg::new(seed);
    let (x, k) = (r.array(xs), r.array(ks));
    let want = naive(&x, &k, g);
    let got = arr(&conv_general(&t(&x), &t(&k), &g.params()).unwrap());
    assert_close(&got, &want, 1e-12, &format!("forward {xs:?} {ks:?} {g:?}"));
    // The method is the same op.
    let got2 = arr(&t(&x).conv(&t(&k), &g.params()).unwrap());
    assert_close(&got2, &want, 1e-12, "Tensor::conv");
}

#[test]
fn forward_1d_matches_naive() {
    let mut g = Geo::plain(1);
    check_forward_canonical(&[2, 3, 9], &[4, 3, 3], &g, 1);
    g.strides = vec![2];
    check_forward_canonical(&[2, 3, 10], &[4, 3, 3], &g, 2);
    g.pad = vec![(2, 1)];
    check_forward_canonical(&[2, 3, 10], &[4, 3, 3], &g, 3);
    g.rd = vec![2];
    check_forward_canonical(&[1, 2, 11], &[3, 2, 3], &g, 4);
    g.ld = vec![3];
    check_forward_canonical(&[1, 2, 5], &[3, 2, 2], &g, 5);
    // negative padding crops
    let mut g = Geo::plain(1);
    g.pad = vec![(-1, -2)];
    check_forward_canonical(&[1, 2, 9], &[2, 2, 2], &g, 6);
}

#[test]
fn forward_2d_matches_naive() {
    let mut g = Geo::plain(2);
    check_forward_canonical(&[2, 3, 6, 5], &[4, 3, 3, 2], &g, 10);
    g.strides = vec![2, 1];
    g.pad = vec![(1, 1), (0, 2)];
    check_forward_canonical(&[2, 3, 7, 5], &[4, 3, 3, 2], &g, 11);
    g.rd = vec![2, 1];
    check_forward_canonical(&[1, 2, 8, 6], &[3, 2, 2, 3], &g, 12);
    g.ld = vec![2, 3];
    check_forward_canonical(&[1, 2, 4, 3], &[3, 2, 2, 2], &g, 13);
}

#[test]
fn forward_groups_matches_naive() {
    let mut g = Geo::plain(2);
    g.groups = 2;
    check_forward_canonical(&[2, 4, 5, 5], &[6, 2, 3, 3], &g, 20);
    // depthwise
    g.groups = 3;
    g.strides = vec![2, 2];
    g.pad = vec![(1, 1), (1, 1)];
    check_forward_canonical(&[1, 3, 6, 6], &[3, 1, 3, 3], &g, 21);
    let mut g1 = Geo::plain(1);
    g1.groups = 2;
    g1.rd = vec![2];
    check_forward_canonical(&[2, 4, 9], &[4, 2, 3], &g1, 22);
}

#[test]
fn forward_same_and_valid_padding() {
    let mut r = Lcg::new(30);
    // (input, kernel, stride, rhs dil, lhs dil)
    for &(n, kk, s, rd, ld) in &[
        (7usize, 3usize, 1usize, 1usize, 1usize),
        (7, 3, 2, 1, 1),
        (8, 4, 3, 1, 1),
        (9, 3, 2, 2, 1),
        (5, 3, 2, 1, 2),
        (4, 2, 1, 1, 3),
    ] {
        let x = r.array(&[2, 2, n, n + 1]);
        let k = r.array(&[3, 2, kk, kk]);
        let base = ConvParams::default_for(2)
            .with_strides(&[s, s])
            .with_rhs_dilation(&[rd, rd])
            .with_lhs_dilation(&[ld, ld]);
        let mut g = Geo {
            strides: vec![s, s],
            pad: vec![same_pad(n, ld, kk, s, rd), same_pad(n + 1, ld, kk, s, rd)],
            ld: vec![ld, ld],
            rd: vec![rd, rd],
            groups: 1,
        };
        let got = arr(&conv_general(
            &t(&x),
            &t(&k),
            &base.clone().with_padding(ConvPadding::Same),
        )
        .unwrap());
        let want = naive(&x, &k, &g);
        assert_close(
            &got,
            &want,
            1e-12,
            &format!("SAME n={n} k={kk} s={s} rd={rd} ld={ld}"),
        );
        if ld == 1 {
            // SAME gives ceil(n / s) outputs.
            assert_eq!(got.shape()[2], n.div_ceil(s));
            assert_eq!(got.shape()[3], (n + 1).div_ceil(s));
        }
        g.pad = vec![(0, 0), (0, 0)];
        let got =
            arr(&conv_general(&t(&x), &t(&k), &base.with_padding(ConvPadding::Valid)).unwrap());
        assert_close(&got, &naive(&x, &k, &g), 1e-12, "VALID");
    }
}

#[test]
fn forward_empty_dilation_lists_mean_one() {
    let mut r = Lcg::new(31);
    let (x, k) = (r.array(&[1, 2, 6, 6]), r.array(&[2, 2, 3, 3]));
    let mut p = ConvParams::default_for(2);
    p.lhs_dilation.clear();
    p.rhs_dilation.clear();
    let got = arr(&conv_general(&t(&x), &t(&k), &p).unwrap());
    assert_close(
        &got,
        &naive(&x, &k, &Geo::plain(2)),
        1e-12,
        "empty dilations",
    );
}

#[test]
fn forward_nhwc_hwio_layout() {
    let mut r = Lcg::new(40);
    let x = r.array(&[2, 4, 7, 6]); // canonical N C H W
    let k = r.array(&[6, 2, 3, 2]); // canonical O I H W
    let g = Geo {
        strides: vec![2, 1],
        pad: vec![(1, 1), (0, 1)],
        ld: vec![1, 1],
        rd: vec![1, 2],
        groups: 2,
    };
    let want = naive(&x, &k, &g); // N O H W
    let p = g.params().with_dimension_numbers("NHWC", "HWIO", "NHWC");
    let got = conv_general(
        &t(&permute(&x, &[0, 2, 3, 1])),
        &t(&permute(&k, &[2, 3, 1, 0])),
        &p,
    )
    .unwrap();
    assert_close(
        &arr(&got),
        &permute(&want, &[0, 2, 3, 1]),
        1e-12,
        "NHWC/HWIO/NHWC",
    );
    // Explicit NCHW/OIHW/NCHW is the canonical layout.
    let p = g.params().with_dimension_numbers("NCHW", "OIHW", "NCHW");
    let got = conv_general(&t(&x), &t(&k), &p).unwrap();
    assert_close(&arr(&got), &want, 1e-12, "NCHW/OIHW/NCHW");
    // Mixed: NHWC input, OIHW kernel, NCHW output.
    let p = g.params().with_dimension_numbers("NHWC", "OIHW", "NCHW");
    let got = conv_general(&t(&permute(&x, &[0, 2, 3, 1])), &t(&k), &p).unwrap();
    assert_close(&arr(&got), &want, 1e-12, "NHWC/OIHW/NCHW");
    // Spatial order follows the kernel layout: an NCWH input with an OIHW
    // kernel still takes strides in (H, W) order.
    let p = g.params().with_dimension_numbers("NCWH", "OIHW", "NWHC");
    let got = conv_general(&t(&permute(&x, &[0, 1, 3, 2])), &t(&k), &p).unwrap();
    assert_close(
        &arr(&got),
        &permute(&want, &[0, 3, 2, 1]),
        1e-12,
        "NCWH/OIHW/NWHC",
    );
}

#[test]
fn forward_1d_layouts() {
    let mut r = Lcg::new(41);
    let x = r.array(&[2, 3, 9]); // N C W
    let k = r.array(&[4, 3, 3]); // O I W
    let mut g = Geo::plain(1);
    g.strides = vec![2];
    g.rd = vec![2];
    let want = naive(&x, &k, &g);
    let p = g.params().with_dimension_numbers("NWC", "WIO", "NWC");
    let got = conv_general(
        &t(&permute(&x, &[0, 2, 1])),
        &t(&permute(&k, &[2, 1, 0])),
        &p,
    )
    .unwrap();
    assert_close(
        &arr(&got),
        &permute(&want, &[0, 2, 1]),
        1e-12,
        "NWC/WIO/NWC",
    );
    let p = g.params().with_dimension_numbers("NCH", "OIH", "NCH");
    let got = conv_general(&t(&x), &t(&k), &p).unwrap();
    assert_close(&arr(&got), &want, 1e-12, "NCH/OIH/NCH");
}

#[test]
fn forward_f32() {
    let mut r = Lcg::new(42);
    let (x, k) = (r.array(&[2, 2, 6, 5]), r.array(&[4, 1, 3, 3]));
    let mut g = Geo::plain(2);
    g.groups = 2;
    g.strides = vec![2, 1];
    g.pad = vec![(1, 1), (1, 0)];
    let want = naive(&x, &k, &g);
    let x32 = Tensor::from_array(x.mapv(|v| v as f32));
    let k32 = Tensor::from_array(k.mapv(|v| v as f32));
    let y = conv_general(&x32, &k32, &g.params()).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_close(&arr(&y), &want, 1e-5, "f32 forward");
    // f32 gradients work too.
    let gr = grad(|a: &[Tensor]| conv_general(&a[0], &a[1], &g.params())?.square()?.sum_all())(&[
        x32, k32,
    ])
    .unwrap();
    assert_eq!(gr[0].dtype(), DType::F32);
    assert_eq!(gr[1].shape(), &[4, 1, 3, 3]);
}

// ------------------------------------------------------------------ derivatives

/// Configurations used for the derivative tests: (x shape, k shape, params),
/// shapes in the layout of the params.
fn deriv_cases() -> Vec<(Vec<usize>, Vec<usize>, ConvParams)> {
    vec![
        (
            vec![2, 3, 7],
            vec![2, 3, 3],
            ConvParams::default_for(1).with_strides(&[2]),
        ),
        (
            vec![2, 4, 6, 5],
            vec![4, 2, 3, 2],
            ConvParams::default_for(2)
                .with_strides(&[2, 1])
                .with_padding(ConvPadding::Same)
                .with_groups(2),
        ),
        (
            vec![1, 2, 7, 6],
            vec![3, 2, 2, 3],
            ConvParams::default_for(2)
                .with_rhs_dilation(&[2, 1])
                .with_padding(ConvPadding::Explicit(vec![(1, 0), (2, 1)])),
        ),
        (
            vec![1, 2, 4, 4],
            vec![2, 2, 3, 2],
            ConvParams::default_for(2)
                .with_lhs_dilation(&[2, 2])
                .with_strides(&[2, 1])
                .with_padding(ConvPadding::Same),
        ),
        (
            vec![2, 5, 4, 2],
            vec![3, 2, 1, 4],
            ConvParams::default_for(2)
                .with_strides(&[1, 2])
                .with_padding(ConvPadding::Same)
                .with_groups(2)
                .with_dimension_numbers("NHWC", "HWIO", "NHWC"),
        ),
    ]
}

fn eval_conv(x: &ArrayD<f64>, k: &ArrayD<f64>, p: &ConvParams) -> ArrayD<f64> {
    arr(&conv_general(&t(x), &t(k), p).unwrap())
}

#[test]
fn jvp_matches_finite_differences() {
    let h = 1e-5;
    for (case, (xs, ks, p)) in deriv_cases().into_iter().enumerate() {
        let mut r = Lcg::new(100 + case as u64);
        let (x, k) = (r.array(&xs), r.array(&ks));
        let (tx, tk) = (r.array(&xs), r.array(&ks));
        let zx = ArrayD::<f64>::zeros(x.raw_dim());
        let zk = ArrayD::<f64>::zeros(k.raw_dim());
        for (which, (dx, dk)) in [("x", (&tx, &zk)), ("k", (&zx, &tk)), ("both", (&tx, &tk))] {
            let f = |a: &[Tensor]| Ok(vec![conv_general(&a[0], &a[1], &p)?]);
            let (y, ty) = jvp(f, &[t(&x), t(&k)], &[t(dx), t(dk)]).unwrap();
            assert_close(&arr(&y[0]), &eval_conv(&x, &k, &p), 1e-12, "jvp primal");
            let fp = eval_conv(&(&x + &(dx * h)), &(&k + &(dk * h)), &p);
            let fm = eval_conv(&(&x - &(dx * h)), &(&k - &(dk * h)), &p);
            let fd = (fp - fm) / (2.0 * h);
            assert_close(
                &arr(&ty[0]),
                &fd,
                1e-6,
                &format!("jvp case {case} w.r.t. {which}"),
            );
        }
    }
}

#[test]
fn vjp_matches_finite_differences() {
    let h = 1e-5;
    for (case, (xs, ks, p)) in deriv_cases().into_iter().enumerate() {
        let mut r = Lcg::new(200 + case as u64);
        let (x, k) = (r.array(&xs), r.array(&ks));
        let y = eval_conv(&x, &k, &p);
        let w = r.array(y.shape());
        let f = |a: &[Tensor]| Ok(vec![conv_general(&a[0], &a[1], &p)?]);
        let (_, pb) = vjp(f, &[t(&x), t(&k)]).unwrap();
        let g = pb.apply(&[t(&w)]).unwrap();
        let fd = fd_grad(
            &|a: &[ArrayD<f64>]| dot(&eval_conv(&a[0], &a[1], &p), &w),
            &[x, k],
            h,
        );
        assert_close(
            &arr(&g[0]),
            &fd[0],
            1e-6,
            &format!("vjp case {case} w.r.t. x"),
        );
        assert_close(
            &arr(&g[1]),
            &fd[1],
            1e-6,
            &format!("vjp case {case} w.r.t. k"),
        );
    }
}

#[test]
fn second_order_grad_of_grad() {
    // F(x, k) = sum(conv(x, k)^2 * w); H = <dF/dx, v1> + <dF/dk, v2>.
    // grad H goes through the transposes of conv_transpose_lhs/rhs.
    let h = 1e-5;
    for (case, (xs, ks, p)) in deriv_cases().into_iter().enumerate() {
        let mut r = Lcg::new(300 + case as u64);
        let (x, k) = (r.array(&xs), r.array(&ks));
        let y = eval_conv(&x, &k, &p);
        let (w, v1, v2) = (t(&r.array(y.shape())), t(&r.array(&xs)), t(&r.array(&ks)));
        let pp = p.clone();
        let inner = move |a: &[Tensor]| {
            conv_general(&a[0], &a[1], &pp)?
                .square()?
                .mul(&w)?
                .sum_all()
        };
        let hfun = move |a: &[Tensor]| {
            let g = grad(&inner)(a)?;
            g[0].mul(&v1)?.sum_all()?.add(&g[1].mul(&v2)?.sum_all()?)
        };
        let g2 = grad(&hfun)(&[t(&x), t(&k)]).unwrap();
        let fd = fd_grad(
            &|a: &[ArrayD<f64>]| hfun(&[t(&a[0]), t(&a[1])]).unwrap().item().unwrap(),
            &[x, k],
            h,
        );
        assert_close(
            &arr(&g2[0]),
            &fd[0],
            1e-6,
            &format!("grad-of-grad case {case} w.r.t. x"),
        );
        assert_close(
            &arr(&g2[1]),
            &fd[1],
            1e-6,
            &format!("grad-of-grad case {case} w.r.t. k"),
        );
    }
}

// ------------------------------------------------------------------ primitive adjoints

fn prim_geo() -> ConvGeometry {
    ConvGeometry {
        strides: vec![2, 1],
        padding: vec![(1, 0), (1, 2)],
        lhs_dilation: vec![1, 2],
        rhs_dilation: vec![2, 1],
        feature_group_count: 2,
    }
}

#[test]
fn adjoint_identities_of_the_three_primitives() {
    let g = prim_geo();
    let mut r = Lcg::new(400);
    let (xs, ks) = ([2usize, 4, 7, 4], [6usize, 2, 2, 3]);
    let (x, k) = (r.array(&xs), r.array(&ks));
    let y = arr(&conv_raw(&t(&x), &t(&k), &g).unwrap());
    // Conv matches the naive reference.
    let geo = Geo {
        strides: g.strides.clone(),
        pad: g.padding.clone(),
        ld: g.lhs_dilation.clone(),
        rd: g.rhs_dilation.clone(),
        groups: g.feature_group_count,
    };
    assert_close(&y, &naive(&x, &k, &geo), 1e-12, "conv_raw");
    let ct = r.array(y.shape());
    let dx = arr(&conv_transpose_lhs_raw(&t(&ct), &t(&k), &g, &xs[2..]).unwrap());
    let dk = arr(&conv_transpose_rhs_raw(&t(&x), &t(&ct), &g, &ks[2..]).unwrap());
    assert_eq!(dx.shape(), &xs);
    assert_eq!(dk.shape(), &ks);
    let lhs = dot(&ct, &y);
    assert!(
        (dot(&dx, &x) - lhs).abs() <= 1e-12 * lhs.abs().max(1.0),
        "<ct, Conv(x,k)> = <TL(ct,k), x>"
    );
    assert!(
        (dot(&dk, &k) - lhs).abs() <= 1e-12 * lhs.abs().max(1.0),
        "<ct, Conv(x,k)> = <TR(x,ct), k>"
    );
}

#[test]
fn transposes_of_transpose_primitives_match_finite_differences() {
    // VJPs of TL and TR in both operands (these use Conv/TL/TR as their
    // transposes), and their JVPs, against finite differences.
    let g = prim_geo();
    let h = 1e-5;
    let mut r = Lcg::new(500);
    let (xs, ks) = (vec![2usize, 4, 7, 4], vec![6usize, 2, 2, 3]);
    let ys = arr(&conv_raw(&t(&r.array(&xs)), &t(&r.array(&ks)), &g).unwrap())
        .shape()
        .to_vec();
    let (ct, k, x) = (r.array(&ys), r.array(&ks), r.array(&xs));
    let gl = g.clone();
    let sx = xs[2..].to_vec();
    let tl = move |ct: &Tensor, k: &Tensor| conv_transpose_lhs_raw(ct, k, &gl, &sx);
    let gr = g.clone();
    let sk = ks[2..].to_vec();
    let tr = move |x: &Tensor, ct: &Tensor| conv_transpose_rhs_raw(x, ct, &gr, &sk);

    // TL(ct, k): output x-shaped.
    let wx = r.array(&xs);
    let (_, pb) = vjp(|a: &[Tensor]| Ok(vec![tl(&a[0], &a[1])?]), &[t(&ct), t(&k)]).unwrap();
    let gv = pb.apply(&[t(&wx)]).unwrap();
    let fd = fd_grad(
        &|a: &[ArrayD<f64>]| dot(&arr(&tl(&t(&a[0]), &t(&a[1])).unwrap()), &wx),
        &[ct.clone(), k.clone()],
        h,
    );
    assert_close(&arr(&gv[0]), &fd[0], 1e-6, "TL vjp w.r.t. ct");
    assert_close(&arr(&gv[1]), &fd[1], 1e-6, "TL vjp w.r.t. k");
    let (tct, tk) = (r.array(&ys), r.array(&ks));
    let (_, tv) = jvp(
        |a: &[Tensor]| Ok(vec![tl(&a[0], &a[1])?]),
        &[t(&ct), t(&k)],
        &[t(&tct), t(&tk)],
    )
    .unwrap();
    let fdj = (arr(&tl(&t(&(&ct + &(&tct * h))), &t(&(&k + &(&tk * h)))).unwrap())
        - arr(&tl(&t(&(&ct - &(&tct * h))), &t(&(&k - &(&tk * h)))).unwrap()))
        / (2.0 * h);
    assert_close(&arr(&tv[0]), &fdj, 1e-6, "TL jvp");

    // TR(x, ct): output k-shaped.
    let wk = r.array(&ks);
    let (_, pb) = vjp(|a: &[Tensor]| Ok(vec![tr(&a[0], &a[1])?]), &[t(&x), t(&ct)]).unwrap();
    let gv = pb.apply(&[t(&wk)]).unwrap();
    let fd = fd_grad(
        &|a: &[ArrayD<f64>]| dot(&arr(&tr(&t(&a[0]), &t(&a[1])).unwrap()), &wk),
        &[x.clone(), ct.clone()],
        h,
    );
    assert_close(&arr(&gv[0]), &fd[0], 1e-6, "TR vjp w.r.t. x");
    assert_close(&arr(&gv[1]), &fd[1], 1e-6, "TR vjp w.r.t. ct");
    let (tx, tct) = (r.array(&xs), r.array(&ys));
    let (_, tv) = jvp(
        |a: &[Tensor]| Ok(vec![tr(&a[0], &a[1])?]),
        &[t(&x), t(&ct)],
        &[t(&tx), t(&tct)],
    )
    .unwrap();
    let fdj = (arr(&tr(&t(&(&x + &(&tx * h))), &t(&(&ct + &(&tct * h)))).unwrap())
        - arr(&tr(&t(&(&x - &(&tx * h))), &t(&(&ct - &(&tct * h)))).unwrap()))
        / (2.0 * h);
    assert_close(&arr(&tv[0]), &fdj, 1e-6, "TR jvp");
}

// ------------------------------------------------------------------ vmap

fn stack_arrays(v: &[ArrayD<f64>]) -> ArrayD<f64> {
    let views: Vec<_> = v.iter().map(|a| a.view()).collect();
    ndarray::stack(ndarray::Axis(0), &views).unwrap()
}

fn slice0(a: &ArrayD<f64>, i: usize) -> ArrayD<f64> {
    a.index_axis(ndarray::Axis(0), i).to_owned()
}

fn vmap_params() -> ConvParams {
    ConvParams::default_for(2)
        .with_strides(&[2, 1])
        .with_padding(ConvPadding::Same)
        .with_rhs_dilation(&[1, 2])
        .with_groups(2)
}

#[test]
fn vmap_over_x_k_and_both_matches_loops() {
    let p = vmap_params();
    let mut r = Lcg::new(600);
    let b = 3;
    let (xb, kb) = (r.array(&[b, 2, 4, 6, 5]), r.array(&[b, 6, 2, 2, 3]));
    let (x1, k1) = (slice0(&xb, 0), slice0(&kb, 0));
    let f = |a: &[Tensor]| Ok(vec![conv_general(&a[0], &a[1], &p)?]);
    for (name, axes, xa, ka) in [
        ("x", vec![Some(0), None], &xb, &k1),
        ("k", vec![None, Some(0)], &x1, &kb),
        ("both", vec![Some(0), Some(0)], &xb, &kb),
    ] {
        let got = vmap(f, axes.clone())(&[t(xa), t(ka)]).unwrap();
        let want: Vec<ArrayD<f64>> = (0..b)
            .map(|i| {
                let xi = if axes[0].is_some() {
                    slice0(xa, i)
                } else {
                    xa.clone()
                };
                let ki = if axes[1].is_some() {
                    slice0(ka, i)
                } else {
                    ka.clone()
                };
                eval_conv(&xi, &ki, &p)
            })
            .collect();
        assert_close(
            &arr(&got[0]),
            &stack_arrays(&want),
            1e-12,
            &format!("vmap over {name}"),
        );
    }
    // Mapping over x folds the batch into N: one conv, no per-example loop.
    let gr = make_graph(
        |a: &[Tensor]| vmap(f, vec![Some(0), None])(a),
        &[
            Aval::new(&[b, 2, 4, 6, 5], DType::F64),
            Aval::new(&[6, 2, 2, 3], DType::F64),
        ],
    )
    .unwrap();
    let n_conv = gr.primitive_names().iter().filter(|n| *n == "conv").count();
    assert_eq!(n_conv, 1, "{gr}");
}

#[test]
fn vmap_over_non_leading_axis_with_nhwc() {
    let p = ConvParams::default_for(2)
        .with_padding(ConvPadding::Same)
        .with_dimension_numbers("NHWC", "HWIO", "NHWC");
    let mut r = Lcg::new(650);
    let xb = r.array(&[2, 5, 4, 3, 2]); // batch on axis 2 of (N, H, B, W, C)
    let k = r.array(&[3, 2, 2, 4]);
    let got = vmap(
        |a: &[Tensor]| Ok(vec![conv_general(&a[0], &a[1], &p)?]),
        vec![Some(2), None],
    )(&[t(&xb), t(&k)])
    .unwrap();
    let want: Vec<_> = (0..4)
        .map(|i| eval_conv(&xb.index_axis(ndarray::Axis(2), i).to_owned(), &k, &p))
        .collect();
    assert_close(
        &arr(&got[0]),
        &stack_arrays(&want),
        1e-12,
        "vmap over axis 2",
    );
}

#[test]
fn vmap_of_grad_matches_loops() {
    // Per-example gradients: batches conv_transpose_lhs and conv_transpose_rhs.
    let p = vmap_params();
    let mut r = Lcg::new(700);
    let b = 3;
    let (xb, kb) = (r.array(&[b, 2, 4, 6, 5]), r.array(&[b, 6, 2, 2, 3]));
    let (x1, k1) = (slice0(&xb, 0), slice0(&kb, 0));
    let loss = |a: &[Tensor]| conv_general(&a[0], &a[1], &p)?.tanh()?.sum_all();
    let gfun = |a: &[Tensor]| grad(loss)(a);
    for (name, axes, xa, ka) in [
        ("x", vec![Some(0), None], &xb, &k1),
        ("k", vec![None, Some(0)], &x1, &kb),
        ("both", vec![Some(0), Some(0)], &xb, &kb),
    ] {
        let got = vmap(gfun, axes.clone())(&[t(xa), t(ka)]).unwrap();
        let mut wx = Vec::new();
        let mut wk = Vec::new();
        for i in 0..b {
            let xi = if axes[0].is_some() {
                slice0(xa, i)
            } else {
                xa.clone()
            };
            let ki = if axes[1].is_some() {
                slice0(ka, i)
            } else {
                ka.clone()
            };
            let g = gfun(&[t(&xi), t(&ki)]).unwrap();
            wx.push(arr(&g[0]));
            wk.push(arr(&g[1]));
        }
        assert_close(
            &arr(&got[0]),
            &stack_arrays(&wx),
            1e-12,
            &format!("vmap(grad) over {name}: dx"),
        );
        assert_close(
            &arr(&got[1]),
            &stack_arrays(&wk),
            1e-12,
            &format!("vmap(grad) over {name}: dk"),
        );
    }
}

#[test]
fn vmap_of_second_order_matches_loops() {
    // Batched transposes of transposes.
    let p = vmap_params();
    let mut r = Lcg::new(750);
    let b = 2;
    let (xb, k) = (r.array(&[b, 2, 4, 6, 5]), r.array(&[6, 2, 2, 3]));
    let pp = p.clone();
    let inner = move |a: &[Tensor]| conv_general(&a[0], &a[1], &pp)?.square()?.sum_all();
    let hfun = move |a: &[Tensor]| {
        let g = grad(&inner)(a)?;
        g[0].square()?.sum_all()?.add(&g[1].square()?.sum_all()?)
    };
    let g2 = |a: &[Tensor]| grad(&hfun)(a);
    let got = vmap(g2, vec![Some(0), None])(&[t(&xb), t(&k)]).unwrap();
    let (mut wx, mut wk) = (Vec::new(), Vec::new());
    for i in 0..b {
        let g = g2(&[t(&slice0(&xb, i)), t(&k)]).unwrap();
        wx.push(arr(&g[0]));
        wk.push(arr(&g[1]));
    }
    assert_close(
        &arr(&got[0]),
        &stack_arrays(&wx),
        1e-12,
        "vmap(grad(grad)) dx",
    );
    assert_close(
        &arr(&got[1]),
        &stack_arrays(&wk),
        1e-12,
        "vmap(grad(grad)) dk",
    );
}

// ------------------------------------------------------------------ graphs

#[test]
fn graph_prints_params_and_grad_uses_the_transposes() {
    let p = ConvParams::default_for(2)
        .with_strides(&[2, 1])
        .with_padding(ConvPadding::Explicit(vec![(1, 1), (0, 1)]))
        .with_rhs_dilation(&[1, 2])
        .with_groups(2);
    let avals = [
        Aval::new(&[1, 4, 6, 6], DType::F32),
        Aval::new(&[2, 2, 3, 3], DType::F32),
    ];
    let g = make_graph(
        |a: &[Tensor]| Ok(vec![conv_general(&a[0], &a[1], &p)?]),
        &avals,
    )
    .unwrap();
    let s = g.to_string();
    assert!(
        s.contains("conv[window_strides=[2,1] padding=[(1,1),(0,1)] lhs_dilation=[1,1] rhs_dilation=[1,2] feature_group_count=2]"),
        "{s}"
    );
    assert_eq!(g.out_avals()[0], Aval::new(&[1, 2, 3, 3], DType::F32));
    let gg = make_graph(
        |a: &[Tensor]| grad(|b: &[Tensor]| conv_general(&b[0], &b[1], &p)?.sum_all())(a),
        &avals,
    )
    .unwrap();
    let names = gg.primitive_names();
    assert!(names.iter().any(|n| n == "conv_transpose_lhs"), "{gg}");
    assert!(names.iter().any(|n| n == "conv_transpose_rhs"), "{gg}");
}

// ------------------------------------------------------------------ errors

fn conv_err(xs: &[usize], ks: &[usize], p: &ConvParams) -> Error {
    let x = Tensor::zeros(xs, DType::F64);
    let k = Tensor::zeros(ks, DType::F64);
    conv_general(&x, &k, p).expect_err("should fail")
}

fn assert_err(e: &Error, needles: &[&str]) {
    let s = e.to_string();
    for n in needles {
        assert!(s.contains(n), "error {s:?} should mention {n:?}");
    }
}

#[test]
fn shape_errors_name_the_op_and_shapes() {
    let p2 = ConvParams::default_for(2);
    // channel mismatch
    let e = conv_err(&[1, 3, 5, 5], &[2, 2, 3, 3], &p2);
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    assert_err(&e, &["conv", "[1, 3, 5, 5]", "[2, 2, 3, 3]", "channel"]);
    // rank mismatch
    let e = conv_err(&[1, 3, 5, 5], &[2, 3, 3], &p2);
    assert_err(&e, &["conv", "[1, 3, 5, 5]", "[2, 3, 3]", "rank"]);
    // rank too small
    let e = conv_err(&[3, 5], &[2, 3], &ConvParams::default_for(0));
    assert_err(&e, &["conv", "[3, 5]", "rank"]);
    // groups not dividing input channels
    let e = conv_err(&[1, 3, 5, 5], &[2, 1, 3, 3], &p2.clone().with_groups(2));
    assert_err(
        &e,
        &[
            "conv",
            "[1, 3, 5, 5]",
            "feature_group_count 2",
            "3 input channels",
        ],
    );
    // groups not dividing output channels
    let e = conv_err(&[1, 4, 5, 5], &[3, 2, 3, 3], &p2.clone().with_groups(2));
    assert_err(&e, &["conv", "3 output channels"]);
    // geometry lists of the wrong length
    let e = conv_err(&[1, 3, 5, 5], &[2, 3, 3, 3], &p2.clone().with_strides(&[1]));
    assert_err(
        &e,
        &[
            "conv",
            "[1, 3, 5, 5]",
            "window_strides has length 1",
            "2 spatial dims",
        ],
    );
    let e = conv_err(
        &[1, 3, 5, 5],
        &[2, 3, 3, 3],
        &p2.clone().with_rhs_dilation(&[1, 1, 1]),
    );
    assert_err(&e, &["conv", "rhs_dilation has length 3"]);
    let e = conv_err(
        &[1, 3, 5, 5],
        &[2, 3, 3, 3],
        &p2.clone().with_lhs_dilation(&[2]),
    );
    assert_err(&e, &["conv", "lhs_dilation has length 1"]);
    let e = conv_err(
        &[1, 3, 5, 5],
        &[2, 3, 3, 3],
        &p2.clone().with_padding(ConvPadding::Explicit(vec![(1, 1)])),
    );
    assert_err(&e, &["conv", "padding has length 1"]);
    // zero stride
    let e = conv_err(
        &[1, 3, 5, 5],
        &[2, 3, 3, 3],
        &p2.clone().with_strides(&[0, 1]),
    );
    assert_err(&e, &["conv", "window_strides must be >= 1"]);
    // zero groups
    let e = conv_err(&[1, 3, 5, 5], &[2, 3, 3, 3], &p2.clone().with_groups(0));
    assert_err(&e, &["conv", "feature_group_count"]);
}

#[test]
fn layout_and_dtype_errors() {
    let p2 = ConvParams::default_for(2);
    let e = conv_err(
        &[1, 5, 5, 3],
        &[3, 3, 3, 2],
        &p2.clone().with_dimension_numbers("NHWC", "HWIO", "NHW"),
    );
    assert_err(&e, &["conv", "out layout", "rank 4"]);
    let e = conv_err(
        &[1, 5, 5, 3],
        &[3, 3, 3, 2],
        &p2.clone().with_dimension_numbers("NHWX", "HWIO", "NHWC"),
    );
    assert_err(&e, &["conv", "lhs layout", "\"NHWX\""]);
    let e = conv_err(
        &[1, 5, 5, 3],
        &[3, 3, 3, 2],
        &p2.clone().with_dimension_numbers("NHWC", "HXIO", "NHWC"),
    );
    assert_err(&e, &["conv", "same spatial axis letters"]);
    let e = conv_err(
        &[1, 5, 5, 3],
        &[3, 3, 3, 2],
        &p2.clone().with_dimension_numbers("NHHC", "HWIO", "NHWC"),
    );
    assert_err(&e, &["conv", "repeats"]);
    // The layout is honoured when checking channels: NHWC x with C=3 and an
    // HWIO kernel with I=2.
    let e = conv_err(
        &[1, 5, 5, 3],
        &[3, 3, 2, 4],
        &p2.clone().with_dimension_numbers("NHWC", "HWIO", "NHWC"),
    );
    assert_err(
        &e,
        &[
            "conv",
            "channel",
            "[1, 5, 5, 3] (NHWC)",
            "[3, 3, 2, 4] (HWIO)",
        ],
    );
    // dtypes
    let x = Tensor::zeros(&[1, 2, 4, 4], DType::F32);
    let k = Tensor::zeros(&[1, 2, 3, 3], DType::F64);
    let e = conv_general(&x, &k, &p2).expect_err("dtype mismatch");
    assert!(matches!(e, Error::DType { .. }), "{e}");
    assert_err(&e, &["conv", "f32", "f64"]);
    let xi = Tensor::zeros(&[1, 2, 4, 4], DType::I64);
    let ki = Tensor::zeros(&[1, 2, 3, 3], DType::I64);
    assert!(matches!(
        conv_general(&xi, &ki, &p2),
        Err(Error::DType { .. })
    ));
}

#[test]
fn transpose_primitives_validate_shapes() {
    let g = prim_geo();
    // Correct: x (2,4,7,4), k (6,2,2,3) -> y shape from the forward op.
    let y = conv_raw(
        &Tensor::zeros(&[2, 4, 7, 4], DType::F64),
        &Tensor::zeros(&[6, 2, 2, 3], DType::F64),
        &g,
    )
    .unwrap();
    let ys = y.shape().to_vec();
    let mut bad = ys.clone();
    bad[2] += 1;
    let e = conv_transpose_lhs_raw(
        &Tensor::zeros(&bad, DType::F64),
        &Tensor::zeros(&[6, 2, 2, 3], DType::F64),
        &g,
        &[7, 4],
    )
    .expect_err("bad cotangent");
    assert_err(&e, &["conv_transpose_lhs", "cotangent", "output shape"]);
    let e = conv_transpose_lhs_raw(
        &Tensor::zeros(&ys, DType::F64),
        &Tensor::zeros(&[6, 2, 2, 3], DType::F64),
        &g,
        &[7],
    )
    .expect_err("bad spatial");
    assert_err(&e, &["conv_transpose_lhs", "lhs_spatial has length 1"]);
    let e = conv_transpose_rhs_raw(
        &Tensor::zeros(&[2, 4, 7, 4], DType::F64),
        &Tensor::zeros(&bad, DType::F64),
        &g,
        &[2, 3],
    )
    .expect_err("bad cotangent");
    assert_err(&e, &["conv_transpose_rhs", "cotangent", "output shape"]);
    let e = conv_transpose_rhs_raw(
        &Tensor::zeros(&[2, 3, 7, 4], DType::F64),
        &Tensor::zeros(&ys, DType::F64),
        &g,
        &[2, 3],
    )
    .expect_err("groups");
    assert_err(&e, &["conv_transpose_rhs", "feature_group_count 2"]);
    // Errors also surface while tracing (shape rules run at bind time).
    let e = make_graph(
        |a: &[Tensor]| {
            Ok(vec![conv_general(
                &a[0],
                &a[1],
                &ConvParams::default_for(2),
            )?])
        },
        &[
            Aval::new(&[1, 3, 5, 5], DType::F64),
            Aval::new(&[2, 4, 3, 3], DType::F64),
        ],
    )
    .expect_err("traced channel mismatch");
    assert_err(&e, &["conv", "channel"]);
}

#[test]
fn kernel_larger_than_input_gives_empty_output() {
    let x = Tensor::zeros(&[1, 1, 2], DType::F64);
    let k = Tensor::ones(&[1, 1, 3], DType::F64);
    let y = conv_general(&x, &k, &ConvParams::default_for(1)).unwrap();
    assert_eq!(y.shape(), &[1, 1, 0]);
}

#[test]
fn vmap_with_empty_batch() {
    let p = vmap_params();
    let f = |a: &[Tensor]| Ok(vec![conv_general(&a[0], &a[1], &p)?]);
    let x = Tensor::zeros(&[0, 2, 4, 6, 5], DType::F64);
    let k = Tensor::zeros(&[6, 2, 2, 3], DType::F64);
    let kb = Tensor::zeros(&[0, 6, 2, 2, 3], DType::F64);
    let want = [0usize, 2, 6, 3, 5];
    let y = vmap(f, vec![Some(0), None])(&[x.clone(), k]).unwrap();
    assert_eq!(y[0].shape(), &want);
    let y = vmap(f, vec![Some(0), Some(0)])(&[x, kb]).unwrap();
    assert_eq!(y[0].shape(), &want);
}
