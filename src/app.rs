//! What every role of one process shares: configuration, database, metrics, identity, shutdown.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::store::Db;

/// Shared process context (cheap to clone).
#[derive(Clone)]
pub struct Ctx(Arc<Shared>);

pub struct Shared {
    pub config: Config,
    pub db: Db,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    /// UUID v4 minted once per process: the cell incarnation (protocol.md §12).
    pub incarnation: String,
    /// Process start, epoch ms.
    pub started_at: i64,
    /// Cancelled when SIGTERM/SIGINT arrives: stop accepting, drain, finish.
    pub shutdown: CancellationToken,
}

impl std::ops::Deref for Ctx {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl Ctx {
    pub fn new(config: Config, db: Db, metrics: Arc<Metrics>) -> Ctx {
        let readiness = Readiness::new(db.clone(), config.readiness_sql_grace_ms);
        Ctx(Arc::new(Shared {
            config,
            db,
            metrics,
            readiness,
            incarnation: uuid::Uuid::new_v4().to_string(),
            started_at: crate::clock::now_ms(),
            shutdown: CancellationToken::new(),
        }))
    }

    pub fn shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }
}
