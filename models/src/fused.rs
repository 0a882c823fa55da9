//! cuDNN's fused attention on CUDA: one call per layer over the whole packed mini-batch.
//!
//! The kernel is cuDNN's scaled-dot-product attention (FlashAttention-class on Ampere and
//! Hopper) for ragged, packed sequences, reached through a small C++ shim over the header-only
//! cuDNN frontend (`models/cuda/cudnn_sdpa.cpp`, built by `build.rs` with the `cuda` feature).
//! The shim loads libcudnn at run time, so one architecture-independent binary serves A100s and
//! H200s, and a node without cuDNN gets a clear error at start-up, not a loader failure.
//!
//! Inputs stay in the token-major `[T, heads, head_dim]` layout of the projections; cuDNN
//! reads each sequence at its ragged offset, grouped-query, with the softmax scale passed in,
//! within the sequence under the layer's mask: causal for a decoder, the whole sequence or a
//! window around each token for an encoder (bounds of a band, [`MaskBounds`]; the mask is part
//! of a plan's key). Plans are built per shape and cached by the shim; to keep the
//! shapes few, a batch's sequence count is padded to a power of two with empty sequences and
//! its longest length rounded up to a power of two of at least 1,024 (the plan's bound, not
//! work done: see [`crate::attention_plan`]). The packed q, k, v and output buffers have a
//! zeroed tail up to a multiple of 64 tokens, so that no tile reads past an allocation; the
//! model makes q and k in such buffers (`AttnContext::rows`), so only v is copied into one.
//!
//! `crate::attention_check` compares the kernel with the blockwise path on the device at
//! start-up; the embedder refuses to run when they disagree. This module takes its per-batch
//! arguments ([`FusedBatch`]) directly, so it needs nothing of `crate::attention`.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, WrapErr};
use candle_core::{Device, Layout, Result, Shape, Storage, Tensor};
use half::bf16;

use crate::attention_plan::{padded_tokens, MaskBounds, PlanShape, ShimFailure};
use crate::cpu::attention::Mask;
use crate::packed::SeqSpan;

mod ffi {
    use std::ffi::{c_char, c_void};

    #[repr(C)]
    pub struct EfSdpa {
        _private: [u8; 0],
    }

