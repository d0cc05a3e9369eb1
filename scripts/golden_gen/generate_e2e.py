"""Record end-to-end online-learning golden cases from the real braintrace.

This writes ``e2e__<model>__<algo>.json`` files (plus ``MANIFEST.json``) in
exactly the schema of ``shared/golden/README.md`` section 6: for each of the
four models (gru, leaky, lif, diag) and each of the four algorithm settings
(D_RTRL / pp_prop, single-step / multi-step) it builds the model with
braintrace/brainstate, overwrites every trainable leaf with fixed float64
draws, and records

* ``etrace``: ``braintrace.compile(...)`` + ``learner.etrace_grad(...)`` (the
  library's online gradients and per-step losses),
* ``bptt``: ``jax.grad`` of the mean per-step loss through a plain pure-JAX
  unroll of the README 6.1 equations (no ETP primitive involved),
* ``graph``: the compiled hidden groups and hidden/param/op relations as the
  library reports them, and every warning it emits.

Nothing here re-derives an online gradient, and nothing reads the Rust code.

Random draws reproduce the reference set A: one generator per model,
``numpy.random.default_rng([seed, crc32('e2e__<model>')])``; the trainable
leaves are drawn in sorted key order (standard normal times a per-model
scale), then ``xs`` (times an input scale) and ``ys`` (times 0.5). Draws are
not rounded. With ``--reference-a --seed 20260`` the script reproduces
``shared/golden/e2e__*.json`` (check with ``--compare-with``). For the LIF a
draw whose membrane potential comes within ``--min-margin`` of threshold is
rejected and redrawn from ``default_rng([seed, crc32, attempt])``
(attempt = 1, 2, ...); the accepted margin is recorded.

Setup: the venv of ``generate.py`` (braintrace 0.2.6, brainstate 0.5.4,
brainevent 0.2.1, brainunit 0.5.2, jax/jaxlib 0.10.2, numpy 2.4.6):
``scripts/ref_venv.sh``; ``PY=$(scripts/ref_python.sh)``.

Run (from the repository root)::

    # validate against the reference set
    $PY scripts/golden_gen/generate_e2e.py --reference-a --seed 20260 \
        --out /tmp/e2e_a --compare-with tests/golden

    # variant set B (other seed, dims and hyperparameters)
    $PY scripts/golden_gen/generate_e2e.py --out tests/golden_extra --seed 70417

``--out`` folders that already hold a ``MANIFEST.json`` (e.g. the primitive
cases of ``generate.py``) keep their other files listed: the manifest is
merged, not replaced.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import warnings
import zlib
from importlib.metadata import version as pkg_version

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402

jax.config.update('jax_enable_x64', True)
jax.config.update('jax_platforms', 'cpu')

import brainevent  # noqa: E402
import brainstate  # noqa: E402
import braintrace  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

# Importing brainstate switches x64 off; its precision knob turns it back on.
brainstate.environ.set(precision=64, dt=1.0)
jax.config.update('jax_enable_x64', True)
brainevent.config.set_backend('cpu', 'jax_raw')
assert jnp.ones(1).dtype == jnp.float64, 'x64 is not enabled'

SCHEMA_VERSION = 1
MAX_ELEMS = 200

ETRACE_GRAD_CALL = ("learner.etrace_grad(xs, ys, step_fn=lambda x, y: jnp.mean((learner(x) - y) ** 2), "
                    "return_value=True)  # reduction='mean', mask=None")
BPTT_OBJECTIVE = ('mean over t of per-step loss (same objective etrace_grad(reduction="mean") '
                  'targets)')


# ----------------------------------------------------------------- the variants

def variants_a():
    """Reference set A (shared/golden): dims, hyperparameters and draw scales."""
    common = dict(T=6, B=2)
    models = [
        dict(model='gru', n_in=3, n_rec=5, n_out=2, w_scale=0.6, x_scale=1.0, hp={}),
        dict(model='leaky', n_in=3, n_rec=4, n_out=5, w_scale=0.7, x_scale=1.0,
             hp=dict(alpha=0.7, tau_out=5.0, dt=1.0)),
        dict(model='lif', n_in=3, n_rec=5, n_out=4, w_scale=0.9, x_scale=1.5,
             hp=dict(beta=0.8, gamma=0.6, v_th=1.0, tau_out=5.0, dt=1.0)),
        dict(model='diag', n_in=3, n_rec=4, n_out=4, w_scale=0.8, x_scale=1.0, hp={}),
    ]
    algos = [
        ('d_rtrl', 'D_RTRL', {}),
        ('pp_prop', 'pp_prop', {'decay_or_rank': 0.9}),
        ('d_rtrl_multistep', 'D_RTRL', {'vjp_method': 'multi-step'}),
        ('pp_prop_multistep', 'pp_prop', {'decay_or_rank': 0.9, 'vjp_method': 'multi-step'}),
    ]
    return [dict(m, **common) for m in models], algos


def variants_b():
    """Variant set B: other dims (T, B, n_*), hyperparameters, draw scales and pp_prop decays.

    pp_prop's ``decay_or_rank`` is given as a float, as an int rank (alpha = (r-1)/(r+1))
    and as a ``(x-decay, f-decay)`` pair, so every accepted spelling is exercised.
    """
    models = [
        dict(model='gru', n_in=2, n_rec=4, n_out=3, T=5, B=3, w_scale=0.8, x_scale=1.2, hp={},
             algos=[('d_rtrl', 'D_RTRL', {}),
                    ('pp_prop', 'pp_prop', {'decay_or_rank': 4}),
                    ('d_rtrl_multistep', 'D_RTRL', {'vjp_method': 'multi-step'}),
                    ('pp_prop_multistep', 'pp_prop',
                     {'decay_or_rank': 0.8, 'vjp_method': 'multi-step'})]),
        dict(model='leaky', n_in=4, n_rec=3, n_out=2, T=8, B=1, w_scale=0.9, x_scale=1.0,
             hp=dict(alpha=0.55, tau_out=3.0, dt=1.0),
             algos=[('d_rtrl', 'D_RTRL', {}),
                    ('pp_prop', 'pp_prop', {'decay_or_rank': 0.75}),
                    ('d_rtrl_multistep', 'D_RTRL', {'vjp_method': 'multi-step'}),
                    ('pp_prop_multistep', 'pp_prop',
                     {'decay_or_rank': (0.9, 0.7), 'vjp_method': 'multi-step'})]),
        dict(model='lif', n_in=2, n_rec=4, n_out=3, T=7, B=3, w_scale=1.0, x_scale=1.8,
             hp=dict(beta=0.7, gamma=0.5, v_th=0.8, tau_out=4.0, dt=1.0),
             algos=[('d_rtrl', 'D_RTRL', {}),
                    ('pp_prop', 'pp_prop', {'decay_or_rank': 0.85}),
                    ('d_rtrl_multistep', 'D_RTRL', {'vjp_method': 'multi-step'}),
                    ('pp_prop_multistep', 'pp_prop',
                     {'decay_or_rank': 5, 'vjp_method': 'multi-step'})]),
        dict(model='diag', n_in=5, n_rec=3, n_out=3, T=7, B=1, w_scale=0.7, x_scale=1.3, hp={},
             algos=[('d_rtrl', 'D_RTRL', {}),
                    ('pp_prop', 'pp_prop', {'decay_or_rank': (0.6, 3)}),
                    ('d_rtrl_multistep', 'D_RTRL', {'vjp_method': 'multi-step'}),
                    ('pp_prop_multistep', 'pp_prop',
                     {'decay_or_rank': 0.95, 'vjp_method': 'multi-step'})]),
    ]
    return models


# ----------------------------------------------------------------- encoding

def enc(a):
    """Array object of README section 2 (row-major nested lists, float64)."""
    a = np.asarray(a)
    if a.dtype != np.float64:
        raise TypeError(f'expected float64, got {a.dtype}')
    if a.size > MAX_ELEMS:
        raise ValueError(f'array of {a.size} elements (> {MAX_ELEMS}): shrink the variant')
    if not np.all(np.isfinite(a)):
        raise ValueError('non-finite value')
    return {'dtype': 'float64', 'shape': list(a.shape), 'data': a.tolist()}


def enc_tree(d):
    return {k: enc(d[k]) for k in sorted(d)}


def warn_strings(ws):
    out = []
    for w in ws:
        s = f'{w.category.__name__}: {w.message}'
        if s not in out:
            out.append(s)
    return out


def path_str(path):
    return '/'.join(str(p) for p in path)


# ----------------------------------------------------------------- the models

@jax.custom_jvp
def spike(u):
    """Heaviside forward, arctan surrogate S'(u) = 1 / (1 + (pi u)^2)."""
    return (u > 0).astype(u.dtype)


