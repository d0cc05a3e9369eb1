//! The built-in primitives beyond the golden vectors: `check_rules` on
//! random shapes for every built-in, identity-preserving `vmap` through
//! `make_graph`, the user-facing ops and their errors.

use braintrace::etp::{check_rules, primitive_by_name, ElemFn, EtpPrimitive, ParamValue, Params};
use braintrace::ops::{ConvPadding, ConvParams};
use braintrace::prelude::*;
use braintrace::prims::{self, CsrStructure, Transforms};

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
    fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_vec((0..n).map(|_| self.next()).collect(), shape).unwrap()
    }
    fn dim(&mut self, lo: usize, hi: usize) -> usize {
        lo + ((self.next() + 1.0) / 2.0 * (hi - lo + 1) as f64) as usize % (hi - lo + 1)
    }
}

fn fnp(name: Option<&str>) -> ParamValue {
    name.map_or(ParamValue::None, |n| {
        ParamValue::Func(ElemFn::builtin(n).unwrap())
    })
}

fn assert_rules(p: &EtpPrimitive, args: &[Tensor], params: &Params) {
    let r = check_rules(p, args, params).unwrap();
    assert!(r.is_ok(), "{r}");
}

const FNS: [Option<&str>; 4] = [None, Some("tanh"), Some("square"), Some("softplus")];

#[test]
fn dense_rules_hold_on_random_shapes() {
    let mut g = Lcg(1);
    for (case, f) in FNS.iter().enumerate() {
        let (b, i, o) = (g.dim(1, 4), g.dim(1, 5), g.dim(1, 5));
        for bias in [false, true] {
            let mut params = Params::new().with("has_bias", bias);
            params.insert("weight_fn", fnp(*f));
            params.insert("bias_fn", fnp(FNS[(case + 1) % 4]));
            let mut args = vec![g.tensor(&[b, i]), g.tensor(&[i, o])];
            if bias {
                args.push(g.tensor(&[o]));
            }
            assert_rules(&prims::etp_mm::primitive(), &args, &params);
            args[0] = g.tensor(&[i]);
            assert_rules(&prims::etp_mv::primitive(), &args, &params);
        }
    }
}

#[test]
fn sparse_rules_hold_on_random_shapes() {
    let mut g = Lcg(2);
    for f in FNS {
        let (b, i, o) = (g.dim(1, 4), g.dim(2, 6), g.dim(2, 6));
        let s = CsrStructure::from_dense_pattern(i, o, |r, c| (r * 7 + c * 3) % 4 == 0 && r != 1);
        let mut params = Params::new()
            .with("has_bias", true)
            .with("sparse_mat", s.clone());
        params.insert("weight_fn", fnp(f));
        let args = vec![g.tensor(&[b, i]), g.tensor(&[s.nnz()]), g.tensor(&[o])];
        assert_rules(&prims::etp_sp_mm::primitive(), &args, &params);
        let args = vec![g.tensor(&[i]), g.tensor(&[s.nnz()])];
        assert_rules(
            &prims::etp_sp_mv::primitive(),
            &args,
            &params.clone().with("has_bias", false),
        );
    }
}

#[test]
fn lora_rules_hold_on_random_shapes() {
    let mut g = Lcg(3);
    for f in FNS {
        let (b, i, o, r) = (g.dim(1, 3), g.dim(2, 5), g.dim(2, 5), g.dim(1, 3));
        let mut params = Params::new()
            .with("alpha", 0.5 + g.next().abs())
            .with("has_bias", true)
            .with("rank", r);
        params.insert("a_fn", fnp(f));
        params.insert("b_fn", fnp(FNS[3]));
        let args = vec![
            g.tensor(&[b, i]),
            g.tensor(&[i, r]),
            g.tensor(&[r, o]),
            g.tensor(&[o]),
        ];
        assert_rules(&prims::etp_lora_mm::primitive(), &args, &params);
        let args = vec![g.tensor(&[i]), g.tensor(&[i, r]), g.tensor(&[r, o])];
        assert_rules(
            &prims::etp_lora_mv::primitive(),
            &args,
            &params.clone().with("has_bias", false),
        );
    }
}

#[test]
fn elemwise_rules_hold_on_random_shapes() {
    let mut g = Lcg(4);
    for f in [
        None,
        Some("tanh"),
        Some("exp"),
        Some("sigmoid"),
        Some("square"),
    ] {
        let mut params = Params::new();
        params.insert("weight_fn", fnp(f));
        let shape = [g.dim(1, 4), g.dim(1, 3)];
        assert_rules(
            &prims::etp_elemwise::primitive(),
            &[g.tensor(&shape)],
            &params,
        );
    }
}

#[test]
fn conv_rules_hold_on_random_shapes() {
    let mut g = Lcg(5);
    let layouts = [None, Some(("NHWC", "HWIO", "NHWC"))];
    for (case, layout) in layouts.iter().enumerate() {
        for padding in [ConvPadding::Same, ConvPadding::Valid] {
            let (b, c, o) = (2, 3, 7);
            let (h, w) = (g.dim(4, 6), g.dim(4, 6));
            let mut cp = ConvParams::default_for(2)
                .with_strides(&[1 + case, 1])
                .with_padding(padding);
            let (x, k) = match layout {
                None => (g.tensor(&[b, c, h, w]), g.tensor(&[o, c, 3, 2])),
                Some((l, r, out)) => {
                    cp = cp.with_dimension_numbers(l, r, out);
                    (g.tensor(&[b, h, w, c]), g.tensor(&[3, 2, c, o]))
                }
            };
            let t = Transforms {
                weight_fn: ElemFn::builtin("tanh"),
                ..Default::default()
            };
            let params = prims::conv_params(&cp, true, &t);
            assert_rules(
                &prims::etp_conv::primitive(),
                &[x, k, g.tensor(&[o])],
                &params,
            );
        }
    }
}

