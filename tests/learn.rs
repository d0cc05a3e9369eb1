//! Online learning: D-RTRL equals BPTT on diagonal models for every built-in
//! primitive a diagonal model can use and for a user-defined primitive; the
//! non-temporal option; pp_prop identities; bad input gets clear errors and
//! leaves the learner unchanged.

mod learn_support;

use braintrace::etp::ElemFn;
use braintrace::learn::{
    bptt_grad, compile, Algorithm, DRtrl, DiagnosticKind, Init, Model, ModelState, NonTemporal,
    PpProp, Reduction, StepCtx, TensorDict, VjpMethod,
};
use braintrace::nn::Initializer;
use braintrace::ops::{ConvPadding, ConvParams};
use braintrace::prelude::*;
use braintrace::prims::{conv, lora_matmul, matmul, sparse_matmul, CsrStructure, Transforms};
use learn_support::models::{DiagNet, GruNet, LifNet};
use learn_support::{draw, mse};

// ------------------------------------------------------------ the user primitive (the seed's)

/// y = scale * (x @ w), x `(B, I)`, w `(I, O)`.
#[etp_primitive(name = "etp_my_op_learn", batched, x = x, weight = w)]
fn my_op(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
    x.matmul(w)?.mul_scalar(scale)
}

#[yw_to_w(my_op)]
fn my_op_yw_to_w(hidden: &Tensor, trace: &Tensor, _p: &my_op::Params) -> Result<Tensor> {
    trace.mul(&hidden.expand_dims(hidden.ndim() - 1)?)
}

#[xy_to_dw(my_op)]
fn my_op_xy_to_dw(x: &Tensor, hidden: &Tensor, _w: &Tensor, p: &my_op::Params) -> Result<Tensor> {
    let xt_h = if x.ndim() == 1 {
        x.expand_dims(1)?.mul(&hidden.expand_dims(0)?)?
    } else {
        x.t()?.matmul(hidden)?
    };
    xt_h.mul_scalar(p.scale)
}

#[init_drtrl(my_op)]
fn my_op_init_drtrl(x: &Aval, y: &Aval, w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    let shape = [&[x.shape()[0]], w.shape(), &[num_hidden_state]].concat();
    Ok(Tensor::zeros(&shape, y.dtype()))
}

#[init_pp(my_op)]
fn my_op_init_pp(_x: &Aval, y: &Aval, _w: &Aval, num_hidden_state: usize) -> Result<Tensor> {
    Ok(Tensor::zeros(
        &[y.shape(), &[num_hidden_state]].concat(),
        y.dtype(),
    ))
}

// ------------------------------------------------------------ a leaky integrator over any op

type Op = Box<dyn Fn(&StepCtx, &Tensor) -> Result<Tensor>>;

/// `h' = λ h + tanh(op(x))`, output `h'`: the cut hidden Jacobian is the
/// true one, so D-RTRL is exact.
struct LeakyOver {
    params: Vec<(String, Vec<usize>)>,
    hidden: Vec<usize>,
    lambda: f64,
    op: Op,
    /// A second state per neuron, `v' = 0.5 v + 0.3 h'` (and `h'` gets
    /// `+ 0.2 v`): a 2 × 2 hidden Jacobian; the output is `h' + v'`.
    two_states: bool,
}

impl Model for LeakyOver {
    fn init(&self, init: &mut Init) -> Result<()> {
        for (k, s) in &self.params {
            let v = Initializer::Normal { std: 0.6 }.draw(s, init.dtype(), init.rng())?;
            init.param(k, None, v)?;
        }
        if self.two_states {
            init.hidden("v", &self.hidden)?;
        }
        init.hidden("h", &self.hidden)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("h")?;
        let y = (self.op)(ctx, x)?;
        let mut h_new = h.mul_scalar(self.lambda)?.add(&y.tanh()?)?;
        if !self.two_states {
            ctx.set_hidden("h", h_new.clone())?;
            return Ok(h_new);
        }
        let v = ctx.hidden("v")?;
        h_new = h_new.add(&v.mul_scalar(0.2)?)?;
        let v_new = v.mul_scalar(0.5)?.add(&h_new.mul_scalar(0.3)?)?;
        ctx.set_hidden("h", h_new.clone())?;
        ctx.set_hidden("v", v_new.clone())?;
        h_new.add(&v_new)
    }
}

fn leaky(params: &[(&str, &[usize])], hidden: &[usize], op: Op) -> LeakyOver {
    LeakyOver {
        params: params
            .iter()
            .map(|(k, s)| (k.to_string(), s.to_vec()))
            .collect(),
        hidden: hidden.to_vec(),
        lambda: 0.7,
        op,
        two_states: false,
    }
}

/// [`leaky`] with two states per neuron.
fn leaky2(params: &[(&str, &[usize])], hidden: &[usize], op: Op) -> LeakyOver {
    LeakyOver {
        two_states: true,
        ..leaky(params, hidden, op)
    }
}

