//! A learner's checkpoint: everything [`Checkpoint::capture`] holds (its
//! parameters, hidden states and the optimiser's state) and the rest of
//! what a [`Learner`] carries from one step to the next — its eligibility
//! traces (those its step programs carry and the algorithm's own), its step
//! counter — with its algorithm, batch size and dtype, so that a run
//! stopped after K updates and resumed from the file ends with the bits of
//! an uninterrupted one.
//!
//! Layout, beside [`Checkpoint`]'s: tensors `extra/learner/trace/<i>` and
//! `extra/learner/owned/<i>`; counters `learner/running_index` and
//! `learner/skipped` (steps the non-finite policy dropped); labels
//! `learner/algorithm`, `learner/batch` (a number or `none`) and
//! `learner/dtype`.

use super::Checkpoint;
use crate::error::{Error, Result};
use crate::learn::{Learner, LearnerSnapshot, Model, TensorDict};
use crate::nn::io::load_params_into;
use crate::nn::optim::Optimizer;
use crate::tensor::{DType, Tensor};

const TRACE: &str = "learner/trace/";
const OWNED: &str = "learner/owned/";
const RUNNING: &str = "learner/running_index";
/// Absent in checkpoints written before the learner's non-finite policy
/// (read as 0).
const SKIPPED: &str = "learner/skipped";
const ALGORITHM: &str = "learner/algorithm";
const BATCH: &str = "learner/batch";
const DTYPE: &str = "learner/dtype";

impl Checkpoint {
    /// `learner`'s parameters, hidden states, traces and step counter and
    /// `opt`'s state (see the module docs).
    ///
    /// ```
    /// use braintrace_core::learn::{compile, DRtrl, ModelState};
    /// use braintrace_core::nn::{Checkpoint, GruCell, Sgd};
    /// use braintrace_core::{DType, Tensor};
    ///
    /// let state = ModelState::new(&GruCell::new("rnn", 3, 4), DType::F64, 0, Some(2))?;
    /// let x = Tensor::ones(&[2, 3], DType::F64);
    /// let mut learner = compile(GruCell::new("rnn", 3, 4), state.clone(), DRtrl::default(), &x, Some(2))?;
    /// learner.update(&x)?;
    /// let bytes = Checkpoint::capture_learner(&learner, &Sgd::new(0.1)?).to_bytes()?;
    ///
    /// let mut again = compile(GruCell::new("rnn", 3, 4), state, DRtrl::default(), &x, Some(2))?;
    /// Checkpoint::from_bytes(&bytes)?.restore_learner(&mut again, &mut Sgd::new(0.1)?)?;
    /// assert_eq!(again.running_index(), 1);
    /// assert_eq!(again.update(&x)?.to_vec_f64()?, learner.update(&x)?.to_vec_f64()?);
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn capture_learner<M: Model>(learner: &Learner<M>, opt: &dyn Optimizer) -> Self {
        let snap = learner.snapshot();
        let mut c = Checkpoint::capture(learner.state(), opt)
            .with_counter(RUNNING, snap.running_index as u64)
            .with_counter(SKIPPED, snap.skipped as u64)
            .with_label(ALGORITHM, &snap.algorithm)
            .with_label(BATCH, &batch_label(snap.batch))
            .with_label(DTYPE, &format!("{:?}", snap.dtype));
        for (prefix, list) in [(TRACE, &snap.traces), (OWNED, &snap.owned)] {
            for (i, t) in list.iter().enumerate() {
                c.extra.insert(format!("{prefix}{i:05}"), t.clone());
            }
        }
        c
    }

    /// Whether this is a learner's checkpoint ([`capture_learner`](Self::capture_learner)).
    pub fn is_learner(&self) -> bool {
        self.counters.contains_key(RUNNING) && self.labels.contains_key(ALGORITHM)
    }

