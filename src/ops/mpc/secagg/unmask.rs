//! What the server subtracts from the sum of the uploads: it rebuilds each survivor's β
//! and each dropout's σ from the revealed shares, checks each against what the client
//! published before uploading (β's commitment, σ's public mask key), and turns them into
//! mask terms. A share that does not fit fails the round; it never yields a wrong sum.

use super::masks::MaskTerm;
use super::protocol::{
    mask_public, mask_secret, pair_mask_key, recover_secret, self_mask_commitment, self_mask_key,
    Fr,
};
use super::round::{RoundConfig, Secret, Sets};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// A client's published keys, as the unmasking needs them.
pub struct PublicMember {
    pub id: u32,
    pub mask_key: [u8; 32],
    pub self_mask_commitment: Option<[u8; 32]>,
}

pub struct RevealedShare {
    pub owner: u32,
    pub holder: u32,
    pub secret: Secret,
    pub value: Fr,
}

/// The masks to apply to the sum of the uploads: minus each survivor's self-mask, and
/// for each dropout, the opposite of each surviving neighbour's pair mask with it.
pub fn unmask_terms(
    round_id: &str,
    config: &RoundConfig,
    sets: &Sets,
    members: &[PublicMember],
    reveals: &[RevealedShare],
) -> Result<Vec<MaskTerm>, String> {
    let graph = config.graph();
    let t = config.threshold as usize;
    let by_id: BTreeMap<u32, &PublicMember> = members.iter().map(|m| (m.id, m)).collect();
    let mut shares: BTreeMap<(u32, Secret), Vec<(u32, Fr)>> = BTreeMap::new();
    for r in reveals {
        shares
            .entry((r.owner, r.secret))
            .or_default()
            .push((r.holder, r.value));
    }
    let needed = sets.needed();
    let per_owner: Vec<Result<Vec<MaskTerm>, String>> = needed
        .par_iter()
        .map(|&(owner, kind)| {
            let given = shares.get(&(owner, kind)).map_or(&[][..], |v| v.as_slice());
            let secret = recover_secret(t, given).ok_or_else(|| {
                format!(
                    "the {} revealed shares of client {owner}'s {} do not lie on one polynomial \
                     of degree {} (or are fewer than {t}): at least one holder sent a wrong share",
                    given.len(),
                    kind.as_str(),
                    t - 1
                )
            })?;
            let member = by_id
                .get(&owner)
                .ok_or_else(|| format!("client {owner} is not registered"))?;
            match kind {
                Secret::SelfMask => {
                    if member.self_mask_commitment
                        != Some(self_mask_commitment(round_id, owner, &secret))
                    {
                        return Err(format!(
                            "client {owner}'s rebuilt self-mask seed does not match its commitment"
                        ));
                    }
                    Ok(vec![MaskTerm {
                        key: self_mask_key(round_id, owner, &secret),
                        subtract: true,
                    }])
                }
                Secret::MaskKey => {
                    if mask_public(round_id, &secret) != member.mask_key {
                        return Err(format!(
                            "client {owner}'s rebuilt mask key does not match its advertised key"
                        ));
                    }
                    let mine = mask_secret(round_id, &secret);
                    graph
                        .neighbours(owner)
                        .into_iter()
                        .filter(|v| sets.uploaded.contains(v))
                        .map(|v| {
                            let theirs = by_id
                                .get(&v)
                                .ok_or_else(|| format!("client {v} is not registered"))?;
                            Ok(MaskTerm {
                                key: pair_mask_key(round_id, &mine, owner, v, &theirs.mask_key),
                                // v added this mask when v < owner: take it away.
                                subtract: !super::protocol::subtracts_pair_mask(v, owner),
                            })
                        })
                        .collect()
                }
            }
        })
        .collect();
    let mut terms = Vec::new();
    for r in per_owner {
        terms.extend(r?);
    }
    Ok(terms)
}
