//! `compile` explains two common mistakes in the user's terms: an example
//! input of the wrong width (the error names the layer and the features it
//! expects, not the shapes of a matmul inside it) and a step that never
//! writes a hidden state it declares.

mod learn_support;

use braintrace::learn::{compile, DRtrl, Init, Model, ModelState, StepCtx};
use braintrace::nn::{Chain, GruCell, LifCell, Linear};
use braintrace::prelude::*;

fn compile_err<M: Model>(model: M, x0: &[usize]) -> String {
    let state = ModelState::new(&model, DType::F64, 0, Some(x0[0])).unwrap();
    let x = Tensor::zeros(x0, DType::F64);
    match compile(model, state, DRtrl::default(), &x, Some(x0[0])) {
        Ok(_) => panic!("compile accepted an example input of shape {x0:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "`{msg}` does not mention `{p}`");
    }
}

#[test]
fn wrong_input_width_names_the_layer_and_its_features() {
    let gru = Chain::new(GruCell::new("rnn", 3, 5), Linear::new("out", 5, 2));
    let msg = compile_err(gru, &[4, 7]);
    assert_mentions(&msg, &["GruCell `rnn`", "3 features", "[4, 7]"]);
    assert!(!msg.contains("matmul"), "{msg}");

    let lif = Chain::new(
        LifCell::new("lif", 2, 6, 0.9, 0.8, 1.0),
        Linear::new("out", 6, 2),
    );
    assert_mentions(
        &compile_err(lif, &[3, 5]),
        &["LifCell `lif`", "2 features", "[3, 5]"],
    );

    // A readout fed by the wrong layer size: the readout is named.
    let net = Chain::new(GruCell::new("rnn", 3, 5), Linear::new("out", 4, 2));
    assert_mentions(
        &compile_err(net, &[4, 3]),
        &["Linear `out`", "4 features", "[4, 5]"],
    );
}

/// Declares `h` and `c`, writes only `h`.
struct Forgetful {
    rec: Linear,
}

impl Model for Forgetful {
    fn init(&self, init: &mut Init) -> Result<()> {
        self.rec.init(init)?;
        init.hidden("h", &[4])?;
        init.hidden("c", &[4])
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let c = ctx.hidden("c")?;
        let y = self.rec.step(ctx, x)?.add(&c)?;
        // `ctx.set_hidden("c", ..)` and `("h", ..)` forgotten.
        Ok(y)
    }
}

#[test]
fn a_hidden_state_never_written_is_named() {
    let msg = compile_err(
        Forgetful {
            rec: Linear::new("rec", 3, 4),
        },
        &[2, 3],
    );
    assert_mentions(&msg, &["never writes", "`h`", "`c`", "set_hidden"]);
}
