//! AMD devices' gauges from ROCm SMI (`librocm_smi64`), the same gauges NVML feeds for
//! NVIDIA devices: busy fraction, memory used and installed, temperature, power. Loaded
//! at run time like the HIP runtime; where it is absent the gauges are absent (logged,
//! not an error). ROCm SMI numbers devices its own way, so each of ours is matched by PCI
//! address (HIP's bus id against SMI's BDF id).

use super::{open_first, Loaded, Search};
use crate::metrics::Metrics;
use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

const NAMES: &[&str] = &[
    "librocm_smi64.so",
    "librocm_smi64.so.7",
    "librocm_smi64.so.6",
    "librocm_smi64.so.5",
    "librocm_smi64.so.1",
];

/// `RSMI_MEM_TYPE_VRAM`, `RSMI_TEMP_TYPE_EDGE`, `RSMI_TEMP_CURRENT`.
const VRAM: c_int = 0;
const EDGE: u32 = 0;
const CURRENT: u32 = 0;

/// ROCm SMI's functions the sampler calls (each returns `rsmi_status_t`, 0 for success).
#[derive(Clone, Copy)]
struct Smi {
    devices: unsafe extern "C" fn(*mut u32) -> c_int,
    pci_id: unsafe extern "C" fn(u32, *mut u64) -> c_int,
    busy_percent: unsafe extern "C" fn(u32, *mut u32) -> c_int,
    memory_used: unsafe extern "C" fn(u32, c_int, *mut u64) -> c_int,
    memory_total: unsafe extern "C" fn(u32, c_int, *mut u64) -> c_int,
    temperature: unsafe extern "C" fn(u32, u32, u32, *mut i64) -> c_int,
    power: unsafe extern "C" fn(u32, u32, *mut u64) -> c_int,
}

/// One of our AMD devices, as the gauges label it.
#[derive(Clone, Debug)]
pub struct Watched {
    pub ordinal: usize,
    pub uuid: String,
    /// HIP's PCI bus id, `domain:bus:device.function` in hex (`0000:03:00.0`).
    pub pci_bus_id: String,
}

/// SMI's BDF id of a HIP PCI bus id: domain << 32 | bus << 8 | device << 3 | function.
pub(crate) fn bdf_id(pci_bus_id: &str) -> Option<u64> {
    let (domain, rest) = pci_bus_id.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    Some(
        (hex(domain)? << 32)
            | ((hex(bus)? & 0xff) << 8)
            | ((hex(device)? & 0x1f) << 3)
            | (hex(function)? & 0x7),
    )
}

impl Smi {
    fn load(lib: &Loaded) -> Result<(Smi, unsafe extern "C" fn(u64) -> c_int), String> {
        fn get<T: Copy>(lib: &Loaded, name: &str) -> Result<T, String> {
            // SAFETY: `T` is the C signature rocm_smi.h declares for `name`.
            unsafe { lib.library.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|_| format!("ROCm SMI at {} lacks {name}", lib.path))
        }
        let smi = Smi {
            devices: get(lib, "rsmi_num_monitor_devices")?,
            pci_id: get(lib, "rsmi_dev_pci_id_get")?,
            busy_percent: get(lib, "rsmi_dev_busy_percent_get")?,
            memory_used: get(lib, "rsmi_dev_memory_usage_get")?,
            memory_total: get(lib, "rsmi_dev_memory_total_get")?,
            temperature: get(lib, "rsmi_dev_temp_metric_get")?,
            power: get(lib, "rsmi_dev_power_ave_get")?,
        };
        Ok((smi, get(lib, "rsmi_init")?))
    }

