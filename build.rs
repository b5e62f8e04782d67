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
//! ends up resident; laid out together, only about the quarter that runs is
//! (docs/benchmarks.md, "code layout"). Names the linker does not find are skipped
//! (`--no-warn-symbol-ordering`): a stale file costs memory, never correctness. The names carry
//! hashes of the compiler, of the dependency graph and of the release profile's settings, so
//! the file is remade when any of them changes; its first line names the compiler it was made
//! with (a build by another one warns) and its second the digest of the `Cargo.lock`, and
//! `tests/layout.rs` holds both to the build's. `crates/warrant-server/benches/layout.sh`
//! writes the file; `WARRANT_LINK_ORDER=0` builds without it (e.g. when linking with another
//! linker).
//!
//! The release's crates are compiled with the gateway's optimisation profile by the workspace's
//! rustc wrapper (`link/rustc`, `link/warrant.profdata`), which no build script can pass to
//! other crates; this says once when a release is compiled without it.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={ORDER}");
    println!("cargo:rerun-if-env-changed=WARRANT_LINK_ORDER");
    // Declared whatever this build is, so that turning the profile back on (or the wrapper
    // back to `link/rustc`) runs this again and `warn_without_profile` sees it.
    println!("cargo:rerun-if-changed={PROFILE}");
    println!("cargo:rerun-if-env-changed=WARRANT_PGO");
    println!("cargo:rerun-if-env-changed=RUSTC_WRAPPER");
    let native = var("HOST") == var("TARGET");
    if native
        && var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "gnu"
        && glibc_at_least(2, 36)
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    let rustc = rustc_version();
    // The compiler building this, for `tests/layout.rs`.
    println!("cargo:rustc-env=WARRANT_BUILT_WITH={rustc}");
    if var("PROFILE") == "release" && var("WARRANT_PGO") != "0" {
        warn_without_profile(&rustc);
    }
    if var("PROFILE") == "release" && var("WARRANT_LINK_ORDER") != "0" && links_with_lld(&rustc) {
        let order = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join(ORDER);
        let Some(made_with) = made_with(&order) else {
            return;
        };
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
        // Symbol names carry hashes of the compiler and the build's settings; the file's
        // first line names the compiler it was made with (lld reads `#` as a comment).
        if made_with != rustc {
            println!(
                "cargo:warning={ORDER} was made with `{made_with}`, this build uses `{rustc}`: \
                 most functions keep their usual place and more of the binary stays resident; \
                 run crates/warrant-server/benches/layout.sh to remake it"
            );
        }
    }
}

/// An environment variable cargo gives the build script, empty when unset.
fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

/// The function order of the release binary, relative to the package root.
const ORDER: &str = "link/symbol-order.txt";

/// The header of the release build's optimisation profile (`link/rustc` reads its first line,
/// the compiler it was made with), relative to the package root.
const PROFILE: &str = "link/warrant.profdata.txt";

/// Says once, for the whole build, when the release is compiled without the gateway's profile
/// (`link/rustc` passes it to each crate's compile and cannot say so once itself): another
/// wrapper replaced `link/rustc` (`RUSTC_WRAPPER`, e.g. sccache), or the profile was made with
/// another compiler. `WARRANT_PGO=0` builds without it on purpose, and says nothing.
fn warn_without_profile(rustc: &str) {
    let wrapper = var("RUSTC_WRAPPER");
    if !wrapper.ends_with("link/rustc") {
        println!(
            "cargo:warning=the release is compiled with the wrapper `{wrapper}` instead of \
             link/rustc, without the gateway's optimisation profile (about 15% more CPU per call)"
        );
        return;
    }
    let header = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join(PROFILE);
    let made_with = made_with(&header).unwrap_or_default();
    if made_with != rustc {
        println!(
            "cargo:warning=link/warrant.profdata was made with `{made_with}`, this build uses \
             `{rustc}`: the release is compiled without it (about 15% more CPU per call); run \
             crates/warrant-server/benches/pgo.sh to remake it"
        );
    }
}

/// The compiler a file made from a profile of the gateway was made with: its first line, `# `
/// and `rustc -V` (`link/rustc` reads the profile's the same way); `None` when it cannot be
/// read.
fn made_with(file: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    Some(
        text.lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("# ")
            .to_owned(),
    )
}

/// `rustc -V` of the compiler building this ("rustc 1.95.0 (59807616e 2026-04-14)"); empty
/// when it cannot be run.
fn rustc_version() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    Command::new(rustc)
        .arg("-V")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Whether the binary is linked by LLD: Rust's default for `x86_64-unknown-linux-gnu` from
/// 1.90, unless the build names another linker (or linker flavour) itself.
fn links_with_lld(rustc: &str) -> bool {
    var("TARGET") == "x86_64-unknown-linux-gnu"
        && std::env::var("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_err()
        && !var("CARGO_ENCODED_RUSTFLAGS").contains("link")
        && second_word_at_least(rustc.as_bytes(), 1, 90)
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
