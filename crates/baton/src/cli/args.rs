//! Arguments the client commands share: where Baton is, and durations as people write them.

use std::time::Duration;

use clap::Args;

/// Where to find Baton. Shared by the client commands.
#[derive(Args, Debug, Clone)]
pub struct EndpointArgs {
    /// Comma-separated gRPC endpoints (host:port or http://host:port), tried in order until
    /// one accepts a connection.
    #[arg(
        long,
        env = "BATON_ENDPOINTS",
        default_value = "127.0.0.1:2379",
        value_delimiter = ','
    )]
    pub endpoints: Vec<String>,
}

/// Parses a human duration: `10` or `1.5` (seconds), `500ms`, `2s`, `1m`.
///
/// Plain numbers are seconds so `--timeout 30` means what etcdctl users expect; the suffixes
/// exist because lock-delays and grace periods are often sub-second.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (examples: 10, 1.5, 500ms, 2s, 1m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("'{text}': a duration cannot be negative"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("").is_err());
    }
}
