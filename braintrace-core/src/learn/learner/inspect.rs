//! A weight's eligibility traces by key ([`Learner::etrace_of`],
//! braintrace's `get_etrace_of`) and a reset to another batch size (the
//! step re-analysed, the traces reallocated).

use super::{make_forward, Learner};
use crate::error::{Error, Result};
use crate::learn::compiler::EtraceGraph;
use crate::learn::program::Program;
use crate::learn::report::CompilationReport;
use crate::learn::state::Model;
use crate::tensor::Tensor;
use crate::transform::Jit;
use std::sync::Arc;

impl<M: Model> Learner<M> {
    /// The algorithm's learner-side state (DNI's training reads its last
    /// window's hidden cotangents back).
    pub(crate) fn trace_state(&self) -> &dyn crate::learn::algorithm::TraceState {
        &*self.owned
    }

    /// `xs` and the target sequences checked as `etrace_grad` checks them;
    /// their length.
    pub(crate) fn checked_length(&self, xs: &Tensor, ys: &[Tensor]) -> Result<usize> {
        self.check_inputs(xs, ys)
    }

    /// The compilation as data (braintrace's `CompilationReport`): the
    /// algorithm and its lines, the hidden groups, the weights with traces
    /// and their groups, the weights without and why, the diagnostics.
    /// [`explain`](Self::explain) is its readable account.
    pub fn report(&self) -> CompilationReport {
        let paths: Vec<String> = self
            .state
            .param_infos()
            .iter()
            .map(|p| p.state_path.clone())
            .collect();
        CompilationReport::new(
            &self.program.eg,
            &paths,
            format!("{:?}", self.program.algo),
            self.program.rule.explain(),
        )
    }

    /// The eligibility traces of one weight (copies), in the order of
    /// [`traces`](Self::traces): `weight_key` is a parameter leaf's key
    /// (`rnn/Wz/weight/weight`) or its parameter state's path
    /// (`rnn/Wz/weight`, every leaf of it). D-RTRL gives one trace per
    /// (relation, group) pair and leaf, shaped like the leaf with the
    /// group's states last; pp_prop the input trace of each relation the
    /// weight is read by, then its output traces.
    ///
    /// Errors: a key that is no parameter (the error lists the keys), and
    /// a weight with no trace (a readout, or one no relation reaches) is
    /// an empty list.
    pub fn etrace_of(&self, weight_key: &str) -> Result<Vec<Tensor>> {
        let infos = self.state.param_infos();
        let wanted: Vec<usize> = infos
            .iter()
            .enumerate()
            .filter(|(_, p)| p.key == weight_key || p.state_path == weight_key)
            .map(|(i, _)| i)
            .collect();
        if wanted.is_empty() {
            let keys: Vec<&str> = infos.iter().map(|p| p.key.as_str()).collect();
            return Err(Error::invalid(
                "etrace_of",
                format!(
                    "weight_key: `{weight_key}` is not a parameter key or path; the keys are {}",
                    keys.join(", ")
                ),
            ));
        }
        let owners = self.program.rule.public_params();
        let all = self.traces();
        if owners.len() != all.len() {
            return Err(Error::invalid(
                "etrace_of",
                format!(
                    "the algorithm `{}` does not say which weight its traces belong to",
                    self.program.algo.name()
                ),
            ));
        }
        Ok(all
            .into_iter()
            .zip(owners)
            .filter(|(_, o)| o.iter().any(|p| wanted.contains(p)))
            .map(|(t, _)| t)
            .collect())
    }

    /// [`reset_state`](Self::reset_state) to a batch size other than the
    /// compiled one: the step is analysed again at the new size, the
    /// programs and traces reallocated for it (the parameters are kept).
    /// Nothing changes on error.
    pub(super) fn rebatch(&mut self, batch: Option<usize>) -> Result<()> {
        let inputs = self.inputs.rebatched(self.state.batch(), batch);
        if batch == Some(0) {
            return Err(Error::invalid(
                "reset_state",
                "batch: a batch size must be at least 1",
            ));
        }
        let mut state = self.state.clone();
        state.reset_hidden(batch)?;
        let x = inputs.zeros(state.dtype())?;
        let eg = Arc::new(EtraceGraph::analyse_with(
            &inputs.model(&self.model),
            &state,
            &x,
            &self.control_flow,
        )?);
        eg.require_relations()?;
        let program = Arc::new(Program::new(eg, self.program.algo.clone())?);
        let traces = program.rule.zeros();
        let owned = program.rule.state(&state)?;
        let work = super::super::work::step_work(&program.eg, &state, &traces, owned.as_ref());
        let forward = make_forward(
            program.clone(),
            state.param_values().len(),
            state.hidden_values().len(),
        );
        self.state = state;
        self.program = program;
        self.traces = traces;
        self.owned = owned;
        self.work = work;
        self.forward = Jit::new(forward);
        self.input_aval = x.aval();
        self.inputs = inputs;
        self.step = None;
        self.running_index = 0;
        Ok(())
    }
}
