//! The model's linear projections (`x · Wᵀ`, no bias). candle runs them through cuBLAS'
//! `cublasGemmStridedBatchedEx`; `EF_GEMM_LT=1` (an A/B switch for the GPU check) runs bf16
//! ones on a GPU through cuBLASLt instead, with its heuristic and a workspace (32 MiB on sm_90),
//! the route TEI takes for its candle backend. Same arithmetic (bf16 in and out, f32
//! accumulation); measured against candle's by `gpu-diagnose.sh` before it can be a default.
//!
//! [`Projection`] is a projection's weight as the forward holds it: as loaded, or quantized to
//! FP8 (`--precision fp8`, [`crate::fp8`]).
//!
//! `EF_CUBLAS_WORKSPACE=1` (another A/B switch) keeps candle's cuBLAS call but gives its handle
//! a 32 MiB workspace, as PyTorch gives its own handles: candle sets none, and cuBLAS then
//! runs without the workspace NVIDIA recommends on Hopper (32 MiB), where some of its faster
//! kernels (split-K, stream-K) need one.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::Linear;

use crate::fp8;

/// A projection's weight (`[N, K]`, no bias) as the forward multiplies by it.
#[derive(Debug, Clone)]
pub enum Projection {
    /// As loaded: bf16 on a GPU, f32 on the CPU.
    Dense(Linear),
    /// FP8 on a GPU: E4M3 codes `[N, K]` (u8) and a scale per output channel `[N]` (f32).
    Fp8 { codes: Tensor, scales: Tensor },
    /// FP8 emulated on the CPU: the quantized weight's values in f32; each input row is
    /// quantized the same way before the product (f32), so the vectors carry FP8's rounding.
    Fp8Emulated(Linear),
}

impl From<Linear> for Projection {
    fn from(linear: Linear) -> Projection {
        Projection::Dense(linear)
    }
}

impl Projection {
    /// `x · Wᵀ` for a `[T, K]` input.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Projection::Dense(linear) => project(linear, x),
            Projection::Fp8 { codes, scales } => fp8_forward(x, codes, scales),
            Projection::Fp8Emulated(linear) => {
                let (t, k) = x.dims2()?;
                let mut rows = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                fp8::round_trip_rows(&mut rows, k);
                let rows = Tensor::from_vec(rows, (t, k), x.device())?.to_dtype(x.dtype())?;
                project(linear, &rows)
            }
        }
    }

    /// The weight quantized to FP8, a scale per output channel: codes and scales on a GPU, the
    /// emulation on the CPU. A projection already in FP8 is returned as it is.
    pub fn to_fp8(&self) -> Result<Projection> {
        let Projection::Dense(linear) = self else {
            return Ok(self.clone());
        };
        let weight = linear.weight();
        // A bf16 weight on a GPU: quantized there, by the kernel that quantizes activations.
        #[cfg(feature = "cuda")]
        if weight.device().is_cuda() && weight.dtype() == DType::BF16 {
            use fp8::gpu::{QuantizeRows, RowPart};
            let weight = weight.contiguous()?;
            return Ok(Projection::Fp8 {
                codes: weight.apply_op1_no_bwd(&QuantizeRows(RowPart::Codes))?,
                scales: weight.apply_op1_no_bwd(&QuantizeRows(RowPart::Scales))?,
            });
        }
        // Elsewhere than the CPU only a bf16 weight on a GPU is taken (`fp8::check_device`
        // refuses the rest before any projection is quantized).
        if !weight.device().is_cpu() {
            candle_core::bail!(
                "FP8 weights are quantized on their GPU from bf16, not {:?}. This is a bug.",
                weight.dtype()
            );
        }
        let (n, k) = weight.dims2()?;
        let values = weight
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let values = fp8::quantize_rows(&values, n, k).dequantize();
        let values = Tensor::from_vec(values, (n, k), &Device::Cpu)?;
        Ok(Projection::Fp8Emulated(Linear::new(
            values.to_dtype(weight.dtype())?,
            None,
        )))
    }

    /// Whether the weight is FP8 (or its emulation).
    pub fn is_fp8(&self) -> bool {
        !matches!(self, Projection::Dense(_))
    }
}

