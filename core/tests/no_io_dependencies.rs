//! keel-core stays sans-IO: nothing it depends on (directly or not) may bring
//! a runtime, a network stack, storage, a clock or an RNG. The clock,
//! thread and hash-map bans inside core's own code are clippy's job
//! (`core/clippy.toml`).

use std::process::Command;

const FORBIDDEN: [&str; 12] =
    ["tokio", "madsim", "redb", "tonic", "hyper", "mio", "openraft", "rand", "getrandom", "uuid", "chrono", "socket2"];

#[test]
fn core_depends_on_no_io_runtime_or_randomness() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let output = Command::new(cargo)
        .args(["tree", "--manifest-path", manifest, "-p", "keel-core", "-e", "normal", "--prefix", "none", "--offline"])
        .output()
        .expect("run cargo tree");
    assert!(output.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&output.stderr));
    let tree = String::from_utf8(output.stdout).expect("utf-8");
    let crates: Vec<&str> = tree.lines().filter_map(|line| line.split_whitespace().next()).collect();
    assert!(crates.contains(&"keel-core"), "unexpected cargo tree output:\n{tree}");
    for name in &crates {
        let forbidden =
            FORBIDDEN.iter().any(|f| name == f || name.starts_with(&format!("{f}-")) || name.starts_with("madsim"));
        assert!(!forbidden, "keel-core must stay sans-IO but depends on {name}:\n{tree}");
    }
}
