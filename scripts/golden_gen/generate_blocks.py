"""Record golden values and gradients of brainstate's non-temporal blocks.

``braintrace.nn`` forwards its activations, norms and pooling layers to
``brainstate.nn`` (0.2.6 emits a DeprecationWarning and returns the
brainstate class), so the layers here are ``brainstate.nn``'s, built with
their defaults unless a case says otherwise. For every case the script
records, in float64:

* ``x``: the input (fixed draws, with no entry at a kink of the function),
* ``y``: the layer's output,
* ``cot``: a cotangent of ``y``'s shape,
* ``dx``: ``vjp`` of the layer at ``x`` applied to ``cot``,
* for layers with parameters: ``params`` (the leaves, keyed as the Rust
  layer keys them, set to fixed draws) and ``dparams`` (their ``vjp``).

Draws: ``numpy.random.default_rng([seed, crc32(case name)])``. Nothing
reads the Rust code.

Run (from the repository root, braintrace 0.2.6's venv)::

    $PY scripts/golden_gen/generate_blocks.py --out tests/golden_blocks
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
import zlib

import jax

jax.config.update('jax_enable_x64', True)
jax.config.update('jax_platforms', 'cpu')

import brainstate  # noqa: E402
import braintrace  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

brainstate.environ.set(precision=64)

SEED = 34


def rng_for(name):
    return np.random.default_rng([SEED, zlib.crc32(name.encode())])


def enc(a):
    a = np.asarray(a, dtype=np.float64)
    assert np.all(np.isfinite(a)), 'non-finite value'
    return {'shape': list(a.shape), 'data': a.reshape(-1).tolist()}


def away_from(x, kinks, gap=0.05):
    """Move entries within ``gap`` of a kink away from it."""
    x = np.array(x)
    for k in kinks:
        near = np.abs(x - k) < gap
        x[near] = k + np.where(x[near] >= k, gap, -gap)
    return x


# name -> (brainstate class name, constructor kwargs, Rust spec, kinks, scale)
ACTIVATIONS = [
    ('relu', 'ReLU', {}, {}, [0.0]),
    ('relu6', 'ReLU6', {}, {}, [0.0, 6.0]),
    ('sigmoid', 'Sigmoid', {}, {}, []),
    ('tanh', 'Tanh', {}, {}, []),
    ('hardsigmoid', 'Hardsigmoid', {}, {}, [-3.0, 3.0]),
    ('hardswish', 'Hardswish', {}, {}, [-3.0, 3.0]),
    ('silu', 'SiLU', {}, {}, []),
    ('mish', 'Mish', {}, {}, []),
    ('elu', 'ELU', {}, {}, [0.0]),
    ('elu_a0.7', 'ELU', {'alpha': 0.7}, {'alpha': 0.7}, [0.0]),
    ('celu', 'CELU', {}, {}, [0.0]),
    ('celu_a1.5', 'CELU', {'alpha': 1.5}, {'alpha': 1.5}, [0.0]),
    ('selu', 'SELU', {}, {}, [0.0]),
    ('gelu', 'GELU', {}, {}, []),
    ('gelu_tanh', 'GELU', {'approximate': True}, {'approximate': True}, []),
    ('leakyrelu', 'LeakyReLU', {}, {}, [0.0]),
    ('leakyrelu_0.2', 'LeakyReLU', {'negative_slope': 0.2}, {'negative_slope': 0.2}, [0.0]),
    ('logsigmoid', 'LogSigmoid', {}, {}, []),
    ('softplus', 'Softplus', {}, {}, []),
    ('softsign', 'Softsign', {}, {}, []),
    ('hardtanh', 'Hardtanh', {}, {}, [-1.0, 1.0]),
    ('hardtanh_m2_1', 'Hardtanh', {'min_val': -2.0, 'max_val': 1.0},
     {'min_val': -2.0, 'max_val': 1.0}, [-2.0, 1.0]),
    ('hardshrink', 'Hardshrink', {}, {}, [-0.5, 0.5]),
    ('softshrink', 'Softshrink', {}, {}, [-0.5, 0.5]),
    ('softshrink_1', 'Softshrink', {'lambd': 1.0}, {'lambd': 1.0}, [-1.0, 1.0]),
    ('tanhshrink', 'Tanhshrink', {}, {}, []),
    ('threshold', 'Threshold', {'threshold': 0.3, 'value': -2.0},
     {'threshold': 0.3, 'value': -2.0}, [0.3]),
    ('softmax', 'Softmax', {}, {}, []),
    ('logsoftmax', 'LogSoftmax', {}, {}, []),
    ('softmin', 'Softmin', {}, {}, []),
    ('glu', 'GLU', {}, {}, []),
]

# jax.nn functions brainstate lists as functions (no layer class).
FUNCTIONS = [
    ('squareplus', lambda x: jax.nn.squareplus(x), {'b': 4.0}, []),
    ('sparse_plus', lambda x: jax.nn.sparse_plus(x), {}, [-1.0, 1.0]),
    ('sparse_sigmoid', lambda x: jax.nn.sparse_sigmoid(x), {}, [-1.0, 1.0]),
]


def vjp_case(fn, x, cot_rng):
    y, pull = jax.vjp(fn, x)
    cot = cot_rng.standard_normal(np.shape(y))
    (dx,) = pull(jnp.asarray(cot))
    return y, cot, dx


def state_vjp(layer, st, x, r):
    """Output, cotangent, and the vjp to ``x`` and the state ``st``."""
    x = jnp.asarray(x)
    y = layer(x)
    cot = jnp.asarray(r.standard_normal(np.shape(y)))
    f = brainstate.transform.grad(lambda xx: jnp.sum(layer(xx) * cot),
                                  grad_states={'w': st}, argnums=0)
    gs, dx = f(x)
    return y, cot, dx, gs['w']


def activation_cases():
    out = []
    for name, cls, kwargs, spec, kinks in ACTIVATIONS:
        r = rng_for('act__' + name)
        x = away_from(2.5 * r.standard_normal((3, 6)), kinks)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            layer = getattr(brainstate.nn, cls)(**kwargs)
        y, cot, dx = vjp_case(lambda a: layer(a), jnp.asarray(x), r)
        out.append({'kind': 'activation', 'name': name, 'class': cls, 'spec': spec,
                    'x': enc(x), 'y': enc(y), 'cot': enc(cot), 'dx': enc(dx)})
    for name, fn, spec, kinks in FUNCTIONS:
        r = rng_for('fn__' + name)
        x = away_from(2.5 * r.standard_normal((3, 6)), kinks)
        y, cot, dx = vjp_case(fn, jnp.asarray(x), r)
        out.append({'kind': 'activation', 'name': name, 'class': 'jax.nn.' + name,
                    'spec': spec, 'x': enc(x), 'y': enc(y), 'cot': enc(cot), 'dx': enc(dx)})
    # PReLU: a trainable slope per feature.
    r = rng_for('act__prelu')
    x = away_from(2.0 * r.standard_normal((4, 5)), [0.0])
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        layer = brainstate.nn.PReLU(num_parameters=5)
    a = 0.25 + 0.1 * r.standard_normal(5)

    layer.weight.value = jnp.asarray(a)
    y, cot, dx, dp = state_vjp(layer, layer.weight, x, r)
    da = dp
    out.append({'kind': 'prelu', 'name': 'prelu', 'class': 'PReLU', 'spec': {'num_parameters': 5},
                'x': enc(x), 'y': enc(y), 'cot': enc(cot), 'dx': enc(dx),
                'params': {'weight': enc(a)}, 'dparams': {'weight': enc(da)}})
    return out


def norm_cases():
    out = []
    specs = [
        # name, class, kwargs(in_size given), input shape, Rust spec, leaves
        ('layernorm', 'LayerNorm', {}, (4, 6), {'features': 6}, 'weight', ['scale', 'bias']),
        ('layernorm_eps', 'LayerNorm', {'epsilon': 0.1}, (3, 5), {'features': 5, 'eps': 0.1},
         'weight', ['scale', 'bias']),
        ('rmsnorm', 'RMSNorm', {}, (4, 6), {'features': 6}, 'scale', ['scale']),
        ('groupnorm', 'GroupNorm', {'num_groups': 3}, (4, 6), {'features': 6, 'num_groups': 3},
         'weight', ['scale', 'bias']),
        ('groupnorm_3d', 'GroupNorm', {'num_groups': 2}, (2, 3, 4),
         {'features': 4, 'num_groups': 2}, 'weight', ['scale', 'bias']),
    ]
    for name, cls, kwargs, shape, spec, state, leaves in specs:
        r = rng_for('norm__' + name)
        x = 1.5 * r.standard_normal(shape) + 0.3
        feat = shape[-1]
        in_size = (feat,)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            layer = getattr(brainstate.nn, cls)(in_size, **kwargs)
        params = {leaf: (1.0 if leaf == 'scale' else 0.0) + 0.3 * r.standard_normal(feat)
                  for leaf in leaves}
        st = getattr(layer, state)

        st.value = {k: jnp.reshape(jnp.asarray(v), np.shape(st.value[k]))
                    for k, v in params.items()}
        y, cot, dx, dp = state_vjp(layer, st, x, r)
        out.append({'kind': 'norm', 'name': name, 'class': cls, 'spec': spec, 'state': state,
                    'x': enc(x), 'y': enc(y), 'cot': enc(cot), 'dx': enc(dx),
                    'params': {k: enc(v) for k, v in params.items()},
                    'dparams': {k: enc(np.reshape(dp[k], -1)) for k in params}})
    return out


def pool_cases():
    out = []
    specs = [
        ('maxpool1d', 'MaxPool1d', {'kernel_size': 2}, (2, 7, 3), {}),
        ('maxpool1d_s1_p1', 'MaxPool1d', {'kernel_size': 3, 'stride': 1, 'padding': 1},
         (2, 6, 3), {}),
        ('avgpool1d', 'AvgPool1d', {'kernel_size': 3, 'stride': 2}, (2, 8, 3), {}),
        ('avgpool1d_p1', 'AvgPool1d', {'kernel_size': 3, 'stride': 2, 'padding': 1},
         (2, 7, 2), {}),
        ('maxpool2d', 'MaxPool2d', {'kernel_size': 2}, (2, 4, 5, 3), {}),
        ('maxpool2d_s1_p1', 'MaxPool2d', {'kernel_size': 3, 'stride': 1, 'padding': 1},
         (1, 4, 4, 2), {}),
        ('avgpool2d', 'AvgPool2d', {'kernel_size': 2, 'stride': 2}, (2, 4, 6, 2), {}),
        ('avgpool2d_p1', 'AvgPool2d', {'kernel_size': 3, 'stride': 2, 'padding': 1},
         (1, 5, 5, 2), {}),
    ]
    for name, cls, kwargs, shape, _ in specs:
        r = rng_for('pool__' + name)
        x = r.standard_normal(shape)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            layer = getattr(brainstate.nn, cls)(**kwargs)
        y, cot, dx = vjp_case(lambda a: layer(a), jnp.asarray(x), r)
        k = kwargs['kernel_size']
        spec = {'kernel': k, 'stride': kwargs.get('stride', k),
                'padding': kwargs.get('padding', 0)}
        out.append({'kind': 'pool', 'name': name, 'class': cls, 'spec': spec,
                    'x': enc(x), 'y': enc(y), 'cot': enc(cot), 'dx': enc(dx)})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', default='tests/golden_blocks')
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    doc = {
        'generator': 'scripts/golden_gen/generate_blocks.py',
        'versions': {'braintrace': braintrace.__version__, 'brainstate': brainstate.__version__,
                     'jax': jax.__version__},
        'cases': activation_cases() + norm_cases() + pool_cases(),
    }
    path = os.path.join(args.out, 'blocks.json')
    with open(path, 'w') as f:
        json.dump(doc, f, indent=None, separators=(',', ':'))
        f.write('\n')
    print(f'{path}: {len(doc["cases"])} cases')


if __name__ == '__main__':
    main()
