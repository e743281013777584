use super::masks::{apply_masks, MaskTerm, UnmaskJob};
use super::protocol::*;
use super::round::*;
use crate::backend::Job;
use ark_ff::One;
use chacha20::cipher::{KeyIvInit, StreamCipher};
use std::sync::Arc;

fn config(n: u32, t: u32, k: u32) -> RoundConfig {
    RoundConfig {
        clients: n,
        threshold: t,
        neighbours: k,
        vector_length: 8,
        clip: 1.0,
        scale_bits: 16,
        graph_seed: "07".repeat(32),
        backend: Default::default(),
    }
}

#[test]
fn the_graph_is_a_symmetric_regular_ring_drawn_from_its_seed() {
    let g = Graph::new(50, 8, &[3; 32]);
    for u in 1..=50 {
        let ns = g.neighbours(u);
        assert_eq!(ns.len(), 8, "client {u}");
        assert!(!ns.contains(&u));
        for &v in &ns {
            assert!(g.neighbours(v).contains(&u), "{u} ~ {v} both ways");
            assert!(g.are_neighbours(u, v));
        }
        let others = (1..=50).filter(|v| !ns.contains(v) && *v != u);
        assert!(others.into_iter().all(|v| !g.are_neighbours(u, v)));
    }
    // Another seed, another ring; the complete graph needs none.
    assert_ne!(Graph::new(50, 8, &[4; 32]).neighbours(1), g.neighbours(1));
    assert_eq!(Graph::new(5, 4, &[0; 32]).neighbours(3), vec![1, 2, 4, 5]);
}

#[test]
fn sealed_shares_open_only_for_their_recipient_and_unchanged() {
    let [a, b, c] = [[1u8; 32], [2u8; 32], [3u8; 32]].map(StaticSecret::from);
    let pk = |s: &StaticSecret| PublicKey::from(s).to_bytes();
    let m = ShareMessage {
        sender: 4,
        recipient: 9,
        sigma: Fr::from(12345u64),
        beta: -Fr::one(),
    };
    let sealed = m.seal("sar_x", &a, &pk(&b));
    assert_eq!(sealed.len(), SHARE_CIPHERTEXT_BYTES);
    assert_eq!(
        ShareMessage::open("sar_x", &b, 4, 9, &pk(&a), &sealed),
        Some(m)
    );
    assert_eq!(
        ShareMessage::open("sar_x", &c, 4, 9, &pk(&a), &sealed),
        None,
        "someone else"
    );
    assert_eq!(
        ShareMessage::open("sar_y", &b, 4, 9, &pk(&a), &sealed),
        None,
        "another round"
    );
    assert_eq!(
        ShareMessage::open("sar_x", &b, 5, 9, &pk(&a), &sealed),
        None,
        "another sender"
    );
    let mut changed = sealed.clone();
    changed[10] ^= 1;
    assert_eq!(
        ShareMessage::open("sar_x", &b, 4, 9, &pk(&a), &changed),
        None
    );
}

use x25519_dalek::{PublicKey, StaticSecret};

#[test]
fn any_threshold_of_shares_recovers_and_fewer_do_not() {
    let secret = random_fr().unwrap();
    let holders = [3u32, 5, 8, 13, 21];
    let ys = share_secret(secret, 3, &holders).unwrap();
    let all: Vec<(u32, Fr)> = holders.iter().copied().zip(ys.iter().copied()).collect();
    assert_eq!(
        recover_secret(3, &all),
        Some(secret),
        "with two checked extras"
    );
    assert_eq!(recover_secret(3, &all[2..]), Some(secret));
    assert_eq!(recover_secret(3, &all[..2]), None, "two of three");
    // Two shares are consistent with every secret: interpolating them as if t were 2
    // gives a value unrelated to it.
    assert_ne!(recover_secret(2, &all[..2]), Some(secret));
    let mut wrong = all.clone();
    wrong[4].1 += Fr::one();
    assert_eq!(
        recover_secret(3, &wrong),
        None,
        "an extra share off the polynomial"
    );
}