/// `got` against `want` key by key, element by element, within `tol` of the
/// largest `|want|` (at least 1e-3); `what` names the two paths compared.
fn assert_dicts_close(what: &str, got: &TensorDict, want: &TensorDict, tol: f64) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: keys"
    );
    for (k, w) in want {
        let (g, w) = (got[k].to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
        let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-3);
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= tol * scale,
                "{what}[{k}] element {i}: got {a}, want {b} (|diff| {:e})",
                (a - b).abs()
            );
        }
    }
}

/// Run D-RTRL (and report BPTT) on `model` over T = 6 random steps.
fn online_vs_bptt<M: Model>(
    model: M,
    batch: Option<usize>,
    x_shape: &[usize],
    algo: Algorithm,
) -> (TensorDict, TensorDict) {
    let state = ModelState::new(&model, DType::F64, 7, batch).unwrap();
    let t = 6;
    let xs = draw(&[&[t], x_shape].concat(), 11);
    let (out, _) = state.step(&model, &xs.index_axis0(0).unwrap()).unwrap();
    let ys = draw(&[&[t], out.shape()].concat(), 12);
    let bptt = bptt_grad(&model, &state, &xs, &ys, mse, Reduction::Mean).unwrap();
    let x0 = xs.index_axis0(0).unwrap();
    let mut learner = compile(model, state, algo, &x0, batch).unwrap();
    let online = learner.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap();
    for (k, g) in &online.grads {
        assert!(
            g.to_vec_f64().unwrap().iter().any(|v| v.abs() > 1e-8),
            "gradient of {k} is zero: the test would not see a wrong trace"
        );
    }
    (online.grads, bptt.grads)
}

fn exact(name: &str, model: LeakyOver, batch: Option<usize>, x_shape: &[usize]) {
    let (online, bptt) = online_vs_bptt(model, batch, x_shape, DRtrl::default().into());
    assert_dicts_close(&format!("{name}: online vs BPTT"), &online, &bptt, 1e-12);
}

fn p(ctx: &StepCtx, k: &str) -> Result<Tensor> {
    ctx.param(k)
}

#[test]
fn drtrl_equals_bptt_dense_mm_and_mv() {
    let op = || -> Op {
        Box::new(|c, x| matmul(x, &p(c, "W")?, Some(&p(c, "b")?), &Transforms::default()))
    };
    exact(
        "mm",
        leaky(&[("W", &[3, 4]), ("b", &[4])], &[4], op()),
        Some(2),
        &[2, 3],
    );
    exact(
        "mv",
        leaky(&[("W", &[3, 4]), ("b", &[4])], &[4], op()),
        None,
        &[3],
    );
}

#[test]
fn drtrl_equals_bptt_dense_with_transforms() {
    let op: Op = Box::new(|c, x| {
        let t = Transforms {
            weight_fn: ElemFn::builtin("tanh"),
            bias_fn: ElemFn::builtin("softplus"),
            ..Transforms::default()
        };
        matmul(x, &p(c, "W")?, Some(&p(c, "b")?), &t)
    });
    exact(
        "mm hooks",
        leaky(&[("W", &[3, 4]), ("b", &[4])], &[4], op),
        Some(2),
        &[2, 3],
    );
}

#[test]
fn drtrl_equals_bptt_conv() {
    // NCW, VALID, stride 1: x (B, 2, 8), kernel (3, 2, 3) -> y (B, 3, 6).
    let op: Op = Box::new(|c, x| {
        conv(
            x,
            &p(c, "K")?,
            Some(&p(c, "b")?),
            &ConvParams::default_for(1),
            &Transforms::default(),
        )
    });
    exact(
        "conv ncw",
        leaky(&[("K", &[3, 2, 3]), ("b", &[3])], &[3, 6], op),
        Some(2),
        &[2, 2, 8],
    );
    // NWC / WIO / NWC, SAME, stride 2: x (B, 7, 2), kernel (3, 2, 4) -> y (B, 4, 4).
    let op: Op = Box::new(|c, x| {
        let cp = ConvParams::default_for(1)
            .with_strides(&[2])
            .with_padding(ConvPadding::Same)
            .with_dimension_numbers("NWC", "WIO", "NWC");
        let t = Transforms {
            weight_fn: ElemFn::builtin("tanh"),
            ..Transforms::default()
        };
        conv(x, &p(c, "K")?, Some(&p(c, "b")?), &cp, &t)
    });
    exact(
        "conv nwc",
        leaky(&[("K", &[3, 2, 4]), ("b", &[4])], &[4, 4], op),
        Some(2),
        &[2, 7, 2],
    );
}

