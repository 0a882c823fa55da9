//! The forward's elementwise steps, each as one pass over memory: SwiGLU over the halves of the
//! gate/up product, a residual add together with the RMSNorm that reads its sum, and q's and
//! k's head norm together with the rotary, written into the attention's padded rows.
//!
//! candle's SwiGLU (`candle_nn::ops::swiglu`) is a silu then a multiply over strided halves:
//! two passes, per-element index arithmetic, and a copy of the strides to the device each; a
//! residual add then a norm read and write the hidden state twice; q and k are copied into the
//! padded rows, normed, then rotated: three passes. On a GPU these are our own
//! kernels (`cuda/elementwise.cu`, cubins for sm_80 and sm_90 built by `build.rs`, loaded from
//! bytes: no NVRTC). `EF_FUSED_ELEMENTWISE=1` (an A/B switch for the GPU check) turns them on,
//! on any device: the CPU runs the same arithmetic ([`cpu`]), which is what the tests check and
//! what a GPU's first use compares its kernels with before trusting them. Off (the default),
//! the forward is candle's ops, unchanged.
//!
//! Arithmetic (bf16 in and out, f32 inside, rounded where transformers rounds):
//! `act = bf16(silu(gate))`, `out = bf16(act · up)`; `sum = bf16(x + h)`,
//! `normed = bf16(sum · rsqrt(mean(sum²) + eps) · w)` with the mean over the rounded sum; q/k:
//! `n = bf16(x · rsqrt(mean(x²) + eps) · w)` per head, then `bf16(n₁·cos − n₂·sin)`,
//! `bf16(n₁·sin + n₂·cos)` in f32 (candle's rope rounds each product: we round once).

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor, WithDType};

use crate::ab_switch::AbSwitch;

/// Which ops run the forward's elementwise steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elementwise {
    /// candle's ops (the default).
    Candle,
    /// Our fused kernels, where they apply (bf16 on a GPU whose kernels passed their check, or
    /// the CPU); candle's ops elsewhere.
    Fused,
}

impl Elementwise {
    /// `Fused` under `EF_FUSED_ELEMENTWISE=1`, else `Candle`.
    pub fn from_env() -> Elementwise {
        if AbSwitch::FusedElementwise.on() {
            Elementwise::Fused
        } else {
            Elementwise::Candle
        }
    }

    /// `silu(gate) · up` of `gate_up` (`[T, 2I]`, gate then up): `[T, I]`.
    pub fn swiglu(self, gate_up: &Tensor) -> Result<Tensor> {
        if self.fuses(gate_up) {
            return gate_up.apply_op1_no_bwd(&Swiglu);
        }
        candle_nn::ops::swiglu(gate_up)
    }

    /// `x + h` (`[T, H]` each) and its RMSNorm with `weight`: `(sum, normed)`.
    pub fn add_rms_norm(
        self,
        x: &Tensor,
        h: &Tensor,
        weight: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        if self.fuses(x) && x.dims() == h.dims() && x.dtype() == h.dtype() {
            let both = x.apply_op3_no_bwd(h, weight, &AddRmsNorm { eps })?;
            return Ok((both.get(0)?, both.get(1)?));
        }
        let sum = (x + h)?;
        let normed = candle_nn::ops::rms_norm(&sum, weight, eps)?;
        Ok((sum, normed))
    }

    /// Fused, and `t` a 2-D tensor of a dtype the kernels take, on a device whose kernels
    /// passed their first-use check.
    fn fuses(self, t: &Tensor) -> bool {
        t.rank() == 2 && self.fuses_any_rank(t)
    }

    fn fuses_any_rank(self, t: &Tensor) -> bool {
        self == Elementwise::Fused && matches!(t.dtype(), DType::BF16 | DType::F32) && trusted(t)
    }

    /// Per-head RMSNorm (weight `norm`, `[hd]`) then rotary (`cos`, `sin`: `[rows, hd / 2]`, a
    /// row per token's position) of the heads `first..first + heads` of `qkv`
    /// (`[T, row_heads, hd]`, contiguous), in `rows ≥ T` rows, zeros past `T`: `[rows, heads,
    /// hd]`. `None` where this mode does not fuse it (the caller runs candle's ops).
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope(
        self,
        qkv: &Tensor,
        first: usize,
        heads: usize,
        norm: &Tensor,
        eps: f32,
        cos: &Tensor,
        sin: &Tensor,
        rows: usize,
    ) -> Result<Option<Tensor>> {
        if !(self.fuses_any_rank(qkv) && qkv.rank() == 3 && qkv.is_contiguous()) {
            return Ok(None);
        }
        let op = QkNormRope {
            first,
            heads,
            rows: rows.max(qkv.dim(0)?),
            eps,
            sin: sin.clone(),
        };
        qkv.apply_op3_no_bwd(norm, cos, &op).map(Some)
    }
}

