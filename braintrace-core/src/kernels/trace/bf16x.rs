//! The fused dense loop for bf16 traces of an f32 model with one state per
//! neuron (`S = 1`, whatever the model: its `D` is diagonal), written with
//! AVX-512 and its BF16 extension where the CPU has both.
//!
//! The generic loop ([`row1`](super::dense::row1) in the compute type,
//! loaded and rounded by [`Store`](super::Store)) spells the rounding to
//! bf16 out as integer operations (`bf16_bits`: about a dozen per vector)
//! and widens through 32-bit lanes: per 16 values some 20 instructions,
//! against 12 here, where `vcvtne2ps2bf16` rounds 32 values in one. GRU
//! 512×64, one core of an AMD Zen 5, a stand-alone copy of the loop with
//! everything in cache: 0.070 → 0.050 ms per 64×8×512×2 values; at full
//! size, with the loop's software prefetch
//! ([`PREFETCH_BYTES`](super::dense::PREFETCH_BYTES)), 5.0 → 4.3 ms/step;
//! `bench_learn` (the whole step): 7.6–7.9 → 4.7–5.3 ms of CPU time.
//!
//! Bit for bit the generic loop's results: the same operations in the same
//! order (two products and a sum, no fused multiply-add; the flush; the
//! gradient's product and sum), and the instruction rounds to nearest, ties
//! to even, and quiets a NaN as `half::bf16::from_f32` does. It treats
//! subnormal inputs as zero, where `from_f32` rounds them; no value it
//! rounds is subnormal, as every one was flushed first (`tiny` ≫ the
//! largest subnormal). The tests compare the two loops' bits and the
//! instruction's rounding with `bf16_bits` over every exponent.

use super::dense::Ctx;
use half::bf16;

