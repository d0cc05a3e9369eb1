//! Saving and loading path-keyed parameters in the `safetensors` format: one
//! tensor per parameter key (`rnn/Wz/weight/weight`), little-endian, with
//! its dtype (`F32`, `F64`, `I64`, `BOOL`) and shape. Files written here open
//! with any safetensors reader (Python's `safetensors.numpy.load_file`).
//!
//! ```
//! use braintrace_core::learn::ModelState;
//! use braintrace_core::nn::{io, GruCell};
//! use braintrace_core::DType;
//!
//! let model = GruCell::new("rnn", 2, 3);
//! let state = ModelState::new(&model, DType::F32, 7, None)?;
//! let bytes = io::params_to_bytes(&state.params())?;
//! let mut other = ModelState::new(&model, DType::F32, 8, None)?;
//! io::load_params_from_bytes(&mut other, &bytes)?;
//! assert_eq!(other.params()["rnn/Wz/weight/weight"].to_vec_f64()?,
//!            state.params()["rnn/Wz/weight/weight"].to_vec_f64()?);
//! # Ok::<(), braintrace_core::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::learn::{ModelState, TensorDict};
use crate::tensor::{ArrayData, Tensor};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

fn tensor_bytes(op: &str, key: &str, t: &Tensor) -> Result<(Dtype, Vec<u8>)> {
    let data = t
        .data_for(op)
        .map_err(|e| Error::invalid(op, format!("`{key}`: {e}")))?;
    Ok(match data {
        ArrayData::F32(a) => (
            Dtype::F32,
            crate::tensor::standard_layout(a)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        ArrayData::F64(a) => (
            Dtype::F64,
            crate::tensor::standard_layout(a)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        ArrayData::I64(a) => (
            Dtype::I64,
            crate::tensor::standard_layout(a)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        ArrayData::Bool(a) => (
            Dtype::BOOL,
            crate::tensor::standard_layout(a)
                .iter()
                .map(|&v| v as u8)
                .collect(),
        ),
    })
}

/// Serialise tensors keyed by path to safetensors bytes.
pub fn params_to_bytes(params: &TensorDict) -> Result<Vec<u8>> {
    to_bytes_with("params_to_bytes", params, None)
}

/// Serialise tensors keyed by path, with a metadata header, naming `op` in
/// errors.
pub(crate) fn to_bytes_with(
    op: &str,
    params: &TensorDict,
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<Vec<u8>> {
    let mut owned = Vec::with_capacity(params.len());
    for (k, t) in params {
        let (dt, bytes) = tensor_bytes(op, k, t)?;
        owned.push((k.as_str(), dt, t.shape().to_vec(), bytes));
    }
    let views = owned
        .iter()
        .map(|(k, dt, shape, bytes)| {
            TensorView::new(*dt, shape.clone(), bytes)
                .map(|v| (*k, v))
                .map_err(|e| Error::safetensors(op, format!("`{k}`"), e))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, metadata).map_err(|e| Error::safetensors(op, "serialising", e))
}

fn read_le<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| f(c.try_into().expect("chunks_exact yields N bytes")))
        .collect()
}

/// Read tensors keyed by path from safetensors bytes (dtypes `F32`, `F64`,
/// `I64`, `BOOL`).
pub fn params_from_bytes(bytes: &[u8]) -> Result<TensorDict> {
    from_bytes_with("params_from_bytes", bytes).map(|(t, _)| t)
}

/// Read tensors keyed by path and the metadata header, naming `op` in errors.
pub(crate) fn from_bytes_with(
    op: &str,
    bytes: &[u8],
) -> Result<(TensorDict, std::collections::HashMap<String, String>)> {
    let (_, meta) = SafeTensors::read_metadata(bytes)
        .map_err(|e| Error::safetensors(op, "not a safetensors buffer", e))?;
    let meta = meta.metadata().clone().unwrap_or_default();
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| Error::safetensors(op, "not a safetensors buffer", e))?;
    let mut out = TensorDict::new();
    for (name, view) in st.tensors() {
        let shape = view.shape().to_vec();
        let data = view.data();
        let t = match view.dtype() {
            Dtype::F32 => Tensor::from_vec_typed(read_le(data, f32::from_le_bytes), &shape),
            Dtype::F64 => Tensor::from_vec_typed(read_le(data, f64::from_le_bytes), &shape),
            Dtype::I64 => Tensor::from_vec_typed(read_le(data, i64::from_le_bytes), &shape),
            Dtype::BOOL => Tensor::from_vec_typed(data.iter().map(|&b| b != 0).collect(), &shape),
            other => {
                return Err(Error::invalid(
                    op,
                    format!("`{name}` has dtype {other:?}; only F32, F64, I64 and BOOL are read"),
                ))
            }
        }
        .map_err(|e| Error::invalid(op, format!("`{name}`: {e}")))?;
        out.insert(name, t);
    }
    Ok((out, meta))
}

/// Write tensors keyed by path to a safetensors file.
pub fn save_safetensors(path: impl AsRef<Path>, params: &TensorDict) -> Result<()> {
    let path = path.as_ref();
    let bytes = params_to_bytes(params)?;
    std::fs::write(path, bytes).map_err(|e| Error::io("save_safetensors", "write", path, e))
}

/// Read tensors keyed by path from a safetensors file.
pub fn load_safetensors(path: impl AsRef<Path>) -> Result<TensorDict> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io("load_safetensors", "read", path, e))?;
    params_from_bytes(&bytes).map_err(|e| in_file("load_safetensors", path, e))
}

