//! The learning layer under bad input (issue 33): sizes of 1e9 and 1e12
//! give `Error::Allocation` (no abort, no swapping), layers and optimisers
//! refuse bad settings when built, the optimisers' non-finite policy, the
//! one dtype rule, and NaN refused by `set_param` and `load_params`. Each
//! test checks the error and that nothing changed.

use braintrace::error::Shape;
use braintrace::learn::{float_dtype, ModelState, NonFinite, TensorDict};
use braintrace::nn::{
    io, Adam, Chain, ElementWiseParam, ExpSynapse, GruCell, LeakyRateReadout, LifCell, Linear,
    Optimizer, Sgd,
};
use braintrace::{DType, Error, Result, Tensor};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A named way to build a model state that must fail, and what its error
/// must mention.
type Case = (
    &'static str,
    Box<dyn Fn() -> Result<ModelState>>,
    &'static [&'static str],
);

const G: usize = 1_000_000_000; // 1e9
const T: usize = 1_000_000_000_000; // 1e12

/// `f`'s error; a panic or `Ok` fails the test with `what`.
#[track_caller]
fn err_of<V>(what: &str, f: impl FnOnce() -> Result<V>) -> Error {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(_)) => panic!("{what}: expected an error, got Ok"),
        Ok(Err(e)) => e,
        Err(_) => panic!("{what}: panicked instead of returning an error"),
    }
}

#[track_caller]
fn assert_msg(e: &Error, needles: &[&str]) {
    let m = e.to_string();
    for n in needles {
        assert!(m.contains(n), "`{m}` does not mention `{n}`");
    }
}

fn bits(d: &TensorDict) -> Vec<(String, Vec<u64>)> {
    d.iter()
        .map(|(k, t)| {
            let v = t
                .to_vec_f64()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (k.clone(), v)
        })
        .collect()
}

// ---- sizes ---------------------------------------------------------------

#[test]
fn tensor_constructors_refuse_what_memory_cannot_hold() {
    let big = [1_000_000, 1_000_000]; // 4e12 bytes of f32
    for (what, e) in [
        (
            "try_zeros",
            err_of("zeros", || Tensor::try_zeros("t", &big, DType::F32)),
        ),
        (
            "try_ones",
            err_of("ones", || Tensor::try_ones("t", &big, DType::F32)),
        ),
        (
            "try_full",
            err_of("full", || Tensor::try_full("t", &big, 2.0, DType::F64)),
        ),
    ] {
        assert!(matches!(e, Error::Allocation { .. }), "{what}: {e}");
        assert_msg(
            &e,
            &["[1000000, 1000000]", "1000000000000 elements", "bytes"],
        );
    }
    // A byte count past isize::MAX, and a shape no array can have.
    let e = err_of("overflow", || {
        Tensor::try_zeros("t", &[T, 2_000_000], DType::F64)
    });
    assert!(matches!(e, Error::Allocation { .. }), "{e}");
    assert_msg(&e, &["more than isize::MAX bytes"]);
    let e = err_of("shape", || Tensor::try_ones("t", &[T, T, T], DType::F32));
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // The infallible constructors panic (catchable, naming the shape)
    // instead of aborting the process.
    for f in [
        (|| drop(Tensor::zeros(&[1_000_000, 1_000_000], DType::F32))) as fn(),
        || drop(Tensor::ones(&[1_000_000, 1_000_000], DType::F32)),
        || drop(Tensor::full(&[G, G], 1.0, DType::F32)),
    ] {
        let p = catch_unwind(f).expect_err("must panic");
        let m = p.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(m.contains("cannot allocate") && m.contains("try_"), "{m}");
    }
    // What fits is made.
    assert_eq!(
        Tensor::try_full("t", &[2, 2], 3.0, DType::F32)
            .unwrap()
            .to_vec_f64()
            .unwrap(),
        vec![3.0; 4]
    );
}

