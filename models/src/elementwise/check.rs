//! The device's kernels against their CPU twins, before a forward trusts them.

use candle_core::{DType, Result, Tensor};

use super::{AddRmsNorm, QkNormRope, Swiglu};

/// The device's kernels against the CPU's arithmetic on the same inputs: rows of a width the
/// 16-byte path takes and one it does not, and a view that starts off alignment. Each value
/// within one bf16 rounding (plus the f32 noise of a different summation order).
pub fn self_check(dev: &candle_core::Device) -> Result<()> {
    for (rows, width, offset) in [(37usize, 136usize, 0usize), (5, 44, 0), (9, 64, 3)] {
        // `rows × cols` values from `offset` on: a view that starts there.
        let rows_of = |seed: u64, scale: f32, cols: usize| -> Result<Tensor> {
            random(seed, offset + rows * cols, scale)?
                .narrow(0, offset, rows * cols)?
                .reshape((rows, cols))
        };
        let gate_up = rows_of(1, 12.0, 2 * width)?;
        let x = rows_of(2, 4.0, width)?;
        let h = rows_of(3, 4.0, width)?;
        let w = random(4, width, 2.0)?;
        let on = |t: &Tensor| t.to_device(dev);
        let want = gate_up.apply_op1_no_bwd(&Swiglu)?;
        let got = on(&gate_up)?.apply_op1_no_bwd(&Swiglu)?;
        close("swiglu", &want, &got)?;
        let op = AddRmsNorm { eps: 1e-6 };
        let want = x.apply_op3_no_bwd(&h, &w, &op)?;
        let got = on(&x)?.apply_op3_no_bwd(&on(&h)?, &on(&w)?, &op)?;
        close("add_rms_norm", &want, &got)?;
    }
    // q/k norm and rotary: heads 2..5 of rows of 6 heads of 16, 9 tokens in 12 rows.
    let (tokens, rows, row_heads, hd) = (9usize, 12usize, 6usize, 16usize);
    let qkv = random(5, tokens * row_heads * hd, 6.0)?.reshape((tokens, row_heads, hd))?;
    let w = random(6, hd, 2.0)?;
    let (cos, sin) = (
        random(7, rows * hd / 2, 2.0)?.reshape((rows, hd / 2))?,
        random(8, rows * hd / 2, 2.0)?.reshape((rows, hd / 2))?,
    );
    let op = |sin: &Tensor| QkNormRope {
        first: 2,
        heads: 3,
        rows,
        eps: 1e-6,
        sin: sin.clone(),
    };
    let want = qkv.apply_op3_no_bwd(&w, &cos, &op(&sin))?;
    let got = qkv.to_device(dev)?.apply_op3_no_bwd(
        &w.to_device(dev)?,
        &cos.to_device(dev)?,
        &op(&sin.to_device(dev)?),
    )?;
    close("qk_norm_rope", &want, &got)?;
    Ok(())
}

/// `n` seeded bf16 values on the CPU, spread evenly over `[-scale/2, scale/2)`.
fn random(seed: u64, n: usize, scale: f32) -> Result<Tensor> {
    let v: Vec<f32> = (0..n as u64)
        .map(|i| {
            let z =
                (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            ((z >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect();
    Tensor::from_vec(v, n, &candle_core::Device::Cpu)?.to_dtype(DType::BF16)
}

/// Every value of `got` within `|want|/128 + max|want|/64` of `want`: two bf16 roundings of its
/// own, plus those of the terms a rotary adds (which can cancel, leaving a small value with the
/// rounding error of large ones). A wrong index or sign misses by the values' own size.
pub(super) fn close(what: &str, want: &Tensor, got: &Tensor) -> Result<()> {
    let flat = |t: &Tensor| -> Result<Vec<f32>> {
        t.to_device(&candle_core::Device::Cpu)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1()
    };
    let (want, got) = (flat(want)?, flat(got)?);
    if want.len() != got.len() {
        candle_core::bail!("{what}: {} values, expected {}", got.len(), want.len());
    }
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
        let within = (a - b).abs() <= a.abs() / 128.0 + scale / 64.0;
        if !within {
            candle_core::bail!("{what}: value {i} is {b}, the CPU's {a}");
        }
    }
    Ok(())
}
