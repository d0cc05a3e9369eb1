//! braintrace's `Conv1d`, `Conv2d` and `Conv3d` on `etp_conv`, in
//! brainstate's layouts: channel-last input by default (`N W C`, `N H W C`,
//! `N D H W C`), the kernel `(k.., in/groups, out)`, SAME padding.

use super::check_size;
use crate::error::{Error, Result};
use crate::learn::{join_path, Init, Model, StepCtx};
use crate::nn::init::Initializer;
use crate::nn::layers::{draw, layer_op};
use crate::ops::{ConvPadding, ConvParams};
use crate::prims::{conv, Transforms};
use crate::tensor::Tensor;

/// The convolution behind [`Conv1d`], [`Conv2d`] and [`Conv3d`]:
/// `y = conv(x, W) (+ b)` through `etp_conv`. One parameter state
/// `<path>/weight` with the leaves `weight` (kernel `(k.., in/groups,
/// out)`, Xavier normal) and, with a bias initialiser, `bias` (`(1.., out)`
/// channel-last, `(1, out, 1..)` channel-first, as brainstate shapes it;
/// braintrace's default is no bias).
///
/// Not supported: braintrace's `w_mask` for convolutions (it multiplies
/// the kernel outside the primitive); feature groups (`groups > 1`) work
/// forward and with pp_prop, but D-RTRL's per-position trace of `etp_conv`
/// refuses them at compile time.
#[derive(Clone, Debug)]
pub struct ConvLayer {
    /// The layer's path.
    pub path: String,
    /// braintrace's class name (`Conv1d`, ...), for errors.
    pub name: &'static str,
    /// The per-sample input shape: `(spatial.., C)` (or `(C, spatial..)`
    /// when channel-first).
    pub in_size: Vec<usize>,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel size per spatial axis.
    pub kernel_size: Vec<usize>,
    /// Strides (default 1).
    pub stride: Vec<usize>,
    /// Padding (default SAME).
    pub padding: ConvPadding,
    /// Input dilation (default 1).
    pub lhs_dilation: Vec<usize>,
    /// Kernel dilation (default 1).
    pub rhs_dilation: Vec<usize>,
    /// Feature groups (default 1).
    pub groups: usize,
    /// Channel-first layout (default channel-last, as brainstate's).
    pub channel_first: bool,
    /// Kernel initialiser (`None`: braintools' `XavierNormal` over the
    /// kernel's fans, `N(0, 2 / (fan_in + fan_out))`).
    pub w_init: Option<Initializer>,
    /// Bias initialiser (`None`: no bias, braintrace's default).
    pub b_init: Option<Initializer>,
}

impl ConvLayer {
    fn new(
        name: &'static str,
        d: usize,
        path: &str,
        in_size: &[usize],
        out_channels: usize,
        kernel_size: &[usize],
    ) -> Result<Self> {
        if kernel_size.len() != d {
            return Err(Error::invalid(
                layer_op(name, path),
                format!("kernel_size must have {d} entries, got {kernel_size:?}"),
            ));
        }
        let l = ConvLayer {
            path: path.to_string(),
            name,
            in_size: in_size.to_vec(),
            out_channels,
            kernel_size: kernel_size.to_vec(),
            stride: vec![1; d],
            padding: ConvPadding::Same,
            lhs_dilation: vec![1; d],
            rhs_dilation: vec![1; d],
            groups: 1,
            channel_first: false,
            w_init: None,
            b_init: None,
        };
        l.checked()
    }

