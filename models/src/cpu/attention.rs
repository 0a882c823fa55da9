//! Attention over a packed batch on the CPU, f32, as one tiled kernel (FlashAttention's
//! schedule): for each sequence, each key/value head and each block of query rows, the key
//! tiles the mask lets those rows see are visited once, with an online softmax (running max,
//! running sum, the accumulator rescaled when the max grows). No score matrix larger than a
//! tile is ever made, nothing is allocated per tile, and no compute goes to masked-out tiles.
//!
//! Grouped-query attention without repeating K/V: the `g` query heads sharing a K/V head are
//! the rows of one block together (`g × QUERY_ROWS` rows), so each K/V tile serves them all.
//! Keys are transposed once per sequence and K/V head (`hd × len`, padded to whole tiles):
//! a score row is then `KEY_COLS` lanes accumulated over `hd` broadcast query values, the loop
//! a compiler turns into vector FMAs. P·V accumulates `hd` lanes over the tile's keys the same
//! way, reading the values where they lie.
//!
//! Blocks are independent: they run on rayon's pool, a block per task.

use rayon::prelude::*;

use super::exp::exp;
use super::{fmadd, simd_kernel, Simd};
use crate::packed::SeqSpan;

/// Query rows (per head) of a block.
const QUERY_ROWS: usize = 32;
/// Keys of a tile (a multiple of [`LANES`]).
const KEY_COLS: usize = 64;
/// The vector width the inner loops are written in (AVX-512's f32 lanes; AVX2 takes two).
const LANES: usize = 16;

/// Which keys a query sees, within its own sequence (positions from the sequence's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mask {
    /// Keys at or before the query (a decoder's).
    Causal,
    /// Every key of the sequence (an encoder's).
    Full,
    /// Keys within `left` before and `right` after the query (a sliding window: ModernBERT's
    /// and Gemma 3's local layers; `right = 0` with causal order is a causal window).
    Window { left: usize, right: usize },
}

impl Mask {
    /// The keys `[lo, hi)` that query rows `[q0, q1)` see, together (each row may see fewer).
    pub(crate) fn keys_of(self, q0: usize, q1: usize, len: usize) -> (usize, usize) {
        match self {
            Mask::Causal => (0, q1),
            Mask::Full => (0, len),
            Mask::Window { left, right } => {
                (q0.saturating_sub(left), (q1 - 1 + right + 1).min(len))
            }
        }
    }

    /// Whether query `i` sees key `j`.
    #[inline(always)]
    pub(crate) fn sees(self, i: usize, j: usize) -> bool {
        match self {
            Mask::Causal => j <= i,
            Mask::Full => true,
            Mask::Window { left, right } => j + left >= i && j <= i + right,
        }
    }

    /// Whether every query of `[q0, q1)` sees every key of `[k0, k1)`: no per-score check.
    pub(crate) fn sees_all(self, q0: usize, q1: usize, k0: usize, k1: usize) -> bool {
        self.sees(q0, k1 - 1)
            && self.sees(q1 - 1, k0)
            && self.sees(q0, k0)
            && self.sees(q1 - 1, k1 - 1)
    }
}

/// Where q, k and v lie: token-major rows (`stride` floats apart), each row holding heads of
/// `head_dim` floats from `offset` on.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub stride: usize,
}

impl Rows<'_> {
    #[inline(always)]
    fn head(&self, token: usize, head: usize, hd: usize) -> &[f32] {
        &self.data[self.offset + token * self.stride + head * hd..][..hd]
    }
}

/// The heads of an attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

