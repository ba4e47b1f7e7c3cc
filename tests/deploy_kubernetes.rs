//! `deploy/kubernetes/*.yaml` validate offline against the Kubernetes 1.30 API schemas with
//! PyPI's `kubernetes-validate --strict` (unknown fields fail). Skipped, with the reason printed,
//! where the tool is not installed. Structural checks in Rust run everywhere.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Kubernetes version the manifests are checked against.
const K8S_VERSION: &str = "1.30.0";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    v
}

#[test]
fn manifests_validate() {
    let files = manifests();
    assert!(files.len() >= 5, "{files:?}");
    if Command::new("kubernetes-validate")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "skipped: kubernetes-validate is not installed (pip install kubernetes-validate)"
        );
        return;
    }
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", "-k", K8S_VERSION])
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubernetes-validate: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn manifests_are_namespace_agnostic_and_complete() {
    let all: String = manifests()
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>()
        .join("\n---\n");
    assert!(!all.contains("namespace:"), "a manifest names a namespace");
    for kind in [
        "kind: Deployment",
        "kind: StatefulSet",
        "kind: PodDisruptionBudget",
        "kind: Service",
        "kind: ConfigMap",
        "kind: Secret",
        "clusterIP: None",
    ] {
        assert!(all.contains(kind), "no {kind}");
    }
    let cells = std::fs::read_to_string(dir().join("cells.yaml")).unwrap();
    for needed in [
        "fieldPath: metadata.name",
        "value: \"$(POD_NAME)\"",
        "preStop:",
        "orca-relay admin drain",
        "path: /ready",
        "livenessProbe:",
    ] {
        assert!(cells.contains(needed), "cells.yaml lacks {needed}");
    }
    let secret = std::fs::read_to_string(dir().join("secret.example.yaml")).unwrap();
    assert!(secret.contains("CHANGE-ME"), "the Secret is a template");
}