#[test]
fn layers_of_1e9_units_give_allocation_errors_naming_the_layer() {
    let cases: Vec<Case> = vec![
        (
            "Linear 1e9 inputs",
            Box::new(|| ModelState::new(&Linear::new("lin", G, 16), DType::F32, 0, None)),
            &["Linear `lin`: weight", "[1000000000, 16]"],
        ),
        (
            "GruCell hidden 1e9",
            Box::new(|| ModelState::new(&GruCell::new("rnn", 3, G), DType::F32, 0, Some(1))),
            &["Linear `rnn/Wz`: weight", "[1000000003, 1000000000]"],
        ),
        (
            "LifCell 1e9 neurons",
            Box::new(|| {
                let m = LifCell::new("lif", 2, G, 0.9, 0.8, 1.0);
                ModelState::new(&m, DType::F32, 0, Some(1))
            }),
            &["Linear `lif/rec`: weight"],
        ),
        (
            "LeakyRateReadout 1e9 inputs",
            Box::new(|| {
                let m = LeakyRateReadout::new("ro", G, 10, 5.0, 1.0);
                ModelState::new(&m, DType::F64, 0, None)
            }),
            &["LeakyRateReadout `ro`: W"],
        ),
        (
            "ElementWiseParam 1e9 x 1e9",
            Box::new(|| {
                let m = ElementWiseParam::new("p", &[G, G], None);
                ModelState::new(&m, DType::F32, 0, None)
            }),
            &["ElementWiseParam `p`: weight"],
        ),
        (
            "ExpSynapse 1e9 units, batch 1e3",
            Box::new(|| {
                ModelState::new(
                    &ExpSynapse::new("syn", G, 5.0, 1.0),
                    DType::F32,
                    0,
                    Some(1000),
                )
            }),
            &["hidden state `syn/g`", "[1000, 1000000000]"],
        ),
        (
            "GRU hidden 8, batch 1e12",
            Box::new(|| ModelState::new(&GruCell::new("rnn", 3, 8), DType::F32, 0, Some(T))),
            &[
                "hidden state `rnn/h`",
                "[1000000000000, 8]",
                "more than this machine's memory",
            ],
        ),
    ];
    for (what, f, needles) in cases {
        let e = err_of(what, f);
        assert!(matches!(e, Error::Allocation { .. }), "{what}: {e}");
        assert_msg(&e, needles);
    }
    // 1e9 units at a batch of 1e12: more elements than any array can have
    // (a shape error naming the state, as for every such shape).
    let e = err_of("1e21 elements", || {
        ModelState::new(&ExpSynapse::new("syn", G, 5.0, 1.0), DType::F32, 0, Some(T))
    });
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    assert_msg(
        &e,
        &[
            "hidden state `syn/g`",
            "[1000000000000, 1000000000]",
            "too large",
        ],
    );
}

#[test]
fn a_batch_of_1e12_is_refused_and_the_state_keeps_its_batch() {
    let model = GruCell::new("rnn", 3, 4);
    let mut s = ModelState::new(&model, DType::F64, 0, Some(2)).unwrap();
    s.advance(&model, &Tensor::ones(&[2, 3], DType::F64))
        .unwrap();
    let before = bits(&s.hidden());
    let e = err_of("reset", || s.reset_hidden(Some(T)));
    assert!(matches!(e, Error::Allocation { .. }), "{e}");
    assert_eq!(s.batch(), Some(2));
    assert_eq!(bits(&s.hidden()), before);
}

// ---- layer settings --------------------------------------------------------

