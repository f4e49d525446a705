//! MariaDB XA participant (in progress).