/// Attention of every sequence of the packed batch to itself: `out` (`[T, n_heads, hd]`,
/// token-major) gets `softmax(scale · q·kᵀ + mask) · v` per head, its loops compiled for
/// `simd` ([`Simd::detect`] for this machine's best).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    simd: Simd,
    q: Rows<'_>,
    k: Rows<'_>,
    v: Rows<'_>,
    spans: &[SeqSpan],
    heads: Heads,
    scale: f32,
    mask: Mask,
    out: &mut [f32],
) {
    let Heads {
        n_heads,
        n_kv,
        head_dim: hd,
    } = heads;
    assert!(
        n_kv > 0 && n_heads % n_kv == 0,
        "{n_heads} heads over {n_kv} K/V heads"
    );
    let total: usize = spans.iter().map(|s| s.len).sum();
    assert!(out.len() >= total * n_heads * hd);
    let packed = PackedKv::of(&k, &v, spans, n_kv, hd);
    // Every (sequence, K/V head, query block): independent tasks.
    let mut blocks = Vec::new();
    for (i, span) in spans.iter().enumerate() {
        for kv in 0..n_kv {
            let mut q0 = 0;
            while q0 < span.len {
                let q1 = (q0 + QUERY_ROWS).min(span.len);
                blocks.push((i, *span, kv, q0, q1));
                q0 = q1;
            }
        }
    }
    // Longest first: a causal block late in a long sequence is the most work.
    blocks.sort_by_key(|b| std::cmp::Reverse(b.4));
    let out_addr = out.as_mut_ptr() as usize;
    blocks.par_iter().for_each_init(
        || Scratch::new(n_heads / n_kv, hd),
        |scratch, &(i, span, kv, q0, q1)| {
            let block = Block {
                span,
                kv,
                q0,
                q1,
                keys: packed.slab(i, kv).0,
                values: packed.slab(i, kv).1,
            };
            // SAFETY: blocks write disjoint rows of `out` (their own tokens × their own heads),
            // which outlives this scope; no block reads `out`.
            let out = unsafe {
                std::slice::from_raw_parts_mut(out_addr as *mut f32, total * n_heads * hd)
            };
            run_block(simd, &q, heads, scale, mask, &block, scratch, out);
        },
    );
}

/// One block's position: a sequence, a K/V head, query rows `[q0, q1)` of the sequence; and
/// that sequence's keys and values of that head, packed by tiles ([`PackedKv`]).
struct Block<'a> {
    span: SeqSpan,
    kv: usize,
    q0: usize,
    q1: usize,
    keys: &'a [f32],
    values: &'a [f32],
}

/// Every sequence's keys and values, per K/V head, packed tile by tile (zeros past the
/// sequence's end): a key tile transposed (`hd × KEY_COLS`), a value tile as rows
/// (`KEY_COLS × hd`), each contiguous. Made once per call, in parallel; each query block then
/// reads its tiles as they are. (Read where they lie, the rows of one tile are a token's width
/// apart: 16 KiB at the 0.6B shape, so all of them fall in the same few L1 sets and evict each
/// other.)
struct PackedKv {
    /// Per (sequence, head): its key tiles, then its value tiles.
    data: Vec<f32>,
    /// Where each sequence's first head starts, and its tiles.
    start: Vec<usize>,
    tiles: Vec<usize>,
    hd: usize,
}

impl PackedKv {
    fn of(k: &Rows<'_>, v: &Rows<'_>, spans: &[SeqSpan], n_kv: usize, hd: usize) -> PackedKv {
        let tiles: Vec<usize> = spans.iter().map(|s| s.len.div_ceil(KEY_COLS)).collect();
        let slab = |tiles: usize| 2 * tiles * KEY_COLS * hd;
        let mut start = Vec::with_capacity(spans.len());
        let mut size = 0;
        for t in &tiles {
            start.push(size);
            size += n_kv * slab(*t);
        }
        let mut data = vec![0f32; size];
        // One task per (sequence, head): its slab is its own.
        let mut slabs: Vec<(usize, usize, &mut [f32])> = Vec::new();
        let mut rest = data.as_mut_slice();
        for (i, t) in tiles.iter().enumerate() {
            for kv in 0..n_kv {
                let (one, tail) = rest.split_at_mut(slab(*t));
                slabs.push((i, kv, one));
                rest = tail;
            }
        }
        slabs.into_par_iter().for_each(|(i, kv, slab)| {
            let span = spans[i];
            let (keys, values) = slab.split_at_mut(slab.len() / 2);
            for j in 0..span.len {
                let tile = &mut keys[(j / KEY_COLS) * KEY_COLS * hd..][..KEY_COLS * hd];
                for (d, x) in k.head(span.start + j, kv, hd).iter().enumerate() {
                    tile[d * KEY_COLS + j % KEY_COLS] = *x;
                }
                values[j * hd..][..hd].copy_from_slice(v.head(span.start + j, kv, hd));
            }
        });
        PackedKv {
            data,
            start,
            tiles,
            hd,
        }
    }

