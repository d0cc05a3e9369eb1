//! The recurrent-cell zoo (`nn::rnn`) and brainpy.state's spiking neurons,
//! synapses and short-term plasticity (`nn::snn`) as native layers, built
//! by kind: `Layer.rnn_cell(kind, ...)` and `Layer.spiking(kind, ...)`,
//! wrapped with braintrace's class names in `braintrace_rs.nn`.

use crate::error::IntoPyResult;
use crate::model::{layer, Layer};
use braintrace_core::nn::{
    Alif, Alpha, CfnCell, DualExpon, Expon, If, Lif, LruCell, LstmCell, MguCell, MiniGru, MiniLstm,
    MinimalRnnCell, Std, Stp, UrLstmCell, VanillaRnnCell,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The recurrent cells by braintrace's class name.
pub const RNN_CELLS: [&str; 9] = [
    "VanillaRNNCell",
    "MGUCell",
    "LSTMCell",
    "URLSTMCell",
    "MinimalRNNCell",
    "MiniGRU",
    "MiniLSTM",
    "CFNCell",
    "LRUCell",
];

/// A recurrent cell of the zoo: `kind` one of [`RNN_CELLS`]; `in_size`
/// inputs, `out_size` units (`LRUCell`: `in_size` is `d_model`, the output
/// width, and `out_size` the complex hidden width).
pub fn rnn_cell(kind: &str, in_size: usize, out_size: usize, name: &str) -> PyResult<Layer> {
    let (i, o) = (in_size, out_size);
    Ok(match kind {
        "VanillaRNNCell" => layer(VanillaRnnCell::new(name, i, o).py()?, "VanillaRNNCell"),
        "MGUCell" => layer(MguCell::new(name, i, o).py()?, "MGUCell"),
        "LSTMCell" => layer(LstmCell::new(name, i, o).py()?, "LSTMCell"),
        "URLSTMCell" => layer(UrLstmCell::new(name, i, o).py()?, "URLSTMCell"),
        "MinimalRNNCell" => layer(MinimalRnnCell::new(name, i, o).py()?, "MinimalRNNCell"),
        "MiniGRU" => layer(MiniGru::new(name, i, o).py()?, "MiniGRU"),
        "MiniLSTM" => layer(MiniLstm::new(name, i, o).py()?, "MiniLSTM"),
        "CFNCell" => layer(CfnCell::new(name, i, o).py()?, "CFNCell"),
        "LRUCell" => layer(LruCell::new(name, i, o).py()?, "LRUCell"),
        other => {
            return Err(PyValueError::new_err(format!(
                "`kind`: unknown recurrent cell {other:?}; one of {RNN_CELLS:?}"
            )))
        }
    })
}

/// The spiking layers by kind.
pub const SPIKING: [&str; 8] = [
    "IF",
    "LIFNeuron",
    "ALIF",
    "Expon",
    "Alpha",
    "DualExpon",
    "STD",
    "STP",
];

/// A spiking layer of `size` units: `kind` one of [`SPIKING`]; `tau`
/// (membrane, synaptic or recovery time constant, by kind), `tau2` (ALIF's
/// adaptation, DualExpon's rise, STP's depression), `u` (STD's and STP's
/// use), `dt` the time step.
#[allow(clippy::too_many_arguments)]
pub fn spiking(
    kind: &str,
    size: usize,
    name: &str,
    tau: f64,
    tau2: f64,
    u: f64,
    dt: f64,
) -> PyResult<Layer> {
    Ok(match kind {
        "IF" => layer(If::new(name, size, tau, dt).py()?, "IF"),
        "LIFNeuron" => layer(Lif::new(name, size, tau, dt).py()?, "LIFNeuron"),
        "ALIF" => layer(Alif::new(name, size, tau, tau2, dt).py()?, "ALIF"),
        "Expon" => layer(Expon::new(name, size, tau, dt).py()?, "Expon"),
        "Alpha" => layer(Alpha::new(name, size, tau, dt).py()?, "Alpha"),
        "DualExpon" => layer(DualExpon::new(name, size, tau, tau2, dt).py()?, "DualExpon"),
        "STD" => layer(Std::new(name, size, tau, u, dt).py()?, "STD"),
        "STP" => layer(Stp::new(name, size, u, tau, tau2, dt).py()?, "STP"),
        other => {
            return Err(PyValueError::new_err(format!(
                "`kind`: unknown spiking layer {other:?}; one of {SPIKING:?}"
            )))
        }
    })
}
