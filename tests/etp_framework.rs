//! The ETP primitive framework (issue 3): the seed's class-based and
//! spec-based examples translated to Rust, derived rules under every
//! transform, identity-preserving batching, registries, concurrency,
//! check_rules and the error cases.

use braintrace::etp::{
    check_rules, decomposition_warnings, get_primitive_spec, lookup_primitive, primitive_by_name,
    register_primitive, register_primitive_spec, AvalMap, EtpPrimitive, EtpPrimitiveSpec, EtpRules,
    InitDrtrl, InitPp, Params, PrimitiveOptions, TensorMap, XyToDw, YwToW, ETP_RULES_INIT_DRTRL,
    ETP_RULES_INIT_PP, ETP_RULES_XY_TO_DW, ETP_RULES_YW_TO_W,
};
use braintrace::prelude::*;
use std::sync::Arc;

fn scaled_impl(a: &[Tensor], p: &Params) -> Result<Tensor> {
    let scale: f64 = p.get_or("etp_my_op", "scale", 1.0)?;
    a[0].matmul(&a[1])?.mul_scalar(scale)
}

/// The seed's rules, written against plain tensors (single trainable).
fn seed_rules(
    impl_fn: fn(&[Tensor], &Params) -> Result<Tensor>,
) -> (YwToW, XyToDw, InitDrtrl, InitPp) {
    let yw = YwToW::single(|hidden, trace, _p| trace.mul(&hidden.expand_dims(hidden.ndim() - 1)?));
    let xy = XyToDw::single(move |x, hidden, w, p| {
        let x = x.expect("x").clone();
        let p = p.clone();
        let (_, pb) = vjp(
            move |w_: &[Tensor]| Ok(vec![impl_fn(&[x.clone(), w_[0].clone()], &p)?]),
            std::slice::from_ref(w),
        )?;
        Ok(pb.apply(std::slice::from_ref(hidden))?.remove(0))
    });
    let init_drtrl = InitDrtrl::single(|x, _y, w, ns, _p| {
        let mut shape = vec![x.expect("x").shape()[0]];
        shape.extend(w.shape());
        shape.push(ns);
        Ok(Tensor::zeros(&shape, w.dtype()))
    });
    let init_pp = InitPp::single(|_x, y, _w, ns, _p| {
        let mut shape = y.shape().to_vec();
        shape.push(ns);
        Ok(Tensor::zeros(&shape, y.dtype()))
    });
    (yw, xy, init_drtrl, init_pp)
}

fn class_based(name: &str) -> EtpPrimitive {
    let p = register_primitive(name, scaled_impl, PrimitiveOptions::new().batched(true))
        .expect("register");
    let (yw, xy, id, ip) = seed_rules(scaled_impl);
    p.register_yw_to_w(yw);
    p.register_etp_rules(EtpRules {
        xy_to_dw: Some(xy),
        init_drtrl: Some(id),
        init_pp: Some(ip),
        ..Default::default()
    });
    p
}

fn x_w() -> (Tensor, Tensor) {
    (
        Tensor::ones(&[4, 3], DType::F64),
        Tensor::ones(&[3, 5], DType::F64),
    )
}

fn half() -> Params {
    Params::new().with("scale", 0.5)
}

fn all_eq(t: &Tensor, v: f64) -> bool {
    t.to_vec_f64()
        .unwrap()
        .iter()
        .all(|&e| (e - v).abs() < 1e-12)
}

fn assert_close(a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape(), b.shape());
    for (x, y) in a.to_vec_f64().unwrap().iter().zip(b.to_vec_f64().unwrap()) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

