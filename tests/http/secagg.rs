//! Secure aggregation over a real socket: rounds of in-process reference clients
//! (`gpu_ops::secagg_client`) with dropouts at every stage and an exact sum, a restart
//! mid-round, two replicas sharing a round through PostgreSQL, the uniformity of a real
//! masked upload, a server that holds fewer than t shares and cannot unmask, and each
//! refusal with its code and the path of the bad field.

use crate::common;

use base64::Engine;
use common::{problem, TestServer};
use gpu_ops::ops::mpc::secagg::masks::apply_masks;
use gpu_ops::ops::mpc::secagg::protocol::{
    fr_bytes, mask_public, random_fr, self_mask_commitment, share_secret, Fr, ShareMessage,
};
use gpu_ops::secagg_client::{participate, Connection, Coordinator, DropBefore, Outcome};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use x25519_dalek::{PublicKey, StaticSecret};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn conn(url: &str) -> Connection {
    let mut c = Connection::new(url);
    c.poll = Duration::from_millis(20);
    c.stage_timeout = Duration::from_secs(60);
    c
}

/// Deterministic test vectors. The first 24 values are the hard cases of the
/// quantisation, each with the same sign for every client so that no rounding error of
/// one client cancels another's: ties (k + ½)·2^−f for each f the rounds here use
/// (10, 12, 16), with k even and odd, where round-half-to-even, round-half-up and
/// round-half-toward-zero each differ from half away from zero; the clip exactly; the
/// next f32 past a clip of 1; and values past a clip of 1 and 2, up to 10^6 (whose
/// unclamped fixed point overflows 32 bits). Then values in ±1.2 (some past a clip of 1).
fn values(client: usize, len: usize) -> Vec<f32> {
    let mut v = Vec::new();
    let k = 2 * client as u32 + 2;
    for f in [10, 12, 16] {
        for odd in [0, 1] {
            let tie = (f64::from(k + odd) + 0.5) / f64::from(1u32 << f);
            v.extend([tie as f32, -tie as f32]);
        }
    }
    let past_one = f32::from_bits(1f32.to_bits() + 1);
    v.extend([1.0, -1.0, 2.0, -2.0, past_one, -past_one]);
    v.extend([1.5, -1.5, 2.5, -2.5, 1e6, -1e6]);
    assert!(len >= v.len(), "vectors hold the {} hard cases", v.len());
    v.extend(
        (v.len()..len).map(|i| (((client * 7919 + i * 104_729) % 2401) as f32 / 1000.0) - 1.2),
    );
    v
}

/// The test's own quantisation, from docs/SECAGG.md: q = round_half_away_from_zero(
/// clamp(x, −clip, clip) · 2^f) as a two's-complement 32-bit ring element. Written apart
/// from the code's: the clamped value (x, exact in f64, or the clip) is taken apart into
/// its integer significand m and exponent e, and m · 2^(e+f) is rounded with integer
/// shifts: ⌊(|m| + 2^(s−1)) / 2^s⌋ with the sign put back, s = −(e + f).
fn ring_quantise(x: f32, clip: f64, f: u32) -> u32 {
    let x = f64::from(x);
    // Comparisons of f64 values are exact, and so is f32 → f64.
    let c = if x > clip {
        clip
    } else if x < -clip {
        -clip
    } else {
        x
    };
    let bits = c.to_bits();
    let negative = bits >> 63 == 1;
    let field = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1u64 << 52) - 1);
    let (m, e) = if field == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1u64 << 52), field - 1075)
    };
    let e = e + f as i32;
    let magnitude: u64 = if e >= 0 {
        m << e
    } else if -e > 60 {
        0 // m < 2^53 ≤ 2^(s−1): below one half
    } else {
        let s = -e as u32;
        (m + (1u64 << (s - 1))) >> s
    };
    let q = if negative {
        -(magnitude as i64)
    } else {
        magnitude as i64
    };
    // Two's complement mod 2^32.
    q.rem_euclid(1i64 << 32) as u32
}

#[test]
fn the_tests_quantisation_rounds_half_away_from_zero_and_clamps() {
    let cases: [(f32, f64, u32, i32); 14] = [
        (0.5, 1.0, 0, 1),
        (-0.5, 1.0, 0, -1),
        (2.5 / 1024.0, 1.0, 10, 3),
        (-2.5 / 1024.0, 1.0, 10, -3),
        (3.5 / 65536.0, 1.0, 16, 4),
        (-3.5 / 65536.0, 1.0, 16, -4),
        (0.49999997, 1.0, 0, 0),
        (1.2, 1.0, 16, 65536),
        (-1e6, 1.0, 16, -65536),
        (-1e6, 2.0, 10, -2048),
        (1e-40, 1.0, 24, 0),
        // clip · 2^f itself a tie: round(0.75 · 2) = 2, round(−1.5) = −2.
        (5.0, 0.75, 1, 2),
        (-5.0, 0.75, 1, -2),
        (0.1, 1.0, 16, 6554), // 0.1f32 · 2^16 = 6553.6000…
    ];
    for (x, clip, f, want) in cases {
        assert_eq!(
            ring_quantise(x, clip, f) as i32,
            want,
            "x {x} clip {clip} f {f}"
        );
    }
}

