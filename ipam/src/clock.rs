//! The daemon's clock: wall time when the daemon started, advanced by the kernel's boot-time
//! clock (monotonic, counts suspend).
//!
//! Cooldowns and lease times are compared against this clock, so a step of the wall clock
//! while the daemon runs (NTP fixing a bad RTC, an operator's `date -s`) neither releases
//! cooling addresses early nor stretches their cooldown. The times it produces are persisted
//! (allocation and release times), so they stay close to wall time across restarts; on load
//! the clock is never behind the newest persisted time (the wall clock went back while the
//! daemon was down), which keeps persisted cooldowns from growing. A forward step while the
//! daemon is down cannot be told from real downtime.
//!
//! Spool entries written by the plugin carry the boot id and boot-time clock of their DEL, so
//! their time maps onto this clock exactly whatever the wall clock did in between; entries
//! without them (an older plugin, another boot) fall back to their wall time, never later
//! than now.

use std::sync::atomic::{AtomicU64, Ordering};

use aliasnet_ipam_proto::spool::{boot_clock, SpoolEntry};

pub type WallFn = Box<dyn Fn() -> u64 + Send + Sync>;

pub struct Clock {
    /// Daemon time at `anchor_boot`.
    anchor: AtomicU64,
    /// Boot-time clock (ms) when the clock was made.
    anchor_boot: u64,
    boot_id: Option<String>,
    /// Time added by [`Clock::advance`] (tests).
    advanced: AtomicU64,
    wall: WallFn,
}

impl Clock {
    /// The system's clocks.
    pub fn system() -> Self {
        Self::with_wall(Box::new(crate::service::now_ms))
    }

    /// Wall time from `wall` (tests inject steps), monotonic time from the kernel.
    pub fn with_wall(wall: WallFn) -> Self {
        let (boot_id, anchor_boot) = match boot_clock() {
            Some((id, ms)) => (Some(id), ms),
            None => (None, 0),
        };
        Self {
            anchor: AtomicU64::new(wall()),
            anchor_boot,
            boot_id,
            advanced: AtomicU64::new(0),
            wall,
        }
    }

    fn at_boot(&self, boot_ms: u64) -> u64 {
        (self.anchor.load(Ordering::Relaxed) + self.advanced.load(Ordering::Relaxed))
            .saturating_add(boot_ms.saturating_sub(self.anchor_boot))
            .saturating_sub(self.anchor_boot.saturating_sub(boot_ms))
    }

    /// Now, in milliseconds (close to the Unix epoch's, never stepping).
    pub fn now_ms(&self) -> u64 {
        match boot_clock() {
            Some((_, b)) => self.at_boot(b),
            None => self.anchor.load(Ordering::Relaxed) + self.advanced.load(Ordering::Relaxed),
        }
    }

    /// The wall clock now.
    pub fn wall_ms(&self) -> u64 {
        (self.wall)()
    }

    /// Let `d` pass without waiting for it (tests).
    pub fn advance(&self, d: std::time::Duration) {
        self.advanced.fetch_add(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Never read earlier than `t` (the newest time in the loaded state) from now on.
    pub fn not_before(&self, t: u64) {
        let now = self.now_ms();
        if t > now {
            self.anchor.fetch_add(t - now, Ordering::Relaxed);
        }
    }

    /// When the DEL behind a spool entry ran, on this clock (see the module documentation).
    pub fn spooled_at(&self, e: &SpoolEntry) -> u64 {
        match (&e.boot_id, e.boot_ms, &self.boot_id) {
            (Some(id), Some(b), Some(ours)) if id == ours => self.at_boot(b).min(self.now_ms()),
            _ => e.released_at_ms.min(self.now_ms()),
        }
    }
}
