//! An FP8 projection on a GPU: the input's rows quantized (`cuda/fp8.cu`), the product of the
//! codes by cuBLASLt's FP8 GEMM into bf16, the output scaled by its token's and channel's
//! scales (`cuda/fp8.cu` again). A weight's rows are quantized at load by the same kernel, on
//! the GPU: a 4B model's weights never travel to the host and back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::cudarc::cublaslt::{result as lt, sys};
use candle_core::cuda_backend::cudarc::driver::{
    sys::CUdevice_attribute, CudaFunction, CudaSlice, CudaView, DevicePtr, DevicePtrMut,
    LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaDevice, CudaStorage, WrapErr};
use candle_core::{CpuStorage, Layout, Result, Shape};
use half::bf16;

use crate::device::per_device::PerDevice;

/// sm_80 and sm_90 cubins and compute_80 PTX of `cuda/fp8.cu`.
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fp8.fatbin"));

/// cuBLASLt's workspace for the FP8 GEMM: NVIDIA's recommendation on Hopper.
const WORKSPACE: usize = 32 << 20;

/// `dev`'s compute capability.
pub(crate) fn capability(dev: &CudaDevice) -> Result<(u32, u32)> {
    let ctx = dev.cuda_stream().context().clone();
    let major = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .w()?;
    let minor = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        .w()?;
    Ok((major as u32, minor as u32))
}

/// What a device keeps for its FP8 projections: the kernels, a cuBLASLt handle and workspace,
/// and the algorithm cuBLASLt's heuristic chose for each recent `(t, n, k)`: a forward asks
/// for the same four shapes once per layer, and the heuristic is the slow part of a call.
struct Fp8Device {
    quantize: CudaFunction,
    scale: CudaFunction,
    handle: LtHandle,
    workspace: CudaSlice<u8>,
    algos: Mutex<HashMap<(usize, usize, usize), sys::cublasLtMatmulAlgo_t>>,
}

/// Shapes whose algorithm is kept: a forward's four projections, many times over; cleared when
/// full (a run's token counts vary batch to batch, so the map would otherwise grow for a week).
const KEPT_ALGOS: usize = 64;

/// A cuBLASLt handle, destroyed with its device's entry (never: entries live for the process).
struct LtHandle(sys::cublasLtHandle_t);

// SAFETY: cuBLASLt handles may be used from any thread, one call at a time per stream; each
// worker computes on its own device's stream.
unsafe impl Send for LtHandle {}
unsafe impl Sync for LtHandle {}

fn on(dev: &CudaDevice) -> Result<Arc<Fp8Device>> {
    static KEPT: PerDevice<Arc<Fp8Device>> = PerDevice::new();
    KEPT.get_or_make(dev, || {
        let module = dev
            .cuda_stream()
            .context()
            .load_module(Ptx::from_binary(FATBIN.to_vec()))
            .w()?;
        let handle = lt::create_handle()
            .map_err(|e| candle_core::Error::Msg(format!("cuBLASLt handle: {e:?}")))?;
        Ok(Arc::new(Fp8Device {
            quantize: module.load_function("ef_fp8_quantize_rows_bf16").w()?,
            scale: module.load_function("ef_fp8_scale_bf16").w()?,
            handle: LtHandle(handle),
            workspace: dev.alloc_zeros::<u8>(WORKSPACE)?,
            algos: Mutex::default(),
        }))
    })
}

/// The rows of a contiguous bf16 `[rows, cols]` view quantized: their codes and scales.
fn quantize_rows(
    dev: &CudaDevice,
    kept: &Fp8Device,
    values: &CudaView<'_, bf16>,
    (rows, cols): (usize, usize),
) -> Result<(CudaSlice<u8>, CudaSlice<f32>)> {
    // SAFETY: the kernel writes every code and every scale.
    let codes = unsafe { dev.alloc::<u8>(rows * cols)? };
    let scales = unsafe { dev.alloc::<f32>(rows)? };
    if rows == 0 {
        return Ok((codes, scales));
    }
    let cols = cols as u64;
    let stream = dev.cuda_stream();
    let mut launch = stream.launch_builder(&kept.quantize);
    launch.arg(values).arg(&codes).arg(&scales).arg(&cols);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel's arguments, buffers of rows·cols and rows values; a block a row.
    unsafe { launch.launch(cfg) }.w()?;
    Ok((codes, scales))
}

/// Which output of a weight's quantization [`QuantizeRows`] gives.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RowPart {
    Codes,
    Scales,
}

/// A bf16 weight `[N, K]` quantized by rows on its GPU: its E4M3 codes `[N, K]` (u8) or its
/// scales `[N]` (f32). A custom op gives one tensor, so a weight takes two calls (at load only;
/// the kernel is cheap beside the upload it replaces).
pub(crate) struct QuantizeRows(pub RowPart);

