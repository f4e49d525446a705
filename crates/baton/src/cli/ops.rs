//! The flags of one key operation — `get`, `put`, `del` — and the client options they
//! describe. Shared by `baton kv get|put|del` (`kv`) and the operations of `baton kv txn`
//! (`txn`), in a module of their own so that `kv` (which runs `txn`) and `txn` (which reuses
//! these) do not import each other (the tidy test `no_module_cycles`).

use baton_client::{DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget};
use clap::{Args, ValueEnum};

use super::client::parse_lease;

/// `--sort-by` choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SortBy {
    Key,
    Create,
    Mod,
    Version,
    Value,
}

/// `--order` choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Order {
    Asc,
    Desc,
}

#[derive(Args, Debug, Clone)]
#[command(about = "Read a key, a range [KEY, RANGE_END), a prefix, or every key from KEY on")]
pub struct GetArgs {
    /// The key (the start of the range with RANGE_END, --prefix or --from-key).
    pub key: String,
    /// End of the range, exclusive.
    #[arg(conflicts_with_all = ["prefix", "from_key"])]
    pub range_end: Option<String>,
    /// Every key that starts with KEY (`--prefix ''`: every key).
    #[arg(long, conflicts_with = "from_key")]
    pub prefix: bool,
    /// Every key greater than or equal to KEY.
    #[arg(long)]
    pub from_key: bool,
    /// Read the store as of this revision (0: the latest).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub rev: i64,
    /// Return at most N keys (0: no limit); the count still covers the whole range.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub limit: i64,
    /// Keys and their revisions only, no values.
    #[arg(long)]
    pub keys_only: bool,
    /// Only the number of keys.
    #[arg(long, conflicts_with = "keys_only")]
    pub count_only: bool,
    /// Sort by this field (ascending unless --order desc).
    #[arg(long, value_enum, value_name = "FIELD")]
    pub sort_by: Option<SortBy>,
    /// Sort order (with no --sort-by: by key).
    #[arg(long, value_enum)]
    pub order: Option<Order>,
}

#[derive(Args, Debug, Clone)]
#[command(about = "Write a key (the value from stdin if VALUE is not given)")]
pub struct PutArgs {
    pub key: String,
    /// The value; read from stdin (all of it, bytes as they are) if left out.
    #[arg(allow_hyphen_values = true)]
    pub value: Option<String>,
    /// Attach the key to this lease (hex id, as `baton lease grant` prints it): the key is
    /// deleted when the lease ends.
    #[arg(long, value_parser = parse_lease, value_name = "HEX")]
    pub lease: Option<i64>,
}

#[derive(Args, Debug, Clone)]
#[command(about = "Delete a key, a range [KEY, RANGE_END), a prefix, or every key from KEY on")]
pub struct DelArgs {
    pub key: String,
    /// End of the range, exclusive.
    #[arg(conflicts_with_all = ["prefix", "from_key"])]
    pub range_end: Option<String>,
    /// Every key that starts with KEY.
    #[arg(long, conflicts_with = "from_key")]
    pub prefix: bool,
    /// Every key greater than or equal to KEY.
    #[arg(long)]
    pub from_key: bool,
    /// Print the deleted key-value pairs.
    #[arg(long)]
    pub prev_kv: bool,
}

/// etcd's "every key from here on": a range end of a single zero byte.
pub const FROM_KEY_END: &[u8] = &[0];

impl GetArgs {
    /// The request these flags describe.
    pub fn options(&self) -> GetOptions {
        let mut o = GetOptions::new()
            .with_revision(self.rev)
            .with_limit(self.limit);
        if self.prefix {
            o = o.with_prefix();
        } else if self.from_key {
            o = o.with_range_end(FROM_KEY_END);
        } else if let Some(end) = &self.range_end {
            o = o.with_range_end(end.as_bytes());
        }
        if self.keys_only {
            o = o.with_keys_only();
        }
        if self.count_only {
            o = o.with_count_only();
        }
        // etcdctl's defaults: an order without a field sorts by key; a field without an
        // order sorts ascending.
        if self.sort_by.is_some() || self.order.is_some() {
            let target = match self.sort_by.unwrap_or(SortBy::Key) {
                SortBy::Key => SortTarget::Key,
                SortBy::Create => SortTarget::Create,
                SortBy::Mod => SortTarget::Mod,
                SortBy::Version => SortTarget::Version,
                SortBy::Value => SortTarget::Value,
            };
            let order = match self.order.unwrap_or(Order::Asc) {
                Order::Asc => SortOrder::Ascend,
                Order::Desc => SortOrder::Descend,
            };
            o = o.with_sort(target, order);
        }
        o
    }
}

impl PutArgs {
    /// The put options these flags describe.
    pub fn options(&self) -> PutOptions {
        match self.lease {
            Some(l) => PutOptions::new().with_lease(l),
            None => PutOptions::new(),
        }
    }
}

impl DelArgs {
    /// The request these flags describe.
    pub fn options(&self) -> DeleteOptions {
        let mut o = DeleteOptions::new();
        if self.prefix {
            o = o.with_prefix();
        } else if self.from_key {
            o = o.with_range_end(FROM_KEY_END);
        } else if let Some(end) = &self.range_end {
            o = o.with_range_end(end.as_bytes());
        }
        if self.prev_kv {
            o = o.with_prev_kv();
        }
        o
    }
}
