"""Record golden cases of braintrace 0.2.6's grouped-matmul and embedding primitives.

Two kinds of files go to ``--out`` (``tests/golden_gprims``):

* ``prim__<name>.json``: one primitive (``etp_gmm``, ``etp_gmv``, ``etp_emb``,
  ``etp_emb_v``) at fixed float64 draws: the forward ``y``, the JVP and VJP
  of ``y`` in the trainables (``jax.jvp`` / ``jax.vjp`` of the bound
  primitive), and braintrace's own rules called on them: ``dt_to_t`` (this
  project's ``yw_to_w``) with a y-shaped factor and a trace slice,
  ``xy_to_dw`` with the batch's ``x`` and with one sample's, for the
  embedding also with a float ``x`` (the filtered one-hot pp_prop's input
  trace holds), and the shapes of ``init_drtrl`` / ``init_pp`` for
  ``num_hidden_state = 2``. The embedding's indices are recorded as
  integers in ``indices``.
* ``e2e__gp_<model>__<algo>.json``: end-to-end cases in the e2e schema of
  ``generate_e2e.py`` (``shared/golden/README.md`` section 6) for two small
  nets:

  - ``gp_grouped``: ``h' = tanh(inp(x) + rec(h))`` with ``inp``, ``rec``
    ``braintrace.nn.GroupedLinear`` (``G = 2`` groups; ``x`` is
    ``(B, G, n_in)``, ``h`` is ``(B, G, n_rec)``), and a
    ``braintrace.nn.Linear`` readout ``out`` of ``h`` flattened;
  - ``gp_emb``: ``h' = tanh(emb(tok) + rec(h))`` with ``emb`` a
    ``braintrace.nn.Embedding(n_in, n_rec)`` (``n_in`` is the vocabulary),
    ``rec`` a ``braintrace.nn.Linear``, and a ``Linear`` readout ``out``.
    The tokens ``xs`` are drawn as integers and recorded as float64.

  ``etrace`` is ``braintrace.compile(...)`` + ``learner.etrace_grad(...)``,
  ``bptt`` is ``jax.grad`` of a pure-JAX unroll of the equations written
  below (no ETP primitive). Cases per net: batch 2 with D-RTRL and pp_prop,
  single- and multi-step; batch 1 with D-RTRL single-step and pp_prop
  multi-step.

Draws: ``numpy.random.default_rng([seed, crc32(<case name>)])``. Nothing
reads the Rust code.

Run (from the repository root, braintrace 0.2.6's venv)::

    $PY scripts/golden_gen/generate_gprims.py --out tests/golden_gprims
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
import warnings
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Encoders, weight-key helpers (importing it also switches on x64 and the CPU backend).
import generate_e2e as e2e  # noqa: E402
from generate_e2e import enc, enc_tree, flat_keys, set_weights  # noqa: E402

import brainstate  # noqa: E402
import braintrace  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import importlib  # noqa: E402

# The modules (``braintrace._op.embedding`` is shadowed by the function of that name).
bt_emb = importlib.import_module('braintrace._op.embedding')
bt_grp = importlib.import_module('braintrace._op.grouped')

G = 2  # groups of the gp_grouped net

FNS = {None: None, 'tanh': jnp.tanh, 'softplus': jax.nn.softplus, 'square': jnp.square,
       'exp': jnp.exp, 'sigmoid': jax.nn.sigmoid}


# ----------------------------------------------------------------- primitive cases

def var(shape, dtype=jnp.float64):
    """A stand-in for a jaxpr var: only ``.aval`` is read by the initialisers."""
    return types.SimpleNamespace(aval=jax.ShapeDtypeStruct(tuple(shape), dtype))


PRIM_SPECS = [
    dict(name='etp_gmm__bias', prim='etp_gmm', B=3, G=2, K=3, N=4, bias=True),
    dict(name='etp_gmm__tanh_softplus', prim='etp_gmm', B=2, G=3, K=2, N=3, bias=True,
         weight_fn='tanh', bias_fn='softplus'),
    dict(name='etp_gmm__nobias_square', prim='etp_gmm', B=2, G=2, K=4, N=2, bias=False,
         weight_fn='square'),
    dict(name='etp_gmv__bias_exp', prim='etp_gmv', G=3, K=2, N=3, bias=True, weight_fn='exp'),
    dict(name='etp_emb__plain', prim='etp_emb', B=4, V=5, D=3),
    dict(name='etp_emb__tanh', prim='etp_emb', B=3, V=4, D=2, weight_fn='tanh'),
    dict(name='etp_emb_v__sigmoid', prim='etp_emb_v', V=6, D=3, weight_fn='sigmoid'),
]


def prim_case(spec, seed, gen):
    rng = np.random.default_rng([seed, zlib.crc32(('prim__' + spec['name']).encode())])
    n = lambda *s: rng.standard_normal(s)  # noqa: E731
    wf, bf = FNS[spec.get('weight_fn')], FNS[spec.get('bias_fn')]
    prim = spec['prim']
    out = {'kind': 'prim', 'case_id': 'prim__' + spec['name'], 'primitive': prim,
           'params': {'weight_fn': spec.get('weight_fn'), 'bias_fn': spec.get('bias_fn'),
                      'has_bias': bool(spec.get('bias', False))}}
    if prim in ('etp_gmm', 'etp_gmv'):
        g, k, nn = spec['G'], spec['K'], spec['N']
        batched = prim == 'etp_gmm'
        x = n(spec['B'], g, k) if batched else n(g, k)
        W = {'weight': n(g, k, nn)}
        if spec['bias']:
            W['bias'] = n(g, nn)
        p = bt_grp.etp_gmm_p if batched else bt_grp.etp_gmv_p
        kw = dict(has_bias=spec['bias'], weight_fn=wf, bias_fn=bf)

        def f(w):
            args = [jnp.asarray(x), w['weight']] + ([w['bias']] if spec['bias'] else [])
            return p.bind(*args, **kw)

        dt_to_t, xy_to_dw = bt_grp._gmm_dt_to_t, bt_grp._gmm_xy_to_dw
        init_drtrl = bt_grp._gmm_init_drtrl if batched else bt_grp._gmv_init_drtrl
        init_pp = bt_grp._gmm_init_pp
        x_enc = enc(x)
        x_sample = x[0] if batched else None
    else:
        v, d = spec['V'], spec['D']
        batched = prim == 'etp_emb'
        idx = rng.integers(0, v, size=(spec['B'],) if batched else ())
        x = jnp.asarray(idx, jnp.int32)
        W = {'weight': n(v, d)}
        p = bt_emb.etp_emb_p if batched else bt_emb.etp_emb_v_p
        kw = dict(weight_fn=wf)

        def f(w):
            return p.bind(x, w['weight'], **kw)

        dt_to_t, xy_to_dw = bt_emb._emb_dt_to_t, bt_emb._emb_xy_to_dw
        init_drtrl = bt_emb._emb_init_drtrl if batched else bt_emb._emb_v_init_drtrl
        init_pp = bt_emb._emb_init_pp
        out['indices'] = np.asarray(idx).tolist()
        x_enc = None
        x_sample = x[0] if batched else None
    Wj = {k: jnp.asarray(a) for k, a in W.items()}
    y = f(Wj)
    tang = {k: n(*a.shape) for k, a in W.items()}
    _, jv = jax.jvp(f, (Wj,), ({k: jnp.asarray(a) for k, a in tang.items()},))
    ct = n(*y.shape)
    _, pull = jax.vjp(f, Wj)
    vj = pull(jnp.asarray(ct))[0]
    # Rules. The kwargs the rules take are the primitive's params.
    kw_rule = kw
    h = n(*y.shape)
    xv = var(np.shape(x), jnp.asarray(x).dtype)
    yv = var(y.shape)
    wv = {k: var(a.shape) for k, a in W.items()}
    drtrl = init_drtrl(xv, yv, wv, 2)
    pp = init_pp(xv, yv, wv, 2)
    trace = {k: n(*a.shape[:-1]) for k, a in drtrl.items()}
    dtt = dt_to_t(jnp.asarray(h), {k: jnp.asarray(a) for k, a in trace.items()}, **kw_rule)
    dw = xy_to_dw(x if x_enc is None else jnp.asarray(x), jnp.asarray(h), Wj, **kw_rule)
    out.update({
        'x': x_enc, 'weights': enc_tree(W), 'y': enc(y),
        'jvp': {'tangents': enc_tree(tang), 'y_dot': enc(jv)},
        'vjp': {'cotangent': enc(ct), 'grads': enc_tree({k: np.asarray(a) for k, a in vj.items()})},
        'dt_to_t': {'hidden': enc(h), 'trace': enc_tree(trace),
                    'out': enc_tree({k: np.asarray(a) for k, a in dtt.items()})},
        'xy_to_dw': {'hidden': enc(h), 'out': enc_tree({k: np.asarray(a) for k, a in dw.items()})},
        'init_drtrl_shapes': {k: list(a.shape) for k, a in drtrl.items()},
        'init_pp_shape': list(pp.shape),
    })
    if x_sample is not None:
        hs = n(*y.shape[1:])
        dws = xy_to_dw(x_sample, jnp.asarray(hs), Wj, **kw_rule)
        out['xy_to_dw_sample'] = {'hidden': enc(hs),
                                  'out': enc_tree({k: np.asarray(a) for k, a in dws.items()})}
    if prim.startswith('etp_emb'):
        # The pp_prop input trace: a float x̄ shaped like the one-hot.
        xbar = np.abs(n(*(np.shape(x) + (spec['V'],))))
        dwf = xy_to_dw(jnp.asarray(xbar), jnp.asarray(h), Wj, **kw_rule)
        out['xy_to_dw_float_x'] = {'x': enc(xbar), 'hidden': enc(h),
                                   'out': enc_tree({k: np.asarray(a) for k, a in dwf.items()})}
        rep = bt_emb._emb_pp_x_repr(x, {'weight': jax.ShapeDtypeStruct(W['weight'].shape, jnp.float64)})
        out['pp_x_repr'] = enc(np.asarray(rep))
    out['generator'] = gen
    return out['case_id'], out


# ----------------------------------------------------------------- the nets

class GroupedNet(brainstate.nn.Module):
    """``h' = tanh(inp(x) + rec(h))`` with grouped layers, a Linear readout ``out``."""

    def __init__(self, n_in, n_rec, n_out):
        super().__init__()
        self.n_rec = n_rec
        self.inp = braintrace.nn.GroupedLinear(G, n_in, n_rec)
        self.rec = braintrace.nn.GroupedLinear(G, n_rec, n_rec)
        self.out = braintrace.nn.Linear(G * n_rec, n_out)

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, G, self.n_rec)))

    def update(self, x):
        h = jnp.tanh(self.inp(x) + self.rec(self.h.value))
        self.h.value = h
        return self.out(h.reshape(h.shape[0], -1))