/// An FP8 projection of a bf16 input on a GPU (`fp8::gpu`).
fn fp8_forward(x: &Tensor, codes: &Tensor, scales: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.dtype() == DType::BF16 && x.device().is_cuda() {
        return x
            .contiguous()?
            .apply_op3_no_bwd(codes, scales, &fp8::gpu::Fp8Matmul);
    }
    let _ = (codes, scales);
    candle_core::bail!(
        "an FP8 projection takes a bf16 input on a GPU, not {:?} on {:?}. This is a bug.",
        x.dtype(),
        x.device().location()
    )
}

/// `x · Wᵀ` for a `[T, in]` input.
pub fn project(lin: &Linear, x: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::ab_switch::AbSwitch::GemmLt.on() && lt::applies(lin.weight(), x) {
        return x.apply_op2_no_bwd(lin.weight(), &lt::LtMatmul);
    }
    if blas::applies(lin.weight(), x) {
        return x.apply_op2_no_bwd(lin.weight(), &blas::BlasMatmul);
    }
    lin.forward(x)
}

/// f32 projections on the CPU through the machine's OpenBLAS (`crate::cpu::blas`), where it
/// has one: about twice candle's GEMM on AVX-512.
mod blas {
    use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};

    /// f32 on the CPU, a 2-D input with unit column stride and a contiguous weight, and an
    /// OpenBLAS loaded.
    pub(super) fn applies(weight: &Tensor, x: &Tensor) -> bool {
        x.dtype() == DType::F32
            && weight.dtype() == DType::F32
            && x.device().is_cpu()
            && x.rank() == 2
            && weight.rank() == 2
            && weight.is_contiguous()
            && x.stride()[1] == 1
            && crate::cpu::blas::sgemm().is_some()
    }

    pub(super) struct BlasMatmul;

    impl candle_core::CustomOp2 for BlasMatmul {
        fn name(&self) -> &'static str {
            "openblas-x-wt"
        }

        fn cpu_fwd(
            &self,
            x: &CpuStorage,
            x_l: &Layout,
            w: &CpuStorage,
            w_l: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let (m, k) = x_l.shape().dims2()?;
            let (n, k_w) = w_l.shape().dims2()?;
            if k != k_w {
                candle_core::bail!("projection: input of {k} columns, weight of {k_w}");
            }
            let Some(sgemm) = crate::cpu::blas::sgemm() else {
                candle_core::bail!("projection: no OpenBLAS. This is a bug.");
            };
            let (CpuStorage::F32(x), CpuStorage::F32(w)) = (x, w) else {
                candle_core::bail!("projection: f32 only");
            };
            let lda = if m > 1 { x_l.stride()[0] } else { k };
            let x = &x[x_l.start_offset()..];
            let w = &w[w_l.start_offset()..];
            let mut out = vec![0f32; m * n];
            sgemm.a_bt(x, lda, w, k, m, n, k, &mut out);
            Ok((CpuStorage::F32(out), Shape::from((m, n))))
        }
    }
}

/// Gives the cuBLAS handle of `dev` (candle's, which every candle matmul on it uses) a
/// workspace of its own, under `EF_CUBLAS_WORKSPACE=1`; returns whether it did. The buffer
/// lives as long as the process: the handle keeps using it.
#[cfg(feature = "cuda")]
pub fn give_cublas_a_workspace(dev: &candle_core::cuda_backend::CudaDevice) -> Result<bool> {
    use candle_core::cuda_backend::cudarc::cublas::sys;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr};
    use std::sync::{Mutex, OnceLock};

    const WORKSPACE: usize = 32 << 20;
    if !crate::ab_switch::AbSwitch::CublasWorkspace.on() {
        return Ok(false);
    }
    static KEPT: OnceLock<Mutex<Vec<CudaSlice<u8>>>> = OnceLock::new();
    let buffer = dev.alloc_zeros::<u8>(WORKSPACE)?;
    let stream = dev.cuda_stream();
    let (ptr, guard) = buffer.device_ptr(&stream);
    let blas = dev.cublas_handle();
    // SAFETY: a live device buffer of WORKSPACE bytes, kept for the rest of the process, on
    // the stream the handle computes on.
    let rc = unsafe {
        sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut std::ffi::c_void, WORKSPACE)
    };
    drop(guard);
    if rc != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        candle_core::bail!("cublasSetWorkspace: {rc:?}");
    }
    KEPT.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(buffer);
    Ok(true)
}