#[test]
fn drtrl_equals_bptt_sparse() {
    let s = CsrStructure::from_dense_pattern(3, 4, |r, c| (r + c) % 2 == 0 && r != 1);
    let nnz = s.nnz();
    let s1 = s.clone();
    let op: Op = Box::new(move |c, x| {
        sparse_matmul(
            x,
            &p(c, "w")?,
            &s1,
            Some(&p(c, "b")?),
            &Transforms::default(),
        )
    });
    exact(
        "sp_mm",
        leaky(&[("w", &[nnz]), ("b", &[4])], &[4], op),
        Some(2),
        &[2, 3],
    );
    let op: Op = Box::new(move |c, x| {
        sparse_matmul(
            x,
            &p(c, "w")?,
            &s,
            Some(&p(c, "b")?),
            &Transforms::default(),
        )
    });
    exact(
        "sp_mv",
        leaky(&[("w", &[nnz]), ("b", &[4])], &[4], op),
        None,
        &[3],
    );
}

#[test]
fn drtrl_equals_bptt_lora() {
    let op = || -> Op {
        Box::new(|c, x| {
            let t = Transforms {
                b_fn: ElemFn::builtin("tanh"),
                ..Transforms::default()
            };
            lora_matmul(x, &p(c, "B")?, &p(c, "A")?, 0.5, Some(&p(c, "b")?), &t)
        })
    };
    let params: &[(&str, &[usize])] = &[("B", &[3, 2]), ("A", &[2, 4]), ("b", &[4])];
    exact("lora_mm", leaky(params, &[4], op()), Some(2), &[2, 3]);
    exact("lora_mv", leaky(params, &[4], op()), None, &[3]);
}

#[test]
fn drtrl_equals_bptt_elementwise() {
    // The golden `diag` model: a per-unit decay through etp_elemwise(sigmoid)
    // and an input matmul.
    let (online, bptt) = online_vs_bptt(
        DiagNet::new(3, 4),
        Some(2),
        &[2, 3],
        DRtrl::default().into(),
    );
    assert_dicts_close("diag: online vs BPTT", &online, &bptt, 1e-12);
}

#[test]
fn drtrl_equals_bptt_for_a_user_defined_primitive() {
    let op: Op = Box::new(|c, x| my_op(x, &p(c, "w")?, 0.5));
    let model = leaky(&[("w", &[3, 4])], &[4], op);
    // The relation of the user's primitive is found.
    let state = ModelState::new(&model, DType::F64, 1, Some(2)).unwrap();
    let learner = compile(
        model,
        state,
        DRtrl::default(),
        &Tensor::zeros(&[2, 3], DType::F64),
        Some(2),
    )
    .unwrap();
    let rels = learner.graph().relations();
    assert_eq!(rels.len(), 1);
    assert_eq!(rels[0].primitive.name(), "etp_my_op_learn");
    assert_eq!(
        rels[0].trainable_paths(),
        vec![("weight".to_string(), "w".to_string())]
    );
    let op: Op = Box::new(|c, x| my_op(x, &p(c, "w")?, 0.5));
    exact(
        "my_op",
        leaky(&[("w", &[3, 4])], &[4], op),
        Some(2),
        &[2, 3],
    );
}

#[test]
fn multi_step_over_one_step_windows_matches_bptt_for_the_readout() {
    // Multi-step gives every parameter its in-step gradient: for a readout
    // with no temporal influence that is its exact gradient.
    let (online, bptt) = online_vs_bptt(
        GruNet::new(3, 5, 2),
        Some(2),
        &[2, 3],
        DRtrl::default().vjp_method(VjpMethod::MultiStep).into(),
    );
    for k in ["out/weight/weight", "out/weight/bias"] {
        let one: TensorDict = [(k.to_string(), online[k].clone())].into();
        let want: TensorDict = [(k.to_string(), bptt[k].clone())].into();
        assert_dicts_close("multi-step readout", &one, &want, 1e-12);
    }
}

#[test]
fn non_temporal_parameters_zero_by_default_in_step_gradient_on_request() {
    let run = |nt: NonTemporal| {
        let model = GruNet::new(3, 5, 2);
        let state = ModelState::new(&model, DType::F64, 3, Some(2)).unwrap();
        let xs = draw(&[5, 2, 3], 1);
        let ys = draw(&[5, 2, 2], 2);
        let bptt = bptt_grad(&model, &state, &xs, &ys, mse, Reduction::Mean).unwrap();
        let mut l = compile(
            model,
            state,
            DRtrl::default().non_temporal(nt),
            &Tensor::zeros(&[2, 3], DType::F64),
            Some(2),
        )
        .unwrap();
        (
            l.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap().grads,
            bptt.grads,
        )
    };
    let (zero, _) = run(NonTemporal::Zero);
    for k in [
        "out/weight/weight",
        "out/weight/bias",
        "rnn/Wr/weight/weight",
        "rnn/Wr/weight/bias",
    ] {
        assert!(
            zero[k].to_vec_f64().unwrap().iter().all(|&v| v == 0.0),
            "{k} must be exactly zero"
        );
    }
    let (in_step, bptt) = run(NonTemporal::InStep);
    for k in ["out/weight/weight", "out/weight/bias"] {
        let one: TensorDict = [(k.to_string(), in_step[k].clone())].into();
        let want: TensorDict = [(k.to_string(), bptt[k].clone())].into();
        assert_dicts_close("in-step readout = BPTT readout", &one, &want, 1e-12);
    }
    assert!(in_step["rnn/Wr/weight/weight"]
        .to_vec_f64()
        .unwrap()
        .iter()
        .any(|v| v.abs() > 1e-8));
    // Relation parameters are unaffected by the option.
    for k in ["rnn/Wz/weight/weight", "rnn/Wh/weight/bias"] {
        assert_eq!(
            zero[k].to_vec_f64().unwrap(),
            in_step[k].to_vec_f64().unwrap()
        );
    }
}