class EmbNet(brainstate.nn.Module):
    """``h' = tanh(emb(tok) + rec(h))``, a Linear readout ``out``."""

    def __init__(self, n_in, n_rec, n_out):
        super().__init__()
        self.n_rec = n_rec
        self.emb = braintrace.nn.Embedding(n_in, n_rec)
        self.rec = braintrace.nn.Linear(n_rec, n_rec)
        self.out = braintrace.nn.Linear(n_rec, n_out)

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, self.n_rec)))

    def update(self, tok):
        h = jnp.tanh(self.emb(tok) + self.rec(self.h.value))
        self.h.value = h
        return self.out(h)


NETS = {'grouped': GroupedNet, 'emb': EmbNet}


def net_step(model, W, h, x):
    """One step from the equations (pure JAX); returns (h', output)."""
    if model == 'grouped':
        def gl(name, v):
            return (jnp.einsum('bgk,gkn->bgn', v, W[f'{name}/weight/weight'])
                    + W[f'{name}/weight/bias'])
        hn = jnp.tanh(gl('inp', x) + gl('rec', h))
        flat = hn.reshape(hn.shape[0], -1)
    else:
        e = W['emb/weight'][x.astype(jnp.int32)]
        hn = jnp.tanh(e + h @ W['rec/weight/weight'] + W['rec/weight/bias'])
        flat = hn
    return hn, flat @ W['out/weight/weight'] + W['out/weight/bias']