#[test]
fn layers_refuse_bad_sizes_and_decays_naming_layer_and_value() {
    let cases: Vec<Case> = vec![
        (
            "Linear n_in 0",
            Box::new(|| ModelState::new(&Linear::new("lin", 0, 2), DType::F32, 0, None)),
            &["Linear `lin`", "n_in must be at least 1, got 0"],
        ),
        (
            "Linear n_out 0",
            Box::new(|| ModelState::new(&Linear::new("lin", 2, 0), DType::F32, 0, None)),
            &["Linear `lin`", "n_out"],
        ),
        (
            "GRU hidden 0",
            Box::new(|| ModelState::new(&GruCell::new("rnn", 3, 0), DType::F32, 0, Some(1))),
            &["GruCell `rnn`", "n_rec must be at least 1"],
        ),
        (
            "LIF 0 neurons",
            Box::new(|| {
                ModelState::new(
                    &LifCell::new("lif", 3, 0, 0.9, 0.8, 1.0),
                    DType::F32,
                    0,
                    None,
                )
            }),
            &["LifCell `lif`", "n_rec"],
        ),
        (
            "LIF beta 1.5",
            Box::new(|| {
                ModelState::new(
                    &LifCell::new("lif", 3, 4, 1.5, 0.8, 1.0),
                    DType::F32,
                    0,
                    None,
                )
            }),
            &["LifCell `lif`", "beta", "1.5"],
        ),
        (
            "LIF gamma NaN",
            Box::new(|| {
                ModelState::new(
                    &LifCell::new("lif", 3, 4, 0.9, f64::NAN, 1.0),
                    DType::F32,
                    0,
                    None,
                )
            }),
            &["LifCell `lif`", "gamma", "NaN"],
        ),
        (
            "LIF v_th inf",
            Box::new(|| {
                ModelState::new(
                    &LifCell::new("lif", 3, 4, 0.9, 0.8, f64::INFINITY),
                    DType::F32,
                    0,
                    None,
                )
            }),
            &["LifCell `lif`", "v_th", "inf"],
        ),
        (
            "readout tau -5",
            Box::new(|| {
                ModelState::new(
                    &LeakyRateReadout::new("ro", 3, 2, -5.0, 1.0),
                    DType::F32,
                    0,
                    None,
                )
            }),
            &["LeakyRateReadout `ro`", "decay", "(0, 1)", "1.22"],
        ),
        (
            "readout tau 0",
            Box::new(|| {
                ModelState::new(
                    &LeakyRateReadout::new("ro", 3, 2, 0.0, 1.0),
                    DType::F32,
                    0,
                    None,
                )
            }),
            &["LeakyRateReadout `ro`", "got 0"],
        ),
        (
            "readout dt NaN",
            Box::new(|| {
                ModelState::new(
                    &LeakyRateReadout::new("ro", 3, 2, 5.0, f64::NAN),
                    DType::F32,
                    0,
                    None,
                )
            }),
            &["LeakyRateReadout `ro`", "NaN"],
        ),
        (
            "synapse tau -1",
            Box::new(|| {
                ModelState::new(&ExpSynapse::new("syn", 3, -1.0, 1.0), DType::F32, 0, None)
            }),
            &["ExpSynapse `syn`", "decay"],
        ),
        (
            "synapse 0 units",
            Box::new(|| ModelState::new(&ExpSynapse::new("syn", 0, 5.0, 1.0), DType::F32, 0, None)),
            &["ExpSynapse `syn`", "n must be at least 1"],
        ),
        (
            "param dim 0",
            Box::new(|| {
                ModelState::new(
                    &ElementWiseParam::new("p", &[3, 0], None),
                    DType::F32,
                    0,
                    None,
                )
            }),
            &["ElementWiseParam `p`", "dimension 1 of [3, 0]"],
        ),
        (
            "chained",
            Box::new(|| {
                ModelState::new(
                    &Chain::new(GruCell::new("rnn", 3, 4), Linear::new("out", 4, 0)),
                    DType::F32,
                    0,
                    None,
                )
            }),
            &["Linear `out`", "n_out"],
        ),
    ];
    for (what, f, needles) in cases {
        let e = err_of(what, f);
        assert!(matches!(e, Error::Invalid { .. }), "{what}: {e}");
        assert_msg(&e, needles);
    }
    // The edges that are models: β = 1 (no leak), γ = 0.
    ModelState::new(
        &LifCell::new("lif", 3, 4, 1.0, 0.0, 1.0),
        DType::F32,
        0,
        None,
    )
    .unwrap();
}

// ---- optimisers: non-finite gradients ---------------------------------------

fn problem() -> (ModelState, TensorDict) {
    let model = Linear::new("lin", 3, 2);
    let state = ModelState::new(&model, DType::F32, 1, None).unwrap();
    let grads: TensorDict = state
        .params()
        .into_iter()
        .map(|(k, v)| (k, v.ones_like()))
        .collect();
    (state, grads)
}

