"""Record golden vectors for braintrace's ETP primitives from the real library.

This writes per-primitive case files (``etp_<prim>__<variant>.json``) plus a
``MANIFEST.json`` in exactly the schema of ``shared/golden/README.md``
(sections 2-5), by driving the *real* Python braintrace: every expected value
comes from ``prim.bind``, ``jax.jvp`` / ``jax.vjp`` / ``jax.vmap`` and the
library's own ``ETP_RULES_*`` registries. Nothing here re-derives a value, and
nothing reads the Rust code.

The default variant set ("B") deliberately uses other shapes, seeds and
variants than the reference set "A" (bias_fn-only dense, exp/sigmoid/softplus
transforms, square matrices, 3-D elemwise, channel-last 1-D conv, strided
NCHW, rhs_dilation, kernel_fn/bias_fn conv, other CSR patterns, LoRA b_fn,
rank 3, negative alpha, ...). ``--only`` picks cases by name,
``--reference-a`` generates some set-A variants (same params as
``shared/golden``) so the structure can be diffed field by field against the
originals, and ``--stress`` writes extra edge cases (3-D conv, mixed conv
layouts, 0-d/4-d elemwise, 1x1 matrices, LoRA rank > in, single-nnz CSR) to a
scratch folder.

Setup (exact versions of the reference recording; PyPI only):
``scripts/ref_venv.sh`` makes ``.venv-ref/`` in the repository (braintrace
0.2.6, brainstate 0.5.4, brainevent 0.2.1, brainunit 0.5.2, jax/jaxlib
0.10.2; the recording used numpy 2.4.6), or set ``BRAINTRACE_REF_PY``.

Run (from the repository root)::

    "$(scripts/ref_python.sh)" scripts/golden_gen/generate.py \
        --out tests/golden_extra --seed 70417

    BRAINTRACE_GOLDEN_DIR=tests/golden_extra cargo test --test golden -- --nocapture

Re-running with the same seed gives byte-identical files (each case draws from
its own generator seeded by ``(seed, crc32(case_id))``). Everything runs in
float64 (``jax_enable_x64``) on the CPU; brainevent's CSR kernels use the
``jax_raw`` backend (numba is not needed). Random inputs are rounded to 4
decimals (short files); all recorded outputs are full-precision float64.
"""

from __future__ import annotations

import argparse
import json
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
from braintrace import _op  # noqa: E402

# Importing brainstate switches x64 off; its precision knob turns it back on.
brainstate.environ.set(precision=64)
jax.config.update('jax_enable_x64', True)
brainevent.config.set_backend('cpu', 'jax_raw')
assert jnp.ones(1).dtype == jnp.float64, 'x64 is not enabled'

SCHEMA_VERSION = 1

# Transform hooks: module-level functions (static params are hashed by identity).
FNS = {
    'square': jnp.square,
    'tanh': jnp.tanh,
    'exp': jnp.exp,
    'softplus': jax.nn.softplus,
    'sigmoid': jax.nn.sigmoid,
}
FN_NAMES = {id(f): n for n, f in FNS.items()}
HOOK_PARAMS = ('weight_fn', 'bias_fn', 'kernel_fn', 'a_fn', 'b_fn')

PRIMS = {
    'etp_mm': _op.etp_mm_p,
    'etp_mv': _op.etp_mv_p,
    'etp_elemwise': _op.etp_elemwise_p,
    'etp_conv': _op.etp_conv_p,
    'etp_sp_mm': _op.etp_sp_mm_p,
    'etp_sp_mv': _op.etp_sp_mv_p,
    'etp_lora_mm': _op.etp_lora_mm_p,
    'etp_lora_mv': _op.etp_lora_mv_p,
}

USER_API = {
    'etp_mm': 'braintrace.matmul(x, weight, bias, weight_fn=..., bias_fn=...)',
    'etp_mv': 'braintrace.matmul(x, weight, bias, weight_fn=..., bias_fn=...)',
    'etp_elemwise': 'braintrace.element_wise(weight, weight_fn=...)',
    'etp_conv': ('braintrace.conv(x, kernel, bias, strides=..., padding=..., rhs_dilation=..., '
                 'dimension_numbers=..., kernel_fn=..., bias_fn=...)'),
    'etp_sp_mm': ('braintrace.sparse_matmul(x, weight_data, sparse_mat=brainevent.CSR(...), '
                  'bias=..., weight_fn=..., bias_fn=...)'),
    'etp_sp_mv': ('braintrace.sparse_matmul(x, weight_data, sparse_mat=brainevent.CSR(...), '
                  'bias=..., weight_fn=..., bias_fn=...)'),
    'etp_lora_mm': 'braintrace.lora_matmul(x, B, A, alpha=..., bias=..., b_fn=..., a_fn=..., bias_fn=...)',
    'etp_lora_mv': 'braintrace.lora_matmul(x, B, A, alpha=..., bias=..., b_fn=..., a_fn=..., bias_fn=...)',
}

