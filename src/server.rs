//! One listener for every role of the process, and the shutdown sequence (docs/operations.md).
//!
//! Connections are served by hyper directly: WebSocket leg paths go to the cell (or the director's
//! invite redirect) with the raw upgrade gates of docs/reference/websocket.md; everything else goes to the warp
//! filter tree assembled here from the roles this process runs. A path that belongs to a role this
//! process does not run answers `404 {"error":"<role>_only"}`.

mod busy;
mod keepalive;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;
use tower_service::Service;
use warp::filters::BoxedFilter;
use warp::Filter;

use crate::app::Ctx;
use crate::cell::heartbeat_client::HttpHeartbeat;
use crate::cell::Cell;
use crate::config::Config;
use crate::contract::errors;
use crate::contract::heartbeat::HeartbeatSink;
use crate::director::Director;
use crate::http::{self as h, PeerAddr, Response};
use crate::logging;
use crate::metrics::Metrics;
use crate::push::Push;
use crate::readiness::Verdict;
use crate::store::{migrate, Db};

/// Paths served only by the director role (exact, or prefixes ending in `/`).
const DIRECTOR_PATHS: &[&str] = &[
    "/v1/host-token",
    "/v1/assign",
    "/v1/resolve",
    "/v1/regions",
    "/v1/admin/cell-heartbeat",
    "/v1/admin/cell-rehome-status",
    "/v1/admin/cells",
    "/v1/admin/cell-state",
    "/v1/admin/cell-fence",
    "/v1/admin/cell-status",
    "/v1/admin/evacuate",
    "/v1/admin/evacuate-cell",
    "/v1/admin/migration-complete",
    "/v1/admin/host-whereabouts",
    "/v1/admin/regional-rehome-control",
    "/v1/admin/overview",
];
/// Paths served only by the cell role.
const CELL_PATHS: &[&str] = &["/v1/admin/drain", "/v1/admin/host-idle-rehome"];
/// Paths served only by the push role.
const PUSH_PATHS: &[&str] = &[
    "/v1/host/challenge",
    "/v1/host/session",
    "/v1/devices",
    "/v1/devices/",
    "/v1/send",
];

fn path_in(path: &str, table: &[&str]) -> bool {
    table
        .iter()
        .any(|p| path == *p || (p.ends_with('/') && path.starts_with(p)))
}

/// Is `path` one of the three WebSocket legs (docs/reference/websocket.md)?
pub fn is_leg_path(path: &str) -> bool {
    path == "/v1/host/control"
        || path.starts_with("/v1/host/control")
        || path.starts_with("/v1/host/data/")
        || path == "/v1/host/data"
        || path.starts_with("/v1/connect/")
        || path == "/v1/connect"
}

/// A started server: its address, its context, and the roles it runs.
pub struct Running {
    pub addr: SocketAddr,
    pub ctx: Ctx,
    pub director: Option<Arc<Director>>,
    pub cell: Option<Arc<Cell>>,
    pub push: Option<Arc<Push>>,
    accept: tokio::task::JoinHandle<()>,
    http: TaskTracker,
}

