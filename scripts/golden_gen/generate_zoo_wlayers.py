"""Record end-to-end golden cases of braintrace 0.2.6's weight-structured layers.

Each layer of ``braintrace.nn`` with a weight structure (``Linear`` with a
``w_mask``, ``SignedWLinear``, ``ScaledWSLinear``, ``SparseLinear``, ``LoRA``,
``Conv1d``, ``Conv2d``, ``Conv3d``) is the recurrent weight ``rnn/W`` of a
small recurrent net, so that its weights get eligibility traces::

    h' = tanh(W([x, h]))          (concatenated on the feature/channel axis)
    o  = out(flatten(h'))         (a braintrace.nn.Linear readout ``out``)

with a per-step MSE loss. The dense layers map ``n_in + n_rec -> n_rec``;
the convolutions keep the spatial shape (SAME padding, channel-last, as
brainstate's default) and map ``c_in + c_rec -> c_rec`` channels. The
layer's fixed structure (mask, sign, CSR pattern) is recorded in the case's
``layer`` field. Every trainable leaf is overwritten with fixed float64
draws; the script records, in the e2e schema of ``generate_e2e.py``:

* ``etrace``: ``braintrace.compile(...)`` + ``learner.etrace_grad(...)``,
* ``bptt``: ``jax.grad`` of the mean per-step loss through a plain pure-JAX
  unroll of the layer's equations written out below (no ETP primitive),
* ``graph``: the compiled hidden groups and relations, and every warning.

Cases per layer: batch 2 with D-RTRL and pp_prop, single- and multi-step,
and batch 1 with D-RTRL single-step and pp_prop multi-step. Draws:
``numpy.random.default_rng([seed, crc32('wlayers__<layer>__b<B>')])``: the
structure first, then the trainable leaves in sorted key order (standard
normal times ``w_scale``), then ``xs`` and ``ys`` (times 0.5). Nothing reads
the Rust code.

Run (from the repository root, braintrace 0.2.6's venv)::

    $PY scripts/golden_gen/generate_zoo_wlayers.py --out tests/golden_wlayers
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import generate_e2e as e2e  # noqa: E402
from generate_e2e import (enc, enc_tree, flat_grads, flat_keys, param_states,  # noqa: E402
                          path_str, set_weights, warn_strings)

import brainevent  # noqa: E402
import brainstate  # noqa: E402
import braintools  # noqa: E402
import braintrace  # noqa: E402
import brainunit as u  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

DENSE = ['linear_mask', 'signed', 'scaledws', 'sparse', 'lora']
CONV = {'conv1d': 1, 'conv2d': 2, 'conv3d': 3}
LAYERS = DENSE + list(CONV)


# ----------------------------------------------------------------- the nets

def draw_structure(layer, spec, rng):
    """The layer's fixed structure (not trainable), drawn first."""
    k = spec['n_in'] + spec['n_rec']
    n = spec['n_rec']
    if layer == 'linear_mask':
        return {'w_mask': (rng.random((k, n)) < 0.7).astype(np.float64)}
    if layer == 'signed':
        # Dale's law: each presynaptic unit (row) excitatory or inhibitory.
        sign = np.where(rng.random((k, 1)) < 0.6, 1.0, -1.0)
        return {'w_sign': sign}
    if layer == 'scaledws':
        # braintrace 0.2.6's online learners fail on ScaledWSLinear's bias and
        # gain leaves (non-temporal leaves of a ParamState in a relation get
        # a scalar zero gradient: "Custom VJP bwd rule must produce an output
        # with the same type"), so the cases have neither.
        return {'w_mask': (rng.random((k, 1)) < 0.8).astype(np.float64), 'eps': 1e-4,
                'bias': False, 'gain': False}
    if layer == 'sparse':
        dense = rng.random((k, n)) < 0.5
        dense[0, 0] = True
        indptr = [0]
        indices = []
        for r in range(k):
            cols = [c for c in range(n) if dense[r, c]]
            indices.extend(cols)
            indptr.append(len(indices))
        return {'indptr': indptr, 'indices': indices, 'shape': [k, n]}
    if layer == 'lora':
        return {'rank': 2}
    # No bias (brainstate's default): braintrace 0.2.6's online learners fail
    # on a convolution bias of brainstate's shape (1.., C) (the rules return
    # (C,): "Custom VJP bwd rule must produce an output with the same type").
    return {'kernel_size': spec['kernel_size'], 'spatial': spec['spatial'], 'bias': False}


