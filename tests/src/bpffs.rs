//! A private bpffs instance: pins of different tests and benchmarks cannot collide, and
//! unmounting it frees everything pinned there.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::netns::run;

/// A bpffs mounted on a fresh temp directory; unmounted on drop (pinned links of deleted
/// devices are inert, and the last reference to every map and program goes with the mount).
#[derive(Debug)]
pub struct Bpffs {
    dir: tempfile::TempDir,
}

impl Bpffs {
    pub fn mount(prefix: &str) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .context("bpffs mountpoint")?;
        run(Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(dir.path()))?;
        Ok(Self { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The datapath's pin root inside this instance.
    pub fn pin_root(&self) -> PathBuf {
        self.path().join("aliasnet")
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).output();
    }
}
