//! The ops as candle custom ops: the CPU side runs the twins of [`super::cpu`] (bf16) or
//! [`crate::cpu::rows`] (f32), the CUDA side launches [`super::gpu`]'s kernels.

use candle_core::{CpuStorage, Layout, Result, Shape, WithDType};

#[cfg(feature = "cuda")]
use super::gpu;
use super::{cpu, AddRmsNorm, QkNormRope, Swiglu};

/// The kernel for the storage `$s`'s element type, called with `$args` (each written once and
/// typed by the kernel it is passed to): bf16 through [`super::cpu`]'s kernel, which rounds
/// where the GPU's does; f32 through [`crate::cpu::rows`]' vectorised one. Its `Vec` is wrapped
/// back into a storage of that type; the other inputs' `values` fail on another dtype.
macro_rules! per_dtype {
    ($s:expr, $what:literal, bf16: $bf16:expr, f32: $f32:expr, ($($arg:expr),* $(,)?)) => {
        match $s {
            CpuStorage::BF16(_) => CpuStorage::BF16($bf16($($arg),*)),
            CpuStorage::F32(_) => CpuStorage::F32($f32($($arg),*)),
            _ => candle_core::bail!(concat!($what, ": bf16 or f32 only")),
        }
    };
}

/// The values of a contiguous CPU tensor.
fn values<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let Some((start, end)) = l.contiguous_offsets() else {
        candle_core::bail!("the fused elementwise ops take contiguous tensors");
    };
    Ok(&s.as_slice::<T>()?[start..end])
}

impl candle_core::CustomOp1 for Swiglu {
    fn name(&self) -> &'static str {
        "fused-swiglu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, inter) = halves(l)?;
        let out = per_dtype!(s, "swiglu",
            bf16: cpu::swiglu::<half::bf16>,
            f32: crate::cpu::rows::swiglu,
            (values(s, l)?, inter));
        Ok((out, Shape::from((rows, inter))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::cuda_backend::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::cuda_backend::CudaStorage, Shape)> {
        gpu::swiglu(s, l, halves(l)?)
    }
}

/// `(rows, inter)` of a `[rows, 2·inter]` gate/up product.
fn halves(l: &Layout) -> Result<(usize, usize)> {
    let (rows, cols) = l.shape().dims2()?;
    if cols % 2 != 0 {
        candle_core::bail!("swiglu: {cols} columns do not split into gate and up");
    }
    Ok((rows, cols / 2))
}

impl candle_core::CustomOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "fused-add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_l: &Layout,
        h: &CpuStorage,
        h_l: &Layout,
        w: &CpuStorage,
        w_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, hidden) = x_l.shape().dims2()?;
        check_shapes(x_l, h_l, w_l)?;
        let out = per_dtype!(x, "add_rms_norm",
            bf16: cpu::add_rms_norm::<half::bf16>,
            f32: crate::cpu::rows::add_rms_norm,
            (values(x, x_l)?, values(h, h_l)?, values(w, w_l)?, self.eps));
        Ok((out, Shape::from((2, rows, hidden))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::cuda_backend::CudaStorage,
        x_l: &Layout,
        h: &candle_core::cuda_backend::CudaStorage,
        h_l: &Layout,
        w: &candle_core::cuda_backend::CudaStorage,
        w_l: &Layout,
    ) -> Result<(candle_core::cuda_backend::CudaStorage, Shape)> {
        check_shapes(x_l, h_l, w_l)?;
        gpu::add_rms_norm((x, x_l), (h, h_l), (w, w_l), self.eps)
    }
}

impl QkNormRope {
    /// `(tokens, row_heads, hd)` of `qkv`, checked against the weight, the tables and the op.
    fn dims(&self, qkv_l: &Layout, w_l: &Layout, cos_l: &Layout) -> Result<(usize, usize, usize)> {
        let (tokens, row_heads, hd) = qkv_l.shape().dims3()?;
        let (sin_l, half) = (self.sin.layout(), hd / 2);
        let fits = hd % 2 == 0
            && self.first + self.heads <= row_heads
            && w_l.shape().dims() == [hd]
            && cos_l.shape().dims() == [self.rows, half]
            && sin_l.shape().dims() == [self.rows, half]
            && self.rows >= tokens;
        if !fits {
            candle_core::bail!(
                "qk_norm_rope: qkv {:?}, heads {}..{}, norm {:?}, cos {:?}, sin {:?}, {} rows",
                qkv_l.shape(),
                self.first,
                self.first + self.heads,
                w_l.shape(),
                cos_l.shape(),
                sin_l.shape(),
                self.rows
            );
        }
        Ok((tokens, row_heads, hd))
    }
}

impl candle_core::CustomOp3 for QkNormRope {
    fn name(&self) -> &'static str {
        "fused-qk-norm-rope"
    }

    fn cpu_fwd(
        &self,
        qkv: &CpuStorage,
        qkv_l: &Layout,
        w: &CpuStorage,
        w_l: &Layout,
        cos: &CpuStorage,
        cos_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, row_heads, hd) = self.dims(qkv_l, w_l, cos_l)?;
        let (sin_storage, sin_l) = self.sin.storage_and_layout();
        let candle_core::Storage::Cpu(sin) = &*sin_storage else {
            candle_core::bail!("qk_norm_rope: the sin table is not on the CPU");
        };
        let (first, heads, rows, eps) = (self.first, self.heads, self.rows, self.eps);
        let out = per_dtype!(qkv, "qk_norm_rope",
        bf16: cpu::qk_norm_rope::<half::bf16>,
        f32: crate::cpu::rows::qk_norm_rope,
        (
            values(qkv, qkv_l)?,
            row_heads,
            first,
            heads,
            values(w, w_l)?,
            eps,
            values(cos, cos_l)?,
            values(sin, sin_l)?,
            rows,
        ));
        Ok((out, Shape::from((rows, heads, hd))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        qkv: &candle_core::cuda_backend::CudaStorage,
        qkv_l: &Layout,
        w: &candle_core::cuda_backend::CudaStorage,
        w_l: &Layout,
        cos: &candle_core::cuda_backend::CudaStorage,
        cos_l: &Layout,
    ) -> Result<(candle_core::cuda_backend::CudaStorage, Shape)> {
        let (tokens, row_heads, hd) = self.dims(qkv_l, w_l, cos_l)?;
        gpu::qk_norm_rope(
            self,
            (tokens, row_heads, hd),
            (qkv, qkv_l),
            (w, w_l),
            (cos, cos_l),
        )
    }
}

fn check_shapes(x_l: &Layout, h_l: &Layout, w_l: &Layout) -> Result<()> {
    let (_, hidden) = x_l.shape().dims2()?;
    if x_l.shape() != h_l.shape() || w_l.shape().dims() != [hidden] {
        candle_core::bail!(
            "add_rms_norm: x {:?}, h {:?} and w {:?} do not match",
            x_l.shape(),
            h_l.shape(),
            w_l.shape()
        );
    }
    Ok(())
}
