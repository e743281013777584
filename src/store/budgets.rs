//! Privacy budgets: a ledger of charges and, per budget, the composed RDP at the budget's
//! orders. A charge is checked against the limit and committed in one transaction that
//! holds the budget's lock (SQLite: the database's write lock; PostgreSQL: the budget's
//! row, `FOR UPDATE`), so concurrent charges of one budget serialise, through every
//! replica, and none can overspend; it is durable before the caller releases anything.
//! A replica killed mid-charge never committed it: its transaction rolls back with its
//! connection, and the lock passes on.

use super::database::{DbError, Param, Row, Tx};
use super::{now, Store, StoreError};
use crate::ops::dp::accountant;
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

impl From<DbError> for BudgetError {
    fn from(e: DbError) -> Self {
        BudgetError::Storage(StoreError::from_db(PART, e))
    }
}

const PART: &str = "budget storage";

const COLUMNS: &str = "id, name, accountant, epsilon_limit, delta, epsilon_spent, optimal_order, \
                       charges, created_at, updated_at, orders, rdp";

/// A budget's row: what the API shows, and its orders and composed RDP.
struct Stored {
    budget: Budget,
    orders: Vec<f64>,
    rdp: Vec<f64>,
}

fn stored(r: &Row) -> Result<Stored, BudgetError> {
    Ok(Stored {
        budget: Budget {
            id: r.text(0)?,
            name: r.opt_text(1)?,
            accountant: r.text(2)?,
            epsilon_limit: r.f64(3)?,
            delta: r.f64(4)?,
            epsilon_spent: r.f64(5)?,
            optimal_order: r.opt_f64(6)?,
            charges: r.u64(7)?,
            created_at: r.text(8)?,
            updated_at: r.text(9)?,
        },
        orders: from_json(&r.text(10)?)?,
        rdp: from_json(&r.text(11)?)?,
    })
}

/// RDP vectors as JSON; +∞ (an order a charge does not bound) is stored as null.
fn to_json(v: &[f64]) -> String {
    let v: Vec<Option<f64>> = v.iter().map(|&x| x.is_finite().then_some(x)).collect();
    serde_json::to_string(&v).expect("floats serialise")
}

