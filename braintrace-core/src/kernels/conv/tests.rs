//! The convolution kernels against explicit loops and their adjoints.

use super::*;
use ndarray::{ArrayD, Dimension, IxDyn};

struct Lcg(u64);
impl Lcg {
    fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn uniform(&mut self) -> f64 {
        (self.next_u64() as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
    }
    /// Uniform integer in [lo, hi].
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }
    fn array(&mut self, shape: &[usize]) -> ArrayD<f64> {
        ArrayD::from_shape_fn(IxDyn(shape), |_| self.uniform())
    }
}

/// All row-major multi-indices of `shape`.
fn multi(shape: &[usize]) -> Vec<Vec<usize>> {
    ndarray::indices(IxDyn(shape))
        .into_iter()
        .map(|ix| ix.slice().to_vec())
        .collect()
}

/// Naive index map: input multi-index read by output position p and kernel offset u, if any.
fn src_index(geo: &ConvGeometry, xs: &[usize], p: &[usize], u: &[usize]) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for i in 0..xs.len() {
        let q = (p[i] * geo.strides[i] + u[i] * geo.rhs_dilation[i]) as i64 - geo.padding[i].0;
        let ld = geo.lhs_dilation[i] as i64;
        if q < 0 || q % ld != 0 || q / ld >= xs[i] as i64 {
            return None;
        }
        out.push((q / ld) as usize);
    }
    Some(out)
}

/// Visits every (x index, k index, y index) triple contributing to the convolution.
fn naive_visit(
    xshape: &[usize],
    kshape: &[usize],
    geo: &ConvGeometry,
    mut f: impl FnMut(&[usize], &[usize], &[usize]),
) {
    let ys = geo.output_spatial(&xshape[2..], &kshape[2..]).unwrap();
    let (o_total, cg) = (kshape[0], kshape[1]);
    let og = o_total / geo.feature_group_count;
    for n in 0..xshape[0] {
        for o in 0..o_total {
            let g = o / og;
            for p in multi(&ys) {
                for cl in 0..cg {
                    for u in multi(&kshape[2..]) {
                        if let Some(i) = src_index(geo, &xshape[2..], &p, &u) {
                            let xi: Vec<usize> =
                                [n, g * cg + cl].iter().chain(&i).copied().collect();
                            let ki: Vec<usize> = [o, cl].iter().chain(&u).copied().collect();
                            let yi: Vec<usize> = [n, o].iter().chain(&p).copied().collect();
                            f(&xi, &ki, &yi);
                        }
                    }
                }
            }
        }
    }
}

fn naive_forward(x: &ArrayD<f64>, k: &ArrayD<f64>, geo: &ConvGeometry) -> ArrayD<f64> {
    let ys = geo
        .output_spatial(&x.shape()[2..], &k.shape()[2..])
        .unwrap();
    let yshape: Vec<usize> = [x.shape()[0], k.shape()[0]]
        .iter()
        .chain(&ys)
        .copied()
        .collect();
    let mut y = ArrayD::zeros(IxDyn(&yshape));
    naive_visit(x.shape(), k.shape(), geo, |xi, ki, yi| {
        y[IxDyn(yi)] += x[IxDyn(xi)] * k[IxDyn(ki)];
    });
    y
}

fn naive_transposes(
    x: &ArrayD<f64>,
    k: &ArrayD<f64>,
    ct: &ArrayD<f64>,
    geo: &ConvGeometry,
) -> (ArrayD<f64>, ArrayD<f64>) {
    let mut dx = ArrayD::zeros(x.raw_dim());
    let mut dk = ArrayD::zeros(k.raw_dim());
    naive_visit(x.shape(), k.shape(), geo, |xi, ki, yi| {
        dx[IxDyn(xi)] += ct[IxDyn(yi)] * k[IxDyn(ki)];
        dk[IxDyn(ki)] += ct[IxDyn(yi)] * x[IxDyn(xi)];
    });
    (dx, dk)
}

