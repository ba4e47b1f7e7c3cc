//! Configuration validation (docs/configuration.md): every bad value stops start-up with one line naming the
//! variable; single-node secrets are generated once (0600) and reused.

use orca_relay::config::{Config, Roles, ServeArgs};

const KEY: &str = "0123456789abcdef0123456789abcdef";
const ADMIN: &str = "admin-token-admin-token-admin-token-0001";

fn cfg(args: &[&str]) -> Result<Config, String> {
    let a = ServeArgs::parse_flags(args.iter().copied()).map_err(|e| e.to_string())?;
    Config::from_args(&a).map_err(|e| e.0)
}

fn err(args: &[&str]) -> String {
    match cfg(args) {
        Ok(_) => panic!("expected a configuration error for {args:?}"),
        Err(e) => e,
    }
}

fn temp_data() -> String {
    orca_relay::store::testing::temp_dir("orca-relay-config")
        .display()
        .to_string()
}

#[test]
fn each_bad_value_names_its_variable() {
    let d = temp_data();
    let cases: &[(&[&str], &str)] = &[
        (&["--role", "relay"], "ORCA_RELAY_ROLE"),
        (&["--listen", "nowhere"], "ORCA_RELAY_LISTEN"),
        (
            &["--public-url", "http://relay.example.com"],
            "ORCA_RELAY_PUBLIC_URL must use HTTPS outside loopback development",
        ),
        (&["--public-url", "https://relay.example.com/"], "ORCA_RELAY_PUBLIC_URL must be an origin"),
        (&["--database-url", "mysql://x"], "ORCA_RELAY_DATABASE_URL"),
        (&["--database-pool-max", "0"], "ORCA_RELAY_DATABASE_POOL_MAX"),
        (
            &["--assignment-signing-key", "short"],
            "ORCA_RELAY_ASSIGNMENT_SIGNING_KEY must be at least 32 bytes",
        ),
        (&["--cluster-key", "short"], "ORCA_RELAY_CLUSTER_KEY must be at least 32 bytes"),
        (&["--self-hosted-key", "bad key with spaces but long enough....."], "ORCA_RELAY_SELF_HOSTED_KEY"),
        (&["--admin-token", "short"], "ORCA_RELAY_ADMIN_TOKEN"),
        (&["--auth-issuer", "https://issuer.test"], "ORCA_RELAY_AUTH_ISSUER and ORCA_RELAY_JWKS_URL"),
        (&["--cell-id", "director"], "ORCA_RELAY_CELL_ID"),
        (&["--cell-id", "a/b"], "ORCA_RELAY_CELL_ID"),
        (&["--region", "eu-west1"], "ORCA_RELAY_REGION"),
        (&["--cell-capacity", "0"], "ORCA_RELAY_CELL_CAPACITY"),
        (
            &["--cell-connection-hard-cap", "600"],
            "ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND is required with ORCA_RELAY_CELL_CONNECTION_HARD_CAP",
        ),
        (
            &["--cell-connection-hard-cap", "600", "--cell-connection-unobserved-bound", "500"],
            "ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND",
        ),
        (&["--cell-connection-hard-cap", "100", "--cell-connection-unobserved-bound", "0"], "ORCA_RELAY_CELL_CONNECTION_HARD_CAP"),
        (&["--cell-max-connections", "999"], "ORCA_RELAY_CELL_MAX_CONNECTIONS"),
        (&["--trusted-proxy-hops", "9"], "ORCA_RELAY_TRUSTED_PROXY_HOPS"),
        (&["--cells", "[{\"id\":\"a\"}]"], "ORCA_RELAY_CELLS"),
        (&["--public-sticky-retry-after-seconds", "61"], "ORCA_RELAY_PUBLIC_STICKY_RETRY_AFTER_SECONDS"),
        (&["--shutdown-grace-ms", "8001"], "ORCA_RELAY_SHUTDOWN_GRACE_MS"),
        (&["--readiness-sql-grace-ms=-1"], "ORCA_RELAY_READINESS_SQL_GRACE_MS"),
        (&["--push-public-url", "http://push.example.com"], "ORCA_PUSH_PUBLIC_URL must use HTTPS outside loopback development"),
        (&["--push-apns-key-id", "KEYID12345"], "ORCA_PUSH_APNS_KEY, ORCA_PUSH_APNS_KEY_ID and ORCA_PUSH_APPLE_TEAM_ID must be configured together"),
        (&["--push-fcm-project-id", "orca-test"], "ORCA_PUSH_FCM_PROJECT_ID and ORCA_PUSH_FCM_CREDENTIALS must be configured together"),
        (&["--push-mode", "validation"], "ORCA_PUSH_MODE=validation requires ORCA_RELAY_ROLE=push"),
    ];
    for (args, expected) in cases {
        let mut full: Vec<&str> = vec!["--data-dir", &d];
        full.extend_from_slice(args);
        let e = err(&full);
        assert!(
            e.contains(expected),
            "{args:?}: got {e:?}, want {expected:?}"
        );
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn missing_secrets_outside_single_node_refuse_to_start() {
    let d = temp_data();
    // Split roles on SQLite: not the single-node shape, nothing is generated.
    assert_eq!(
        err(&["--data-dir", &d, "--role", "director"]),
        "ORCA_RELAY_ASSIGNMENT_SIGNING_KEY is required for role director"
    );
    assert_eq!(
        err(&[
            "--data-dir",
            &d,
            "--role",
            "director",
            "--assignment-signing-key",
            KEY
        ]),
        "ORCA_RELAY_CLUSTER_KEY is required for role director"
    );
    assert_eq!(
        err(&[
            "--data-dir",
            &d,
            "--role",
            "cell",
            "--director-url",
            "http://127.0.0.1:1",
            "--assignment-signing-key",
            KEY,
            "--cluster-key",
            KEY,
        ]),
        "ORCA_RELAY_ADMIN_TOKEN is required for role cell"
    );
    assert_eq!(
        err(&["--data-dir", &d, "--role", "push"]),
        "ORCA_RELAY_ADMIN_TOKEN is required for role push"
    );
    // `all` on Postgres is clustered: no generation either.
    assert_eq!(
        err(&[
            "--data-dir",
            &d,
            "--database-url",
            "postgres://postgres@127.0.0.1/test"
        ]),
        "ORCA_RELAY_ASSIGNMENT_SIGNING_KEY is required for role director"
    );
    assert_eq!(
        err(&[
            "--data-dir",
            &d,
            "--role",
            "cell",
            "--assignment-signing-key",
            KEY,
            "--cluster-key",
            KEY,
            "--admin-token",
            ADMIN
        ]),
        "ORCA_RELAY_DIRECTOR_URL is required for role cell"
    );
    // Nothing was written.
    assert!(!std::path::Path::new(&d).join("secrets.json").exists());
    // With its secrets a split director starts; the self-hosted key stays optional.
    let c = cfg(&[
        "--data-dir",
        &d,
        "--role",
        "director",
        "--assignment-signing-key",
        KEY,
        "--cluster-key",
        KEY,
        "--admin-token",
        ADMIN,
    ])
    .unwrap();
    assert_eq!(
        c.roles,
        Roles {
            director: true,
            cell: false,
            push: false
        }
    );
    assert!(c.secrets.self_hosted_key.is_none());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn pool_must_fit_both_lanes_on_postgres() {
    let d = temp_data();
    let e = err(&[
        "--data-dir",
        &d,
        "--role",
        "director",
        "--database-url",
        "postgres://postgres@127.0.0.1/test",
        "--assignment-signing-key",
        KEY,
        "--cluster-key",
        KEY,
        "--admin-token",
        ADMIN,
        "--database-pool-max",
        "3",
    ]);
    assert_eq!(
        e,
        "sticky and placement admission together must fit the database pool"
    );
}

#[cfg(unix)]
#[test]
fn single_node_generates_secrets_once_with_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let d = temp_data();
    let first = cfg(&["--data-dir", &d]).unwrap();
    let path = std::path::Path::new(&d).join("secrets.json");
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "v",
            "assignmentSigningKey",
            "selfHostedKey",
            "adminToken",
            "clusterKey"
        ]
    );
    assert_eq!(json["v"], 1);
    let second = cfg(&["--data-dir", &d]).unwrap();
    assert_eq!(
        first.secrets.admin_token, second.secrets.admin_token,
        "a restart reuses the secrets"
    );
    assert_eq!(
        first.secrets.assignment_signing_key,
        second.secrets.assignment_signing_key
    );
    // An explicitly set variable wins over the file; the others still come from it.
    let third = cfg(&["--data-dir", &d, "--admin-token", ADMIN]).unwrap();
    assert_eq!(third.secrets.admin_token.as_deref(), Some(ADMIN));
    assert_eq!(third.secrets.cluster_key, first.secrets.cluster_key);
    assert_eq!(
        first.database_url,
        format!(
            "sqlite://{}",
            std::path::Path::new(&d)
                .join("orca-relay.sqlite3")
                .display()
        )
    );
    // Secrets never show in Debug output.
    assert!(!format!("{first:?}").contains(first.secrets.admin_token.as_deref().unwrap()));
    let _ = std::fs::remove_dir_all(&d);
}

