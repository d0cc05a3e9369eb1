//! The zoo's golden models (`scripts/golden_gen/generate_zoo_rnn.py`): a
//! braintrace cell `rnn` and a `Linear` readout `out`, by the case's
//! `model` name `zoo_<cell>`.

use super::e2e::check_model;
use braintrace::learn::Algorithm;
use braintrace::nn::Linear;
use braintrace::nn::{
    CfnCell, Chain, LruCell, LstmCell, MguCell, MiniGru, MiniLstm, MinimalRnnCell, UrLstmCell,
    VanillaRnnCell,
};
use serde_json::{Map, Value};

/// The cells of the zoo cases (the `<cell>` of `zoo_<cell>`).
pub const CELLS: &[&str] = &[
    "vanilla", "mgu", "minimal", "cfn", "lstm", "urlstm", "minigru", "minilstm", "lru",
];

/// Whether `model` names a zoo case.
pub fn is_zoo(model: &str) -> bool {
    model
        .strip_prefix("zoo_")
        .is_some_and(|c| CELLS.contains(&c))
}

/// Build the case's model and check it (`check_model` of the e2e checker).
#[allow(clippy::too_many_arguments)]
pub fn check(
    model: &str,
    (n_in, n_rec, n_out): (usize, usize, usize),
    o: &Map<String, Value>,
    algo: Algorithm,
    b: usize,
    fails: &mut Vec<String>,
) -> Result<(), String> {
    let e = |e: braintrace::Error| e.to_string();
    let out = |k: usize| Linear::new("out", k, n_out);
    macro_rules! run {
        ($cell:expr, $k:expr) => {
            check_model(Chain::new($cell.map_err(e)?, out($k)), o, algo, b, fails)
        };
    }
    match model.strip_prefix("zoo_").unwrap_or(model) {
        "vanilla" => run!(VanillaRnnCell::new("rnn", n_in, n_rec), n_rec),
        "mgu" => run!(MguCell::new("rnn", n_in, n_rec), n_rec),
        "minimal" => run!(MinimalRnnCell::new("rnn", n_in, n_rec), n_rec),
        "cfn" => run!(CfnCell::new("rnn", n_in, n_rec), n_rec),
        "lstm" => run!(LstmCell::new("rnn", n_in, n_rec), n_rec),
        "urlstm" => run!(UrLstmCell::new("rnn", n_in, n_rec), n_rec),
        "minigru" => run!(MiniGru::new("rnn", n_in, n_rec), n_rec),
        "minilstm" => run!(MiniLstm::new("rnn", n_in, n_rec), n_rec),
        // The LRU's output has the input's width.
        "lru" => run!(LruCell::new("rnn", n_in, n_rec), n_in),
        other => Err(format!("unknown zoo model `{other}`")),
    }
}
