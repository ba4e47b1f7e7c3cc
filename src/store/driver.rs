//! What each backend implements (`postgres`, `sqlite`) and `backend::Db` dispatches to: the
//! transaction trait and the advisory-lock key of a scope. Below both, so neither backend names
//! the dispatcher.

use super::{DbError, Row, Value};

/// What a backend's open transaction must offer. Statements use Postgres syntax; a backend that
/// cannot take row locks treats the locking clauses and scopes as no-ops (ARCHITECTURE.md).
#[allow(async_fn_in_trait)]
pub trait Backend {
    async fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError>;
    async fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError>;
    async fn execute_batch(&mut self, sql: &str) -> Result<(), DbError>;
    /// `SET LOCAL lock_timeout` for the rest of the transaction.
    async fn set_lock_timeout(&mut self, ms: u64) -> Result<(), DbError>;
    /// Waits for the transaction-scoped advisory lock named `scope`.
    async fn scope_lock(&mut self, scope: &str) -> Result<(), DbError>;
    /// Takes the advisory lock named `scope` if free.
    async fn try_scope_lock(&mut self, scope: &str) -> Result<bool, DbError>;
    /// Runs the transaction's last statement and commits, in one round trip where the backend
    /// can pipeline; the later `commit` is then a no-op and any further statement an error.
    async fn finish_with(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError>;
    async fn commit(self) -> Result<(), DbError>;
    async fn rollback(self);
}

/// The advisory-lock key of a scope: the first 8 bytes of SHA-256(scope), big-endian signed
/// (ARCHITECTURE.md).
pub fn scope_key(scope: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(scope.as_bytes());
    i64::from_be_bytes(d[..8].try_into().unwrap())
}