#[test]
fn pp_prop_with_zero_decay_equals_drtrl_on_a_single_relation_model() {
    // With α = 0 (rank 1) the traces are instantaneous; on a model whose
    // hidden Jacobian is zero (h' = tanh(x @ W)) D-RTRL's trace is too.
    let op = || -> Op { Box::new(|c, x| matmul(x, &p(c, "W")?, None, &Transforms::default())) };
    let mut m1 = leaky(&[("W", &[3, 4])], &[4], op());
    m1.lambda = 0.0;
    let mut m2 = leaky(&[("W", &[3, 4])], &[4], op());
    m2.lambda = 0.0;
    let (d, _) = online_vs_bptt(m1, Some(2), &[2, 3], DRtrl::default().into());
    let (pp, _) = online_vs_bptt(m2, Some(2), &[2, 3], PpProp::rank(1).unwrap().into());
    assert_dicts_close("pp_prop(rank 1) vs D-RTRL", &pp, &d, 1e-12);
}

#[test]
fn lif_groups_and_relations() {
    let model = LifNet::new(3, 5, 4, 0.8, 0.6, 1.0, 0.8);
    let state = ModelState::new(&model, DType::F64, 0, Some(2)).unwrap();
    let l = compile(
        model,
        state,
        DRtrl::default(),
        &Tensor::zeros(&[2, 3], DType::F64),
        Some(2),
    )
    .unwrap();
    let g = l.graph();
    assert_eq!(g.groups().len(), 2);
    assert_eq!(g.groups()[0].hidden_paths, vec!["i", "v"]);
    assert_eq!(g.groups()[1].hidden_paths, vec!["readout/r"]);
    assert!(g
        .diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::HiddenGroupMerged));
    let text = l.explain();
    assert!(
        text.contains("[i, v]") && text.contains("readout/W"),
        "{text}"
    );
}

// ------------------------------------------------------------ bad input

struct NoHidden;
impl Model for NoHidden {
    fn init(&self, init: &mut Init) -> Result<()> {
        init.param("W", None, Tensor::ones(&[3, 2], DType::F64))
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        matmul(x, &ctx.param("W")?, None, &Transforms::default())
    }
}

struct NoEtp;
impl Model for NoEtp {
    fn init(&self, init: &mut Init) -> Result<()> {
        init.param("W", None, Tensor::ones(&[3, 2], DType::F64))?;
        init.hidden("h", &[2])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = ctx.hidden("h")?.add(&x.matmul(&ctx.param("W")?)?)?;
        ctx.set_hidden("h", h.clone())?;
        Ok(h)
    }
}