def make_layer(layer, spec, st):
    k = spec['n_in'] + spec['n_rec']
    n = spec['n_rec']
    if layer == 'linear_mask':
        return braintrace.nn.Linear(k, n, w_mask=jnp.asarray(st['w_mask']))
    if layer == 'signed':
        return braintrace.nn.SignedWLinear(k, n, w_sign=jnp.asarray(st['w_sign']))
    if layer == 'scaledws':
        return braintrace.nn.ScaledWSLinear(k, n, w_mask=jnp.asarray(st['w_mask']),
                                            eps=st['eps'], ws_gain=st['gain'],
                                            b_init=braintools.init.ZeroInit() if st['bias']
                                            else None)
    if layer == 'sparse':
        data = jnp.ones(len(st['indices']))
        mat = brainevent.CSR((data, jnp.asarray(st['indices'], dtype=jnp.int32),
                            jnp.asarray(st['indptr'], dtype=jnp.int32)), shape=tuple(st['shape']))
        return braintrace.nn.SparseLinear(mat, b_init=braintools.init.ZeroInit(), in_size=(k,))
    if layer == 'lora':
        return braintrace.nn.LoRA(k, st['rank'], n)
    d = CONV[layer]
    cls = {1: braintrace.nn.Conv1d, 2: braintrace.nn.Conv2d, 3: braintrace.nn.Conv3d}[d]
    return cls(in_size=tuple(st['spatial']) + (k,), out_channels=n,
               kernel_size=st['kernel_size'], padding='SAME',
               b_init=braintools.init.ZeroInit() if st['bias'] else None)


class WCell(brainstate.nn.Module):
    """``h' = tanh(W([x, h]))`` with the layer under test as ``W``."""

    def __init__(self, layer, spec, st):
        super().__init__()
        self.W = make_layer(layer, spec, st)
        shape = tuple(spec.get('spatial', ())) + (spec['n_rec'],)
        self.shape = shape

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size,) + self.shape))

    def update(self, x):
        self.h.value = jnp.tanh(self.W(jnp.concatenate([x, self.h.value], -1)))
        return self.h.value


class WNet(brainstate.nn.Module):
    def __init__(self, layer, spec, st):
        super().__init__()
        self.rnn = WCell(layer, spec, st)
        n_flat = int(np.prod(spec.get('spatial', ()))) * spec['n_rec']
        self.out = braintrace.nn.Linear(n_flat, spec['n_out'])

    def update(self, x):
        h = self.rnn(x)
        return self.out(h.reshape(h.shape[0], -1))


# ----------------------------------------------------------------- pure-JAX equations

def layer_forward(layer, spec, st, W, v):
    """The layer's output from its published equations (no ETP primitive)."""
    p = 'rnn/W/weight'
    if layer == 'linear_mask':
        return v @ (W[p + '/weight'] * st['w_mask']) + W[p + '/bias']
    if layer == 'signed':
        return v @ (jnp.abs(W[p]) * st['w_sign'])
    if layer == 'scaledws':
        w = W[p + '/weight']
        fan_in = w.shape[0]
        mean = jnp.mean(w, axis=0, keepdims=True)
        var = jnp.mean((w - mean) ** 2, axis=0, keepdims=True)
        ws = (w - mean) / jnp.sqrt(jnp.maximum(var * fan_in, st['eps']))
        y = v @ (ws * st['w_mask'])
        if st['gain']:
            y = y * W[p + '/gain']
        return y + W[p + '/bias'] if st['bias'] else y
    if layer == 'sparse':
        k, n = st['shape']
        dense = jnp.zeros((k, n))
        rows = np.repeat(np.arange(k), np.diff(st['indptr']))
        dense = dense.at[rows, np.asarray(st['indices'])].set(W[p + '/weight'])
        return v @ dense + W[p + '/bias']
    if layer == 'lora':
        return v @ W[p + '/lora_a'] @ W[p + '/lora_b'] / st['rank']
    d = CONV[layer]
    # brainstate's layouts: channel-last input, (k.., in, out) kernel.
    lhs = 'N' + 'DHW'[3 - d:] + 'C'
    rhs = 'DHW'[3 - d:] + 'IO'
    y = jax.lax.conv_general_dilated(v, W[p + '/weight'], (1,) * d, 'SAME',
                                     dimension_numbers=(lhs, rhs, lhs))
    return y + W[p + '/bias'] if st['bias'] else y


