//! Compiles every `*.bpf.c` in this directory with clang-19 into `OUT_DIR/<name>.o`.
//!
//! The kernel side is C: Rust BPF would need a nightly toolchain and bpf-linker, which the
//! stable toolchain the project builds with does not provide. `ALIASNET_CLANG` overrides the compiler.

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
    println!("cargo:rerun-if-changed=include");

    check_toolchain(&clang);

    // Kernel uapi headers (asm/types.h) live under the multiarch directory on Debian.
    let multiarch = format!("/usr/include/{}-linux-gnu", env::consts::ARCH);
    let include = manifest.join("include");

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

    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let stem = src
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 file name");
        let obj = out.join(stem.trim_end_matches(".c").to_owned() + ".o");
        compile(&clang, src, &obj, &include, Path::new(&multiarch));
    }
}

fn check_toolchain(clang: &str) {
    match Command::new(clang).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "`{clang} --version` failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!(
            "\n\naliasnet-ebpf needs `{clang}` to compile its eBPF programs, but running it failed: {e}\n\
             Install it with `apt-get install -y clang-19 libbpf-dev` (Debian 12), or point \
             ALIASNET_CLANG at a clang >= 14 with the BPF target.\n\n"
        ),
    }
    if !Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        panic!(
            "\n\naliasnet-ebpf needs the libbpf headers (/usr/include/bpf/bpf_helpers.h): \
             `apt-get install -y libbpf-dev`\n\n"
        );
    }
}

fn compile(clang: &str, src: &Path, obj: &Path, include: &Path, multiarch: &Path) {
    let output = Command::new(clang)
        .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Wextra", "-Werror"])
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
