//! A private mount namespace: mounts a test makes there (a tiny tmpfs, a bpffs of its own, a
//! directory hidden under an empty one) are invisible to the node and to every other test, and
//! go away with the namespace.
//!
//! The namespace belongs to one thread, which runs what the test sends it; processes spawned
//! there start in the namespace, so a daemon can be started, killed and restarted on the
//! same private mounts.

use std::{path::Path, process::Command, sync::mpsc, thread::JoinHandle};

use anyhow::{bail, Context, Result};

type Job = Box<dyn FnOnce() + Send>;

/// A thread in a mount namespace of its own (unshared from the test's, every mount private).
/// Dropping it ends the thread; the namespace and its mounts go once the last process in it
/// (a child spawned through [`MountNs::run`]) exits.
pub struct MountNs {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl MountNs {
    pub fn new() -> Result<Self> {
        crate::require_root();
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name("mount-ns".into())
            .spawn(move || {
                let setup = (|| -> Result<()> {
                    // CLONE_NEWNS unshares this thread's filesystem context too: the thread
                    // leaves the process's mount namespace, the other threads stay.
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
                        .context("unshare the mount namespace")?;
                    // Nothing mounted here may propagate back to the node.
                    nix::mount::mount(
                        None::<&str>,
                        "/",
                        None::<&str>,
                        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                        None::<&str>,
                    )
                    .context("make every mount private")?;
                    Ok(())
                })();
                let ok = setup.is_ok();
                let _ = ready_tx.send(setup);
                if ok {
                    for job in rx {
                        job();
                    }
                }
            })
            .context("spawn the mount namespace's thread")?;
        ready.recv().context("mount namespace thread")??;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Runs `f` on the namespace's thread and returns its result.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .as_ref()
            .expect("live")
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .expect("mount namespace thread alive");
        rx.recv().expect("mount namespace job finished")
    }

    /// `mount -t tmpfs -o OPTIONS` on `dir` (which must exist) inside the namespace.
    pub fn tmpfs(&self, dir: &Path, options: &str) -> Result<()> {
        let (dir, options) = (dir.to_owned(), options.to_owned());
        self.run(move || {
            let out = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &options, "aliasnet-test"])
                .arg(&dir)
                .output()
                .context("spawning mount")?;
            if !out.status.success() {
                bail!(
                    "mount tmpfs on {}: {}",
                    dir.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(())
        })
    }
}

impl Drop for MountNs {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