/// `e`, raised reading the bytes of the file `path`, as an error of `op`
/// naming the file; a safetensors error keeps its source.
pub(crate) fn in_file(op: &str, path: &Path, e: Error) -> Error {
    match e {
        Error::Safetensors {
            context, source, ..
        } => Error::Safetensors {
            op: op.into(),
            context: format!("{}: {context}", path.display()),
            source,
        },
        e => Error::invalid(op, format!("{}: {}", path.display(), e.root())),
    }
}

/// Save a model state's parameters (not its hidden states) to a file.
pub fn save_params(state: &ModelState, path: impl AsRef<Path>) -> Result<()> {
    save_safetensors(path, &state.params())
}

/// Replace every parameter of `state` with the tensors in `params`: the keys
/// must be exactly the state's parameter keys and the shapes must match
/// (float values are cast to the state's dtype; integer and bool ones, NaN
/// and infinities are refused). Nothing changes on error.
pub fn load_params_into(state: &mut ModelState, params: &TensorDict) -> Result<()> {
    let own = state.params();
    let missing: Vec<&str> = own
        .keys()
        .filter(|k| !params.contains_key(*k))
        .map(String::as_str)
        .collect();
    let extra: Vec<&str> = params
        .keys()
        .filter(|k| !own.contains_key(*k))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() || !extra.is_empty() {
        return Err(Error::invalid(
            "load_params",
            format!(
                "the saved parameters do not match the model: missing [{}], unexpected [{}]",
                missing.join(", "),
                extra.join(", ")
            ),
        ));
    }
    for (k, v) in params {
        crate::learn::float_dtype("load_params", &format!("parameter `{k}`"), v.dtype())?;
    }
    // `set_params` casts to the state's dtype and refuses NaN and
    // infinities, all or nothing.
    state.set_params(params)
}

/// Load a model state's parameters from bytes written by [`params_to_bytes`].
pub fn load_params_from_bytes(state: &mut ModelState, bytes: &[u8]) -> Result<()> {
    load_params_into(state, &params_from_bytes(bytes)?)
}

/// Load a model state's parameters from a file written by [`save_params`].
pub fn load_params(state: &mut ModelState, path: impl AsRef<Path>) -> Result<()> {
    load_params_into(state, &load_safetensors(path)?)
}
