//! The push gateway's settings (`ORCA_PUSH_*`).

use serde::Deserialize;

use super::{
    absolute_url, err, opt, origin, ApnsConfig, ConfigError, FcmConfig, PushConfig, PushMode,
    Roles, ServeArgs, DEFAULT_APNS_TOPIC,
};

pub(super) fn parse_push(
    a: &ServeArgs,
    public_url: &str,
    roles: Roles,
) -> Result<PushConfig, ConfigError> {
    let public = match opt(&a.push_public_url) {
        Some(u) => origin("ORCA_PUSH_PUBLIC_URL", &u)?,
        None => public_url.to_string(),
    };
    let mode = match a.push_mode.trim() {
        "" | "active" => PushMode::Active,
        "validation" => {
            if roles
                != (Roles {
                    push: true,
                    ..Roles::default()
                })
            {
                return err("ORCA_PUSH_MODE=validation requires ORCA_RELAY_ROLE=push");
            }
            PushMode::Validation
        }
        _ => return err("ORCA_PUSH_MODE must be active or validation"),
    };
    let apns = parse_apns(a)?;
    // docs/configuration.md: a whitespace-only ORCA_PUSH_* value is unset, so a blank topic is the default.
    let topic = match a.push_apns_topic.trim() {
        "" => DEFAULT_APNS_TOPIC.to_string(),
        t => t.to_string(),
    };
    if !(1..=255).contains(&topic.chars().count()) {
        return err("ORCA_PUSH_APNS_TOPIC must be 1..255 characters");
    }
    let fcm = parse_fcm(a)?;
    let apns_base_url = match opt(&a.push_apns_base_url) {
        Some(u) => Some(origin("ORCA_PUSH_APNS_BASE_URL", &u)?),
        None => None,
    };
    let fcm_base_url = match opt(&a.push_fcm_base_url) {
        Some(u) => origin("ORCA_PUSH_FCM_BASE_URL", &u)?,
        None => "https://fcm.googleapis.com".to_string(),
    };
    let oauth_token_url = match opt(&a.push_oauth_token_url) {
        Some(u) => absolute_url("ORCA_PUSH_OAUTH_TOKEN_URL", &u)?,
        None => "https://oauth2.googleapis.com/token".to_string(),
    };
    Ok(PushConfig {
        public_url: public,
        mode,
        apns,
        apns_topic: topic,
        fcm,
        apns_base_url,
        fcm_base_url,
        oauth_token_url,
    })
}

/// The APNs key, key id and team id: all three or none; the key PEM text, the ids 10 characters
/// of `[A-Z0-9]`.
fn parse_apns(a: &ServeArgs) -> Result<Option<ApnsConfig>, ConfigError> {
    Ok(match (
        opt(&a.push_apns_key),
        opt(&a.push_apns_key_id),
        opt(&a.push_apple_team_id),
    ) {
        (None, None, None) => None,
        (Some(key), Some(id), Some(team)) => {
            let ten = |s: &str| {
                s.len() == 10
                    && s.bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
            };
            if !key.contains("-----BEGIN") {
                return err("ORCA_PUSH_APNS_KEY must be PEM text");
            }
            if !ten(&id) {
                return err("ORCA_PUSH_APNS_KEY_ID must be 10 characters of [A-Z0-9]");
            }
            if !ten(&team) {
                return err("ORCA_PUSH_APPLE_TEAM_ID must be 10 characters of [A-Z0-9]");
            }
            Some(ApnsConfig {
                key_pem: key,
                key_id: id,
                team_id: team,
            })
        }
        _ => {
            return err(
                "ORCA_PUSH_APNS_KEY, ORCA_PUSH_APNS_KEY_ID and ORCA_PUSH_APPLE_TEAM_ID must be configured together",
            )
        }
    })
}

/// The FCM project id and credentials file: both or neither; the project id
/// `^[a-z0-9-]{4,64}$`, the file a readable service account.
fn parse_fcm(a: &ServeArgs) -> Result<Option<FcmConfig>, ConfigError> {
    Ok(match (opt(&a.push_fcm_project_id), opt(&a.push_fcm_credentials)) {
        (None, None) => None,
        (Some(project), Some(path)) => {
            let ok = (4..=64).contains(&project.len())
                && project
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                return err("ORCA_PUSH_FCM_PROJECT_ID must match ^[a-z0-9-]{4,64}$");
            }
            Some(read_service_account(&project, &path)?)
        }
        _ => return err(
            "ORCA_PUSH_FCM_PROJECT_ID and ORCA_PUSH_FCM_CREDENTIALS must be configured together",
        ),
    })
}

fn read_service_account(project_id: &str, path: &str) -> Result<FcmConfig, ConfigError> {
    #[derive(Deserialize)]
    struct Sa {
        #[serde(rename = "type")]
        kind: Option<String>,
        client_email: Option<String>,
        private_key: Option<String>,
        private_key_id: Option<String>,
    }
    let bad = || err("ORCA_PUSH_FCM_CREDENTIALS must name a readable service-account JSON file");
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(_) => return bad(),
    };
    let sa: Sa = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(_) => return bad(),
    };
    if sa.kind.as_deref().is_some_and(|k| k != "service_account") {
        return bad();
    }
    let email = sa.client_email.filter(|s| !s.is_empty());
    let key = sa
        .private_key
        .filter(|s| s.contains("-----BEGIN") && s.contains("PRIVATE KEY"));
    match (email, key) {
        (Some(client_email), Some(private_key_pem)) => Ok(FcmConfig {
            project_id: project_id.to_string(),
            client_email,
            private_key_pem,
            private_key_id: sa.private_key_id.filter(|s| !s.is_empty()),
        }),
        _ => bad(),
    }
}
