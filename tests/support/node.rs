//! A single node: an in-process `orca-relay serve` (role `all` unless told otherwise) on an
//! ephemeral port, over SQLite and, when `ORCA_RELAY_TEST_POSTGRES_URL` is set, Postgres
//! ([`dbs`]); the test clock ([`jump`]); the host helpers of [`super::clients`] re-exported.

pub use super::common;

use std::time::Duration;

use orca_relay::server::Running;
use orca_relay::store::testing::{backends, temp_dir, TestDb};

#[allow(unused_imports)]
pub use common::time::{real_deadline, real_eventually, ManualTime};
#[allow(unused_imports)]
pub use common::wait::{eventually, eventually_async, wait_until};

pub const SIGNING: &str = "0123456789abcdef0123456789abcdef";
pub const SELF_HOSTED: &str = "self-hosted-key-self-hosted-key-0001";
pub const ADMIN: &str = "admin-token-admin-token-admin-token-0001";
pub const CLUSTER: &str = "cluster-key-cluster-key-cluster-key-0001";

pub struct Server {
    pub running: Running,
    pub url: String,
    pub public_url: String,
    pub cell_url: String,
}

/// Starts a server on `db` (a `TestDb` URL) with extra flags.
pub async fn start_on(db_url: &str, extra: &[&str]) -> Server {
    let dir = temp_dir("orca-relay-cell");
    let data = dir.display().to_string();
    let mut args = vec![
        "orca-relay",
        "--listen",
        "127.0.0.1:0",
        "--role",
        "all",
        "--data-dir",
        &data,
        "--database-url",
        db_url,
        "--assignment-signing-key",
        SIGNING,
        "--self-hosted-key",
        SELF_HOSTED,
        "--admin-token",
        ADMIN,
        "--cluster-key",
        CLUSTER,
    ];
    args.extend_from_slice(extra);
    let running = common::serve::start(&args).await;
    Server {
        url: format!("http://{}", running.addr),
        public_url: running.ctx.config.public_url.clone(),
        cell_url: running.ctx.config.cell_url.clone(),
        running,
    }
}

impl Server {
    /// `f` of the cell's session for `key`, if it has one (the test's view of server state for
    /// "wait until the cell saw it" conditions).
    pub fn session<T>(
        &self,
        key: &orca_relay::store::assignments::HostKey,
        f: impl FnOnce(&orca_relay::cell::session::Inner) -> T,
    ) -> Option<T> {
        let cell = self.running.cell.as_ref().expect("cell role");
        let session = cell.registry().get(key)?;
        let st = session.lock();
        Some(f(&st))
    }

    /// The state of the cell's session for `key`, if it has one.
    pub fn session_state(
        &self,
        key: &orca_relay::store::assignments::HostKey,
    ) -> Option<orca_relay::cell::session::State> {
        self.session(key, |st| st.state)
    }
}

/// Every backend to run a behaviour test on.
pub async fn dbs() -> Vec<TestDb> {
    backends().await
}

pub const SEC: Duration = Duration::from_secs(1);

pub use super::clients::{barrier, raw_upgrade, Host};
pub use super::common::time::jump;