fn err_text<T>(r: Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn compile_refuses_models_without_hidden_state_or_etp_ops() {
    let x = Tensor::zeros(&[2, 3], DType::F64);
    let s = ModelState::new(&NoHidden, DType::F64, 0, Some(2)).unwrap();
    let e = err_text(compile(NoHidden, s, DRtrl::default(), &x, Some(2)));
    assert!(e.contains("no hidden state"), "{e}");
    let s = ModelState::new(&NoEtp, DType::F64, 0, Some(2)).unwrap();
    let e = err_text(compile(NoEtp, s, DRtrl::default(), &x, Some(2)));
    assert!(e.contains("no ETP operation"), "{e}");
}

#[test]
fn bad_input_is_refused_and_leaves_the_learner_unchanged() {
    let model = GruNet::new(3, 5, 2);
    let state = ModelState::new(&model, DType::F64, 0, Some(2)).unwrap();
    // Batch mismatch between the example input and batch_size.
    let e = err_text(compile(
        GruNet::new(3, 5, 2),
        state.clone(),
        DRtrl::default(),
        &Tensor::zeros(&[3, 3], DType::F64),
        Some(2),
    ));
    assert!(e.contains("batch"), "{e}");
    let mut l = compile(
        model,
        state,
        DRtrl::default(),
        &Tensor::zeros(&[2, 3], DType::F64),
        Some(2),
    )
    .unwrap();
    l.update(&draw(&[2, 3], 5)).unwrap();
    let (h0, tr0, n0) = (l.state().hidden(), l.traces(), l.running_index());
    let same = |l: &braintrace::learn::Learner<GruNet>| {
        assert_eq!(l.running_index(), n0);
        for (k, v) in l.state().hidden() {
            assert_eq!(
                v.to_vec_f64().unwrap(),
                h0[&k].to_vec_f64().unwrap(),
                "hidden {k} changed"
            );
        }
        for (a, b) in l.traces().iter().zip(&tr0) {
            assert_eq!(
                a.to_vec_f64().unwrap(),
                b.to_vec_f64().unwrap(),
                "a trace changed"
            );
        }
    };
    let xs = draw(&[4, 2, 3], 1);
    // Different lengths.
    let e = err_text(l.etrace_grad(&xs, &draw(&[3, 2, 2], 2), mse, Reduction::Mean));
    assert!(e.contains("same number of steps"), "{e}");
    same(&l);
    // Wrong input shape.
    let e = err_text(l.etrace_grad(
        &draw(&[4, 2, 4], 1),
        &draw(&[4, 2, 2], 2),
        mse,
        Reduction::Mean,
    ));
    assert!(e.contains("xs"), "{e}");
    same(&l);
    // A loss that is not a scalar.
    let e = err_text(l.etrace_grad(&xs, &draw(&[4, 2, 2], 2), |o, y| o.sub(y), Reduction::Mean));
    assert!(e.contains("scalar"), "{e}");
    same(&l);
    // Targets of the wrong shape (the loss's own error surfaces).
    assert!(l
        .etrace_grad(&xs, &draw(&[4, 2, 5], 2), mse, Reduction::Mean)
        .is_err());
    same(&l);
    // update with a wrong shape.
    let e = err_text(l.update(&draw(&[3, 3], 1)));
    assert!(e.contains("shape"), "{e}");
    same(&l);
    // A parameter path that does not exist.
    let e = err_text(
        l.state_mut()
            .set_param("rnn/Wq/weight/weight", &Tensor::zeros(&[8, 5], DType::F64)),
    );
    assert!(
        e.contains("rnn/Wq/weight/weight") && e.contains("rnn/Wz/weight/weight"),
        "{e}"
    );
    // Resetting to a batch size of 0 (another size is allowed: it
    // recompiles the step, see tests/driver.rs).
    let e = err_text(l.reset_state(Some(0)));
    assert!(e.contains("batch"), "{e}");
    same(&l);
}

// ------------------------------------------------------------ fused kernels vs the rules

fn fast_vs_generic<M: Model, F: Fn() -> M>(
    make: F,
    batch: Option<usize>,
    x_shape: &[usize],
    base: DRtrl,
    seed: u64,
) {
    let t = 5;
    let run = |fast: bool| {
        let model = make();
        let state = ModelState::new(&model, DType::F64, seed, batch).unwrap();
        let xs = draw(&[&[t], x_shape].concat(), seed + 1);
        let (out, _) = state.step(&model, &xs.index_axis0(0).unwrap()).unwrap();
        let ys = draw(&[&[t], out.shape()].concat(), seed + 2);
        let mut l = compile(
            model,
            state,
            base.fast_paths(fast),
            &xs.index_axis0(0).unwrap(),
            batch,
        )
        .unwrap();
        // Every pair runs a kernel with fast paths on, none without: the
        // comparison below compares two different code paths.
        let text = l.explain();
        let n = l
            .graph()
            .relations()
            .iter()
            .map(|r| r.groups.len())
            .sum::<usize>();
        let want = format!("fused trace kernels: {} of {n} ", if fast { n } else { 0 });
        assert!(text.contains(&want), "want `{want}` in\n{text}");
        // A plain update first (traces advance without a gradient), then a sequence.
        l.update(&xs.index_axis0(1).unwrap()).unwrap();
        let g1 = l.etrace_grad(&xs, &ys, mse, Reduction::Sum).unwrap();
        // An optimiser-like change of every parameter between calls: the
        // traces carry the old transform derivatives, the new call's
        // instantaneous terms and gradient maps use the new ones.
        let infos: Vec<String> = l
            .state()
            .param_infos()
            .iter()
            .map(|i| i.key.clone())
            .collect();
        for (k, key) in infos.iter().enumerate() {
            let v = l.state().param_values()[k].clone();
            let nv = v.mul_scalar(0.9).unwrap().add_scalar(0.05).unwrap();
            l.state_mut().set_param(key, &nv).unwrap();
        }
        l.update(&xs.index_axis0(2).unwrap()).unwrap();
        let xs2 = draw(&[&[t], x_shape].concat(), seed + 3);
        let g2 = l.etrace_grad(&xs2, &ys, mse, Reduction::Mean).unwrap();
        let mut traces = l.traces();
        traces.sort_by_key(|t| t.shape().to_vec());
        (g1.grads, g2.grads, traces)
    };
    let (g1_fast, g2_fast, tr_fast) = run(true);
    let (g1_gen, g2_gen, tr_gen) = run(false);
    assert_dicts_close("fast vs generic grads", &g1_fast, &g1_gen, 1e-12);
    assert_dicts_close("fast vs generic grads, 2nd call", &g2_fast, &g2_gen, 1e-12);
    assert_eq!(tr_fast.len(), tr_gen.len());
    for (a, b) in tr_fast.iter().zip(&tr_gen) {
        assert_eq!(a.shape(), b.shape());
        let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "trace {x} vs {y}");
        }
    }
}