fn dot(a: &ArrayD<f64>, b: &ArrayD<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter().zip(b.iter()).map(|(x, y)| x * y).sum()
}

fn assert_close(a: &ArrayD<f64>, b: &ArrayD<f64>, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    for (p, q) in a.iter().zip(b.iter()) {
        assert!(
            (p - q).abs() <= 1e-12 * (1.0 + q.abs()),
            "{what}: {p} vs {q}"
        );
    }
}

fn rel_close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-10 * a.abs().max(b.abs()).max(1e-300) || (a == 0.0 && b == 0.0)
}

fn random_case(rng: &mut Lcg, d: usize) -> (Vec<usize>, Vec<usize>, ConvGeometry) {
    let g = rng.range(1, 3) as usize;
    let cg = rng.range(1, 3) as usize;
    let og = rng.range(1, 2) as usize;
    let n = rng.range(1, 2) as usize;
    let mut xshape = vec![n, g * cg];
    let mut kshape = vec![g * og, cg];
    let mut geo = ConvGeometry {
        strides: vec![],
        padding: vec![],
        lhs_dilation: vec![],
        rhs_dilation: vec![],
        feature_group_count: g,
    };
    for _ in 0..d {
        xshape.push(rng.range(1, 7) as usize);
        kshape.push(rng.range(1, 3) as usize);
        geo.strides.push(rng.range(1, 3) as usize);
        geo.lhs_dilation.push(rng.range(1, 3) as usize);
        geo.rhs_dilation.push(rng.range(1, 2) as usize);
        geo.padding.push((rng.range(-2, 3), rng.range(-2, 3)));
    }
    (xshape, kshape, geo)
}

#[test]
fn random_cases_match_naive_and_are_adjoint() {
    let mut rng = Lcg(12345);
    let mut nonempty = 0;
    for case in 0..300 {
        let d = 1 + case % 3;
        let (xshape, kshape, geo) = random_case(&mut rng, d);
        let x = rng.array(&xshape);
        let k = rng.array(&kshape);
        let y = conv_forward(&x.view(), &k.view(), &geo).unwrap();
        assert_close(
            &y,
            &naive_forward(&x, &k, &geo),
            &format!("forward {xshape:?} {kshape:?} {geo:?}"),
        );
        let ct = rng.array(y.shape());
        let dx = conv_transpose_lhs(&ct.view(), &k.view(), &geo, &xshape).unwrap();
        let dk = conv_transpose_rhs(&x.view(), &ct.view(), &geo, &kshape).unwrap();
        let (ndx, ndk) = naive_transposes(&x, &k, &ct, &geo);
        assert_close(&dx, &ndx, &format!("lhs {xshape:?} {kshape:?} {geo:?}"));
        assert_close(&dk, &ndk, &format!("rhs {xshape:?} {kshape:?} {geo:?}"));
        let (a, b, c) = (dot(&ct, &y), dot(&dx, &x), dot(&dk, &k));
        assert!(
            rel_close(a, b) && rel_close(a, c),
            "adjoint {a} {b} {c} for {geo:?}"
        );
        if !y.is_empty() {
            nonempty += 1;
        }
    }
    assert!(nonempty > 200, "too few non-empty cases: {nonempty}");
}

#[test]
fn adjoint_on_benchmark_like_shape() {
    let mut rng = Lcg(99);
    let xshape = [2usize, 4, 9, 8];
    let kshape = [6usize, 2, 3, 3];
    let geo = ConvGeometry {
        strides: vec![1, 2],
        padding: vec![same_padding(9, 3, 1, 1), same_padding(8, 3, 2, 1)],
        lhs_dilation: vec![1, 1],
        rhs_dilation: vec![1, 1],
        feature_group_count: 2,
    };
    let x = rng.array(&xshape);
    let k = rng.array(&kshape);
    let y = conv_forward(&x.view(), &k.view(), &geo).unwrap();
    assert_eq!(y.shape(), &[2, 6, 9, 4]);
    assert_close(&y, &naive_forward(&x, &k, &geo), "forward");
    let ct = rng.array(y.shape());
    let dx = conv_transpose_lhs(&ct.view(), &k.view(), &geo, &xshape).unwrap();
    let dk = conv_transpose_rhs(&x.view(), &ct.view(), &geo, &kshape).unwrap();
    let (a, b, c) = (dot(&ct, &y), dot(&dx, &x), dot(&dk, &k));
    assert!(rel_close(a, b) && rel_close(a, c), "adjoint {a} {b} {c}");
}