@spike.defjvp
def _spike_jvp(primals, tangents):
    (u,), (du,) = primals, tangents
    return spike(u), du / (1.0 + (jnp.pi * u) ** 2)


def readout_decay(hp):
    return math.exp(-hp['dt'] / hp['tau_out'])


class GruNet(brainstate.nn.Module):
    """README model: GRUCell followed by a Linear readout."""

    def __init__(self, n_in, n_rec, n_out, hp):
        super().__init__()
        self.rnn = braintrace.nn.GRUCell(n_in, n_rec)
        self.out = braintrace.nn.Linear(n_rec, n_out)

    def update(self, x):
        return self.out(self.rnn(x))


class LeakyNet(brainstate.nn.Module):
    """Leaky rate RNN + LeakyRateReadout."""

    def __init__(self, n_in, n_rec, n_out, hp):
        super().__init__()
        self.n_rec = n_rec
        self.alpha = hp['alpha']
        self.rec = braintrace.nn.Linear(n_in + n_rec, n_rec)
        self.readout = braintrace.nn.LeakyRateReadout(n_rec, n_out, tau=hp['tau_out'])

    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, self.n_rec)))

    def update(self, x):
        v_prev = self.v.value
        a = self.alpha
        v = a * v_prev + (1 - a) * self.rec(jnp.concatenate([x, jnp.tanh(v_prev)], axis=-1))
        self.v.value = v
        return self.readout(jnp.tanh(v))