fn poisoned(grads: &TensorDict, value: f64) -> TensorDict {
    let mut g = grads.clone();
    let mut w = vec![1.0; 6];
    w[4] = value; // index [2, 0] of the (3, 2) weight
    g.insert(
        "lin/weight/weight".into(),
        Tensor::from_vec(w, &[3, 2])
            .unwrap()
            .cast(DType::F32)
            .unwrap(),
    );
    g
}

#[test]
fn a_non_finite_gradient_is_an_error_naming_key_and_index_and_changes_nothing() {
    let (mut state, grads) = problem();
    let mut opts: Vec<(&str, Box<dyn Optimizer>)> = vec![
        (
            "Sgd",
            Box::new(Sgd::new(0.1).unwrap().momentum(0.9).unwrap()),
        ),
        ("Adam", Box::new(Adam::new(0.1).unwrap())),
    ];
    for (name, opt) in opts.iter_mut() {
        opt.step(&mut state, &grads).unwrap(); // some state to keep
        let (p0, s0) = (bits(&state.params()), bits(&opt.state().tensors));
        let c0 = opt.state().counters;
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = err_of(name, || opt.step(&mut state, &poisoned(&grads, bad)));
            match &e {
                Error::NonFinite {
                    op,
                    key,
                    index,
                    value,
                    ..
                } => {
                    assert_eq!(op, name);
                    assert_eq!(key, "lin/weight/weight");
                    assert_eq!(index, &vec![2, 0]);
                    assert!(value.to_bits() == bad.to_bits() || (value.is_nan() && bad.is_nan()));
                }
                other => panic!("{name}: {other}"),
            }
            assert_msg(&e, &[name, "gradient `lin/weight/weight`", "index [2, 0]"]);
            assert_eq!(bits(&state.params()), p0, "{name}: parameters changed");
            assert_eq!(bits(&opt.state().tensors), s0, "{name}: state changed");
            assert_eq!(opt.state().counters, c0, "{name}: counters changed");
        }
    }
}

#[test]
fn skip_drops_the_update_and_counts_it_allow_applies_it() {
    let (mut state, grads) = problem();
    let mut adam = Adam::new(0.1).unwrap().non_finite(NonFinite::Skip);
    let p0 = bits(&state.params());
    adam.step(&mut state, &poisoned(&grads, f64::NAN)).unwrap();
    assert_eq!(bits(&state.params()), p0);
    assert_eq!(adam.skipped(), 1);
    assert_eq!(adam.steps("lin/weight/weight"), 0);
    // The next finite update is the first one.
    let mut plain = Adam::new(0.1).unwrap();
    let mut s2 = state.clone();
    adam.step(&mut state, &grads).unwrap();
    plain.step(&mut s2, &grads).unwrap();
    assert_eq!(bits(&state.params()), bits(&s2.params()));

    let mut sgd = Sgd::new(0.1).unwrap().non_finite(NonFinite::Skip);
    sgd.step(&mut state, &poisoned(&grads, f64::INFINITY))
        .unwrap();
    assert_eq!(sgd.skipped(), 1);

    // Allow: the old behaviour, NaN written into the parameter (and then
    // refused by set_param, which holds parameters finite).
    let mut allow = Sgd::new(0.1).unwrap().non_finite(NonFinite::Allow);
    let new = allow
        .update(&state.params(), &poisoned(&grads, f64::NAN))
        .unwrap();
    assert!(new["lin/weight/weight"].to_vec_f64().unwrap()[4].is_nan());
    let e = err_of("set_params", || state.set_params(&new));
    assert!(matches!(e, Error::NonFinite { .. }), "{e}");
}

