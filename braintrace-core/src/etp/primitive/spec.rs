//! Spec-based description: one value, `EtpPrimitiveSpec`, fully describes a
//! primitive (name, impl, the four rules, layout, flags). It is plain data:
//! `register_primitive_spec` (in `registration`) builds the primitive from
//! it, and `get_primitive_spec` returns that very spec.

use super::options::PrimitiveOptions;
use crate::error::Result;
use crate::etp::params::Params;
use crate::etp::rules::{EtpRules, InitDrtrl, InitPp, InstantDrtrl, SolveDrtrl, XyToDw, YwToW};
use crate::tensor::Tensor;
use std::fmt;
use std::sync::Arc;

/// The implementation function of an ETP primitive: operands and params to `y`.
pub type ImplFn = Arc<dyn Fn(&[Tensor], &Params) -> Result<Tensor> + Send + Sync>;

/// A complete description of an ETP primitive. All four rules are required
/// fields, so an incomplete spec does not compile.
#[derive(Clone)]
pub struct EtpPrimitiveSpec {
    /// The primitive's name (unique).
    pub name: String,
    /// The implementation function.
    pub impl_fn: ImplFn,
    /// `yw_to_w`.
    pub yw_to_w: YwToW,
    /// `xy_to_dw`.
    pub xy_to_dw: XyToDw,
    /// `init_drtrl`.
    pub init_drtrl: InitDrtrl,
    /// `init_pp`.
    pub init_pp: InitPp,
    /// Optional `instant_drtrl`.
    pub instant_drtrl: Option<InstantDrtrl>,
    /// Optional `solve_drtrl`.
    pub solve_drtrl: Option<SolveDrtrl>,
    /// Flags and layout (`x` index, trainables, counterpart).
    pub options: PrimitiveOptions,
}

impl EtpPrimitiveSpec {
    /// A spec with default options (x = operand 0, weight = operand 1).
    pub fn new<F>(
        name: &str,
        impl_fn: F,
        yw_to_w: YwToW,
        xy_to_dw: XyToDw,
        init_drtrl: InitDrtrl,
        init_pp: InitPp,
    ) -> Self
    where
        F: Fn(&[Tensor], &Params) -> Result<Tensor> + Send + Sync + 'static,
    {
        EtpPrimitiveSpec {
            name: name.to_string(),
            impl_fn: Arc::new(impl_fn),
            yw_to_w,
            xy_to_dw,
            init_drtrl,
            init_pp,
            instant_drtrl: None,
            solve_drtrl: None,
            options: PrimitiveOptions::default(),
        }
    }
    /// Replace the options.
    pub fn with_options(mut self, options: PrimitiveOptions) -> Self {
        self.options = options;
        self
    }
    /// Every rule of the spec, for registration.
    pub(in crate::etp) fn rules(&self) -> EtpRules {
        EtpRules {
            yw_to_w: Some(self.yw_to_w.clone()),
            xy_to_dw: Some(self.xy_to_dw.clone()),
            init_drtrl: Some(self.init_drtrl.clone()),
            init_pp: Some(self.init_pp.clone()),
            instant_drtrl: self.instant_drtrl.clone(),
            solve_drtrl: self.solve_drtrl.clone(),
        }
    }
}

impl fmt::Debug for EtpPrimitiveSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtpPrimitiveSpec")
            .field("name", &self.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}
