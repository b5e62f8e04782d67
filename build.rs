//! Link settings for the `warrant` binary.
//!
//! On Linux with glibc 2.36 or newer (native builds only), the binary is linked with packed
//! relative relocations (`-z pack-relative-relocs`, `DT_RELR`). A position-independent Rust
//! binary carries tens of thousands of relative relocations (vtables, string tables); as
//! `RELA` entries they take about 1.3 MB that the dynamic loader reads at every start, and those
//! pages stay resident. Packed, they take a few kilobytes (docs/benchmarks.md, "Memory").
//! The binary stays position-independent. Older glibc cannot load `DT_RELR`, so the flag is
//! only passed when the build machine's glibc — the one a native build runs on — has it.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let native = var("HOST") == var("TARGET");
    if native
        && var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "gnu"
        && glibc_at_least(2, 36)
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether `getconf GNU_LIBC_VERSION` reports at least `major.minor`.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    // "glibc 2.36"
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.split_whitespace().nth(1) else {
        return false;
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}