/// `ORCA_RELAY_REGION_REHOME_POLL_MS`: the idle-rehome worker's poll period, 6000 (docs/configuration.md
///) unless set; an integer in 100..600000, anything else names the variable.
#[test]
fn region_rehome_poll_period_is_bounded() {
    let d = temp_data();
    let with = |v: Option<&str>| {
        let flag = v.map(|v| format!("--region-rehome-poll-ms={v}"));
        let mut args = vec!["--data-dir", d.as_str()];
        args.extend(flag.as_deref());
        cfg(&args)
    };
    assert_eq!(with(None).unwrap().region_rehome_poll_ms, 6000);
    assert_eq!(with(Some("6000")).unwrap().region_rehome_poll_ms, 6000);
    assert_eq!(with(Some("100")).unwrap().region_rehome_poll_ms, 100);
    assert_eq!(with(Some(" 500 ")).unwrap().region_rehome_poll_ms, 500);
    assert_eq!(with(Some("600000")).unwrap().region_rehome_poll_ms, 600_000);
    for bad in ["99", "0", "-1", "600001", "6s", "1.5", "", "0x10", "1e3"] {
        let e = with(Some(bad)).map(|_| ()).expect_err(bad);
        assert_eq!(
            e, "ORCA_RELAY_REGION_REHOME_POLL_MS must be an integer in 100..600000",
            "{bad:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// `ORCA_RELAY_SWEEP_INTERVAL_MS`: the director's sweep period, 30000 (ARCHITECTURE.md) unless
/// set; an integer in 1000..600000, anything else names the variable.
#[test]
fn sweep_interval_is_bounded() {
    let d = temp_data();
    let with = |v: Option<&str>| {
        let flag = v.map(|v| format!("--sweep-interval-ms={v}"));
        let mut args = vec!["--data-dir", d.as_str()];
        args.extend(flag.as_deref());
        cfg(&args)
    };
    assert_eq!(with(None).unwrap().sweep_interval_ms, 30_000);
    assert_eq!(with(Some("1000")).unwrap().sweep_interval_ms, 1000);
    assert_eq!(with(Some("600000")).unwrap().sweep_interval_ms, 600_000);
    for bad in ["999", "0", "-1", "600001", "30s", "2.5", ""] {
        let e = with(Some(bad)).map(|_| ()).expect_err(bad);
        assert_eq!(
            e, "ORCA_RELAY_SWEEP_INTERVAL_MS must be an integer in 1000..600000",
            "{bad:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}
