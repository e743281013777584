//! Privacy budgets: a ledger of charges and, per budget, the composed RDP at the budget's
//! orders. A charge is checked against the limit and committed in one IMMEDIATE
//! transaction, so concurrent charges serialise and none can overspend; it is durable
//! before the caller releases anything.

use super::{now, Store, StoreError};
use crate::ops::dp::accountant;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde_json::Value;

pub struct NewBudget {
    pub tenant: String,
    pub name: Option<String>,
    pub epsilon_limit: f64,
    pub delta: f64,
}

#[derive(Clone, Debug)]
pub struct Budget {
    pub id: String,
    pub name: Option<String>,
    pub accountant: String,
    pub epsilon_limit: f64,
    pub delta: f64,
    pub epsilon_spent: f64,
    pub optimal_order: Option<f64>,
    pub charges: u64,
    pub created_at: String,
    pub updated_at: String,
}

/// A release's RDP at each of the given orders.
pub type RdpCurve = Box<dyn Fn(&[f64]) -> Vec<f64> + Send>;

/// What one release costs: its kind and parameters for the history, and its RDP at any
/// set of orders.
pub struct Charge {
    pub kind: &'static str,
    pub params: Value,
    pub rdp: RdpCurve,
}

#[derive(Clone, Debug)]
pub struct ChargeRecord {
    pub seq: u64,
    pub kind: String,
    pub params: Value,
    pub epsilon_after: f64,
    pub status: String,
    pub at: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("no such budget")]
    NotFound,
    #[error("this release would spend ε = {would_be:.6} of a limit of {limit} (spent so far: {spent:.6})")]
    Exhausted {
        spent: f64,
        would_be: f64,
        limit: f64,
    },
    #[error(transparent)]
    Storage(#[from] StoreError),
}

impl From<rusqlite::Error> for BudgetError {
    fn from(e: rusqlite::Error) -> Self {
        BudgetError::Storage(StoreError::new("budget storage", e))
    }
}

const COLUMNS: &str = "id, name, accountant, epsilon_limit, delta, epsilon_spent, optimal_order, \
                       charges, created_at, updated_at";

fn row_to_budget(r: &rusqlite::Row<'_>) -> rusqlite::Result<Budget> {
    Ok(Budget {
        id: r.get(0)?,
        name: r.get(1)?,
        accountant: r.get(2)?,
        epsilon_limit: r.get(3)?,
        delta: r.get(4)?,
        epsilon_spent: r.get(5)?,
        optimal_order: r.get(6)?,
        charges: r.get::<_, i64>(7)? as u64,
        created_at: r.get(8)?,
        updated_at: r.get(9)?,
    })
}

/// RDP vectors as JSON; +∞ (an order a charge does not bound) is stored as null.
fn to_json(v: &[f64]) -> String {
    let v: Vec<Option<f64>> = v.iter().map(|&x| x.is_finite().then_some(x)).collect();
    serde_json::to_string(&v).expect("floats serialise")
}

fn from_json(s: &str) -> Result<Vec<f64>, BudgetError> {
    let v: Vec<Option<f64>> = serde_json::from_str(s)
        .map_err(|e| StoreError::new("budget storage", format!("corrupt RDP vector: {e}")))?;
    Ok(v.into_iter().map(|x| x.unwrap_or(f64::INFINITY)).collect())
}

fn new_id() -> Result<String, BudgetError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)
        .map_err(|e| StoreError::new("budget ids", format!("no OS entropy: {e}")))?;
    Ok(format!(
        "bud_{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    ))
}

fn find(conn: &Connection, tenant: &str, id: &str) -> Result<Budget, BudgetError> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM budgets WHERE id = ?1 AND tenant = ?2"),
        params![id, tenant],
        row_to_budget,
    )
    .optional()?
    .ok_or(BudgetError::NotFound)
}

