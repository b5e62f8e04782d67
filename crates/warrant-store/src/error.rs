//! The store's typed errors. A caller that gets one must fail closed: no decision to allow is
//! made when the store cannot record it.

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached (connection refused, pool exhausted, I/O error).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A uniqueness rule refused the write (e.g. name@version registered with another body).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The addressed record does not exist (in this tenant).
    #[error("not found")]
    NotFound,
    /// A stored row cannot be read back (unknown enum text, malformed JSON, bad timestamp).
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The caller passed a value the store cannot hold (e.g. a number beyond i64).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// Applying the schema migrations failed.
    #[error("migration failed: {0}")]
    Migration(String),
    /// Any other database error.
    #[error("database error: {0}")]
    Database(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::RowNotFound => StoreError::NotFound,
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(error.to_string()),
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) | sqlx::Error::ColumnNotFound(_) => {
                StoreError::Corrupt(error.to_string())
            }
            sqlx::Error::Database(db) if db.is_unique_violation() => {
                StoreError::Conflict(db.message().to_owned())
            }
            sqlx::Error::Database(db) => {
                // SQLITE_BUSY / SQLITE_LOCKED and PostgreSQL connection-class errors mean the
                // database is there but not usable right now.
                let code = db.code().unwrap_or_default();
                if code == "5" || code == "6" || code.starts_with("08") || code == "57P01" {
                    StoreError::Unavailable(db.message().to_owned())
                } else {
                    StoreError::Database(db.message().to_owned())
                }
            }
            sqlx::Error::Migrate(e) => StoreError::Migration(e.to_string()),
            _ => StoreError::Database(error.to_string()),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(error: sqlx::migrate::MigrateError) -> Self {
        StoreError::Migration(error.to_string())
    }
}
