//! General dilated, strided, padded, grouped convolution (cross-correlation,
//! like XLA's `conv_general_dilated`).
//!
//! Three primitives work on the canonical layouts x: `(N, C, s..)`,
//! k: `(O, C/G, k..)`, y: `(N, O, o..)`:
//!
//! * [`Conv`] `(x, k) -> y`,
//! * [`ConvTransposeLhs`] `(ct, k) -> dx`, the adjoint of `Conv` in `x`,
//! * [`ConvTransposeRhs`] `(x, ct) -> dk`, the adjoint of `Conv` in `k`.
//!
//! All three are bilinear, and the set is closed under transposition:
//! with `<·,·>` the sum of element-wise products,
//! `<ct, Conv(x, k)> = <TL(ct, k), x> = <TR(x, ct), k>`, so
//!
//! * `Conv`: w.r.t. `x` → `TL(ct, k)`, w.r.t. `k` → `TR(x, ct)`;
//! * `TL(ct, k)` with output cotangent `g` (x-shaped): w.r.t. `ct` →
//!   `Conv(g, k)`, w.r.t. `k` → `TR(g, ct)`;
//! * `TR(x, ct)` with output cotangent `G` (k-shaped): w.r.t. `x` →
//!   `TL(ct, G)`, w.r.t. `ct` → `Conv(x, G)`.
//!
//! [`conv_general`] (and [`Tensor::conv`](crate::tensor::Tensor::conv))
//! handles layouts, SAME/VALID padding and defaults, and binds [`Conv`] on
//! canonical operands.

mod batching;
mod check;
mod general;
mod prims;

pub(crate) use general::layout_perms;
pub use general::{conv_general, conv_raw, conv_transpose_lhs_raw, conv_transpose_rhs_raw};
pub use prims::{Conv, ConvTransposeLhs, ConvTransposeRhs};

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
///
/// The lhs and output strings name the batch axis `N` and the feature axis
/// `C`; the rhs string names the output-feature axis `O` and the
/// input-feature axis `I`. Every other letter is a spatial axis; the three
/// strings must use the same spatial letters, and the order of the spatial
/// letters in the rhs string is the order of the per-axis lists of
/// [`ConvParams`] (strides, padding, dilations), as in JAX.
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

impl ConvParams {
    /// Stride 1, VALID padding, no dilation, channel-first layouts, one group.
    ///
    /// ```
    /// use braintrace_core::ops::{ConvPadding, ConvParams};
    /// let p = ConvParams::default_for(2)
    ///     .with_strides(&[2, 2])
    ///     .with_padding(ConvPadding::Same)
    ///     .with_dimension_numbers("NHWC", "HWIO", "NHWC");
    /// assert_eq!(p.strides, vec![2, 2]);
    /// ```
    pub fn default_for(spatial_dims: usize) -> Self {
        ConvParams {
            strides: vec![1; spatial_dims],
            padding: ConvPadding::Valid,
            lhs_dilation: vec![1; spatial_dims],
            rhs_dilation: vec![1; spatial_dims],
            dimension_numbers: None,
            feature_group_count: 1,
        }
    }
    /// Set the window strides.
    pub fn with_strides(mut self, strides: &[usize]) -> Self {
        self.strides = strides.to_vec();
        self
    }
    /// Set the padding.
    pub fn with_padding(mut self, padding: ConvPadding) -> Self {
        self.padding = padding;
        self
    }
    /// Set the kernel (rhs, "atrous") dilation.
    pub fn with_rhs_dilation(mut self, dilation: &[usize]) -> Self {
        self.rhs_dilation = dilation.to_vec();
        self
    }
    /// Set the input (lhs, "transposed conv") dilation.
    pub fn with_lhs_dilation(mut self, dilation: &[usize]) -> Self {
        self.lhs_dilation = dilation.to_vec();
        self
    }
    /// Set the layouts, e.g. `("NHWC", "HWIO", "NHWC")`.
    pub fn with_dimension_numbers(mut self, lhs: &str, rhs: &str, out: &str) -> Self {
        self.dimension_numbers = Some(ConvDimensionNumbers {
            lhs: lhs.to_string(),
            rhs: rhs.to_string(),
            out: out.to_string(),
        });
        self
    }
    /// Set the number of feature groups.
    pub fn with_groups(mut self, groups: usize) -> Self {
        self.feature_group_count = groups;
        self
    }
}
