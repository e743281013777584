//! Why an array was refused, or could not be stored or read.

use crate::store::StoreError;

#[derive(Debug, PartialEq, Eq)]
pub enum ArrayError {
    /// The tenant's arrays would pass its byte quota.
    QuotaExceeded {
        need: u64,
        used: u64,
        quota: u64,
    },
    /// The tenant holds `--max-tenant-arrays` arrays already.
    TooMany {
        count: usize,
        cap: usize,
    },
    /// All arrays would pass the server's cap.
    Full {
        need: u64,
        used: u64,
        cap: u64,
    },
    /// All tenants hold `--max-arrays` arrays already.
    FullCount {
        count: usize,
        cap: usize,
    },
    /// An embedding table: the tenant's tables would pass `--max-tenant-embedding-mib`.
    TableQuotaExceeded {
        need: u64,
        used: u64,
        quota: u64,
    },
    /// An embedding table: the tenant holds `--max-tenant-embedding-tables` already.
    TablesTooMany {
        count: usize,
        cap: usize,
    },
    /// An embedding table: all tables would pass `--max-embedding-tables-mib`.
    TablesFull {
        need: u64,
        used: u64,
        cap: u64,
    },
    Io(String),
    /// A result held only on a device that no longer has it.
    Lost {
        id: String,
        why: String,
    },
    /// A result held only on a device whose leases stayed taken for `waited`: not read
    /// back, still held there.
    DeviceBusy {
        id: String,
        waited: std::time::Duration,
    },
    /// The shared catalog could not be read or written (`unavailable`: it could not be
    /// reached; a retry may succeed).
    Storage {
        message: String,
        unavailable: bool,
    },
}

impl From<StoreError> for ArrayError {
    fn from(e: StoreError) -> Self {
        ArrayError::Storage {
            unavailable: e.is_unavailable(),
            message: e.to_string(),
        }
    }
}

impl ArrayError {
    /// The refusal's label in `gpu_ops_arrays_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            ArrayError::QuotaExceeded { .. } => "tenant_bytes",
            ArrayError::TooMany { .. } => "tenant_count",
            ArrayError::Full { .. } => "server_bytes",
            ArrayError::FullCount { .. } => "server_count",
            ArrayError::TableQuotaExceeded { .. } => "table_tenant_bytes",
            ArrayError::TablesTooMany { .. } => "table_tenant_count",
            ArrayError::TablesFull { .. } => "table_server_bytes",
            ArrayError::Io(_) => "io",
            ArrayError::Lost { .. } => "lost",
            ArrayError::DeviceBusy { .. } => "device_busy",
            ArrayError::Storage { .. } => "storage",
        }
    }
}

impl std::fmt::Display for ArrayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArrayError::QuotaExceeded { need, used, quota } => write!(
                f,
                "the array takes {need} bytes; the tenant's arrays take {used} of {quota} (--max-tenant-array-mib)"
            ),
            ArrayError::TooMany { count, cap } => write!(
                f,
                "the tenant has {count} arrays of at most {cap} (--max-tenant-arrays); delete one first"
            ),
            ArrayError::Full { need, used, cap } => write!(
                f,
                "the array takes {need} bytes; all arrays take {used} of {cap} (--max-arrays-mib)"
            ),
            ArrayError::FullCount { count, cap } => write!(
                f,
                "the server holds {count} arrays of at most {cap} (--max-arrays)"
            ),
            ArrayError::TableQuotaExceeded { need, used, quota } => write!(
                f,
                "the table takes {need} bytes; the tenant's tables take {used} of {quota} (--max-tenant-embedding-mib)"
            ),
            ArrayError::TablesTooMany { count, cap } => write!(
                f,
                "the tenant has {count} tables of at most {cap} (--max-tenant-embedding-tables); delete one first"
            ),
            ArrayError::TablesFull { need, used, cap } => write!(
                f,
                "the table takes {need} bytes; all tables take {used} of {cap} (--max-embedding-tables-mib)"
            ),
            ArrayError::Io(e) => write!(f, "{e}"),
            ArrayError::Lost { id, why } => write!(
                f,
                "{id} was held only on a device, which no longer has it ({why}); it is gone"
            ),
            ArrayError::DeviceBusy { id, waited } => write!(
                f,
                "{id} is held only on a device, which had no lease free for {:.1} s (--job-timeout); \
                 it is still held there: read it again later",
                waited.as_secs_f64()
            ),
            ArrayError::Storage { message, .. } => write!(f, "{message}"),
        }
    }
}
