//! Weights from braintrace: a file of a braintrace 0.2.6 model's parameters
//! (written by `scripts/export_braintrace_weights.py`) read into the Rust
//! model of the same layers.
//!
//! The file is safetensors, one tensor per parameter leaf, keyed by the
//! braintrace state's path in its model (`brainstate.graph.treefy_states`,
//! flattened, joined by `/`) and, for a dict-valued state, the leaf's name:
//! `rnn/Wz/weight/weight`, `rnn/Wz/weight/bias`, `readout/W`,
//! `layers/0/weight/weight` (a `Sequential`'s index). `braintrace::nn`'s
//! layers declare their parameters under the same keys and in the same
//! layouts (`Linear`'s weight is `(in, out)` as braintrace's; the recurrent
//! cells' sub-layers, the LRU's `nu_log`/`theta_log`/`gamma_log`/`D`, the
//! URLSTM's `bias`, `LeakyRateReadout`'s `W` are braintrace's), so a model
//! whose layer paths are the braintrace attribute names loads as is. A
//! [`KeyMap`] renames path prefixes (braintrace's `layers/0` to a Rust
//! layer `fc0`), skips parts of the file, and permutes or reshapes a
//! parameter whose layout differs in a model of one's own.
//!
//! Every check is made before anything changes: a parameter of the model
//! that the file lacks, a key of the file that the model does not have, a
//! shape that does not fit (after the layout), a non-float tensor, a NaN:
//! each is an error naming the key (both forms, braintrace's and ours) and
//! the shapes, and the model state is left as it was.
//!
//! ```
//! use braintrace_core::learn::ModelState;
//! use braintrace_core::nn::io_braintrace::{load_braintrace_into, KeyMap};
//! use braintrace_core::nn::{Chain, Linear};
//! use braintrace_core::{DType, Tensor};
//!
//! // braintrace: brainstate.nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
//! let mut file = braintrace_core::learn::TensorDict::new();
//! file.insert("layers/0/weight/weight".into(), Tensor::ones(&[2, 3], DType::F64));
//! file.insert("layers/0/weight/bias".into(), Tensor::zeros(&[3], DType::F64));
//! file.insert("layers/1/weight/weight".into(), Tensor::ones(&[3, 1], DType::F64));
//! file.insert("layers/1/weight/bias".into(), Tensor::zeros(&[1], DType::F64));
//!
//! let model = Chain::new(Linear::new("fc0", 2, 3), Linear::new("fc1", 3, 1));
//! let mut state = ModelState::new(&model, DType::F64, 0, None)?;
//! let map = KeyMap::new().rename("layers/0", "fc0").rename("layers/1", "fc1");
//! load_braintrace_into(&mut state, &file, &map)?;
//! assert_eq!(state.params()["fc1/weight/weight"].to_vec_f64()?, vec![1.0; 3]);
//! # Ok::<(), braintrace_core::Error>(())
//! ```

use super::io::{from_bytes_with, in_file};
use crate::error::{Error, Result};
use crate::learn::{ModelState, TensorDict};
use crate::tensor::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The `format` the export script writes in the file's metadata.
pub const FORMAT: &str = "braintrace-params";

const OP: &str = "load_braintrace";

/// A braintrace model's parameters as read from a file: the tensors keyed
/// by braintrace's paths, and the file's metadata (`format`, `model`,
/// `braintrace`, `brainstate`, `jax` from the export script; any
/// safetensors file is accepted, with whatever metadata it has).
#[derive(Clone, Debug)]
pub struct BraintraceParams {
    /// The tensors, keyed by braintrace's state paths.
    pub params: TensorDict,
    /// The safetensors header's metadata.
    pub metadata: HashMap<String, String>,
}

impl BraintraceParams {
    /// Read a safetensors file of braintrace parameters.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(OP, "read", path, e))?;
        Self::from_bytes(&bytes).map_err(|e| in_file(OP, path, e))
    }
    /// Read safetensors bytes of braintrace parameters.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let (params, metadata) = from_bytes_with(OP, bytes)?;
        Ok(BraintraceParams { params, metadata })
    }
    /// The exported model's name (the `model` metadata), if any.
    pub fn model(&self) -> Option<&str> {
        self.metadata.get("model").map(String::as_str)
    }
    /// The braintrace version that wrote the file (the `braintrace`
    /// metadata), if recorded.
    pub fn braintrace_version(&self) -> Option<&str> {
        self.metadata.get("braintrace").map(String::as_str)
    }
}