    extern "C" {
        pub fn ef_sdpa_create(err: *mut c_char, err_len: usize) -> *mut EfSdpa;
        pub fn ef_sdpa_destroy(s: *mut EfSdpa);
        pub fn ef_sdpa_cudnn_version(s: *const EfSdpa) -> i64;
        pub fn ef_sdpa_prepare(
            s: *mut EfSdpa,
            batch: i32,
            max_seq_len: i32,
            total_tokens: i32,
            n_heads: i32,
            n_kv_heads: i32,
            head_dim: i32,
            scale: f32,
            left_bound: i32,
            right_bound: i32,
            workspace_bytes: *mut i64,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        pub fn ef_sdpa_plan_impl(
            s: *mut EfSdpa,
            batch: i32,
            max_seq_len: i32,
            n_heads: i32,
            n_kv_heads: i32,
            head_dim: i32,
            scale: f32,
            left_bound: i32,
            right_bound: i32,
        ) -> *const c_char;
        pub fn ef_sdpa_run(
            s: *mut EfSdpa,
            stream: *mut c_void,
            batch: i32,
            max_seq_len: i32,
            total_tokens: i32,
            n_heads: i32,
            n_kv_heads: i32,
            head_dim: i32,
            scale: f32,
            left_bound: i32,
            right_bound: i32,
            q: *const c_void,
            k: *const c_void,
            v: *const c_void,
            o: *mut c_void,
            seq_len: *const i32,
            q_offsets: *const i32,
            kv_offsets: *const i32,
            workspace: *mut c_void,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
    }
}

/// Room for the shim's error messages.
const ERR_LEN: usize = 1024;

fn message(buf: &[c_char]) -> String {
    // SAFETY: the shim writes a NUL-terminated string into the buffer (zeroed before the call,
    // so it is terminated even when the shim writes nothing).
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// The shim's handle (a cuDNN handle and its plan cache) and the device workspace.
struct Handle {
    raw: *mut ffi::EfSdpa,
    workspace: Option<CudaSlice<u8>>,
}

// SAFETY: the handle is only used under the `Mutex` of its `FusedAttention`, from the one
// worker thread that owns the device.
unsafe impl Send for Handle {}

/// A forward's shape as the shim takes it: sequences, longest sequence, tokens, query heads,
/// key/value heads, head dimension.
type ShimShape = (i32, i32, i32, i32, i32, i32);

impl Handle {
    /// Builds (or finds in the shim's cache) the plan of `shape` under `bounds`; returns the
    /// workspace bytes a run of it needs.
    fn plan(&mut self, shape: ShimShape, scale: f32, bounds: MaskBounds) -> Result<usize> {
        let mut err = [0 as c_char; ERR_LEN];
        let mut workspace_bytes = 0i64;
        // SAFETY: the handle is live and ours (the caller holds its lock); the buffer is
        // ERR_LEN long.
        let rc = unsafe {
            ffi::ef_sdpa_prepare(
                self.raw,
                shape.0,
                shape.1,
                shape.2,
                shape.3,
                shape.4,
                shape.5,
                scale,
                bounds.left,
                bounds.right,
                &mut workspace_bytes,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        if rc != 0 {
            return Err(shim_error(message(&err)));
        }
        Ok(workspace_bytes.max(0) as usize)
    }

    /// Grows the device workspace to at least `need` bytes.
    fn reserve_workspace(&mut self, dev: &CudaDevice, need: usize) -> Result<()> {
        if need > 0 && self.workspace.as_ref().is_none_or(|w| w.len() < need) {
            self.workspace = None; // free the old one first
                                   // SAFETY: workspace contents are the kernel's scratch.
            self.workspace = Some(unsafe { dev.alloc::<u8>(need)? });
        }
        Ok(())
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ef_sdpa_create` and is destroyed once.
        unsafe { ffi::ef_sdpa_destroy(self.raw) }
    }
}

/// The fused kernel for one model on one device.
pub struct FusedAttention {
    handle: Mutex<Handle>,
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
    cudnn_version: i64,
}

impl std::fmt::Debug for FusedAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FusedAttention(cuDNN {})", self.cudnn_version)
    }
}

/// The shim's error as a candle error: an allocation failure is the typed out-of-memory the
/// embed job's fallback acts on (with the shim's message as context), anything else its text.
fn shim_error(message: String) -> candle_core::Error {
    match ShimFailure::classify(&message) {
        ShimFailure::OutOfMemory(message) => crate::error::cuda_out_of_memory_error()
            .context(format!("cuDNN fused attention: {message}")),
        ShimFailure::Other(message) => {
            candle_core::Error::Msg(format!("cuDNN fused attention: {message}"))
        }
    }
}

/// The fused kernel's arguments for one packed batch, on the device: every layer of a
/// forward shares them.
pub struct FusedBatch {
    /// Sequences, padded to a power of two with empty ones.
    batch: usize,
    /// The longest sequence, rounded up to a power of two of at least the plan floor.
    max_seq: usize,
    /// Real tokens.
    total: usize,
    /// Tokens the packed buffers hold: `total` and a zeroed tail.
    padded: usize,
    seq_len: Tensor,
    q_offsets: Tensor,
    kv_offsets: Tensor,
}

impl FusedBatch {
    /// Tokens the packed buffers hold: the batch's tokens and a zeroed tail (a multiple of 64).
    pub fn padded_rows(&self) -> usize {
        self.padded
    }
}

impl FusedAttention {
    /// Loads cuDNN and creates the kernel's handle on the current device. The error says what
    /// is missing (libcudnn, a version too old).
    pub fn new(n_heads: usize, n_kv: usize, head_dim: usize) -> std::result::Result<Self, String> {
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: the buffer is ERR_LEN long; a NULL return means failure, with a message.
        let raw = unsafe { ffi::ef_sdpa_create(err.as_mut_ptr(), ERR_LEN) };
        if raw.is_null() {
            return Err(message(&err));
        }
        // SAFETY: `raw` is a live handle.
        let cudnn_version = unsafe { ffi::ef_sdpa_cudnn_version(raw) };
        Ok(FusedAttention {
            handle: Mutex::new(Handle {
                raw,
                workspace: None,
            }),
            n_heads,
            n_kv,
            head_dim,
            cudnn_version,
        })
    }

    /// Query heads, key/value heads and head dimension it was made for.
    pub fn heads(&self) -> (usize, usize, usize) {
        (self.n_heads, self.n_kv, self.head_dim)
    }

    /// The cuDNN version loaded (e.g. 91300).
    pub fn cudnn_version(&self) -> i64 {
        self.cudnn_version
    }

    /// The device arguments of a batch of `spans`.
    pub fn batch(&self, spans: &[SeqSpan], device: &Device) -> Result<FusedBatch> {
        let lens: Vec<usize> = spans.iter().map(|s| s.len).collect();
        let PlanShape { batch, max_seq } = PlanShape::of(&lens);
        let total: usize = lens.iter().sum();
        let mut seq_len: Vec<i32> = spans.iter().map(|s| s.len as i32).collect();
        seq_len.resize(batch, 0);
        let starts = spans
            .iter()
            .map(|s| s.start)
            .chain(std::iter::repeat(total))
            .take(batch + 1);
        let (qw, kvw) = (self.n_heads * self.head_dim, self.n_kv * self.head_dim);
        let (q_offsets, kv_offsets): (Vec<i32>, Vec<i32>) =
            starts.map(|t| ((t * qw) as i32, (t * kvw) as i32)).unzip();
        Ok(FusedBatch {
            batch,
            max_seq,
            total,
            padded: padded_tokens(total),
            seq_len: Tensor::new(seq_len.as_slice(), device)?,
            q_offsets: Tensor::new(q_offsets.as_slice(), device)?,
            kv_offsets: Tensor::new(kv_offsets.as_slice(), device)?,
        })
    }

    /// Attention of every sequence of `batch` to itself under `mask`, as
    /// `crate::attention::AttentionKernel::attention` describes it.
    pub fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        batch: &FusedBatch,
        scale: f64,
        mask: Mask,
    ) -> Result<Tensor> {
        // Buffers of `padded` rows with a zeroed tail. The model makes q and k in them already
        // (`AttnContext::rows`): taken as they are. v (a view of the projections) and a
        // caller's unpadded tensors take one copy each, as `contiguous` would make.
        let pad = |t: &Tensor| -> Result<Tensor> {
            let rows = t.dim(0)?;
            if rows == batch.padded {
                t.contiguous()
            } else if rows == batch.total {
                t.pad_with_zeros(0, 0, batch.padded - rows)
            } else {
                candle_core::bail!(
                    "fused attention: {rows} rows for {} tokens padded to {}. This is a bug.",
                    batch.total,
                    batch.padded
                )
            }
        };
        let (q, k, v) = (pad(q)?, pad(k)?, pad(v)?);
        let op = SdpaOp {
            attention: self,
            batch,
            scale: scale as f32,
            bounds: MaskBounds::of(mask),
        };
        let out = q.apply_op3_no_bwd(&k, &v, &op)?;
        out.narrow(0, 0, batch.total)?
            .reshape((batch.total, self.n_heads * self.head_dim))
    }

    /// Builds the plan of each shape mini-batches of these sequence lengths take
    /// ([`crate::attention_plan::planned_shapes`]), under each of `masks`, now (a warm-up's
    /// work: 0.1–2 s a plan), so that no timed forward builds one. Returns the seconds it took.
    pub fn prepare(&self, batches: &[Vec<usize>], scale: f32, masks: &[Mask]) -> Result<f64> {
        let started = std::time::Instant::now();
        let shapes = crate::attention_plan::planned_shapes(batches.iter().map(Vec::as_slice));
        let mut handle = self
            .handle
            .lock()
            .expect("fused attention lock. This is a bug.");
        let keys = shapes
            .iter()
            .flat_map(|shape| masks.iter().map(move |&mask| (shape, MaskBounds::of(mask))));
        for (shape, bounds) in keys {
            // The plan's key leaves the token count out: the bound's own shape, cut to what
            // int32 offsets address.
            let total = shape.plan_tokens(self.n_heads * self.head_dim) as i32;
            let workspace_bytes = handle.plan(
                (
                    shape.batch as i32,
                    shape.max_seq as i32,
                    total,
                    self.n_heads as i32,
                    self.n_kv as i32,
                    self.head_dim as i32,
                ),
                scale,
                bounds,
            )?;
            // SAFETY: the handle is live and ours; the shim returns a static string or NULL.
            let implementation = unsafe {
                let name = ffi::ef_sdpa_plan_impl(
                    handle.raw,
                    shape.batch as i32,
                    shape.max_seq as i32,
                    self.n_heads as i32,
                    self.n_kv as i32,
                    self.head_dim as i32,
                    scale,
                    bounds.left,
                    bounds.right,
                );
                if name.is_null() {
                    "?".to_string()
                } else {
                    CStr::from_ptr(name).to_string_lossy().into_owned()
                }
            };
            tracing::info!(
                batch = shape.batch,
                max_seq = shape.max_seq,
                left_bound = bounds.left,
                right_bound = bounds.right,
                implementation,
                workspace_bytes,
                "fused attention plan ready"
            );
        }
        Ok(started.elapsed().as_secs_f64())
    }
}

/// The kernel as a candle op over q, k and v, so its output is an ordinary tensor.
struct SdpaOp<'a> {
    attention: &'a FusedAttention,
    batch: &'a FusedBatch,
    scale: f32,
    bounds: MaskBounds,
}

/// A contiguous part of a device buffer.
struct View<'a, T> {
    slice: &'a CudaSlice<T>,
    start: usize,
    end: usize,
}

fn view<'a, T: candle_core::cuda_backend::CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
) -> Result<View<'a, T>> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("fused attention takes contiguous tensors");
    };
    Ok(View {
        slice: storage.as_cuda_slice::<T>()?,
        start,
        end,
    })
}

/// The i32 device buffer of one of a batch's argument tensors.
fn int_buffer(storage: &Storage) -> Result<&CudaSlice<i32>> {
    match storage {
        Storage::Cuda(c) => c.as_cuda_slice::<i32>(),
        _ => candle_core::bail!("fused attention arguments must be on the device"),
    }
}

impl candle_core::CustomOp3 for SdpaOp<'_> {
    fn name(&self) -> &'static str {
        "cudnn-fused-attention"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("the fused attention kernel runs on CUDA only")
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        q_l: &Layout,
        k: &CudaStorage,
        k_l: &Layout,
        v: &CudaStorage,
        v_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let a = self.attention;
        let b = self.batch;
        let dev: CudaDevice = q.device.clone();
        let stream = dev.cuda_stream();
        let (q, k, v) = (
            view::<bf16>(q, q_l)?,
            view::<bf16>(k, k_l)?,
            view::<bf16>(v, v_l)?,
        );
        let out_len = b.padded * a.n_heads * a.head_dim;
        if q.end - q.start != out_len {
            candle_core::bail!(
                "fused attention: q holds {} values, the batch's padded buffers {out_len}",
                q.end - q.start
            );
        }
        let mut out = output_buffer(&dev, out_len, b.total * a.n_heads * a.head_dim)?;
        let (seq_len, _) = b.seq_len.storage_and_layout();
        let (q_off, _) = b.q_offsets.storage_and_layout();
        let (kv_off, _) = b.kv_offsets.storage_and_layout();
        let mut handle = a
            .handle
            .lock()
            .expect("fused attention lock. This is a bug.");
        let shape: ShimShape = (
            b.batch as i32,
            b.max_seq as i32,
            b.total as i32,
            a.n_heads as i32,
            a.n_kv as i32,
            a.head_dim as i32,
        );
        let need = handle.plan(shape, self.scale, self.bounds)?;
        handle.reserve_workspace(&dev, need)?;
        let mut err = [0 as c_char; ERR_LEN];
        let raw = handle.raw;
        // The guards record the kernel's use of each buffer on the stream when they drop.
        let (qp, g1) = q.slice.device_ptr(&stream);
        let (kp, g2) = k.slice.device_ptr(&stream);
        let (vp, g3) = v.slice.device_ptr(&stream);
        // Written by the kernel: its use recorded as a write.
        let (op, g4) = out.device_ptr_mut(&stream);
        let (lp, g5) = int_buffer(&seq_len)?.device_ptr(&stream);
        let (qo, g6) = int_buffer(&q_off)?.device_ptr(&stream);
        let (ko, g7) = int_buffer(&kv_off)?.device_ptr(&stream);
        let el = std::mem::size_of::<bf16>() as u64;
        let wp = match &handle.workspace {
            Some(w) if need > 0 => w.device_ptr(&stream).0 as *mut c_void,
            _ => std::ptr::null_mut(),
        };
        // SAFETY: pointers are live device buffers of the sizes the shape implies, on `stream`;
        // the offsets of the views are added in bytes.
        let rc = unsafe {
            ffi::ef_sdpa_run(
                raw,
                stream.cu_stream() as *mut c_void,
                shape.0,
                shape.1,
                shape.2,
                shape.3,
                shape.4,
                shape.5,
                self.scale,
                self.bounds.left,
                self.bounds.right,
                (qp + q.start as u64 * el) as *const c_void,
                (kp + k.start as u64 * el) as *const c_void,
                (vp + v.start as u64 * el) as *const c_void,
                op as *mut c_void,
                (lp + 4 * start_of(&b.seq_len)) as *const i32,
                (qo + 4 * start_of(&b.q_offsets)) as *const i32,
                (ko + 4 * start_of(&b.kv_offsets)) as *const i32,
                wp,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        if rc != 0 {
            return Err(shim_error(message(&err)));
        }
        drop((g1, g2, g3, g4, g5, g6, g7));
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((b.padded, a.n_heads, a.head_dim)),
        ))
    }
}

/// The attention's output buffer of `out_len` values, of which the kernel writes the first
/// `written` (every real token's rows): only the tail past them (under 64 rows) is zeroed, not
/// the whole buffer (268 MB a layer at 32,768 tokens of the 4B model).
fn output_buffer(dev: &CudaDevice, out_len: usize, written: usize) -> Result<CudaSlice<bf16>> {
    // EF_FUSED_ZERO_ALL=1 (an A/B switch for the GPU check) zeroes the whole buffer.
    if crate::ab_switch::AbSwitch::FusedZeroAll.on() {
        return dev.alloc_zeros::<bf16>(out_len);
    }
    // SAFETY: rows [0, written) are written by the kernel before anything reads them; the rest
    // is zeroed here, on the device's stream, which the kernel runs on after it.
    let mut out = unsafe { dev.alloc::<bf16>(out_len)? };
    if written < out_len {
        dev.cuda_stream()
            .memset_zeros(&mut out.slice_mut(written..))
            .w()?;
    }
    Ok(out)
}

/// The element offset of a tensor's first value in its storage.
fn start_of(t: &Tensor) -> u64 {
    t.layout().start_offset() as u64
}
