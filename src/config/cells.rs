//! `ORCA_RELAY_CELLS`: the cells a director registers at start-up.

use super::{err, CellSpec, ConfigError};
use crate::contract::validate::{check_origin, is_cell_id};

/// `ORCA_RELAY_CELLS`: a JSON array of cells, each checked against `regions`; every error names
/// the variable. Public as the fuzzing entry of `fuzz/fuzz_targets/cells_config.rs`.
pub fn parse_cells(text: &str, regions: &[String]) -> Result<Vec<CellSpec>, ConfigError> {
    // Strict like every other JSON the relay reads: each cell an object with exactly its keys, no
    // `null` optionals, no duplicate keys (a plain serde derive would take a cell given as an array).
    let cells: Vec<CellSpec> = crate::contract::strict::parse_value(text.as_bytes())
        .and_then(crate::contract::strict::from_value)
        .or_else(|e| {
            err(format!(
                "ORCA_RELAY_CELLS must be a JSON array of cells: {e}"
            ))
        })?;
    for c in &cells {
        if !is_cell_id(&c.id) || c.id == "director" {
            return err("ORCA_RELAY_CELLS has an invalid cell id");
        }
        if check_origin(&c.url).is_err() {
            return err("ORCA_RELAY_CELLS has a cell url that is not a canonical origin");
        }
        if !regions.contains(&c.region) {
            return err("ORCA_RELAY_CELLS names a region outside ORCA_RELAY_REGIONS");
        }
        if !(1..=1_000_000).contains(&c.capacity_requests) {
            return err("ORCA_RELAY_CELLS capacityRequests must be in 1..1000000");
        }
        match (c.connection_hard_cap, c.connection_unobserved_bound) {
            (None, None) => {}
            (Some(cap), Some(b))
                if (200..=1_000_000).contains(&cap) && (0..=cap - 101).contains(&b) => {}
            _ => {
                return err(
                    "ORCA_RELAY_CELLS connection cap and bound must be set together and in range",
                )
            }
        }
        if let Some(s) = &c.initial_state {
            if !matches!(s.as_str(), "general" | "migration-only" | "existing-only") {
                return err("ORCA_RELAY_CELLS initialState must be general, migration-only or existing-only");
            }
        }
    }
    Ok(cells)
}

#[cfg(test)]
mod cells_tests {
    use super::parse_cells;

    const REGIONS: &[&str] = &["us-central1"];

    fn parse(text: &str) -> Result<usize, String> {
        let regions: Vec<String> = REGIONS.iter().map(|r| r.to_string()).collect();
        parse_cells(text, &regions)
            .map(|c| c.len())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn cells_json_is_strict() {
        let ok = r#"[{"id":"c1","url":"http://127.0.0.1:9001","region":"us-central1","capacityRequests":10}]"#;
        assert_eq!(parse(ok), Ok(1));
        for bad in [
            // a cell as an array (fields by position)
            r#"[["c1","http://127.0.0.1:9001","us-central1",10]]"#,
            // null for an optional field
            r#"[{"id":"c1","url":"http://127.0.0.1:9001","region":"us-central1","capacityRequests":10,"initialState":null}]"#,
            // duplicate key
            r#"[{"id":"c1","id":"c2","url":"http://127.0.0.1:9001","region":"us-central1","capacityRequests":10}]"#,
            // unknown key
            r#"[{"id":"c1","url":"http://127.0.0.1:9001","region":"us-central1","capacityRequests":10,"x":1}]"#,
            // top level not an array
            r#"{"id":"c1"}"#,
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(
                e.contains("ORCA_RELAY_CELLS must be a JSON array of cells"),
                "{bad}: {e}"
            );
        }
    }
}
