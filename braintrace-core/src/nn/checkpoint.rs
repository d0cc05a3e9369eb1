//! Checkpoints for resuming training exactly: a model state's parameters
//! and hidden states, an optimiser's state (Adam's moments and step
//! counts, SGD's velocities) and named tensors and counters the caller adds,
//! in one safetensors file with a small metadata header.
//!
//! A file is written beside its destination under a temporary name, flushed
//! to the disk and renamed over the destination, so a crash or a kill while
//! saving leaves the previous checkpoint whole (a rename within a directory
//! is atomic on POSIX file systems); at worst a stray `.<name>.tmp.<pid>`
//! file stays behind.
//!
//! Layout: tensors `param/<key>`, `hidden/<path>`, `optim/<slot>/<key>`
//! (`optim/m/rnn/Wz/weight/weight`) and `extra/<name>`; metadata
//! `format = braintrace-checkpoint`, `version = 1`, `optimizer = <kind>`,
//! one entry per counter, `counter/<name>` and `optim_counter/<name>`,
//! its value in decimal, and one per label, `label/<name>`. Tensors keep their dtype, so a restored run
//! continues with the bits of an uninterrupted one.
//!
//! ```
//! use braintrace_core::learn::ModelState;
//! use braintrace_core::nn::{checkpoint::Checkpoint, Adam, Linear, Optimizer};
//! use braintrace_core::DType;
//!
//! let model = Linear::new("lin", 3, 2);
//! let mut state = ModelState::new(&model, DType::F32, 0, Some(1))?;
//! let mut opt = Adam::new(0.01)?;
//! let grads = state.params().into_iter().map(|(k, v)| (k, v.ones_like())).collect();
//! opt.step(&mut state, &grads)?;
//!
//! let bytes = Checkpoint::capture(&state, &opt).with_counter("epoch", 3).to_bytes()?;
//! let back = Checkpoint::from_bytes(&bytes)?;
//! let (mut state2, mut opt2) = (ModelState::new(&model, DType::F32, 1, Some(1))?, Adam::new(0.01)?);
//! back.restore(&mut state2, &mut opt2)?;
//! assert_eq!(back.counters["epoch"], 3);
//! assert_eq!(opt2.steps("lin/weight/weight"), 1);
//! # Ok::<(), braintrace_core::Error>(())
//! ```

use super::io::{from_bytes_with, load_params_into, to_bytes_with};
use super::optim::{OptimState, Optimizer};
use crate::error::{Error, Result};
use crate::learn::{ModelState, TensorDict};
use crate::tensor::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

mod learner;

/// The `format` entry of a checkpoint's metadata.
pub const FORMAT: &str = "braintrace-checkpoint";
/// The `version` entry this library writes and reads.
pub const VERSION: &str = "1";

/// What a checkpoint holds. Build one with [`Checkpoint::capture`] (and
/// [`with_extra`](Checkpoint::with_extra), [`with_counter`](Checkpoint::with_counter)),
/// write it with [`save`](Checkpoint::save), read it with
/// [`load`](Checkpoint::load) and put it back with
/// [`restore`](Checkpoint::restore).
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    /// Parameters keyed by parameter key.
    pub params: TensorDict,
    /// Hidden states keyed by path.
    pub hidden: TensorDict,
    /// The optimiser's state.
    pub optim: OptimState,
    /// Named tensors of the caller (a learner's traces, a data cursor).
    pub extra: TensorDict,
    /// Named counters of the caller (steps, epochs).
    pub counters: BTreeMap<String, u64>,
    /// Named text of the caller (a learner's algorithm and batch size).
    pub labels: BTreeMap<String, String>,
}

impl Checkpoint {
    /// The parameters and hidden states of `state` and the state of `opt`.
    pub fn capture(state: &ModelState, opt: &dyn Optimizer) -> Self {
        Checkpoint {
            params: state.params(),
            hidden: state.hidden(),
            optim: opt.state(),
            ..Checkpoint::default()
        }
    }

    /// With a named tensor of the caller's.
    pub fn with_extra(mut self, name: &str, value: Tensor) -> Self {
        self.extra.insert(name.to_string(), value);
        self
    }

    /// With a named counter of the caller's.
    pub fn with_counter(mut self, name: &str, value: u64) -> Self {
        self.counters.insert(name.to_string(), value);
        self
    }

    /// With a named text of the caller's.
    pub fn with_label(mut self, name: &str, value: &str) -> Self {
        self.labels.insert(name.to_string(), value.to_string());
        self
    }

