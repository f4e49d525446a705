/// A response as stored under an idempotency key and replayed to retries: status, the
/// headers the service chose to keep, and the body.
///
/// The service builds it explicitly (rather than the store capturing whatever went out on the
/// wire) because it is written inside the work's transaction, before any byte is sent, and
/// because only some headers belong in a replay: `Content-Type` and `Location`, yes; `Date`
/// or a per-request trace id, no.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code (or any application status for non-HTTP use).
    pub status: u16,
    /// Header names and values, in order; names as given.
    pub headers: Vec<(String, String)>,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// A response with a status and nothing else.
    pub fn new(status: u16) -> Self {
        StoredResponse {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A JSON response: the status, `content-type: application/json` and the given body.
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Self {
        StoredResponse::new(status)
            .header("content-type", "application/json")
            .body(body)
    }

    /// Adds a header to keep in replays.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }
}