fn check_seed_values(p: &EtpPrimitive) {
    let (x, w) = x_w();
    let y = p.bind(&[x.clone(), w.clone()], &half()).unwrap();
    assert_eq!(y.shape(), &[4, 5]);
    assert!(all_eq(&y, 1.5), "y = {y}");
    let pc = p.clone();
    let gw =
        grad(move |a: &[Tensor]| pc.bind(&[a[0].clone(), a[1].clone()], &half())?.sum_all())(&[
            x.clone(),
            w.clone(),
        ])
        .unwrap();
    assert!(all_eq(&gw[1], 2.0), "grad_w = {}", gw[1]);
    // d/dx sum(0.5 x@w) = 0.5 * rowsum(w) = 2.5
    assert!(all_eq(&gw[0], 2.5), "grad_x = {}", gw[0]);

    // jit equals eager; vmap equals the loop; jvp is linear in the tangents.
    let pc = p.clone();
    let f = move |a: &[Tensor]| Ok(vec![pc.bind(a, &half())?]);
    let jf = jit(f.clone());
    assert_close(&jf(&[x.clone(), w.clone()]).unwrap()[0], &y);
    let xs = Tensor::from_vec((0..24).map(|i| i as f64 * 0.1).collect(), &[2, 4, 3]).unwrap();
    let vm = vmap(f.clone(), vec![Some(0), None])(&[xs.clone(), w.clone()])
        .unwrap()
        .remove(0);
    for b in 0..2 {
        let yb = p
            .bind(&[xs.index_axis0(b).unwrap(), w.clone()], &half())
            .unwrap();
        assert_close(&vm.index_axis0(b).unwrap(), &yb);
    }
    let tx = Tensor::full(&[4, 3], 0.3, DType::F64);
    let tw = Tensor::full(&[3, 5], -0.2, DType::F64);
    let (prim, tan) = jvp(
        f.clone(),
        &[x.clone(), w.clone()],
        &[tx.clone(), tw.clone()],
    )
    .unwrap();
    assert_close(&prim[0], &y);
    // 0.5 (tx @ w + x @ tw) = 0.5 (0.9 - 0.6) = 0.15
    assert!(all_eq(&tan[0], 0.15), "tangent = {}", tan[0]);

    // Nesting: jit(vmap(grad)), vmap(jvp), grad(jit).
    let pc = p.clone();
    let g = move |a: &[Tensor]| grad(|b: &[Tensor]| pc.bind(b, &half())?.sum_all())(a);
    let nested = jit(vmap(g.clone(), vec![Some(0), None]))(&[xs.clone(), w.clone()]).unwrap();
    for b in 0..2 {
        let gb = g(&[xs.index_axis0(b).unwrap(), w.clone()]).unwrap();
        assert_close(&nested[0].index_axis0(b).unwrap(), &gb[0]);
        assert_close(&nested[1].index_axis0(b).unwrap(), &gb[1]);
    }
    let f2 = f.clone();
    let vj = vmap(
        move |a: &[Tensor]| {
            Ok(jvp(
                &f2,
                &[a[0].clone(), a[1].clone()],
                &[a[0].ones_like(), a[1].zeros_like()],
            )?
            .1)
        },
        vec![Some(0), None],
    )(&[xs.clone(), w.clone()])
    .unwrap();
    for b in 0..2 {
        let (_, t) = jvp(
            &f,
            &[xs.index_axis0(b).unwrap(), w.clone()],
            &[Tensor::ones(&[4, 3], DType::F64), w.zeros_like()],
        )
        .unwrap();
        assert_close(&vj[0].index_axis0(b).unwrap(), &t[0]);
    }
    let pc = p.clone();
    let gj = grad(move |a: &[Tensor]| {
        jit(|b: &[Tensor]| Ok(vec![pc.bind(b, &half())?]))(a)?
            .remove(0)
            .sum_all()
    })(&[x.clone(), w.clone()])
    .unwrap();
    assert!(all_eq(&gj[1], 2.0));

    // The four registries hold the rules.
    assert!(ETP_RULES_YW_TO_W.contains(p));
    assert!(ETP_RULES_XY_TO_DW.contains(p));
    assert!(ETP_RULES_INIT_DRTRL.contains(p));
    assert!(ETP_RULES_INIT_PP.contains(p));
    assert_eq!(primitive_by_name(p.name()).as_ref(), Some(p));
    let report = check_rules(p, &[x_rand(&[4, 3]), x_rand(&[3, 5])], &half()).unwrap();
    assert!(report.is_ok(), "{report}");
}

fn x_rand(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(
        (0..n)
            .map(|i| ((i * 7919 % 97) as f64 / 97.0) - 0.5)
            .collect(),
        shape,
    )
    .unwrap()
}