#[test]
fn masks_are_the_key_stream_whatever_the_pieces() {
    let key = [9u8; 32];
    let len = 40_000; // several parallel pieces, the last one partial
    let mut stream = vec![0u8; len * 4];
    chacha20::ChaCha20::new(&key.into(), &[0u8; 12].into()).apply_keystream(&mut stream);
    let mut acc = vec![5u32; len];
    apply_masks(
        &mut acc,
        &[MaskTerm {
            key,
            subtract: false,
        }],
    );
    for (i, (a, w)) in acc.iter().zip(stream.chunks_exact(4)).enumerate() {
        assert_eq!(
            *a,
            5u32.wrapping_add(u32::from_le_bytes(w.try_into().unwrap())),
            "word {i}"
        );
    }
    apply_masks(
        &mut acc,
        &[MaskTerm {
            key,
            subtract: true,
        }],
    );
    assert!(acc.iter().all(|&a| a == 5));
}

#[test]
fn pair_masks_cancel_and_the_unmask_job_removes_the_rest() {
    let round = "sar_t";
    let sigma: Vec<Fr> = (0..3).map(|_| random_fr().unwrap()).collect();
    let secret = |u: usize| mask_secret(round, &sigma[u]);
    let public = |u: usize| mask_public(round, &sigma[u]);
    let pair = |u: usize, v: usize| {
        pair_mask_key(round, &secret(u), u as u32 + 1, v as u32 + 1, &public(v))
    };
    assert_eq!(pair(0, 1), pair(1, 0), "both ends agree on the pair's key");
    let mut sum = vec![0u32; 100];
    let self_keys: Vec<[u8; 32]> = (0..3)
        .map(|u| self_mask_key(round, u as u32 + 1, &Fr::from(u as u64)))
        .collect();
    for (u, &self_key) in self_keys.iter().enumerate() {
        let mut y = vec![u as u32 + 1; 100];
        let mut terms = vec![MaskTerm {
            key: self_key,
            subtract: false,
        }];
        for v in (0..3).filter(|&v| v != u) {
            terms.push(MaskTerm {
                key: pair(u, v),
                subtract: subtracts_pair_mask(u as u32 + 1, v as u32 + 1),
            });
        }
        apply_masks(&mut y, &terms);
        super::masks::add_into(&mut sum, &y);
    }
    let terms = self_keys
        .iter()
        .map(|&key| MaskTerm {
            key,
            subtract: true,
        })
        .collect();
    let out = UnmaskJob::new(Arc::new(sum), terms).run_cpu();
    assert!(
        out.iter().all(|&v| v == 6),
        "1 + 2 + 3 once the self-masks are gone"
    );
}

#[test]
fn quantisation_clips_rounds_and_reads_back_signed() {
    assert_eq!(quantise(0.5, 1.0, 4), 8);
    assert_eq!(quantise(-0.5, 1.0, 4), (-8i32) as u32);
    assert_eq!(quantise(3.0, 1.0, 4), 16, "clipped");
    assert_eq!(
        quantise(-1.03125, 2.0, 4),
        (-17i32) as u32,
        "a tie rounds away from zero"
    );
    assert_eq!(dequantise((-17i32) as u32, 4), -1.0625);
    assert_eq!(
        dequantise(
            quantise(0.25, 1.0, 16).wrapping_add(quantise(-0.75, 1.0, 16)),
            16
        ),
        -0.5
    );
}

#[test]
fn round_parameters_are_checked_with_their_field() {
    let ok = config(10, 5, 8);
    ok.validate(100).unwrap();
    config(10, 6, 9).validate(100).unwrap();
    let field = |c: RoundConfig| c.validate(100).unwrap_err().path;
    use crate::ops::invalid::FieldPath;
    assert_eq!(
        field(config(10, 4, 8)),
        FieldPath::root().field("threshold"),
        "half of k"
    );
    assert_eq!(
        field(config(10, 5, 7)),
        FieldPath::root().field("neighbours"),
        "odd k"
    );
    assert_eq!(field(config(2, 2, 1)), FieldPath::root().field("clients"));
    let wide = RoundConfig {
        clip: 40_000.0,
        ..config(10, 5, 8)
    };
    assert_eq!(
        field(wide),
        FieldPath::root().field("clip"),
        "the sum could wrap"
    );
}

