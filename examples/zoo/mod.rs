//! `bench_learn`'s recurrent-cell zoo: braintrace 0.2.6's cells
//! (`braintrace::nn::rnn`) with a `Linear` readout `out`, by name
//! (`mgu`, `lstm`, ...); a name ending in `_ce` trains the readout's logits
//! with softmax cross-entropy on integer labels instead of the MSE.

use braintrace::learn::{Init, Model, StepCtx};
use braintrace::nn::loss::softmax_cross_entropy_with_integer_labels;
use braintrace::nn::Linear;
use braintrace::nn::{
    CfnCell, LruCell, LstmCell, MguCell, MiniGru, MiniLstm, MinimalRnnCell, UrLstmCell,
    VanillaRnnCell,
};
use braintrace::{DType, Result, Tensor};

/// The cells `--model` takes (each also as `<cell>_ce`).
pub const CELLS: [&str; 9] = [
    "vanilla", "mgu", "minimal", "cfn", "lstm", "urlstm", "minigru", "minilstm", "lru",
];

/// Whether `model` is a zoo model (`<cell>` or `<cell>_ce`).
pub fn is_zoo(model: &str) -> bool {
    CELLS.contains(&model.strip_suffix("_ce").unwrap_or(model))
}

/// Whether `model` trains with cross-entropy.
pub fn uses_ce(model: &str) -> bool {
    is_zoo(model) && model.ends_with("_ce")
}

/// Softmax cross-entropy of the logits against the step's labels.
pub fn ce_loss(o: &Tensor, y: &Tensor) -> Result<Tensor> {
    softmax_cross_entropy_with_integer_labels(o, y)
}

/// `t` steps of inputs uniform in [0, 1) and class labels in `[0, n_out)`
/// (f32 whole numbers, `(t, batch)`), from `seed`.
pub fn ce_sequences(
    t: usize,
    batch: usize,
    n_in: usize,
    n_out: usize,
    seed: u64,
) -> Result<(Tensor, Tensor)> {
    let mut rng = braintrace::nn::Rng::seed(seed);
    let xs: Vec<f64> = (0..t * batch * n_in).map(|_| rng.uniform()).collect();
    let ys: Vec<f64> = (0..t * batch).map(|_| rng.below(n_out) as f64).collect();
    Ok((
        Tensor::from_vec(xs, &[t, batch, n_in])?.cast(DType::F32)?,
        Tensor::from_vec(ys, &[t, batch])?.cast(DType::F32)?,
    ))
}

/// The net `model` names (`<cell>` or `<cell>_ce`).
pub fn net(model: &str, n_in: usize, n_rec: usize, n_out: usize) -> Result<ZooNet> {
    ZooNet::new(model, n_in, n_rec, n_out)
}

/// One of the cells.
pub enum Cell {
    Vanilla(VanillaRnnCell),
    Mgu(MguCell),
    Minimal(MinimalRnnCell),
    Cfn(CfnCell),
    Lstm(LstmCell),
    UrLstm(UrLstmCell),
    MiniGru(MiniGru),
    MiniLstm(MiniLstm),
    Lru(LruCell),
}

macro_rules! each {
    ($s:expr, $c:ident => $e:expr) => {
        match $s {
            Cell::Vanilla($c) => $e,
            Cell::Mgu($c) => $e,
            Cell::Minimal($c) => $e,
            Cell::Cfn($c) => $e,
            Cell::Lstm($c) => $e,
            Cell::UrLstm($c) => $e,
            Cell::MiniGru($c) => $e,
            Cell::MiniLstm($c) => $e,
            Cell::Lru($c) => $e,
        }
    };
}

/// A zoo cell `rnn` and its readout `out`.
pub struct ZooNet {
    cell: Cell,
    out: Linear,
}

impl ZooNet {
    /// The net `model` names (`<cell>` or `<cell>_ce`).
    pub fn new(model: &str, n_in: usize, n_rec: usize, n_out: usize) -> Result<Self> {
        let name = model.strip_suffix("_ce").unwrap_or(model);
        let cell = match name {
            "vanilla" => Cell::Vanilla(VanillaRnnCell::new("rnn", n_in, n_rec)?),
            "mgu" => Cell::Mgu(MguCell::new("rnn", n_in, n_rec)?),
            "minimal" => Cell::Minimal(MinimalRnnCell::new("rnn", n_in, n_rec)?),
            "cfn" => Cell::Cfn(CfnCell::new("rnn", n_in, n_rec)?),
            "lstm" => Cell::Lstm(LstmCell::new("rnn", n_in, n_rec)?),
            "urlstm" => Cell::UrLstm(UrLstmCell::new("rnn", n_in, n_rec)?),
            "minigru" => Cell::MiniGru(MiniGru::new("rnn", n_in, n_rec)?),
            "minilstm" => Cell::MiniLstm(MiniLstm::new("rnn", n_in, n_rec)?),
            "lru" => Cell::Lru(LruCell::new("rnn", n_in, n_rec)?),
            other => {
                return Err(braintrace::Error::invalid(
                    "bench_learn",
                    format!("`{other}` is not a zoo cell"),
                ))
            }
        };
        // The LRU's output has the input's width.
        let width = if name == "lru" { n_in } else { n_rec };
        Ok(ZooNet {
            cell,
            out: Linear::new("out", width, n_out),
        })
    }
}

impl Model for ZooNet {
    fn init(&self, init: &mut Init) -> Result<()> {
        each!(&self.cell, c => c.init(init))?;
        self.out.init(init)
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let h = each!(&self.cell, c => c.step(ctx, x))?;
        self.out.step(ctx, &h)
    }
}
