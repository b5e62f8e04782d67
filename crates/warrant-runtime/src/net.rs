//! The SSRF-safe outbound HTTP client every adapter uses (being built).
