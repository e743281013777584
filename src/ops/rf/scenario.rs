//! The synthetic dataset's configuration: every parameter of the model with its default.
//! The model itself is documented in docs/RF_DATASETS.md; `validate` names the first bad
//! field by its place in the scenario (`ops::Invalid`).

use crate::ops::invalid::{check, FieldPath, Invalid};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    pub geometry: Geometry,
    pub propagation: Propagation,
    pub signal: Signal,
    pub receiver: Receiver,
    pub quality: Quality,
    /// Feature chunk length, ms. At most `signal.duration_ms`, and at least 128 samples at
    /// `signal.sample_rate_hz`.
    #[cfg_attr(feature = "openapi", schema(minimum = 1.0, maximum = 60000.0))]
    pub chunk_ms: f64,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            geometry: Geometry::default(),
            propagation: Propagation::default(),
            signal: Signal::default(),
            receiver: Receiver::default(),
            quality: Quality::default(),
            chunk_ms: 200.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Site {
    #[cfg_attr(feature = "openapi", schema(minimum = -85.0, maximum = 85.0))]
    pub lat: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = -180.0, maximum = 180.0))]
    pub lon: f64,
    #[serde(default = "default_rx_alt")]
    #[cfg_attr(feature = "openapi", schema(minimum = -500.0, maximum = 10000.0))]
    pub alt_m: f64,
}

fn default_rx_alt() -> f64 {
    10.0
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Geometry {
    /// Fixed receiver sites; when empty, `receivers_min..=receivers_max` receivers are
    /// placed uniformly in the area per sample.
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub receivers: Vec<Site>,
    /// At least 1 when `receivers` is empty.
    pub receivers_min: usize,
    /// At least `receivers_min` and at most 64 when `receivers` is empty.
    pub receivers_max: usize,
    #[cfg_attr(feature = "openapi", schema(minimum = -85.0, maximum = 85.0))]
    pub lat_min: f64,
    /// At least `lat_min`.
    #[cfg_attr(feature = "openapi", schema(minimum = -85.0, maximum = 85.0))]
    pub lat_max: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = -180.0, maximum = 180.0))]
    pub lon_min: f64,
    /// At least `lon_min`.
    #[cfg_attr(feature = "openapi", schema(minimum = -180.0, maximum = 180.0))]
    pub lon_max: f64,
    /// Height of random receivers, m.
    #[cfg_attr(feature = "openapi", schema(minimum = -500.0, maximum = 10000.0))]
    pub receiver_alt_m: f64,
    /// Share of transmitters inside the receivers' bounding box; the rest fall in the box
    /// widened by `outside_margin_deg` on every side.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 1.0))]
    pub inside_ratio: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 5.0))]
    pub outside_margin_deg: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = -500.0, maximum = 10000.0))]
    pub transmitter_alt_m: f64,
}

impl Default for Geometry {
    fn default() -> Self {
        Self {
            receivers: Vec::new(),
            receivers_min: 7,
            receivers_max: 7,
            lat_min: 47.30,
            lat_max: 47.50,
            lon_min: 8.40,
            lon_max: 8.70,
            receiver_alt_m: 10.0,
            inside_ratio: 0.7,
            outside_margin_deg: 0.5,
            transmitter_alt_m: 2.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Environment {
    Open,
    Rural,
    Suburban,
    Urban,
}

impl Environment {
    /// Path-loss exponent beyond 100 m (free space is 2).
    pub fn exponent(self) -> f64 {
        match self {
            Environment::Open => 2.0,
            Environment::Rural => 2.5,
            Environment::Suburban => 3.0,
            Environment::Urban => 3.5,
        }
    }

    /// Mean excess delay of the multipath taps, µs.
    pub fn mean_delay_us(self) -> f64 {
        match self {
            Environment::Open => 0.1,
            Environment::Rural => 0.5,
            Environment::Suburban => 1.0,
            Environment::Urban => 3.0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Propagation {
    #[cfg_attr(feature = "openapi", schema(minimum = 1.0, maximum = 100000.0))]
    pub frequency_mhz: f64,
    pub environment: Environment,
    /// Terrain-style obstruction: U(0, max) dB, scaled by min(1, d / 10 km).
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 100.0))]
    pub terrain_loss_max_db: f64,
    /// Log-normal shadowing standard deviation, dB.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 30.0))]
    pub shadowing_std_db: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = -50.0, maximum = 90.0))]
    pub tx_power_dbm: f64,
    /// Per-sample transmit power fluctuation (normal), dB.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 20.0))]
    pub tx_power_std_db: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = -30.0, maximum = 50.0))]
    pub tx_antenna_gain_dbi: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = -30.0, maximum = 50.0))]
    pub rx_antenna_gain_dbi: f64,
    /// Rician K-factor at the transmitter, dB, falling by `k_factor_slope_db_per_km`; at
    /// or beyond `rayleigh_beyond_km` the fading is Rayleigh.
    #[cfg_attr(feature = "openapi", schema(minimum = -30.0, maximum = 40.0))]
    pub k_factor_db: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 100.0))]
    pub k_factor_slope_db_per_km: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 10000.0))]
    pub rayleigh_beyond_km: f64,
    /// Block fading: one complex gain per block of this length, ms.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.01, maximum = 1000000.0))]
    pub coherence_time_ms: f64,
    /// Extra multipath taps per receiver: 0..=max, exponential delays with the
    /// environment's mean, exponentially decaying power (`tap_decay_db_per_us`).
    #[cfg_attr(feature = "openapi", schema(maximum = 16))]
    pub max_extra_taps: usize,
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 100.0))]
    pub tap_decay_db_per_us: f64,
}

