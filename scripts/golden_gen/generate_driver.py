"""Record golden cases of the sequence driver from the real braintrace 0.2.6.

Each case (``driver__<model>__<case>.json`` in ``--out``) builds a model of
``generate_e2e.py`` (GRU, LIF; reference set A dims and weights), compiles
it with braintrace and runs one driver call with an option:

* ``mask``: ``etrace_grad(mask=m)``, a non-binary mask with zeros, reduction
  ``mean`` (D_RTRL) or ``sum`` (pp_prop);
* ``evolve``: ``etrace_evolve(xs[:3], return_outputs=True)`` then
  ``etrace_grad`` on the remaining steps (pp_prop's bias correction reads
  the step counter the warm-up advanced);
* ``chunk2``: ``etrace_grad(chunk_size=2)`` on a multi-step learner, the
  model called on ``MultiStepData`` windows;
* ``aux2``: two target sequences and ``has_aux=True``.

Recorded: the weights, inputs, options, the gradients, the per-step,
masked and scalar losses, the aux values and the warm-up outputs.
Nothing reads the Rust code.

Run (from the repository root)::

    $(scripts/ref_python.sh) scripts/golden_gen/generate_driver.py --out tests/golden_driver
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import generate_e2e as E  # noqa: E402  (sets x64, the backends)

import braintrace  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

MASK = [0.0, 1.0, 0.5, 0.0, 2.0, 1.0]

CASES = [
    # name, algorithm, options, driver settings
    ('mask', 'D_RTRL', {}, dict(mask=MASK, reduction='mean')),
    ('mask_pp', 'pp_prop', {'decay_or_rank': 0.9}, dict(mask=MASK, reduction='sum')),
    ('evolve', 'D_RTRL', {}, dict(evolve=3)),
    ('evolve_pp', 'pp_prop', {'decay_or_rank': 0.9}, dict(evolve=3)),
    ('chunk2', 'D_RTRL', {'vjp_method': 'multi-step'}, dict(chunk=2)),
    ('chunk2_pp', 'pp_prop', {'decay_or_rank': 0.9, 'vjp_method': 'multi-step'}, dict(chunk=2)),
    ('aux2', 'D_RTRL', {}, dict(aux2=True)),
]


def run_case(spec, algo_name, options, cfg, W, xs, ys, zs):
    net = E.MODELS[spec['model']](spec['n_in'], spec['n_rec'], spec['n_out'], spec['hp'])
    E.set_weights(net, W)
    B, n_in = spec['B'], spec['n_in']
    learner = braintrace.compile(net, getattr(braintrace, algo_name), jnp.zeros((B, n_in)),
                                 batch_size=B, **options)
    out = {}
    xs, ys, zs = jnp.asarray(xs), jnp.asarray(ys), jnp.asarray(zs)
    if 'evolve' in cfg:
        n = cfg['evolve']
        outs = learner.etrace_evolve(xs[:n], return_outputs=True)
        out['evolve_outputs'] = np.asarray(outs)
        xs, ys = xs[n:], ys[n:]
    kw = dict(return_value=True)
    if 'mask' in cfg:
        kw['mask'] = jnp.asarray(cfg['mask'])
        kw['reduction'] = cfg['reduction']
    if 'chunk' in cfg:
        k = cfg['chunk']

        def step(x, y):
            o = learner(braintrace.MultiStepData(x))
            return jnp.mean((o - y) ** 2, axis=tuple(range(1, o.ndim)))

        grads, losses = learner.etrace_grad(xs, ys, step_fn=step, chunk_size=k, **kw)
    elif cfg.get('aux2'):
        def step(x, y, z):
            o = learner(x)
            return jnp.mean((o - y) ** 2) + jnp.mean(o * z), (jnp.mean(o), jnp.sum(z))

        grads, losses, aux = learner.etrace_grad(xs, ys, zs, step_fn=step, has_aux=True, **kw)
        out['aux'] = [np.asarray(a) for a in aux]
    else:
        def step(x, y):
            return jnp.mean((learner(x) - y) ** 2)

        grads, losses = learner.etrace_grad(xs, ys, step_fn=step, **kw)
    out['grads'] = {k: np.asarray(v) for k, v in E.flat_grads(grads).items()}
    out['losses'] = np.asarray(losses)
    if 'mask' in cfg:
        m = np.asarray(cfg['mask'])
        out['masked'] = out['losses'] * m
        s = float(np.sum(out['masked']))
        out['scalar'] = s / max(float(np.sum(m)), 1.0) if cfg['reduction'] == 'mean' else s
    out['running_index'] = int(learner.running_index.value)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', required=True)
    ap.add_argument('--seed', type=int, default=20260)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    specs = {m['model']: m for m in E.variants_a()[0]}
    files = []
    for model in ('gru', 'lif'):
        spec = specs[model]
        W, xs, ys = E.draw_model(spec, args.seed, 0)
        rng = np.random.default_rng([args.seed, 35])
        zs = 0.5 * rng.standard_normal(ys.shape)
        for name, algo, options, cfg in CASES:
            res = run_case(spec, algo, options, cfg, W, xs, ys, zs)
            case = {
                'kind': 'driver',
                'case_id': f'driver__{model}__{name}',
                'model': model,
                'dims': {k: spec[k] for k in ('n_in', 'n_rec', 'n_out', 'T', 'B')},
                'hyperparams': E.hyperparams_json(spec),
                'algorithm': algo,
                'algorithm_options': options,
                'driver': {k: v for k, v in cfg.items()},
                'weights': E.enc_tree(W),
                'xs': E.enc(xs),
                'ys': E.enc(ys),
                'zs': E.enc(zs),
                'expect': {
                    'grads': E.enc_tree(res['grads']),
                    'losses': E.enc(res['losses']),
                    'running_index': res['running_index'],
                },
                'generator': {'seed': args.seed, 'braintrace': E.pkg_version('braintrace'),
                              'jax': E.pkg_version('jax')},
            }
            for k in ('masked', 'evolve_outputs'):
                if k in res:
                    case['expect'][k] = E.enc(res[k])
            if 'scalar' in res:
                case['expect']['scalar'] = res['scalar']
            if 'aux' in res:
                case['expect']['aux'] = [E.enc(np.asarray(a, np.float64)) for a in res['aux']]
            fn = case['case_id'] + '.json'
            with open(os.path.join(args.out, fn), 'w') as f:
                json.dump(case, f, indent=None, sort_keys=True)
            files.append(fn)
            print('wrote', fn)
    with open(os.path.join(args.out, 'MANIFEST.json'), 'w') as f:
        json.dump({'files': sorted(files), 'generator': 'scripts/golden_gen/generate_driver.py',
                   'seed': args.seed}, f, sort_keys=True)


if __name__ == '__main__':
    main()