SPARSE_NOTE = ('weight (the bind operand) holds the nnz stored values in CSR order; dense '
               'W[row_of_nnz[p], col_of_nnz[p]] = weight[p], all other entries 0; W has shape '
               '(n_in, n_out) and y = x @ W')

CTX = {
    'xy_to_dw': ('forward shapes: x as bound, hidden_dim shaped like the primitive output y '
                 '(this is how the IO-dim / pp_prop solve calls it)'),
    'dt_to_t': ('trace-recurrence shapes: hidden_dim shaped like y, trace leaves shaped like '
                'init_drtrl(num_hidden_state=1) leaves without the trailing state axis'),
    'xy_to_dw_slice': ('batch-free slice: x[0], hidden_dim[0] of the xy_to_dw entry (D-RTRL calls '
                       'the instantaneous rule per batch sample)'),
    'dt_to_t_slice': ('batch-free slice: hidden_dim[0], trace[*][0] of the dt_to_t entry (D-RTRL '
                      'solve calls dt_to_t per batch sample)'),
    'instant_drtrl': ('ETP_RULES_INSTANT_DRTRL, batch-free slice: x[0] / hidden_dim[0] of the '
                      'xy_to_dw entry (unbatched primitives: the full arrays)'),
    'solve_drtrl': ('ETP_RULES_SOLVE_DRTRL, batch-free slice: dg_hidden = hidden_dim[0] and '
                    'trace[*][0] of the dt_to_t entry (unbatched primitives: the full arrays)'),
    'dt_to_t_vmapped': ('jax.vmap(dt_to_t, in_axes=-1, out_axes=-1): hidden_dim = y shape + (S,), '
                        'trace leaves = init_drtrl(S) shapes; each state slice handled independently'),
    'drtrl_instant_vmapped_batched': (
        'instantaneous D-RTRL term = vmap over trailing state axis of vmap over batch of '
        'rule(x[b], df[b, ..., s], weights); output leaves have the init_drtrl(S) shapes'),
    'drtrl_instant_vmapped': (
        'instantaneous D-RTRL term = vmap over trailing state axis of rule(x, df[..., s], '
        'weights); output leaves have the init_drtrl(S) shapes'),
}

MAX_ELEMS = 200


# ----------------------------------------------------------------- the variants

def _csr(n_in, n_out, rows):
    """CSR structure from {row: [cols]} (rows not listed are empty)."""
    indptr, indices, row_of, col_of = [0], [], [], []
    for r in range(n_in):
        cols = sorted(rows.get(r, []))
        indices += cols
        row_of += [r] * len(cols)
        col_of += cols
        indptr.append(len(indices))
    return dict(shape=[n_in, n_out], indptr=indptr, indices=indices,
                row_of_nnz=row_of, col_of_nnz=col_of)