impl Default for Propagation {
    fn default() -> Self {
        Self {
            frequency_mhz: 433.92,
            environment: Environment::Suburban,
            terrain_loss_max_db: 10.0,
            shadowing_std_db: 6.0,
            tx_power_dbm: 30.0,
            tx_power_std_db: 1.0,
            tx_antenna_gain_dbi: 2.15,
            rx_antenna_gain_dbi: 0.0,
            k_factor_db: 10.0,
            k_factor_slope_db_per_km: 1.0,
            rayleigh_beyond_km: 15.0,
            coherence_time_ms: 50.0,
            max_extra_taps: 3,
            tap_decay_db_per_us: 3.0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Signal {
    #[cfg_attr(feature = "openapi", schema(minimum = 8000.0, maximum = 50000000.0))]
    pub sample_rate_hz: f64,
    /// At most 20 million samples (`sample_rate_hz` × duration) per recording.
    #[cfg_attr(feature = "openapi", schema(minimum = 1.0, maximum = 60000.0))]
    pub duration_ms: f64,
    /// Occupied bandwidth of the FM modes; the deviation is bandwidth/2 − 3 kHz (Carson).
    /// At most `sample_rate_hz` / 2.
    #[cfg_attr(feature = "openapi", schema(minimum = 6500.0, maximum = 25000000.0))]
    pub bandwidth_hz: f64,
    /// Relative weights of the modulations; not all zero.
    pub mix: ModulationMix,
    /// AM modulation depth.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 1.0))]
    pub am_depth: f64,
}

impl Default for Signal {
    fn default() -> Self {
        Self {
            sample_rate_hz: 200_000.0,
            duration_ms: 1000.0,
            bandwidth_hz: 12_500.0,
            mix: ModulationMix::default(),
            am_depth: 0.8,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ModulationMix {
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub fm_voice: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub fm_tone: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub fm_dtmf: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub am: f64,
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub carrier: f64,
}

impl Default for ModulationMix {
    fn default() -> Self {
        Self {
            fm_voice: 0.4,
            fm_tone: 0.15,
            fm_dtmf: 0.15,
            am: 0.15,
            carrier: 0.15,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Receiver {
    /// Noise figure, dB: the floor is −174 dBm/Hz + NF over the sample rate.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 30.0))]
    pub noise_figure_db: f64,
    /// Oscillator offset standard deviation, ppm of the carrier.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 100.0))]
    pub oscillator_ppm_std: f64,
    /// Oscillator drift standard deviation, ppm per second.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 10.0))]
    pub drift_ppm_per_s_std: f64,
}

impl Default for Receiver {
    fn default() -> Self {
        Self {
            noise_figure_db: 6.0,
            oscillator_ppm_std: 1.0,
            drift_ppm_per_s_std: 0.05,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Quality {
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub min_receivers: usize,
    #[cfg_attr(feature = "openapi", schema(minimum = -50.0, maximum = 100.0))]
    pub min_snr_db: f64,
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub max_gdop: f64,
}

impl Default for Quality {
    fn default() -> Self {
        Self {
            min_receivers: 3,
            min_snr_db: 3.0,
            max_gdop: 10.0,
        }
    }
}

fn finite_in(v: f64, lo: f64, hi: f64, path: FieldPath) -> Result<(), Invalid> {
    check(
        v.is_finite() && (lo..=hi).contains(&v),
        path,
        &format!("must be between {lo} and {hi}"),
    )
}

/// Most receivers per sample.
pub const MAX_RECEIVERS: usize = 64;
/// Most complex samples per receiver recording.
pub const MAX_SAMPLES_PER_RECORDING: f64 = 20e6;

impl Scenario {
    /// Receiver slots of a sample: the fixed list's length or the most a sample may draw.
    pub fn receiver_slots(&self) -> usize {
        if self.geometry.receivers.is_empty() {
            self.geometry.receivers_max
        } else {
            self.geometry.receivers.len()
        }
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        let g = &self.geometry;
        let p = FieldPath::root().field("geometry");
        if g.receivers.is_empty() {
            check(
                g.receivers_min >= 1,
                p.field("receivers_min"),
                "must be at least 1",
            )?;
            check(
                g.receivers_max >= g.receivers_min && g.receivers_max <= MAX_RECEIVERS,
                p.field("receivers_max"),
                &format!("must be between receivers_min and {MAX_RECEIVERS}"),
            )?;
        } else {
            check(
                g.receivers.len() <= MAX_RECEIVERS,
                p.field("receivers"),
                &format!("at most {MAX_RECEIVERS} receivers"),
            )?;
            for (i, s) in g.receivers.iter().enumerate() {
                finite_in(
                    s.lat,
                    -85.0,
                    85.0,
                    p.field("receivers").index(i).field("lat"),
                )?;
                finite_in(
                    s.lon,
                    -180.0,
                    180.0,
                    p.field("receivers").index(i).field("lon"),
                )?;
                finite_in(
                    s.alt_m,
                    -500.0,
                    10_000.0,
                    p.field("receivers").index(i).field("alt_m"),
                )?;
            }
        }
        finite_in(g.lat_min, -85.0, 85.0, p.field("lat_min"))?;
        finite_in(g.lat_max, g.lat_min, 85.0, p.field("lat_max"))?;
        finite_in(g.lon_min, -180.0, 180.0, p.field("lon_min"))?;
        finite_in(g.lon_max, g.lon_min, 180.0, p.field("lon_max"))?;
        finite_in(
            g.receiver_alt_m,
            -500.0,
            10_000.0,
            p.field("receiver_alt_m"),
        )?;
        finite_in(g.inside_ratio, 0.0, 1.0, p.field("inside_ratio"))?;
        finite_in(
            g.outside_margin_deg,
            0.0,
            5.0,
            p.field("outside_margin_deg"),
        )?;
        finite_in(
            g.transmitter_alt_m,
            -500.0,
            10_000.0,
            p.field("transmitter_alt_m"),
        )?;

        let r = &self.propagation;
        let p = FieldPath::root().field("propagation");
        finite_in(r.frequency_mhz, 1.0, 100_000.0, p.field("frequency_mhz"))?;
        finite_in(
            r.terrain_loss_max_db,
            0.0,
            100.0,
            p.field("terrain_loss_max_db"),
        )?;
        finite_in(r.shadowing_std_db, 0.0, 30.0, p.field("shadowing_std_db"))?;
        finite_in(r.tx_power_dbm, -50.0, 90.0, p.field("tx_power_dbm"))?;
        finite_in(r.tx_power_std_db, 0.0, 20.0, p.field("tx_power_std_db"))?;
        finite_in(
            r.tx_antenna_gain_dbi,
            -30.0,
            50.0,
            p.field("tx_antenna_gain_dbi"),
        )?;
        finite_in(
            r.rx_antenna_gain_dbi,
            -30.0,
            50.0,
            p.field("rx_antenna_gain_dbi"),
        )?;
        finite_in(r.k_factor_db, -30.0, 40.0, p.field("k_factor_db"))?;
        finite_in(
            r.k_factor_slope_db_per_km,
            0.0,
            100.0,
            p.field("k_factor_slope_db_per_km"),
        )?;
        finite_in(
            r.rayleigh_beyond_km,
            0.0,
            10_000.0,
            p.field("rayleigh_beyond_km"),
        )?;
        finite_in(r.coherence_time_ms, 0.01, 1e6, p.field("coherence_time_ms"))?;
        check(
            r.max_extra_taps <= 16,
            p.field("max_extra_taps"),
            "at most 16",
        )?;
        finite_in(
            r.tap_decay_db_per_us,
            0.0,
            100.0,
            p.field("tap_decay_db_per_us"),
        )?;

        let s = &self.signal;
        let p = FieldPath::root().field("signal");
        finite_in(s.sample_rate_hz, 8_000.0, 50e6, p.field("sample_rate_hz"))?;
        finite_in(s.duration_ms, 1.0, 60_000.0, p.field("duration_ms"))?;
        check(
            s.sample_rate_hz * s.duration_ms / 1e3 <= MAX_SAMPLES_PER_RECORDING,
            p.field("duration_ms"),
            "sample_rate_hz × duration gives more than 20 million samples per recording",
        )?;
        finite_in(
            s.bandwidth_hz,
            6_500.0,
            s.sample_rate_hz / 2.0,
            p.field("bandwidth_hz"),
        )?;
        finite_in(s.am_depth, 0.0, 1.0, p.field("am_depth"))?;
        let m = &s.mix;
        let weights = [m.fm_voice, m.fm_tone, m.fm_dtmf, m.am, m.carrier];
        check(
            weights.iter().all(|w| w.is_finite() && *w >= 0.0) && weights.iter().sum::<f64>() > 0.0,
            p.field("mix"),
            "weights must be non-negative and not all zero",
        )?;

        let x = &self.receiver;
        let p = FieldPath::root().field("receiver");
        finite_in(x.noise_figure_db, 0.0, 30.0, p.field("noise_figure_db"))?;
        finite_in(
            x.oscillator_ppm_std,
            0.0,
            100.0,
            p.field("oscillator_ppm_std"),
        )?;
        finite_in(
            x.drift_ppm_per_s_std,
            0.0,
            10.0,
            p.field("drift_ppm_per_s_std"),
        )?;

        let q = &self.quality;
        let p = FieldPath::root().field("quality");
        check(
            q.min_receivers >= 1,
            p.field("min_receivers"),
            "must be at least 1",
        )?;
        finite_in(q.min_snr_db, -50.0, 100.0, p.field("min_snr_db"))?;
        check(
            q.max_gdop > 0.0 && !q.max_gdop.is_nan(),
            p.field("max_gdop"),
            "must be positive",
        )?;
        finite_in(
            self.chunk_ms,
            1.0,
            self.signal.duration_ms,
            FieldPath::root().field("chunk_ms"),
        )?;
        check(
            self.signal.sample_rate_hz * self.chunk_ms / 1e3
                >= super::features::MIN_CHUNK_SAMPLES as f64,
            FieldPath::root().field("chunk_ms"),
            "a chunk needs at least 128 samples at this sample rate",
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_fields_are_named() {
        Scenario::default().validate().unwrap();
        let mut s = Scenario::default();
        s.propagation.frequency_mhz = f64::NAN;
        assert_eq!(
            s.validate().unwrap_err().path,
            FieldPath::root()
                .field("propagation")
                .field("frequency_mhz")
        );
        let mut s = Scenario::default();
        s.geometry.receivers = vec![Site {
            lat: 47.0,
            lon: 200.0,
            alt_m: 0.0,
        }];
        assert_eq!(
            s.validate().unwrap_err().path,
            FieldPath::root()
                .field("geometry")
                .field("receivers")
                .index(0)
                .field("lon")
        );
        let mut s = Scenario::default();
        s.signal.mix = ModulationMix {
            fm_voice: 0.0,
            fm_tone: 0.0,
            fm_dtmf: 0.0,
            am: 0.0,
            carrier: 0.0,
        };
        assert_eq!(
            s.validate().unwrap_err().path,
            FieldPath::root().field("signal").field("mix")
        );
        let json: Scenario =
            serde_json::from_str(r#"{"propagation": {"environment": "urban"}}"#).unwrap();
        assert_eq!(json.propagation.environment, Environment::Urban);
        assert_eq!(json.propagation.frequency_mhz, 433.92);
        assert!(serde_json::from_str::<Scenario>(r#"{"bogus": 1}"#).is_err());
    }
}
