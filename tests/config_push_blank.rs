//! docs/configuration.md: a whitespace-only `ORCA_PUSH_*` value counts as unset. Read through clap's real
//! environment path (this binary holds one test, so setting the process environment is race-free).

use orca_relay::config::{Config, ServeArgs};

#[test]
fn whitespace_only_push_variables_are_unset() {
    let dir = orca_relay::store::testing::temp_dir("orca-relay-push-blank");
    for var in [
        "ORCA_PUSH_PUBLIC_URL",
        "ORCA_PUSH_MODE",
        "ORCA_PUSH_APNS_KEY",
        "ORCA_PUSH_APNS_KEY_ID",
        "ORCA_PUSH_APPLE_TEAM_ID",
        "ORCA_PUSH_APNS_TOPIC",
        "ORCA_PUSH_FCM_PROJECT_ID",
        "ORCA_PUSH_FCM_CREDENTIALS",
        "ORCA_PUSH_APNS_BASE_URL",
        "ORCA_PUSH_FCM_BASE_URL",
        "ORCA_PUSH_OAUTH_TOKEN_URL",
    ] {
        std::env::set_var(var, " \t ");
    }
    let data = dir.display().to_string();
    let args = ServeArgs::parse_flags([
        "--role",
        "push",
        "--data-dir",
        &data,
        "--admin-token",
        "admin-token-admin-token-admin-token-0001",
    ])
    .expect("flags");
    let cfg =
        Config::from_args(&args).unwrap_or_else(|e| panic!("blank ORCA_PUSH_* refused: {}", e.0));
    let p = &cfg.push;
    assert_eq!(p.apns_topic, "com.stably.orca.mobile");
    assert!(p.apns.is_none() && p.fcm.is_none() && p.apns_base_url.is_none());
    assert_eq!(p.public_url, cfg.public_url);
}
