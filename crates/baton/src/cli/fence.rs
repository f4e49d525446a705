//! `baton fence public-key` and `baton fence rotate-key`: the cluster's fencing-token
//! signing keys, as a resource that verifies signed tokens needs them, and their rotation.
//!
//! `public-key` prints every key the cluster signs or signed with: the text form of
//! `baton_fencing::PublicKeys` (`ed25519 <key id> <hex>` per line, a `#` header) by default
//! and with `--output simple`, or JSON (`{"keys":[{"id":1,"algorithm":"ed25519",
//! "public_key":"<hex>","current":true}]}`). `rotate-key` is served by the leader only, so
//! it asks each endpoint for its status and sends the request to the leader; with auth on
//! it needs root.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use serde_json::json;

use super::client::{connect, connect_leader, describe, finish, ClientArgs};
use super::output::{emit, Format};

#[derive(Args, Debug)]
#[command(
    about = "The cluster's fencing-token signing keys: print the public keys, rotate the key",
    long_about = "Every lock grant of Baton's lock API carries an Ed25519 signature by the \
                  cluster's key over the lock name, the fencing token, the holder's lease and \
                  the grant revision (`baton lock` exports them as BATON_FENCING_SIGNATURE, \
                  BATON_FENCING_KEY_ID, BATON_LEASE_ID and BATON_FENCING_REVISION). A resource \
                  configured with the public keys refuses tokens whose signature does not \
                  verify, so nobody can lock honest holders out with a made-up huge token.",
    after_help = "Examples:\n  \
                  baton fence public-key > /etc/myservice/baton-fencing.keys\n  \
                  baton fence public-key --output json\n  \
                  baton fence rotate-key --endpoints a:2379,b:2379,c:2379"
)]
pub struct FenceArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: FenceCommand,
}

#[derive(Subcommand, Debug)]
pub enum FenceCommand {
    /// Print every public key (old ones included: tokens they signed may still be held).
    PublicKey,
    /// Make a new signing key (the leader makes it; the old private key is dropped, its
    /// public key kept). Resources must fetch the public keys again.
    RotateKey,
}

/// Runs `baton fence ...`; returns the process exit status.
pub async fn run(args: FenceArgs) -> i32 {
    finish("fence", run_inner(args).await)
}

async fn run_inner(args: FenceArgs) -> Result<i32> {
    let format = args.client.output;
    match args.command {
        FenceCommand::PublicKey => {
            let client = connect(&args.client).await?;
            let keys = client.fence_public_keys().await.map_err(describe)?;
            if keys.keys.is_empty() {
                bail!("the cluster has no fencing key yet (its leader creates one at bootstrap)");
            }
            emit(&match format {
                Format::Table | Format::Simple => keys.keys.to_text(),
                Format::Json => {
                    let list: Vec<_> = keys
                        .keys
                        .iter()
                        .map(|(id, key)| {
                            json!({
                                "id": id.get(),
                                "algorithm": baton_client::FENCING_KEY_ALGORITHM,
                                "public_key": key.to_hex(),
                                "current": Some(id) == keys.current,
                            })
                        })
                        .collect();
                    json!({ "keys": list }).to_string()
                }
            });
        }
        FenceCommand::RotateKey => {
            let (client, leader) = connect_leader(&args.client).await?;
            let id = client.rotate_fence_key().await.map_err(describe)?;
            emit(&match format {
                Format::Table => format!(
                    "Fencing key rotated: key {id} is current (made by leader {leader:x}); \
                     resources must fetch the public keys again\n"
                ),
                Format::Simple => format!("{id}\n"),
                Format::Json => json!({ "key_id": id.get() }).to_string(),
            });
        }
    }
    Ok(0)
}
