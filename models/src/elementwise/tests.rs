use super::check::close;
use super::*;
use candle_core::Device;

fn tensor(v: &[f32], shape: (usize, usize), dtype: DType) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn pseudo(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 250.0 - 4.0)
        .collect()
}

/// In f32 the ops are candle's composite ones to rounding; in bf16 each value within one
/// bf16 step of candle's (which rounds at other points inside silu).
#[test]
fn the_fused_arithmetic_is_candles_swiglu_and_add_then_norm() {
    let (rows, hidden, inter) = (7, 24, 40);
    for (dtype, tol) in [(DType::F32, 1e-5f32), (DType::BF16, 1.0 / 64.0)] {
        let gate_up = tensor(&pseudo(rows * 2 * inter, 1), (rows, 2 * inter), dtype);
        let fused = flat(&gate_up.apply_op1_no_bwd(&Swiglu).unwrap());
        let plain = flat(&candle_nn::ops::swiglu(&gate_up).unwrap());
        assert_eq!(fused.len(), rows * inter);
        for (a, b) in fused.iter().zip(&plain) {
            assert!(
                (a - b).abs() <= tol * b.abs().max(1.0),
                "{dtype:?} swiglu {a} vs {b}"
            );
        }
        let x = tensor(&pseudo(rows * hidden, 2), (rows, hidden), dtype);
        let h = tensor(&pseudo(rows * hidden, 3), (rows, hidden), dtype);
        let w = Tensor::from_vec(pseudo(hidden, 4), hidden, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        // Inputs of two dtypes are an error, not a misread.
        let other = if dtype == DType::F32 {
            DType::BF16
        } else {
            DType::F32
        };
        let mixed = h.to_dtype(other).unwrap();
        let op = AddRmsNorm { eps: 1e-6 };
        assert!(x.apply_op3_no_bwd(&mixed, &w, &op).is_err());
        let both = x.apply_op3_no_bwd(&h, &w, &op).unwrap();
        assert_eq!(both.dims(), &[2, rows, hidden]);
        let sum = (&x + &h).unwrap();
        assert_eq!(
            flat(&both.get(0).unwrap()),
            flat(&sum),
            "{dtype:?}: the sums"
        );
        let normed = flat(&candle_nn::ops::rms_norm(&sum, &w, 1e-6).unwrap());
        for (a, b) in flat(&both.get(1).unwrap()).iter().zip(&normed) {
            assert!(
                (a - b).abs() <= tol * b.abs().max(1.0),
                "{dtype:?} norm {a} vs {b}"
            );
        }
    }
}

/// The rounding points are the kernels': silu is rounded to bf16 before the multiply.
#[test]
fn bf16_swiglu_rounds_the_activation_before_the_product() {
    // gate 1.5: silu = 1.5 / (1 + e^-1.5) = 1.22636..., bf16 1.2265625; up 3.0.
    let gate_up = tensor(&[1.5, 3.0], (1, 2), DType::BF16);
    let got = flat(&gate_up.apply_op1_no_bwd(&Swiglu).unwrap())[0];
    let want = half::bf16::from_f32(1.226_562_5 * 3.0).to_f32();
    assert_eq!(got, want);
    assert_ne!(got, half::bf16::from_f32(1.226_361 * 3.0).to_f32());
}

/// The checker itself: the CPU against itself passes, and a wrong value is named.
#[test]
fn the_self_check_passes_on_the_cpu_and_names_a_wrong_value() {
    self_check(&Device::Cpu).unwrap();
    let want = tensor(&[1.0, 2.0, 3.0], (1, 3), DType::F32);
    let got = tensor(&[1.0, 2.0, 3.2], (1, 3), DType::F32);
    let err = close("swiglu", &want, &got).unwrap_err().to_string();
    assert!(err.contains("swiglu: value 2"), "{err}");
    let nan = tensor(&[1.0, f32::NAN, 3.0], (1, 3), DType::F32);
    let err = close("swiglu", &want, &nan).unwrap_err().to_string();
    assert!(err.contains("swiglu: value 1"), "{err}");
}

/// q/k norm and rotary in one op: the heads asked for, normed by candle's rms_norm and
/// rotated by candle's rope_thd (to f32 rounding; within a bf16 step in bf16), then zero rows
/// up to the padded count.
#[test]
fn qk_norm_rope_is_candles_norm_then_rope_in_padded_rows() {
    let (tokens, rows, row_heads, hd, first, heads) = (5, 8, 6, 8, 4, 2);
    for (dtype, tol) in [(DType::F32, 1e-5f32), (DType::BF16, 1.0 / 64.0)] {
        let qkv = tensor(
            &pseudo(tokens * row_heads * hd, 9),
            (tokens * row_heads, hd),
            dtype,
        )
        .reshape((tokens, row_heads, hd))
        .unwrap();
        let w = tensor(&pseudo(hd, 10), (1, hd), dtype).reshape(hd).unwrap();
        let angles = |f: fn(f32) -> f32| -> Tensor {
            let v: Vec<f32> = (0..rows * hd / 2).map(|i| f(i as f32 * 0.37)).collect();
            tensor(&v, (rows, hd / 2), dtype)
        };
        let (cos, sin) = (angles(f32::cos), angles(f32::sin));
        let fused = Elementwise::Fused
            .qk_norm_rope(&qkv, first, heads, &w, 1e-6, &cos, &sin, rows)
            .unwrap()
            .expect("the CPU fuses");
        assert_eq!(fused.dims(), &[rows, heads, hd]);
        // Candle's mode runs candle's ops, but for the CPU in f32, whose steps are always its
        // own kernels (`crate::cpu::rows`).
        let want = (dtype == DType::F32).then(|| vec![rows, heads, hd]);
        assert_eq!(
            Elementwise::Candle
                .qk_norm_rope(&qkv, first, heads, &w, 1e-6, &cos, &sin, rows)
                .unwrap()
                .map(|t| t.dims().to_vec()),
            want
        );
        let part = qkv.narrow(1, first, heads).unwrap().contiguous().unwrap();
        let normed = candle_nn::ops::rms_norm(&part, &w, 1e-6).unwrap();
        let t_cos = cos.narrow(0, 0, tokens).unwrap();
        let t_sin = sin.narrow(0, 0, tokens).unwrap();
        let plain =
            candle_nn::rotary_emb::rope_thd(&normed.unsqueeze(0).unwrap(), &t_cos, &t_sin).unwrap();
        let got = flat(&fused);
        let want = flat(&plain);
        for (a, b) in got[..want.len()].iter().zip(&want) {
            assert!(
                (a - b).abs() <= tol * b.abs().max(1.0),
                "{dtype:?} {a} vs {b}"
            );
        }
        assert!(
            got[want.len()..].iter().all(|v| *v == 0.0),
            "{dtype:?}: padding"
        );
    }
}

/// In f32 on the CPU, either mode runs the row kernel (NomicBERT's SwiGLU is `Candle`'s), on a
/// product that is a view (narrowed) as well as a contiguous one: candle_nn's values.
#[test]
fn cpu_f32_swiglu_is_candle_nns_in_either_mode() {
    let (rows, inter) = (33, 40);
    let gate_up = Tensor::randn(0f32, 2.0, (rows + 2, 2 * inter), &Device::Cpu).unwrap();
    for t in [gate_up.clone(), gate_up.narrow(0, 1, rows).unwrap()] {
        let want = flat(&candle_nn::ops::swiglu(&t).unwrap());
        for mode in [Elementwise::Candle, Elementwise::Fused] {
            let got = flat(&mode.swiglu(&t).unwrap());
            assert_eq!(got.len(), t.dim(0).unwrap() * inter);
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs() + 1e-7,
                    "{mode:?} swiglu: {g} against {w}"
                );
            }
        }
    }
}

/// `Candle` is candle's ops; `Fused` the fused ones, which round differently in bf16.
#[test]
fn each_mode_runs_its_own_ops() {
    let gate_up = tensor(&pseudo(3 * 64, 5), (3, 64), DType::BF16);
    let candle = flat(&candle_nn::ops::swiglu(&gate_up).unwrap());
    let fused = flat(&gate_up.apply_op1_no_bwd(&Swiglu).unwrap());
    assert_ne!(candle, fused, "the inputs must tell the two apart");
    assert_eq!(flat(&Elementwise::Candle.swiglu(&gate_up).unwrap()), candle);
    assert_eq!(flat(&Elementwise::Fused.swiglu(&gate_up).unwrap()), fused);
}
