//! The signed bytes and the signature of one grant, pinned: every verifier outside Baton (a
//! script, another language's Ed25519 library) reproduces exactly these bytes, so a change
//! to the layout is a new `ENCODING_VERSION`, never an edit of this file's expectations.
//! Ed25519 signatures are deterministic, so the signature is pinned too (it checks that
//! ring still signs what it signed). `BATON_BLESS_NEW=1` writes a missing file, never an
//! existing one.

use std::path::Path;

use baton_fencing::{Grant, KeyId, PublicKeys, Signature, SigningKey};

#[test]
fn grant_encoding_v1_is_pinned() {
    let key = SigningKey::from_seed(KeyId::new(3), &[0x5a; 32]);
    let grant = Grant {
        name: b"locks/stock",
        token: 0x0102_0304_0506_0708,
        lease: 0x694d_7f2a_11c0_0001,
        revision: 57,
    };
    let bytes = grant.signed_bytes(key.id());
    let sig = key.sign(&grant);
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let text = format!(
        "# baton-fencing grant encoding v1: key id 3, seed 32 x 0x5a, name \"locks/stock\",\n\
         # token 0x0102030405060708, lease 0x694d7f2a11c00001, revision 57.\n\
         # Pinned by crates/baton-fencing/tests/golden.rs: never edit by hand.\n\
         public_key: {}\nbytes: {}\nsignature: {}\n",
        key.public_key().to_hex(),
        hex(&bytes),
        sig.to_hex()
    );
    // The layout, spelled out once more than the file does.
    let mut expected = Vec::new();
    expected.extend_from_slice(&19u32.to_be_bytes());
    expected.extend_from_slice(b"baton.fencing.grant");
    expected.push(1);
    expected.extend_from_slice(&3u64.to_be_bytes());
    expected.extend_from_slice(&11u32.to_be_bytes());
    expected.extend_from_slice(b"locks/stock");
    expected.extend_from_slice(&0x0102_0304_0506_0708i64.to_be_bytes());
    expected.extend_from_slice(&0x694d_7f2a_11c0_0001i64.to_be_bytes());
    expected.extend_from_slice(&57i64.to_be_bytes());
    assert_eq!(bytes, expected);

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/grant_v1.txt");
    match std::fs::read_to_string(&path) {
        Ok(pinned) => assert_eq!(pinned, text, "{}: the encoding changed", path.display()),
        Err(_) if std::env::var_os("BATON_BLESS_NEW").is_some_and(|v| v == "1") => {
            std::fs::write(&path, &text).unwrap();
            eprintln!("wrote {}", path.display());
        }
        Err(e) => panic!("{}: {e} (write it with BATON_BLESS_NEW=1)", path.display()),
    }
    // And what is pinned verifies.
    let mut keys = PublicKeys::new();
    keys.insert(key.id(), key.public_key());
    let pinned_sig = text
        .lines()
        .find_map(|l| l.strip_prefix("signature: "))
        .unwrap();
    let pinned_sig = Signature::from_hex(pinned_sig).unwrap();
    assert_eq!(keys.verify(&grant, key.id(), &pinned_sig), Ok(()));
}
