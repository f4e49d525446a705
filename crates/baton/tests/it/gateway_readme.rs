//! README.md's "JSON gateway and HTTP" examples, taken from the file and run as written
//! (`curl … http://127.0.0.1:2379/…`) against a `baton serve` with its default client URL,
//! in a network namespace of the test's own (`unshare -n`, as root; CI is) so that port 2379
//! is free whatever else runs on the host. The README cannot drift from what Baton answers.

use std::process::Command;

/// The shell blocks of the README section `heading`.
fn shell_blocks(readme: &str, heading: &str) -> String {
    let start = readme.find(heading).expect("the README has the section");
    let rest = &readme[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut blocks = String::new();
    let mut in_block = false;
    for line in section.lines() {
        match (in_block, line.trim_start()) {
            (false, "```sh") => in_block = true,
            (true, "```") => in_block = false,
            (true, _) => {
                blocks.push_str(line);
                blocks.push('\n');
            }
            _ => {}
        }
    }
    assert!(!blocks.is_empty(), "no ```sh block in {heading}");
    blocks
}

#[test]
fn readme_curl_examples_work_as_written() {
    let readme = include_str!("../../../../README.md");
    let examples = shell_blocks(readme, "## JSON gateway and HTTP");
    assert!(examples.contains("curl -s http://127.0.0.1:2379/v3/kv/put"));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("examples.sh");
    std::fs::write(
        &script,
        format!(
            "set -eu\n\
             '{baton}' serve --data-dir '{data}' > '{log}' 2>&1 &\n\
             server=$!\n\
             for _ in $(seq 200); do curl -sf http://127.0.0.1:2379/health > /dev/null && break; sleep 0.1; done\n\
             {examples}\n\
             kill $server\n",
            baton = env!("CARGO_BIN_EXE_baton"),
            data = dir.path().join("data").display(),
            log = dir.path().join("baton.log").display(),
        ),
    )
    .unwrap();
    let out = Command::new("unshare")
        .args(["-n", "bash", "-c", "ip link set lo up && exec bash \"$0\""])
        .arg(&script)
        .output()
        .expect("unshare (util-linux) and ip (iproute2)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(dir.path().join("baton.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "the README's examples failed ({}):\n{stdout}\n{}\nbaton's log:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        r#"{"health":"true"}"#,
        r#""etcdserver":"#,
        r#""kvs":[{"key":"Zm9v""#,
        r#""created":true"#,
        r#""events":[{"kv":{"key":"Zm9v""#,
        r#""TTL":"60""#,
        r#""succeeded":true"#,
        "etcd_mvcc_put_total 2\n",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected} missing from:\n{stdout}"
        );
    }
    assert!(
        !stdout.contains(r#""error""#),
        "an example failed:\n{stdout}"
    );
}
