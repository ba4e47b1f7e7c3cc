//! One reading of a process's `/metrics`, as series (name with labels, as printed) → value.

use std::collections::HashMap;
use std::time::Duration;

/// `/metrics` of the process at `url` (scheme and authority), read with the admin `token`.
pub async fn scrape(url: &str, token: &str) -> HashMap<String, f64> {
    let text = reqwest::Client::new()
        .get(format!("{url}/metrics"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}
