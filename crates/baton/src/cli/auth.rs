//! `baton auth enable|disable|status`, `baton user …` and `baton role …`: etcd's Auth
//! service, with etcdctl's commands and messages (`User alice created`, `Role r created`,
//! …), so scripts written for `etcdctl user`/`role`/`auth` read the same lines. Passwords
//! are taken from the command line or stdin, never printed.

use anyhow::{bail, Result};
use baton_client::proto::authpb;
use clap::{Args, Subcommand};

use super::client::{connect, describe, finish, ClientArgs};

#[derive(Args, Debug)]
#[command(about = "Enable, disable or show authentication (etcd's auth)")]
pub struct AuthArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: AuthCommand,
}

#[derive(Subcommand, Debug)]
pub enum AuthCommand {
    /// Enable auth: needs a `root` user holding the `root` role.
    Enable,
    /// Disable auth (root only while it is on).
    Disable,
    /// Whether auth is on, and the auth store's revision.
    Status,
}

#[derive(Args, Debug)]
#[command(
    about = "Add, list, inspect, delete users and grant or revoke their roles",
    after_help = "Examples:\n  baton user add alice --new-password s3cret\n  \
                  baton user grant-role alice readers\n  \
                  baton --user root:rootpw user list"
)]
pub struct UserArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: UserCommand,
}

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Add a user (`name:password` or `--new-password`; `--no-password` for a user that
    /// only authenticates by client certificate).
    Add {
        name: String,
        #[arg(long, conflicts_with = "no_password")]
        new_password: Option<String>,
        #[arg(long)]
        no_password: bool,
    },
    /// Show a user's roles.
    Get { name: String },
    /// List every user.
    List,
    /// Delete a user.
    Delete { name: String },
    /// Change a user's password.
    Passwd {
        name: String,
        #[arg(long)]
        new_password: String,
    },
    /// Grant a role to a user.
    GrantRole { name: String, role: String },
    /// Revoke a role from a user.
    RevokeRole { name: String, role: String },
}

#[derive(Args, Debug)]
#[command(
    about = "Add, list, inspect, delete roles and grant or revoke key permissions",
    after_help = "Examples:\n  baton role add readers\n  \
                  baton role grant-permission readers read /app/ --prefix\n  \
                  baton role revoke-permission readers /app/ --prefix"
)]
pub struct RoleArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: RoleCommand,
}

/// Which keys a permission covers (etcdctl's flags).
#[derive(Args, Debug)]
pub struct KeyRangeArgs {
    key: String,
    /// The end of the range `[key, range_end)`.
    range_end: Option<String>,
    /// Every key starting with `key`.
    #[arg(long, conflicts_with_all = ["range_end", "from_key"])]
    prefix: bool,
    /// Every key from `key` on.
    #[arg(long, conflicts_with = "range_end")]
    from_key: bool,
}

impl KeyRangeArgs {
    fn range(&self) -> (Vec<u8>, Vec<u8>) {
        let key = self.key.as_bytes().to_vec();
        let end = if self.prefix {
            if key.is_empty() {
                vec![0]
            } else {
                baton_client::prefix_end(&key)
            }
        } else if self.from_key {
            vec![0]
        } else {
            self.range_end.clone().unwrap_or_default().into_bytes()
        };
        (key, end)
    }
}

#[derive(Subcommand, Debug)]
pub enum RoleCommand {
    /// Add a role.
    Add { name: String },
    /// Show a role's permissions.
    Get { name: String },
    /// List every role.
    List,
    /// Delete a role (and revoke it from every user).
    Delete { name: String },
    /// Grant `read`, `write` or `readwrite` on a key, range, prefix or from-key.
    GrantPermission {
        name: String,
        perm: String,
        #[command(flatten)]
        keys: KeyRangeArgs,
    },
    /// Revoke the permission on exactly that key, range, prefix or from-key.
    RevokePermission {
        name: String,
        #[command(flatten)]
        keys: KeyRangeArgs,
    },
}

pub async fn run_auth(args: AuthArgs) -> i32 {
    finish("auth", auth(args).await)
}

async fn auth(args: AuthArgs) -> Result<i32> {
    let c = connect(&args.client).await?;
    match args.command {
        AuthCommand::Enable => {
            c.auth_enable().await.map_err(describe)?;
            println!("Authentication Enabled");
        }
        AuthCommand::Disable => {
            c.auth_disable().await.map_err(describe)?;
            println!("Authentication Disabled");
        }
        AuthCommand::Status => {
            let s = c.auth_status().await.map_err(describe)?;
            println!("Authentication Status: {}", s.enabled);
            println!("AuthRevision: {}", s.auth_revision);
        }
    }
    Ok(0)
}