#[test]
fn seed_class_based_example() {
    let p = class_based("etp_my_op");
    assert!(p.is_batched());
    assert!(!p.is_gradient_enabled());
    assert!(
        get_primitive_spec(&p).is_none(),
        "class-based primitives have no spec"
    );
    check_seed_values(&p);
}

fn seed_spec(name: &str) -> Arc<EtpPrimitiveSpec> {
    let (yw, xy, id, ip) = seed_rules(scaled_impl);
    Arc::new(
        EtpPrimitiveSpec::new(name, scaled_impl, yw, xy, id, ip)
            .with_options(PrimitiveOptions::new().batched(true).x_index(Some(0))),
    )
}

#[test]
fn seed_spec_based_example() {
    let spec = seed_spec("etp_my_op_spec");
    let p = register_primitive_spec(spec.clone()).unwrap();
    assert!(
        Arc::ptr_eq(&get_primitive_spec(&p).unwrap(), &spec),
        "get_primitive_spec returns the very spec"
    );
    check_seed_values(&p);
}

#[test]
fn graph_shows_one_equation_with_params() {
    let p = class_based("etp_graph_op");
    let (x, w) = x_w();
    let pc = p.clone();
    let g = make_graph(
        move |a: &[Tensor]| Ok(vec![pc.bind(a, &half())?.tanh()?]),
        &[x.aval(), w.aval()],
    )
    .unwrap();
    assert_eq!(g.primitive_names(), vec!["etp_graph_op", "tanh"]);
    let text = g.to_string();
    assert!(text.contains("etp_graph_op[scale=0.5]"), "{text}");
    // Under jvp, the primal stays one ETP equation.
    let pc = p.clone();
    let gj = make_graph(
        move |a: &[Tensor]| {
            let pc = pc.clone();
            Ok(jvp(
                move |b: &[Tensor]| Ok(vec![pc.bind(b, &half())?]),
                &a[..2],
                &a[2..],
            )?
            .0)
        },
        &[x.aval(), w.aval(), x.aval(), w.aval()],
    )
    .unwrap();
    assert_eq!(
        gj.primitive_names()
            .iter()
            .filter(|n| *n == "etp_graph_op")
            .count(),
        1,
        "{gj}"
    );
}

fn mv_impl(a: &[Tensor], _p: &Params) -> Result<Tensor> {
    a[0].matmul(&a[1])
}

fn dense_rules(p: &EtpPrimitive) {
    let (yw, xy, _, ip) = seed_rules(mv_impl);
    p.register_etp_rules(EtpRules {
        yw_to_w: Some(yw),
        xy_to_dw: Some(xy),
        init_drtrl: Some(InitDrtrl::single(|x, _y, w, ns, _p| {
            let mut shape: Vec<usize> = x.expect("x").shape()[..x.expect("x").ndim() - 1].to_vec();
            shape.extend(w.shape());
            shape.push(ns);
            Ok(Tensor::zeros(&shape, w.dtype()))
        })),
        init_pp: Some(ip),
        ..Default::default()
    });
}