#[cfg(feature = "cuda")]
fn trusted(t: &Tensor) -> bool {
    match t.device() {
        candle_core::Device::Cuda(dev) => t.dtype() == DType::BF16 && gpu::trusted(dev),
        candle_core::Device::Cpu => true,
        _ => false,
    }
}

#[cfg(not(feature = "cuda"))]
fn trusted(t: &Tensor) -> bool {
    t.device().is_cpu()
}

struct Swiglu;

/// See [`Elementwise::qk_norm_rope`]; `sin` rides along (a custom op takes three tensors).
struct QkNormRope {
    first: usize,
    heads: usize,
    rows: usize,
    eps: f32,
    sin: Tensor,
}

struct AddRmsNorm {
    eps: f32,
}

/// `$body` with `$t` the element type of the storage `$s` (bf16 or f32), its `Vec` wrapped back
/// into a storage of that type. The other inputs' `values::<$t>` fail on another dtype.
macro_rules! bf16_or_f32 {
    ($s:expr, $what:literal, |$t:ident| $body:expr) => {
        match $s {
            CpuStorage::BF16(_) => {
                type $t = half::bf16;
                CpuStorage::BF16($body)
            }
            CpuStorage::F32(_) => {
                type $t = f32;
                CpuStorage::F32($body)
            }
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

/// The arithmetic of the kernels, on the CPU: f32 inside, rounded to `T` where they round.
pub mod cpu {
    use candle_core::WithDType;

    fn round<T: WithDType>(v: f32) -> f32 {
        T::from_f64(v as f64).to_f64() as f32
    }

    /// `gate_up` is `rows × 2·inter` row-major; returns `rows × inter`.
    pub fn swiglu<T: WithDType>(gate_up: &[T], inter: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(gate_up.len() / 2);
        for row in gate_up.chunks_exact(2 * inter) {
            let (gate, up) = row.split_at(inter);
            for (g, u) in gate.iter().zip(up) {
                let g = g.to_f64() as f32;
                let act = round::<T>(g / (1.0 + (-g).exp()));
                out.push(T::from_f64((act * u.to_f64() as f32) as f64));
            }
        }
        out
    }

    /// `x`, `h`: `rows × hidden`, `w`: `hidden`; returns the sums then the normed rows.
    pub fn add_rms_norm<T: WithDType>(x: &[T], h: &[T], w: &[T], eps: f32) -> Vec<T> {
        let hidden = w.len();
        let mut sums = Vec::with_capacity(x.len());
        let mut normed = Vec::with_capacity(x.len());
        for (xr, hr) in x.chunks_exact(hidden).zip(h.chunks_exact(hidden)) {
            let start = sums.len();
            let mut squares = 0f32;
            for (a, b) in xr.iter().zip(hr) {
                let s = round::<T>(a.to_f64() as f32 + b.to_f64() as f32);
                squares += s * s;
                sums.push(T::from_f64(s as f64));
            }
            let inv = 1.0 / (squares / hidden as f32 + eps).sqrt();
            for (s, wv) in sums[start..].iter().zip(w) {
                let v = s.to_f64() as f32 * inv * wv.to_f64() as f32;
                normed.push(T::from_f64(v as f64));
            }
        }
        sums.extend(normed);
        sums
    }

    /// `qkv`: `tokens × row_heads × hd`; `cos`, `sin`: `rows × hd/2` (at least `tokens` rows);
    /// returns `rows × heads × hd`, heads `first..first + heads` normed and rotated, zeros past
    /// `tokens`.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope<T: WithDType>(
        qkv: &[T],
        row_heads: usize,
        first: usize,
        heads: usize,
        w: &[T],
        eps: f32,
        cos: &[T],
        sin: &[T],
        rows: usize,
    ) -> Vec<T> {
        let hd = w.len();
        let half = hd / 2;
        let tokens = qkv.len() / (row_heads * hd);
        let mut out = vec![T::zero(); rows * heads * hd];
        for t in 0..tokens {
            for h in 0..heads {
                let src = &qkv[(t * row_heads + first + h) * hd..][..hd];
                let f = |v: &T| v.to_f64() as f32;
                let squares: f32 = src.iter().map(|v| f(v) * f(v)).sum();
                let inv = 1.0 / (squares / hd as f32 + eps).sqrt();
                let dst = &mut out[(t * heads + h) * hd..][..hd];
                for i in 0..half {
                    let a = round::<T>(f(&src[i]) * inv * f(&w[i]));
                    let b = round::<T>(f(&src[i + half]) * inv * f(&w[i + half]));
                    let (c, s) = (f(&cos[t * half + i]), f(&sin[t * half + i]));
                    dst[i] = T::from_f64((a * c - b * s) as f64);
                    dst[i + half] = T::from_f64((a * s + b * c) as f64);
                }
            }
        }
        out
    }
}

impl candle_core::CustomOp1 for Swiglu {
    fn name(&self) -> &'static str {
        "fused-swiglu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, cols) = l.shape().dims2()?;
        if cols % 2 != 0 {
            candle_core::bail!("swiglu: {cols} columns do not split into gate and up");
        }
        let out = bf16_or_f32!(s, "swiglu", |T| cpu::swiglu::<T>(values(s, l)?, cols / 2));
        Ok((out, Shape::from((rows, cols / 2))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::cuda_backend::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::cuda_backend::CudaStorage, Shape)> {
        gpu::swiglu(s, l)
    }
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
        let out = bf16_or_f32!(x, "add_rms_norm", |T| cpu::add_rms_norm::<T>(
            values(x, x_l)?,
            values(h, h_l)?,
            values(w, w_l)?,
            self.eps
        ));
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
        gpu::add_rms_norm(x, x_l, h, h_l, w, w_l, self.eps)
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
        let out = bf16_or_f32!(qkv, "qk_norm_rope", |T| cpu::qk_norm_rope::<T>(
            values(qkv, qkv_l)?,
            row_heads,
            first,
            heads,
            values(w, w_l)?,
            eps,
            values(cos, cos_l)?,
            values(sin, sin_l)?,
            rows
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

#[cfg(feature = "cuda")]
mod gpu {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};

    use candle_core::cuda_backend::cudarc::driver::{
        CudaFunction, CudaView, DevicePtr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
    use candle_core::cuda_backend::{CudaDevice, CudaStorage, DeviceId, WrapErr};
    use candle_core::{Layout, Result, Shape};
    use half::bf16;

    /// sm_80 and sm_90 cubins and compute_80 PTX of `cuda/elementwise.cu`.
    static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/elementwise.fatbin"));

    struct Kernels {
        swiglu_v8: CudaFunction,
        swiglu_v1: CudaFunction,
        add_norm_v8: CudaFunction,
        add_norm_v1: CudaFunction,
        qk_norm_rope: CudaFunction,
    }

    fn kernels(dev: &CudaDevice) -> Result<Arc<Kernels>> {
        static LOADED: OnceLock<Mutex<HashMap<DeviceId, Arc<Kernels>>>> = OnceLock::new();
        let mut loaded = LOADED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(k) = loaded.get(&dev.id()) {
            return Ok(k.clone());
        }
        let module = dev
            .cuda_stream()
            .context()
            .load_module(Ptx::from_binary(FATBIN.to_vec()))
            .w()?;
        let f = |name: &str| module.load_function(name).w();
        let k = Arc::new(Kernels {
            swiglu_v8: f("ef_swiglu_bf16_v8")?,
            swiglu_v1: f("ef_swiglu_bf16_v1")?,
            add_norm_v8: f("ef_add_rms_norm_bf16_v8")?,
            add_norm_v1: f("ef_add_rms_norm_bf16_v1")?,
            qk_norm_rope: f("ef_qk_norm_rope_bf16")?,
        });
        loaded.insert(dev.id(), k.clone());
        Ok(k)
    }

    /// Whether `dev`'s kernels agree with the CPU's arithmetic, checked once per device at
    /// first use (a kernel that loads but computes wrong must not write a run's vectors): on
    /// a mismatch, or a kernel that does not load, the forward keeps candle's ops, saying why.
    pub(super) fn trusted(dev: &CudaDevice) -> bool {
        static CHECKED: OnceLock<Mutex<HashMap<DeviceId, bool>>> = OnceLock::new();
        let mut checked = CHECKED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *checked.entry(dev.id()).or_insert_with(|| {
            match super::self_check(&candle_core::Device::Cuda(dev.clone())) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        "the fused elementwise kernels failed their check on this GPU and are \
                         not used (candle's ops instead): {e}"
                    );
                    false
                }
            }
        })
    }

    fn view<'a>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, bf16>> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("the fused elementwise kernels take contiguous tensors");
        };
        Ok(s.as_cuda_slice::<bf16>()?.slice(start..end))
    }

    /// 16-byte loads apply: every view starts 16-byte aligned and rows are whole 8-value groups.
    fn aligned(dev: &CudaDevice, views: &[&CudaView<'_, bf16>], row: usize) -> bool {
        let stream = dev.cuda_stream();
        row.is_multiple_of(8)
            && views
                .iter()
                .all(|v| v.device_ptr(&stream).0.is_multiple_of(16))
    }

    pub(super) fn swiglu(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = s.device.clone();
        let (rows, cols) = l.shape().dims2()?;
        let inter = cols / 2;
        if cols % 2 != 0 || rows == 0 {
            candle_core::bail!("swiglu: a [rows > 0, 2·inter] input, not [{rows}, {cols}]");
        }
        let gate_up = view(s, l)?;
        let k = kernels(&dev)?;
        let (func, vec) = if aligned(&dev, &[&gate_up], inter) {
            (&k.swiglu_v8, 8)
        } else {
            (&k.swiglu_v1, 1)
        };
        // SAFETY: the kernel writes every one of the rows · inter values.
        let out = unsafe { dev.alloc::<bf16>(rows * inter)? };
        let groups = (rows * inter / vec) as u64;
        let blocks = groups.div_ceil(256).min(1 << 20) as u32;
        let (rows, inter) = (rows as u64, inter as u64);
        let stream = dev.cuda_stream();
        let mut launch = stream.launch_builder(func);
        launch.arg(&gate_up).arg(&out).arg(&rows).arg(&inter);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments are the kernel's (pointers, two u64), the buffers of the sizes
        // it reads and writes.
        unsafe { launch.launch(cfg) }.w()?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((rows as usize, inter as usize)),
        ))
    }

    type Arg<'a> = (&'a CudaStorage, &'a Layout);

    pub(super) fn qk_norm_rope(
        op: &super::QkNormRope,
        (tokens, row_heads, hd): (usize, usize, usize),
        (qkv, qkv_l): Arg<'_>,
        (w, w_l): Arg<'_>,
        (cos, cos_l): Arg<'_>,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = qkv.device.clone();
        let (sin_storage, sin_l) = op.sin.storage_and_layout();
        let candle_core::Storage::Cuda(sin) = &*sin_storage else {
            candle_core::bail!("qk_norm_rope: the sin table is not on the GPU");
        };
        let (qv, wv, cv, sv) = (
            view(qkv, qkv_l)?,
            view(w, w_l)?,
            view(cos, cos_l)?,
            view(sin, sin_l)?,
        );
        let k = kernels(&dev)?;
        let out_len = op.rows * op.heads * hd;
        // SAFETY: the kernel writes every value: the tokens' rows, and zeros past them.
        let out = unsafe { dev.alloc::<bf16>(out_len)? };
        let warps = (op.rows * op.heads) as u64;
        let blocks = (warps * 32).div_ceil(256) as u32;
        let (tokens, rows) = (tokens as u64, op.rows as u64);
        let (row_heads, first, heads, hd32) = (
            row_heads as u32,
            op.first as u32,
            op.heads as u32,
            hd as u32,
        );
        let stream = dev.cuda_stream();
        let mut launch = stream.launch_builder(&k.qk_norm_rope);
        launch
            .arg(&qv)
            .arg(&wv)
            .arg(&cv)
            .arg(&sv)
            .arg(&out)
            .arg(&tokens)
            .arg(&rows)
            .arg(&row_heads)
            .arg(&first)
            .arg(&heads)
            .arg(&hd32)
            .arg(&op.eps);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as the kernel's signature; the shapes were checked by `QkNormRope::dims`.
        unsafe { launch.launch(cfg) }.w()?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((op.rows, op.heads, hd)),
        ))
    }

    pub(super) fn add_rms_norm(
        x: &CudaStorage,
        x_l: &Layout,
        h: &CudaStorage,
        h_l: &Layout,
        w: &CudaStorage,
        w_l: &Layout,
        eps: f32,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = x.device.clone();
        let (rows, hidden) = x_l.shape().dims2()?;
        if rows == 0 {
            candle_core::bail!("add_rms_norm: no rows");
        }
        let (xv, hv, wv) = (view(x, x_l)?, view(h, h_l)?, view(w, w_l)?);
        let k = kernels(&dev)?;
        let (func, vec) = if aligned(&dev, &[&xv, &hv, &wv], hidden) {
            (&k.add_norm_v8, 8)
        } else {
            (&k.add_norm_v1, 1)
        };
        // SAFETY: the kernel writes every value of both halves (sums, then normed rows).
        let out = unsafe { dev.alloc::<bf16>(2 * rows * hidden)? };
        // A thread per `vec` values of a row, in whole warps, at most 1,024.
        let threads = (hidden / vec).div_ceil(32).clamp(1, 32) as u32 * 32;
        let (rows_arg, hidden_arg) = (rows as u64, hidden as u64);
        let stream = dev.cuda_stream();
        let mut launch = stream.launch_builder(func);
        launch
            .arg(&xv)
            .arg(&hv)
            .arg(&wv)
            .arg(&out)
            .arg(&rows_arg)
            .arg(&hidden_arg)
            .arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as the kernel's signature; `out` holds 2 · rows · hidden values.
        unsafe { launch.launch(cfg) }.w()?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((2, rows, hidden)),
        ))
    }
}

