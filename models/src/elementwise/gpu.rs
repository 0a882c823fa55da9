//! The kernels of `cuda/elementwise.cu` on a GPU: loaded once per device from the embedded
//! fatbin, checked against the CPU at first use, launched with the widest loads the rows allow.

use std::convert::Infallible;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaView, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaDevice, CudaStorage, WrapErr};
use candle_core::{Layout, Result, Shape};
use half::bf16;

use crate::device::per_device::PerDevice;

/// `blocks` blocks of `threads` threads, no dynamic shared memory.
fn grid(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

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
    static LOADED: PerDevice<Arc<Kernels>> = PerDevice::new();
    LOADED.get_or_make(dev, || {
        let module = dev
            .cuda_stream()
            .context()
            .load_module(Ptx::from_binary(FATBIN.to_vec()))
            .w()?;
        let f = |name: &str| module.load_function(name).w();
        Ok(Arc::new(Kernels {
            swiglu_v8: f("ef_swiglu_bf16_v8")?,
            swiglu_v1: f("ef_swiglu_bf16_v1")?,
            add_norm_v8: f("ef_add_rms_norm_bf16_v8")?,
            add_norm_v1: f("ef_add_rms_norm_bf16_v1")?,
            qk_norm_rope: f("ef_qk_norm_rope_bf16")?,
        }))
    })
}

/// Whether `dev`'s kernels agree with the CPU's arithmetic, checked once per device at
/// first use (a kernel that loads but computes wrong must not write a run's vectors): on
/// a mismatch, or a kernel that does not load, the forward keeps candle's ops, saying why.
pub(super) fn trusted(dev: &CudaDevice) -> bool {
    static CHECKED: PerDevice<bool> = PerDevice::new();
    let Ok(trusted) = CHECKED.get_or_make(dev, || -> std::result::Result<bool, Infallible> {
        match super::self_check(&candle_core::Device::Cuda(dev.clone())) {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(
                    "the fused elementwise kernels failed their check on this GPU and are \
                     not used (candle's ops instead): {e}"
                );
                Ok(false)
            }
        }
    });
    trusted
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

/// A device tensor and its layout, as a custom op receives them.
type Arg<'a> = (&'a CudaStorage, &'a Layout);

/// `(rows, inter)`: the op's, checked there.
pub(super) fn swiglu(
    s: &CudaStorage,
    l: &Layout,
    (rows, inter): (usize, usize),
) -> Result<(CudaStorage, Shape)> {
    let dev = s.device.clone();
    if rows == 0 {
        candle_core::bail!("swiglu: no rows");
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
    let cfg = grid(blocks, 256);
    // SAFETY: the arguments are the kernel's (pointers, two u64), the buffers of the sizes
    // it reads and writes.
    unsafe { launch.launch(cfg) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev),
        Shape::from((rows as usize, inter as usize)),
    ))
}

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
    let cfg = grid(blocks, 256);
    // SAFETY: as the kernel's signature; the shapes were checked by `QkNormRope::dims`.
    unsafe { launch.launch(cfg) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev),
        Shape::from((op.rows, op.heads, hd)),
    ))
}

pub(super) fn add_rms_norm(
    (x, x_l): Arg<'_>,
    (h, h_l): Arg<'_>,
    (w, w_l): Arg<'_>,
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
    let cfg = grid(rows as u32, threads);
    // SAFETY: as the kernel's signature; `out` holds 2 · rows · hidden values.
    unsafe { launch.launch(cfg) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev),
        Shape::from((2, rows, hidden)),
    ))
}