def bptt_rollout(layer, spec, st, W, xs, ys):
    B = xs.shape[1]
    h = jnp.zeros((B,) + tuple(spec.get('spatial', ())) + (spec['n_rec'],))
    losses, outs, hid = [], [], []
    for t in range(xs.shape[0]):
        h = jnp.tanh(layer_forward(layer, spec, st, W, jnp.concatenate([xs[t], h], -1)))
        o = h.reshape(B, -1) @ W['out/weight/weight'] + W['out/weight/bias']
        losses.append(jnp.mean((o - ys[t]) ** 2))
        outs.append(o)
        hid.append(h)
    losses = jnp.stack(losses)
    return jnp.mean(losses), (losses, jnp.stack(outs), {'rnn/h': jnp.stack(hid)})


# ----------------------------------------------------------------- the cases

ALGOS_B2 = [
    ('d_rtrl', 'D_RTRL', {}),
    ('pp_prop', 'pp_prop', {'decay_or_rank': 0.9}),
    ('d_rtrl_multistep', 'D_RTRL', {'vjp_method': 'multi-step'}),
    ('pp_prop_multistep', 'pp_prop', {'decay_or_rank': 0.8, 'vjp_method': 'multi-step'}),
]
ALGOS_B1 = [
    ('d_rtrl_b1', 'D_RTRL', {}),
    ('pp_prop_multistep_b1', 'pp_prop', {'decay_or_rank': 4, 'vjp_method': 'multi-step'}),
]


def specs():
    out = []
    for layer in LAYERS:
        if layer in CONV:
            d = CONV[layer]
            spatial = {1: [4], 2: [3, 3], 3: [2, 2, 2]}[d]
            ks = {1: [3], 2: [2, 2], 3: [2, 2, 2]}[d]
            base = dict(layer=layer, n_in=1, n_rec=2, n_out=2, w_scale=0.6, x_scale=1.0,
                        spatial=spatial, kernel_size=ks)
            out.append(dict(base, T=4, B=2, algos=ALGOS_B2))
            out.append(dict(base, T=3, B=1, algos=ALGOS_B1))
        else:
            base = dict(layer=layer, n_in=3, n_rec=4, n_out=2, w_scale=0.6, x_scale=1.0)
            out.append(dict(base, T=5, B=2, algos=ALGOS_B2))
            out.append(dict(base, T=6, B=1, algos=ALGOS_B1))
    return out


def run_etrace(layer, spec, st, algo_name, options, W, xs, ys):
    net = WNet(layer, spec, st)
    set_weights(net, W)
    algo = getattr(braintrace, algo_name)
    with warnings.catch_warnings(record=True) as cws:
        warnings.simplefilter('always')
        learner = braintrace.compile(net, algo, jnp.zeros(xs.shape[1:]), batch_size=xs.shape[1],
                                     **options)
    for k, v in flat_grads({p: s.value for p, s in param_states(net).items()}).items():
        assert np.array_equal(np.asarray(v), W[k]), f'compile changed weight {k}'
    initial = {path_str(p): np.asarray(s.value)
               for p, s in net.states(brainstate.HiddenState).items()}
    with warnings.catch_warnings(record=True) as rws:
        warnings.simplefilter('always')
        grads, losses = learner.etrace_grad(
            jnp.asarray(xs), jnp.asarray(ys),
            step_fn=lambda x, y: jnp.mean((learner(x) - y) ** 2), return_value=True)
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


def enc_structure(st):
    out = {}
    for k, v in st.items():
        out[k] = enc(v) if isinstance(v, np.ndarray) else v
    return out


