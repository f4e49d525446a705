//! Sagas (in progress).
