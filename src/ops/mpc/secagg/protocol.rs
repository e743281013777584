//! The wire-level pieces of secure aggregation (Bonawitz et al., CCS 2017, with the
//! SecAgg+ neighbourhoods of Bell et al., CCS 2020), shared by the server and the
//! reference client so that both derive every key, graph and mask the same way.
//! `docs/SECAGG.md` states each of them for other languages.
//!
//! Every derived key is HKDF-SHA256 with the round id as salt and an info string that
//! starts with `gpu-ops/secagg/v1/`, names its purpose and ends with the client ids
//! (big-endian u32), so no key serves two purposes, two rounds or two pairs.

use ark_ff::{BigInteger, PrimeField, Zero};
use chacha20::cipher::{KeyIvInit, StreamCipher};
use chacha20::ChaCha20;
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::ChaCha20Poly1305;
use hkdf::Hkdf;
use sha2::{Digest, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};

/// The secrets are shared over BN254's scalar field: one element each.
pub type Fr = ark_bn254::Fr;

const LABEL: &str = "gpu-ops/secagg/v1/";
/// The plaintext of one share message: sender, recipient, then the two shares.
pub const SHARE_PLAINTEXT_BYTES: usize = 4 + 4 + 32 + 32;
/// ChaCha20-Poly1305's tag.
pub const SHARE_CIPHERTEXT_BYTES: usize = SHARE_PLAINTEXT_BYTES + 16;

/// HKDF-SHA256(ikm, salt = round id, info = label ‖ purpose ‖ ids as big-endian u32).
fn derive(ikm: &[u8], round: &str, purpose: &str, ids: &[u32]) -> [u8; 32] {
    let mut info = Vec::with_capacity(LABEL.len() + purpose.len() + 4 * ids.len());
    info.extend_from_slice(LABEL.as_bytes());
    info.extend_from_slice(purpose.as_bytes());
    for id in ids {
        info.extend_from_slice(&id.to_be_bytes());
    }
    let mut out = [0u8; 32];
    Hkdf::<Sha256>::new(Some(round.as_bytes()), ikm)
        .expand(&info, &mut out)
        .expect("32 bytes is a valid HKDF-SHA256 length");
    out
}

/// An element as 32 little-endian bytes (canonical).
pub fn fr_bytes(x: &Fr) -> [u8; 32] {
    x.into_bigint()
        .to_bytes_le()
        .try_into()
        .expect("BN254's scalars are 32 bytes")
}

/// 32 little-endian bytes as an element; `None` unless canonical (below r).
pub fn fr_from_bytes(b: &[u8; 32]) -> Option<Fr> {
    let x = Fr::from_le_bytes_mod_order(b);
    (fr_bytes(&x) == *b).then_some(x)
}

/// A uniform element from the operating system's CSPRNG (64 bytes reduced mod r, so the
/// bias is below 2^-250).
pub fn random_fr() -> Result<Fr, String> {
    let mut b = [0u8; 64];
    getrandom::fill(&mut b).map_err(|e| format!("no OS entropy: {e}"))?;
    Ok(Fr::from_le_bytes_mod_order(&b))
}

/// 32 bytes from the operating system's CSPRNG.
pub fn random_bytes() -> Result<[u8; 32], String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| format!("no OS entropy: {e}"))?;
    Ok(b)
}

/// Whether an X25519 public key lies in the small subgroup (order 1, 2, 4 or 8, in any of
/// its encodings): agreement with it is all zeros for every secret, as X25519 clamps each
/// secret to a multiple of the cofactor 8. Tried with one fixed secret, which suffices for
/// that reason; a key with a prime-order part agrees to something else.
pub fn is_low_order(key: &[u8; 32]) -> bool {
    let probe = StaticSecret::from([0x5a; 32]);
    !probe
        .diffie_hellman(&PublicKey::from(*key))
        .was_contributory()
}

/// The X25519 secret a client masks with, derived from its shared element σ, so that σ's
/// shares are enough to rebuild it after a dropout. (No client id in it: the key is
/// advertised before the server assigns the id.)
pub fn mask_secret(round: &str, sigma: &Fr) -> StaticSecret {
    StaticSecret::from(derive(&fr_bytes(sigma), round, "mask-key", &[]))
}

/// The public key a client advertises for masking; the server checks a rebuilt σ
/// against it before using it.
pub fn mask_public(round: &str, sigma: &Fr) -> [u8; 32] {
    PublicKey::from(&mask_secret(round, sigma)).to_bytes()
}

/// The ChaCha20 key of a client's self-mask, from its shared element β.
pub fn self_mask_key(round: &str, client: u32, beta: &Fr) -> [u8; 32] {
    derive(&fr_bytes(beta), round, "self-mask", &[client])
}