impl candle_core::CustomOp1 for QuantizeRows {
    fn name(&self) -> &'static str {
        "fp8-quantize-rows"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("the GPU's row quantization ran on the CPU. This is a bug.")
    }

    fn cuda_fwd(&self, w: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = w.device.clone();
        let (rows, cols) = l.shape().dims2()?;
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("the row quantization takes a contiguous weight");
        };
        let values = w.as_cuda_slice::<bf16>()?.slice(start..end);
        let kept = on(&dev)?;
        let (codes, scales) = quantize_rows(&dev, &kept, &values, (rows, cols))?;
        Ok(match self.0 {
            RowPart::Codes => (
                CudaStorage::wrap_cuda_slice(codes, dev),
                Shape::from((rows, cols)),
            ),
            RowPart::Scales => (CudaStorage::wrap_cuda_slice(scales, dev), Shape::from(rows)),
        })
    }
}

/// `x · Wᵀ` for a bf16 input `[T, K]`, E4M3 weight codes `[N, K]` and their f32 scales `[N]`.
pub(crate) struct Fp8Matmul;

impl candle_core::CustomOp3 for Fp8Matmul {
    fn name(&self) -> &'static str {
        "fp8-projection"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("the FP8 projection's GPU op ran on the CPU. This is a bug.")
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        x_l: &Layout,
        codes: &CudaStorage,
        codes_l: &Layout,
        scales: &CudaStorage,
        scales_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = x.device.clone();
        let (t, k) = x_l.shape().dims2()?;
        let (n, k_w) = codes_l.shape().dims2()?;
        if k != k_w || scales_l.shape().dims1()? != n {
            candle_core::bail!("fp8 projection: input [{t}, {k}], weight [{n}, {k_w}]");
        }
        let range = |l: &Layout| match l.contiguous_offsets() {
            Some(r) => Ok(r),
            None => candle_core::bail!("the FP8 projection takes contiguous tensors"),
        };
        let (x0, x1) = range(x_l)?;
        let (c0, c1) = range(codes_l)?;
        let (s0, s1) = range(scales_l)?;
        let xs = x.as_cuda_slice::<bf16>()?.slice(x0..x1);
        let ws = codes.as_cuda_slice::<u8>()?.slice(c0..c1);
        let wscale = scales.as_cuda_slice::<f32>()?.slice(s0..s1);
        let kept = on(&dev)?;
        let stream = dev.cuda_stream();

        // 1. The input's rows as codes and scales.
        let (x_codes, x_scales) = quantize_rows(&dev, &kept, &xs, (t, k))?;

        // 2. Column-major, [N, T] = Wq(op T) · Xq: cuBLASLt's "TN" layout, the one FP8 takes.
        // SAFETY: every element of `out` is written by the GEMM.
        let mut out = unsafe { dev.alloc::<bf16>(t * n)? };
        gemm(&kept, &stream, (t, n, k), &ws, &x_codes, &mut out)?;

        // 3. Each value times its token's and its channel's scale.
        let (rows, ncols) = (t as u64, n as u64);
        let blocks = ((t * n) as u64).div_ceil(256).min(1 << 16) as u32;
        let mut launch = stream.launch_builder(&kept.scale);
        launch
            .arg(&out)
            .arg(&x_scales)
            .arg(&wscale)
            .arg(&rows)
            .arg(&ncols);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `out` holds t·n values, the scales t and n.
        unsafe { launch.launch(cfg) }.w()?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((t, n))))
    }
}

/// Destroys a cuBLASLt descriptor when dropped.
struct Desc<T: Copy>(T, unsafe fn(T) -> std::result::Result<(), lt::CublasError>);

impl<T: Copy> Drop for Desc<T> {
    fn drop(&mut self) {
        // SAFETY: made by the matching create call, destroyed once.
        let _ = unsafe { (self.1)(self.0) };
    }
}

fn lt_err(what: &str) -> impl Fn(lt::CublasError) -> candle_core::Error + '_ {
    move |e| candle_core::Error::Msg(format!("cuBLASLt FP8 GEMM, {what}: {e:?}"))
}

/// The algorithm for `shape` (`(t, n, k)`): the one kept, else `ask`'s (cuBLASLt's heuristic),
/// kept from now on.
fn kept_algo(
    kept: &Fp8Device,
    shape: (usize, usize, usize),
    ask: impl FnOnce() -> Result<sys::cublasLtMatmulAlgo_t>,
) -> Result<sys::cublasLtMatmulAlgo_t> {
    let mut algos = kept.algos.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(algo) = algos.get(&shape) {
        return Ok(*algo);
    }
    let algo = ask()?;
    if algos.len() >= KEPT_ALGOS {
        algos.clear();
    }
    algos.insert(shape, algo);
    Ok(algo)
}