    /// The number of spatial axes.
    pub fn spatial_dims(&self) -> usize {
        self.kernel_size.len()
    }
    /// Input channels.
    pub fn in_channels(&self) -> usize {
        let i = if self.channel_first {
            0
        } else {
            self.spatial_dims()
        };
        self.in_size.get(i).copied().unwrap_or(0)
    }
    fn spatial_in(&self) -> &[usize] {
        let d = self.spatial_dims().min(self.in_size.len());
        if self.channel_first {
            self.in_size.get(1..).unwrap_or(&[])
        } else {
            &self.in_size[..d]
        }
    }
    /// The kernel's shape `(k.., in/groups, out)`.
    pub fn kernel_shape(&self) -> Vec<usize> {
        let mut s = self.kernel_size.clone();
        s.push(self.in_channels() / self.groups.max(1));
        s.push(self.out_channels);
        s
    }
    /// The bias's shape (brainstate's `_bias_shape`).
    pub fn bias_shape(&self) -> Vec<usize> {
        let d = self.spatial_dims();
        if self.channel_first {
            [&[1, self.out_channels][..], &vec![1; d]].concat()
        } else {
            [&vec![1; d][..], &[self.out_channels]].concat()
        }
    }
    /// The per-sample output shape (`(spatial.., out)`, or channel-first).
    pub fn out_size(&self) -> Vec<usize> {
        let sp: Vec<usize> = (0..self.spatial_dims())
            .map(|i| self.out_len(i).unwrap_or(0))
            .collect();
        if self.channel_first {
            [&[self.out_channels][..], &sp].concat()
        } else {
            [&sp[..], &[self.out_channels]].concat()
        }
    }
    fn out_len(&self, i: usize) -> Option<usize> {
        let l = self.spatial_in().get(i)?.checked_sub(1)? * self.lhs_dilation.get(i)? + 1;
        let k = self.kernel_size.get(i)?.checked_sub(1)? * self.rhs_dilation.get(i)? + 1;
        let s = *self.stride.get(i).filter(|&&s| s > 0)?;
        match &self.padding {
            ConvPadding::Same => Some(l.div_ceil(s)),
            ConvPadding::Valid => l.checked_sub(k).map(|r| r / s + 1),
            ConvPadding::Explicit(p) => {
                let (lo, hi) = p.get(i).copied()?;
                let lp = l as i64 + lo + hi - k as i64;
                (lp >= 0).then(|| lp as usize / s + 1)
            }
        }
    }
    /// The kernel initialiser (the default: Xavier normal over the fans).
    pub fn kernel_init(&self) -> Initializer {
        let rf: usize = self.kernel_size.iter().product();
        let fan_in = rf * self.in_channels() / self.groups.max(1);
        let fan_out = rf * self.out_channels;
        self.w_init.unwrap_or(Initializer::Normal {
            std: (2.0 / (fan_in + fan_out).max(1) as f64).sqrt(),
        })
    }
    /// Check the hyperparameters together.
    fn checked(self) -> Result<Self> {
        let op = layer_op(self.name, &self.path);
        let d = self.spatial_dims();
        if d == 0 || self.in_size.len() != d + 1 {
            return Err(Error::invalid(
                &op,
                format!(
                    "in_size must have {} entries ({d} spatial and the channels), got {:?}",
                    d + 1,
                    self.in_size
                ),
            ));
        }
        for (i, &n) in self.in_size.iter().enumerate() {
            check_size(self.name, &format!("in_size[{i}]"), n)?;
        }
        for (i, &n) in self.kernel_size.iter().enumerate() {
            check_size(self.name, &format!("kernel_size[{i}]"), n)?;
        }
        check_size(self.name, "out_channels", self.out_channels)?;
        for (what, v) in [
            ("stride", &self.stride),
            ("lhs_dilation", &self.lhs_dilation),
            ("rhs_dilation", &self.rhs_dilation),
        ] {
            if v.len() != d || v.contains(&0) {
                return Err(Error::invalid(
                    &op,
                    format!("{what} must be {d} positive entries, got {v:?}"),
                ));
            }
        }
        if let ConvPadding::Explicit(p) = &self.padding {
            if p.len() != d {
                return Err(Error::invalid(
                    &op,
                    format!("padding must have {d} (lo, hi) pairs, got {p:?}"),
                ));
            }
        }
        let g = self.groups;
        if g == 0 || !self.in_channels().is_multiple_of(g) || !self.out_channels.is_multiple_of(g) {
            return Err(Error::invalid(
                &op,
                format!(
                    "groups = {g} must be positive and divide in_channels = {} and out_channels = {}",
                    self.in_channels(),
                    self.out_channels
                ),
            ));
        }
        if (0..d).any(|i| self.out_len(i).is_none_or(|n| n == 0)) {
            return Err(Error::invalid(
                &op,
                format!(
                    "the kernel {:?} (dilation {:?}) does not fit the input {:?} with padding {:?}",
                    self.kernel_size, self.rhs_dilation, self.in_size, self.padding
                ),
            ));
        }
        Ok(self)
    }
    /// The parameter state's path (`<path>/weight`).
    pub fn state_path(&self) -> String {
        join_path(&self.path, "weight")
    }
    /// The key of leaf `leaf` (`weight`, `bias`).
    pub fn key(&self, leaf: &str) -> String {
        join_path(&self.state_path(), leaf)
    }
    /// The `etp_conv` settings.
    pub fn conv_params(&self) -> ConvParams {
        let sp = &"DHW"[3 - self.spatial_dims().min(3)..];
        let lhs = if self.channel_first {
            format!("NC{sp}")
        } else {
            format!("N{sp}C")
        };
        let rhs = format!("{sp}IO");
        ConvParams::default_for(self.spatial_dims())
            .with_strides(&self.stride)
            .with_padding(self.padding.clone())
            .with_lhs_dilation(&self.lhs_dilation)
            .with_rhs_dilation(&self.rhs_dilation)
            .with_groups(self.groups)
            .with_dimension_numbers(&lhs, &rhs, &lhs)
    }
}