/// How a braintrace tensor becomes the Rust parameter, when the layouts
/// differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Permute the axes: axis `i` of ours is axis `perm[i]` of braintrace's
    /// (`[1, 0]` transposes a matrix).
    Permute(Vec<usize>),
    /// The same elements in row-major order under another shape.
    Reshape(Vec<usize>),
}

/// The correspondence between a braintrace model's keys and a Rust
/// model's: path-prefix renames (first match wins), prefixes of the file
/// to skip, and layouts of parameters stored differently. The default maps
/// every key to itself.
#[derive(Clone, Debug, Default)]
pub struct KeyMap {
    renames: Vec<(String, String)>,
    skips: Vec<String>,
    layouts: BTreeMap<String, Layout>,
}

/// `key` is `prefix` or lies under it (whole path components; the empty
/// prefix holds every key). The rest after the prefix, without its `/`.
fn under<'a>(key: &'a str, prefix: &str) -> Option<&'a str> {
    if prefix.is_empty() {
        return Some(key);
    }
    let rest = key.strip_prefix(prefix)?;
    if rest.is_empty() {
        Some(rest)
    } else {
        rest.strip_prefix('/')
    }
}

impl KeyMap {
    /// The identity map.
    pub fn new() -> Self {
        Self::default()
    }
    /// Braintrace keys under the path `from` (`layers/0`; `""` for every
    /// key) are ours under `to` (`fc0`; `""` drops the prefix). Rules are
    /// tried in the order given; the first that matches applies.
    pub fn rename(mut self, from: &str, to: &str) -> Self {
        self.renames
            .push((trim(from).to_string(), trim(to).to_string()));
        self
    }
    /// Leave the braintrace keys under `prefix` out (a part of the exported
    /// model the Rust model does not have).
    pub fn skip(mut self, prefix: &str) -> Self {
        self.skips.push(trim(prefix).to_string());
        self
    }
    /// Our parameter `key` (the Rust key, after renaming) is braintrace's
    /// tensor under `layout`.
    pub fn layout(mut self, key: &str, layout: Layout) -> Self {
        self.layouts.insert(key.to_string(), layout);
        self
    }
    /// Whether the braintrace key `key` is skipped.
    pub fn skips(&self, key: &str) -> bool {
        self.skips.iter().any(|p| under(key, p).is_some())
    }
    /// The Rust key of the braintrace key `key`.
    pub fn map_key(&self, key: &str) -> String {
        for (from, to) in &self.renames {
            if let Some(rest) = under(key, from) {
                return match (to.is_empty(), rest.is_empty()) {
                    (true, _) => rest.to_string(),
                    (false, true) => to.clone(),
                    (false, false) => format!("{to}/{rest}"),
                };
            }
        }
        key.to_string()
    }
}

fn trim(p: &str) -> &str {
    p.trim_matches('/')
}

/// Apply `layout` to braintrace's tensor under `key`.
fn apply_layout(key: &str, bt_key: &str, t: &Tensor, layout: &Layout) -> Result<Tensor> {
    let fail = |what: &str, e: Error| {
        Error::shapes(
            OP,
            [t.shape()],
            format!(
                "parameter `{key}` (braintrace `{bt_key}`) of shape {:?}: {what} {layout:?} does not apply: {}",
                t.shape(),
                e.root()
            ),
        )
    };
    match layout {
        Layout::Permute(perm) => {
            let mut seen = perm.clone();
            seen.sort_unstable();
            if seen != (0..t.ndim()).collect::<Vec<_>>() {
                return Err(fail(
                    "the layout",
                    Error::invalid(OP, format!("{perm:?} is not a permutation of the axes")),
                ));
            }
            t.transpose(perm).map_err(|e| fail("the layout", e))
        }
        Layout::Reshape(shape) => t.reshape(shape).map_err(|e| fail("the layout", e)),
    }
}

