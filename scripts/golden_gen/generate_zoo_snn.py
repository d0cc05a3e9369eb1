"""Record golden cases for the spiking zoo from the real braintrace 0.2.6.

Two kinds of files, in the schema of ``generate_e2e.py`` (golden README):

* ``surrogates.json`` (``"kind": "surrogates"``): for each of braintools'
  surrogate gradients (class name, parameters) the points ``u`` and the
  gradient ``d spike(u) / du`` that ``jax.grad`` gives through
  ``braintools.surrogate.<Class>(...)`` (its Heaviside primitive), and its
  forward values (``x >= 0``).
* ``e2e__<model>__<algo>.json`` (``"kind": "e2e"``): networks of
  ``brainpy.state`` neurons and synapses (``IF``, ``LIF``, ``ALIF``,
  ``Expon``, ``Alpha``, ``DualExpon``, ``STP``, ``STD``) and braintools'
  ``spike_bitwise``, between a ``braintrace.nn.Linear`` input layer over
  ``[x, previous spikes]`` and a ``braintrace.nn.LeakyRateReadout``; D-RTRL
  and pp_prop, single- and multi-step, batch 1 and > 1. ``etrace`` is
  ``braintrace.compile`` + ``etrace_grad``; ``bptt`` is ``jax.grad`` of a
  plain JAX unroll of the equations written out below (no ETP primitive,
  no brainpy.state class; only braintools' surrogate for the spike).

For every spiking model a draw whose scaled membrane potential (the
surrogate's argument) comes within ``--min-margin`` of zero anywhere in the
rollout is rejected and redrawn (as ``generate_e2e.py`` does for its LIF):
near the threshold a rounding difference flips a spike.

Nothing here reads the Rust code. Run from the repository root::

    $(scripts/ref_python.sh) scripts/golden_gen/generate_zoo_snn.py --out tests/golden_snn
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import generate_e2e as ge  # noqa: E402  (sets x64, dt = 1, the CPU backend)

import brainpy  # noqa: E402
import brainstate  # noqa: E402
import braintools  # noqa: E402
import braintrace  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

SG = braintools.surrogate
C = braintools.init.Constant
DT = 1.0

# ----------------------------------------------------------------- surrogates

SURROGATES = [
    ('Sigmoid', {'alpha': 4.0}), ('Sigmoid', {'alpha': 2.5}),
    ('Arctan', {'alpha': 1.0}), ('Arctan', {'alpha': 2.0}),
    ('ReluGrad', {'alpha': 0.3, 'width': 1.0}), ('ReluGrad', {'alpha': 0.7, 'width': 0.6}),
    ('PiecewiseQuadratic', {'alpha': 1.0}), ('PiecewiseQuadratic', {'alpha': 2.5}),
    ('PiecewiseExp', {'alpha': 1.0}), ('PiecewiseExp', {'alpha': 3.0}),
    ('SoftSign', {'alpha': 1.0}), ('SoftSign', {'alpha': 4.0}),
    ('ERF', {'alpha': 1.0}), ('ERF', {'alpha': 2.0}),
    ('GaussianGrad', {'sigma': 0.5, 'alpha': 0.5}), ('GaussianGrad', {'sigma': 0.8, 'alpha': 1.3}),
    ('MultiGaussianGrad', {'h': 0.15, 's': 6.0, 'sigma': 0.5, 'scale': 0.5}),
    ('MultiGaussianGrad', {'h': 0.3, 's': 2.0, 'sigma': 0.4, 'scale': 1.0}),
    ('InvSquareGrad', {'alpha': 100.0}), ('InvSquareGrad', {'alpha': 3.0}),
    ('SlayerGrad', {'alpha': 1.0}), ('SlayerGrad', {'alpha': 2.5}),
    ('LeakyRelu', {'alpha': 0.1, 'beta': 1.0}), ('LeakyRelu', {'alpha': 0.3, 'beta': 0.8}),
    ('QPseudoSpike', {'alpha': 2.0}), ('QPseudoSpike', {'alpha': 1.0}),
    ('QPseudoSpike', {'alpha': 3.5}),
]


def surrogate_points():
    """Points off every kink (0, ±width, ±1/alpha are avoided by the offset)."""
    u = np.linspace(-2.6, 2.6, 27) + 0.0137
    return np.concatenate([u, [-40.0, -0.003, 0.002, 0.31, 55.0]])


def make_surrogates(gen_block):
    u = surrogate_points()
    entries = []
    for name, params in SURROGATES:
        fn = getattr(SG, name)(**params)
        g = jax.vmap(jax.grad(lambda x: fn(x)))(jnp.asarray(u))
        y = fn(jnp.asarray(u))
        entries.append({'class': name, 'params': params, 'u': ge.enc(u),
                        'grad': ge.enc(np.asarray(g)), 'forward': ge.enc(np.asarray(y))})
    return {'schema_version': ge.SCHEMA_VERSION, 'kind': 'surrogates',
            'case_id': 'surrogates', 'call': 'jax.vmap(jax.grad(braintools.surrogate.<class>(**params)))(u)',
            'entries': entries, 'generator': gen_block}


def surrogate_of(hp):
    return getattr(SG, hp['surrogate'])(**hp['surrogate_params'])


# ----------------------------------------------------------------- the networks

def neuron(hp, n):
    kind, sf, reset = hp['neuron'], surrogate_of(hp), hp['reset']
    if kind == 'IF':
        return brainpy.state.IF(n, R=hp['R'], tau=hp['tau'], V_th=hp['V_th'],
                                V_initializer=C(0.), spk_fun=sf, spk_reset=reset)
    if kind == 'LIF':
        return brainpy.state.LIF(n, R=hp['R'], tau=hp['tau'], V_th=hp['V_th'],
                                 V_reset=hp['V_reset'], V_rest=hp['V_rest'],
                                 V_initializer=C(0.), spk_fun=sf, spk_reset=reset)
    if kind == 'ALIF':
        return brainpy.state.ALIF(n, R=hp['R'], tau=hp['tau'], tau_a=hp['tau_a'],
                                  V_th=hp['V_th'], V_reset=hp['V_reset'], V_rest=hp['V_rest'],
                                  beta=hp['beta'], spk_fun=sf, spk_reset=reset,
                                  V_initializer=C(0.), a_initializer=C(0.))
    raise ValueError(kind)


def synapse(hp, n):
    kind = hp['synapse']
    if kind == 'Expon':
        return brainpy.state.Expon(n, tau=hp['tau_syn'], g_initializer=C(0.))
    if kind == 'Alpha':
        return brainpy.state.Alpha(n, tau=hp['tau_syn'], g_initializer=C(0.))
    if kind == 'DualExpon':
        return brainpy.state.DualExpon(n, tau_decay=hp['tau_decay'], tau_rise=hp['tau_rise'],
                                       amplitude=hp['amplitude'], normalize=True,
                                       g_initializer=C(0.))
    if kind == 'none':
        return None
    raise ValueError(kind)


def plasticity(hp, n):
    kind = hp['plasticity']
    if kind == 'STD':
        return brainpy.state.STD(n, tau=hp['tau_std'], U=hp['U'])
    if kind == 'STP':
        return brainpy.state.STP(n, U=hp['U'], tau_f=hp['tau_f'], tau_d=hp['tau_d'])
    if kind == 'none':
        return None
    raise ValueError(kind)


class SnnNet(brainstate.nn.Module):
    """x -> Linear over [x, previous spikes] -> synapse -> neuron ->
    [short-term plasticity of (spikes OR previous spikes)] -> leaky readout."""

    def __init__(self, n_in, n_rec, n_out, hp):
        super().__init__()
        self.hp = hp
        self.syn_in = braintrace.nn.Linear(n_in + n_rec, n_rec)
        syn = synapse(hp, n_rec)
        if syn is not None:
            self.syn = syn
        self.neu = neuron(hp, n_rec)
        pl = plasticity(hp, n_rec)
        if pl is not None:
            setattr(self, hp['plasticity'].lower(), pl)
        self.readout = braintrace.nn.LeakyRateReadout(n_rec, n_out, tau=hp['tau_out'])

    def update(self, x):
        s_prev = self.neu.get_spike()
        i = self.syn_in(jnp.concatenate([x, s_prev], axis=-1))
        if self.hp['synapse'] != 'none':
            i = self.syn(i)
        s = self.neu(i)
        if self.hp['plasticity'] != 'none':
            s = getattr(self, self.hp['plasticity'].lower())(
                braintools.spike_bitwise(s, s_prev, self.hp['bitwise']))
        return self.readout(s)


def hidden_shapes(hp, n_rec, n_out):
    h = {'neu/V': n_rec, 'readout/r': n_out}
    if hp['neuron'] == 'ALIF':
        h['neu/a'] = n_rec
    h.update({'Expon': {'syn/g': n_rec}, 'Alpha': {'syn/g': n_rec, 'syn/h': n_rec},
              'DualExpon': {'syn/g_rise': n_rec, 'syn/g_decay': n_rec},
              'none': {}}[hp['synapse']])
    h.update({'STD': {'std/x': n_rec}, 'STP': {'stp/u': n_rec, 'stp/x': n_rec},
              'none': {}}[hp['plasticity']])
    return h


def initial_value(hp, k):
    return {'std/x': 1.0, 'stp/x': 1.0, 'stp/u': hp.get('U', 0.0)}.get(k, 0.0)


# ----------------------------------------------------------------- pure-JAX reference

def bptt_rollout(W, hp, xs, ys, B, dims):
    """Plain unroll of the equations (exact exponential-Euler steps of the
    linear ODEs); returns (objective, (losses, outs, hidden, scaled_potentials))."""
    n_rec, n_out = dims['n_rec'], dims['n_out']
    sf = surrogate_of(hp)
    e = lambda tau: math.exp(-DT / tau)  # noqa: E731
    kind = hp['neuron']
    vth = hp['V_th']
    vreset = 0.0 if kind == 'IF' else hp['V_reset']
    vrest = 0.0 if kind == 'IF' else hp['V_rest']
    width = vth - vreset

    def scaled(h):
        v = h['neu/V'] - vth
        if kind == 'ALIF':
            v = v - hp['beta'] * h['neu/a']
        return v / width

    def step(h, x):
        u0 = scaled(h)
        s_prev = sf(u0)
        cur = jnp.concatenate([x, s_prev], -1) @ W['syn_in/weight/weight'] + W['syn_in/weight/bias']
        new = {}
        syn = hp['synapse']
        if syn == 'Expon':
            new['syn/g'] = e(hp['tau_syn']) * h['syn/g'] + cur
            cur = new['syn/g']
        elif syn == 'Alpha':
            k = 1 - e(hp['tau_syn'])
            new['syn/g'] = h['syn/g'] + k * (h['syn/h'] - h['syn/g'])
            new['syn/h'] = e(hp['tau_syn']) * h['syn/h'] + cur
            cur = new['syn/g']
        elif syn == 'DualExpon':
            td, tr = hp['tau_decay'], hp['tau_rise']
            new['syn/g_rise'] = e(tr) * h['syn/g_rise'] + cur
            new['syn/g_decay'] = e(td) * h['syn/g_decay'] + cur
            norm = td / (td - tr) * (tr / td) ** (tr / (tr - td))
            cur = hp['amplitude'] * norm * (new['syn/g_decay'] - new['syn/g_rise'])
        v = h['neu/V']
        drop = width if hp['reset'] == 'soft' else jax.lax.stop_gradient(v) - vreset
        v = v - drop * s_prev
        v = v + (1 - e(hp['tau'])) * (vrest + hp['R'] * cur - v)
        new['neu/V'] = v
        if kind == 'ALIF':
            new['neu/a'] = e(hp['tau_a']) * (h['neu/a'] + s_prev)
        u1 = scaled(new)
        s = sf(u1)
        pl = hp['plasticity']
        if pl != 'none':
            op = hp['bitwise']
            pre = {'or': s + s_prev - s * s_prev, 'and': s * s_prev,
                   'iand': (1 - s) * s_prev, 'xor': s + s_prev - 2 * s * s_prev}[op]
            if pl == 'STD':
                x1 = h['std/x'] + (1 - e(hp['tau_std'])) * (1 - h['std/x'])
                new['std/x'] = x1 - pre * hp['U'] * h['std/x']
                s = x1 * pre
            else:
                uu = e(hp['tau_f']) * h['stp/u'] + pre * hp['U'] * (1 - h['stp/u'])
                x1 = h['stp/x'] + (1 - e(hp['tau_d'])) * (1 - h['stp/x'])
                new['stp/u'] = uu
                new['stp/x'] = x1 - pre * uu * h['stp/x']
                s = uu * x1 * pre
        new['readout/r'] = math.exp(-DT / hp['tau_out']) * h['readout/r'] + s @ W['readout/W']
        return new, new['readout/r'], jnp.stack([u0, u1])

    shapes = hidden_shapes(hp, n_rec, n_out)
    h = {k: jnp.full((B, w), initial_value(hp, k)) for k, w in sorted(shapes.items())}
    losses, outs, hid, us = [], [], {k: [] for k in h}, []
    for t in range(xs.shape[0]):
        h, o, u = step(h, xs[t])
        losses.append(jnp.mean((o - ys[t]) ** 2))
        outs.append(o)
        us.append(u)
        for k in hid:
            hid[k].append(h[k])
    losses = jnp.stack(losses)
    aux = (losses, jnp.stack(outs), {k: jnp.stack(v) for k, v in hid.items()}, jnp.stack(us))
    return jnp.mean(losses), aux


# ----------------------------------------------------------------- cases

def variants():
    """Models (each a neuron, a synapse, maybe a plasticity) and their settings."""
    lif = dict(neuron='LIF', R=1.0, tau=5.0, V_th=1.0, V_reset=0.0, V_rest=0.0)
    base = dict(tau_out=5.0, dt=DT, plasticity='none')
    return [
        dict(model='snn_lif_expon', n_in=3, n_rec=5, n_out=3, w_scale=1.2, x_scale=1.5,
             hp=dict(base, **lif, synapse='Expon', tau_syn=4.0, reset='soft',
                     surrogate='ReluGrad', surrogate_params={'alpha': 0.3, 'width': 1.0})),
        dict(model='snn_lif_hard', n_in=2, n_rec=4, n_out=2, w_scale=1.3, x_scale=1.8,
             hp=dict(base, neuron='LIF', R=1.5, tau=8.0, V_th=0.8, V_reset=-0.2, V_rest=0.1,
                     synapse='none', reset='hard', surrogate='Sigmoid',
                     surrogate_params={'alpha': 4.0})),
        dict(model='snn_if_alpha', n_in=3, n_rec=4, n_out=3, w_scale=1.5, x_scale=1.6,
             hp=dict(base, neuron='IF', R=1.0, tau=6.0, V_th=0.9, synapse='Alpha',
                     tau_syn=3.0, reset='soft', surrogate='PiecewiseQuadratic',
                     surrogate_params={'alpha': 1.0})),
        dict(model='snn_alif_dualexpon', n_in=3, n_rec=4, n_out=2, w_scale=1.6, x_scale=1.7,
             hp=dict(base, neuron='ALIF', R=1.0, tau=5.0, tau_a=20.0, V_th=1.0, V_reset=0.0,
                     V_rest=0.0, beta=0.4, synapse='DualExpon', tau_decay=6.0, tau_rise=2.0,
                     amplitude=1.5, reset='soft', surrogate='Arctan',
                     surrogate_params={'alpha': 1.0})),
        dict(model='snn_lif_std', n_in=3, n_rec=4, n_out=2, w_scale=1.4, x_scale=1.6,
             hp=dict(base, **lif, synapse='Expon', tau_syn=3.0, reset='soft',
                     surrogate='SoftSign', surrogate_params={'alpha': 1.0},
                     plasticity='STD', tau_std=10.0, U=0.3, bitwise='or')),
        dict(model='snn_lif_stp', n_in=3, n_rec=4, n_out=2, w_scale=1.4, x_scale=1.6,
             hp=dict(base, **lif, synapse='none', reset='soft',
                     surrogate='GaussianGrad', surrogate_params={'sigma': 0.5, 'alpha': 0.5},
                     plasticity='STP', tau_f=15.0, tau_d=8.0, U=0.2, bitwise='xor')),
    ]


ALGOS = [
    # (suffix, algorithm, options, T, B)
    ('d_rtrl', 'D_RTRL', {}, 6, 2),
    ('pp_prop', 'pp_prop', {'decay_or_rank': 0.9}, 6, 2),
    ('d_rtrl_multistep_b1', 'D_RTRL', {'vjp_method': 'multi-step'}, 6, 1),
    ('pp_prop_multistep_b1', 'pp_prop', {'decay_or_rank': 0.8, 'vjp_method': 'multi-step'}, 6, 1),
    ('d_rtrl_b1', 'D_RTRL', {}, 5, 1),
    ('pp_prop_multistep', 'pp_prop', {'decay_or_rank': 0.85, 'vjp_method': 'multi-step'}, 5, 3),
]


def draw(spec, seed, T, B, attempt):
    name = f"zoo_snn__{spec['model']}__{T}x{B}"
    key = [seed, zlib.crc32(name.encode())] + ([attempt] if attempt else [])
    rng = np.random.default_rng(key)
    net = SnnNet(spec['n_in'], spec['n_rec'], spec['n_out'], spec['hp'])
    W = {k: spec['w_scale'] * rng.standard_normal(s) for k, s in ge.flat_keys(net).items()}
    xs = spec['x_scale'] * rng.standard_normal((T, B, spec['n_in']))
    ys = 0.5 * rng.standard_normal((T, B, spec['n_out']))
    return W, xs, ys


def run_bptt(spec, W, xs, ys, B):
    dims = {k: spec[k] for k in ('n_in', 'n_rec', 'n_out')}
    Wj = {k: jnp.asarray(v) for k, v in W.items()}
    f = lambda w: bptt_rollout(w, spec['hp'], jnp.asarray(xs), jnp.asarray(ys), B, dims)  # noqa
    (_, (losses, outs, hid, us)), g = jax.value_and_grad(f, has_aux=True)(Wj)
    return ({k: np.asarray(v) for k, v in g.items()}, np.asarray(losses), np.asarray(outs),
            {k: np.asarray(v) for k, v in hid.items()}, float(np.min(np.abs(np.asarray(us)))))


def run_etrace(spec, algo_name, options, W, xs, ys, B):
    net = SnnNet(spec['n_in'], spec['n_rec'], spec['n_out'], spec['hp'])
    ge.set_weights(net, W)
    algo = getattr(braintrace, algo_name)
    with warnings.catch_warnings(record=True) as cws:
        warnings.simplefilter('always')
        learner = braintrace.compile(net, algo, jnp.zeros((B, spec['n_in'])), batch_size=B,
                                     **options)
    initial = {ge.path_str(p): np.asarray(st.value)
               for p, st in net.states(brainstate.HiddenState).items()}
    with warnings.catch_warnings(record=True) as rws:
        warnings.simplefilter('always')
        grads, losses = learner.etrace_grad(
            jnp.asarray(xs), jnp.asarray(ys),
            step_fn=lambda x, y: jnp.mean((learner(x) - y) ** 2), return_value=True)
    grads = {k: np.asarray(v) for k, v in ge.flat_grads(grads).items()}
    graph = learner.graph
    gidx = {id(g): g.index for g in graph.hidden_groups}
    groups = [{'index': g.index, 'hidden_paths': [ge.path_str(p) for p in g.hidden_paths],
               'varshape': list(g.varshape), 'num_state': int(g.num_state)}
              for g in graph.hidden_groups]
    rels = [{'primitive': r.primitive.name,
             'trainable': {k: ge.path_str(p) for k, p in r.trainable_paths.items()},
             'hidden_groups': [gidx[id(g)] for g in r.hidden_groups]}
            for r in graph.hidden_param_op_relations]
    return dict(grads=grads, losses=np.asarray(losses), initial=initial,
                graph={'hidden_groups': groups, 'relations': rels},
                compile_warnings=ge.warn_strings(cws),
                run_warnings=[w for w in ge.warn_strings(rws) if 'Deprecat' not in w])


def make_cases(spec, seed, gen_block, min_margin):
    cases = []
    for suffix, algo_name, options, T, B in ALGOS:
        attempt = 0
        while True:
            W, xs, ys = draw(spec, seed, T, B, attempt)
            bg, bl, bo, bh, margin = run_bptt(spec, W, xs, ys, B)
            if margin >= min_margin:
                break
            attempt += 1
            if attempt > 200:
                raise RuntimeError(f"{spec['model']}: no draw with a safe threshold margin")
        r = run_etrace(spec, algo_name, options, W, xs, ys, B)
        assert set(r['grads']) == set(W), (sorted(r['grads']), sorted(W))
        assert np.allclose(r['losses'], bl, rtol=1e-12, atol=1e-14), \
            f"{spec['model']}: etrace/bptt losses differ: {r['losses']} vs {bl}"
        for k in bh:
            assert np.allclose(r['initial'][k], initial_value(spec['hp'], k)), k
        opt_str = ''.join(f', {k}={v!r}' for k, v in options.items())
        case_id = f"e2e__{spec['model']}__{suffix}"
        hp = dict(spec['hp'])
        hp['readout_decay'] = math.exp(-DT / hp['tau_out'])
        case = {
            'schema_version': ge.SCHEMA_VERSION, 'kind': 'e2e', 'case_id': case_id,
            'model': spec['model'],
            'dims': {'n_in': spec['n_in'], 'n_rec': spec['n_rec'], 'n_out': spec['n_out'],
                     'T': T, 'B': B},
            'hyperparams': hp, 'algorithm': algo_name,
            'algorithm_options': dict(options),
            'vjp_method': options.get('vjp_method', 'single-step'),
            'compile_call': (f'braintrace.compile(model, braintrace.{algo_name}, '
                             f'jnp.zeros((B, n_in)), batch_size=B{opt_str})'),
            'etrace_grad_call': ge.ETRACE_GRAD_CALL,
            'weights': ge.enc_tree(W), 'initial_hidden': ge.enc_tree(r['initial']),
            'xs': ge.enc(xs), 'ys': ge.enc(ys),
            'etrace': {'grads': ge.enc_tree(r['grads']),
                       'grad_dtypes': {k: str(r['grads'][k].dtype) for k in sorted(r['grads'])},
                       'losses': ge.enc(r['losses'])},
            'bptt': {'objective': ge.BPTT_OBJECTIVE, 'grads': ge.enc_tree(bg),
                     'losses': ge.enc(bl), 'outputs': ge.enc(bo), 'hidden': ge.enc_tree(bh)},
            'max_abs_diff_etrace_vs_bptt': {
                k: float(np.max(np.abs(r['grads'][k] - bg[k]))) for k in sorted(bg)},
            'graph': r['graph'], 'compile_warnings': r['compile_warnings'],
            'run_warnings': r['run_warnings'], 'spike_threshold_margin': margin,
            'generator': gen_block,
        }
        cases.append((case_id, case))
        print(f'{case_id}: max|etrace-bptt| = '
              f"{max(case['max_abs_diff_etrace_vs_bptt'].values()):.3g}, margin {margin:.3g} "
              f'(attempt {attempt})', file=sys.stderr)
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--seed', type=int, default=34034)
    ap.add_argument('--only', nargs='*', help='models to generate')
    ap.add_argument('--min-margin', type=float, default=5e-3)
    a = ap.parse_args(argv)
    gen = {'schema_version': ge.SCHEMA_VERSION, 'seed': a.seed, 'variant_set': 'zoo_snn',
           'versions': dict(ge.versions(), braintools=ge.pkg_version('braintools'),
                            brainpy=ge.pkg_version('brainpy')),
           'float': 'float64 (jax_enable_x64)', 'backend': 'cpu',
           'brainevent_cpu_backend': 'jax_raw'}
    os.makedirs(a.out, exist_ok=True)
    files = {'surrogates.json': make_surrogates(gen)}
    for spec in variants():
        if a.only and spec['model'] not in a.only:
            continue
        for case_id, case in make_cases(spec, a.seed, gen, a.min_margin):
            files[case_id + '.json'] = case
    for fn, case in files.items():
        with open(os.path.join(a.out, fn), 'w') as fh:
            fh.write(json.dumps(case, separators=(',', ':'), allow_nan=False))
    names = sorted(set(files) | set(
        f for f in os.listdir(a.out) if f.endswith('.json') and f != 'MANIFEST.json'))
    manifest = dict(gen, files=names)
    with open(os.path.join(a.out, 'MANIFEST.json'), 'w') as fh:
        fh.write(json.dumps(manifest, separators=(',', ':'), allow_nan=False))
    print(f'{len(files)} files written to {a.out}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