class LifNet(brainstate.nn.Module):
    """Current-based LIF with soft reset + LeakyRateReadout."""

    def __init__(self, n_in, n_rec, n_out, hp):
        super().__init__()
        self.n_rec = n_rec
        self.beta, self.gamma, self.v_th = hp['beta'], hp['gamma'], hp['v_th']
        self.rec = braintrace.nn.Linear(n_in + n_rec, n_rec)
        self.readout = braintrace.nn.LeakyRateReadout(n_rec, n_out, tau=hp['tau_out'])

    def init_state(self, batch_size=None, **kwargs):
        self.i = brainstate.HiddenState(jnp.zeros((batch_size, self.n_rec)))
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, self.n_rec)))

    def update(self, x):
        i_prev, v_prev = self.i.value, self.v.value
        s_prev = spike(v_prev - self.v_th)
        i = self.gamma * i_prev + self.rec(jnp.concatenate([x, s_prev], axis=-1))
        v = self.beta * (v_prev - self.v_th * s_prev) + i
        self.i.value = i
        self.v.value = v
        return self.readout(spike(v - self.v_th))


class DiagNet(brainstate.nn.Module):
    """Diagonal leaky unit with a trainable per-unit decay (element_wise, sigmoid)."""

    def __init__(self, n_in, n_rec, n_out, hp):
        super().__init__()
        assert n_out == n_rec, 'diag: out_t = v_t'
        self.n_rec = n_rec
        self.decay_raw = brainstate.ParamState(jnp.zeros((n_rec,)))
        self.inp = braintrace.nn.Linear(n_in, n_rec)

    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, self.n_rec)))

    def update(self, x):
        d = braintrace.element_wise(self.decay_raw.value, weight_fn=jax.nn.sigmoid)
        v = d * self.v.value + (1 - d) * self.inp(x)
        self.v.value = v
        return v


MODELS = {'gru': GruNet, 'leaky': LeakyNet, 'lif': LifNet, 'diag': DiagNet}
HIDDEN = {'gru': ['rnn/h'], 'leaky': ['readout/r', 'v'], 'lif': ['i', 'readout/r', 'v'],
          'diag': ['v']}


# ----------------------------------------------------------------- pure-JAX reference

