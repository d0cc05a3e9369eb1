//! What a [`Learner`] carries from one call to the next besides its
//! parameters and hidden states — the eligibility traces the step programs
//! carry, the algorithm's own traces (in its own layout) and the step
//! counter — taken out with [`Learner::snapshot`] and put back, with a
//! model state, by [`Learner::resume`]. Together with the optimiser's
//! state they are all a run needs to continue with the bits of an
//! uninterrupted one (`nn::Checkpoint::capture_learner` writes them to a
//! file).

use super::Learner;
use crate::error::{Error, Result};
use crate::learn::state::{Model, ModelState};
use crate::tensor::{DType, Tensor};

/// A learner's traces and step counter (see the module docs), with what
/// identifies the learner they fit: its algorithm with its options, its
/// batch size and dtype.
#[derive(Clone, Debug)]
pub struct LearnerSnapshot {
    /// The algorithm with its options (`Learner::algorithm`'s `Debug`).
    pub algorithm: String,
    /// The compiled batch size.
    pub batch: Option<usize>,
    /// The model's dtype.
    pub dtype: DType,
    /// The traces the step programs carry, in their order.
    pub traces: Vec<Tensor>,
    /// The algorithm's own traces, in its own layout.
    pub owned: Vec<Tensor>,
    /// Steps since compile or the last reset.
    pub running_index: usize,
    /// Steps [`NonFinite::Skip`](crate::learn::NonFinite::Skip) dropped
    /// since compile ([`Learner::skipped`]).
    pub skipped: usize,
}

impl<M: Model> Learner<M> {
    /// Copies of the traces and the step counter (see [`LearnerSnapshot`]).
    pub fn snapshot(&self) -> LearnerSnapshot {
        LearnerSnapshot {
            algorithm: format!("{:?}", self.program.algo),
            batch: self.state.batch(),
            dtype: self.state.dtype(),
            traces: self.traces.clone(),
            owned: self.owned.raw(),
            running_index: self.running_index,
            skipped: self.skipped,
        }
    }

    /// Continue from `state` (parameters and hidden states) and `snap`
    /// (traces and step counter). `state` must be this learner's model
    /// state in layout (the same parameter keys and shapes, hidden states,
    /// batch size and dtype), `snap` taken from a learner of the same
    /// model, algorithm and options, batch size and dtype. Every part is
    /// checked before anything changes: on error the learner is as it was,
    /// and the error names what differs.
    pub fn resume(&mut self, state: ModelState, snap: &LearnerSnapshot) -> Result<()> {
        const OP: &str = "Learner::resume";
        let own = self.snapshot_header();
        if snap.algorithm != own.algorithm {
            return Err(Error::invalid(
                OP,
                format!(
                    "saved with algorithm {}; this learner runs {}",
                    snap.algorithm, own.algorithm
                ),
            ));
        }
        if snap.batch != own.batch || state.batch() != own.batch {
            return Err(Error::invalid(
                OP,
                format!(
                    "saved with batch size {:?} (model state {:?}); this learner was compiled for {:?}",
                    snap.batch,
                    state.batch(),
                    own.batch
                ),
            ));
        }
        if snap.dtype != own.dtype || state.dtype() != own.dtype {
            return Err(Error::dtype_with(
                OP,
                "snapshot",
                [own.dtype],
                if snap.dtype != own.dtype {
                    snap.dtype
                } else {
                    state.dtype()
                },
                format!(
                    "saved as {:?} (model state {:?}); this learner is {:?}",
                    snap.dtype,
                    state.dtype(),
                    own.dtype
                ),
            ));
        }
        check_state(&self.state, &state)?;
        if snap.traces.len() != self.traces.len() {
            return Err(Error::invalid(
                OP,
                format!(
                    "saved with {} program trace(s); this learner carries {}",
                    snap.traces.len(),
                    self.traces.len()
                ),
            ));
        }
        for (i, (s, o)) in snap.traces.iter().zip(&self.traces).enumerate() {
            if s.dtype() != o.dtype() {
                return Err(Error::dtype_with(
                    OP,
                    format!("saved trace {i}"),
                    [o.dtype()],
                    s.dtype(),
                    "the saved trace's dtype is not the learner's",
                ));
            }
            if s.shape() != o.shape() || s.is_symbolic() {
                return Err(Error::shapes(
                    OP,
                    [s.shape().to_vec(), o.shape().to_vec()],
                    format!("saved trace {i} (first) does not have the learner's shape (second)"),
                ));
            }
        }
        // The algorithm's state checks everything before it changes
        // anything; after it nothing can fail.
        self.owned.load_raw(&snap.owned)?;
        self.state = state;
        self.traces = snap.traces.clone();
        self.running_index = snap.running_index;
        self.skipped = snap.skipped;
        Ok(())
    }

    /// The identifying part of [`snapshot`](Self::snapshot), without copies.
    fn snapshot_header(&self) -> LearnerSnapshot {
        LearnerSnapshot {
            algorithm: format!("{:?}", self.program.algo),
            batch: self.state.batch(),
            dtype: self.state.dtype(),
            traces: Vec::new(),
            owned: Vec::new(),
            running_index: self.running_index,
            skipped: self.skipped,
        }
    }
}

/// `new` has `old`'s parameters (keys, shapes) and hidden states (paths, shapes).
fn check_state(old: &ModelState, new: &ModelState) -> Result<()> {
    const OP: &str = "Learner::resume";
    let keys = |s: &ModelState| {
        s.param_infos()
            .iter()
            .map(|p| p.key.clone())
            .collect::<Vec<_>>()
    };
    if keys(old) != keys(new) {
        return Err(Error::invalid(
            OP,
            format!(
                "the model state's parameters [{}] are not the learner's [{}]",
                keys(new).join(", "),
                keys(old).join(", ")
            ),
        ));
    }
    for ((k, a), b) in keys(old)
        .iter()
        .zip(old.param_values())
        .zip(new.param_values())
    {
        if a.shape() != b.shape() {
            return Err(Error::shapes(
                OP,
                [b.shape().to_vec(), a.shape().to_vec()],
                format!("parameter `{k}`: the saved shape (first) is not the learner's (second)"),
            ));
        }
    }
    let paths = |s: &ModelState| {
        s.hidden_infos()
            .iter()
            .map(|h| h.path.clone())
            .collect::<Vec<_>>()
    };
    if paths(old) != paths(new) {
        return Err(Error::invalid(
            OP,
            format!(
                "the model state's hidden states [{}] are not the learner's [{}]",
                paths(new).join(", "),
                paths(old).join(", ")
            ),
        ));
    }
    for ((p, a), b) in paths(old)
        .iter()
        .zip(old.hidden_values())
        .zip(new.hidden_values())
    {
        if a.shape() != b.shape() {
            return Err(Error::shapes(
                OP,
                [b.shape().to_vec(), a.shape().to_vec()],
                format!(
                    "hidden state `{p}`: the saved shape (first) is not the learner's (second)"
                ),
            ));
        }
    }
    Ok(())
}