#[test]
fn the_builtins_declare_their_trace_kernels() {
    let conv = Params::new().with("feature_group_count", 1usize);
    for p in [
        "etp_mm",
        "etp_mv",
        "etp_elemwise",
        "etp_sp_mm",
        "etp_sp_mv",
        "etp_lora_mm",
        "etp_lora_mv",
        "etp_conv",
    ] {
        let prim = braintrace::etp::lookup_primitive(p).unwrap();
        let params = match p {
            "etp_conv" => conv.clone(),
            "etp_lora_mm" | "etp_lora_mv" => Params::new().with("alpha", 1.0),
            "etp_sp_mm" | "etp_sp_mv" => Params::new().with("sparse_mat", 1i64),
            _ => Params::new(),
        };
        assert!(
            prim.trace_kernel(&params).is_some(),
            "{p} declares no kernel"
        );
    }
}

#[test]
fn fused_dense_kernels_equal_the_rule_path() {
    // 19 hidden units: two full 8-output blocks of the kernels' row layout
    // and a narrower last one.
    for (seed, (n_in, n_rec, n_out, b)) in [(3, 5, 2, 2), (4, 7, 3, 3), (2, 3, 1, 1), (3, 19, 2, 2)]
        .into_iter()
        .enumerate()
    {
        let seed = seed as u64 * 10;
        for base in [
            DRtrl::default(),
            DRtrl::default().vjp_method(VjpMethod::MultiStep),
        ] {
            fast_vs_generic(
                || GruNet::new(n_in, n_rec, n_out),
                Some(b),
                &[b, n_in],
                base,
                seed,
            );
            // Two states per group (LIF: i, v).
            fast_vs_generic(
                || LifNet::new(n_in, n_rec, n_out, 0.8, 0.6, 0.3, 0.8),
                Some(b),
                &[b, n_in],
                base,
                seed,
            );
        }
        // etp_elemwise: fused without weight_fn, the rules with one.
        for make in [DiagNet::identity, DiagNet::new] {
            for base in [
                DRtrl::default(),
                DRtrl::default().vjp_method(VjpMethod::MultiStep),
            ] {
                fast_vs_generic(|| make(n_in, n_rec), Some(b), &[b, n_in], base, seed);
            }
        }
        // Unbatched: etp_mv.
        let op = || -> Op {
            Box::new(|c, x| matmul(x, &p(c, "W")?, Some(&p(c, "b")?), &Transforms::default()))
        };
        fast_vs_generic(
            || leaky(&[("W", &[n_in, n_rec]), ("b", &[n_rec])], &[n_rec], op()),
            None,
            &[n_in],
            DRtrl::default(),
            seed,
        );
    }
}

/// Both VJP methods, one and two states per neuron, batched (`B = 2`) and
/// not, over `op`; `x` is `(B?, n_in)`.
fn fast_vs_generic_leaky(
    params: &[(&str, &[usize])],
    n_in: usize,
    n_out: usize,
    op: impl Fn() -> Op,
    seed: u64,
) {
    for batch in [Some(2), None] {
        let x_shape: Vec<usize> = batch.into_iter().chain([n_in]).collect();
        for base in [
            DRtrl::default(),
            DRtrl::default().vjp_method(VjpMethod::MultiStep),
        ] {
            fast_vs_generic(
                || leaky(params, &[n_out], op()),
                batch,
                &x_shape,
                base,
                seed,
            );
            fast_vs_generic(
                || leaky2(params, &[n_out], op()),
                batch,
                &x_shape,
                base,
                seed,
            );
        }
    }
}

fn transforms(w: Option<&str>, b: Option<&str>) -> Transforms {
    Transforms {
        weight_fn: w.and_then(ElemFn::builtin),
        bias_fn: b.and_then(ElemFn::builtin),
        ..Transforms::default()
    }
}

#[test]
fn fused_kernels_with_transforms_equal_the_rule_path() {
    // Dense with weight and bias transforms (etp_mm, etp_mv).
    for (w, b) in [
        (Some("tanh"), Some("softplus")),
        (Some("square"), None),
        (None, Some("exp")),
    ] {
        let op = move || -> Op {
            Box::new(move |c, x| matmul(x, &p(c, "W")?, Some(&p(c, "b")?), &transforms(w, b)))
        };
        fast_vs_generic_leaky(&[("W", &[3, 4]), ("b", &[4])], 3, 4, op, 20);
    }
    // etp_elemwise with weight_fn: DiagNet's sigmoid decay.
    for base in [
        DRtrl::default(),
        DRtrl::default().vjp_method(VjpMethod::MultiStep),
    ] {
        fast_vs_generic(|| DiagNet::new(3, 5), Some(2), &[2, 3], base, 21);
    }
}