#[test]
fn vmap_over_x_binds_the_batched_counterpart() {
    let mm = register_primitive(
        "etp_test_mm",
        mv_impl,
        PrimitiveOptions::new().batched(true),
    )
    .unwrap();
    dense_rules(&mm);
    let mv = register_primitive(
        "etp_test_mv",
        mv_impl,
        PrimitiveOptions::new().counterpart(&mm),
    )
    .unwrap();
    dense_rules(&mv);
    let mvc = mv.clone();
    let f = vmap(
        move |a: &[Tensor]| Ok(vec![mvc.bind(a, &Params::new())?]),
        vec![Some(0), None],
    );
    let xs = x_rand(&[6, 3]);
    let w = x_rand(&[3, 5]);
    let g = make_graph(&f, &[xs.aval(), w.aval()]).unwrap();
    assert_eq!(g.primitive_names(), vec!["etp_test_mm"], "{g}");
    // Mapping the weight too decomposes (and is recorded as a warning).
    let mvc = mv.clone();
    let f2 = vmap(
        move |a: &[Tensor]| Ok(vec![mvc.bind(a, &Params::new())?]),
        vec![Some(0), Some(0)],
    );
    let ws = x_rand(&[6, 3, 5]);
    let g2 = make_graph(&f2, &[xs.aval(), ws.aval()]).unwrap();
    assert!(
        !g2.primitive_names().iter().any(|n| n.starts_with("etp_")),
        "{g2}"
    );
    assert!(decomposition_warnings().iter().any(|n| n == "etp_test_mv"));
    let out = f2(&[xs.clone(), ws.clone()]).unwrap().remove(0);
    for b in 0..6 {
        assert_close(
            &out.index_axis0(b).unwrap(),
            &xs.index_axis0(b)
                .unwrap()
                .matmul(&ws.index_axis0(b).unwrap())
                .unwrap(),
        );
    }
    // Values agree with the unbatched loop.
    let y = f(&[xs.clone(), w.clone()]).unwrap().remove(0);
    for b in 0..6 {
        assert_close(
            &y.index_axis0(b).unwrap(),
            &xs.index_axis0(b).unwrap().matmul(&w).unwrap(),
        );
    }
}

#[test]
fn transpose_is_derived_for_linear_primitives() {
    // An ETP primitive that is linear in x: its transpose comes from the impl.
    let p = register_primitive("etp_linear_in_x", mv_impl, PrimitiveOptions::new()).unwrap();
    let w = x_rand(&[3, 2]);
    let eqn = braintrace::etp::EtpEqn {
        prim: p.clone(),
        params: Params::new(),
    };
    use braintrace::graph::{LinearArg, Primitive};
    let ct = Tensor::from_vec(vec![1.0, -2.0], &[2]).unwrap();
    let out = eqn
        .transpose(
            &[Some(ct.clone())],
            &[
                LinearArg::Linear(Aval::new(&[3], DType::F64)),
                LinearArg::Known(w.clone()),
            ],
        )
        .unwrap();
    let want = w.matmul(&ct).unwrap();
    assert_close(out[0].as_ref().unwrap(), &want);
    assert!(out[1].is_none());
}

#[test]
fn registries_are_thread_safe() {
    let handles: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..25 {
                    let p = class_based(&format!("etp_thread_{t}_{i}"));
                    mine.push(p);
                    // Read while others write.
                    let _ = braintrace::etp::all_primitives().len();
                    assert!(ETP_RULES_YW_TO_W.len() >= mine.len());
                }
                mine
            })
        })
        .collect();
    let all: Vec<EtpPrimitive> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("no panic"))
        .collect();
    assert_eq!(all.len(), 200);
    for p in &all {
        assert!(
            ETP_RULES_YW_TO_W.contains(p)
                && ETP_RULES_XY_TO_DW.contains(p)
                && ETP_RULES_INIT_DRTRL.contains(p)
                && ETP_RULES_INIT_PP.contains(p)
        );
        assert_eq!(lookup_primitive(p.name()).unwrap(), *p);
    }
}

#[test]
fn check_rules_flags_a_wrong_xy_to_dw() {
    let p = register_primitive(
        "etp_wrong_dw",
        scaled_impl,
        PrimitiveOptions::new().batched(true),
    )
    .unwrap();
    let (yw, right, id, ip) = seed_rules(scaled_impl);
    // Off by a factor of two.
    let wrong = XyToDw::new(move |x, h, w, p| {
        right
            .call(x, h, w, p)?
            .into_iter()
            .map(|(k, v)| Ok((k, v.mul_scalar(2.0)?)))
            .collect()
    });
    p.register_etp_rules(EtpRules {
        yw_to_w: Some(yw),
        xy_to_dw: Some(wrong),
        init_drtrl: Some(id),
        init_pp: Some(ip),
        ..Default::default()
    });
    let report = check_rules(&p, &[x_rand(&[4, 3]), x_rand(&[3, 5])], &half()).unwrap();
    assert!(!report.is_ok());
    let bad = report.get("xy_to_dw").unwrap();
    assert!(!bad.passed && bad.max_abs_dev > 1e-3, "{report}");
    assert!(report.to_string().contains("FAIL"));
    assert!(report.into_result().is_err());
}