#[test]
fn stages_close_only_with_enough_clients_and_holders() {
    let c = config(5, 3, 4);
    let m = |id, shared, uploaded, unmasked| Member {
        id,
        shared,
        uploaded,
        unmasked,
    };
    let sets = Sets::of(&[
        m(1, true, true, false),
        m(2, true, true, false),
        m(3, true, false, false),
    ]);
    // Each uploader holds shares of the other two needed secrets only: 2 < 3 holders.
    assert!(matches!(
        close(&c, Stage::MaskedInput, &sets),
        Err(Refusal::TooFew(_))
    ));
    let four: Vec<Member> = (1..=4).map(|i| m(i, true, true, i <= 2)).collect();
    let sets = Sets::of(&four);
    assert_eq!(close(&c, Stage::MaskedInput, &sets), Ok(Stage::Unmasking));
    assert!(
        matches!(close(&c, Stage::Unmasking, &sets), Err(Refusal::TooFew(_))),
        "two revealed of three"
    );
    let owed = sets.reveals_of(&c.graph(), 1);
    assert_eq!(owed.keys().copied().collect::<Vec<_>>(), vec![2, 3, 4]);
    assert!(owed.values().all(|s| *s == Secret::SelfMask));
    assert!(check_reveals(&owed, &[(2, Secret::SelfMask), (3, Secret::SelfMask)]).is_err());
    assert!(check_reveals(
        &owed,
        &[
            (2, Secret::MaskKey),
            (3, Secret::SelfMask),
            (4, Secret::SelfMask)
        ]
    )
    .is_err());
    check_reveals(
        &owed,
        &[
            (4, Secret::SelfMask),
            (2, Secret::SelfMask),
            (3, Secret::SelfMask),
        ],
    )
    .unwrap();
}

#[test]
fn the_share_stage_does_not_close_into_a_round_that_cannot_finish() {
    // Three of five shared, t = 3: each has two neighbours among the sharers.
    let c = config(5, 3, 4);
    let m = |id, shared| Member {
        id,
        shared,
        ..Default::default()
    };
    let sets = Sets::of(&[m(1, true), m(2, true), m(3, true), m(4, false), m(5, false)]);
    assert!(matches!(
        close(&c, Stage::ShareKeys, &sets),
        Err(Refusal::TooFew(_))
    ));
    let sets = Sets::of(&[m(1, true), m(2, true), m(3, true), m(4, true), m(5, false)]);
    assert_eq!(close(&c, Stage::ShareKeys, &sets), Ok(Stage::MaskedInput));
}

#[test]
fn the_unmasking_work_is_bounded_at_creation() {
    let big = RoundConfig {
        vector_length: 1 << 24,
        ..config(1000, 500, 999)
    };
    assert!(big.worst_case_masks() > 400_000);
    assert_eq!(
        big.validate(1 << 24).unwrap_err().path,
        crate::ops::invalid::FieldPath::root().field("vector_length")
    );
    // The benchmark round fits.
    RoundConfig {
        vector_length: 1 << 20,
        ..config(100, 50, 99)
    }
    .validate(1 << 24)
    .unwrap();
}

/// The small-order points of Curve25519 as RFC 7748 and libsodium list them (u = 0, 1,
/// the two points of order 8, and p − 1, p, p + 1 as unreduced encodings), each refused;
/// honest keys are not.
#[test]
fn low_order_keys_are_told_from_honest_ones() {
    let hex = |h: &str| -> [u8; 32] {
        let v: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        v.try_into().unwrap()
    };
    let mut one = [0u8; 32];
    one[0] = 1;
    let low = [
        [0u8; 32],
        one,
        hex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
        hex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
        hex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
        hex("edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
        hex("eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
    ];
    for key in low {
        assert!(is_low_order(&key), "{key:02x?}");
    }
    for seed in 1..=20u8 {
        let honest = PublicKey::from(&StaticSecret::from([seed; 32])).to_bytes();
        assert!(!is_low_order(&honest));
    }
    assert!(!is_low_order(&[9u8; 32]));
}