def bptt_rollout(model, W, xs, ys, h0):
    h = h0
    losses, outs, hid = [], [], []
    for t in range(xs.shape[0]):
        h, o = net_step(model, W, h, xs[t])
        losses.append(jnp.mean((o - ys[t]) ** 2))
        outs.append(o)
        hid.append(h)
    losses = jnp.stack(losses)
    return jnp.mean(losses), (losses, jnp.stack(outs), jnp.stack(hid))


def run_etrace(net, algo_name, options, W, xs, ys, x0):
    set_weights(net, W)
    algo = getattr(braintrace, algo_name)
    B = x0.shape[0]
    with warnings.catch_warnings(record=True) as cws:
        warnings.simplefilter('always')
        learner = braintrace.compile(net, algo, x0, batch_size=B, **options)
    initial = {e2e.path_str(p): np.asarray(st.value)
               for p, st in net.states(brainstate.HiddenState).items()}
    with warnings.catch_warnings(record=True) as rws:
        warnings.simplefilter('always')
        grads, losses = learner.etrace_grad(
            xs, jnp.asarray(ys),
            step_fn=lambda x, y: jnp.mean((learner(x) - y) ** 2), return_value=True)
    grads = {k: np.asarray(v) for k, v in e2e.flat_grads(grads).items()}
    graph = learner.graph
    gidx = {id(g): g.index for g in graph.hidden_groups}
    groups = [{'index': g.index, 'hidden_paths': [e2e.path_str(p) for p in g.hidden_paths],
               'varshape': list(g.varshape), 'num_state': int(g.num_state)}
              for g in graph.hidden_groups]
    rels = [{'primitive': r.primitive.name,
             'trainable': {k: e2e.path_str(p) for k, p in r.trainable_paths.items()},
             'hidden_groups': [gidx[id(g)] for g in r.hidden_groups]}
            for r in graph.hidden_param_op_relations]
    return dict(grads=grads, losses=np.asarray(losses), initial=initial,
                graph={'hidden_groups': groups, 'relations': rels},
                compile_warnings=e2e.warn_strings(cws), run_warnings=e2e.warn_strings(rws))


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