def make_cases(spec, seed, gen):
    layer, B, T = spec['layer'], spec['B'], spec['T']
    rng = np.random.default_rng([seed, zlib.crc32(f'wlayers__{layer}__b{B}'.encode())])
    st = draw_structure(layer, spec, rng)
    net = WNet(layer, spec, st)
    W = {k: spec['w_scale'] * rng.standard_normal(s) for k, s in flat_keys(net).items()}
    xshape = tuple(spec.get('spatial', ())) + (spec['n_in'],)
    xs = spec['x_scale'] * rng.standard_normal((T, B) + xshape)
    ys = 0.5 * rng.standard_normal((T, B, spec['n_out']))

    Wj = {k: jnp.asarray(v) for k, v in W.items()}
    f = lambda w: bptt_rollout(layer, spec, st, w, jnp.asarray(xs), jnp.asarray(ys))  # noqa
    (_, (bl, bo, bh)), bg = jax.value_and_grad(f, has_aux=True)(Wj)
    bg = {k: np.asarray(v) for k, v in bg.items()}
    bl, bo, bh = np.asarray(bl), np.asarray(bo), {k: np.asarray(v) for k, v in bh.items()}

    cases = []
    for suffix, algo_name, options in spec['algos']:
        r = run_etrace(layer, spec, st, algo_name, options, W, xs, ys)
        assert set(r['grads']) == set(W), (sorted(r['grads']), sorted(W))
        assert np.allclose(r['losses'], bl, rtol=1e-12, atol=1e-14), \
            f'{layer}: braintrace losses differ from the equations'
        opt_str = ''.join(f', {k}={v!r}' for k, v in options.items())
        case_id = f'e2e__wl_{layer}__{suffix}'
        case = {
            'schema_version': e2e.SCHEMA_VERSION,
            'kind': 'e2e',
            'case_id': case_id,
            'model': f'wl_{layer}',
            'dims': {k: spec[k] for k in ('n_in', 'n_rec', 'n_out', 'T', 'B')},
            'hyperparams': {},
            'layer': enc_structure(st),
            'algorithm': algo_name,
            'algorithm_options': dict(options),
            'vjp_method': options.get('vjp_method', 'single-step'),
            'compile_call': (f'braintrace.compile(model, braintrace.{algo_name}, '
                             f'jnp.zeros(xs.shape[1:]), batch_size=B{opt_str})'),
            'etrace_grad_call': e2e.ETRACE_GRAD_CALL,
            'weights': enc_tree(W),
            'initial_hidden': enc_tree(r['initial']),
            'xs': enc(xs),
            'ys': enc(ys),
            'etrace': {'grads': enc_tree(r['grads']),
                       'grad_dtypes': {k: str(r['grads'][k].dtype) for k in sorted(r['grads'])},
                       'losses': enc(r['losses'])},
            'bptt': {'objective': e2e.BPTT_OBJECTIVE, 'grads': enc_tree(bg), 'losses': enc(bl),
                     'outputs': enc(bo), 'hidden': enc_tree(bh)},
            'max_abs_diff_etrace_vs_bptt': {
                k: float(np.max(np.abs(r['grads'][k] - bg[k]))) for k in sorted(bg)},
            'graph': r['graph'],
            'compile_warnings': r['compile_warnings'],
            'run_warnings': r['run_warnings'],
            'spike_threshold_margin': None,
            'generator': gen,
        }
        cases.append((case_id, case))
        print(f"{case_id}: max|etrace-bptt| = {max(case['max_abs_diff_etrace_vs_bptt'].values()):.3g}"
              f", {len(r['graph']['relations'])} relations, {len(r['compile_warnings'])} warnings",
              file=sys.stderr)
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--seed', type=int, default=34003)
    ap.add_argument('--only', nargs='*', help='layers to generate (' + ' '.join(LAYERS) + ')')
    a = ap.parse_args(argv)
    gen = {'schema_version': e2e.SCHEMA_VERSION, 'seed': a.seed, 'variant_set': 'zoo_wlayers',
           'versions': e2e.versions(), 'float': 'float64 (jax_enable_x64)', 'backend': 'cpu',
           'brainevent_cpu_backend': 'jax_raw'}
    os.makedirs(a.out, exist_ok=True)
    written = []
    for spec in specs():
        if a.only and spec['layer'] not in a.only:
            continue
        for case_id, case in make_cases(spec, a.seed, gen):
            with open(os.path.join(a.out, case_id + '.json'), 'w') as fh:
                fh.write(json.dumps(case, separators=(',', ':'), allow_nan=False))
            written.append(case_id + '.json')
    mpath = os.path.join(a.out, 'MANIFEST.json')
    files = set(written)
    if os.path.exists(mpath):
        with open(mpath) as fh:
            files |= set(json.load(fh).get('files', []))
    manifest = dict(gen, files=sorted(files))
    manifest['total_bytes'] = sum(os.path.getsize(os.path.join(a.out, f)) for f in files
                                  if os.path.exists(os.path.join(a.out, f)))
    with open(mpath, 'w') as fh:
        fh.write(json.dumps(manifest, separators=(',', ':'), allow_nan=False))
    print(f'{len(written)} files written', file=sys.stderr)
    return 0


if __name__ == '__main__':
    with warnings.catch_warnings():
        sys.exit(main())