/// The exact sum the round must answer: the clients' quantised values summed on the ring
/// Z/2^32, each read as a signed 32-bit integer and divided by 2^f.
fn expected_sum(inputs: &[Vec<f32>], clip: f64, f: u32) -> Vec<f64> {
    let len = inputs[0].len();
    (0..len)
        .map(|i| {
            let ring = inputs.iter().fold(0u32, |acc, v| {
                acc.wrapping_add(ring_quantise(v[i], clip, f))
            });
            f64::from(ring as i32) / f64::from(1u32 << f)
        })
        .collect()
}

/// Checks `got` against `expected_sum`, naming the first value that differs and its
/// inputs; returns the expected sum.
fn assert_exact_sum(got: &[f64], inputs: &[Vec<f32>], clip: f64, f: u32) -> Vec<f64> {
    let want = expected_sum(inputs, clip, f);
    assert_eq!(got.len(), want.len(), "the sum's length");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let xs: Vec<f32> = inputs.iter().map(|v| v[i]).collect();
        assert_eq!(
            g, w,
            "the unmasked sum is exact: value {i}, inputs {xs:?}, clip {clip}, f {f}"
        );
    }
    want
}

/// Runs one client per entry of `plan` (its drop point, or none) against the servers in
/// turn; returns each client's outcome in plan order.
fn spawn_clients(
    urls: &[String],
    round: &str,
    inputs: &[Vec<f32>],
    plan: &[Option<DropBefore>],
) -> Vec<tokio::task::JoinHandle<Outcome>> {
    plan.iter()
        .enumerate()
        .map(|(i, &drop)| {
            let c = conn(&urls[i % urls.len()]);
            let (round, v) = (round.to_string(), inputs[i].clone());
            tokio::spawn(async move {
                participate(&c, &round, &v, drop)
                    .await
                    .expect("client runs")
            })
        })
        .collect()
}

fn client_id(o: &Outcome) -> u32 {
    match o {
        Outcome::Done { client_id }
        | Outcome::Dropped { client_id }
        | Outcome::LeftBehind { client_id, .. } => *client_id,
    }
}