def e2e_specs():
    out = []
    for model, (n_in, n_rec, n_out) in {'grouped': (2, 3, 2), 'emb': (5, 3, 2)}.items():
        base = dict(model=model, n_in=n_in, n_rec=n_rec, n_out=n_out, w_scale=0.6)
        out.append(dict(base, T=5, B=2, algos=ALGOS_B2))
        out.append(dict(base, T=6, B=1, algos=ALGOS_B1))
    return out


def e2e_cases(spec, seed, gen):
    model, B, T = spec['model'], spec['B'], spec['T']
    n_in, n_rec, n_out = spec['n_in'], spec['n_rec'], spec['n_out']
    rng = np.random.default_rng([seed, zlib.crc32(f'gp__{model}__b{B}'.encode())])
    net = NETS[model](n_in, n_rec, n_out)
    W = {k: spec['w_scale'] * rng.standard_normal(s) for k, s in flat_keys(net).items()}
    if model == 'grouped':
        xs = rng.standard_normal((T, B, G, n_in))
        xs_j, x0 = jnp.asarray(xs), jnp.zeros((B, G, n_in))
        h0 = jnp.zeros((B, G, n_rec))
    else:
        toks = rng.integers(0, n_in, size=(T, B))
        xs = toks.astype(np.float64)
        xs_j, x0 = jnp.asarray(toks, jnp.int32), jnp.zeros((B,), jnp.int32)
        h0 = jnp.zeros((B, n_rec))
    ys = 0.5 * rng.standard_normal((T, B, n_out))

    Wj = {k: jnp.asarray(v) for k, v in W.items()}
    f = lambda w: bptt_rollout(model, w, xs_j, jnp.asarray(ys), h0)  # noqa: E731
    (_, (bl, bo, bh)), bg = jax.value_and_grad(f, has_aux=True)(Wj)
    bg = {k: np.asarray(v) for k, v in bg.items()}
    bl, bo, bh = np.asarray(bl), np.asarray(bo), {'h': np.asarray(bh)}
    cases = []
    for suffix, algo_name, options in spec['algos']:
        net = NETS[model](n_in, n_rec, n_out)
        r = run_etrace(net, algo_name, options, W, xs_j, ys, x0)
        assert set(r['grads']) == set(W), (sorted(r['grads']), sorted(W))
        assert np.allclose(r['losses'], bl, rtol=1e-12, atol=1e-14), \
            f'{model}: braintrace losses differ from the equations'
        opt_str = ''.join(f', {k}={v!r}' for k, v in options.items())
        case_id = f'e2e__gp_{model}__{suffix}'
        x0_str = 'jnp.zeros((B, G, n_in))' if model == 'grouped' else 'jnp.zeros((B,), jnp.int32)'
        case = {
            'schema_version': e2e.SCHEMA_VERSION,
            'kind': 'e2e',
            'case_id': case_id,
            'model': f'gp_{model}',
            'dims': {k: spec[k] for k in ('n_in', 'n_rec', 'n_out', 'T', 'B')},
            'hyperparams': {},
            'algorithm': algo_name,
            'algorithm_options': dict(options),
            'vjp_method': options.get('vjp_method', 'single-step'),
            'compile_call': (f'braintrace.compile(model, braintrace.{algo_name}, '
                             f'{x0_str}, batch_size=B{opt_str})'),
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
    a = ap.parse_args(argv)
    gen = {'schema_version': e2e.SCHEMA_VERSION, 'seed': a.seed, 'variant_set': 'gprims',
           'versions': e2e.versions(), 'float': 'float64 (jax_enable_x64)', 'backend': 'cpu'}
    os.makedirs(a.out, exist_ok=True)
    written = []
    items = [prim_case(s, a.seed, gen) for s in PRIM_SPECS]
    for spec in e2e_specs():
        items.extend(e2e_cases(spec, a.seed, gen))
    for case_id, case in items:
        with open(os.path.join(a.out, case_id + '.json'), 'w') as fh:
            fh.write(json.dumps(case, separators=(',', ':'), allow_nan=False))
        written.append(case_id + '.json')
    manifest = dict(gen, files=sorted(written))
    with open(os.path.join(a.out, 'MANIFEST.json'), 'w') as fh:
        fh.write(json.dumps(manifest, separators=(',', ':'), allow_nan=False))
    print(f'{len(written)} files written', file=sys.stderr)
    return 0


if __name__ == '__main__':
    with warnings.catch_warnings():
        sys.exit(main())
