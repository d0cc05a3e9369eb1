"""Type stubs of the native module (PyO3) that ``braintrace_rs`` wraps."""

from os import PathLike
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

ArrayLike = Union[npt.NDArray[np.float32], npt.NDArray[np.float64], "Tensor"]
Number = Union[int, float]
Operand = Union[ArrayLike, Number]
Arrays = Dict[str, np.ndarray]

class Tensor:
    """A tensor: concrete data, or a symbolic value while a step or loss is traced."""

    def __init__(self, array: ArrayLike) -> None: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def ndim(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def is_symbolic(self) -> bool: ...
    def numpy(self) -> np.ndarray: ...
    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray: ...
    def item(self) -> float: ...
    def __len__(self) -> int: ...
    def __add__(self, o: Operand) -> Tensor: ...
    def __radd__(self, o: Operand) -> Tensor: ...
    def __sub__(self, o: Operand) -> Tensor: ...
    def __rsub__(self, o: Operand) -> Tensor: ...
    def __mul__(self, o: Operand) -> Tensor: ...
    def __rmul__(self, o: Operand) -> Tensor: ...
    def __truediv__(self, o: Operand) -> Tensor: ...
    def __rtruediv__(self, o: Operand) -> Tensor: ...
    def __pow__(self, o: Operand, m: Any = None) -> Tensor: ...
    def __neg__(self) -> Tensor: ...
    def __matmul__(self, o: ArrayLike) -> Tensor: ...
    def exp(self) -> Tensor: ...
    def log(self) -> Tensor: ...
    def tanh(self) -> Tensor: ...
    def sigmoid(self) -> Tensor: ...
    def relu(self) -> Tensor: ...
    def softplus(self) -> Tensor: ...
    def square(self) -> Tensor: ...
    def sqrt(self) -> Tensor: ...
    def abs(self) -> Tensor: ...
    def sin(self) -> Tensor: ...
    def cos(self) -> Tensor: ...
    def reciprocal(self) -> Tensor: ...
    def sum_all(self) -> Tensor: ...
    def mean_all(self) -> Tensor: ...
    def stop_gradient(self) -> Tensor: ...
    def maximum(self, o: Operand) -> Tensor: ...
    def minimum(self, o: Operand) -> Tensor: ...
    def sum(self, axis: Union[int, Sequence[int], None] = None) -> Tensor: ...
    def mean(self, axis: Union[int, Sequence[int], None] = None) -> Tensor: ...
    def reshape(self, shape: Sequence[int]) -> Tensor: ...
    def transpose(self, axes: Optional[Sequence[int]] = None) -> Tensor: ...
    def expand_dims(self, axis: int) -> Tensor: ...
    def squeeze(self, axis: Union[int, Sequence[int]]) -> Tensor: ...
    def slice_axis(self, axis: int, start: int, end: int) -> Tensor: ...
    def index(self, i: int) -> Tensor: ...
    def astype(self, dtype: str) -> Tensor: ...
    def spike(self) -> Tensor: ...

class Init:
    """What a model declares in ``init``; valid only during that call."""

    @property
    def dtype(self) -> str: ...
    def param(self, path: str, value: ArrayLike, leaf: Optional[str] = None) -> None: ...
    def hidden(self, path: str, shape: Sequence[int]) -> None: ...
    def draw(self, initializer: str, shape: Sequence[int], scale: Optional[float] = None) -> Tensor:
        """Initial values of ``shape`` from the seeded generator: ``zeros``,
        ``constant``, ``kaiming_normal``, ``orthogonal``, ``normal``, and
        brainstate's ``xavier_normal``, ``xavier_uniform``,
        ``kaiming_uniform``, ``kaiming_truncated_normal``, ``lecun_normal``,
        ``lecun_uniform`` (``scale``: the variance numerator),
        ``truncated_normal`` (std), ``uniform`` (``[0, scale)``), ``identity``."""

class StepCtx:
    """What ``step`` reads and writes; valid during the traced call."""

    def param(self, key: str) -> Tensor: ...
    def hidden(self, path: str) -> Tensor: ...
    def set_hidden(self, path: str, value: Tensor) -> None: ...

class Layer:
    """A native layer (or sequence) of braintrace-rs."""

    def init(self, init: Init) -> None: ...
    def step(self, ctx: StepCtx, x: ArrayLike) -> Tensor: ...
    @property
    def training(self) -> bool:
        """A ``Dropout`` layer's mode (others raise ``ValueError``); a learner
        keeps the mode the layer had when it was compiled."""
    @training.setter
    def training(self, on: bool) -> None: ...
    @staticmethod
    def linear(
        in_size: int,
        out_size: int,
        name: str,
        bias: bool = True,
        w_init: Optional[Tuple[str, Optional[float]]] = None,
        weight_fn: Optional[str] = None,
        w_mask: Optional[ArrayLike] = None,
    ) -> Layer: ...
    @staticmethod
    def gru_cell(in_size: int, out_size: int, name: str) -> Layer: ...
    @staticmethod
    def lif(in_size: int, out_size: int, beta: float, gamma: float, v_th: float, name: str) -> Layer: ...
    @staticmethod
    def leaky_rate_readout(
        in_size: int, out_size: int, name: str, tau: float = 5.0, dt: float = 1.0, decay: Optional[float] = None
    ) -> Layer: ...
    @staticmethod
    def exp_synapse(size: int, name: str, tau: float, dt: float) -> Layer: ...
    @staticmethod
    def element_wise(shape: Sequence[int], name: str, weight_fn: Optional[str] = None) -> Layer: ...
    @staticmethod
    def sequential(models: Sequence[Any]) -> Layer: ...
    @staticmethod
    def rnn_cell(kind: str, in_size: int, out_size: int, name: str) -> Layer: ...
    @staticmethod
    def spiking(
        kind: str, size: int, name: str, tau: float, tau2: float = 0.0, u: float = 0.0, dt: float = 1.0
    ) -> Layer: ...
    # The layers of issue 36 (``braintrace_rs.nn`` wraps them by class name).
    @staticmethod
    def activation(kind: str, **params: Any) -> Layer:
        """An activation by brainstate's class name (``ReLU``, ``GELU``, ...)
        with its hyperparameters as keywords."""
    @staticmethod
    def prelu(num_parameters: int, name: str, init: float = 0.25) -> Layer:
        """brainstate's ``PReLU`` (bare parameter ``name/weight``)."""
    @staticmethod
    def norm(
        kind: str,
        features: int,
        name: str,
        eps: float = 1e-6,
        num_groups: int = 1,
        use_scale: bool = True,
        use_bias: bool = True,
    ) -> Layer:
        """``LayerNorm``, ``RMSNorm`` or ``GroupNorm`` over the last axis."""
    @staticmethod
    def dropout(prob: float, seed: int = 0) -> Layer:
        """brainstate's ``Dropout`` (keep probability ``prob``), training
        until ``training`` is set off."""
    @staticmethod
    def pool(
        kind: str, kernel_size: Sequence[int], stride: Optional[Sequence[int]] = None, padding: int = 0
    ) -> Layer:
        """``MaxPool1d``, ``MaxPool2d``, ``AvgPool1d`` or ``AvgPool2d``."""
    @staticmethod
    def flatten(in_rank: int, start_axis: int = 0, end_axis: int = -1) -> Layer:
        """brainstate's ``Flatten`` of a sample of rank ``in_rank``."""
    @staticmethod
    def unflatten(axis: int, sizes: Sequence[int]) -> Layer:
        """brainstate's ``Unflatten``."""
    @staticmethod
    def signed_w_linear(
        in_size: int,
        out_size: int,
        name: str,
        w_sign: Optional[ArrayLike] = None,
        w_init: Optional[Tuple[str, Optional[float]]] = None,
    ) -> Layer:
        """braintrace's ``SignedWLinear`` (bare weight ``name/weight``)."""
    @staticmethod
    def scaled_ws_linear(
        in_size: int,
        out_size: int,
        name: str,
        bias: bool = True,
        ws_gain: bool = True,
        eps: float = 1e-4,
        w_mask: Optional[ArrayLike] = None,
        w_init: Optional[Tuple[str, Optional[float]]] = None,
    ) -> Layer:
        """braintrace's ``ScaledWSLinear`` (``name/weight``: ``weight``, ``bias``, ``gain``)."""
    @staticmethod
    def sparse_linear(
        spar_mat: ArrayLike, name: str, b_init: Optional[Tuple[str, Optional[float]]] = None
    ) -> Layer:
        """braintrace's ``SparseLinear`` on the non-zeros of a dense array."""
    @staticmethod
    def lora(
        in_features: int,
        lora_rank: int,
        out_features: int,
        name: str,
        kernel_init: Optional[Tuple[str, Optional[float]]] = None,
    ) -> Layer:
        """braintrace's ``LoRA`` without a base module (``lora_a``, ``lora_b``)."""
    @staticmethod
    def conv(
        dims: int,
        in_size: Sequence[int],
        out_channels: int,
        kernel_size: Sequence[int],
        name: str,
        stride: Sequence[int],
        padding: Union[str, int, Sequence[Tuple[int, int]]],
        lhs_dilation: Sequence[int],
        rhs_dilation: Sequence[int],
        groups: int = 1,
        w_init: Optional[Tuple[str, Optional[float]]] = None,
        b_init: Optional[Tuple[str, Optional[float]]] = None,
        channel_first: bool = False,
    ) -> Layer:
        """braintrace's ``Conv1d``/``Conv2d``/``Conv3d`` (``dims`` spatial axes)."""
    @staticmethod
    def grouped_linear(
        num_groups: int,
        in_features: int,
        out_features: int,
        name: str,
        bias: bool = True,
        w_init: Optional[Tuple[str, Optional[float]]] = None,
    ) -> Layer:
        """braintrace's ``GroupedLinear`` (``weight`` ``(G, K, N)``, ``bias`` ``(G, N)``)."""
    @staticmethod
    def embedding(num_embeddings: int, embedding_size: int, name: str) -> Layer:
        """braintrace's ``Embedding`` (bare table ``name/weight``)."""

class Algorithm:
    """An online learning algorithm with its options."""

    @property
    def name(self) -> str: ...
    @property
    def vjp_method(self) -> str: ...
    @property
    def non_temporal(self) -> str: ...
    @property
    def modulator(self) -> float: ...
    def set_modulator(self, modulator: float) -> None: ...

DecayOrRank = Union[float, int]

def D_RTRL(
    vjp_method: str = "single-step",
    non_temporal: str = "zero",
    fast_paths: bool = True,
    in_step_paths: str = "twice",
) -> Algorithm: ...
def pp_prop(
    decay_or_rank: Union[DecayOrRank, Tuple[DecayOrRank, DecayOrRank]],
    vjp_method: str = "single-step",
    non_temporal: str = "zero",
    fast_paths: bool = True,
    in_step_paths: str = "twice",
) -> Algorithm: ...
def EProp(
    feedback: str = "symmetric",
    kappa_filter_decay: float = 0.0,
    random_feedback_key: Optional[int] = None,
    vjp_method: str = "single-step",
    non_temporal: str = "zero",
    fast_paths: bool = True,
    feedback_matrices: Optional[Dict[int, ArrayLike]] = None,
) -> Algorithm: ...
def OSTLRecurrent(vjp_method: str = "single-step", non_temporal: str = "zero", fast_paths: bool = True) -> Algorithm: ...
def OSTLFeedforward(
    decay_or_rank: Optional[DecayOrRank] = None, vjp_method: str = "single-step", non_temporal: str = "zero"
) -> Algorithm: ...
def ThreeFactor(
    modulator: float = 1.0, vjp_method: str = "single-step", non_temporal: str = "zero", fast_paths: bool = True
) -> Algorithm: ...
def SnAp(n: Optional[int] = None, vjp_method: str = "single-step", non_temporal: str = "zero") -> Algorithm: ...
def UORO(
    seed: int = 42,
    projection_eps: float = 1e-12,
    vjp_method: str = "multi-step",
    non_temporal: str = "zero",
    draws: Optional[Sequence[Sequence[ArrayLike]]] = None,
) -> Algorithm: ...
def RandomProjection(
    seed: int = 42,
    projection_eps: float = 1e-12,
    vjp_method: str = "multi-step",
    non_temporal: str = "zero",
    draws: Optional[Sequence[Sequence[ArrayLike]]] = None,
) -> Algorithm: ...

class ETraceConfig:
    """An online learning rule by its axes (braintrace's ``ETraceConfig``)."""

    def __init__(
        self,
        trace_factorization: str = "per_param",
        recurrence_scope: str = "diagonal",
        learning_signal: str = "symmetric",
        trace_filter: str = "none",
        decay: Union[float, Tuple[float, float], None] = None,
        kappa: Optional[float] = None,
        sparse_n: Optional[int] = None,
        random_feedback_key: Optional[int] = None,
        non_temporal: str = "zero",
    ) -> None: ...
    @property
    def trace_factorization(self) -> str: ...
    @property
    def recurrence_scope(self) -> str: ...
    @property
    def sparse_n(self) -> Optional[int]: ...
    @property
    def learning_signal(self) -> str: ...
    @property
    def trace_filter(self) -> str: ...
    @property
    def kappa(self) -> Optional[float]: ...
    @property
    def decay(self) -> Optional[Tuple[float, float]]: ...
    def algorithm(self) -> Algorithm: ...

Loss = Union[str, Callable[..., Any]]

class Learner:
    """A model compiled for online learning."""

    def update(self, x: ArrayLike) -> np.ndarray: ...
    def etrace_grad(
        self,
        xs: ArrayLike,
        ys: Union[ArrayLike, Sequence[ArrayLike]],
        loss: Optional[Loss] = None,
        reduction: str = "mean",
        *,
        mask: Optional[ArrayLike] = None,
        weights: Union[Sequence[float], ArrayLike, None] = None,
        chunk_size: Optional[int] = None,
        return_outputs: bool = False,
        has_aux: bool = False,
        loss_output: str = "per_step",
    ) -> Tuple[Any, ...]: ...
    def evolve(
        self, xs: ArrayLike, chunk_size: Optional[int] = None, return_outputs: bool = False
    ) -> Optional[np.ndarray]: ...
    def evaluate(self, xs: ArrayLike) -> np.ndarray: ...
    def etrace_of(self, weight_key: str) -> list[np.ndarray]: ...
    @property
    def modulator(self) -> float: ...
    def set_modulator(self, modulator: float) -> None: ...
    def reset_state(self, batch_size: Optional[int] = None) -> None: ...
    def explain(self) -> str: ...
    @property
    def running_index(self) -> int: ...
    @property
    def non_finite(self) -> str: ...
    @non_finite.setter
    def non_finite(self, policy: str) -> None: ...
    @property
    def skipped(self) -> int: ...
    @property
    def batch_size(self) -> Optional[int]: ...
    @property
    def dtype(self) -> str: ...
    def param_keys(self) -> list[str]: ...
    def params(self) -> Arrays: ...
    def set_params(self, params: Dict[str, ArrayLike]) -> None: ...
    def hidden(self) -> Arrays: ...
    def set_hidden(self, path: str, value: ArrayLike) -> None: ...
    def forward(self, xs: ArrayLike) -> np.ndarray: ...
    def save(self, path: Union[str, PathLike[str]]) -> None: ...
    def load(self, path: Union[str, PathLike[str]]) -> None: ...

def compile(
    model: Any,
    algorithm: Union[Algorithm, ETraceConfig, str],
    example_input: ArrayLike,
    batch_size: Optional[int] = None,
    dtype: Optional[str] = None,
    seed: int = 0,
    params: Optional[Dict[str, ArrayLike]] = None,
) -> Learner: ...

class SGD:
    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None: ...
    def step(self, learner: Learner, grads: Dict[str, ArrayLike]) -> None: ...

class Adam:
    def __init__(self, lr: float, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None: ...
    def step(self, learner: Learner, grads: Dict[str, ArrayLike]) -> None: ...

def clip_grad_norm(grads: Dict[str, ArrayLike], max_norm: float) -> Tuple[Arrays, float]: ...
Optimizer = Union[SGD, Adam]

def save_checkpoint(
    learner: Learner,
    path: Union[str, PathLike[str]],
    optimizer: Optional[Optimizer] = None,
    counters: Optional[Dict[str, int]] = None,
) -> None: ...
def checkpoint_bytes(
    learner: Learner, optimizer: Optional[Optimizer] = None, counters: Optional[Dict[str, int]] = None
) -> bytes: ...
def restore_checkpoint(
    learner: Learner, path: Union[str, PathLike[str]], optimizer: Optional[Optimizer] = None
) -> Dict[str, int]: ...
def restore_checkpoint_bytes(
    learner: Learner, data: bytes, optimizer: Optional[Optimizer] = None
) -> Dict[str, int]: ...
def load_checkpoint(path: Union[str, PathLike[str]]) -> Dict[str, Any]: ...
def save_safetensors(path: Union[str, PathLike[str]], tensors: Dict[str, ArrayLike]) -> None: ...
def load_safetensors(path: Union[str, PathLike[str]]) -> Arrays: ...
def tensor(array: ArrayLike) -> Tensor: ...
def etp_mm(
    x: ArrayLike,
    weight: ArrayLike,
    bias: Optional[ArrayLike] = None,
    weight_fn: Optional[str] = None,
    bias_fn: Optional[str] = None,
) -> Tensor: ...
def etp_elemwise(weight: ArrayLike, weight_fn: Optional[str] = None) -> Tensor: ...
def etp_sp_mm(
    x: ArrayLike,
    weight: ArrayLike,
    sparse_mat: Any,
    bias: Optional[ArrayLike] = None,
    weight_fn: Optional[str] = None,
    bias_fn: Optional[str] = None,
) -> Tensor: ...
def etp_lora_mm(
    x: ArrayLike,
    B: ArrayLike,
    A: ArrayLike,
    alpha: float = 1.0,
    bias: Optional[ArrayLike] = None,
    b_fn: Optional[str] = None,
    a_fn: Optional[str] = None,
    bias_fn: Optional[str] = None,
) -> Tensor: ...
def etp_conv(
    x: ArrayLike,
    kernel: ArrayLike,
    bias: Optional[ArrayLike] = None,
    strides: Optional[Sequence[int]] = None,
    padding: Union[str, Sequence[Tuple[int, int]], None] = None,
    lhs_dilation: Optional[Sequence[int]] = None,
    rhs_dilation: Optional[Sequence[int]] = None,
    feature_group_count: int = 1,
    dimension_numbers: Optional[Tuple[str, str, str]] = None,
    kernel_fn: Optional[str] = None,
    bias_fn: Optional[str] = None,
) -> Tensor: ...
def spike_bitwise(x: ArrayLike, y: ArrayLike, op: str = "add") -> Tensor: ...
def concat(xs: Sequence[ArrayLike], axis: int = -1) -> Tensor: ...
def stack(xs: Sequence[ArrayLike], axis: int = 0) -> Tensor: ...
def _time_update(learner: Learner, x: ArrayLike, n: int) -> float: ...
def _time_etrace_grad(learner: Learner, xs: ArrayLike, ys: ArrayLike, n: int) -> float: ...