def bptt_rollout(model, W, hp, xs, ys, B, dims):
    """Plain unroll of README 6.1 (no ETP ops); returns (objective, (losses, outs, hidden))."""
    n_rec, n_out = dims['n_rec'], dims['n_out']
    sig = jax.nn.sigmoid

    if model == 'gru':
        def step(h, x):
            hp_ = h['rnn/h']
            xh = jnp.concatenate([x, hp_], -1)
            z = sig(xh @ W['rnn/Wz/weight/weight'] + W['rnn/Wz/weight/bias'])
            r = sig(xh @ W['rnn/Wr/weight/weight'] + W['rnn/Wr/weight/bias'])
            hc = jnp.tanh(jnp.concatenate([x, r * hp_], -1) @ W['rnn/Wh/weight/weight']
                          + W['rnn/Wh/weight/bias'])
            hn = (1 - z) * hp_ + z * hc
            return {'rnn/h': hn}, hn @ W['out/weight/weight'] + W['out/weight/bias']
    elif model == 'leaky':
        a, dec = hp['alpha'], readout_decay(hp)

        def step(h, x):
            v = a * h['v'] + (1 - a) * (jnp.concatenate([x, jnp.tanh(h['v'])], -1)
                                        @ W['rec/weight/weight'] + W['rec/weight/bias'])
            r = dec * h['readout/r'] + jnp.tanh(v) @ W['readout/W']
            return {'v': v, 'readout/r': r}, r
    elif model == 'lif':
        be, ga, vth, dec = hp['beta'], hp['gamma'], hp['v_th'], readout_decay(hp)

        def step(h, x):
            s = spike(h['v'] - vth)
            i = ga * h['i'] + jnp.concatenate([x, s], -1) @ W['rec/weight/weight'] \
                + W['rec/weight/bias']
            v = be * (h['v'] - vth * s) + i
            r = dec * h['readout/r'] + spike(v - vth) @ W['readout/W']
            return {'i': i, 'v': v, 'readout/r': r}, r
    elif model == 'diag':
        def step(h, x):
            d = sig(W['decay_raw'])
            v = d * h['v'] + (1 - d) * (x @ W['inp/weight/weight'] + W['inp/weight/bias'])
            return {'v': v}, v
    else:
        raise ValueError(model)

    width = {'readout/r': n_out}
    h0 = {k: jnp.zeros((B, width.get(k, n_rec))) for k in HIDDEN[model]}
    h = h0
    losses, outs, hid = [], [], {k: [] for k in h0}
    for t in range(xs.shape[0]):
        h, o = step(h, xs[t])
        losses.append(jnp.mean((o - ys[t]) ** 2))
        outs.append(o)
        for k in hid:
            hid[k].append(h[k])
    losses = jnp.stack(losses)
    aux = (losses, jnp.stack(outs), {k: jnp.stack(v) for k, v in hid.items()})
    return jnp.mean(losses), aux


# ----------------------------------------------------------------- one model

def param_states(net):
    """{path tuple: ParamState} in sorted path order."""
    states = net.states(brainstate.ParamState)
    return {tuple(p): s for p, s in sorted(states.items(), key=lambda kv: path_str(kv[0]))}


def flat_keys(net):
    """The README 6 weight keys with their shapes, in sorted order."""
    out = {}
    for p, st in param_states(net).items():
        v = st.value
        if isinstance(v, dict):
            for leaf in v:
                out[path_str(p) + '/' + leaf] = tuple(np.shape(v[leaf]))
        else:
            out[path_str(p)] = tuple(np.shape(v))
    return dict(sorted(out.items()))


def set_weights(net, W):
    for p, st in param_states(net).items():
        v = st.value
        if isinstance(v, dict):
            st.value = {leaf: jnp.asarray(W[path_str(p) + '/' + leaf], jnp.float64) for leaf in v}
        else:
            st.value = jnp.asarray(W[path_str(p)], jnp.float64)


def flat_grads(grads):
    out = {}
    for p, g in grads.items():
        if isinstance(g, dict):
            for leaf, a in g.items():
                out[path_str(p) + '/' + leaf] = a
        else:
            out[path_str(p)] = g
    return out