def variants_b():
    """Variant set B: shapes/variants not in set A."""
    V = []
    # dense ---------------------------------------------------------------
    V.append(dict(name='etp_mm__bias__bfn_sigmoid', prim='etp_mm', B=2, n_in=4, n_out=2,
                  bias=True, bias_fn='sigmoid'))
    V.append(dict(name='etp_mm__nobias__wfn_exp', prim='etp_mm', B=1, n_in=5, n_out=3,
                  bias=False, weight_fn='exp'))
    V.append(dict(name='etp_mm__bias__wfn_softplus__bfn_tanh', prim='etp_mm', B=2, n_in=1,
                  n_out=4, bias=True, weight_fn='softplus', bias_fn='tanh'))
    V.append(dict(name='etp_mm__bias__wfn_sigmoid__square', prim='etp_mm', B=2, n_in=3, n_out=3,
                  bias=True, weight_fn='sigmoid'))
    V.append(dict(name='etp_mv__nobias__wfn_square__square', prim='etp_mv', n_in=4, n_out=4,
                  bias=False, weight_fn='square'))
    V.append(dict(name='etp_mv__bias__wfn_exp__bfn_square', prim='etp_mv', n_in=6, n_out=2,
                  bias=True, weight_fn='exp', bias_fn='square'))
    # elemwise ------------------------------------------------------------
    V.append(dict(name='etp_elemwise__1d_sigmoid', prim='etp_elemwise', shape=(7,),
                  weight_fn='sigmoid'))
    V.append(dict(name='etp_elemwise__2d_softplus', prim='etp_elemwise', shape=(3, 2),
                  weight_fn='softplus'))
    V.append(dict(name='etp_elemwise__3d_square', prim='etp_elemwise', shape=(2, 3, 2),
                  weight_fn='square'))
    # conv ----------------------------------------------------------------
    V.append(dict(name='etp_conv__1d_same_s1_nwc_bias', prim='etp_conv', x=(1, 3, 2),
                  k=(2, 2, 2), strides=(1,), padding='SAME', dn=('NWC', 'WIO', 'NWC'), bias=True))
    V.append(dict(name='etp_conv__2d_same_s2_nchw_nobias', prim='etp_conv', x=(1, 1, 4, 3),
                  k=(2, 1, 2, 2), strides=(2, 2), padding='SAME', dn=None, bias=False))
    V.append(dict(name='etp_conv__1d_valid_s1_dil2_nch_bias', prim='etp_conv', x=(2, 1, 5),
                  k=(2, 1, 2), strides=(1,), padding='VALID', dil=(2,), dn=None, bias=True))
    V.append(dict(name='etp_conv__1d_same_s1_nch_bias__kfn_tanh', prim='etp_conv', x=(1, 2, 3),
                  k=(2, 2, 2), strides=(1,), padding='SAME', dn=None, bias=True, kernel_fn='tanh'))
    V.append(dict(name='etp_conv__2d_valid_s1_nhwc_bias__bfn_softplus', prim='etp_conv',
                  x=(1, 3, 2, 1), k=(2, 2, 1, 2), strides=(1, 1), padding='VALID',
                  dn=('NHWC', 'HWIO', 'NHWC'), bias=True, bias_fn='softplus'))
    V.append(dict(name='etp_conv__1d_same_s2_nwc_dil2_nobias__kfn_square', prim='etp_conv',
                  x=(1, 5, 1), k=(3, 1, 2), strides=(2,), padding='SAME', dil=(2,),
                  dn=('NWC', 'WIO', 'NWC'), bias=False, kernel_fn='square'))
    # sparse --------------------------------------------------------------
    V.append(dict(name='etp_sp_mm__csr_bias__wfn_square', prim='etp_sp_mm', B=2,
                  csr=_csr(5, 4, {0: [0, 1, 2, 3], 2: [1], 3: [0, 3], 4: [2]}), bias=True,
                  weight_fn='square'))
    V.append(dict(name='etp_sp_mm__csr_nobias__wfn_exp', prim='etp_sp_mm', B=2,
                  csr=_csr(4, 6, {1: [5], 2: [0, 2, 4], 3: [1, 5]}), bias=False, weight_fn='exp'))
    V.append(dict(name='etp_sp_mv__csr_bias__bfn_sigmoid', prim='etp_sp_mv',
                  csr=_csr(7, 3, {0: [2], 1: [0, 1], 3: [0, 1, 2], 6: [1]}), bias=True,
                  bias_fn='sigmoid'))
    V.append(dict(name='etp_sp_mv__csr_bias__wfn_softplus__bfn_exp', prim='etp_sp_mv',
                  csr=_csr(3, 5, {0: [0, 4], 2: [1, 2, 3]}), bias=True, weight_fn='softplus',
                  bias_fn='exp'))
    # lora ----------------------------------------------------------------
    V.append(dict(name='etp_lora_mm__r3_a0.75_bias__b_fn_tanh', prim='etp_lora_mm', B=2,
                  n_in=3, n_out=2, rank=3, alpha=0.75, bias=True, b_fn='tanh'))
    V.append(dict(name='etp_lora_mm__r1_a1_bias__b_fn_square__afn_exp__bfn_softplus',
                  prim='etp_lora_mm', B=1, n_in=3, n_out=2, rank=1, alpha=1.0, bias=True,
                  b_fn='square', a_fn='exp', bias_fn='softplus'))
    V.append(dict(name='etp_lora_mv__r3_a-0.5_nobias__b_fn_softplus', prim='etp_lora_mv',
                  n_in=5, n_out=2, rank=3, alpha=-0.5, bias=False, b_fn='softplus'))
    V.append(dict(name='etp_lora_mv__r2_a3_bias__afn_sigmoid__bfn_tanh', prim='etp_lora_mv',
                  n_in=3, n_out=3, rank=2, alpha=3.0, bias=True, a_fn='sigmoid', bias_fn='tanh'))
    return V


