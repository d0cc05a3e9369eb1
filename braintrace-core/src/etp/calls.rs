//! The checked rule calls of an ETP primitive (`p.yw_to_w(..)`,
//! `p.xy_to_dw(..)`, ...): look the rule up, call it, name the primitive
//! and the rule in any error, and check the result's structure (keys,
//! shapes, the trailing hidden-state axis). The D-RTRL overrides fall back
//! to `xy_to_dw` and `yw_to_w` where absent.

use super::params::Params;
use super::primitive::EtpPrimitive;
use super::rules::{AvalMap, TensorMap};
use crate::error::{Error, Result};
use crate::tensor::{Aval, Tensor};

type BTreeMapView<'a> = Vec<(&'a str, Aval)>;

impl EtpPrimitive {
    fn missing(&self, rule: &str) -> Error {
        Error::MissingRule {
            primitive: self.name().to_string(),
            rule: rule.into(),
            detail: format!("; register it with `register_{rule}`"),
        }
    }

    fn check_like(&self, rule: &str, out: &TensorMap, like: &BTreeMapView) -> Result<()> {
        for (k, a) in like {
            match out.get(*k) {
                None => {
                    return Err(Error::etp(
                        self.name(),
                        format!("rule {rule}"),
                        format!(
                            "result lacks trainable `{k}` (got keys {:?})",
                            out.keys().collect::<Vec<_>>()
                        ),
                    ))
                }
                Some(t) if t.shape() != a.shape() => {
                    return Err(Error::etp(
                        self.name(),
                        format!("rule {rule}"),
                        format!(
                            "result `{k}` has shape {:?}, expected {:?}",
                            t.shape(),
                            a.shape()
                        ),
                    ))
                }
                _ => {}
            }
        }
        if out.len() != like.len() {
            return Err(Error::etp(
                self.name(),
                format!("rule {rule}"),
                format!(
                    "result has keys {:?}, expected {:?}",
                    out.keys().collect::<Vec<_>>(),
                    like.iter().map(|(k, _)| k).collect::<Vec<_>>()
                ),
            ));
        }
        Ok(())
    }

    /// Call the registered `yw_to_w`, checking that the result has the trace's structure.
    pub fn yw_to_w(
        &self,
        hidden: &Tensor,
        trace: &TensorMap,
        params: &Params,
    ) -> Result<TensorMap> {
        let r = self
            .rule(|r| &r.yw_to_w)
            .ok_or_else(|| self.missing("yw_to_w"))?;
        let out = r
            .call(hidden, trace, params)
            .map_err(|e| self.wrap("rule yw_to_w", e))?;
        let like: BTreeMapView = trace.iter().map(|(k, t)| (k.as_str(), t.aval())).collect();
        self.check_like("yw_to_w", &out, &like)?;
        Ok(out)
    }
    /// Call the registered `xy_to_dw`, checking keys (and shapes, unless the primitive opts out).
    pub fn xy_to_dw(
        &self,
        x: Option<&Tensor>,
        hidden: &Tensor,
        weights: &TensorMap,
        params: &Params,
    ) -> Result<TensorMap> {
        let r = self
            .rule(|r| &r.xy_to_dw)
            .ok_or_else(|| self.missing("xy_to_dw"))?;
        let out = r
            .call(x, hidden, weights, params)
            .map_err(|e| self.wrap("rule xy_to_dw", e))?;
        if self.exact_dw_shapes() {
            let like: BTreeMapView = weights
                .iter()
                .map(|(k, t)| (k.as_str(), t.aval()))
                .collect();
            self.check_like("xy_to_dw", &out, &like)?;
        }
        Ok(out)
    }
    /// The D-RTRL instantaneous term: `instant_drtrl` where registered, else `xy_to_dw`.
    pub fn instant_drtrl(
        &self,
        x: Option<&Tensor>,
        hidden: &Tensor,
        weights: &TensorMap,
        params: &Params,
    ) -> Result<TensorMap> {
        match self.rule(|r| &r.instant_drtrl) {
            Some(r) => r
                .call(x, hidden, weights, params)
                .map_err(|e| self.wrap("rule instant_drtrl", e)),
            None => self.xy_to_dw(x, hidden, weights, params),
        }
    }
    /// The D-RTRL solve: `solve_drtrl` where registered, else `yw_to_w(g, trace)`.
    pub fn solve_drtrl(
        &self,
        g: &Tensor,
        trace: &TensorMap,
        weights: &TensorMap,
        params: &Params,
    ) -> Result<TensorMap> {
        match self.rule(|r| &r.solve_drtrl) {
            Some(r) => r
                .call(g, trace, weights, params)
                .map_err(|e| self.wrap("rule solve_drtrl", e)),
            None => self.yw_to_w(g, trace, params),
        }
    }
    /// Call `init_drtrl`, checking keys, zeros and the trailing state axis.
    pub fn init_drtrl(
        &self,
        x: Option<&Aval>,
        y: &Aval,
        weights: &AvalMap,
        num_hidden_state: usize,
        params: &Params,
    ) -> Result<TensorMap> {
        let r = self
            .rule(|r| &r.init_drtrl)
            .ok_or_else(|| self.missing("init_drtrl"))?;
        let out = r
            .call(x, y, weights, num_hidden_state, params)
            .map_err(|e| self.wrap("rule init_drtrl", e))?;
        for k in weights.keys() {
            let t = out.get(k).ok_or_else(|| {
                Error::etp(
                    self.name(),
                    "rule init_drtrl",
                    format!("result lacks trainable `{k}`"),
                )
            })?;
            if t.shape().last() != Some(&num_hidden_state) {
                return Err(Error::etp(self.name(), "rule init_drtrl", format!("result `{k}` has shape {:?}; its last axis must be num_hidden_state = {num_hidden_state}", t.shape())));
            }
        }
        Ok(out)
    }
    /// Call `init_pp`, checking the shape `(*y.shape, S)`.
    pub fn init_pp(
        &self,
        x: Option<&Aval>,
        y: &Aval,
        weights: &AvalMap,
        num_hidden_state: usize,
        params: &Params,
    ) -> Result<Tensor> {
        let r = self
            .rule(|r| &r.init_pp)
            .ok_or_else(|| self.missing("init_pp"))?;
        let out = r
            .call(x, y, weights, num_hidden_state, params)
            .map_err(|e| self.wrap("rule init_pp", e))?;
        let mut want = y.shape().to_vec();
        want.push(num_hidden_state);
        if out.shape() != want.as_slice() {
            return Err(Error::etp(
                self.name(),
                "rule init_pp",
                format!(
                    "result has shape {:?}, expected (*y.shape, S) = {want:?}",
                    out.shape()
                ),
            ));
        }
        Ok(out)
    }
}