/// Binds, migrates, starts the roles and serves until [`Running::shutdown`].
pub async fn start(mut config: Config) -> Result<Running, String> {
    // The store logs nothing itself: its reports become log events here.
    crate::store::observe(crate::logging::store_event);
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("ORCA_RELAY_LISTEN: cannot bind {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    config.adopt_bound_port(addr.port());

    let db = open_database(&config).await?;
    let metrics = Arc::new(Metrics::new());
    db.observe_with(metrics.db_seconds.clone(), metrics.db_errors.clone());
    let ctx = Ctx::new(config, db, metrics);
    let roles = ctx.config.roles;
    let tls = start_tls(&ctx)?;
    if let Some(t) = &tls {
        // Not ready (no `/ready`, no ready heartbeat) while the listener has no certificate.
        let resolver = t.resolver.clone();
        ctx.readiness
            .gate_on_tls(Box::new(move || resolver.current().is_some()));
    }

    let director = if roles.director {
        Some(Director::start(ctx.clone()).await?)
    } else {
        None
    };
    let cell = if roles.cell {
        Some(Cell::start(ctx.clone(), heartbeat_sink(&ctx, director.as_ref())).await?)
    } else {
        None
    };
    let push = if roles.push {
        Some(Push::start(ctx.clone()).await?)
    } else {
        None
    };
    if let (Some(d), Some(p)) = (&director, &push) {
        d.attach_push_overview(p.clone());
    }

    let filter = routes(&ctx, director.as_ref(), cell.as_ref(), push.as_ref());
    if let Some(maddr) = ctx.config.metrics_listen {
        let metrics_tls = tls
            .clone()
            .filter(|_| ctx.config.tls.as_ref().is_some_and(|t| t.metrics_tls));
        spawn_metrics_listener(ctx.clone(), maddr, metrics_tls).await?;
    }
    // Announced once every listener is bound: whoever waits for this line can use them all.
    announce(&ctx, addr, tls.is_some());
    let http = TaskTracker::new();
    let accept = ctx.spawn(
        "accept",
        accept_loop(
            listener,
            ctx.clone(),
            filter,
            director.clone(),
            cell.clone(),
            http.clone(),
            tls,
        ),
    );
    Ok(Running {
        addr,
        ctx,
        director,
        cell,
        push,
        accept,
        http,
    })
}

/// Opens the database and brings it to this release: a director or push process (not in
/// validation mode) applies the migrations and settles a restored backup; any other process only
/// checks the schema is not newer than it knows.
async fn open_database(config: &Config) -> Result<Db, String> {
    let read_only = config.push.mode == crate::config::PushMode::Validation;
    let db = Db::connect_with(&config.database_url, config.database_pool_max, read_only)
        .await
        .map_err(|e| format!("ORCA_RELAY_DATABASE_URL: cannot open the database: {e}"))?;
    let owns_schema = config.roles.director || config.roles.push;
    if owns_schema && !read_only {
        migrate::apply(&db, crate::clock::now_ms())
            .await
            .map_err(|e| format!("ORCA_RELAY_DATABASE_URL: {e}"))?;
    } else {
        // A process that does not migrate still refuses a schema newer than it knows.
        let found = migrate::check(&db)
            .await
            .map_err(|e| format!("ORCA_RELAY_DATABASE_URL: {e}"))?;
        let known = migrate::known_version(db.kind());
        if found < known {
            log::warn!(
                "[orca-relay] database schema at version {found}, this release expects {known}: \
                 a director or `orca-relay migrate` applies the rest"
            );
        }
    }
    if owns_schema && !read_only {
        // A database restored from `orca-relay backup`: advance epochs and generations past what
        // could have been issued since the copy, once, before any role starts (store::restore).
        let settled = crate::store::restore::settle(&db, crate::clock::now_ms())
            .await
            .map_err(|e| {
                format!("ORCA_RELAY_DATABASE_URL: settling the restored backup failed: {e}")
            })?;
        if let Some(s) = settled {
            logging::event(
                "orca_relay_restore_settled",
                serde_json::json!({"takenAt": s.taken_at, "epochJump": s.jump, "hosts": s.hosts}),
            );
        }
    }
    Ok(db)
}

/// Logs the start: the process-started event, the listening address and the advertised URLs
/// (with the plain-http warning).
fn announce(ctx: &Ctx, addr: SocketAddr, tls: bool) {
    let roles = ctx.config.roles;
    if let Some(path) = &ctx.config.secrets_file {
        log::info!("[orca-relay] secrets file: {}", path.display());
    }
    logging::event(
        "orca_relay_process_started",
        serde_json::json!({
            "roles": roles.names(),
            "cellId": if roles.cell { Some(&ctx.config.cell_id) } else { None },
            "incarnation": ctx.incarnation,
            "database": ctx.config.database_kind(),
            "listen": addr.to_string(),
        }),
    );
    let scheme = if tls { "https" } else { "http" };
    log::info!("[orca-relay] listening on {scheme}://{addr}");
    let (urls, plain) = crate::advertise::startup_lines(
        addr,
        &ctx.config.public_url,
        roles.cell.then_some(ctx.config.cell_url.as_str()),
    );
    log::info!("{urls}");
    if let Some(w) = plain {
        log::warn!("{w}");
    }
}

/// Where the local cell's heartbeats go: the director at `ORCA_RELAY_DIRECTOR_URL` over HTTP if
/// configured, else this process's director in-process, else nowhere.
fn heartbeat_sink(ctx: &Ctx, director: Option<&Arc<Director>>) -> Option<Arc<dyn HeartbeatSink>> {
    match HttpHeartbeat::from_config(&ctx.config) {
        Some(http) => Some(Arc::new(http)),
        None => director.map(|d| d.clone() as Arc<dyn HeartbeatSink>),
    }
}

impl Running {
    /// The shutdown sequence: refuse new work, drain the cell, let push deliveries and in-flight
    /// requests finish, stop loops, close the database. Returns the exit status.
    pub async fn shutdown(self) -> i32 {
        logging::event(
            "orca_relay_process_stopping",
            serde_json::json!({ "roles": self.ctx.config.roles.names() }),
        );
        self.ctx.shutdown.cancel();
        let cell = self.cell.clone();
        let push = self.push.clone();
        let (_, push_ok) = tokio::join!(
            async {
                if let Some(c) = &cell {
                    c.shutdown().await;
                }
            },
            async {
                match &push {
                    Some(p) => p.shutdown().await,
                    None => true,
                }
            }
        );
        if let Some(d) = &self.director {
            d.shutdown().await;
        }
        self.http.close();
        let _ = tokio::time::timeout(Duration::from_secs(8), self.http.wait()).await;
        self.accept.abort();
        // Background tasks end with the shutdown token; activity releases must reach the store
        // before the database closes.
        self.ctx.wait_tasks(TASKS_WAIT).await;
        self.ctx.db.close();
        if push_ok {
            0
        } else {
            1
        }
    }
}

/// How long shutdown waits for the process's background tasks before closing the database.
const TASKS_WAIT: Duration = Duration::from_secs(3);

/// `orca-relay serve`: start, wait for SIGTERM/SIGINT, shut down within 10 s.
pub async fn run(config: Config) -> i32 {
    // Handlers first: a signal that arrives while starting must not kill the process untidily.
    let signal = wait_for_signal();
    let running = match start(config).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    signal.await;
    // The hard deadline: whatever is still running after 10 s is abandoned.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(
            crate::contract::limits::SHUTDOWN_EXIT_MS,
        ));
        log::error!("[orca-relay] shutdown deadline exceeded");
        std::process::exit(1);
    });
    running.shutdown().await
}