/// Whether this CPU runs the loop: AVX-512 (F, VL, DQ, BW, as the crate's
/// other wide kernels want) and AVX-512 BF16.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::kernels::has_avx512() && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Run block `k` of a fused dense step here when the shape (`S = 1`) and
/// the CPU allow; `false` (nothing done) otherwise.
pub(super) fn dense_block(
    ctx: &Ctx<'_, f32>,
    k: usize,
    part: &mut [&mut [bf16]],
    grad: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if ctx.dims.s == 1 && available() {
        // SAFETY: the CPU has every feature the function enables
        // (`available`), the only requirement of a `target_feature`
        // function.
        unsafe { x86::block(ctx, k, part, grad) };
        return true;
    }
    let _ = (ctx, k, part, grad);
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::dense::{row1, Ahead, Ctx, PREFETCH_BYTES};
    use super::super::{tiny, Dims, Operands, Solve};
    use half::bf16;
    use std::arch::x86_64::*;

    /// The block: [`dense::block_body`](super::super::dense) for `S = 1`,
    /// its rows by [`row`].
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")]
    pub(super) fn block(ctx: &Ctx<'_, f32>, k: usize, part: &mut [&mut [bf16]], grad: &mut [f32]) {
        let Dims { i: ni, o: no, .. } = ctx.dims;
        let Operands { x, d, df, g, scale } = ctx.ops;
        let i0 = k * ctx.rows_per;
        let rows = grad.len() / no;
        // The instantaneous term of a row with a transform: x Df f'(W)[i, :].
        let mut inst = if scale.is_some() {
            vec![0f32; no]
        } else {
            Vec::new()
        };
        for (b, piece) in part.iter_mut().enumerate() {
            let ahead = Ahead::new(piece, ctx.prefetch);
            let mut fetched = 0;
            let db = &d[b * no..(b + 1) * no];
            let dfb = &df[b * no..(b + 1) * no];
            let gb = g.map(|g| &g[b * no..(b + 1) * no]);
            for (ii, (erow, grow)) in piece[..rows * no]
                .chunks_exact_mut(no)
                .zip(grad.chunks_exact_mut(no))
                .enumerate()
            {
                ahead.fetch(&mut fetched, (ii + 1) * no * 2 + PREFETCH_BYTES);
                let xi = match x {
                    Some(x) => x[b * ni + i0 + ii],
                    None => 1.0,
                };
                let (xi, f) = match scale {
                    Some(sc) => {
                        let srow = &sc[(i0 + ii) * no..(i0 + ii + 1) * no];
                        for ((v, &f), &p) in inst.iter_mut().zip(dfb).zip(srow) {
                            *v = xi * f * p;
                        }
                        (1.0, &inst[..])
                    }
                    None => (xi, dfb),
                };
                row(erow, grow, xi, db, f, gb, ctx.solve);
            }
        }
    }

    /// [`row1`]: 32 values at a time, the rest (fewer than 32) by `row1`
    /// itself.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")]
    #[inline]
    fn row(
        erow: &mut [bf16],
        grow: &mut [f32],
        xi: f32,
        db: &[f32],
        dfb: &[f32],
        gb: Option<&[f32]>,
        solve: Solve,
    ) {
        let n = erow.len();
        let (db, dfb, grow) = (&db[..n], &dfb[..n], &mut grow[..n]);
        let full = n - n % 32;
        let xv = _mm512_set1_ps(xi);
        let small = _mm512_set1_ps(tiny::<f32>());
        let (e, gr) = (&mut erow[..full], &mut grow[..full]);
        let (d, f) = (db[..full].chunks_exact(32), dfb[..full].chunks_exact(32));
        match (gb, solve) {
            (Some(gb), Solve::After) => with_grad::<false>(e, gr, d, f, &gb[..full], xv, small),
            (Some(gb), Solve::Before) => with_grad::<true>(e, gr, d, f, &gb[..full], xv, small),
            _ => {
                for ((e, d), f) in e.chunks_exact_mut(32).zip(d).zip(f) {
                    let (lo, hi) = widen(e);
                    let vlo = update(lo, &d[..16], &f[..16], xv, small);
                    let vhi = update(hi, &d[16..], &f[16..], xv, small);
                    narrow(e, vlo, vhi);
                }
            }
        }
        row1::<f32, bf16>(
            &mut erow[full..],
            &mut grow[full..],
            xi,
            &db[full..],
            &dfb[full..],
            gb.map(|g| &g[full..n]),
            solve,
        );
    }

    /// [`row`]'s whole vectors with a gradient: from the trace before the
    /// update (`BEFORE`) or after it.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")]
    #[inline]
    fn with_grad<const BEFORE: bool>(
        e: &mut [bf16],
        gr: &mut [f32],
        d: std::slice::ChunksExact<'_, f32>,
        f: std::slice::ChunksExact<'_, f32>,
        g: &[f32],
        xv: __m512,
        small: __m512,
    ) {
        for ((((e, gr), d), f), g) in e
            .chunks_exact_mut(32)
            .zip(gr.chunks_exact_mut(32))
            .zip(d)
            .zip(f)
            .zip(g.chunks_exact(32))
        {
            let (lo, hi) = widen(e);
            let vlo = update(lo, &d[..16], &f[..16], xv, small);
            let vhi = update(hi, &d[16..], &f[16..], xv, small);
            narrow(e, vlo, vhi);
            let (slo, shi) = if BEFORE { (lo, hi) } else { (vlo, vhi) };
            let (glo, ghi) = gr.split_at_mut(16);
            accumulate(glo, &g[..16], slo);
            accumulate(ghi, &g[16..], shi);
        }
    }

    /// 16 `f32` from `v[..16]`.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")]
    #[inline]
    fn load(v: &[f32]) -> __m512 {
        let v = &v[..16];
        // SAFETY: reads the 64 bytes of `v` (16 values, checked above).
        unsafe { _mm512_loadu_ps(v.as_ptr()) }
    }

    /// The 32 bf16 values of `e` (32 long), widened to `f32` (exactly: the
    /// bits moved up 16 places), the first 16 and the last 16.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")]
    #[inline]
    fn widen(e: &[bf16]) -> (__m512, __m512) {
        let e = &e[..32];
        // SAFETY: reads the 64 bytes of `e` (32 values of 2 bytes, checked
        // above), in two halves of 32 bytes.
        let (lo, hi) = unsafe {
            let p = e.as_ptr().cast::<__m256i>();
            (_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1)))
        };
        (
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(lo))),
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi))),
        )
    }

    /// `flush(d·e + x·f)` for 16 values, as [`row1`] computes it.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")]
    #[inline]
    fn update(e: __m512, d: &[f32], f: &[f32], xv: __m512, small: __m512) -> __m512 {
        let v = _mm512_add_ps(_mm512_mul_ps(load(d), e), _mm512_mul_ps(xv, load(f)));
        // Kept unless |v| < tiny (a NaN is kept: the comparison is
        // "not less than", true when unordered).
        let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(_mm512_abs_ps(v), small);
        _mm512_maskz_mov_ps(keep, v)
    }

    /// `lo` and `hi` rounded to bf16 into `e` (32 long).
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")]
    #[inline]
    fn narrow(e: &mut [bf16], lo: __m512, hi: __m512) {
        let e = &mut e[..32];
        let h = _mm512_cvtne2ps_pbh(hi, lo);
        // SAFETY: `__m512bh` and `__m512i` are both 64 plain bytes; the
        // store writes the 64 bytes of `e` (32 values, checked above).
        unsafe {
            let bits = std::mem::transmute::<__m512bh, __m512i>(h);
            _mm512_storeu_si512(e.as_mut_ptr().cast(), bits);
        }
    }

    /// `gr += g·v` for 16 values.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")]
    #[inline]
    fn accumulate(gr: &mut [f32], g: &[f32], v: __m512) {
        let gr = &mut gr[..16];
        let sum = _mm512_add_ps(load(gr), _mm512_mul_ps(load(g), v));
        // SAFETY: writes the 64 bytes of `gr` (16 values, checked above).
        unsafe { _mm512_storeu_ps(gr.as_mut_ptr(), sum) };
    }

    /// `v` rounded to bf16 by the instruction the loop uses.
    #[cfg(test)]
    pub(super) fn round(v: &[f32; 32]) -> [u16; 32] {
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")]
        fn go(v: &[f32; 32]) -> [u16; 32] {
            let mut out = [bf16::ZERO; 32];
            narrow(&mut out, load(&v[..16]), load(&v[16..]));
            out.map(|b| b.to_bits())
        }
        assert!(super::available());
        // SAFETY: the CPU has the features (asserted just above).
        unsafe { go(v) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::trace::store::bf16_bits;

    /// The instruction's rounding is `bf16_bits`' (and so `half`'s) for
    /// every value the loop can round: every sign and exponent but the
    /// subnormal ones, with a spread of mantissas (ties, NaN payloads,
    /// infinities, values that round up to infinity).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_instruction_rounds_as_bf16_bits() {
        if !available() {
            eprintln!("no AVX-512 BF16 on this CPU: nothing to compare");
            return;
        }
        let mut values = Vec::new();
        for hi in 0..=0xFFFFu32 {
            if hi & 0x7F80 == 0 && hi & 0x7F != 0 {
                continue; // subnormal
            }
            for lo in [
                0u32,
                1,
                0x7FFF,
                0x8000,
                0x8001,
                0xFFFF,
                hi.wrapping_mul(2_654_435_761) & 0xFFFF,
            ] {
                let v = f32::from_bits((hi << 16) | lo);
                if !v.is_subnormal() {
                    values.push(v);
                }
            }
        }
        values.extend([0.0, -0.0, f32::MIN_POSITIVE, -f32::MIN_POSITIVE]);
        for chunk in values.chunks(32) {
            let mut v = [0f32; 32];
            v[..chunk.len()].copy_from_slice(chunk);
            let got = x86::round(&v);
            for (x, b) in v.iter().zip(got) {
                assert_eq!(b, bf16_bits(*x), "{x:e} ({:#010x})", x.to_bits());
            }
        }
    }
}
