//! Rows quantized to E4M3 with a scale each: a weight's rows (its output channels) once at
//! load, an activation's rows (its tokens) at every projection. A row's scale is its largest
//! magnitude over 448, so the row spans E4M3's whole range; its value is `code · scale`.
//!
//! The arithmetic is fixed so that the CPU and the GPU kernel (`cuda/fp8.cu`) agree to the bit:
//! the codes are of `x · (448 / amax)`, the scale is `amax / 448`, a row of zeros has scale 1.

use rayon::prelude::*;

use super::e4m3::{decode_table, to_e4m3, E4M3_MAX};

/// `rows × cols` values as E4M3 codes, row-major, and one scale per row.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedRows {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// What a row's codes are multiplied by, and the factor its values are coded at.
fn scale_of(row: &[f32]) -> (f32, f32) {
    let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax > 0.0 && amax.is_finite() {
        (amax / E4M3_MAX, E4M3_MAX / amax)
    } else {
        (1.0, 1.0)
    }
}

/// Quantizes the `rows × cols` row-major `values`, a scale per row (rows in parallel: a 4B
/// model's weights are 3.6 billion values).
pub fn quantize_rows(values: &[f32], rows: usize, cols: usize) -> QuantizedRows {
    assert_eq!(values.len(), rows * cols, "quantize_rows: {rows} × {cols}");
    let mut codes = vec![0u8; values.len()];
    let mut scales = vec![1f32; rows];
    if cols > 0 {
        values
            .par_chunks(cols)
            .zip(codes.par_chunks_mut(cols))
            .zip(scales.par_iter_mut())
            .for_each(|((row, out), scale)| {
                let (s, inv) = scale_of(row);
                *scale = s;
                for (c, v) in out.iter_mut().zip(row) {
                    *c = to_e4m3(v * inv);
                }
            });
    }
    QuantizedRows {
        codes,
        scales,
        rows,
        cols,
    }
}

impl QuantizedRows {
    /// The values the codes stand for: `code · scale`, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let table = decode_table();
        let mut out = Vec::with_capacity(self.codes.len());
        if self.cols > 0 {
            for (row, scale) in self.codes.chunks(self.cols).zip(&self.scales) {
                out.extend(row.iter().map(|&c| table[c as usize] * scale));
            }
        }
        out
    }
}

/// Each row of `values` replaced by its quantized value (quantized, then dequantized): what the
/// CPU's emulation of an FP8 projection feeds its f32 product.
pub fn round_trip_rows(values: &mut [f32], cols: usize) {
    if cols == 0 {
        return;
    }
    let rows = values.len() / cols;
    let back = quantize_rows(values, rows, cols).dequantize();
    values.copy_from_slice(&back);
}

/// `x [t, k] · wᵀ [k, n]` as an FP8 projection computes it: both quantized by rows, the
/// product of their values in f32 (f64 sums). The reference the GPU's kernels are checked
/// against at first use.
pub fn fp8_product(x: &[f32], w: &[f32], (t, n, k): (usize, usize, usize)) -> Vec<f32> {
    let xq = quantize_rows(x, t, k).dequantize();
    let wq = quantize_rows(w, n, k).dequantize();
    let mut out = Vec::with_capacity(t * n);
    for row in xq.chunks(k.max(1)).take(t) {
        for col in wq.chunks(k.max(1)).take(n) {
            out.push(
                row.iter()
                    .zip(col)
                    .map(|(a, b)| (a * b) as f64)
                    .sum::<f64>() as f32,
            );
        }
    }
    out
}

/// Deterministic values in [-1, 1) (a check's inputs: no RNG crate in the forward's path).
pub fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_s_largest_value_is_coded_as_448_and_comes_back_exactly() {
        let q = quantize_rows(&[0.5, -2.0, 1.0, 0.0], 1, 4);
        assert_eq!(q.scales, vec![2.0 / 448.0]);
        assert_eq!(q.codes[1], 0xFE, "-2.0 is -448 after scaling");
        let back = q.dequantize();
        assert_eq!(back[1], -2.0);
        assert_eq!(back[3], 0.0);
    }

    #[test]
    fn each_row_has_its_own_scale() {
        // One row a thousand times the other: each still keeps E4M3's 3 bits of precision.
        let mut values = pseudo_random(64, 1);
        for v in &mut values[32..] {
            *v *= 1000.0;
        }
        let q = quantize_rows(&values, 2, 32);
        assert!((q.scales[1] / q.scales[0] - 1000.0).abs() < 100.0);
        let back = q.dequantize();
        for (i, (x, y)) in values.iter().zip(&back).enumerate() {
            // Half a step: 2⁻⁴ of the value, or half the subnormal step (2⁻¹⁰) times the scale.
            let scale = q.scales[i / 32];
            assert!(
                (x - y).abs() <= x.abs() / 16.0 + scale * 2f32.powi(-10),
                "{x} → {y}"
            );
        }
    }

    #[test]
    fn a_row_of_zeros_has_scale_one_and_codes_zero() {
        let q = quantize_rows(&[0.0; 8], 2, 4);
        assert_eq!(q.scales, vec![1.0, 1.0]);
        assert!(q.codes.iter().all(|&c| c == 0));
    }

    #[test]
    fn the_round_trip_in_place_is_quantize_then_dequantize() {
        let values = pseudo_random(3 * 40, 7);
        let expected = quantize_rows(&values, 3, 40).dequantize();
        let mut in_place = values.clone();
        round_trip_rows(&mut in_place, 40);
        assert_eq!(in_place, expected);
    }

    #[test]
    fn a_dot_product_of_quantized_rows_stays_close() {
        // The error a projection sees: the cosine of a 2,560-long product's row against the
        // exact one, over random rows (the reason a per-row scale is enough for the bar).
        let (k, n) = (2560, 8);
        let x = pseudo_random(k, 3);
        let w = pseudo_random(n * k, 4);
        let xq = quantize_rows(&x, 1, k).dequantize();
        let wq = quantize_rows(&w, n, k).dequantize();
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
        let exact: Vec<f32> = w.chunks(k).map(|r| dot(&x, r)).collect();
        let quant: Vec<f32> = wq.chunks(k).map(|r| dot(&xq, r)).collect();
        let cos = dot(&exact, &quant) / (dot(&exact, &exact) * dot(&quant, &quant)).sqrt();
        assert!(cos > 0.999, "cosine {cos}");
    }
}
