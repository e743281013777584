//! `POST /beams/sweep`'s request read into its job: generated channels from a model or
//! uploaded ones with their arrays, the codebooks, the noise, each refusal by its path.

use super::*;

/// The sweep's job, the generated channels' seed and the noise's.
pub(super) fn sweep_job(
    req: SweepRequest,
    max: usize,
) -> Result<(SweepJob, Option<u64>, Option<u64>), Problem> {
    let root = FieldPath::root();
    let (channels, tx, rx, first, seed) = match (req.model, req.channels) {
        (Some(ObjectOnly(model)), None) => {
            if req.tx_array.is_some() || req.rx_array.is_some() {
                let at = if req.tx_array.is_some() {
                    "/tx_array"
                } else {
                    "/rx_array"
                };
                return Err(Problem::at(
                    ErrorCode::InvalidParameter,
                    at,
                    "the model states the arrays; tx_array and rx_array go with uploaded channels",
                ));
            }
            let (spec, seed) = model.spec(&root.field("model"), max)?;
            // `spec` validated it: draw the paths, as ChannelsJob would.
            let drawn = spec.draw();
            let words = spec.path_words(&drawn);
            let (tx, rx, first) = (spec.tx, spec.rx, spec.first);
            let generated = Channels::Generated { spec, drawn, words };
            (generated, tx, rx, first, Some(seed))
        }
        (None, Some(channels)) => {
            let (tx, rx) = (req.tx_array.map(|a| a.0), req.rx_array.map(|a| a.0));
            let (channels, tx, rx) = uploaded(channels, tx, rx, max)?;
            (channels, tx, rx, 0, None)
        }
        _ => {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/model",
                "give exactly one of model (generated channels) or channels (uploaded)",
            ))
        }
    };
    let tx_book = req
        .tx_codebook
        .0
        .build(tx, root.field("tx_codebook"), max)?;
    let rx_book = req
        .rx_codebook
        .0
        .build(rx, root.field("rx_codebook"), max)?;
    let count = match &channels {
        Channels::Generated { spec, .. } => spec.count,
        Channels::Uploaded(h) => h.len() / (2 * tx.elements() * rx.elements()),
    };
    let powers = (count as u64).saturating_mul((tx_book.beams * rx_book.beams) as u64);
    if powers > max as u64 {
        let at = match &channels {
            Channels::Generated { .. } => "/model/batch",
            Channels::Uploaded(_) => "/channels",
        };
        return Err(too_large(
            at,
            "beam-pair powers (held even without the grid)",
            powers,
            max,
        ));
    }
    if req.noise_seed.is_some() && req.snr_db.is_none() {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/noise_seed",
            "a noise seed without snr_db: give snr_db for noise, or no seed",
        ));
    }
    let noise_seed = match req.snr_db {
        None => None,
        Some(_) => Some(seed_or_drawn(req.noise_seed, "/noise_seed")?),
    };
    let noise = req
        .snr_db
        .zip(noise_seed)
        .map(|(snr_db, seed)| MeasurementNoise { snr_db, seed });
    let output = Dtype::from(req.out_dtype);
    let job = SweepJob::new(
        channels,
        first,
        tx,
        rx,
        tx_book,
        rx_book,
        noise,
        req.return_grid,
        output,
    )?;
    Ok((job, seed, noise_seed))
}

/// Decodes the uploaded channels and their arrays.
fn uploaded(
    channels: DenseIn,
    tx: Option<ArrayGeometry>,
    rx: Option<ArrayGeometry>,
    max: usize,
) -> Result<(Channels, Array, Array), Problem> {
    let t = channels.decode("/channels", 4..=4, max)?;
    let [_, nr, nt, two] = t.shape[..] else {
        unreachable!("rank 4 checked")
    };
    if two != 2 {
        return Err(Problem::at(
            ErrorCode::InvalidTensor,
            "/channels",
            format!("shape {:?}: the last dimension holds (re, im)", t.shape),
        ));
    }
    let root = FieldPath::root();
    let geometry = |g: Option<ArrayGeometry>, n: usize, name: &'static str| {
        // Without the geometry, a linear array of the channels' size: refused at them.
        let at = root.field(if g.is_some() { name } else { "channels" });
        let a = g
            .unwrap_or(ArrayGeometry {
                rows: 1,
                columns: n,
            })
            .array(at)?;
        if a.elements() != n {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                format!("/{name}"),
                format!("{} elements, but the channels have {n}", a.elements()),
            ));
        }
        Ok(a)
    };
    let tx = geometry(tx, nt, "tx_array")?;
    let rx = geometry(rx, nr, "rx_array")?;
    Ok((Channels::Uploaded(t.values.into_f64()), tx, rx))
}