def variants_stress():
    """Edge cases beyond set B (scratch use: ``--stress``); not part of the committed set."""
    return [
        dict(name='etp_conv__3d_same_s1_ncdhw_bias', prim='etp_conv', x=(1, 1, 2, 3, 2),
             k=(2, 1, 2, 2, 1), strides=(1, 1, 1), padding='SAME', dn=None, bias=True),
        dict(name='etp_conv__2d_same_s12_nhwc_oihw_nchw_bias', prim='etp_conv', x=(1, 3, 4, 1),
             k=(2, 1, 2, 2), strides=(1, 2), padding='SAME', dn=('NHWC', 'OIHW', 'NCHW'),
             bias=True),
        dict(name='etp_conv__2d_valid_s1_nchw_hwio_nhwc_dil21_bias__bfn_exp', prim='etp_conv',
             x=(1, 1, 4, 3), k=(2, 2, 1, 2), strides=(1, 1), padding='VALID', dil=(2, 1),
             dn=('NCHW', 'HWIO', 'NHWC'), bias=True, bias_fn='exp'),
        dict(name='etp_conv__1d_same_s3_nch_explicit_bias__kfn_sigmoid', prim='etp_conv',
             x=(2, 1, 7), k=(2, 1, 4), strides=(3,), padding='SAME', dn=('NCH', 'OIH', 'NCH'),
             bias=True, kernel_fn='sigmoid'),
        dict(name='etp_conv__1d_same_s1_ncw_wio_nwc_dil3_bias', prim='etp_conv', x=(1, 2, 4),
             k=(2, 2, 3), strides=(1,), padding='SAME', dil=(3,), dn=('NCW', 'WIO', 'NWC'),
             bias=True),
        dict(name='etp_conv__2d_same_s2_nhwc_iohw_nhwc_bias', prim='etp_conv', x=(1, 3, 3, 2),
             k=(2, 1, 2, 2), strides=(2, 2), padding='SAME', dn=('NHWC', 'IOHW', 'NHWC'),
             bias=True),
        dict(name='etp_elemwise__0d_tanh', prim='etp_elemwise', shape=(), weight_fn='tanh'),
        dict(name='etp_elemwise__4d_exp', prim='etp_elemwise', shape=(2, 1, 2, 3),
             weight_fn='exp'),
        dict(name='etp_mm__bias__1x1x1', prim='etp_mm', B=1, n_in=1, n_out=1, bias=True),
        dict(name='etp_mv__bias__1x1__wfn_sigmoid__bfn_sigmoid', prim='etp_mv', n_in=1,
             n_out=1, bias=True, weight_fn='sigmoid', bias_fn='sigmoid'),
        dict(name='etp_lora_mm__r4_a0.1_bias__rank_gt_in', prim='etp_lora_mm', B=2, n_in=2,
             n_out=3, rank=4, alpha=0.1, bias=True, b_fn='exp', a_fn='square'),
        dict(name='etp_lora_mv__r1_a-2_bias__all_fns', prim='etp_lora_mv', n_in=2, n_out=1,
             rank=1, alpha=-2.0, bias=True, b_fn='sigmoid', a_fn='softplus', bias_fn='square'),
        dict(name='etp_sp_mm__csr_single_nnz', prim='etp_sp_mm', B=3,
             csr=_csr(4, 3, {2: [1]}), bias=True, weight_fn='tanh', bias_fn='exp'),
        dict(name='etp_sp_mv__csr_full_col', prim='etp_sp_mv',
             csr=_csr(5, 2, {0: [1], 1: [1], 2: [1], 4: [0, 1]}), bias=False,
             weight_fn='sigmoid'),
        dict(name='etp_sp_mm__csr_square', prim='etp_sp_mm', B=2,
             csr=_csr(4, 4, {0: [0, 3], 1: [1], 3: [0, 1, 2, 3]}), bias=True),
    ]