#[test]
fn check_rules_flags_a_wrong_yw_to_w_and_nonzero_init() {
    let p = register_primitive(
        "etp_wrong_yw",
        scaled_impl,
        PrimitiveOptions::new().batched(true),
    )
    .unwrap();
    let (_, xy, _, ip) = seed_rules(scaled_impl);
    let wrong_yw = YwToW::single(|h, trace, _p| trace.mul(&h.expand_dims(h.ndim() - 1)?.square()?));
    let ones_init = InitDrtrl::single(|x, _y, w, ns, _p| {
        let mut shape = vec![x.expect("x").shape()[0]];
        shape.extend(w.shape());
        shape.push(ns);
        Ok(Tensor::ones(&shape, w.dtype()))
    });
    p.register_etp_rules(EtpRules {
        yw_to_w: Some(wrong_yw),
        xy_to_dw: Some(xy),
        init_drtrl: Some(ones_init),
        init_pp: Some(ip),
        ..Default::default()
    });
    let report = check_rules(&p, &[x_rand(&[4, 3]), x_rand(&[3, 5])], &half()).unwrap();
    assert!(!report.get("yw_to_w").unwrap().passed, "{report}");
    assert!(!report.get("init_drtrl").unwrap().passed, "{report}");
    assert!(report.get("xy_to_dw").unwrap().passed, "{report}");
}

