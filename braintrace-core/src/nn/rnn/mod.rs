//! braintrace 0.2.6's recurrent cells (`braintrace.nn`), each built from
//! [`Linear`] layers (the ETP matmul) and element-wise ops, so the learning
//! compiler finds their hidden–parameter relations as it does in
//! braintrace. Parameter keys and hidden-state paths are braintrace's
//! (`<path>/Wf/weight/weight`, `<path>/h`, ...), so weights move between the
//! two by key.
//!
//! Every constructor checks its sizes (0 is refused) and returns an
//! [`Error::Invalid`] naming the cell and the value.

mod gated;
mod lru;
mod simple;

pub use gated::{LstmCell, MiniGru, MiniLstm, UrLstmCell};
pub use lru::LruCell;
pub use simple::{CfnCell, MguCell, MinimalRnnCell, VanillaRnnCell};

use super::init::Initializer;
use super::layers::Linear;
use crate::error::{Error, Result};
use crate::learn::join_path;
use crate::tensor::Tensor;

/// A cell's activation function (braintrace's `activation=` argument, by
/// the name `brainstate.nn` gives it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellActivation {
    /// `tanh`
    Tanh,
    /// `relu`
    Relu,
    /// `sigmoid`
    Sigmoid,
    /// `softplus`
    Softplus,
    /// The identity (no activation).
    Identity,
}

impl CellActivation {
    /// Apply it.
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            CellActivation::Tanh => x.tanh(),
            CellActivation::Relu => x.relu(),
            CellActivation::Sigmoid => x.sigmoid(),
            CellActivation::Softplus => x.softplus(),
            CellActivation::Identity => Ok(x.clone()),
        }
    }
    /// By braintrace's name (`"tanh"`, `"relu"`, `"sigmoid"`, `"softplus"`,
    /// `"identity"`).
    pub fn by_name(name: &str) -> Result<Self> {
        Ok(match name {
            "tanh" => CellActivation::Tanh,
            "relu" => CellActivation::Relu,
            "sigmoid" => CellActivation::Sigmoid,
            "softplus" => CellActivation::Softplus,
            "identity" => CellActivation::Identity,
            other => {
                return Err(Error::invalid(
                    "CellActivation::by_name",
                    format!("unknown activation `{other}` (tanh, relu, sigmoid, softplus, identity)"),
                ))
            }
        })
    }
}

/// Refuse a zero size: `<cell>::new: <arg> = 0 ...`.
pub(crate) fn check_sizes(cell: &str, sizes: &[(&str, usize)]) -> Result<()> {
    for &(name, n) in sizes {
        if n == 0 {
            return Err(Error::invalid(
                format!("{cell}::new"),
                format!("`{name}` = 0: a layer size must be positive"),
            ));
        }
    }
    Ok(())
}

/// braintools' `XavierNormal()` for a `(fan_in, fan_out)` weight: normal with
/// variance `2 / (fan_in + fan_out)`. The fans are fixed by the layer, so the
/// initialiser is the plain normal of that deviation.
pub(crate) fn xavier_normal(fan_in: usize, fan_out: usize) -> Initializer {
    Initializer::Normal {
        std: (2.0 / (fan_in + fan_out) as f64).sqrt(),
    }
}

/// A `Linear` sub-layer `<cell>/<name>` of `n_in → n_out` with `init`.
pub(crate) fn sub_linear(
    cell: &str,
    name: &str,
    n_in: usize,
    n_out: usize,
    init: Initializer,
) -> Linear {
    Linear::new(&join_path(cell, name), n_in, n_out).with_init(init)
}
