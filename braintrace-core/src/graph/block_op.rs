//! The element-wise ops whose block kernels the fused executor calls
//! directly: an [`Elementwise`](super::Elementwise) kernel that computes
//! one of them says which through
//! [`Elementwise::block_op`](super::Elementwise::block_op), so the planner
//! asks the primitive instead of checking its type. The ops' kernels and
//! rules live with the core ops (`crate::ops`), which re-export these types.

/// Unary element-wise functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `e^x`
    Exp,
    /// natural log
    Log,
    /// `tanh x`
    Tanh,
    /// logistic sigmoid
    Sigmoid,
    /// `max(x, 0)`
    Relu,
    /// square root
    Sqrt,
    /// absolute value
    Abs,
    /// sine
    Sin,
    /// cosine
    Cos,
    /// `x*x`
    Square,
    /// `1/x`
    Reciprocal,
    /// `log(1 + e^x)`
    Softplus,
    /// Heaviside step `1[x > 0]` as a float (zero derivative); also the derivative of relu.
    Step,
    /// sign of x (zero derivative)
    Sign,
    /// arctangent
    Atan,
    /// the error function `erf x = 2/√π ∫₀ˣ e^{−t²} dt` (exact GELU)
    Erf,
}

/// Binary element-wise functions on operands of equal shape and dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
    /// element-wise maximum
    Max,
    /// element-wise minimum
    Min,
    /// `a ^ b`
    Pow,
}

/// Ops of a tensor and a static scalar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalarOp {
    /// `x + s`
    Add,
    /// `x * s`
    Mul,
    /// `x / s` (a true division: `x * (1/s)` overflows for a subnormal `s`)
    Div,
    /// `s - x`
    RSub,
    /// `s / x`
    RDiv,
    /// `x ^ s`
    Pow,
    /// `max(x, s)`
    Max,
    /// `min(x, s)`
    Min,
}

/// Which surrogate derivative a [`spike`](fn@crate::ops::spike) uses in its JVP.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Surrogate {
    /// `g(u) = alpha/2 / (1 + (π/2 · alpha · u)²)`, the derivative of
    /// `atan(π/2 · alpha · u)/π + 1/2`.
    Arctan {
        /// Sharpness (`2` gives `1/(1+(πu)²)`).
        alpha: f64,
    },
    /// `g(u) = alpha · σ(alpha u) (1 − σ(alpha u))`, the derivative of `σ(alpha u)`.
    Sigmoid {
        /// Sharpness.
        alpha: f64,
    },
    /// `g(u) = max(alpha·width − alpha·|u|, 0)`: a triangle of half-width
    /// `width` and height `alpha·width`.
    ReluGrad {
        /// Slope of the triangle's sides.
        alpha: f64,
        /// Half-width of the support.
        width: f64,
    },
    /// `g(u) = alpha − alpha²·|u|` on `|u| ≤ 1/alpha`, 0 outside
    /// (braintools' `PiecewiseQuadratic`, default `alpha = 1`).
    PiecewiseQuadratic {
        /// Sharpness: the support is `|u| ≤ 1/alpha`.
        alpha: f64,
    },
    /// `g(u) = alpha/2 · exp(−alpha·|u|)` (braintools' `PiecewiseExp`,
    /// default `alpha = 1`).
    PiecewiseExp {
        /// Sharpness.
        alpha: f64,
    },
    /// `g(u) = alpha/2 / (1 + alpha·|u|)²`, the derivative of
    /// `u / (2/alpha + 2|u|) + 1/2` (braintools' `SoftSign`, default 1).
    SoftSign {
        /// Sharpness.
        alpha: f64,
    },
    /// `g(u) = alpha/√π · exp(−alpha² u²)`, the derivative of
    /// `(1 + erf(alpha u))/2` (braintools' `ERF`, default `alpha = 1`).
    Erf {
        /// Sharpness.
        alpha: f64,
    },
    /// `g(u) = alpha · N(u; 0, sigma)`, a normal density (braintools'
    /// `GaussianGrad`, defaults `sigma = 0.5`, `alpha = 0.5`).
    Gaussian {
        /// Width of the bell.
        sigma: f64,
        /// Height factor.
        alpha: f64,
    },
    /// `g(u) = scale · ((1 + h)·N(u; 0, σ) − h·N(u; σ, sσ) − h·N(u; −σ, sσ))`
    /// (braintools' `MultiGaussianGrad`, defaults `h = 0.15`, `s = 6`,
    /// `sigma = 0.5`, `scale = 0.5`).
    MultiGaussian {
        /// Weight of the two negative side bells.
        h: f64,
        /// Width of the side bells relative to `sigma`.
        s: f64,
        /// Width of the centre bell (and the side bells' offset).
        sigma: f64,
        /// Overall factor.
        scale: f64,
    },
    /// `g(u) = 1 / (alpha·|u| + 1)²` (braintools' `InvSquareGrad`, default
    /// `alpha = 100`).
    InvSquare {
        /// Sharpness.
        alpha: f64,
    },
    /// `g(u) = exp(−alpha·|u|)` (braintools' `SlayerGrad`, default 1).
    Slayer {
        /// Sharpness.
        alpha: f64,
    },
    /// `g(u) = alpha` for `u < 0`, `beta` otherwise: the derivative of a
    /// leaky ReLU (braintools' `LeakyRelu`, defaults `alpha = 0.1`,
    /// `beta = 1`).
    LeakyRelu {
        /// Slope left of zero.
        alpha: f64,
        /// Slope from zero on.
        beta: f64,
    },
    /// `g(u) = (1 + 2/(alpha + 1)·|u|)^(−alpha)`, a heavy tail
    /// (braintools' `QPseudoSpike`, default `alpha = 2`).
    QPseudoSpike {
        /// Tail exponent.
        alpha: f64,
    },
}

/// A core element-wise op with its static parameters: what a fused loop
/// runs for an equation whose [`Elementwise`](super::Elementwise) kernel is
/// one of them (see [`Elementwise::block_op`](super::Elementwise::block_op)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlockOp {
    /// A unary op.
    Unary(UnaryOp),
    /// A binary op on operands of one shape.
    Binary(BinaryOp),
    /// An op of the operand and a static scalar.
    Scalar(ScalarOp, f64),
    /// A spike's surrogate derivative `g(u)`.
    Surrogate(Surrogate),
}