def variants_reference_a():
    """Same params as some set-A files, for a structural diff against shared/golden."""
    return [
        dict(name='etp_mv__bias__wfn_tanh__bfn_softplus', prim='etp_mv', n_in=3, n_out=5,
             bias=True, weight_fn='tanh', bias_fn='softplus'),
        dict(name='etp_conv__2d_same_s21_nhwc_bias', prim='etp_conv', x=(1, 4, 2, 1),
             k=(2, 3, 1, 4), strides=(2, 1), padding='SAME', dn=('NHWC', 'HWIO', 'NHWC'),
             bias=True),
        dict(name='etp_sp_mm__csr_bias', prim='etp_sp_mm', B=4,
             csr=_csr(6, 5, {0: [4], 1: [2, 3], 3: [1], 4: [0, 2], 5: [3, 4]}), bias=True),
        dict(name='etp_lora_mm__r2_a2_bias', prim='etp_lora_mm', B=4, n_in=5, n_out=3, rank=2,
             alpha=2.0, bias=True),
        dict(name='etp_lora_mv__r1_a0.25_bias__afn_tanh', prim='etp_lora_mv', n_in=4, n_out=5,
             rank=1, alpha=0.25, bias=True, a_fn='tanh'),
        dict(name='etp_elemwise__1d_identity', prim='etp_elemwise', shape=(5,), weight_fn=None),
        dict(name='etp_mm__bias', prim='etp_mm', B=4, n_in=3, n_out=2, bias=True),
    ]


# ----------------------------------------------------------------- encoding

def draw(rng, shape, scale=1.0):
    """Standard-normal draws rounded to 4 decimals.

    Only the *inputs* are rounded (short JSON, exactly parsed); every recorded
    output is the library's full-precision float64 result for those inputs.
    """
    return np.round(scale * rng.standard_normal(tuple(shape)), 4)


def enc(a):
    """Array object of section 2 (row-major nested lists, float64)."""
    a = np.asarray(a)
    if a.dtype != np.float64:
        raise TypeError(f'expected float64, got {a.dtype}')
    if a.size > MAX_ELEMS:
        raise ValueError(f'array of {a.size} elements (> {MAX_ELEMS}): shrink the variant')
    if not np.all(np.isfinite(a)):
        raise ValueError('non-finite value')
    return {'dtype': 'float64', 'shape': list(a.shape), 'data': a.tolist()}


def enc_tree(d):
    """Tree of arrays; keys sorted (as JAX flattens dicts)."""
    return {k: enc(d[k]) for k in sorted(d)}


def init_leaf(a):
    a = np.asarray(a)
    return {'shape': list(a.shape), 'dtype': str(a.dtype), 'all_zero': bool(np.all(a == 0))}


def fn_name(f):
    if f is None:
        return None
    n = FN_NAMES.get(id(f))
    if n is None:
        raise ValueError(f'unknown transform hook {f!r}')
    return n


def params_json(prim_name, params, spec):
    """JSON form of the bind params, in bind order."""
    out = {}
    for k, v in params.items():
        if k in HOOK_PARAMS:
            out[k] = fn_name(v)
        elif k == 'sparse_mat':
            c = spec['csr']
            out[k] = {'format': 'csr', 'shape': list(c['shape']), 'nnz': len(c['indices']),
                      'indptr': list(c['indptr']), 'indices': list(c['indices']),
                      'row_of_nnz': list(c['row_of_nnz']), 'col_of_nnz': list(c['col_of_nnz']),
                      'note': SPARSE_NOTE}
        elif isinstance(v, tuple):
            out[k] = list(v)
        elif isinstance(v, (bool, int, str)) or v is None:
            out[k] = v
        elif isinstance(v, float):
            out[k] = float(v)
        else:
            raise TypeError(f'param {k}={v!r}: no JSON form')
    if prim_name.startswith('etp_lora'):
        out['rank'] = spec['rank']
    return out


def warn_strings(ws):
    out = []
    for w in ws:
        s = f'{w.category.__name__}: {w.message}'
        if s not in out:
            out.append(s)
    return out


class _Var:
    """Stand-in for a jaxpr var: the init rules only read ``.aval``."""

    def __init__(self, a):
        self.aval = jax.core.ShapedArray(tuple(np.shape(a)), jnp.asarray(a).dtype)


# ----------------------------------------------------------------- one case

