//! Rebuilds the store when a migration is added: `sqlx::migrate!` embeds the migration
//! directories at compile time, and a new file alone would not tell cargo to compile again.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
