//! A count per tenant against a cap, each taken amount given back when its guard drops:
//! the bytes of a tenant's bodies in flight (`body_budget`) and its open progress
//! streams (`datasets::progress`). A tenant whose count returns to 0 leaves the map.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct TenantCounts {
    counts: Arc<Mutex<HashMap<String, u64>>>,
}

/// `amount` of a tenant's count, given back on drop.
pub struct Taken {
    counts: Arc<Mutex<HashMap<String, u64>>>,
    tenant: String,
    amount: u64,
}

impl TenantCounts {
    fn lock(
        counts: &Mutex<HashMap<String, u64>>,
    ) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        // A panic while the lock is held leaves counts, not broken invariants.
        counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `amount` to `tenant`'s count unless that would pass `cap`; Err with the count
    /// as it stands.
    pub fn take(&self, tenant: &str, amount: u64, cap: u64) -> Result<Taken, u64> {
        let mut counts = Self::lock(&self.counts);
        let held = counts.get(tenant).copied().unwrap_or(0);
        if held + amount > cap {
            return Err(held);
        }
        counts.insert(tenant.to_string(), held + amount);
        Ok(Taken {
            counts: self.counts.clone(),
            tenant: tenant.to_string(),
            amount,
        })
    }

    /// `tenant`'s count now.
    pub fn get(&self, tenant: &str) -> u64 {
        Self::lock(&self.counts).get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut counts = TenantCounts::lock(&self.counts);
        if let Some(n) = counts.get_mut(&self.tenant) {
            *n = n.saturating_sub(self.amount);
            if *n == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_up_to_the_cap_per_tenant_and_gives_back_on_drop() {
        let counts = TenantCounts::default();
        let a = counts.take("a", 3, 5).unwrap();
        assert_eq!(counts.take("a", 3, 5).err(), Some(3), "past the cap");
        let b = counts.take("a", 2, 5).unwrap();
        assert!(counts.take("b", 5, 5).is_ok(), "another tenant's own count");
        drop(a);
        assert_eq!(counts.get("a"), 2);
        drop(b);
        assert_eq!(counts.get("a"), 0);
        assert!(
            TenantCounts::lock(&counts.counts).is_empty(),
            "no empty entries left"
        );
    }
}