/// What a client publishes about β before uploading: SHA-256 of the label, the round,
/// its id and β, so the server can check a rebuilt β (β is uniform over 2^254 values, so
/// the hash hides it).
pub fn self_mask_commitment(round: &str, client: u32, beta: &Fr) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(LABEL.as_bytes());
    h.update(b"self-mask-commitment");
    h.update((round.len() as u32).to_be_bytes());
    h.update(round.as_bytes());
    h.update(client.to_be_bytes());
    h.update(fr_bytes(beta));
    h.finalize().into()
}

/// The ChaCha20 key of the mask between clients `a` and `b` (either order), from their
/// X25519 agreement.
pub fn pair_mask_key(
    round: &str,
    mine: &StaticSecret,
    a: u32,
    b: u32,
    theirs: &[u8; 32],
) -> [u8; 32] {
    let shared = mine.diffie_hellman(&PublicKey::from(*theirs));
    derive(shared.as_bytes(), round, "pair-mask", &[a.min(b), a.max(b)])
}

/// Whether client `me` subtracts its pair mask with `other`: it adds the mask shared
/// with a higher id and subtracts the one with a lower id, so a pair's masks cancel in
/// the sum.
pub fn subtracts_pair_mask(me: u32, other: u32) -> bool {
    me > other
}

/// One client's shares for one holder: the share of σ and of β at the holder's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareMessage {
    pub sender: u32,
    pub recipient: u32,
    pub sigma: Fr,
    pub beta: Fr,
}

fn share_key(
    round: &str,
    mine: &StaticSecret,
    sender: u32,
    recipient: u32,
    theirs: &[u8; 32],
) -> [u8; 32] {
    let shared = mine.diffie_hellman(&PublicKey::from(*theirs));
    derive(shared.as_bytes(), round, "share", &[sender, recipient])
}

fn share_aad(round: &str, sender: u32, recipient: u32) -> Vec<u8> {
    let mut aad = format!("{LABEL}share/{round}").into_bytes();
    aad.extend_from_slice(&sender.to_be_bytes());
    aad.extend_from_slice(&recipient.to_be_bytes());
    aad
}

impl ShareMessage {
    /// Sealed with ChaCha20-Poly1305 under a key only the two clients can derive (one
    /// key per direction, used once, so the nonce is zero).
    pub fn seal(&self, round: &str, mine: &StaticSecret, recipient_key: &[u8; 32]) -> Vec<u8> {
        let mut plain = Vec::with_capacity(SHARE_PLAINTEXT_BYTES);
        plain.extend_from_slice(&self.sender.to_le_bytes());
        plain.extend_from_slice(&self.recipient.to_le_bytes());
        plain.extend_from_slice(&fr_bytes(&self.sigma));
        plain.extend_from_slice(&fr_bytes(&self.beta));
        let key = share_key(round, mine, self.sender, self.recipient, recipient_key);
        let aad = share_aad(round, self.sender, self.recipient);
        cipher(&key)
            .encrypt(
                &[0u8; 12].into(),
                Payload {
                    msg: &plain,
                    aad: &aad,
                },
            )
            .expect("ChaCha20-Poly1305 seals any short message")
    }

    /// Opens a message from `sender` to `recipient`; `None` if it was changed, sealed for
    /// someone else, or names other clients than the ones it travelled between.
    pub fn open(
        round: &str,
        mine: &StaticSecret,
        sender: u32,
        recipient: u32,
        sender_key: &[u8; 32],
        sealed: &[u8],
    ) -> Option<Self> {
        let key = share_key(round, mine, sender, recipient, sender_key);
        let aad = share_aad(round, sender, recipient);
        let plain = cipher(&key)
            .decrypt(
                &[0u8; 12].into(),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .ok()?;
        if plain.len() != SHARE_PLAINTEXT_BYTES {
            return None;
        }
        let word = |i: usize| u32::from_le_bytes(plain[i..i + 4].try_into().unwrap());
        let element = |i: usize| fr_from_bytes(plain[i..i + 32].try_into().unwrap());
        let m = Self {
            sender: word(0),
            recipient: word(4),
            sigma: element(8)?,
            beta: element(40)?,
        };
        (m.sender == sender && m.recipient == recipient).then_some(m)
    }
}

fn cipher(key: &[u8; 32]) -> ChaCha20Poly1305 {
    use chacha20poly1305::KeyInit;
    ChaCha20Poly1305::new(key.into())
}

/// A random polynomial of degree t − 1 with `secret` at 0, evaluated at each holder's id.
pub fn share_secret(secret: Fr, threshold: usize, holders: &[u32]) -> Result<Vec<Fr>, String> {
    let mut coeffs = vec![secret];
    for _ in 1..threshold {
        coeffs.push(random_fr()?);
    }
    Ok(holders
        .iter()
        .map(|&x| {
            let x = Fr::from(x);
            coeffs.iter().rev().fold(Fr::zero(), |acc, c| acc * x + c)
        })
        .collect())
}

/// The secret from shares at distinct nonzero ids (Lagrange at 0). With more shares
/// than `threshold`, the extra ones must lie on the polynomial through the first
/// `threshold`: `None` if any does not, or if there are too few.
pub fn recover_secret(threshold: usize, shares: &[(u32, Fr)]) -> Option<Fr> {
    if shares.len() < threshold || threshold == 0 {
        return None;
    }
    let (used, extra) = shares.split_at(threshold);
    let xs: Vec<Fr> = used.iter().map(|&(x, _)| Fr::from(x)).collect();
    let mut targets = vec![Fr::zero()];
    targets.extend(extra.iter().map(|&(x, _)| Fr::from(x)));
    let rows = crate::ops::mpc::scalar::lagrange_rows(&xs, &targets);
    let at = |q: usize| -> Fr {
        used.iter()
            .enumerate()
            .map(|(i, &(_, y))| rows[q * threshold + i] * y)
            .sum()
    };
    for (q, &(_, y)) in extra.iter().enumerate() {
        if at(q + 1) != y {
            return None;
        }
    }
    Some(at(0))
}

/// A uniform draw from a seeded ChaCha20 stream, by rejection: the graph's permutation.
struct SeededWords {
    cipher: ChaCha20,
}

impl SeededWords {
    fn new(seed: &[u8; 32]) -> Self {
        Self {
            cipher: ChaCha20::new(seed.into(), &[0u8; 12].into()),
        }
    }

