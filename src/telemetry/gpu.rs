//! GPU figures through NVML (nvml-wrapper loads libnvidia-ml at run time).
//!
//! Owns: the NVML handle of the sampler thread. Without a driver, a library or a device, the GPU
//! is absent (`None`), never an error: most machines that run prepfs's tests have none. Must
//! never be called on a request path (an NVML query can take milliseconds).

use nvml_wrapper::Nvml;

use crate::control::observation::GpuObservation;

/// NVML, if this machine has it.
pub struct Gpu {
    nvml: Option<Nvml>,
}

impl Gpu {
    /// Loads NVML; logs once at debug level when there is none.
    pub fn probe() -> Gpu {
        let nvml = Nvml::init()
            .inspect_err(|e| tracing::debug!(error = %e, "no NVML; telemetry reports no GPU"))
            .ok()
            .filter(|n| n.device_count().is_ok_and(|c| c > 0));
        Gpu { nvml }
    }

    /// Utilisation and free memory of device 0, or `None` without a GPU (or when a query fails).
    pub fn sample(&self) -> Option<GpuObservation> {
        let device = self.nvml.as_ref()?.device_by_index(0).ok()?;
        let busy = f64::from(device.utilization_rates().ok()?.gpu) / 100.0;
        let memory = device.memory_info().ok()?;
        let memory_free = if memory.total > 0 {
            memory.free as f64 / memory.total as f64
        } else {
            0.0
        };
        Some(GpuObservation { busy, memory_free })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_a_gpu_reports_none_without_failing() {
        let gpu = Gpu::probe();
        let sample = gpu.sample();
        if gpu.nvml.is_none() {
            assert_eq!(sample, None);
        } else if let Some(s) = sample {
            assert!((0.0..=1.0).contains(&s.busy) && (0.0..=1.0).contains(&s.memory_free));
        }
    }
}
