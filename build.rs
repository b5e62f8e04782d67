//! Link settings for the `warrant` binary.
//!
//! On Linux with glibc 2.36 or newer (native builds only), the binary is linked with packed
//! relative relocations (`-z pack-relative-relocs`, `DT_RELR`). A position-independent Rust
//! binary carries tens of thousands of relative relocations (vtables, string tables); as
//! `RELA` entries they take about 1.3 MB that the dynamic loader reads at every start, and those
//! pages stay resident. Packed, they take a few kilobytes (docs/benchmarks.md, "Memory").
//! The binary stays position-independent. Older glibc cannot load `DT_RELR`, so the flag is
//! only passed when the build machine's glibc — the one a native build runs on — has it.
//!
//! Where the linker is LLD (Rust's default on `x86_64-unknown-linux-gnu` since 1.90), the
//! release binary's functions are laid out in the order of `link/symbol-order.txt`
//! (`--symbol-ordering-file`): the functions a serving gateway runs, most-run first, together at
//! the start of the text segment. The kernel maps the 64 KiB around each faulted page of code,
//! and those functions are otherwise scattered over the whole segment, so nearly all of it
//! ends up resident; laid out together, about a third is (docs/benchmarks.md, "Code layout").
//! Names the linker does not find are skipped (`--no-warn-symbol-ordering`): a stale file
//! costs memory, never correctness. `crates/warrant-server/benches/layout.sh` writes the file;
//! `WARRANT_LINK_ORDER=0` builds without it (e.g. when linking with another linker).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={ORDER}");
    println!("cargo:rerun-if-env-changed=WARRANT_LINK_ORDER");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let native = var("HOST") == var("TARGET");
    if native
        && var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "gnu"
        && glibc_at_least(2, 36)
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    if var("PROFILE") == "release" && var("WARRANT_LINK_ORDER") != "0" && links_with_lld() {
        let order = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join(ORDER);
        if order.is_file() {
            println!(
                "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
                order.display()
            );
            println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
        }
    }
}

/// The function order of the release binary, relative to the package root.
const ORDER: &str = "link/symbol-order.txt";

/// Whether the binary is linked by LLD: Rust's default for `x86_64-unknown-linux-gnu` from
/// 1.90, unless the build names another linker (or linker flavour) itself.
fn links_with_lld() -> bool {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("TARGET") != "x86_64-unknown-linux-gnu"
        || std::env::var("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_ok()
        || var("CARGO_ENCODED_RUSTFLAGS").contains("link")
    {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let Ok(out) = Command::new(rustc).arg("-V").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    second_word_at_least(&out.stdout, 1, 90)
}

/// Whether `getconf GNU_LIBC_VERSION` reports at least `major.minor`.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    // "glibc 2.36"
    second_word_at_least(&out.stdout, major, minor)
}

/// Whether the version that is the second word of a tool's output ("glibc 2.36", "rustc
/// 1.95.0 (…)") is at least `major.minor`.
fn second_word_at_least(output: &[u8], major: u32, minor: u32) -> bool {
    let text = String::from_utf8_lossy(output);
    let Some(version) = text.split_whitespace().nth(1) else {
        return false;
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}