/// The device's kernels against the CPU's arithmetic on the same inputs: rows of a width the
/// 16-byte path takes and one it does not, and a view that starts off alignment. Each value
/// within one bf16 rounding (plus the f32 noise of a different summation order).
pub fn self_check(dev: &candle_core::Device) -> Result<()> {
    let cpu = candle_core::Device::Cpu;
    for (rows, width, offset) in [(37usize, 136usize, 0usize), (5, 44, 0), (9, 64, 3)] {
        let n = rows * width + offset;
        let data = |seed: u64, scale: f32| -> Result<Tensor> {
            let v: Vec<f32> = (0..2 * n as u64)
                .map(|i| {
                    let z = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed)
                        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    ((z >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
                })
                .collect();
            Tensor::from_vec(v, 2 * n, &cpu)?.to_dtype(DType::BF16)
        };
        let rows_of = |t: &Tensor, cols: usize| -> Result<Tensor> {
            t.narrow(0, offset, rows * cols)?.reshape((rows, cols))
        };
        let gate_up = rows_of(&data(1, 12.0)?, 2 * width)?;
        let x = rows_of(&data(2, 4.0)?, width)?;
        let h = rows_of(&data(3, 4.0)?, width)?;
        let w = data(4, 2.0)?.narrow(0, 0, width)?;
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
    let table = |seed: u64, n: usize, shape: (usize, usize)| -> Result<Tensor> {
        let v: Vec<f32> = (0..n as u64)
            .map(|i| ((i * 2_654_435_761 + seed * 97) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        Tensor::from_vec(v, shape, &cpu)?.to_dtype(DType::BF16)
    };
    let qkv = table(5, tokens * row_heads * hd, (tokens * row_heads, hd))?
        .affine(3.0, 0.0)?
        .reshape((tokens, row_heads, hd))?;
    let w = table(6, hd, (1, hd))?.reshape(hd)?;
    let (cos, sin) = (
        table(7, rows * hd / 2, (rows, hd / 2))?,
        table(8, rows * hd / 2, (rows, hd / 2))?,
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

/// Every value of `got` within `|want|/128 + max|want|/64` of `want`: two bf16 roundings of its
/// own, plus those of the terms a rotary adds (which can cancel, leaving a small value with the
/// rounding error of large ones). A wrong index or sign misses by the values' own size.
fn close(what: &str, want: &Tensor, got: &Tensor) -> Result<()> {
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

#[cfg(test)]
mod tests {
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
            assert_eq!(
                Elementwise::Candle
                    .qk_norm_rope(&qkv, first, heads, &w, 1e-6, &cos, &sin, rows)
                    .unwrap()
                    .map(|t| t.dims().to_vec()),
                None
            );
            let part = qkv.narrow(1, first, heads).unwrap().contiguous().unwrap();
            let normed = candle_nn::ops::rms_norm(&part, &w, 1e-6).unwrap();
            let t_cos = cos.narrow(0, 0, tokens).unwrap();
            let t_sin = sin.narrow(0, 0, tokens).unwrap();
            let plain =
                candle_nn::rotary_emb::rope_thd(&normed.unsqueeze(0).unwrap(), &t_cos, &t_sin)
                    .unwrap();
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
}
