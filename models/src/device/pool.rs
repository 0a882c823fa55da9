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

#[cfg(feature = "cuda")]
mod cuda {
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
        // SAFETY: the three attributes read here are cuuint64_t.
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
pub use cuda::{idle_bytes, keep_freed_memory, trim};
