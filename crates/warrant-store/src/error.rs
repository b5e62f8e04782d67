//! Mapping of database errors onto the store port's typed [`StoreError`].

use warrant_core::store::StoreError;

/// Converts sqlx results into the port's error type (`.db()?`).
pub(crate) trait Db<T> {
    fn db(self) -> Result<T, StoreError>;
}

impl<T> Db<T> for Result<T, sqlx::Error> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(from_sqlx)
    }
}

impl<T> Db<T> for Result<T, sqlx::migrate::MigrateError> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(|e| StoreError::Migration(e.to_string()))
    }
}

/// The typed error for a database error.
pub(crate) fn from_sqlx(error: sqlx::Error) -> StoreError {
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
