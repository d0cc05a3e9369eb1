//! Convolution (filled in below).
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Padding of a convolution.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConvPadding {
    /// Output size `ceil(n / stride)`.
    Same,
    /// No padding.
    Valid,
    /// Explicit `(lo, hi)` per spatial axis.
    Explicit(Vec<(i64, i64)>),
}

/// Layouts of lhs, rhs and output, as strings like `"NCHW"`, `"OIHW"`, `"NCHW"`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvDimensionNumbers {
    /// Input layout.
    pub lhs: String,
    /// Kernel layout.
    pub rhs: String,
    /// Output layout.
    pub out: String,
}

/// Parameters of [`conv_general`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvParams {
    /// Strides per spatial axis.
    pub strides: Vec<usize>,
    /// Padding.
    pub padding: ConvPadding,
    /// Input dilation per spatial axis (empty = 1).
    pub lhs_dilation: Vec<usize>,
    /// Kernel dilation per spatial axis (empty = 1).
    pub rhs_dilation: Vec<usize>,
    /// Layouts (`None` = channel-first `NC…`, `OI…`, `NC…`).
    pub dimension_numbers: Option<ConvDimensionNumbers>,
    /// Feature groups.
    pub feature_group_count: usize,
}

/// General dilated convolution (cross-correlation, like XLA's).
pub fn conv_general(x: &Tensor, k: &Tensor, p: &ConvParams) -> Result<Tensor> {
    let _ = (x, k, p);
    Err(Error::invalid("conv", "not implemented yet"))
}
