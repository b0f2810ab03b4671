//! Compiles every `*.bpf.c` in this directory with clang-19 into `OUT_DIR/<name>.bpf.o`, and
//! again with `-DAN_BENCH_SWITCHES` into `OUT_DIR/<name>.bench.bpf.o`: the benchmarks' build,
//! whose programs obey the switches in `an_config.flags` (see `aliasnet_tuning.h`); the
//! product's object has none.
//!
//! The kernel side is C: Rust BPF would need a nightly toolchain and bpf-linker, which the
//! stable toolchain the project builds with does not provide. `ALIASNET_CLANG` overrides the
//! compiler.
//!
//! Without clang (or the libbpf headers), or with `ALIASNET_EBPF_STUB=1`, every object is an
//! empty stub and cargo prints a warning, as aya's integration tests do: `cargo check`,
//! `clippy` and `doc` then work on any machine, and loading the object fails at run time
//! with an error that says why (see `aliasnet_ebpf::datapath_object`).

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("ALIASNET_CLANG").unwrap_or_else(|_| "clang-19".to_owned());
    println!("cargo:rerun-if-env-changed=ALIASNET_CLANG");
    println!("cargo:rerun-if-env-changed=ALIASNET_EBPF_STUB");
    println!("cargo:rerun-if-changed=include");
    println!("cargo:rerun-if-changed=lib");

    let mut sources: Vec<PathBuf> = std::fs::read_dir(&manifest)
        .expect("read ebpf/ directory")
        .map(|e| e.expect("read ebpf/ entry").path())
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(".bpf.c")))
        .collect();
    sources.sort();
    assert!(
        !sources.is_empty(),
        "no *.bpf.c sources in {}",
        manifest.display()
    );
    // (source, object, whether the benchmark switches are compiled in)
    let objects: Vec<(PathBuf, PathBuf, bool)> = sources
        .into_iter()
        .flat_map(|src| {
            println!("cargo:rerun-if-changed={}", src.display());
            let name = src
                .file_name()
                .and_then(|n| n.to_str())
                .expect("utf-8 file name")
                .trim_end_matches(".bpf.c")
                .to_owned();
            [
                (src.clone(), out.join(format!("{name}.bpf.o")), false),
                (src, out.join(format!("{name}.bench.bpf.o")), true),
            ]
        })
        .collect();

    let stub_reason = if env::var("ALIASNET_EBPF_STUB").is_ok_and(|v| v == "1") {
        Some("ALIASNET_EBPF_STUB=1".to_owned())
    } else {
        check_toolchain(&clang).err()
    };
    if let Some(reason) = stub_reason {
        println!(
            "cargo:warning=aliasnet-ebpf: eBPF objects are empty stubs ({reason}); \
             loading them fails at run time. Install clang-19 and libbpf-dev to build them."
        );
        // Read by `datapath_object()` to explain the failure.
        println!("cargo:rustc-env=ALIASNET_EBPF_STUB_REASON={reason}");
        for (_, obj, _) in &objects {
            std::fs::write(obj, []).unwrap_or_else(|e| panic!("write {}: {e}", obj.display()));
        }
        return;
    }
    println!("cargo:rustc-env=ALIASNET_EBPF_STUB_REASON=");

    // Kernel uapi headers (asm/types.h) live under the multiarch directory on Debian.
    let multiarch = format!("/usr/include/{}-linux-gnu", env::consts::ARCH);
    let include = manifest.join("include");
    let multiarch = Path::new(&multiarch);
    std::thread::scope(|s| {
        for (src, obj, bench) in &objects {
            let (clang, include) = (&clang, &include);
            s.spawn(move || compile(clang, src, obj, *bench, include, multiarch));
        }
    });
}

/// Why `clang` cannot build the programs, if it cannot.
fn check_toolchain(clang: &str) -> Result<(), String> {
    match Command::new(clang).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return Err(format!(
                "`{clang} --version` failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Err(e) => return Err(format!("cannot run `{clang}`: {e}")),
    }
    if !Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        return Err("the libbpf headers (/usr/include/bpf/bpf_helpers.h) are missing".to_owned());
    }
    Ok(())
}

fn compile(clang: &str, src: &Path, obj: &Path, bench: bool, include: &Path, multiarch: &Path) {
    let output = Command::new(clang)
        .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Wextra", "-Werror"])
        .args(bench.then_some("-DAN_BENCH_SWITCHES"))
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{}", multiarch.display()))
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(obj)
        .output()
        .unwrap_or_else(|e| panic!("run {clang}: {e}"));
    if !output.status.success() {
        panic!(
            "{clang} failed to compile {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