def build_inputs(spec, rng):
    """Operands (numpy, float64) and the user-API call reproducing the bind."""
    p = spec['prim']
    fn = {k: (FNS[spec[k]] if spec.get(k) else None) for k in HOOK_PARAMS}
    normal = lambda *s, scale=1.0: draw(rng, s, scale)  # noqa: E731
    if p in ('etp_mm', 'etp_mv'):
        xs = (spec['B'], spec['n_in']) if p == 'etp_mm' else (spec['n_in'],)
        args = {'x': normal(*xs), 'weight': normal(spec['n_in'], spec['n_out'])}
        if spec['bias']:
            args['bias'] = normal(spec['n_out'], scale=0.5)

        def api(x, weight, bias=None):
            return braintrace.matmul(x, weight, bias, weight_fn=fn['weight_fn'],
                                     bias_fn=fn['bias_fn'])
    elif p == 'etp_elemwise':
        args = {'weight': normal(*spec['shape'], scale=0.7)}

        def api(weight):
            return braintrace.element_wise(weight, weight_fn=fn['weight_fn'])
    elif p == 'etp_conv':
        args = {'x': normal(*spec['x']), 'weight': normal(*spec['k'], scale=0.7)}
        dn = spec['dn']
        o_axis = 0 if dn is None else dn[1].index('O')
        if spec['bias']:
            args['bias'] = normal(spec['k'][o_axis], scale=0.5)

        def api(x, weight, bias=None):
            return braintrace.conv(x, weight, bias, strides=spec['strides'],
                                   padding=spec['padding'], rhs_dilation=spec.get('dil'),
                                   dimension_numbers=dn, kernel_fn=fn['kernel_fn'],
                                   bias_fn=fn['bias_fn'])
    elif p in ('etp_sp_mm', 'etp_sp_mv'):
        c = spec['csr']
        n_in, n_out = c['shape']
        nnz = len(c['indices'])
        xs = (spec['B'], n_in) if p == 'etp_sp_mm' else (n_in,)
        args = {'x': normal(*xs), 'weight': normal(nnz)}
        if spec['bias']:
            args['bias'] = normal(n_out, scale=0.5)
        csr = brainevent.CSR(
            (jnp.asarray(args['weight']), jnp.asarray(np.asarray(c['indices'], np.int32)),
             jnp.asarray(np.asarray(c['indptr'], np.int32))),
            shape=(n_in, n_out))
        dense = np.zeros((n_in, n_out))
        dense[c['row_of_nnz'], c['col_of_nnz']] = args['weight']
        assert np.array_equal(np.asarray(csr.todense()), dense), 'CSR structure mismatch'
        assert any(c['indptr'][r] == c['indptr'][r + 1] for r in range(n_in)), 'need an empty row'

        def api(x, weight, bias=None):
            return braintrace.sparse_matmul(x, weight, sparse_mat=csr, bias=bias,
                                            weight_fn=fn['weight_fn'], bias_fn=fn['bias_fn'])
    elif p in ('etp_lora_mm', 'etp_lora_mv'):
        xs = (spec['B'], spec['n_in']) if p == 'etp_lora_mm' else (spec['n_in'],)
        args = {'x': normal(*xs), 'lora_b': normal(spec['n_in'], spec['rank'], scale=0.8),
                'lora_a': normal(spec['rank'], spec['n_out'], scale=0.8)}
        if spec['bias']:
            args['bias'] = normal(spec['n_out'], scale=0.5)

        def api(x, lora_b, lora_a, bias=None):
            return braintrace.lora_matmul(x, lora_b, lora_a, alpha=spec['alpha'], bias=bias,
                                          b_fn=fn['b_fn'], a_fn=fn['a_fn'],
                                          bias_fn=fn['bias_fn'])
    else:
        raise ValueError(p)
    return args, api


