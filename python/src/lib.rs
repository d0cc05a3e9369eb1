//! `braintrace_rs._native`: the PyO3 layer over the `braintrace` library,
//! imported by the pure-Python package `braintrace_rs` (which adds the
//! `nn` classes with braintrace's names). The library knows nothing of
//! Python: this crate converts arrays (`array`), maps errors in one place
//! (`error`), wraps tensors and ops (`tensor`), models (`model`), learners
//! (`learner`), the algorithms (`algos`), the sequence driver (`driver`),
//! more ETP primitives (`etp_ops`), optimisers (`optim`) and a learner's
//! checkpoints (`checkpoint`).

mod algos;
mod array;
mod blocks;
mod checkpoint;
mod driver;
mod error;
mod etp_ops;
mod learner;
mod model;
mod optim;
mod tensor;
mod zoo;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<model::PyInit>()?;
    m.add_class::<model::PyStepCtx>()?;
    m.add_class::<model::Layer>()?;
    m.add_class::<algos::PyAlgorithm>()?;
    m.add_class::<algos::PyEtraceConfig>()?;
    m.add_class::<learner::PyLearner>()?;
    m.add_class::<optim::PySgd>()?;
    m.add_class::<optim::PyAdam>()?;
    m.add_function(wrap_pyfunction!(tensor::tensor, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::etp_mm, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::etp_elemwise, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::concat, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::stack, m)?)?;
    m.add_function(wrap_pyfunction!(learner::compile, m)?)?;
    m.add_function(wrap_pyfunction!(algos::d_rtrl, m)?)?;
    m.add_function(wrap_pyfunction!(algos::pp_prop, m)?)?;
    m.add_function(wrap_pyfunction!(algos::eprop, m)?)?;
    m.add_function(wrap_pyfunction!(algos::ostl_recurrent, m)?)?;
    m.add_function(wrap_pyfunction!(algos::ostl_feedforward, m)?)?;
    m.add_function(wrap_pyfunction!(algos::three_factor_fn, m)?)?;
    m.add_function(wrap_pyfunction!(algos::snap, m)?)?;
    m.add_function(wrap_pyfunction!(algos::uoro, m)?)?;
    m.add_function(wrap_pyfunction!(algos::random_projection, m)?)?;
    m.add_function(wrap_pyfunction!(etp_ops::etp_sp_mm, m)?)?;
    m.add_function(wrap_pyfunction!(etp_ops::etp_lora_mm, m)?)?;
    m.add_function(wrap_pyfunction!(etp_ops::etp_conv, m)?)?;
    m.add_function(wrap_pyfunction!(etp_ops::spike_bitwise, m)?)?;
    m.add_function(wrap_pyfunction!(learner::_time_update, m)?)?;
    m.add_function(wrap_pyfunction!(learner::_time_etrace_grad, m)?)?;
    m.add_function(wrap_pyfunction!(optim::clip_grad_norm, m)?)?;
    m.add_function(wrap_pyfunction!(optim::save_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(optim::load_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::save_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::restore_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::checkpoint_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::restore_checkpoint_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::load_checkpoint, m)?)?;
    Ok(())
}