/// A dtype error carries the dtypes typed: the argument, the dtypes it may
/// have and the one it has.
#[test]
fn dtype_errors_carry_typed_dtypes() {
    let (state, grads) = problem();
    let mut g = grads.clone();
    g.insert(
        "lin/weight/bias".into(),
        Tensor::from_vec_typed(vec![1i64, 2], &[2]).unwrap(),
    );
    let e = err_of("Adam", || Adam::new(0.1)?.update(&state.params(), &g));
    match &e {
        Error::DType {
            op,
            arg,
            expected,
            got,
            ..
        } => {
            assert_eq!(op, "Adam");
            assert_eq!(arg, "gradient `lin/weight/bias`");
            assert_eq!(expected, &[DType::F32, DType::F64]);
            assert_eq!(*got, DType::I64);
        }
        other => panic!("expected Error::DType, got {other:?}"),
    }
    // Two operands that must agree: the rhs is named, expected to be the
    // lhs's dtype, and both shapes are in the message.
    let a = Tensor::zeros(&[2, 3], DType::F64);
    let b = Tensor::zeros(&[2, 3], DType::F32);
    let e = err_of("add", || a.add(&b));
    assert!(
        matches!(&e, Error::DType { arg, expected, got: DType::F32, .. }
            if arg == "rhs" && expected == &[DType::F64]),
        "{e:?}"
    );
    assert!(e.to_string().contains("[2, 3]"), "{e}");
    // An integer operand of a float-only op.
    let i = Tensor::zeros(&[3], DType::I64);
    let e = err_of("exp", || i.exp());
    assert!(
        matches!(&e, Error::DType { expected, got: DType::I64, .. } if expected == &DType::FLOATS),
        "{e:?}"
    );
}

/// The shape errors of the optimisers, the learner and the loaders carry
/// the operands' shapes typed, in the order the message names them.
#[test]
fn shape_errors_carry_the_operand_shapes() {
    let (state, grads) = problem();
    let mut g = grads.clone();
    g.insert("lin/weight/bias".into(), Tensor::zeros(&[3], DType::F32));
    let e = err_of("Adam", || Adam::new(0.1)?.update(&state.params(), &g));
    match &e {
        Error::Shape { op, shapes, reason } => {
            assert_eq!(op, "Adam");
            assert_eq!(shapes, &[Shape(vec![2]), Shape(vec![3])]);
            assert!(reason.contains("lin/weight/bias"), "{reason}");
        }
        other => panic!("expected Error::Shape, got {other:?}"),
    }
    assert_eq!(
        e.to_string(),
        "Adam: incompatible shapes [2] and [3]: the gradient of `lin/weight/bias` (second) must have its parameter's shape (first)"
    );
}