/// The listener's TLS front (and its certificate reloader or ACME loop), when configured.
fn start_tls(ctx: &Ctx) -> Result<Option<Arc<crate::tls::server::Tls>>, String> {
    let Some(settings) = &ctx.config.tls else {
        return Ok(None);
    };
    crate::tls::install_provider();
    let mut hosts: Vec<String> = crate::tls::origin_host(&ctx.config.public_url)
        .into_iter()
        .collect();
    if ctx.config.roles.cell {
        hosts.extend(crate::tls::origin_host(&ctx.config.cell_url));
    }
    hosts.dedup();
    crate::tls::server::start(
        settings,
        &ctx.config.extra_ca,
        hosts,
        &ctx.metrics.registry,
        ctx.shutdown.clone(),
    )
    .map(Some)
}

/// Registers the SIGTERM/SIGINT handlers now; the returned future completes on the first signal.
fn wait_for_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Pause after a failed `accept` before the next one.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The next accepted connection. An accept error (EMFILE, ENFILE, ECONNABORTED, …) is logged and
/// retried after [`ACCEPT_BACKOFF`]: a listener out of descriptors must not spin a core.
pub async fn accept_with_backoff<T, F, Fut>(mut accept: F, what: &str) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<T>>,
{
    loop {
        match accept().await {
            Ok(x) => return x,
            Err(e) => {
                log::warn!("[orca-relay] {what} accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    ctx: Ctx,
    filter: BoxedFilter<(Response,)>,
    director: Option<Arc<Director>>,
    cell: Option<Arc<Cell>>,
    http: TaskTracker,
    tls: Option<Arc<crate::tls::server::Tls>>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(
        crate::contract::limits::HTTP_CONNECTIONS_MAX,
    ));
    let busy = busy::Busy::new(&ctx.metrics, tls.clone());
    let keepalive = keepalive::KeepAlive::new(&ctx.metrics, slots.clone());
    loop {
        // Bounded HTTP connections: accept only holding a serving slot or, over the bound, an
        // answering permit (503 + Retry-After); with neither, new connections wait in the
        // kernel's backlog rather than being accepted and closed unanswered.
        let Some(ticket) = busy::admit(&slots, busy.permits()).await else {
            return;
        };
        let (stream, peer) = accept_with_backoff(|| listener.accept(), "listener").await;
        let slot = match busy::upgrade(ticket, &slots) {
            busy::Ticket::Serve(slot) => slot,
            busy::Ticket::Answer(permit) => {
                busy.refuse(stream, permit, &http);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            ctx: ctx.clone(),
            filter: filter.clone(),
            director: director.clone(),
            cell: cell.clone(),
            peer,
            keepalive: keepalive.clone(),
        };
        let tls = tls.clone();
        http.spawn(async move {
            let _slot = slot;
            // The handshake runs in the connection's task (never in the accept loop); after it,
            // plain and TLS connections share one code path.
            match tls {
                None => conn.serve(stream).await,
                Some(tls) => {
                    if let Some(stream) = tls.accept(stream).await {
                        conn.serve(stream).await;
                    }
                }
            }
        });
    }
}

/// One accepted connection and what serving it needs.
struct Conn {
    ctx: Ctx,
    filter: BoxedFilter<(Response,)>,
    director: Option<Arc<Director>>,
    cell: Option<Arc<Cell>>,
    peer: SocketAddr,
    /// Whether to keep this connection alive after a response (off near the connection cap).
    keepalive: keepalive::KeepAlive,
}

impl Conn {
    async fn serve<S>(self, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Conn {
            ctx,
            filter,
            director,
            cell,
            peer,
            keepalive,
        } = self;
        let shutdown = ctx.shutdown.clone();
        let svc = warp::service(filter);
        let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
            req.extensions_mut().insert(PeerAddr(peer));
            let ctx = ctx.clone();
            let mut svc = svc.clone();
            let director = director.clone();
            let cell = cell.clone();
            let keepalive = keepalive.clone();
            async move {
                let mut resp = route(req, peer, &ctx, &mut svc, &director, &cell).await;
                keepalive.decide(&mut resp);
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(
                crate::contract::limits::HEADER_READ_TIMEOUT_S,
            ))
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = shutdown.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
}

/// Routes one request: legs to the cell (or the director's connect redirect), the rest through
/// the warp filter tree.
async fn route<S>(
    req: http::Request<Incoming>,
    peer: SocketAddr,
    ctx: &Ctx,
    svc: &mut S,
    director: &Option<Arc<Director>>,
    cell: &Option<Arc<Cell>>,
) -> Response
where
    S: Service<http::Request<Incoming>, Response = Response, Error = Infallible>,
{
    let path = req.uri().path();
    if is_leg_path(path) {
        if let Some(cell) = cell {
            return cell.upgrade(req, peer).await;
        }
        if path.starts_with("/v1/connect/") {
            if let Some(d) = director {
                return d.connect_redirect(req, peer).await;
            }
        }
        return h::error(StatusCode::NOT_FOUND, errors::CELL_ONLY);
    }
    if ctx.shutting_down() && path != "/health" {
        return h::shutting_down();
    }
    match svc.call(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

/// The warp filter tree for this process's roles.
fn routes(
    ctx: &Ctx,
    director: Option<&Arc<Director>>,
    cell: Option<&Arc<Cell>>,
    push: Option<&Arc<Push>>,
) -> BoxedFilter<(Response,)> {
    let mut tree = common_routes(ctx, cell.cloned(), push.cloned());
    tree = match director {
        Some(d) => tree.or(d.routes()).unify().boxed(),
        None => tree
            .or(role_only(DIRECTOR_PATHS, errors::DIRECTOR_ONLY))
            .unify()
            .boxed(),
    };
    tree = match cell {
        Some(c) => tree.or(c.routes()).unify().boxed(),
        None => tree
            .or(role_only(CELL_PATHS, errors::CELL_ONLY))
            .unify()
            .boxed(),
    };
    tree = match push {
        Some(p) => tree.or(p.routes()).unify().boxed(),
        None => tree
            .or(role_only(PUSH_PATHS, errors::PUSH_ONLY))
            .unify()
            .boxed(),
    };
    tree.or(warp::any().map(|| h::error(StatusCode::NOT_FOUND, errors::NOT_FOUND)))
        .unify()
        .boxed()
}

fn role_only(paths: &'static [&'static str], code: &'static str) -> BoxedFilter<(Response,)> {
    warp::path::full()
        .and_then(move |p: warp::path::FullPath| async move {
            if path_in(p.as_str(), paths) {
                Ok(h::error(StatusCode::NOT_FOUND, code))
            } else {
                Err(warp::reject::not_found())
            }
        })
        .boxed()
}

/// `/health`, `/ready`, `/metrics`, `/v1/admin/runtime-status` (docs/reference/http.md).
fn common_routes(
    ctx: &Ctx,
    cell: Option<Arc<Cell>>,
    push: Option<Arc<Push>>,
) -> BoxedFilter<(Response,)> {
    let c = ctx.clone();
    let health = warp::path!("health").and(warp::get()).map(move || {
        let mut body = serde_json::json!({
            "ok": true,
            "roles": c.config.roles.names(),
            "connectionCapacityProtocol": 2,
        });
        if let Some(p) = &push {
            if let (Some(obj), serde_json::Value::Object(extra)) =
                (body.as_object_mut(), p.health_fields())
            {
                obj.extend(extra);
            }
        }
        h::json(StatusCode::OK, &body)
    });
    let c = ctx.clone();
    let ready = warp::path!("ready").and(warp::get()).then(move || {
        let c = c.clone();
        async move {
            let verdict = c.readiness.check().await;
            // A validation-mode push process is a deploy preflight: it is ready only when the
            // database already carries every migration this binary knows (docs/configuration.md).
            if verdict.is_ready() && c.config.push.mode == crate::config::PushMode::Validation {
                match migrate::is_current(&c.db).await {
                    Ok(true) => {}
                    _ => return ready_response(Verdict::Unavailable),
                }
            }
            ready_response(verdict)
        }
    });
    let c = ctx.clone();
    let metrics = warp::path!("metrics")
        .and(warp::get())
        .and(warp::header::headers_cloned())
        .then(move |headers: HeaderMap| {
            let c = c.clone();
            async move {
                if !h::is_reader(&headers, &c.config.secrets) {
                    return h::invalid_token();
                }
                metrics_response(&c.metrics).await
            }
        });
    let c = ctx.clone();
    let runtime_status = warp::path!("v1" / "admin" / "runtime-status")
        .and(warp::post())
        .and(warp::header::headers_cloned())
        .and(h::body(crate::contract::limits::RELAY_BODY_MAX))
        .map(move |headers: HeaderMap, body: h::Body| {
            runtime_status(&c, cell.as_deref(), &headers, body)
        });
    health
        .or(ready)
        .unify()
        .or(metrics)
        .unify()
        .or(runtime_status)
        .unify()
        .or(crate::dashboard::route())
        .unify()
        .boxed()
}

fn ready_response(v: Verdict) -> Response {
    match v {
        Verdict::Ready => h::json(StatusCode::OK, &serde_json::json!({"ok": true})),
        Verdict::Degraded => h::json(
            StatusCode::OK,
            &serde_json::json!({"ok": true, "degraded": true, "dependency": ["sql"]}),
        ),
        Verdict::Unavailable => h::error(
            StatusCode::SERVICE_UNAVAILABLE,
            errors::DEPENDENCY_UNAVAILABLE,
        ),
        Verdict::TlsUnavailable => h::json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({
                "error": errors::DEPENDENCY_UNAVAILABLE,
                "dependency": ["tls"],
                "cause": "no TLS certificate to serve yet",
            }),
        ),
    }
}

async fn metrics_response(m: &Arc<Metrics>) -> Response {
    let mut r = Response::new(m.render_blocking().await.into());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct VersionOnly {
    v: u8,
}

/// The `{"v":1}` body of `POST /v1/admin/runtime-status`, or `400`. Also the fuzzing entry of
/// `fuzz/fuzz_targets/admin_bodies.rs`.
pub fn decode_version_only(bytes: &[u8]) -> Result<(), Response> {
    match h::parse::<VersionOnly>(bytes)? {
        VersionOnly { v: 1 } => Ok(()),
        _ => Err(h::bad_request()),
    }
}

fn runtime_status(ctx: &Ctx, cell: Option<&Cell>, headers: &HeaderMap, body: h::Body) -> Response {
    if !h::is_reader(headers, &ctx.config.secrets) {
        return h::invalid_token();
    }
    let bytes = match body {
        h::Body::Ok(b) => b,
        h::Body::TooLarge => return h::too_large(),
        h::Body::Broken => return h::bad_request(),
    };
    if let Err(r) = decode_version_only(&bytes) {
        return r;
    }
    let cfg = &ctx.config;
    let is_cell = cell.is_some();
    let capacity = if is_cell {
        cfg.hard_cap.map(|c| {
            serde_json::json!({
                "hardCap": c.cap,
                "controlRebindReserve": 100,
                "ordinaryConnectionLimit": c.cap - 100,
                "unobservedBound": c.unobserved_bound,
                "normalAdmissionPause": c.cap - 100 - c.unobserved_bound,
            })
        })
    } else {
        None
    };
    let runtime = cell.map(|c| c.runtime_counts());
    h::json(
        StatusCode::OK,
        &serde_json::json!({
            "v": 1,
            "roles": cfg.roles.names(),
            "cellId": if is_cell { Some(&cfg.cell_id) } else { None },
            "cellUrl": if is_cell { Some(&cfg.cell_url) } else { None },
            "region": cfg.region,
            "cellIncarnation": if is_cell { Some(&ctx.incarnation) } else { None },
            "startedAt": ctx.started_at,
            "draining": cell.is_some_and(|c| c.is_draining()),
            "regionalRehomeProtocol": if is_cell { Some(crate::cell::idle_rehome::PROTOCOL) } else { None },
            "connectionCapacity": capacity,
            "runtime": runtime,
        }),
    )
}

async fn spawn_metrics_listener(
    ctx: Ctx,
    addr: SocketAddr,
    tls: Option<Arc<crate::tls::server::Tls>>,
) -> Result<(), String> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("ORCA_RELAY_METRICS_LISTEN: cannot bind {addr}: {e}"))?;
    let c = ctx.clone();
    let filter = warp::path!("metrics")
        .and(warp::get())
        .then(move || {
            let c = c.clone();
            async move { metrics_response(&c.metrics).await }
        })
        .boxed();
    // A counter beside each limit: connections closed at once over the bound, and connections
    // closed because their request headers did not arrive in time.
    let refused = ctx.metrics.register_counter_vec(
        "orca_relay_metrics_listener_refused_total",
        "metrics-listener connections closed by a limit",
        &["reason"],
    );
    let slots = Arc::new(tokio::sync::Semaphore::new(
        crate::contract::limits::METRICS_CONNECTIONS_MAX,
    ));
    let stop = ctx.child_token();
    ctx.spawn("metrics-listener", async move {
        let svc = warp::service(filter);
        loop {
            let (stream, _) = tokio::select! {
                _ = stop.cancelled() => return,
                c = accept_with_backoff(|| listener.accept(), "metrics listener") => c,
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                refused.with_label_values(&["connections"]).inc();
                drop(stream);
                continue;
            };
            let svc = svc.clone();
            let tls = tls.clone();
            let refused = refused.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let mut svc = svc.clone();
                    async move { svc.call(req).await }
                });
                let mut builder = http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(
                        crate::contract::limits::HEADER_READ_TIMEOUT_S,
                    ));
                let served = match tls {
                    None => {
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    Some(tls) => match tls.accept(stream).await {
                        Some(s) => builder.serve_connection(TokioIo::new(s), service).await,
                        None => Ok(()),
                    },
                };
                if served.is_err_and(|e| e.is_timeout()) {
                    refused.with_label_values(&["header_timeout"]).inc();
                }
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener whose accept keeps failing waits between attempts instead of spinning (both the
    /// main and the metrics listener use this loop).
    #[tokio::test(start_paused = true)]
    async fn accept_errors_back_off() {
        let started = tokio::time::Instant::now();
        let mut calls = 0u32;
        let got = accept_with_backoff(
            || {
                calls += 1;
                let n = calls;
                async move {
                    if n <= 10 {
                        Err(std::io::Error::other("EMFILE"))
                    } else {
                        Ok(n)
                    }
                }
            },
            "test",
        )
        .await;
        assert_eq!(got, 11);
        assert_eq!(calls, 11);
        assert!(started.elapsed() >= ACCEPT_BACKOFF * 10);
    }
}