/// The file's tensors under our keys, checked against `state`'s
/// parameters: every parameter present, no other key (after skips), each
/// shape the parameter's (after its layout), float dtypes. The error names
/// the keys (ours and braintrace's) and the shapes; nothing is changed.
pub fn map_braintrace(state: &ModelState, params: &TensorDict, map: &KeyMap) -> Result<TensorDict> {
    let own = state.params();
    let mut out = TensorDict::new();
    let mut origin: BTreeMap<String, String> = BTreeMap::new();
    let mut extra = Vec::new();
    for (bt_key, t) in params {
        if map.skips(bt_key) {
            continue;
        }
        let key = map.map_key(bt_key);
        if let Some(first) = origin.get(&key) {
            return Err(Error::invalid(
                OP,
                format!(
                    "braintrace keys `{first}` and `{bt_key}` both map to the parameter `{key}`"
                ),
            ));
        }
        if !own.contains_key(&key) {
            extra.push(if &key == bt_key {
                format!("`{bt_key}` {:?}", t.shape())
            } else {
                format!("`{bt_key}` (as `{key}`) {:?}", t.shape())
            });
            continue;
        }
        origin.insert(key.clone(), bt_key.clone());
        out.insert(key, t.clone());
    }
    let missing: Vec<String> = own
        .iter()
        .filter(|(k, _)| !out.contains_key(*k))
        .map(|(k, v)| format!("`{k}` {:?}", v.shape()))
        .collect();
    if !missing.is_empty() || !extra.is_empty() {
        let mut parts = Vec::new();
        if !missing.is_empty() {
            parts.push(format!(
                "the model's parameters missing from the file: {}",
                missing.join(", ")
            ));
        }
        if !extra.is_empty() {
            parts.push(format!(
                "keys of the file the model does not have: {}",
                extra.join(", ")
            ));
        }
        return Err(Error::invalid(
            OP,
            format!(
                "the braintrace parameters do not match the model ({}); rename or skip \
                 braintrace paths with a KeyMap",
                parts.join("; ")
            ),
        ));
    }
    for (key, t) in out.iter_mut() {
        let bt_key = &origin[key];
        crate::learn::float_dtype(
            OP,
            &format!("parameter `{key}` (braintrace `{bt_key}`)"),
            t.dtype(),
        )?;
        if let Some(layout) = map.layouts.get(key) {
            *t = apply_layout(key, bt_key, t, layout)?;
        }
        let want = own[key].shape();
        if t.shape() != want {
            return Err(Error::shapes(
                OP,
                [t.shape(), want],
                format!(
                    "parameter `{key}` (braintrace `{bt_key}`): the file holds shape {:?}, the model's parameter has shape {want:?}",
                    t.shape()
                ),
            ));
        }
    }
    for key in map.layouts.keys() {
        if !own.contains_key(key) {
            return Err(Error::invalid(
                OP,
                format!("a layout is given for `{key}`, which is not a parameter of the model"),
            ));
        }
    }
    Ok(out)
}

/// Replace `state`'s parameters with braintrace's `params` mapped by `map`
/// ([`map_braintrace`]); values are cast to the state's dtype, NaN and
/// infinities refused. Nothing changes on error.
pub fn load_braintrace_into(
    state: &mut ModelState,
    params: &TensorDict,
    map: &KeyMap,
) -> Result<()> {
    let mapped = map_braintrace(state, params, map)?;
    state.set_params(&mapped)
}