    /// Put a [`capture_learner`](Self::capture_learner) checkpoint back
    /// into `learner` and `opt`. The learner must be compiled from the
    /// same model (parameter keys and shapes), with the same algorithm and
    /// options, batch size and dtype, and `opt` be of the kind saved;
    /// otherwise the error names what differs. Nothing changes on error.
    pub fn restore_learner<M: Model>(
        &self,
        learner: &mut Learner<M>,
        opt: &mut dyn Optimizer,
    ) -> Result<()> {
        const OP: &str = "Checkpoint::restore_learner";
        if !self.is_learner() {
            return Err(Error::invalid(
                OP,
                "not a learner's checkpoint (no learner/running_index and learner/algorithm entries; \
                 Checkpoint::capture_learner writes them)",
            ));
        }
        let own = learner.state();
        let label = |k: &str| self.labels.get(k).map(String::as_str).unwrap_or("none");
        let own_batch = batch_label(own.batch());
        if label(BATCH) != own_batch {
            return Err(Error::invalid(
                OP,
                format!(
                    "batch size: the checkpoint was saved with {}, the learner was compiled for {own_batch}",
                    label(BATCH)
                ),
            ));
        }
        let own_dtype = format!("{:?}", own.dtype());
        if label(DTYPE) != own_dtype {
            let saved = [DType::F32, DType::F64, DType::I64, DType::Bool]
                .into_iter()
                .find(|d| format!("{d:?}") == label(DTYPE));
            return Err(match saved {
                Some(got) => Error::dtype_with(
                    OP,
                    "checkpoint",
                    [own.dtype()],
                    got,
                    "the checkpoint's dtype is not the learner's",
                ),
                None => Error::invalid(
                    OP,
                    format!(
                        "the checkpoint was saved as {}, the learner is {own_dtype}",
                        label(DTYPE)
                    ),
                ),
            });
        }
        let own_algo = format!("{:?}", learner.algorithm());
        if label(ALGORITHM) != own_algo {
            return Err(Error::invalid(
                OP,
                format!(
                    "algorithm: the checkpoint was saved with {}, the learner runs {own_algo}",
                    label(ALGORITHM)
                ),
            ));
        }
        let mut next = own.clone();
        load_params_into(&mut next, &self.params)?;
        let paths: Vec<String> = own.hidden_infos().iter().map(|h| h.path.clone()).collect();
        if paths.len() != self.hidden.len() || paths.iter().any(|p| !self.hidden.contains_key(p)) {
            return Err(Error::invalid(
                OP,
                format!(
                    "hidden states: the checkpoint's [{}] are not the learner's [{}]",
                    self.hidden.keys().cloned().collect::<Vec<_>>().join(", "),
                    paths.join(", ")
                ),
            ));
        }
        for p in &paths {
            next.set_hidden(p, &self.hidden[p])?;
        }
        let snap = LearnerSnapshot {
            algorithm: own_algo,
            batch: own.batch(),
            dtype: own.dtype(),
            traces: numbered(OP, &self.extra, TRACE)?,
            owned: numbered(OP, &self.extra, OWNED)?,
            running_index: usize::try_from(self.counters[RUNNING]).map_err(|_| {
                Error::invalid(
                    OP,
                    "learner/running_index does not fit this machine's usize",
                )
            })?,
            skipped: usize::try_from(self.counters.get(SKIPPED).copied().unwrap_or(0)).map_err(
                |_| Error::invalid(OP, "learner/skipped does not fit this machine's usize"),
            )?,
        };
        // The optimiser first (all or nothing), put back if the learner
        // refuses the rest.
        let before = opt.state();
        opt.load_state(&self.optim)?;
        if let Err(e) = learner.resume(next, &snap) {
            opt.load_state(&before)
                .expect("an optimiser takes back the state it gave");
            return Err(e);
        }
        Ok(())
    }
}

fn batch_label(b: Option<usize>) -> String {
    b.map_or_else(|| "none".to_string(), |b| b.to_string())
}

/// `d`'s tensors `<prefix>0`, `<prefix>1`, ... in order; a gap is an error.
fn numbered(op: &str, d: &TensorDict, prefix: &str) -> Result<Vec<Tensor>> {
    let mut v: Vec<(usize, Tensor)> = Vec::new();
    for (k, t) in d {
        if let Some(i) = k.strip_prefix(prefix) {
            let i = i
                .parse::<usize>()
                .map_err(|_| Error::invalid(op, format!("tensor `extra/{k}` is not numbered")))?;
            v.push((i, t.clone()));
        }
    }
    v.sort_by_key(|(i, _)| *i);
    if v.iter().enumerate().any(|(n, (i, _))| n != *i) {
        return Err(Error::invalid(
            op,
            format!("the checkpoint's `extra/{prefix}*` tensors are not numbered 0, 1, ...",),
        ));
    }
    Ok(v.into_iter().map(|(_, t)| t).collect())
}