#[test]
fn simple_1d_by_hand() {
    let x = ndarray::arr3(&[[[1.0, 2.0, 3.0]]]).into_dyn();
    let k = ndarray::arr3(&[[[1.0, 10.0]]]).into_dyn();
    let mut geo = ConvGeometry {
        strides: vec![1],
        padding: vec![(0, 0)],
        lhs_dilation: vec![1],
        rhs_dilation: vec![1],
        feature_group_count: 1,
    };
    let y = conv_forward(&x.view(), &k.view(), &geo).unwrap();
    assert_eq!(y, ndarray::arr3(&[[[21.0, 32.0]]]).into_dyn());
    // Input dilation 2 + padding 1: xpad = [0, 1, 0, 2, 0, 3, 0].
    geo.lhs_dilation = vec![2];
    geo.padding = vec![(1, 1)];
    let y = conv_forward(&x.view(), &k.view(), &geo).unwrap();
    assert_eq!(
        y,
        ndarray::arr3(&[[[10.0, 1.0, 20.0, 2.0, 30.0, 3.0]]]).into_dyn()
    );
}

#[test]
fn non_standard_layout_inputs() {
    let mut rng = Lcg(5);
    let geo = ConvGeometry {
        strides: vec![1, 1],
        padding: vec![(1, 0), (0, 1)],
        lhs_dilation: vec![1, 1],
        rhs_dilation: vec![2, 1],
        feature_group_count: 1,
    };
    // x stored as (N, H, W, C) and viewed as (N, C, H, W).
    let x_nhwc = rng.array(&[2, 5, 4, 3]);
    let x = x_nhwc.view().permuted_axes(IxDyn(&[0, 3, 1, 2]));
    let k = rng.array(&[2, 3, 2, 2]);
    let y = conv_forward(&x, &k.view(), &geo).unwrap();
    assert_close(&y, &naive_forward(&x.to_owned(), &k, &geo), "forward");
}