#[test]
fn errors_name_the_primitive_and_shapes() {
    let p = class_based("etp_err_op");
    // Registering a name twice.
    let e = register_primitive("etp_err_op", scaled_impl, PrimitiveOptions::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("etp_err_op") && e.contains("already registered"),
        "{e}"
    );
    // Wrong number of arguments.
    let e = p
        .bind(&[Tensor::ones(&[4, 3], DType::F64)], &half())
        .unwrap_err()
        .to_string();
    assert!(e.contains("etp_err_op") && e.contains("f64[4,3]"), "{e}");
    // Wrong shapes inside the impl.
    let e = p
        .bind(
            &[
                Tensor::ones(&[4, 3], DType::F64),
                Tensor::ones(&[4, 5], DType::F64),
            ],
            &half(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("etp_err_op")
            && e.contains("matmul")
            && e.contains("[4, 3]")
            && e.contains("[4, 5]"),
        "{e}"
    );
    // Wrong dtype of a trainable.
    let idx = Tensor::from_vec_typed(vec![1i64, 2, 3], &[3]).unwrap();
    let e = p
        .bind(&[Tensor::ones(&[4, 3], DType::F64), idx], &half())
        .unwrap_err()
        .to_string();
    assert!(e.contains("etp_err_op") && e.contains("float"), "{e}");
    // Layout index out of range.
    let e = register_primitive(
        "etp_bad_layout",
        scaled_impl,
        PrimitiveOptions::new()
            .num_args(2)
            .trainables(&[("weight", 5)]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("etp_bad_layout") && e.contains("out of range"),
        "{e}"
    );
    // Unknown name.
    let e = lookup_primitive("etp_no_such_op").unwrap_err().to_string();
    assert!(e.contains("etp_no_such_op"), "{e}");
    // A rule with the wrong output shape, named when used.
    let q = register_primitive(
        "etp_bad_rule",
        scaled_impl,
        PrimitiveOptions::new().batched(true),
    )
    .unwrap();
    q.register_yw_to_w(YwToW::single(|h, _trace, _p| Ok(h.clone())));
    let mut trace = TensorMap::new();
    trace.insert("weight".into(), Tensor::zeros(&[4, 3, 5], DType::F64));
    let e = q
        .yw_to_w(&Tensor::ones(&[4, 5], DType::F64), &trace, &half())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("etp_bad_rule") && e.contains("yw_to_w") && e.contains("[4, 3, 5]"),
        "{e}"
    );
    // A missing rule.
    let e = q
        .xy_to_dw(
            None,
            &Tensor::ones(&[4, 5], DType::F64),
            &TensorMap::new(),
            &half(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("etp_bad_rule") && e.contains("xy_to_dw"), "{e}");
    let _ = AvalMap::new();
}

#[test]
fn jit_executes_the_lowered_graph_and_keeps_analysis_graphs_whole() {
    let p = class_based("etp_lowered_op");
    let (x, w) = x_w();
    let pc = p.clone();
    let f = move |a: &[Tensor]| Ok(vec![pc.bind(a, &half())?]);
    let analysis = make_graph(&f, &[x.aval(), w.aval()]).unwrap();
    assert_eq!(analysis.primitive_names(), vec!["etp_lowered_op"]);
    let lowered = analysis.lower().unwrap();
    assert_eq!(
        lowered.primitive_names(),
        vec!["matmul", "mul_scalar"],
        "{lowered}"
    );
    let j = braintrace::Jit::new(f);
    let y = j.call(&[x.clone(), w.clone()]).unwrap();
    assert!(all_eq(&y[0], 1.5));
    let cached = j.cached_graph(&[x.aval(), w.aval()]).unwrap();
    assert_eq!(cached.primitive_names(), vec!["matmul", "mul_scalar"]);
    assert_eq!(j.trace_count(), 1);
}

#[test]
fn a_runtime_registration_after_the_built_ins_cannot_claim_their_names() {
    // Compile-time primitives first (the other order is in
    // `registration_order.rs`, its own process).
    let mv = braintrace::prims::etp_mv::primitive();
    for (name, e) in [
        (
            "etp_mv",
            register_primitive("etp_mv", scaled_impl, PrimitiveOptions::new()).unwrap_err(),
        ),
        (
            "etp_lora_mm",
            register_primitive_spec(seed_spec("etp_lora_mm")).unwrap_err(),
        ),
    ] {
        let msg = e.to_string();
        match e {
            braintrace::Error::DuplicatePrimitive {
                name: n,
                first,
                second,
            } => {
                assert_eq!(n, name);
                assert!(first.contains("#[etp_primitive]"), "{msg}");
                assert!(
                    second.contains("register_primitive") && second.contains("etp_framework.rs"),
                    "{msg}"
                );
            }
            other => panic!("expected DuplicatePrimitive, got {other:?}"),
        }
    }
    assert_eq!(primitive_by_name("etp_mv"), Some(mv));
    assert_eq!(
        primitive_by_name("etp_lora_mm"),
        Some(braintrace::prims::etp_lora_mm::primitive())
    );
}

#[test]
fn rule_registries_are_views_of_the_primitives_rules() {
    let p = register_primitive("etp_view_op", scaled_impl, PrimitiveOptions::new()).unwrap();
    assert!(!ETP_RULES_YW_TO_W.contains(&p));
    assert!(!ETP_RULES_YW_TO_W.primitives().contains(&p));
    // A rule registered on the handle is what the registry returns, the same function.
    let (yw, xy, _, _) = seed_rules(scaled_impl);
    p.register_yw_to_w(yw.clone());
    assert!(ETP_RULES_YW_TO_W.get(&p).unwrap().ptr_eq(&yw));
    assert!(ETP_RULES_YW_TO_W.primitives().contains(&p));
    assert!(!ETP_RULES_XY_TO_DW.primitives().contains(&p));
    // Registering again replaces it.
    let (yw2, _, _, _) = seed_rules(scaled_impl);
    p.register_yw_to_w(yw2.clone());
    assert!(ETP_RULES_YW_TO_W.get(&p).unwrap().ptr_eq(&yw2));
    p.register_xy_to_dw(xy);
    assert!(ETP_RULES_XY_TO_DW.contains(&p));
    assert_eq!(ETP_RULES_XY_TO_DW.name(), "xy_to_dw");
    // A primitive refused at registration is in no registry.
    let spec = seed_spec("etp_view_op");
    assert!(register_primitive_spec(spec).is_err());
    let holders: Vec<EtpPrimitive> = ETP_RULES_INIT_PP
        .primitives()
        .into_iter()
        .filter(|q| q.name() == "etp_view_op")
        .collect();
    assert!(holders.is_empty(), "{holders:?}");
}
