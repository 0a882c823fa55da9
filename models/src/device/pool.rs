//! The GPU's stream-ordered memory pool, kept warm between forwards.
//!
//! candle allocates through cudarc's `cuMemAllocAsync`, from the device's default pool, whose
//! release threshold is 0 by CUDA's default: at every synchronization (each forward ends with
//! one, copying its vectors to the host) the pool hands every freed byte back to the driver,
//! and the next forward maps its gigabytes of activations again (others measured 20 ms a GB;
//! PyTorch's caching allocator never does this). The threshold is raised to keep them, once per
//! device. Memory the pool holds and no tensor uses is counted as free where we plan by free
//! memory, and an out-of-memory trims the pool before the smaller retry.
//!
//! `EF_POOL_RELEASE=1` keeps CUDA's default (an A/B switch for the GPU check).
//!
//! The pool also keeps a high-water mark of the memory its allocations use, which a benchmark
//! reads for its peak ([`watch_peak`]) instead of polling the driver from a second thread
//! while the forwards run (`EF_MEMORY_SAMPLER=1` polls, as before).

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::driver::{sys, CudaContext};

    fn default_pool(ctx: &CudaContext) -> Option<sys::CUmemoryPool> {
        let mut pool = std::ptr::null_mut();
        ctx.bind_to_thread().ok()?;
        // SAFETY: writes the device's default pool handle into `pool`.
        let rc = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
        (rc == sys::CUresult::CUDA_SUCCESS && !pool.is_null()).then_some(pool)
    }

    fn attribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Option<u64> {
        let mut value: u64 = 0;
        // SAFETY: the attributes read here are cuuint64_t.
        let rc =
            unsafe { sys::cuMemPoolGetAttribute(pool, attr, &mut value as *mut u64 as *mut _) };
        (rc == sys::CUresult::CUDA_SUCCESS).then_some(value)
    }

    /// Raises the release threshold of the device's default pool to keep freed memory (unless
    /// `EF_POOL_RELEASE=1`); returns whether it did.
    pub fn keep_freed_memory(ctx: &CudaContext) -> bool {
        if crate::ab_switch::AbSwitch::PoolRelease.on() {
            return false;
        }
        let Some(pool) = default_pool(ctx) else {
            return false;
        };
        let mut keep = u64::MAX;
        // SAFETY: the release threshold is a cuuint64_t.
        let rc = unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut keep as *mut u64 as *mut _,
            )
        };
        rc == sys::CUresult::CUDA_SUCCESS
    }

    /// Bytes the pool holds that no allocation uses: free for our next forward, though the
    /// driver counts them as used.
    pub fn idle_bytes(ctx: &CudaContext) -> u64 {
        let Some(pool) = default_pool(ctx) else {
            return 0;
        };
        use sys::CUmemPool_attribute::*;
        match (
            attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        ) {
            (Some(reserved), Some(used)) => reserved.saturating_sub(used),
            _ => 0,
        }
    }

    /// Starts watching the peak of the device memory in use, as `total − free − idle pool
    /// bytes` counts it (other processes and our context included), from the pool's
    /// high-water mark: what is in use outside the pool now, plus the most the pool's
    /// allocations use from here on. The returned call reads it. `None` where the driver
    /// gives no mark, or under `EF_MEMORY_SAMPLER=1`.
    pub fn watch_peak(ctx: &Arc<CudaContext>) -> Option<impl FnOnce() -> Option<u64>> {
        use sys::CUmemPool_attribute::*;
        if crate::ab_switch::AbSwitch::MemorySampler.on() {
            return None;
        }
        let pool = default_pool(ctx)?;
        let (free, total) = ctx.mem_get_info().ok()?;
        let reserved = attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        let outside = (total as u64)
            .saturating_sub(free as u64)
            .saturating_sub(reserved);
        let mut zero: u64 = 0;
        // SAFETY: the high-water mark is a cuuint64_t; 0 resets it to the use now.
        let rc = unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                &mut zero as *mut u64 as *mut _,
            )
        };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return None;
        }
        let ctx = ctx.clone();
        Some(move || {
            let pool = default_pool(&ctx)?;
            attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH).map(|high| outside + high)
        })
    }

    /// Waits for the device, then gives every idle byte of the pool back to the driver.
    pub fn trim(ctx: &CudaContext) {
        if ctx.synchronize().is_err() {
            return;
        }
        if let Some(pool) = default_pool(ctx) {
            // SAFETY: trims a valid pool; nothing in use is released.
            unsafe { sys::cuMemPoolTrimTo(pool, 0) };
        }
    }
}

#[cfg(feature = "cuda")]
pub use cuda::{idle_bytes, keep_freed_memory, trim, watch_peak};