def make_case(spec, seed, gen_block):
    name = spec['name']
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    prim_name = spec['prim']
    prim = PRIMS[prim_name]
    np_args, api = build_inputs(spec, rng)
    arg_names = list(np_args)
    args = [jnp.asarray(np_args[k], dtype=jnp.float64) for k in arg_names]

    # The user API's jaxpr gives the exact bind params.
    jp = jax.make_jaxpr(api)(*args)
    eqns = [e for e in jp.jaxpr.eqns if e.primitive is prim]
    assert len(eqns) == 1, f'{name}: user API did not bind {prim_name}: {jp}'
    params = dict(eqns[0].params)
    user_prims = sorted({e.primitive.name for e in jp.jaxpr.eqns})

    def f(*a):
        return prim.bind(*a, **params)

    batched = _op.is_batched_primitive(prim)
    cp = _op.get_batched_counterpart(prim)
    tinv = dict(_op.get_trainable_invars(prim, params))
    xi = _op.get_x_invar_index(prim)
    weights = {k: args[i] for k, i in tinv.items()}
    x = args[xi] if xi is not None else None

    case_warn = {}

    def record(stage, fn):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter('always')
            r = fn()
        if ws:
            case_warn[stage] = warn_strings(ws)
        return r

    y = record('forward', lambda: f(*args))
    y_np = np.asarray(y)
    assert y_np.dtype == np.float64

    # jvp w.r.t. every float arg
    tangents = [jnp.asarray(draw(rng, a.shape)) for a in args]
    po, to = record('jvp', lambda: jax.jvp(f, tuple(args), tuple(tangents)))

    # vjp
    cot = jnp.asarray(draw(rng, y_np.shape))

    def _vjp():
        _, pb = jax.vjp(f, *args)
        return pb(cot)
    grads = record('vjp', _vjp)

    # vmap over x (or weight for elemwise), axis_size 3
    mapped = 'x' if xi is not None else 'weight'
    mi = arg_names.index(mapped)
    in_axes = [0 if i == mi else None for i in range(len(args))]
    mapped_input = jnp.asarray(draw(rng, (3, *args[mi].shape)))
    vargs = list(args)
    vargs[mi] = mapped_input
    with warnings.catch_warnings(record=True) as vws:
        warnings.simplefilter('always')
        vf = jax.vmap(f, in_axes=tuple(in_axes))
        vout = vf(*vargs)
        vjp_ = jax.make_jaxpr(vf)(*vargs)
    vprims = sorted({e.primitive.name for e in vjp_.jaxpr.eqns})

    rules = make_rules(prim, params, batched, x, y_np, weights, rng)

    case = {
        'schema_version': SCHEMA_VERSION,
        'kind': 'primitive',
        'case_id': name,
        'primitive': prim_name,
        'batched_primitive': bool(batched),
        'batched_counterpart': cp.name if cp is not None else None,
        'user_api': USER_API[prim_name],
        'user_api_jaxpr_primitives': user_prims,
        'arg_names': arg_names,
        'float_arg_names': arg_names,
        'x_invar_index': xi,
        'trainable_invars': tinv,
        'params': params_json(prim_name, params, spec),
        'inputs': {k: enc(np_args[k]) for k in arg_names},
        'forward': {'output': enc(y_np)},
        'jvp': {'tangents': {k: enc(t) for k, t in zip(arg_names, tangents)},
                'primal_out': enc(po), 'tangent_out': enc(to)},
        'vjp': {'cotangent': enc(cot), 'grads': {k: enc(g) for k, g in zip(arg_names, grads)}},
        'vmap': {'mapped_arg': mapped, 'axis_size': 3, 'in_axes': in_axes,
                 'mapped_input': enc(mapped_input), 'output': enc(vout),
                 'jaxpr_primitives': vprims, 'warnings': warn_strings(vws)},
        'rules': rules,
        'warnings': case_warn,
        'generator': gen_block,
    }
    return case