def draw_model(spec, seed, attempt):
    """Weights, xs, ys for one model (same draw order as set A)."""
    name = 'e2e__' + spec['model']
    key = [seed, zlib.crc32(name.encode())] + ([attempt] if attempt else [])
    rng = np.random.default_rng(key)
    net = MODELS[spec['model']](spec['n_in'], spec['n_rec'], spec['n_out'], spec['hp'])
    W = {k: spec['w_scale'] * rng.standard_normal(s) for k, s in flat_keys(net).items()}
    T, B = spec['T'], spec['B']
    xs = spec['x_scale'] * rng.standard_normal((T, B, spec['n_in']))
    ys = 0.5 * rng.standard_normal((T, B, spec['n_out']))
    return W, xs, ys


def hyperparams_json(spec):
    hp = dict(spec['hp'])
    if 'tau_out' in hp:
        hp['readout_decay'] = readout_decay(hp)
    return hp


def run_bptt(spec, W, xs, ys):
    dims = {k: spec[k] for k in ('n_in', 'n_rec', 'n_out')}
    Wj = {k: jnp.asarray(v) for k, v in W.items()}
    f = lambda w: bptt_rollout(spec['model'], w, spec['hp'], jnp.asarray(xs),  # noqa: E731
                               jnp.asarray(ys), spec['B'], dims)
    (_, (losses, outs, hid)), g = jax.value_and_grad(f, has_aux=True)(Wj)
    return ({k: np.asarray(v) for k, v in g.items()}, np.asarray(losses), np.asarray(outs),
            {k: np.asarray(v) for k, v in hid.items()})


def mse_step(learner):
    return lambda x, y: jnp.mean((learner(x) - y) ** 2)


def run_etrace(spec, algo_name, options, W, xs, ys, step_fn=mse_step):
    """``step_fn(learner)`` is etrace_grad's per-step loss (MSE by default)."""
    net = MODELS[spec['model']](spec['n_in'], spec['n_rec'], spec['n_out'], spec['hp'])
    set_weights(net, W)
    algo = getattr(braintrace, algo_name)
    B, n_in = spec['B'], spec['n_in']
    with warnings.catch_warnings(record=True) as cws:
        warnings.simplefilter('always')
        learner = braintrace.compile(net, algo, jnp.zeros((B, n_in)), batch_size=B, **options)
    # compile must not have touched the weights
    for k, v in flat_grads({p: st.value for p, st in param_states(net).items()}).items():
        assert np.array_equal(np.asarray(v), W[k]), f'compile changed weight {k}'
    initial = {path_str(p): np.asarray(st.value)
               for p, st in net.states(brainstate.HiddenState).items()}
    with warnings.catch_warnings(record=True) as rws:
        warnings.simplefilter('always')
        grads, losses = learner.etrace_grad(
            jnp.asarray(xs), jnp.asarray(ys), step_fn=step_fn(learner), return_value=True)
    grads = {k: np.asarray(v) for k, v in flat_grads(grads).items()}
    graph = learner.graph
    gidx = {id(g): g.index for g in graph.hidden_groups}
    groups = [{'index': g.index, 'hidden_paths': [path_str(p) for p in g.hidden_paths],
               'varshape': list(g.varshape), 'num_state': int(g.num_state)}
              for g in graph.hidden_groups]
    rels = [{'primitive': r.primitive.name,
             'trainable': {k: path_str(p) for k, p in r.trainable_paths.items()},
             'hidden_groups': [gidx[id(g)] for g in r.hidden_groups]}
            for r in graph.hidden_param_op_relations]
    return dict(grads=grads, losses=np.asarray(losses), initial=initial,
                graph={'hidden_groups': groups, 'relations': rels},
                compile_warnings=warn_strings(cws), run_warnings=warn_strings(rws))


def spike_margin(spec, hid):
    return float(np.min(np.abs(hid['v'] - spec['hp']['v_th'])))