impl Model for ConvLayer {
    fn init(&self, init: &mut Init) -> Result<()> {
        // The fields are public: check them again.
        self.clone().checked()?;
        let op = layer_op(self.name, &self.path);
        let w = draw(
            init,
            &op,
            "weight",
            &self.kernel_init(),
            &self.kernel_shape(),
        )?;
        init.param(&self.state_path(), Some("weight"), w)?;
        if let Some(b) = &self.b_init {
            let b = draw(init, &op, "bias", b, &self.bias_shape())?;
            init.param(&self.state_path(), Some("bias"), b)?;
        }
        Ok(())
    }
    fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
        let r = self.in_size.len();
        let batched = x.ndim() == r + 1;
        if !(batched || x.ndim() == r) || x.shape()[x.ndim() - r..] != self.in_size[..] {
            return Err(Error::shapes(
                layer_op(self.name, &self.path),
                [x.shape(), &self.in_size[..]],
                "the input (first) must be the layer's in_size (second), with or without a leading batch axis",
            ));
        }
        let xb = if batched {
            x.clone()
        } else {
            x.expand_dims(0)?
        };
        let w = ctx.param(&self.key("weight"))?;
        let b = match self.b_init {
            Some(_) => Some(ctx.param(&self.key("bias"))?),
            None => None,
        };
        let y = conv(
            &xb,
            &w,
            b.as_ref(),
            &self.conv_params(),
            &Transforms::default(),
        )?;
        if batched {
            Ok(y)
        } else {
            y.squeeze(&[0])
        }
    }
}

macro_rules! conv_nd {
    ($name:ident, $d:expr, $doc:expr) => {
        #[doc = $doc]
        ///
        /// See [`ConvLayer`] for the equation, keys and what is not supported.
        #[derive(Clone, Debug)]
        pub struct $name(pub ConvLayer);

        impl $name {
            /// A layer over inputs of per-sample shape `in_size` (`(spatial..,
            /// C)`), with `out_channels` and `kernel_size` per spatial axis;
            /// stride 1, SAME padding, no bias (braintrace's defaults).
            pub fn new(
                path: &str,
                in_size: &[usize],
                out_channels: usize,
                kernel_size: &[usize],
            ) -> Result<Self> {
                ConvLayer::new(
                    stringify!($name),
                    $d,
                    path,
                    in_size,
                    out_channels,
                    kernel_size,
                )
                .map($name)
            }
            /// With strides (one per spatial axis, positive).
            pub fn with_stride(mut self, stride: &[usize]) -> Result<Self> {
                self.0.stride = stride.to_vec();
                self.0.checked().map($name)
            }
            /// With a padding (`Same`, `Valid` or explicit pairs).
            pub fn with_padding(mut self, padding: ConvPadding) -> Result<Self> {
                self.0.padding = padding;
                self.0.checked().map($name)
            }
            /// With a kernel dilation (braintrace's `rhs_dilation`).
            pub fn with_rhs_dilation(mut self, dilation: &[usize]) -> Result<Self> {
                self.0.rhs_dilation = dilation.to_vec();
                self.0.checked().map($name)
            }
            /// With an input dilation (braintrace's `lhs_dilation`).
            pub fn with_lhs_dilation(mut self, dilation: &[usize]) -> Result<Self> {
                self.0.lhs_dilation = dilation.to_vec();
                self.0.checked().map($name)
            }
            /// With feature groups (dividing both channel counts).
            pub fn with_groups(mut self, groups: usize) -> Result<Self> {
                self.0.groups = groups;
                self.0.checked().map($name)
            }
            /// Channel-first: `in_size` is `(C, spatial..)`.
            pub fn channel_first(mut self) -> Result<Self> {
                self.0.channel_first = true;
                self.0.checked().map($name)
            }
            /// With a bias leaf drawn by `b_init`.
            pub fn with_bias(mut self, b_init: Initializer) -> Self {
                self.0.b_init = Some(b_init);
                self
            }
            /// With another kernel initialiser.
            pub fn with_init(mut self, w_init: Initializer) -> Self {
                self.0.w_init = Some(w_init);
                self
            }
            /// The per-sample output shape.
            pub fn out_size(&self) -> Vec<usize> {
                self.0.out_size()
            }
            /// The key of leaf `leaf` (`weight`, `bias`).
            pub fn key(&self, leaf: &str) -> String {
                self.0.key(leaf)
            }
        }

        impl Model for $name {
            fn init(&self, init: &mut Init) -> Result<()> {
                self.0.init(init)
            }
            fn step(&self, ctx: &mut StepCtx, x: &Tensor) -> Result<Tensor> {
                self.0.step(ctx, x)
            }
        }
    };
}

conv_nd!(
    Conv1d,
    1,
    "braintrace's `nn.Conv1d`: input `(B?, W, C)`, kernel `(k, C/groups, out)`."
);
conv_nd!(
    Conv2d,
    2,
    "braintrace's `nn.Conv2d`: input `(B?, H, W, C)`, kernel `(kh, kw, C/groups, out)`."
);
conv_nd!(
    Conv3d,
    3,
    "braintrace's `nn.Conv3d`: input `(B?, D, H, W, C)`, kernel `(kd, kh, kw, C/groups, out)`."
);