def make_rules(prim, params, batched, x, y_np, weights, rng):
    xy_to_dw = _op.ETP_RULES_XY_TO_DW[prim]
    dt_to_t = _op.ETP_RULES_DT_TO_T[prim]
    init_drtrl = _op.ETP_RULES_INIT_DRTRL[prim]
    init_pp = _op.ETP_RULES_INIT_PP[prim]
    instant = _op.get_instant_drtrl_rule(prim)
    solve = _op.get_solve_drtrl_rule(prim)
    is_conv = prim is _op.etp_conv_p
    y_shape = y_np.shape
    normal = lambda s: jnp.asarray(draw(rng, s))  # noqa: E731

    x_var = _Var(x) if x is not None else None
    y_var = _Var(y_np)
    w_vars = {k: _Var(v) for k, v in weights.items()}

    def init_d(S):
        if is_conv:
            return init_drtrl(x_var, y_var, w_vars, S, eqn_params=params)
        return init_drtrl(x_var, y_var, w_vars, S)

    def enc_x(a):
        return None if a is None else enc(a)

    R = {}
    hd = normal(y_shape)
    R['xy_to_dw'] = {'context': CTX['xy_to_dw'], 'x': enc_x(x), 'hidden_dim': enc(hd),
                     'weights': enc_tree(weights),
                     'output': enc_tree(xy_to_dw(x, hd, weights, **params))}

    tr_shapes = {k: v.shape[:-1] for k, v in init_d(1).items()}
    hd_t = normal(y_shape)
    trace = {k: normal(s) for k, s in sorted(tr_shapes.items())}
    R['dt_to_t'] = {'context': CTX['dt_to_t'], 'hidden_dim': enc(hd_t), 'trace': enc_tree(trace),
                    'output': enc_tree(dt_to_t(hd_t, trace, **params))}

    if batched:
        R['xy_to_dw_slice'] = {'context': CTX['xy_to_dw_slice'], 'x': enc(x[0]),
                               'hidden_dim': enc(hd[0]), 'weights': enc_tree(weights),
                               'output': enc_tree(xy_to_dw(x[0], hd[0], weights, **params))}
        if instant is None:
            tr0 = {k: v[0] for k, v in trace.items()}
            R['dt_to_t_slice'] = {'context': CTX['dt_to_t_slice'], 'hidden_dim': enc(hd_t[0]),
                                  'trace': enc_tree(tr0),
                                  'output': enc_tree(dt_to_t(hd_t[0], tr0, **params))}
    if instant is not None:
        xs, hs = (x[0], hd[0]) if batched else (x, hd)
        R['instant_drtrl'] = {'context': CTX['instant_drtrl'], 'x': enc(xs),
                              'hidden_dim': enc(hs), 'weights': enc_tree(weights),
                              'output': enc_tree(instant(xs, hs, weights, **params))}
        dg, trs = (hd_t[0], {k: v[0] for k, v in trace.items()}) if batched else (hd_t, trace)
        R['solve_drtrl'] = {'context': CTX['solve_drtrl'], 'dg_hidden': enc(dg),
                            'trace': enc_tree(trs), 'weights': enc_tree(weights),
                            'output': enc_tree(solve(dg, trs, weights, **params))}

    by = []
    rule = instant or xy_to_dw
    for S in (1, 2):
        d = init_d(S)
        pp = init_pp(x_var, y_var, w_vars, S)
        hd_s = normal((*y_shape, S))
        tr_s = {k: normal(v.shape) for k, v in sorted(d.items())}
        vm = jax.vmap(lambda h, t: dt_to_t(h, t, **params), in_axes=-1, out_axes=-1)(hd_s, tr_s)

        df = normal((*y_shape, S))

        def comp(x_, df_):
            return rule(x_, df_, weights, **params)

        if batched:
            inst = jax.vmap(lambda dfs: jax.vmap(comp)(x, dfs), in_axes=-1, out_axes=-1)(df)
        else:
            inst = jax.vmap(lambda dfs: comp(x, dfs), in_axes=-1, out_axes=-1)(df)
        for k, v in inst.items():
            assert v.shape == d[k].shape, (k, v.shape, d[k].shape)
        by.append({
            'num_hidden_state': S,
            'init_drtrl': {k: init_leaf(d[k]) for k in sorted(d)},
            'init_pp': init_leaf(pp),
            'dt_to_t_vmapped': {'context': CTX['dt_to_t_vmapped'], 'hidden_dim': enc(hd_s),
                                'trace': enc_tree(tr_s), 'output': enc_tree(vm)},
            'drtrl_instant_vmapped': {
                'rule': 'instant_drtrl' if instant is not None else 'xy_to_dw',
                'context': CTX['drtrl_instant_vmapped_batched' if batched
                               else 'drtrl_instant_vmapped'],
                'x': enc_x(x), 'df': enc(df), 'output': enc_tree(inst)},
        })
    R['by_num_hidden_state'] = by
    return R


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
    ap.add_argument('--variant-set', default='B')
    ap.add_argument('--reference-a', action='store_true',
                    help='generate set-A variants (for a structural diff with shared/golden)')
    ap.add_argument('--stress', action='store_true',
                    help='generate extra edge cases (scratch use, not committed)')
    ap.add_argument('--only', nargs='*', help='case names to generate')
    a = ap.parse_args(argv)

    specs = (variants_reference_a() if a.reference_a
             else variants_stress() if a.stress else variants_b())
    if a.only:
        specs = [s for s in specs if s['name'] in a.only]
    gen = {'schema_version': SCHEMA_VERSION, 'seed': a.seed, 'variant_set': a.variant_set,
           'versions': versions(), 'float': 'float64 (jax_enable_x64)', 'backend': 'cpu',
           'brainevent_cpu_backend': 'jax_raw'}
    os.makedirs(a.out, exist_ok=True)
    files, total = [], 0
    for s in specs:
        case = make_case(s, a.seed, gen)
        text = json.dumps(case, separators=(',', ':'), allow_nan=False)
        fn = s['name'] + '.json'
        with open(os.path.join(a.out, fn), 'w') as fh:
            fh.write(text)
        files.append(fn)
        total += len(text.encode())
        print(f'{fn}: {len(text)} bytes', file=sys.stderr)
    manifest = dict(gen)
    manifest['files'] = sorted(files)
    manifest['total_bytes'] = total
    with open(os.path.join(a.out, 'MANIFEST.json'), 'w') as fh:
        fh.write(json.dumps(manifest, separators=(',', ':'), allow_nan=False))
    print(f'{len(files)} files, {total} bytes', file=sys.stderr)


if __name__ == '__main__':
    main()