def make_model_cases(spec, algos, seed, gen_block, min_margin):
    attempt = 0
    while True:
        W, xs, ys = draw_model(spec, seed, attempt)
        bg, bl, bo, bh = run_bptt(spec, W, xs, ys)
        if spec['model'] != 'lif':
            margin = None
            break
        margin = spike_margin(spec, bh)
        if margin >= min_margin:
            break
        print(f'  lif: margin {margin:.3g} < {min_margin} at attempt {attempt}, redrawing',
              file=sys.stderr)
        attempt += 1
        if attempt > 200:
            raise RuntimeError('no LIF draw with a safe threshold margin')
    dims = {k: spec[k] for k in ('n_in', 'n_rec', 'n_out', 'T', 'B')}
    cases = []
    for suffix, algo_name, options in algos:
        r = run_etrace(spec, algo_name, options, W, xs, ys)
        assert set(r['grads']) == set(W), (sorted(r['grads']), sorted(W))
        for k, g in r['grads'].items():
            assert g.dtype == np.float64, f'{k}: {g.dtype}'
        assert np.allclose(r['losses'], bl, rtol=1e-12, atol=1e-14), 'etrace/bptt losses differ'
        opt_str = ''.join(f', {k}={v!r}' for k, v in options.items())
        case_id = f"e2e__{spec['model']}__{suffix}"
        case = {
            'schema_version': SCHEMA_VERSION,
            'kind': 'e2e',
            'case_id': case_id,
            'model': spec['model'],
            'dims': dims,
            'hyperparams': hyperparams_json(spec),
            'algorithm': algo_name,
            'algorithm_options': {k: (list(v) if isinstance(v, tuple) else v)
                                  for k, v in options.items()},
            'vjp_method': options.get('vjp_method', 'single-step'),
            'compile_call': (f'braintrace.compile(model, braintrace.{algo_name}, '
                             f'jnp.zeros((B, n_in)), batch_size=B{opt_str})'),
            'etrace_grad_call': ETRACE_GRAD_CALL,
            'weights': enc_tree(W),
            'initial_hidden': enc_tree(r['initial']),
            'xs': enc(xs),
            'ys': enc(ys),
            'etrace': {'grads': enc_tree(r['grads']),
                       'grad_dtypes': {k: str(r['grads'][k].dtype) for k in sorted(r['grads'])},
                       'losses': enc(r['losses'])},
            'bptt': {'objective': BPTT_OBJECTIVE, 'grads': enc_tree(bg), 'losses': enc(bl),
                     'outputs': enc(bo), 'hidden': enc_tree(bh)},
            'max_abs_diff_etrace_vs_bptt': {
                k: float(np.max(np.abs(r['grads'][k] - bg[k]))) for k in sorted(bg)},
            'graph': r['graph'],
            'compile_warnings': r['compile_warnings'],
            'run_warnings': r['run_warnings'],
            'spike_threshold_margin': margin,
            'generator': gen_block,
        }
        cases.append((case_id, case))
        print(f'{case_id}: max|etrace-bptt| = '
              f"{max(case['max_abs_diff_etrace_vs_bptt'].values()):.3g}"
              + (f', margin {margin:.4g} (attempt {attempt})' if margin is not None else ''),
              file=sys.stderr)
    return cases


# ----------------------------------------------------------------- comparison

def compare(a, b, path='', tol=1e-12, out=None):
    """Differences between two decoded case files: arrays to ``tol``, all else equal."""
    out = [] if out is None else out
    if isinstance(a, dict) and 'dtype' in a and 'data' in a:
        if not (isinstance(b, dict) and 'data' in b) or a['shape'] != b['shape'] \
                or a['dtype'] != b['dtype']:
            out.append((path, 'array shape/dtype', None))
            return out
        d = float(np.max(np.abs(np.asarray(a['data'], float) - np.asarray(b['data'], float)),
                         initial=0.0))
        if d > tol:
            out.append((path, 'array', d))
        compare.max_diff = max(getattr(compare, 'max_diff', 0.0), d)
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            out.append((path, 'keys', sorted(set(a) ^ set(b))))
        for k in a:
            if k in b and not (path == '' and k == 'generator'):
                compare(a[k], b[k], f'{path}/{k}', tol, out)
        return out
    if isinstance(a, float) and isinstance(b, float) and path.startswith(
            ('/max_abs_diff', '/spike_threshold_margin')):
        if abs(a - b) > tol:
            out.append((path, 'float', abs(a - b)))
        return out
    if a != b:
        out.append((path, 'value', (a, b)))
    return out


# ----------------------------------------------------------------- main