    fn next(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.cipher.apply_keystream(&mut b);
        u32::from_le_bytes(b)
    }

    /// Uniform on 0..bound (bound ≥ 1): words at or above the largest multiple of
    /// `bound` below 2^32 are drawn again.
    fn below(&mut self, bound: u32) -> u32 {
        let limit = u32::MAX - (u32::MAX % bound + 1) % bound;
        loop {
            let w = self.next();
            if w <= limit {
                return w % bound;
            }
        }
    }
}

/// A round's graph seed from its wire form (64 hex digits); `None` if malformed.
pub fn graph_seed_bytes(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Who shares with whom. SecAgg+ places the ids 1..=n on a ring in a random order drawn
/// from the round's graph seed, and joins each to the k/2 nearest on each side (a Harary
/// graph); with k = n − 1 every client is every other's neighbour (the original
/// protocol).
#[derive(Clone, Debug)]
pub struct Graph {
    clients: u32,
    degree: u32,
    /// `ring[p]` is the id at place p; `place[id - 1]` its place.
    ring: Vec<u32>,
    place: Vec<u32>,
}

impl Graph {
    /// `degree` is k: n − 1, or an even number below it.
    pub fn new(clients: u32, degree: u32, seed: &[u8; 32]) -> Self {
        let mut ring: Vec<u32> = (1..=clients).collect();
        let mut words = SeededWords::new(seed);
        // Fisher–Yates, from the last place down.
        for i in (1..ring.len()).rev() {
            let j = words.below(i as u32 + 1) as usize;
            ring.swap(i, j);
        }
        let mut place = vec![0; clients as usize];
        for (p, &id) in ring.iter().enumerate() {
            place[id as usize - 1] = p as u32;
        }
        Self {
            clients,
            degree,
            ring,
            place,
        }
    }

    /// Client `id`'s neighbours, in increasing id order.
    pub fn neighbours(&self, id: u32) -> Vec<u32> {
        let n = self.clients;
        let mut out: Vec<u32> = if self.degree + 1 >= n {
            (1..=n).filter(|&v| v != id).collect()
        } else {
            let p = self.place[id as usize - 1];
            (1..=self.degree / 2)
                .flat_map(|d| [(p + d) % n, (p + n - d) % n])
                .map(|q| self.ring[q as usize])
                .collect()
        };
        out.sort_unstable();
        out
    }

    pub fn are_neighbours(&self, a: u32, b: u32) -> bool {
        if a == b {
            return false;
        }
        if self.degree + 1 >= self.clients {
            return true;
        }
        let n = self.clients;
        let (pa, pb) = (self.place[a as usize - 1], self.place[b as usize - 1]);
        let gap = pa.abs_diff(pb);
        gap.min(n - gap) <= self.degree / 2
    }
}

/// Fixed-point quantisation onto the ring Z/2^32: clipped to ±clip, scaled by 2^f and
/// rounded to the nearest integer (ties away from zero), as a two's-complement word.
pub fn quantise(x: f32, clip: f64, scale_bits: u32) -> u32 {
    let v = (f64::from(x).clamp(-clip, clip) * f64::from(1u32 << scale_bits)).round();
    (v as i64) as i32 as u32
}

/// A ring sum back to a real number: read as a signed 32-bit integer, divided by 2^f.
/// Exact while Σ|q| < 2^31, which the round's parameters guarantee.
pub fn dequantise(v: u32, scale_bits: u32) -> f64 {
    f64::from(v as i32) / f64::from(1u32 << scale_bits)
}

/// The largest quantised magnitude: round(clip · 2^f).
pub fn quantised_bound(clip: f64, scale_bits: u32) -> f64 {
    (clip * f64::from(1u32 << scale_bits)).round()
}