    /// The checkpoint as safetensors bytes with its metadata header.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        const OP: &str = "Checkpoint::to_bytes";
        let mut tensors = TensorDict::new();
        let groups = [
            ("param", &self.params),
            ("hidden", &self.hidden),
            ("optim", &self.optim.tensors),
            ("extra", &self.extra),
        ];
        for (group, dict) in groups {
            for (k, t) in dict {
                tensors.insert(format!("{group}/{k}"), t.clone());
            }
        }
        let mut meta = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("version".to_string(), VERSION.to_string()),
            ("optimizer".to_string(), self.optim.kind.clone()),
        ]);
        for (k, v) in &self.counters {
            meta.insert(format!("counter/{k}"), v.to_string());
        }
        for (k, v) in &self.optim.counters {
            meta.insert(format!("optim_counter/{k}"), v.to_string());
        }
        for (k, v) in &self.labels {
            meta.insert(format!("label/{k}"), v.clone());
        }
        to_bytes_with(OP, &tensors, Some(meta))
    }

    /// Read a checkpoint written by [`Checkpoint::to_bytes`]; bytes that are
    /// not one (another safetensors file, another version, a truncated
    /// file) are an error saying so.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const OP: &str = "Checkpoint::from_bytes";
        let (tensors, meta) = from_bytes_with(OP, bytes)?;
        let entry = |k: &str| meta.get(k).map(String::as_str);
        if entry("format") != Some(FORMAT) {
            return Err(Error::invalid(
                OP,
                format!("not a braintrace checkpoint (its metadata has no `format = {FORMAT}`)"),
            ));
        }
        if entry("version") != Some(VERSION) {
            return Err(Error::invalid(
                OP,
                format!(
                    "checkpoint version {:?}; this library reads version {VERSION}",
                    entry("version").unwrap_or("none")
                ),
            ));
        }
        let mut c = Checkpoint::default();
        c.optim.kind = entry("optimizer").unwrap_or_default().to_string();
        for (name, t) in tensors {
            let (group, key) = name.split_once('/').unwrap_or(("", &name));
            let dict = match group {
                "param" => &mut c.params,
                "hidden" => &mut c.hidden,
                "optim" => &mut c.optim.tensors,
                "extra" => &mut c.extra,
                _ => {
                    return Err(Error::invalid(
                        OP,
                        format!(
                        "unexpected tensor `{name}` (expected param/, hidden/, optim/ or extra/)"
                    ),
                    ))
                }
            };
            dict.insert(key.to_string(), t);
        }
        for (k, v) in &meta {
            if let Some(n) = k.strip_prefix("label/") {
                c.labels.insert(n.to_string(), v.clone());
                continue;
            }
            let (counters, name) = if let Some(n) = k.strip_prefix("counter/") {
                (&mut c.counters, n)
            } else if let Some(n) = k.strip_prefix("optim_counter/") {
                (&mut c.optim.counters, n)
            } else {
                continue;
            };
            let v = v.parse::<u64>().map_err(|_| {
                Error::invalid(OP, format!("counter `{k}` is {v:?}, not a whole number"))
            })?;
            counters.insert(name.to_string(), v);
        }
        Ok(c)
    }

    /// Write the checkpoint to `path` atomically: to a temporary file in
    /// the same directory, flushed to the disk, then renamed over `path`.
    /// On error `path` is left as it was.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        const OP: &str = "Checkpoint::save";
        let path = path.as_ref();
        let fail = |what: &str, e: std::io::Error| Error::io(OP, what, path, e);
        let bytes = self.to_bytes()?;
        let name = path
            .file_name()
            .ok_or_else(|| Error::invalid(OP, format!("{} names no file", path.display())))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let tmp = dir.join(format!(
            ".{}.tmp.{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            // On the disk before the rename makes it the checkpoint: else a
            // power cut could leave the new name on an empty file.
            f.sync_all()
        })();
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail("write", e));
        }
        // Make the rename itself durable (best effort: not every platform
        // can open a directory).
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Read a checkpoint written by [`Checkpoint::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| Error::io("Checkpoint::load", "read", path, e))?;
        Self::from_bytes(&bytes).map_err(|e| super::io::in_file("Checkpoint::load", path, e))
    }

    /// Put the parameters and hidden states back into `state` and the
    /// optimiser's state into `opt`. The keys must be the state's own (see
    /// [`load_params_into`]), the hidden states of its shapes (its batch);
    /// `opt` must be of the kind that was saved. Nothing changes on error.
    pub fn restore(&self, state: &mut ModelState, opt: &mut dyn Optimizer) -> Result<()> {
        let mut next = state.clone();
        load_params_into(&mut next, &self.params)?;
        let own = state.hidden();
        if own.len() != self.hidden.len() || own.keys().any(|k| !self.hidden.contains_key(k)) {
            return Err(Error::invalid(
                "Checkpoint::restore",
                format!(
                    "the saved hidden states [{}] are not the model's [{}]",
                    keys(&self.hidden),
                    keys(&own)
                ),
            ));
        }
        for (k, v) in &self.hidden {
            next.set_hidden(k, v)?;
        }
        // The optimiser last: its load is all-or-nothing, and after it
        // nothing can fail.
        opt.load_state(&self.optim)?;
        *state = next;
        Ok(())
    }
}

fn keys(d: &TensorDict) -> String {
    d.keys().cloned().collect::<Vec<_>>().join(", ")
}