pub async fn run_user(args: UserArgs) -> i32 {
    finish("user", user(args).await)
}

async fn user(args: UserArgs) -> Result<i32> {
    let c = connect(&args.client).await?;
    match args.command {
        UserCommand::Add {
            name,
            new_password,
            no_password,
        } => {
            let (name, password) = match (name.split_once(':'), new_password, no_password) {
                (_, _, true) => (name.clone(), None),
                (_, Some(p), false) => (name.clone(), Some(p)),
                (Some((n, p)), None, false) => (n.to_string(), Some(p.to_string())),
                (None, None, false) => {
                    bail!("a password is needed: NAME:PASSWORD, --new-password or --no-password")
                }
            };
            c.user_add(&name, password.as_deref())
                .await
                .map_err(describe)?;
            println!("User {name} created");
        }
        UserCommand::Get { name } => {
            let u = c.user_get(&name).await.map_err(describe)?;
            println!("User: {name}");
            println!("Roles: {}", u.roles.join(" "));
        }
        UserCommand::List => {
            for u in c.user_list().await.map_err(describe)?.users {
                println!("{u}");
            }
        }
        UserCommand::Delete { name } => {
            c.user_delete(&name).await.map_err(describe)?;
            println!("User {name} deleted");
        }
        UserCommand::Passwd { name, new_password } => {
            c.user_change_password(&name, &new_password)
                .await
                .map_err(describe)?;
            println!("Password updated");
        }
        UserCommand::GrantRole { name, role } => {
            c.user_grant_role(&name, &role).await.map_err(describe)?;
            println!("Role {role} is granted to user {name}");
        }
        UserCommand::RevokeRole { name, role } => {
            c.user_revoke_role(&name, &role).await.map_err(describe)?;
            println!("Role {role} is revoked from user {name}");
        }
    }
    Ok(0)
}

pub async fn run_role(args: RoleArgs) -> i32 {
    finish("role", role(args).await)
}

fn perm_name(t: i32) -> &'static str {
    match authpb::permission::Type::try_from(t) {
        Ok(authpb::permission::Type::Read) => "READ",
        Ok(authpb::permission::Type::Write) => "WRITE",
        _ => "READWRITE",
    }
}

async fn role(args: RoleArgs) -> Result<i32> {
    let c = connect(&args.client).await?;
    match args.command {
        RoleCommand::Add { name } => {
            c.role_add(&name).await.map_err(describe)?;
            println!("Role {name} created");
        }
        RoleCommand::Get { name } => {
            let r = c.role_get(&name).await.map_err(describe)?;
            println!("Role {name}");
            println!("KV Read:");
            for p in r.perm.iter().filter(|p| perm_name(p.perm_type) != "WRITE") {
                println!("\t{}", describe_range(&p.key, &p.range_end));
            }
            println!("KV Write:");
            for p in r.perm.iter().filter(|p| perm_name(p.perm_type) != "READ") {
                println!("\t{}", describe_range(&p.key, &p.range_end));
            }
        }
        RoleCommand::List => {
            for r in c.role_list().await.map_err(describe)?.roles {
                println!("{r}");
            }
        }
        RoleCommand::Delete { name } => {
            c.role_delete(&name).await.map_err(describe)?;
            println!("Role {name} deleted");
        }
        RoleCommand::GrantPermission { name, perm, keys } => {
            let perm_type = match perm.to_ascii_lowercase().as_str() {
                "read" => authpb::permission::Type::Read,
                "write" => authpb::permission::Type::Write,
                "readwrite" => authpb::permission::Type::Readwrite,
                other => bail!("permission type {other:?}: read, write or readwrite"),
            };
            let (key, range_end) = keys.range();
            let p = authpb::Permission {
                perm_type: perm_type as i32,
                key,
                range_end,
            };
            c.role_grant_permission(&name, &p).await.map_err(describe)?;
            println!("Role {name} updated");
        }
        RoleCommand::RevokePermission { name, keys } => {
            let (key, range_end) = keys.range();
            c.role_revoke_permission(&name, &key, &range_end)
                .await
                .map_err(describe)?;
            println!(
                "Permission of range {} is revoked from role {name}",
                describe_range(&key, &range_end)
            );
        }
    }
    Ok(0)
}

/// etcdctl's wording of a permission's keys.
fn describe_range(key: &[u8], range_end: &[u8]) -> String {
    let k = String::from_utf8_lossy(key);
    match range_end {
        [] => k.into_owned(),
        [0] => format!("[{k}, <open ended>"),
        end => format!("[{k}, {})", String::from_utf8_lossy(end)),
    }
}