    /// SMI's index of each of `watched`, by PCI address.
    fn indices(&self, watched: &[Watched]) -> Vec<(u32, Watched)> {
        let mut n = 0;
        // SAFETY: rocm_smi.h's signatures; out-pointers are valid.
        if unsafe { (self.devices)(&mut n) } != 0 {
            return Vec::new();
        }
        let ids: Vec<(u32, u64)> = (0..n)
            .filter_map(|i| {
                let mut id = 0;
                // SAFETY: as above.
                (unsafe { (self.pci_id)(i, &mut id) } == 0).then_some((i, id))
            })
            .collect();
        watched
            .iter()
            .filter_map(|w| {
                let want = bdf_id(&w.pci_bus_id)?;
                let (i, _) = ids.iter().find(|(_, id)| *id == want)?;
                Some((*i, w.clone()))
            })
            .collect()
    }

    /// One reading of every matched device into the gauges; a reading the device does
    /// not give is left as it was.
    fn sample(&self, matched: &[(u32, Watched)], m: &Metrics) {
        for (i, w) in matched {
            let gpu = w.ordinal.to_string();
            let labels = [gpu.as_str(), w.uuid.as_str()];
            let (mut busy, mut used, mut total, mut milli_c, mut micro_w) =
                (0u32, 0u64, 0u64, 0i64, 0u64);
            // SAFETY: rocm_smi.h's signatures; out-pointers are valid.
            unsafe {
                if (self.busy_percent)(*i, &mut busy) == 0 {
                    m.gpu_utilization
                        .with_label_values(&labels)
                        .set(f64::from(busy) / 100.0);
                }
                if (self.memory_used)(*i, VRAM, &mut used) == 0 {
                    m.gpu_memory_used
                        .with_label_values(&labels)
                        .set(used as f64);
                }
                if (self.memory_total)(*i, VRAM, &mut total) == 0 {
                    m.gpu_memory_total
                        .with_label_values(&labels)
                        .set(total as f64);
                }
                if (self.temperature)(*i, EDGE, CURRENT, &mut milli_c) == 0 {
                    m.gpu_temperature
                        .with_label_values(&labels)
                        .set(milli_c as f64 / 1000.0);
                }
                if (self.power)(*i, 0, &mut micro_w) == 0 {
                    m.gpu_power
                        .with_label_values(&labels)
                        .set(micro_w as f64 / 1e6);
                }
            }
        }
    }
}

/// Starts sampling `watched` every `interval` if ROCm SMI loads and knows them; why not
/// otherwise.
pub fn spawn_sampler(
    metrics: Arc<Metrics>,
    interval: Duration,
    watched: Vec<Watched>,
) -> Result<(), String> {
    let search = Search {
        dirs: super::search_dirs(),
        loader_path: true,
    };
    let loaded = open_first(NAMES, &search).map_err(|e| format!("no ROCm SMI ({e})"))?;
    let matched = start(&loaded, &watched)?;
    let smi = Smi::load(&loaded)?.0;
    std::thread::Builder::new()
        .name("gpu-ops-rocm-smi".into())
        .spawn(move || {
            // The library stays loaded while the thread samples through it.
            let _loaded = loaded;
            loop {
                smi.sample(&matched, &metrics);
                std::thread::sleep(interval);
            }
        })
        .map_err(|e| format!("cannot start the ROCm SMI thread: {e}"))?;
    Ok(())
}

/// Initialises ROCm SMI in `loaded` and matches `watched` to its devices.
fn start(loaded: &Loaded, watched: &[Watched]) -> Result<Vec<(u32, Watched)>, String> {
    let (smi, init) = Smi::load(loaded)?;
    // SAFETY: rocm_smi.h's signature; 0 is the default flags.
    let rc = unsafe { init(0) };
    if rc != 0 {
        return Err(format!("rsmi_init returned {rc}"));
    }
    let matched = smi.indices(watched);
    if matched.is_empty() {
        return Err("ROCm SMI knows none of the AMD devices in use (by PCI address)".into());
    }
    Ok(matched)
}

#[cfg(test)]
pub(super) fn sample_once(
    loaded: &Loaded,
    watched: &[Watched],
    metrics: &Metrics,
) -> Result<usize, String> {
    let matched = start(loaded, watched)?;
    Smi::load(loaded)?.0.sample(&matched, metrics);
    Ok(matched.len())
}