#[test]
fn fused_sparse_kernels_equal_the_rule_path() {
    // Rows with 0, 1 and several entries; a column without any.
    let s = CsrStructure::from_dense_pattern(5, 4, |r, c| (r + 2 * c) % 3 != 0 && r != 2 && c != 3);
    let nnz = s.nnz();
    for (w, b) in [(None, None), (Some("tanh"), Some("softplus"))] {
        let st = s.clone();
        let op = move || -> Op {
            let st = st.clone();
            Box::new(move |c, x| {
                sparse_matmul(x, &p(c, "w")?, &st, Some(&p(c, "b")?), &transforms(w, b))
            })
        };
        fast_vs_generic_leaky(&[("w", &[nnz]), ("b", &[4])], 5, 4, op, 30);
    }
    // Without a bias.
    let op = move || -> Op {
        let st = s.clone();
        Box::new(move |c, x| sparse_matmul(x, &p(c, "w")?, &st, None, &transforms(None, None)))
    };
    fast_vs_generic_leaky(&[("w", &[nnz])], 5, 4, op, 31);
}

#[test]
fn fused_lora_kernels_equal_the_rule_path() {
    let params: &[(&str, &[usize])] = &[("B", &[3, 2]), ("A", &[2, 4]), ("b", &[4])];
    for (bf, af, cf) in [
        (None, None, None),
        (Some("tanh"), Some("square"), Some("softplus")),
    ] {
        let op = move || -> Op {
            Box::new(move |c, x| {
                let t = Transforms {
                    b_fn: bf.and_then(ElemFn::builtin),
                    a_fn: af.and_then(ElemFn::builtin),
                    bias_fn: cf.and_then(ElemFn::builtin),
                    ..Transforms::default()
                };
                lora_matmul(x, &p(c, "B")?, &p(c, "A")?, 0.5, Some(&p(c, "b")?), &t)
            })
        };
        fast_vs_generic_leaky(params, 3, 4, op, 40);
    }
}

#[test]
fn fused_conv_kernels_equal_the_rule_path() {
    // (x shape without batch, kernel, hidden = y without batch, strides, padding, transforms)
    type Case = (
        Vec<usize>,
        Vec<usize>,
        Vec<usize>,
        Vec<usize>,
        ConvPadding,
        Transforms,
    );
    let cases: Vec<Case> = vec![
        (
            vec![2, 8],
            vec![3, 2, 3],
            vec![3, 6],
            vec![1],
            ConvPadding::Valid,
            transforms(None, None),
        ),
        (
            vec![2, 7],
            vec![4, 2, 3],
            vec![4, 4],
            vec![2],
            ConvPadding::Same,
            transforms(Some("tanh"), Some("softplus")),
        ),
        (
            vec![2, 5, 4],
            vec![3, 2, 2, 2],
            vec![3, 4, 3],
            vec![1, 1],
            ConvPadding::Valid,
            transforms(Some("square"), None),
        ),
    ];
    for (x_shape, k_shape, y_shape, strides, padding, t) in cases {
        let d = strides.len();
        let op = || -> Op {
            let (strides, padding, t) = (strides.clone(), padding.clone(), t.clone());
            Box::new(move |c, x| {
                let cp = ConvParams::default_for(d)
                    .with_strides(&strides)
                    .with_padding(padding.clone());
                conv(x, &p(c, "K")?, Some(&p(c, "b")?), &cp, &t)
            })
        };
        let o = [k_shape[0]];
        let params: &[(&str, &[usize])] = &[("K", &k_shape), ("b", &o)];
        for batch in [2, 1] {
            let xs: Vec<usize> = [&[batch][..], &x_shape].concat();
            for base in [
                DRtrl::default(),
                DRtrl::default().vjp_method(VjpMethod::MultiStep),
            ] {
                fast_vs_generic(|| leaky(params, &y_shape, op()), Some(batch), &xs, base, 50);
                fast_vs_generic(
                    || leaky2(params, &y_shape, op()),
                    Some(batch),
                    &xs,
                    base,
                    51,
                );
            }
        }
    }
}

/// The fused kernels in f32 against f64 (fast paths on in both) over 8 steps.
fn f32_vs_f64<M: Model>(
    make: impl Fn() -> M,
    batch: Option<usize>,
    x_shape: &[usize],
    y_shape: &[usize],
) {
    learn_support::assert_learner_f32_matches_f64(
        make,
        || DRtrl::default().into(),
        batch,
        8,
        (x_shape, y_shape),
        |l| assert!(!l.explain().contains("fused trace kernels: 0 of")),
    );
}