/// Read a file written by `scripts/export_braintrace_weights.py` (or any
/// safetensors file keyed by braintrace's paths) into `state`'s
/// parameters ([`load_braintrace_into`]). Returns the file's metadata.
pub fn load_braintrace(
    state: &mut ModelState,
    path: impl AsRef<Path>,
    map: &KeyMap,
) -> Result<HashMap<String, String>> {
    let path = path.as_ref();
    let file = BraintraceParams::read(path)?;
    load_braintrace_into(state, &file.params, map).map_err(|e| match e {
        Error::Invalid { op, reason } => Error::Invalid {
            op,
            reason: format!("{}: {reason}", path.display()),
        },
        e => e,
    })?;
    Ok(file.metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{Chain, LeakyRateReadout, Linear};
    use crate::tensor::DType;

    fn state() -> ModelState {
        let m = Chain::new(
            Linear::new("fc0", 2, 3),
            LeakyRateReadout::new("ro", 3, 1, 5.0, 1.0),
        );
        ModelState::new(&m, DType::F64, 3, None).unwrap()
    }

    fn file() -> TensorDict {
        let mut f = TensorDict::new();
        let seq = |n: usize, s: &[usize]| {
            Tensor::from_vec((0..n).map(|i| i as f64 * 0.1).collect(), s).unwrap()
        };
        f.insert("layers/0/weight/weight".into(), seq(6, &[2, 3]));
        f.insert("layers/0/weight/bias".into(), seq(3, &[3]));
        f.insert("ro/W".into(), seq(3, &[3, 1]));
        f
    }

    fn map() -> KeyMap {
        KeyMap::new().rename("layers/0", "fc0")
    }

    #[test]
    fn renames_apply_by_whole_components() {
        let m = KeyMap::new()
            .rename("layers/1", "b")
            .rename("layers", "a")
            .rename("", "top");
        assert_eq!(m.map_key("layers/1/weight/bias"), "b/weight/bias");
        assert_eq!(m.map_key("layers/10/weight/bias"), "a/10/weight/bias");
        assert_eq!(m.map_key("layersX/W"), "top/layersX/W");
        assert_eq!(KeyMap::new().rename("rnn", "").map_key("rnn/h"), "h");
        assert_eq!(KeyMap::new().map_key("rnn/h"), "rnn/h");
        assert!(KeyMap::new().skip("aux").skips("aux/W"));
        assert!(!KeyMap::new().skip("aux").skips("auxiliary/W"));
    }

    #[test]
    fn loads_through_the_map() {
        let mut st = state();
        load_braintrace_into(&mut st, &file(), &map()).unwrap();
        assert_eq!(
            st.params()["fc0/weight/weight"].to_vec_f64().unwrap(),
            file()["layers/0/weight/weight"].to_vec_f64().unwrap()
        );
    }

    #[test]
    fn errors_name_the_keys_and_shapes_and_change_nothing() {
        let mut st = state();
        let before = st.params();
        let same = |st: &ModelState| {
            for (k, v) in st.params() {
                assert_eq!(v.to_vec_f64().unwrap(), before[&k].to_vec_f64().unwrap());
            }
        };
        // Missing and extra.
        let mut f = file();
        f.remove("ro/W");
        f.insert("aux/W".into(), Tensor::zeros(&[2], DType::F64));
        let m = load_braintrace_into(&mut st, &f, &map())
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("`ro/W` [3, 1]") && m.contains("`aux/W` [2]"),
            "{m}"
        );
        same(&st);
        // ... skipped.
        f.insert("ro/W".into(), file()["ro/W"].clone());
        load_braintrace_into(&mut st.clone(), &f, &map().skip("aux")).unwrap();
        // Wrong shape: both keys and shapes.
        let mut f = file();
        f.insert(
            "layers/0/weight/weight".into(),
            Tensor::zeros(&[3, 2], DType::F64),
        );
        let e = load_braintrace_into(&mut st, &f, &map()).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e:?}");
        let m = e.to_string();
        assert!(
            m.contains("`fc0/weight/weight`")
                && m.contains("`layers/0/weight/weight`")
                && m.contains("[3, 2]")
                && m.contains("[2, 3]"),
            "{m}"
        );
        same(&st);
        // ... which a layout fixes: braintrace's (3, 2) is our (2, 3)
        // transposed.
        let t: Vec<f64> = (0..6).map(|i| i as f64).collect();
        f.insert(
            "layers/0/weight/weight".into(),
            Tensor::from_vec(t, &[3, 2]).unwrap(),
        );
        let mut moved = st.clone();
        load_braintrace_into(
            &mut moved,
            &f,
            &map().layout("fc0/weight/weight", Layout::Permute(vec![1, 0])),
        )
        .unwrap();
        assert_eq!(
            moved.params()["fc0/weight/weight"].to_vec_f64().unwrap(),
            [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]
        );
        let bad = map().layout("fc0/weight/weight", Layout::Permute(vec![0, 0]));
        let m = load_braintrace_into(&mut st, &f, &bad)
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("not a permutation") && m.contains("[3, 2]"),
            "{m}"
        );
        // Two keys onto one, an integer tensor, a NaN.
        let mut f = file();
        f.insert("fc0/weight/bias".into(), Tensor::zeros(&[3], DType::F64));
        let m = load_braintrace_into(&mut st, &f, &map())
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("both map to the parameter `fc0/weight/bias`"),
            "{m}"
        );
        let mut f = file();
        f.insert(
            "ro/W".into(),
            Tensor::from_vec_typed(vec![1i64, 2, 3], &[3, 1]).unwrap(),
        );
        let m = load_braintrace_into(&mut st, &f, &map())
            .unwrap_err()
            .to_string();
        assert!(m.contains("`ro/W`"), "{m}");
        let mut f = file();
        f.insert(
            "ro/W".into(),
            Tensor::from_vec(vec![0.0, f64::NAN, 1.0], &[3, 1]).unwrap(),
        );
        assert!(load_braintrace_into(&mut st, &f, &map()).is_err());
        same(&st);
    }
}