impl Store {
    pub fn create_budget(&self, b: NewBudget) -> Result<Budget, BudgetError> {
        let id = new_id()?;
        let orders = accountant::budget_orders();
        let at = now();
        self.with(|conn| {
            conn.execute(
                "INSERT INTO budgets (id, tenant, name, accountant, epsilon_limit, delta, orders, \
                 rdp, epsilon_spent, optimal_order, charges, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, 'rdp', ?4, ?5, ?6, ?7, 0, NULL, 0, ?8, ?8)",
                params![
                    id,
                    b.tenant,
                    b.name,
                    b.epsilon_limit,
                    b.delta,
                    to_json(&orders),
                    to_json(&vec![0.0; orders.len()]),
                    at
                ],
            )?;
            find(conn, &b.tenant, &id)
        })
    }

    pub fn budget(&self, tenant: &str, id: &str) -> Result<Budget, BudgetError> {
        self.with(|conn| find(conn, tenant, id))
    }

    pub fn budgets(&self, tenant: &str) -> Result<Vec<Budget>, BudgetError> {
        self.with(|conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {COLUMNS} FROM budgets WHERE tenant = ?1 ORDER BY created_at, id"
            ))?;
            let rows = stmt.query_map(params![tenant], row_to_budget)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    /// The latest `limit` charges, oldest first.
    pub fn charges(
        &self,
        tenant: &str,
        id: &str,
        limit: usize,
    ) -> Result<Vec<ChargeRecord>, BudgetError> {
        self.with(|conn| {
            find(conn, tenant, id)?;
            let mut stmt = conn.prepare(
                "SELECT seq, kind, params, epsilon_after, status, at FROM budget_charges \
                 WHERE budget_id = ?1 ORDER BY seq DESC LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![id, limit as i64], |r| {
                let params: String = r.get(2)?;
                Ok(ChargeRecord {
                    seq: r.get::<_, i64>(0)? as u64,
                    kind: r.get(1)?,
                    params: serde_json::from_str(&params).unwrap_or(Value::Null),
                    epsilon_after: r.get(3)?,
                    status: r.get(4)?,
                    at: r.get(5)?,
                })
            })?;
            let mut out = rows.collect::<Result<Vec<_>, _>>()?;
            out.reverse();
            Ok(out)
        })
    }

    /// Adds `charge` to the budget if the total stays within its limit; returns the
    /// budget after it and the charge's sequence number. Committed durably on return.
    pub fn charge(
        &self,
        tenant: &str,
        id: &str,
        charge: &Charge,
    ) -> Result<(Budget, u64), BudgetError> {
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let b = find(&tx, tenant, id)?;
            let (orders, rdp): (String, String) = tx.query_row(
                "SELECT orders, rdp FROM budgets WHERE id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let orders = from_json(&orders)?;
            let step = (charge.rdp)(&orders);
            let total: Vec<f64> = from_json(&rdp)?
                .iter()
                .zip(&step)
                .map(|(a, s)| a + s)
                .collect();
            let (eps, order) = accountant::epsilon_from_rdp(&orders, &total, b.delta);
            // NaN (a broken curve) is refused too.
            if eps.is_nan() || eps > b.epsilon_limit {
                return Err(BudgetError::Exhausted {
                    spent: b.epsilon_spent,
                    would_be: eps,
                    limit: b.epsilon_limit,
                });
            }
            let seq: i64 = tx.query_row(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM budget_charges WHERE budget_id = ?1",
                params![id],
                |r| r.get(0),
            )?;
            let at = now();
            tx.execute(
                "INSERT INTO budget_charges (budget_id, seq, kind, params, rdp, epsilon_after, \
                 status, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'charged', ?7)",
                params![
                    id,
                    seq,
                    charge.kind,
                    charge.params.to_string(),
                    to_json(&step),
                    eps,
                    at
                ],
            )?;
            tx.execute(
                "UPDATE budgets SET rdp = ?2, epsilon_spent = ?3, optimal_order = ?4, \
                 charges = charges + 1, updated_at = ?5 WHERE id = ?1",
                params![id, to_json(&total), eps, order, at],
            )?;
            let b = find(&tx, tenant, id)?;
            tx.commit()?;
            Ok((b, seq as u64))
        })
    }

    /// Takes back a charge whose release never left the server (the job failed before
    /// producing anything). The total is recomputed from the remaining charges in order.
    pub fn refund(&self, tenant: &str, id: &str, seq: u64) -> Result<Budget, BudgetError> {
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let b = find(&tx, tenant, id)?;
            let orders: String = tx.query_row(
                "SELECT orders FROM budgets WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )?;
            let orders = from_json(&orders)?;
            tx.execute(
                "UPDATE budget_charges SET status = 'refunded' WHERE budget_id = ?1 AND seq = ?2",
                params![id, seq as i64],
            )?;
            let mut total = vec![0.0; orders.len()];
            let mut charged = 0i64;
            {
                let mut stmt = tx.prepare(
                    "SELECT rdp FROM budget_charges WHERE budget_id = ?1 AND status = 'charged' \
                     ORDER BY seq",
                )?;
                let rows = stmt.query_map(params![id], |r| r.get::<_, String>(0))?;
                for rdp in rows {
                    for (t, s) in total.iter_mut().zip(from_json(&rdp?)?) {
                        *t += s;
                    }
                    charged += 1;
                }
            }
            let (eps, order) = if charged == 0 {
                (0.0, None)
            } else {
                let (e, o) = accountant::epsilon_from_rdp(&orders, &total, b.delta);
                (e, Some(o))
            };
            tx.execute(
                "UPDATE budgets SET rdp = ?2, epsilon_spent = ?3, optimal_order = ?4, \
                 charges = ?5, updated_at = ?6 WHERE id = ?1",
                params![id, to_json(&total), eps, order, charged, now()],
            )?;
            let b = find(&tx, tenant, id)?;
            tx.commit()?;
            Ok(b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn temp_store(tag: &str) -> (Store, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("gpu-ops-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (Store::open(&dir).unwrap(), dir)
    }

    fn gaussian_step(sigma: f64) -> Charge {
        Charge {
            kind: "test",
            params: serde_json::json!({"sigma": sigma}),
            rdp: Box::new(move |orders| {
                orders
                    .iter()
                    .map(|&a| accountant::gaussian_rdp(a, 1.0, sigma))
                    .collect()
            }),
        }
    }

    #[test]
    fn charges_accumulate_refuse_past_the_limit_and_persist() {
        let (store, dir) = temp_store("limit");
        let b = store
            .create_budget(NewBudget {
                tenant: "t".into(),
                name: None,
                epsilon_limit: 3.0,
                delta: 1e-5,
            })
            .unwrap();
        let mut last = 0.0;
        let mut accepted = 0;
        loop {
            match store.charge("t", &b.id, &gaussian_step(4.0)) {
                Ok((after, _)) => {
                    assert!(after.epsilon_spent > last && after.epsilon_spent <= 3.0);
                    last = after.epsilon_spent;
                    accepted += 1;
                }
                Err(BudgetError::Exhausted {
                    spent,
                    would_be,
                    limit,
                }) => {
                    assert_eq!((spent, limit), (last, 3.0));
                    assert!(would_be > 3.0);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(accepted >= 2);
        assert!(matches!(
            store.budget("other", &b.id),
            Err(BudgetError::NotFound)
        ));
        drop(store);
        let again = Store::open(&dir).unwrap().budget("t", &b.id).unwrap();
        assert_eq!((again.epsilon_spent, again.charges), (last, accepted));
    }

    #[test]
    fn concurrent_charges_never_overspend_and_refunds_recompute() {
        let (store, _dir) = temp_store("race");
        let store = Arc::new(store);
        let b = store
            .create_budget(NewBudget {
                tenant: "".into(),
                name: Some("race".into()),
                epsilon_limit: 2.0,
                delta: 1e-5,
            })
            .unwrap();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (store, id) = (store.clone(), b.id.clone());
                std::thread::spawn(move || {
                    (0..20)
                        .filter(|_| store.charge("", &id, &gaussian_step(6.0)).is_ok())
                        .count()
                })
            })
            .collect();
        let ok: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let after = store.budget("", &b.id).unwrap();
        assert!(after.epsilon_spent <= 2.0 && ok as u64 == after.charges && ok > 0);
        let history = store.charges("", &b.id, 1000).unwrap();
        assert_eq!(history.len(), ok);
        let refunded = store.refund("", &b.id, history[0].seq).unwrap();
        assert_eq!(refunded.charges, after.charges - 1);
        assert!(refunded.epsilon_spent < after.epsilon_spent);
    }
}