def versions():
    return {
        'python': platform.python_version(),
        'numpy': np.__version__,
        'jax': jax.__version__,
        'jaxlib': pkg_version('jaxlib'),
        'braintrace': pkg_version('braintrace'),
        'brainstate': pkg_version('brainstate'),
        'brainevent': pkg_version('brainevent'),
        'brainunit': pkg_version('brainunit'),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', required=True, help='output folder')
    ap.add_argument('--seed', type=int, default=70417)
    ap.add_argument('--variant-set', default=None, help="default 'A' with --reference-a, else 'B'")
    ap.add_argument('--reference-a', action='store_true',
                    help='set-A dims/hyperparameters (reproduces shared/golden with seed 20260)')
    ap.add_argument('--only', nargs='*', help='models to generate (gru leaky lif diag)')
    ap.add_argument('--min-margin', type=float, default=5e-3,
                    help='LIF: redraw when some |v - v_th| is below this')
    ap.add_argument('--compare-with', help='folder of reference files to diff against')
    a = ap.parse_args(argv)

    if a.reference_a:
        models, algos = variants_a()
        models = [dict(m, algos=algos) for m in models]
        vset = a.variant_set or 'A'
    else:
        models = variants_b()
        vset = a.variant_set or 'B'
    if a.only:
        models = [m for m in models if m['model'] in a.only]
    gen = {'schema_version': SCHEMA_VERSION, 'seed': a.seed, 'variant_set': vset,
           'versions': versions(), 'float': 'float64 (jax_enable_x64)', 'backend': 'cpu',
           'brainevent_cpu_backend': 'jax_raw'}
    os.makedirs(a.out, exist_ok=True)
    written, sizes = [], {}
    for spec in models:
        for case_id, case in make_model_cases(spec, spec['algos'], a.seed, gen, a.min_margin):
            text = json.dumps(case, separators=(',', ':'), allow_nan=False)
            fn = case_id + '.json'
            with open(os.path.join(a.out, fn), 'w') as fh:
                fh.write(text)
            written.append(fn)
            sizes[fn] = len(text.encode())

    # MANIFEST: merge with what the folder already lists (e.g. generate.py's primitives).
    mpath = os.path.join(a.out, 'MANIFEST.json')
    manifest = dict(gen)
    files = set(written)
    if os.path.exists(mpath):
        with open(mpath) as fh:
            old = json.load(fh)
        files |= set(old.get('files', []))
    manifest['files'] = sorted(files)
    manifest['total_bytes'] = sum(os.path.getsize(os.path.join(a.out, f))
                                  for f in manifest['files']
                                  if os.path.exists(os.path.join(a.out, f)))
    with open(mpath, 'w') as fh:
        fh.write(json.dumps(manifest, separators=(',', ':'), allow_nan=False))
    print(f'{len(written)} e2e files written, {sum(sizes.values())} bytes', file=sys.stderr)

    if a.compare_with:
        bad = 0
        compare.max_diff = 0.0
        for fn in written:
            ref_path = os.path.join(a.compare_with, fn)
            if not os.path.exists(ref_path):
                print(f'{fn}: no reference file', file=sys.stderr)
                continue
            with open(ref_path) as fh:
                ref = json.load(fh)
            with open(os.path.join(a.out, fn)) as fh:
                new = json.load(fh)
            diffs = compare(new, ref) + [(p, 'missing here', None)
                                         for p in sorted(set(ref) - set(new))]
            gdiff = {k: (new['generator'].get(k), ref['generator'].get(k))
                     for k in set(new['generator']) | set(ref['generator'])
                     if new['generator'].get(k) != ref['generator'].get(k)}
            with open(ref_path, 'rb') as fh:
                same_bytes = fh.read() == open(os.path.join(a.out, fn), 'rb').read()
            print(f'{fn}: {len(diffs)} differences'
                  + (f' (generator block differs: {gdiff})' if gdiff else '')
                  + (', byte-identical' if same_bytes else ''), file=sys.stderr)
            for d in diffs[:20]:
                print('   ', d, file=sys.stderr)
            bad += bool(diffs)
        print(f'compare: {len(written) - bad}/{len(written)} files match '
              f'(largest array difference {compare.max_diff:.3g})', file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == '__main__':
    sys.exit(main())