fn from_json(s: &str) -> Result<Vec<f64>, BudgetError> {
    let v: Vec<Option<f64>> = serde_json::from_str(s)
        .map_err(|e| StoreError::new(PART, format!("corrupt RDP vector: {e}")))?;
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

/// The tenant's budget `id`; with `lock`, held until the transaction ends.
fn find(tx: &mut Tx<'_>, tenant: &str, id: &str, lock: bool) -> Result<Stored, BudgetError> {
    let lock = if lock { tx.lock_rows() } else { "" };
    let row = tx.query_opt(
        &format!("SELECT {COLUMNS} FROM budgets WHERE id = ?1 AND tenant = ?2{lock}"),
        &[Param::Text(id), Param::Text(tenant)],
    )?;
    stored(&row.ok_or(BudgetError::NotFound)?)
}

/// Writes a budget's composed RDP and the ε it gives; `charges` is the count of charges
/// standing. Returns the budget as written.
fn set_total(
    tx: &mut Tx<'_>,
    id: &str,
    total: &[f64],
    (eps, order): (f64, Option<f64>),
    charges: u64,
    at: &str,
) -> Result<Budget, BudgetError> {
    let row = tx.query_opt(
        &format!(
            "UPDATE budgets SET rdp = ?2, epsilon_spent = ?3, optimal_order = ?4, charges = ?5, \
             updated_at = ?6 WHERE id = ?1 RETURNING {COLUMNS}"
        ),
        &[
            Param::Text(id),
            Param::Text(&to_json(total)),
            Param::F64(eps),
            Param::OptF64(order),
            Param::I64(charges as i64),
            Param::Text(at),
        ],
    )?;
    Ok(stored(&row.ok_or(BudgetError::NotFound)?)?.budget)
}

impl Store {
    pub fn create_budget(&self, b: NewBudget) -> Result<Budget, BudgetError> {
        let id = new_id()?;
        let orders = accountant::budget_orders();
        let at = now();
        self.shared.write(PART, |tx| {
            tx.exec(
                "INSERT INTO budgets (id, tenant, name, accountant, epsilon_limit, delta, orders, \
                 rdp, epsilon_spent, optimal_order, charges, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, 'rdp', ?4, ?5, ?6, ?7, 0, NULL, 0, ?8, ?8)",
                &[
                    Param::Text(&id),
                    Param::Text(&b.tenant),
                    Param::OptText(b.name.as_deref()),
                    Param::F64(b.epsilon_limit),
                    Param::F64(b.delta),
                    Param::Text(&to_json(&orders)),
                    Param::Text(&to_json(&vec![0.0; orders.len()])),
                    Param::Text(&at),
                ],
            )?;
            Ok(find(tx, &b.tenant, &id, false)?.budget)
        })
    }

    pub fn budget(&self, tenant: &str, id: &str) -> Result<Budget, BudgetError> {
        self.shared
            .read(PART, |tx| Ok(find(tx, tenant, id, false)?.budget))
    }

    pub fn budgets(&self, tenant: &str) -> Result<Vec<Budget>, BudgetError> {
        self.shared.read(PART, |tx| {
            tx.query(
                &format!("SELECT {COLUMNS} FROM budgets WHERE tenant = ?1 ORDER BY created_at, id"),
                &[Param::Text(tenant)],
            )?
            .iter()
            .map(|r| Ok(stored(r)?.budget))
            .collect()
        })
    }

    /// The latest `limit` charges, oldest first.
    pub fn charges(
        &self,
        tenant: &str,
        id: &str,
        limit: usize,
    ) -> Result<Vec<ChargeRecord>, BudgetError> {
        self.shared.read(PART, |tx| {
            find(tx, tenant, id, false)?;
            let rows = tx.query(
                "SELECT seq, kind, params, epsilon_after, status, at FROM budget_charges \
                 WHERE budget_id = ?1 ORDER BY seq DESC LIMIT ?2",
                &[
                    Param::Text(id),
                    Param::I64(limit.min(i64::MAX as usize) as i64),
                ],
            )?;
            let mut out = rows
                .iter()
                .map(|r| {
                    Ok(ChargeRecord {
                        seq: r.u64(0)?,
                        kind: r.text(1)?,
                        params: serde_json::from_str(&r.text(2)?).unwrap_or(Value::Null),
                        epsilon_after: r.f64(3)?,
                        status: r.text(4)?,
                        at: r.text(5)?,
                    })
                })
                .collect::<Result<Vec<_>, BudgetError>>()?;
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
        self.shared.write(PART, |tx| {
            let b = find(tx, tenant, id, true)?;
            let step = (charge.rdp)(&b.orders);
            let total: Vec<f64> = b.rdp.iter().zip(&step).map(|(a, s)| a + s).collect();
            let (eps, order) = accountant::epsilon_from_rdp(&b.orders, &total, b.budget.delta);
            // NaN (a broken curve) is refused too.
            if eps.is_nan() || eps > b.budget.epsilon_limit {
                return Err(BudgetError::Exhausted {
                    spent: b.budget.epsilon_spent,
                    would_be: eps,
                    limit: b.budget.epsilon_limit,
                });
            }
            // Under the budget's lock, so no other charge takes this number. One statement
            // each for the ledger entry and the total: few round trips hold the lock.
            let at = now();
            let seq = tx
                .query_opt(
                    "INSERT INTO budget_charges (budget_id, seq, kind, params, rdp, epsilon_after, \
                     status, at) SELECT ?1, COALESCE(MAX(seq), 0) + 1, ?2, ?3, ?4, ?5, 'charged', ?6 \
                     FROM budget_charges WHERE budget_id = ?1 RETURNING seq",
                    &[
                        Param::Text(id),
                        Param::Text(charge.kind),
                        Param::Text(&charge.params.to_string()),
                        Param::Text(&to_json(&step)),
                        Param::F64(eps),
                        Param::Text(&at),
                    ],
                )?
                .ok_or_else(|| StoreError::new(PART, "the ledger entry was not written"))?
                .u64(0)?;
            let after = set_total(tx, id, &total, (eps, Some(order)), b.budget.charges + 1, &at)?;
            Ok((after, seq))
        })
    }

    /// Takes back a charge whose release never left the server (the job failed before
    /// producing anything). The total is recomputed from the remaining charges in order.
    pub fn refund(&self, tenant: &str, id: &str, seq: u64) -> Result<Budget, BudgetError> {
        self.shared.write(PART, |tx| {
            let b = find(tx, tenant, id, true)?;
            tx.exec(
                "UPDATE budget_charges SET status = 'refunded' WHERE budget_id = ?1 AND seq = ?2",
                &[Param::Text(id), Param::I64(seq as i64)],
            )?;
            let mut total = vec![0.0; b.orders.len()];
            let standing = tx.query(
                "SELECT rdp FROM budget_charges WHERE budget_id = ?1 AND status = 'charged' \
                 ORDER BY seq",
                &[Param::Text(id)],
            )?;
            for r in &standing {
                for (t, s) in total.iter_mut().zip(from_json(&r.text(0)?)?) {
                    *t += s;
                }
            }
            let (eps, order) = if standing.is_empty() {
                (0.0, None)
            } else {
                let (e, o) = accountant::epsilon_from_rdp(&b.orders, &total, b.budget.delta);
                (e, Some(o))
            };
            set_total(tx, id, &total, (eps, order), standing.len() as u64, &now())
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