/// `out [T, N] (bf16, row-major) = Xq [T, K] · Wqᵀ`, the E4M3 codes' product, unscaled.
fn gemm(
    kept: &Fp8Device,
    stream: &Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    (t, n, k): (usize, usize, usize),
    w: &impl DevicePtr<u8>,
    x: &impl DevicePtr<u8>,
    out: &mut CudaSlice<bf16>,
) -> Result<()> {
    use sys::cublasLtMatmulDescAttributes_t as D;
    use sys::cudaDataType_t as Ty;
    let layout = |ty, rows: usize, cols: usize, ld: usize| {
        lt::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64)
            .map(|l| Desc(l, lt::destroy_matrix_layout))
            .map_err(lt_err("layout"))
    };
    let a = layout(Ty::CUDA_R_8F_E4M3, k, n, k)?;
    let b = layout(Ty::CUDA_R_8F_E4M3, k, t, k)?;
    let d = layout(Ty::CUDA_R_16BF, n, t, n)?;
    let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, Ty::CUDA_R_32F)
        .map(|m| Desc(m, lt::destroy_matmul_desc))
        .map_err(lt_err("descriptor"))?;
    let transpose: i32 = 1; // CUBLAS_OP_T
    let fast_accum: i8 = crate::ab_switch::AbSwitch::Fp8FastAccum.on() as i8;
    // SAFETY: a live descriptor; each value the attribute's type (int32_t, int8_t).
    unsafe {
        lt::set_matmul_desc_attribute(
            desc.0,
            D::CUBLASLT_MATMUL_DESC_TRANSA,
            (&transpose as *const i32).cast(),
            size_of::<i32>(),
        )
        .map_err(lt_err("transpose"))?;
        lt::set_matmul_desc_attribute(
            desc.0,
            D::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
            (&fast_accum as *const i8).cast(),
            size_of::<i8>(),
        )
        .map_err(lt_err("fast accumulation"))?;
    }
    let pref = lt::create_matmul_pref()
        .map(|p| Desc(p, lt::destroy_matmul_pref))
        .map_err(lt_err("preference"))?;
    let size = WORKSPACE as u64;
    // SAFETY: a live preference; the attribute is a uint64_t.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref.0,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&size as *const u64).cast(),
            size_of::<u64>(),
        )
        .map_err(lt_err("workspace preference"))?;
    }
    let handle = kept.handle.0;
    let algo = kept_algo(kept, (t, n, k), || {
        // SAFETY: live descriptors of the shapes below.
        let heuristic = unsafe {
            lt::get_matmul_algo_heuristic(handle, desc.0, a.0, b.0, d.0, d.0, pref.0).map_err(
                lt_err(&format!("no algorithm for [{t}, {k}] · [{n}, {k}]ᵀ")),
            )?
        };
        Ok(heuristic.algo)
    })?;
    let (alpha, beta) = (1f32, 0f32);
    let (wp, _w) = w.device_ptr(stream);
    let (xp, _x) = x.device_ptr(stream);
    let (op, _o) = out.device_ptr_mut(stream);
    let (wsp, _ws) = kept.workspace.device_ptr(stream);
    // SAFETY: W holds n·k codes, X t·k, out t·n bf16 values, the workspace WORKSPACE bytes, all
    // on `stream`, which the call is queued on; C is D (β = 0, never read).
    unsafe {
        lt::matmul(
            handle,
            desc.0,
            (&alpha as *const f32).cast(),
            (&beta as *const f32).cast(),
            wp as *const _,
            a.0,
            xp as *const _,
            b.0,
            op as *const _,
            d.0,
            op as *mut _,
            d.0,
            &algo,
            wsp as *mut _,
            WORKSPACE,
            stream.cu_stream() as *mut _,
        )
        .map_err(lt_err("matmul"))
    }
}

/// One FP8 projection on `device` against [`super::fp8_product`] on the CPU: 48 tokens (not a
/// multiple of 16, as a packed batch's are not), 80 channels, 256 columns, bf16 inputs. The
/// GPU rounds its GEMM's output and the scaled value to bf16: each value within 1 % of the
/// CPU's, or 10⁻⁴ of the largest.
pub(crate) fn self_check(device: &candle_core::Device) -> Result<()> {
    use candle_core::{DType, Tensor};
    let (t, n, k) = (48, 80, 256);
    let as_bf16 =
        |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| bf16::from_f32(x).to_f32()).collect() };
    let x = as_bf16(super::pseudo_random(t * k, 11));
    let mut w = as_bf16(super::pseudo_random(n * k, 12));
    // One channel a hundred times the others: the per-channel scale must carry it.
    for v in &mut w[..k] {
        *v *= 100.0;
    }
    let want = super::fp8_product(&x, &w, (t, n, k));
    // The ops a projection runs (`Projection::to_fp8`'s and its forward's), called here
    // directly: this module is below `projection.rs`.
    let weight = Tensor::from_vec(w, (n, k), device)?.to_dtype(DType::BF16)?;
    let codes = weight.apply_op1_no_bwd(&QuantizeRows(RowPart::Codes))?;
    let scales = weight.apply_op1_no_bwd(&QuantizeRows(RowPart::Scales))?;
    let input = Tensor::from_vec(x, (t, k), device)?.to_dtype(DType::BF16)?;
    let got = input
        .apply_op3_no_bwd(&codes, &scales, &Fp8Matmul)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let largest = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        // Written so that a NaN (a kernel writing garbage) is never close.
        let close = (g - w).abs() <= 0.01 * w.abs() + 1e-4 * largest;
        if !close {
            candle_core::bail!(
                "value {i} of a [{t}, {k}] · [{n}, {k}]ᵀ product is {g}, the CPU's {w}"
            );
        }
    }
    Ok(())
}