#[cfg(feature = "cuda")]
mod lt {
    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
    use candle_core::cuda_backend::{CudaDevice, CudaStorage};
    use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
    use half::bf16;

    use crate::device::per_device::PerDevice;

    /// bf16, on a GPU, a 2-D input and weight, both contiguous.
    pub(super) fn applies(weight: &Tensor, x: &Tensor) -> bool {
        x.dtype() == DType::BF16
            && weight.dtype() == DType::BF16
            && x.device().is_cuda()
            && x.rank() == 2
            && weight.rank() == 2
            && x.is_contiguous()
            && weight.is_contiguous()
    }

    /// One cuBLASLt handle and workspace per device, made at its first projection.
    fn handle(dev: &CudaDevice) -> Result<Arc<CudaBlasLT>> {
        static HANDLES: PerDevice<Arc<CudaBlasLT>> = PerDevice::new();
        HANDLES.get_or_make(dev, || {
            CudaBlasLT::new(dev.cuda_stream())
                .map(Arc::new)
                .map_err(|e| candle_core::Error::Msg(format!("cuBLASLt handle: {e:?}")))
        })
    }

    pub(super) struct LtMatmul;

    impl candle_core::CustomOp2 for LtMatmul {
        fn name(&self) -> &'static str {
            "cublaslt-projection"
        }

        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            candle_core::bail!("the cuBLASLt projection runs on CUDA only")
        }

        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            x_l: &Layout,
            w: &CudaStorage,
            w_l: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device.clone();
            let (t, k) = x_l.shape().dims2()?;
            let (n, k_w) = w_l.shape().dims2()?;
            if k != k_w {
                candle_core::bail!("projection: input of {k} columns against a weight of {k_w}");
            }
            let (Some((x0, x1)), Some((w0, w1))) =
                (x_l.contiguous_offsets(), w_l.contiguous_offsets())
            else {
                candle_core::bail!("the cuBLASLt projection takes contiguous tensors");
            };
            let xs = x.as_cuda_slice::<bf16>()?.slice(x0..x1);
            let ws = w.as_cuda_slice::<bf16>()?.slice(w0..w1);
            // SAFETY: every element of `out` is written by the matmul below.
            let mut out = unsafe { dev.alloc::<bf16>(t * n)? };
            // Row-major [T, K] · [N, K]ᵀ is, column-major, [N, T] = Wᵀ(op T) · X(op N).
            let cfg = MatmulConfig {
                transa: true,
                transb: false,
                transc: false,
                m: n as u64,
                n: t as u64,
                k: k as u64,
                alpha: 1.0,
                lda: k as i64,
                ldb: k as i64,
                beta: 0.0,
                ldc: n as i64,
                stride_a: None,
                stride_b: None,
                stride_c: None,
                stride_bias: None,
                batch_size: None,
            };
            let lt = handle(&dev)?;
            // SAFETY: the views hold n·k and t·k values, `out` t·n, all on the handle's stream.
            unsafe { lt.matmul(cfg, &ws, &xs, &mut out, None, None) }
                .map_err(|e| candle_core::Error::Msg(format!("cuBLASLt matmul: {e:?}")))?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((t, n))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emulated_fp8_projection_computes_the_fp8_product() {
        let (t, n, k) = (5, 24, 64);
        let x = fp8::pseudo_random(t * k, 1);
        let w = fp8::pseudo_random(n * k, 2);
        let weight = Tensor::from_vec(w.clone(), (n, k), &Device::Cpu).unwrap();
        let dense = Projection::Dense(Linear::new(weight, None));
        let quantized = dense.to_fp8().unwrap();
        assert!(matches!(quantized, Projection::Fp8Emulated(_)));
        let input = Tensor::from_vec(x.clone(), (t, k), &Device::Cpu).unwrap();
        let got = quantized.forward(&input).unwrap().flatten_all().unwrap();
        let got = got.to_vec1::<f32>().unwrap();
        let want = fp8::fp8_product(&x, &w, (t, n, k));
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "{g} against {w}");
        }
        // And it is not the unquantized product.
        let exact = dense.forward(&input).unwrap().flatten_all().unwrap();
        let exact = exact.to_vec1::<f32>().unwrap();
        let furthest = exact
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(furthest > 1e-3, "{furthest}");
    }
}