#[test]
fn fused_kernels_in_f32_agree_with_f64() {
    let st = CsrStructure::from_dense_pattern(5, 4, |r, c| (r + c) % 2 == 0);
    let nnz = st.nnz();
    let sparse = move || {
        let st = st.clone();
        let op: Op = Box::new(move |c, x| {
            sparse_matmul(
                x,
                &p(c, "w")?,
                &st,
                Some(&p(c, "b")?),
                &transforms(Some("tanh"), Some("softplus")),
            )
        });
        leaky2(&[("w", &[nnz]), ("b", &[4])], &[4], op)
    };
    f32_vs_f64(&sparse, Some(2), &[2, 5], &[2, 4]);
    f32_vs_f64(&sparse, None, &[5], &[4]);
    let lora = || {
        let op: Op = Box::new(|c, x| {
            let t = Transforms {
                b_fn: ElemFn::builtin("tanh"),
                a_fn: ElemFn::builtin("square"),
                ..Transforms::default()
            };
            lora_matmul(x, &p(c, "B")?, &p(c, "A")?, 0.5, Some(&p(c, "b")?), &t)
        });
        leaky(&[("B", &[5, 2]), ("A", &[2, 4]), ("b", &[4])], &[4], op)
    };
    f32_vs_f64(lora, Some(2), &[2, 5], &[2, 4]);
    let dense = || {
        let op: Op = Box::new(|c, x| {
            matmul(
                x,
                &p(c, "W")?,
                Some(&p(c, "b")?),
                &transforms(Some("tanh"), Some("exp")),
            )
        });
        leaky2(&[("W", &[5, 4]), ("b", &[4])], &[4], op)
    };
    f32_vs_f64(dense, Some(2), &[2, 5], &[2, 4]);
    let conv_net = || {
        let op: Op = Box::new(|c, x| {
            let cp = ConvParams::default_for(1).with_padding(ConvPadding::Same);
            conv(
                x,
                &p(c, "K")?,
                Some(&p(c, "b")?),
                &cp,
                &transforms(Some("tanh"), None),
            )
        });
        leaky2(&[("K", &[3, 2, 3]), ("b", &[3])], &[3, 6], op)
    };
    f32_vs_f64(conv_net, Some(2), &[2, 2, 6], &[2, 3, 6]);
}

#[test]
fn f32_learner_agrees_with_f64() {
    learn_support::assert_learner_f32_matches_f64(
        || GruNet::new(3, 6, 2),
        || DRtrl::default().into(),
        Some(2),
        8,
        (&[2, 3], &[2, 2]),
        |_| {},
    );
}

// ------------------------------------------------------------ the step program across calls

/// `etrace_grad` stages its step program once and reuses it while the loss
/// computes the same thing; a loss that changes what it captures is staged
/// again (a stale program would give the old loss's gradients).
#[test]
fn etrace_grad_reuses_its_step_program_only_for_the_same_loss() {
    let algos: [fn() -> Algorithm; 2] = [
        || PpProp::new(0.9).unwrap().into(),
        || DRtrl::default().into(),
    ];
    for algo in algos {
        let make = || {
            let model = GruNet::new(3, 5, 2);
            let state = ModelState::new(&model, DType::F64, 4, Some(2)).unwrap();
            compile(
                model,
                state,
                algo(),
                &Tensor::zeros(&[2, 3], DType::F64),
                Some(2),
            )
            .unwrap()
        };
        let data = |s: u64| (draw(&[6, 2, 3], s), draw(&[6, 2, 2], s + 100));
        let grads = |g: &braintrace::learn::EtraceGrads| {
            g.grads
                .values()
                .flat_map(|t| t.to_vec_f64().unwrap())
                .collect::<Vec<f64>>()
        };
        // The same loss three times: one trace.
        let mut a = make();
        let mut want = Vec::new();
        for s in 1..=3 {
            let (xs, ys) = data(s);
            want.push(grads(
                &a.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap(),
            ));
        }
        assert_eq!(a.step_traces(), 1);
        // Another computation (times 2, exact in binary) is staged again,
        // and the program reused above gave the bits of a freshly staged one.
        let mut b = make();
        let (xs, ys) = data(1);
        b.etrace_grad(&xs, &ys, mse, Reduction::Mean).unwrap();
        let (xs, ys) = data(2);
        let twice = |o: &Tensor, y: &Tensor| mse(o, y)?.mul_scalar(2.0);
        let got = grads(&b.etrace_grad(&xs, &ys, twice, Reduction::Mean).unwrap());
        assert_eq!(b.step_traces(), 2);
        let doubled: Vec<f64> = want[1].iter().map(|g| 2.0 * g).collect();
        assert_eq!(got, doubled);
        // A loss capturing a weight: 2, then 3 (staged again: 3x the plain
        // gradients, as hidden states and traces do not depend on the loss),
        // then 3 in a fresh tensor (the same computation: reused).
        let mut c = make();
        for (s, w) in [(1u64, 2.0), (2, 3.0), (3, 3.0)] {
            let w = Tensor::scalar_of(w, DType::F64);
            let weighted = |o: &Tensor, y: &Tensor| mse(o, y)?.mul(&w);
            let (xs, ys) = data(s);
            let got = grads(&c.etrace_grad(&xs, &ys, weighted, Reduction::Mean).unwrap());
            let k = w.to_vec_f64().unwrap()[0];
            for (g, p) in got.iter().zip(&want[s as usize - 1]) {
                assert!(
                    (g - k * p).abs() <= 1e-12 * (1.0 + (k * p).abs()),
                    "{g} vs {k} x {p}"
                );
            }
        }
        assert_eq!(c.step_traces(), 2);
    }
}