/// Polls the round until `pred` holds.
async fn until(c: &Coordinator, pred: impl Fn(&gpu_ops::secagg_client::RoundState) -> bool) {
    for _ in 0..3000 {
        if pred(&c.state().await.unwrap()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "the round never reached the awaited state: {:?}",
        c.state().await.unwrap()
    );
}

fn count(
    s: &gpu_ops::secagg_client::RoundState,
    f: impl Fn(&gpu_ops::secagg_client::PublicClient) -> bool,
) -> usize {
    s.clients.iter().filter(|c| f(c)).count()
}

async fn check_result(
    c: &Coordinator,
    inputs: &[Vec<f32>],
    survivors: &[usize],
    outcomes: &[Outcome],
    clip: f64,
    f: u32,
) {
    let result = c.result().await.unwrap();
    let mut want_ids: Vec<u32> = survivors.iter().map(|&i| client_id(&outcomes[i])).collect();
    want_ids.sort();
    let got_ids: Vec<u32> = serde_json::from_value(result["clients"].clone()).unwrap();
    assert_eq!(got_ids, want_ids, "the sum holds exactly the survivors");
    let kept: Vec<Vec<f32>> = survivors.iter().map(|&i| inputs[i].clone()).collect();
    let got: Vec<f64> = serde_json::from_value(result["sum"].clone()).unwrap();
    let want = assert_exact_sum(&got, &kept, clip, f);
    let ring = B64.decode(result["ring_sum"].as_str().unwrap()).unwrap();
    assert_eq!(ring.len(), 4 * want.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_client_survives_and_the_sum_is_exact() {
    let s = TestServer::start(&[]).await;
    let (n, len, clip, f) = (5, 1000, 1.0, 16);
    let c = Coordinator::create(
        &conn(&s.url),
        &json!({"clients": n, "threshold": 3, "vector_length": len, "clip": clip, "scale_bits": f}),
    )
    .await
    .unwrap();
    let inputs: Vec<Vec<f32>> = (0..n).map(|i| values(i, len)).collect();
    let handles = spawn_clients(std::slice::from_ref(&s.url), &c.round, &inputs, &[None; 5]);
    let mut outcomes = Vec::new();
    for h in handles {
        outcomes.push(h.await.unwrap());
    }
    assert!(outcomes.iter().all(|o| matches!(o, Outcome::Done { .. })));
    check_result(&c, &inputs, &[0, 1, 2, 3, 4], &outcomes, clip, f).await;
    // The clients uploaded in the bulk form (`secagg_client`); the sum reads in it too,
    // its values where the JSON answer has them.
    let json_result = c.result().await.unwrap();
    let res = s
        .client
        .get(format!("{}/secagg/rounds/{}/result", s.url, c.round))
        .header("x-secagg-token", &c.token)
        .header("accept", gpu_ops::wire::MEDIA_TYPE)
        .send()
        .await
        .unwrap();
    let bulk = crate::bulk::answer(res).await;
    let (r, sum) = &bulk.buffers["/sum"];
    assert_eq!(
        (r.dtype, r.shape.clone()),
        (gpu_ops::wire::Dtype::F64, vec![len as u64])
    );
    let want: Vec<f64> = serde_json::from_value(json_result["sum"].clone()).unwrap();
    assert_eq!(
        sum,
        &want
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
    );
    let (r, ring) = &bulk.buffers["/ring_sum"];
    assert_eq!(r.dtype, gpu_ops::wire::Dtype::U32);
    assert_eq!(
        ring,
        &B64.decode(json_result["ring_sum"].as_str().unwrap())
            .unwrap()
    );
    assert_eq!(bulk.header["clients"], json_result["clients"]);
    // The registry is the process's: other tests' rounds count too.
    assert!(
        s.metric("gpu_ops_secagg_rounds_total{event=\"finished\"}")
            .await
            >= 1.0
    );
    assert!(
        s.metric("gpu_ops_secagg_submissions_total{stage=\"masked_input\"}")
            .await
            >= 5.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropouts_at_every_stage_leave_the_survivors_sum_exact() {
    // SecAgg+: 10 clients on a ring with 8 neighbours each, threshold 5. One client
    // drops before sending shares, one before uploading, one before unmasking.
    let s = TestServer::start(&[]).await;
    let (n, len, clip, f) = (10, 300, 1.0, 12);
    let c = Coordinator::create(
        &conn(&s.url),
        &json!({"clients": n, "threshold": 5, "neighbours": 8, "vector_length": len, "clip": clip, "scale_bits": f}),
    )
    .await
    .unwrap();
    let inputs: Vec<Vec<f32>> = (0..n).map(|i| values(i, len)).collect();
    let mut plan = vec![None; n];
    plan[0] = Some(DropBefore::Shares);
    plan[1] = Some(DropBefore::Input);
    plan[2] = Some(DropBefore::Unmask);
    let handles = spawn_clients(std::slice::from_ref(&s.url), &c.round, &inputs, &plan);
    // The coordinator closes each stage once everyone but the dropout has submitted.
    until(&c, |r| r.stage == "share_keys").await;
    until(&c, |r| count(r, |x| x.shared) == n - 1).await;
    c.advance().await.unwrap();
    until(&c, |r| count(r, |x| x.uploaded) == n - 2).await;
    c.advance().await.unwrap();
    let state = c.state().await.unwrap();
    assert_eq!(state.stage, "unmasking");
    let mut outcomes = Vec::new();
    for h in handles {
        outcomes.push(h.await.unwrap());
    }
    for (i, o) in outcomes.iter().enumerate() {
        match i {
            0..=2 => assert!(matches!(o, Outcome::Dropped { .. }), "{outcomes:?}"),
            _ => assert!(matches!(o, Outcome::Done { .. }), "{outcomes:?}"),
        }
    }
    // The client that uploaded and then vanished has not revealed: close without it.
    let after = c.advance().await.unwrap();
    assert_eq!(after.stage, "aggregating", "{:?}", after.failure);
    let survivors: Vec<usize> = (2..n).collect();
    check_result(&c, &inputs, &survivors, &outcomes, clip, f).await;
    let result = c.result().await.unwrap();
    assert_eq!(result["dropped"], json!([client_id(&outcomes[1])]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_server_resumes_the_round_from_the_store() {
    let dir = common::temp_data_dir();
    let mut a = TestServer::start(&["--data-dir", &dir]).await;
    let addr = a.url.trim_start_matches("http://").to_string();
    let (n, len, clip, f) = (5, 200, 2.0, 10);
    let c = Coordinator::create(
        &conn(&a.url),
        &json!({"clients": n, "threshold": 3, "neighbours": 4, "vector_length": len, "clip": clip, "scale_bits": f}),
    )
    .await
    .unwrap();
    let inputs: Vec<Vec<f32>> = (0..n).map(|i| values(i + 20, len)).collect();
    let mut plan = vec![None; n];
    plan[4] = Some(DropBefore::Input);
    let handles = spawn_clients(std::slice::from_ref(&a.url), &c.round, &inputs, &plan);
    until(&c, |r| count(r, |x| x.uploaded) == n - 1).await;
    // Stop the server with the round at masked_input, its sum in the store.
    a.trigger_shutdown();
    a.handle.take().unwrap().await.unwrap().unwrap();
    drop(a);
    let b = TestServer::start_at(common::settings(&["--data-dir", &dir]), &addr, |r| r).await;
    let state = c.advance().await.unwrap();
    assert_eq!(state.stage, "unmasking");
    let mut outcomes = Vec::new();
    for h in handles {
        outcomes.push(h.await.unwrap());
    }
    check_result(&c, &inputs, &[0, 1, 2, 3], &outcomes, clip, f).await;
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_share_a_round_through_postgresql() {
    let Some(url) = common::pg::fresh_database() else {
        return;
    };
    // Server processes: the PostgreSQL client may not be dropped on a test's runtime.
    let a = common::binary::Replica::start(&["--database-url", &url], &[]);
    let b = common::binary::Replica::start(&["--database-url", &url], &[]);
    let (n, len, clip, f) = (4, 64, 1.0, 16);
    let c = Coordinator::create(
        &conn(&a.url),
        &json!({"clients": n, "threshold": 2, "vector_length": len, "clip": clip, "scale_bits": f}),
    )
    .await
    .unwrap();
    let inputs: Vec<Vec<f32>> = (0..n).map(|i| values(i + 40, len)).collect();
    // Clients alternate between the replicas; the coordinator reads the result from a.
    let handles = spawn_clients(
        &[a.url.clone(), b.url.clone()],
        &c.round,
        &inputs,
        &[None; 4],
    );
    let mut outcomes = Vec::new();
    for h in handles {
        outcomes.push(h.await.unwrap());
    }
    check_result(&c, &inputs, &[0, 1, 2, 3], &outcomes, clip, f).await;
}

/// χ² of a byte position of the words against uniform over 256 values.
fn chi_square(words: &[u32], byte: u32) -> f64 {
    let mut bins = [0u64; 256];
    for w in words {
        bins[((w >> (8 * byte)) & 0xff) as usize] += 1;
    }
    let e = words.len() as f64 / 256.0;
    bins.iter().map(|&o| (o as f64 - e).powi(2) / e).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_masked_upload_is_indistinguishable_from_uniform() {
    // The uploads are read off the wire as the server receives them.
    let seen: Arc<Mutex<Vec<Vec<u32>>>> = Arc::default();
    let tap = seen.clone();
    let s = TestServer::start_with(common::settings(&[]), move |router| {
        router.layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let tap = tap.clone();
                async move {
                    if !req.uri().path().ends_with("/inputs") {
                        return next.run(req).await;
                    }
                    let (parts, body) = req.into_parts();
                    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
                    // The reference client uploads in the bulk form.
                    let raw = crate::bulk::read(&bytes).buffers["/masked"].1.clone();
                    tap.lock().unwrap().push(
                        raw.chunks_exact(4)
                            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                            .collect(),
                    );
                    next.run(axum::extract::Request::from_parts(
                        parts,
                        axum::body::Body::from(bytes),
                    ))
                    .await
                }
            },
        ))
    })
    .await;
    let (n, len) = (3, 1 << 16);
    let c = Coordinator::create(
        &conn(&s.url),
        &json!({"clients": n, "threshold": 2, "vector_length": len, "clip": 1.0, "scale_bits": 8}),
    )
    .await
    .unwrap();
    // Every client sends the same constant vector: unmasked, every word is equal.
    let inputs = vec![vec![0.25f32; len]; n];
    for h in spawn_clients(std::slice::from_ref(&s.url), &c.round, &inputs, &[None; 3]) {
        h.await.unwrap();
    }
    let uploads = seen.lock().unwrap().clone();
    assert_eq!(uploads.len(), n);
    // df = 255: P(χ² > 360) ≈ 1e-5 under uniformity; 12 statistics are tested.
    for (i, words) in uploads.iter().enumerate() {
        for byte in 0..4 {
            let x2 = chi_square(words, byte);
            assert!(x2 < 360.0, "upload {i}, byte {byte}: χ² = {x2}");
        }
    }
    // The test has power: the same vector unmasked fails it by far.
    let plain: Vec<u32> = inputs[0]
        .iter()
        .map(|&x| ring_quantise(x, 1.0, 8))
        .collect();
    assert!(chi_square(&plain, 0) > 1e6);
    let sum: Vec<f64> = serde_json::from_value(c.result().await.unwrap()["sum"].clone()).unwrap();
    assert!(sum.iter().all(|&v| v == 0.75));
}

/// A client driven step by step, for the refusals a reference client never makes.
struct Manual {
    id: u32,
    token: String,
    share_secret: StaticSecret,
    sigma: Fr,
    beta: Fr,
}

async fn register(s: &TestServer, round: &str) -> Manual {
    let share_secret =
        StaticSecret::from(gpu_ops::ops::mpc::secagg::protocol::random_bytes().unwrap());
    let (sigma, beta) = (random_fr().unwrap(), random_fr().unwrap());
    let res = s
        .post(
            &format!("/secagg/rounds/{round}/keys"),
            json!({"share_key": B64.encode(PublicKey::from(&share_secret).to_bytes()),
                   "mask_key": B64.encode(mask_public(round, &sigma))}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let v: Value = res.json().await.unwrap();
    Manual {
        id: v["client_id"].as_u64().unwrap() as u32,
        token: v["token"].as_str().unwrap().to_string(),
        share_secret,
        sigma,
        beta,
    }
}

impl Manual {
    fn post(
        &self,
        s: &TestServer,
        round: &str,
        what: &str,
        body: Value,
    ) -> reqwest::RequestBuilder {
        s.post(&format!("/secagg/rounds/{round}/{what}"), body)
            .header("x-secagg-token", &self.token)
    }

    /// Its real sealed shares for `peers` (id, share key).
    fn shares_body(&self, round: &str, t: usize, peers: &[(u32, [u8; 32])]) -> Value {
        let ids: Vec<u32> = peers.iter().map(|p| p.0).collect();
        let ss = share_secret(self.sigma, t, &ids).unwrap();
        let bs = share_secret(self.beta, t, &ids).unwrap();
        let messages: Vec<Value> = peers
            .iter()
            .enumerate()
            .map(|(i, (v, key))| {
                let m = ShareMessage { sender: self.id, recipient: *v, sigma: ss[i], beta: bs[i] };
                json!({"recipient": v, "ciphertext": B64.encode(m.seal(round, &self.share_secret, key))})
            })
            .collect();
        json!({"self_mask_commitment": B64.encode(self_mask_commitment(round, self.id, &self.beta)), "messages": messages})
    }

    fn share_key(&self) -> [u8; 32] {
        PublicKey::from(&self.share_secret).to_bytes()
    }
}

async fn create(s: &TestServer, body: Value) -> (String, String) {
    let res = s.post("/secagg/rounds", body).send().await.unwrap();
    assert_eq!(res.status(), 201);
    let v: Value = res.json().await.unwrap();
    (
        v["id"].as_str().unwrap().into(),
        v["coordinator_token"].as_str().unwrap().into(),
    )
}

/// A round left alone for --secagg-round-ttl is deleted with what it stored: its page
/// answers 404, and the expiry is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_round_expires_with_everything_it_stored() {
    let s = TestServer::start(&["--secagg-round-ttl", "2s"]).await;
    let (round, _) = create(
        &s,
        json!({"clients": 3, "threshold": 2, "vector_length": 4, "clip": 1.0, "scale_bits": 8}),
    )
    .await;
    register(&s, &round).await;
    let page = format!("/secagg/rounds/{round}");
    assert_eq!(s.get(&page).await.status(), 200);
    let started = std::time::Instant::now();
    loop {
        let res = s.get(&page).await;
        if res.status() == 404 {
            problem(res, 404, "secagg_round_not_found").await;
            break;
        }
        assert_eq!(res.status(), 200);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "the round outlived its 2 s TTL by far"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(started.elapsed() >= std::time::Duration::from_millis(1500));
    assert!(s.metric("gpu_ops_secagg_rounds_expired_total").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fewer_than_threshold_shares_cannot_unmask_a_client() {
    let s = TestServer::start(&[]).await;
    let (round, coordinator) = create(
        &s,
        json!({"clients": 3, "threshold": 2, "vector_length": 4, "clip": 1.0}),
    )
    .await;
    let cs = [
        register(&s, &round).await,
        register(&s, &round).await,
        register(&s, &round).await,
    ];
    for me in &cs {
        let peers: Vec<(u32, [u8; 32])> = cs
            .iter()
            .filter(|o| o.id != me.id)
            .map(|o| (o.id, o.share_key()))
            .collect();
        let res = me
            .post(&s, &round, "shares", me.shares_body(&round, 2, &peers))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
    }
    for me in &cs {
        let res = me
            .post(
                &s,
                &round,
                "inputs",
                json!({"masked": B64.encode([0u8; 16])}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    // One client reveals; each survivor's β has then one share of the two needed.
    let inbox: Value = s
        .client
        .get(format!("{}/secagg/rounds/{round}/inbox", s.url))
        .header("x-secagg-token", &cs[0].token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut shares = Vec::new();
    for m in inbox["messages"].as_array().unwrap() {
        let sender = m["sender"].as_u64().unwrap() as u32;
        let key = cs.iter().find(|c| c.id == sender).unwrap().share_key();
        let sealed = B64.decode(m["ciphertext"].as_str().unwrap()).unwrap();
        let opened =
            ShareMessage::open(&round, &cs[0].share_secret, sender, cs[0].id, &key, &sealed)
                .unwrap();
        shares.push(json!({"owner": sender, "secret": "self_mask", "share": B64.encode(fr_bytes(&opened.beta))}));
    }
    // A mask_key share for a client that uploaded is refused: never both secrets.
    let mut wrong = shares.clone();
    wrong[0]["secret"] = json!("mask_key");
    let res = cs[0]
        .post(&s, &round, "unmask", json!({"shares": wrong}))
        .send()
        .await
        .unwrap();
    let p = problem(res, 422, "invalid_parameter").await;
    assert_eq!(p["errors"][0]["path"], "/shares/0/secret");
    let res = cs[0]
        .post(&s, &round, "unmask", json!({"shares": shares}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // The coordinator cannot close the unmasking, and there is no sum.
    let advance = s
        .post(&format!("/secagg/rounds/{round}/advance"), json!({}))
        .header("x-secagg-token", &coordinator)
        .send()
        .await
        .unwrap();
    let p = problem(advance, 409, "secagg_too_few_clients").await;
    assert!(
        p["detail"].as_str().unwrap().contains("threshold is 2"),
        "{p}"
    );
    let result = s
        .client
        .get(format!("{}/secagg/rounds/{round}/result", s.url))
        .header("x-secagg-token", &coordinator)
        .send()
        .await
        .unwrap();
    problem(result, 409, "secagg_wrong_stage").await;
    let state: Value = s
        .get(&format!("/secagg/rounds/{round}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(state["stage"], "unmasking");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_has_its_code_and_path() {
    let s = TestServer::start(&["--max-elements", "4096"]).await;
    let base = json!({"clients": 4, "threshold": 2, "vector_length": 8, "clip": 1.0});
    for (change, path) in [
        (json!({"clients": 2}), "/clients"),
        (json!({"clients": 1001}), "/clients"),
        (json!({"neighbours": 1}), "/neighbours"),
        (json!({"clients": 8, "neighbours": 5}), "/neighbours"),
        (json!({"neighbours": 4}), "/neighbours"),
        (json!({"threshold": 1}), "/threshold"),
        (json!({"threshold": 4}), "/threshold"),
        (
            json!({"clients": 9, "neighbours": 4, "threshold": 2}),
            "/threshold",
        ),
        (json!({"vector_length": 0}), "/vector_length"),
        (json!({"vector_length": 4097}), "/vector_length"),
        (json!({"clip": 0.0}), "/clip"),
        (json!({"clip": 1e-9}), "/clip"),
        (json!({"clip": 100000.0}), "/clip"),
        (json!({"scale_bits": 25}), "/scale_bits"),
    ] {
        let mut body = base.clone();
        for (k, v) in change.as_object().unwrap() {
            body[k] = v.clone();
        }
        let res = s.post("/secagg/rounds", body.clone()).send().await.unwrap();
        let p = problem(res, 422, "invalid_parameter").await;
        assert_eq!(p["errors"][0]["path"], path, "{body}");
    }
    let res = s.get("/secagg/rounds/sar_0").await;
    problem(res, 404, "secagg_round_not_found").await;
    let mut on_gpu = base.clone();
    on_gpu["backend"] = json!("cuda");
    let res = s.post("/secagg/rounds", on_gpu).send().await.unwrap();
    problem(res, 503, "device_unavailable").await;

    let (round, coordinator) = create(&s, base.clone()).await;
    let res = s
        .post(
            &format!("/secagg/rounds/{round}/keys"),
            json!({"share_key": "AAAA", "mask_key": B64.encode([9u8; 32])}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/share_key"
    );
    // Low-order X25519 points (here 0 and p − 1): every agreement with them is zero.
    let mut minus_one = [0xffu8; 32];
    (minus_one[0], minus_one[31]) = (0xec, 0x7f);
    for (share_key, mask_key, path) in [
        ([0u8; 32], [9u8; 32], "/share_key"),
        ([9u8; 32], minus_one, "/mask_key"),
    ] {
        let body = json!({"share_key": B64.encode(share_key), "mask_key": B64.encode(mask_key)});
        let res = s
            .post(&format!("/secagg/rounds/{round}/keys"), body)
            .send()
            .await
            .unwrap();
        let p = problem(res, 422, "invalid_parameter").await;
        assert_eq!(p["errors"][0]["path"], path);
        assert!(
            p["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("low-order"),
            "{p}"
        );
    }
    let a = register(&s, &round).await;
    // Shares before the advertising closed: the wrong stage.
    let res = a
        .post(&s, &round, "shares", a.shares_body(&round, 2, &[]))
        .send()
        .await
        .unwrap();
    problem(res, 409, "secagg_wrong_stage").await;
    // Tokens.
    let res = s
        .post(&format!("/secagg/rounds/{round}/advance"), json!({}))
        .send()
        .await
        .unwrap();
    problem(res, 403, "secagg_token_invalid").await;
    let res = s
        .post(&format!("/secagg/rounds/{round}/advance"), json!({}))
        .header("x-secagg-token", &a.token)
        .send()
        .await
        .unwrap();
    problem(res, 403, "secagg_token_invalid").await;
    // Closing the advertising with one client: too few.
    let res = s
        .post(&format!("/secagg/rounds/{round}/advance"), json!({}))
        .header("x-secagg-token", &coordinator)
        .send()
        .await
        .unwrap();
    problem(res, 409, "secagg_too_few_clients").await;
    let b = register(&s, &round).await;
    let c = register(&s, &round).await;
    let d = register(&s, &round).await;
    let res = s
        .post(
            &format!("/secagg/rounds/{round}/keys"),
            json!({"share_key": B64.encode([1u8; 32]), "mask_key": B64.encode([2u8; 32])}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 409, "secagg_round_full").await;
    let all = [&a, &b, &c, &d];
    let peers = |me: &Manual| -> Vec<(u32, [u8; 32])> {
        all.iter()
            .filter(|o| o.id != me.id)
            .map(|o| (o.id, o.share_key()))
            .collect()
    };
    let res = s
        .client
        .get(format!("{}/secagg/rounds/{round}/inbox", s.url))
        .header("x-secagg-token", &a.token)
        .send()
        .await
        .unwrap();
    problem(res, 409, "secagg_wrong_stage").await;
    let res = a
        .post(
            &s,
            &round,
            "shares",
            a.shares_body(&round, 2, &[(a.id, a.share_key())]),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/messages/0/recipient"
    );
    let res = a
        .post(
            &s,
            &round,
            "shares",
            a.shares_body(&round, 2, &peers(&a)[..2]),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/messages"
    );
    let mut twice = a.shares_body(&round, 2, &peers(&a));
    twice["messages"][1]["recipient"] = twice["messages"][0]["recipient"].clone();
    let res = a.post(&s, &round, "shares", twice).send().await.unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/messages/1/recipient"
    );
    let mut short = a.shares_body(&round, 2, &peers(&a));
    short["messages"][2]["ciphertext"] = json!(B64.encode([0u8; 40]));
    let res = a.post(&s, &round, "shares", short).send().await.unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/messages/2/ciphertext"
    );
    for me in [&a, &b, &c] {
        let res = me
            .post(&s, &round, "shares", me.shares_body(&round, 2, &peers(me)))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    let res = a
        .post(&s, &round, "shares", a.shares_body(&round, 2, &peers(&a)))
        .send()
        .await
        .unwrap();
    problem(res, 409, "secagg_already_submitted").await;
    // d never shares: the coordinator closes the stage without it.
    let res = s
        .post(&format!("/secagg/rounds/{round}/advance"), json!({}))
        .header("x-secagg-token", &coordinator)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = d
        .post(
            &s,
            &round,
            "inputs",
            json!({"masked": B64.encode([0u8; 32])}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 409, "secagg_wrong_stage").await;
    let res = a
        .post(
            &s,
            &round,
            "inputs",
            json!({"masked": B64.encode([0u8; 28])}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/masked"
    );
    let res = a
        .post(&s, &round, "inputs", json!({"masked": "not base64!"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/masked"
    );
    // In the bulk form the words are a u32 buffer: another dtype is refused at its member.
    let as_f32 = crate::bulk::body(
        json!({}),
        vec![crate::bulk::Buf {
            at: "/masked",
            dtype: gpu_ops::wire::Dtype::F32,
            shape: vec![8],
            bytes: vec![0; 32],
        }],
    );
    let res = s
        .client
        .post(format!("{}/secagg/rounds/{round}/inputs", s.url))
        .header("x-secagg-token", &a.token)
        .header("content-type", gpu_ops::wire::MEDIA_TYPE)
        .body(as_f32)
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/masked/dtype"
    );
    let res = s
        .client
        .get(format!("{}/secagg/rounds/{round}/result", s.url))
        .header("x-secagg-token", &coordinator)
        .send()
        .await
        .unwrap();
    problem(res, 409, "secagg_wrong_stage").await;
    let masked = {
        let mut q: Vec<u32> = vec![0; 8];
        apply_masks(&mut q, &[]);
        B64.encode(q.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>())
    };
    // The vector may be a resident array of kind bytes: refused at `/masked/array` when it
    // is not whole words, is not the round's vector_length, is not bytes, or is not there.
    let array = |body: Value| {
        let s = &s;
        async move {
            let res = s.post("/arrays", body).send().await.unwrap();
            assert_eq!(res.status(), 201);
            res.json::<Value>().await.unwrap()["id"].clone()
        }
    };
    let odd = array(json!({"kind": "bytes", "bytes": B64.encode([0u8; 6])})).await;
    let tensor = array(json!({"kind": "tensor", "tensor": [1.0]})).await;
    let short = array(json!({"kind": "bytes", "bytes": B64.encode([0u8; 16])})).await;
    for (named, status, code) in [
        (odd, 422, "invalid_parameter"),
        (short, 422, "invalid_parameter"),
        (tensor, 422, "array_mismatch"),
        (json!("arr_nothing"), 422, "unknown_array"),
    ] {
        let res = a
            .post(&s, &round, "inputs", json!({"masked": {"array": named}}))
            .send()
            .await
            .unwrap();
        let p = problem(res, status, code).await;
        assert_eq!(p["errors"][0]["path"], "/masked/array", "{p}");
    }
    let resident = array(json!({"kind": "bytes", "bytes": masked})).await;
    for (me, body) in [
        (&a, json!({"masked": {"array": resident}})),
        (&b, json!({"masked": masked})),
        (&c, json!({"masked": masked})),
    ] {
        let res = me.post(&s, &round, "inputs", body).send().await.unwrap();
        assert_eq!(res.status(), 200);
    }
    let res = a.post(&s, &round, "unmask", json!({"shares": [{"owner": b.id, "secret": "self_mask", "share": B64.encode([0xffu8; 32])}]})).send().await.unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/shares/0/share"
    );
    let res = a.post(&s, &round, "unmask", json!({"shares": [{"owner": d.id, "secret": "self_mask", "share": B64.encode([0u8; 32])}]})).send().await.unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/shares/0/owner"
    );
    let res = a.post(&s, &round, "unmask", json!({"shares": [{"owner": b.id, "secret": "self_mask", "share": B64.encode([0u8; 32])}]})).send().await.unwrap();
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/shares"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_client_takes_part_in_a_round() {
    let s = TestServer::start(&[]).await;
    let (n, len) = (3usize, 32);
    let c = Coordinator::create(
        &conn(&s.url),
        &json!({"clients": n, "threshold": 2, "vector_length": len, "clip": 1.0, "scale_bits": 16}),
    )
    .await
    .unwrap();
    let dir = std::path::PathBuf::from(common::temp_data_dir());
    std::fs::create_dir_all(&dir).unwrap();
    let inputs: Vec<Vec<f32>> = (0..n).map(|i| values(i + 60, len)).collect();
    let children: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let file = dir.join(format!("client-{i}.json"));
            std::fs::write(&file, serde_json::to_string(v).unwrap()).unwrap();
            tokio::process::Command::new(env!("CARGO_BIN_EXE_gpu-ops"))
                .args([
                    "secagg-client",
                    "--server",
                    &s.url,
                    "--round",
                    &c.round,
                    "--input",
                ])
                .arg(&file)
                .output()
        })
        .collect();
    let mut ids = Vec::new();
    for child in children {
        let out = child.await.unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(line["outcome"], "done", "{line}");
        ids.push(line["client_id"].as_u64().unwrap());
    }
    ids.sort();
    assert_eq!(ids, [1, 2, 3]);
    let sum: Vec<f64> = serde_json::from_value(c.result().await.unwrap()["sum"].clone()).unwrap();
    assert_exact_sum(&sum, &inputs, 1.0, 16);
    // A file that is not a JSON array of numbers is refused before anything is sent.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"not\": \"an array\"}").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ops"))
        .args([
            "secagg-client",
            "--server",
            &s.url,
            "--round",
            &c.round,
            "--input",
        ])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a JSON array of numbers"));
    let _ = std::fs::remove_dir_all(&dir);
}
