//! A value per CUDA device, kept for the process (cuda builds only).

/// A value per CUDA device (candle's `DeviceId`: one per opened device), made at the device's
/// first call and kept for the process: a library handle, loaded kernels, a check's verdict.
/// `make` runs with the table held, so a device's value is made once.
pub(crate) struct PerDevice<T>(
    std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<candle_core::cuda_backend::DeviceId, T>>,
    >,
);

impl<T: Clone> PerDevice<T> {
    pub(crate) const fn new() -> PerDevice<T> {
        PerDevice(std::sync::OnceLock::new())
    }

    /// `dev`'s value, made by `make` the first time (an error is returned, not kept).
    pub(crate) fn get_or_make<E>(
        &self,
        dev: &candle_core::cuda_backend::CudaDevice,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let mut table = self
            .0
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(value) = table.get(&dev.id()) {
            return Ok(value.clone());
        }
        let value = make()?;
        table.insert(dev.id(), value.clone());
        Ok(value)
    }
}