#[test]
fn vmap_over_x_keeps_the_primitive() {
    let mut g = Lcg(6);
    let w = g.tensor(&[3, 4]);
    let xs = g.tensor(&[5, 3]);
    type Case = (
        &'static str,
        Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>>,
        Vec<Tensor>,
    );
    let cases: Vec<Case> = vec![
        (
            "etp_mm",
            Box::new(|a: &[Tensor]| {
                Ok(vec![prims::matmul(
                    &a[0],
                    &a[1],
                    None,
                    &Transforms::default(),
                )?])
            }),
            vec![xs.clone(), w.clone()],
        ),
        (
            "etp_sp_mm",
            Box::new(|a: &[Tensor]| {
                let s = CsrStructure::from_dense_pattern(3, 4, |r, c| (r + c) % 2 == 0);
                Ok(vec![prims::sparse_matmul(
                    &a[0],
                    &a[1],
                    &s,
                    None,
                    &Transforms::default(),
                )?])
            }),
            vec![xs.clone(), g.tensor(&[6])],
        ),
        (
            "etp_lora_mm",
            Box::new(|a: &[Tensor]| {
                Ok(vec![prims::lora_matmul(
                    &a[0],
                    &a[1],
                    &a[2],
                    0.5,
                    None,
                    &Transforms::default(),
                )?])
            }),
            vec![xs.clone(), g.tensor(&[3, 2]), g.tensor(&[2, 4])],
        ),
    ];
    for (want, f, args) in cases {
        let mut axes = vec![None; args.len()];
        axes[0] = Some(0);
        let vf = vmap(&f, axes);
        let graph = make_graph(&vf, &args.iter().map(|a| a.aval()).collect::<Vec<_>>()).unwrap();
        assert_eq!(graph.primitive_names(), vec![want.to_string()], "{graph}");
        // And the values equal the per-example loop.
        let out = vf(&args).unwrap().remove(0);
        for b in 0..5 {
            let mut one = args.clone();
            one[0] = args[0].index_axis0(b).unwrap();
            let yb = f(&one).unwrap().remove(0);
            let d: f64 = out
                .index_axis0(b)
                .unwrap()
                .sub(&yb)
                .unwrap()
                .abs()
                .unwrap()
                .to_vec_f64()
                .unwrap()
                .iter()
                .fold(0.0, |m, v| m.max(*v));
            assert!(d < 1e-12);
        }
    }
}

#[test]
fn builtins_are_registered_and_flagged() {
    for name in [
        "etp_mm",
        "etp_mv",
        "etp_conv",
        "etp_elemwise",
        "etp_sp_mm",
        "etp_sp_mv",
        "etp_lora_mm",
        "etp_lora_mv",
    ] {
        let p = primitive_by_name(name).unwrap_or_else(|| panic!("{name} registered"));
        assert_eq!(p.is_gradient_enabled(), name == "etp_elemwise", "{name}");
        assert!(
            braintrace::etp::ETP_RULES_YW_TO_W.contains(&p)
                && braintrace::etp::ETP_RULES_INIT_PP.contains(&p)
        );
    }
    assert_eq!(
        primitive_by_name("etp_mv").unwrap().batched_counterpart(),
        primitive_by_name("etp_mm")
    );
}

#[test]
fn user_ops_reject_ranks_they_cannot_take() {
    let w = Tensor::ones(&[3, 4], DType::F64);
    let e = prims::matmul(
        &Tensor::ones(&[2, 2, 3], DType::F64),
        &w,
        None,
        &Transforms::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("matmul") && e.contains("[2, 2, 3]") && e.contains("rank"),
        "{e}"
    );
    let e = prims::matmul(
        &Tensor::ones(&[2, 5], DType::F64),
        &w,
        None,
        &Transforms::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("etp_mm") && e.contains("[2, 5]") && e.contains("[3, 4]"),
        "{e}"
    );
    let s = CsrStructure::from_dense_pattern(3, 4, |r, c| r == c);
    let e = prims::sparse_matmul(
        &Tensor::ones(&[3], DType::F64),
        &Tensor::ones(&[5], DType::F64),
        &s,
        None,
        &Transforms::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("etp_sp_mv"), "{e}");
    let e = prims::conv(
        &Tensor::ones(&[3, 8], DType::F64),
        &Tensor::ones(&[2, 3, 3], DType::F64),
        None,
        &ConvParams::default_for(1),
        &Transforms::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("conv") && e.contains("rank"), "{e}");
    // Grouped convolutions are refused for the D-RTRL trace with a clear error.
    let cp = ConvParams::default_for(1).with_groups(2);
    let params = prims::conv_params(&cp, false, &Transforms::default());
    let p = prims::etp_conv::primitive();
    let e = p
        .init_drtrl(
            Some(&Aval::new(&[1, 4, 6], DType::F64)),
            &Aval::new(&[1, 4, 4], DType::F64),
            &[("weight".to_string(), Aval::new(&[4, 2, 3], DType::F64))]
                .into_iter()
                .collect(),
            1,
            &params,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("etp_conv") && e.contains("grouped"), "{e}");
}