/// io and safetensors errors keep the error they come from as their
/// `source()`, typed.
#[test]
fn file_errors_keep_their_source() {
    use std::error::Error as _;
    let dir = std::env::temp_dir().join(format!("bt-robustness-src-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.safetensors");
    let e = err_of("load", || braintrace::nn::io::load_safetensors(&missing));
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("missing.safetensors"), "{e}");
    let io = e
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .expect("the io error is the source");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);

    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, b"not a safetensors file").unwrap();
    let e = err_of("load", || braintrace::nn::io::load_safetensors(&garbage));
    assert!(matches!(e, Error::Safetensors { .. }), "{e:?}");
    assert!(e.to_string().contains("garbage.safetensors"), "{e}");
    let st = e
        .source()
        .and_then(|s| s.downcast_ref::<braintrace::error::SafeTensorError>())
        .expect("the safetensors error is the source");
    assert!(e.to_string().ends_with(&st.to_string()), "{e} / {st}");

    let e = err_of("bytes", || {
        braintrace::nn::io::params_from_bytes(&[1, 2, 3])
    });
    assert!(
        e.source()
            .is_some_and(|s| s.is::<braintrace::error::SafeTensorError>()),
        "{e:?}"
    );
    // Saving into a folder that does not exist: the io error, typed.
    let e = err_of("save", || {
        braintrace::nn::io::save_safetensors(dir.join("no/such/dir.st"), &grads_of_problem())
    });
    assert!(
        e.source().is_some_and(|s| s.is::<std::io::Error>()),
        "{e:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

fn grads_of_problem() -> TensorDict {
    problem().1
}

#[test]
fn integer_gradients_are_refused_with_the_dtype_rule() {
    let (state, grads) = problem();
    let mut g = grads.clone();
    g.insert(
        "lin/weight/bias".into(),
        Tensor::from_vec_typed(vec![1i64, 2], &[2]).unwrap(),
    );
    let mut adam = Adam::new(0.1).unwrap();
    let e = err_of("Adam", || adam.update(&state.params(), &g));
    assert_eq!(
        e.to_string(),
        "Adam: dtype mismatch: gradient `lin/weight/bias` is i64, expected f32 or f64 (a float tensor: cast to the model's dtype)"
    );
    assert_eq!(adam.steps("lin/weight/weight"), 0);
}

// ---- parameters and the dtype rule -----------------------------------------

#[test]
fn set_param_set_hidden_and_load_params_refuse_nan_and_inf() {
    let model = Chain::new(GruCell::new("rnn", 3, 4), Linear::new("out", 4, 2));
    let mut state = ModelState::new(&model, DType::F32, 1, Some(2)).unwrap();
    let (p0, h0) = (bits(&state.params()), bits(&state.hidden()));
    let mut w = vec![0.0; 8];
    w[5] = f64::NAN;
    let bad = Tensor::from_vec(w, &[4, 2]).unwrap();
    let e = err_of("set_param", || state.set_param("out/weight/weight", &bad));
    assert_msg(
        &e,
        &[
            "ModelState::set_param",
            "parameter `out/weight/weight`",
            "NaN",
            "[2, 1]",
        ],
    );
    let hbad = Tensor::full(&[2, 4], f64::INFINITY, DType::F64);
    let e = err_of("set_hidden", || state.set_hidden("rnn/h", &hbad));
    assert_msg(
        &e,
        &["ModelState::set_hidden", "hidden state `rnn/h`", "inf"],
    );

    let mut params = state.params();
    params.insert("out/weight/weight".into(), bad.clone());
    let bytes = io::params_to_bytes(&params).unwrap();
    let e = err_of("load_params", || {
        io::load_params_from_bytes(&mut state, &bytes)
    });
    assert_msg(&e, &["out/weight/weight", "NaN"]);
    assert_eq!(bits(&state.params()), p0);
    assert_eq!(bits(&state.hidden()), h0);

    // Integer values: the dtype rule.
    let ints = Tensor::from_vec_typed(vec![1i64; 8], &[4, 2]).unwrap();
    let e = err_of("set_param i64", || {
        state.set_param("out/weight/weight", &ints)
    });
    assert_eq!(
        e,
        float_dtype(
            "ModelState::set_param",
            "parameter `out/weight/weight`",
            DType::I64
        )
        .unwrap_err()
    );
    let mut params = state.params();
    params.insert("out/weight/weight".into(), ints);
    let e = err_of("load_params i64", || {
        io::load_params_into(&mut state, &params)
    });
    assert_eq!(
        e,
        float_dtype("load_params", "parameter `out/weight/weight`", DType::I64).unwrap_err()
    );
    assert_eq!(bits(&state.params()), p0);
}

#[test]
fn advance_casts_float_input_and_refuses_integer_and_bool() {
    let model = GruCell::new("rnn", 3, 4);
    let mut a = ModelState::new(&model, DType::F32, 1, Some(2)).unwrap();
    let mut b = a.clone();
    let x64 = Tensor::from_vec(vec![0.5, -1.0, 2.0, 0.25, 0.0, 1.5], &[2, 3]).unwrap();
    // f64 input on an f32 model: cast, the same bits as f32 input.
    let ya = a.advance(&model, &x64).unwrap();
    let yb = b.advance(&model, &x64.cast(DType::F32).unwrap()).unwrap();
    assert_eq!(ya.dtype(), DType::F32);
    assert_eq!(ya.to_vec_f64().unwrap(), yb.to_vec_f64().unwrap());
    let h0 = bits(&a.hidden());
    for x in [
        Tensor::from_vec_typed(vec![1i64; 6], &[2, 3]).unwrap(),
        Tensor::from_vec_typed(vec![true; 6], &[2, 3]).unwrap(),
    ] {
        let dt = x.dtype();
        let e = err_of("advance", || a.advance(&model, &x));
        assert_eq!(
            e,
            float_dtype("ModelState::step", "input `x`", dt).unwrap_err()
        );
        assert_eq!(bits(&a.hidden()), h0);
    }
}