    /// Sequence `seq`'s head `kv`: its key tiles and its value rows.
    fn slab(&self, seq: usize, kv: usize) -> (&[f32], &[f32]) {
        let half = self.tiles[seq] * KEY_COLS * self.hd;
        let slab = &self.data[self.start[seq] + kv * 2 * half..][..2 * half];
        slab.split_at(half)
    }
}

/// A task's buffers, reused block after block.
struct Scratch {
    /// The block's queries, scaled: `g × QUERY_ROWS` rows of `hd`.
    q: Vec<f32>,
    /// Scores, then probabilities: rows × `KEY_COLS`.
    s: Vec<f32>,
    /// Accumulators: rows × `hd`.
    acc: Vec<f32>,
    /// Running max and sum per row.
    m: Vec<f32>,
    l: Vec<f32>,
}

impl Scratch {
    fn new(g: usize, hd: usize) -> Scratch {
        let rows = g * QUERY_ROWS;
        Scratch {
            q: vec![0.0; rows * hd],
            s: vec![0.0; rows * KEY_COLS],
            acc: vec![0.0; rows * hd],
            m: vec![0.0; rows],
            l: vec![0.0; rows],
        }
    }
}

simd_kernel! {
    /// One block: its queries against every key tile its rows see, then its output rows.
    fn run_block<const FMA: bool>(
        q: &Rows<'_>,
        heads: Heads,
        scale: f32,
        mask: Mask,
        block: &Block<'_>,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) {
        let hd = heads.head_dim;
        let g = heads.n_heads / heads.n_kv;
        let (q0, q1) = (block.q0, block.q1);
        let qn = q1 - q0;
        let rows = g * qn;
        let base = block.span.start;
        // Queries of the group's heads, row r = head_in_group · qn + i, pre-scaled (f32).
        for h in 0..g {
            let head = block.kv * g + h;
            for i in 0..qn {
                let src = q.head(base + q0 + i, head, hd);
                let dst = &mut scratch.q[(h * qn + i) * hd..][..hd];
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = s * scale;
                }
            }
        }
        scratch.m[..rows].fill(f32::NEG_INFINITY);
        scratch.l[..rows].fill(0.0);
        scratch.acc[..rows * hd].fill(0.0);
        let (k_lo, k_hi) = mask.keys_of(q0, q1, block.span.len);
        // Tiles start at whole multiples of the tile (the transposed keys are padded to them).
        let mut k0 = k_lo / KEY_COLS * KEY_COLS;
        while k0 < k_hi {
            let k1 = (k0 + KEY_COLS).min(k_hi);
            let kn = k1 - k0;
            // The tile's keys, transposed already (zero columns past the sequence: masked
            // below), and its values.
            let kt = &block.keys[k0 * hd..][..KEY_COLS * hd];
            scores::<FMA>(&scratch.q, rows, hd, kt, KEY_COLS, &mut scratch.s);
            let whole = kn == KEY_COLS && mask.sees_all(q0, q1, k0, k1);
            for r in 0..rows {
                let i = q0 + r % qn;
                let s = &mut scratch.s[r * KEY_COLS..][..KEY_COLS];
                if !whole {
                    for (j, x) in s.iter_mut().enumerate() {
                        if j >= kn || !mask.sees(i, k0 + j) {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
                let s: &mut [f32; KEY_COLS] = s.try_into().unwrap();
                let m_old = scratch.m[r];
                let m_new = m_old.max(row_max(s));
                if m_new == f32::NEG_INFINITY {
                    // Nothing of this tile seen by this row (a window's edge): nothing to add.
                    s.fill(0.0);
                    continue;
                }
                let sum = exp_in_place::<FMA>(s, m_new);
                if m_old != m_new {
                    let corr = exp::<FMA>(m_old - m_new);
                    scratch.l[r] *= corr;
                    for a in &mut scratch.acc[r * hd..][..hd] {
                        *a *= corr;
                    }
                }
                scratch.l[r] += sum;
                scratch.m[r] = m_new;
            }
            let values = &block.values[k0 * hd..][..kn * hd];
            weighted_values::<FMA>(&scratch.s, rows, hd, values, hd, kn, &mut scratch.acc);
            k0 = k1;
        }
        // out[token, head, :] = acc / l.
        for h in 0..g {
            let head = block.kv * g + h;
            for i in 0..qn {
                let r = h * qn + i;
                let inv = if scratch.l[r] > 0.0 { 1.0 / scratch.l[r] } else { 0.0 };
                let token = base + q0 + i;
                let dst = &mut out[(token * heads.n_heads + head) * hd..][..hd];
                for (o, a) in dst.iter_mut().zip(&scratch.acc[r * hd..][..hd]) {
                    *o = a * inv;
                }
            }
        }
    }
}

/// The largest of a tile's scores, taken lane by lane (a reduction a compiler vectorises:
/// `f32::max` folded in order is not reassociated).
#[inline(always)]
fn row_max(s: &[f32; KEY_COLS]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for chunk in s.chunks_exact(LANES) {
        for (l, x) in lanes.iter_mut().zip(chunk) {
            *l = if *x > *l { *x } else { *l };
        }
    }
    lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// `s[j] = exp(s[j] − m)` for the tile; returns their sum, taken lane by lane.
#[inline(always)]
fn exp_in_place<const FMA: bool>(s: &mut [f32; KEY_COLS], m: f32) -> f32 {
    let mut lanes = [0f32; LANES];
    for chunk in s.chunks_exact_mut(LANES) {
        for (l, x) in lanes.iter_mut().zip(chunk) {
            let p = exp::<FMA>(*x - m);
            *x = p;
            *l += p;
        }
    }
    lanes.iter().sum()
}

/// `s[r, 0..KEY_COLS] = q[r, :] · kt[:, 0..KEY_COLS]` for `rows` rows (`kt`'s rows `stride`
/// apart): four rows and [`KEY_COLS`] lanes at a time, accumulated over `hd`.
#[inline(always)]
fn scores<const FMA: bool>(
    q: &[f32],
    rows: usize,
    hd: usize,
    kt: &[f32],
    stride: usize,
    s: &mut [f32],
) {
    let mut r = 0;
    while r + 4 <= rows {
        let (mut a0, mut a1, mut a2, mut a3) = (
            [0f32; KEY_COLS],
            [0f32; KEY_COLS],
            [0f32; KEY_COLS],
            [0f32; KEY_COLS],
        );
        let (q0, q1, q2, q3) = (
            &q[r * hd..][..hd],
            &q[(r + 1) * hd..][..hd],
            &q[(r + 2) * hd..][..hd],
            &q[(r + 3) * hd..][..hd],
        );
        for d in 0..hd {
            // Each key lane loaded once, for the four rows.
            let kv: &[f32; KEY_COLS] = kt[d * stride..][..KEY_COLS].try_into().unwrap();
            let (x0, x1, x2, x3) = (q0[d], q1[d], q2[d], q3[d]);
            for j in 0..KEY_COLS {
                let k = kv[j];
                a0[j] = fmadd::<FMA>(x0, k, a0[j]);
                a1[j] = fmadd::<FMA>(x1, k, a1[j]);
                a2[j] = fmadd::<FMA>(x2, k, a2[j]);
                a3[j] = fmadd::<FMA>(x3, k, a3[j]);
            }
        }
        for (row, a) in [a0, a1, a2, a3].iter().enumerate() {
            s[(r + row) * KEY_COLS..][..KEY_COLS].copy_from_slice(a);
        }
        r += 4;
    }
    while r < rows {
        let mut a = [0f32; KEY_COLS];
        for d in 0..hd {
            let x = q[r * hd + d];
            let kv = &kt[d * stride..][..KEY_COLS];
            for j in 0..KEY_COLS {
                a[j] = fmadd::<FMA>(x, kv[j], a[j]);
            }
        }
        s[r * KEY_COLS..][..KEY_COLS].copy_from_slice(&a);
        r += 1;
    }
}

/// `acc[r, :] += Σ_j p[r, j] · v[j, :]` for `rows` rows and the tile's `kn` keys (`v`'s rows
/// `stride` apart, read where they lie): `hd` in chunks held in registers across the keys (64
/// lanes where `hd` allows, else 32 or 16), four rows at a time so that each value chunk
/// loaded serves them all.
#[inline(always)]
fn weighted_values<const FMA: bool>(
    p: &[f32],
    rows: usize,
    hd: usize,
    v: &[f32],
    stride: usize,
    kn: usize,
    acc: &mut [f32],
) {
    if hd.is_multiple_of(64) {
        weighted_chunks::<FMA, 64>(p, rows, hd, v, stride, kn, acc);
    } else if hd.is_multiple_of(32) {
        weighted_chunks::<FMA, 32>(p, rows, hd, v, stride, kn, acc);
    } else if hd.is_multiple_of(LANES) {
        weighted_chunks::<FMA, LANES>(p, rows, hd, v, stride, kn, acc);
    } else {
        for r in 0..rows {
            for j in 0..kn {
                let pj = p[r * KEY_COLS + j];
                let vj = &v[j * stride..][..hd];
                for (a, x) in acc[r * hd..][..hd].iter_mut().zip(vj) {
                    *a = fmadd::<FMA>(pj, *x, *a);
                }
            }
        }
    }
}

#[inline(always)]
fn weighted_chunks<const FMA: bool, const C: usize>(
    p: &[f32],
    rows: usize,
    hd: usize,
    v: &[f32],
    stride: usize,
    kn: usize,
    acc: &mut [f32],
) {
    // Four rows at a time (each value chunk loaded once for the four), then the rest one by one.
    let mut r = 0;
    while r + 4 <= rows {
        for c0 in (0..hd).step_by(C) {
            let load = |row: usize| -> [f32; C] { acc[row * hd + c0..][..C].try_into().unwrap() };
            let (mut a0, mut a1, mut a2, mut a3) = (load(r), load(r + 1), load(r + 2), load(r + 3));
            let (p0, p1, p2, p3) = (
                &p[r * KEY_COLS..][..KEY_COLS],
                &p[(r + 1) * KEY_COLS..][..KEY_COLS],
                &p[(r + 2) * KEY_COLS..][..KEY_COLS],
                &p[(r + 3) * KEY_COLS..][..KEY_COLS],
            );
            for j in 0..kn {
                let vj: &[f32; C] = v[j * stride + c0..][..C].try_into().unwrap();
                let (x0, x1, x2, x3) = (p0[j], p1[j], p2[j], p3[j]);
                for c in 0..C {
                    let x = vj[c];
                    a0[c] = fmadd::<FMA>(x0, x, a0[c]);
                    a1[c] = fmadd::<FMA>(x1, x, a1[c]);
                    a2[c] = fmadd::<FMA>(x2, x, a2[c]);
                    a3[c] = fmadd::<FMA>(x3, x, a3[c]);
                }
            }
            for (row, a) in [a0, a1, a2, a3].iter().enumerate() {
                acc[(r + row) * hd + c0..][..C].copy_from_slice(a);
            }
        }
        r += 4;
    }
    while r < rows {
        for c0 in (0..hd).step_by(C) {
            let mut a: [f32; C] = acc[r * hd + c0..][..C].try_into().unwrap();
            for j in 0..kn {
                let vj: &[f32; C] = v[j * stride + c0..][..C].try_into().unwrap();
                let x = p[r * KEY_COLS + j];
                for c in 0..C {
                    a[c] = fmadd::<FMA>(x, vj[c], a[c]);
                }
            }
            acc[r * hd + c0..][..C].copy_from_slice(&a);
        }
        r += 1;
    }
}

#[cfg(test)]
mod tests;