#[test]
fn f32_matches_f64() {
    let mut rng = Lcg(42);
    let xshape = [2usize, 16, 8, 8];
    let kshape = [32usize, 16, 3, 3];
    let geo = ConvGeometry {
        strides: vec![1, 1],
        padding: vec![same_padding(8, 3, 1, 1); 2],
        lhs_dilation: vec![1, 1],
        rhs_dilation: vec![1, 1],
        feature_group_count: 1,
    };
    let x = rng.array(&xshape);
    let k = rng.array(&kshape);
    let y = conv_forward(&x.view(), &k.view(), &geo).unwrap();
    let y32 = conv_forward(
        &x.mapv(|v| v as f32).view(),
        &k.mapv(|v| v as f32).view(),
        &geo,
    )
    .unwrap();
    for (a, b) in y.iter().zip(y32.iter()) {
        assert!((a - *b as f64).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn same_padding_values() {
    assert_eq!(same_padding(32, 3, 1, 1), (1, 1));
    assert_eq!(same_padding(5, 2, 2, 1), (0, 1));
    assert_eq!(same_padding(4, 1, 2, 1), (0, 0));
    assert_eq!(same_padding(10, 3, 1, 2), (2, 2));
    assert_eq!(same_padding(7, 4, 3, 1), (1, 2));
    for n in 1..12 {
        for k in 1..5 {
            for s in 1..4 {
                for dil in 1..3 {
                    let geo = ConvGeometry {
                        strides: vec![s],
                        padding: vec![same_padding(n, k, s, dil)],
                        lhs_dilation: vec![1],
                        rhs_dilation: vec![dil],
                        feature_group_count: 1,
                    };
                    assert_eq!(geo.output_spatial(&[n], &[k]).unwrap(), vec![n.div_ceil(s)]);
                }
            }
        }
    }
}

#[test]
fn output_spatial_edge_cases() {
    let geo = ConvGeometry {
        strides: vec![2, 1],
        padding: vec![(-1, -1), (0, 0)],
        lhs_dilation: vec![3, 1],
        rhs_dilation: vec![1, 2],
        feature_group_count: 1,
    };
    // dim0: dilated 3*(4-1)+1 = 10, padded 8, k=3 -> (8-3)/2+1 = 3; dim1: dilated_k 5 > 4 -> 0.
    assert_eq!(geo.output_spatial(&[4, 4], &[3, 3]).unwrap(), vec![3, 0]);
    assert!(geo.output_spatial(&[4], &[3]).is_err());
    // Empty output: forward gives an empty array, transposes give zeros.
    let x = ArrayD::<f64>::ones(IxDyn(&[1, 1, 4, 4]));
    let k = ArrayD::<f64>::ones(IxDyn(&[1, 1, 3, 3]));
    let y = conv_forward(&x.view(), &k.view(), &geo).unwrap();
    assert_eq!(y.shape(), &[1, 1, 3, 0]);
    let dx = conv_transpose_lhs(&y.view(), &k.view(), &geo, &[1, 1, 4, 4]).unwrap();
    assert!(dx.iter().all(|&v| v == 0.0));
    let dk = conv_transpose_rhs(&x.view(), &y.view(), &geo, &[1, 1, 3, 3]).unwrap();
    assert!(dk.iter().all(|&v| v == 0.0));
}

#[test]
fn shape_errors() {
    let geo = ConvGeometry {
        strides: vec![1],
        padding: vec![(0, 0)],
        lhs_dilation: vec![1],
        rhs_dilation: vec![1],
        feature_group_count: 2,
    };
    let x = ArrayD::<f64>::zeros(IxDyn(&[1, 4, 5]));
    // Kernel must have C/G = 2 input channels.
    let k_bad = ArrayD::<f64>::zeros(IxDyn(&[2, 4, 3]));
    assert!(conv_forward(&x.view(), &k_bad.view(), &geo).is_err());
    // O not divisible by G.
    let k_odd = ArrayD::<f64>::zeros(IxDyn(&[3, 2, 3]));
    assert!(conv_forward(&x.view(), &k_odd.view(), &geo).is_err());
    // Rank mismatch / missing spatial dims.
    let k2 = ArrayD::<f64>::zeros(IxDyn(&[2, 2, 3, 3]));
    assert!(conv_forward(&x.view(), &k2.view(), &geo).is_err());
    let x2 = ArrayD::<f64>::zeros(IxDyn(&[1, 4]));
    assert!(conv_forward(&x2.view(), &x2.view(), &geo).is_err());
    // Geometry length mismatch and zero stride.
    let k = ArrayD::<f64>::zeros(IxDyn(&[2, 2, 3]));
    let mut g2 = geo.clone();
    g2.strides = vec![1, 1];
    assert!(conv_forward(&x.view(), &k.view(), &g2).is_err());
    g2.strides = vec![0];
    assert!(conv_forward(&x.view(), &k.view(), &g2).is_err());
    // Cotangent shape mismatch.
    let ct = ArrayD::<f64>::zeros(IxDyn(&[1, 2, 4]));
    assert!(conv_transpose_lhs(&ct.view(), &k.view(), &geo, &[1, 4, 5]).is_err());
    assert!(conv_transpose_rhs(&x.view(), &ct.view(), &geo, &[2, 2, 3]).is_err());
    let ct_ok = ArrayD::<f64>::zeros(IxDyn(&[1, 2, 3]));
    assert!(conv_transpose_lhs(&ct_ok.view(), &k.view(), &geo, &[1, 4, 5]).is_ok());
    assert!(conv_transpose_rhs(&x.view(), &ct_ok.view(), &geo, &[2, 2, 3]).is_ok());
}
