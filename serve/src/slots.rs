//! Connection slots. At most `max` connections are served; a connection is *waiting* while it
//! waits for its client (for a request, or for the client to take a reply) and *busy* while
//! its request is handled. Accepting never stops for waiting connections: at the limit the one
//! that has waited longest is closed to make room, so clients that connect and idle, trickle,
//! or never read their answers cannot lock a real client out. Only when every slot is busy
//! (requests that finish within milliseconds) does a new connection wait for one.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
};

use tokio::sync::Notify;

pub struct Slots {
    max: usize,
    inner: Mutex<Inner>,
    /// Signalled when a slot frees or a connection starts waiting (at the limit only).
    changed: Notify,
}

#[derive(Default)]
struct Inner {
    live: usize,
    next: u64,
    /// Waiting connections by when they started waiting, with the signal that closes them.
    waiting: BTreeMap<u64, Arc<Notify>>,
}

impl Slots {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            inner: Default::default(),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain counters: a panic elsewhere cannot leave them half-updated.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a slot now, closing the longest-waiting connection at the limit; `false` when
    /// every slot is busy.
    fn try_claim(&self) -> bool {
        let mut g = self.lock();
        if g.live >= self.max {
            let Some((_, kick)) = g.waiting.pop_first() else {
                return false;
            };
            // Its slot is ours from now; the evicted connection only closes its socket.
            kick.notify_one();
            g.live -= 1;
        }
        g.live += 1;
        true
    }

    /// A slot for a new connection: at once unless every slot is busy, then as soon as one
    /// frees or starts waiting. `None` if `stop` resolves first.
    pub async fn claim(self: &Arc<Self>, stop: impl Future<Output = ()>) -> Option<Slot> {
        tokio::pin!(stop);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.try_claim() {
                return Some(Slot {
                    slots: self.clone(),
                    kick: Arc::new(Notify::new()),
                    waiting: None,
                    evicted: false,
                });
            }
            tokio::select! {
                _ = changed => {}
                _ = &mut stop => return None,
            }
        }
    }

    /// Connections holding a slot.
    pub fn live(&self) -> usize {
        self.lock().live
    }
}

/// A connection's slot; released on drop.
pub struct Slot {
    slots: Arc<Slots>,
    kick: Arc<Notify>,
    waiting: Option<u64>,
    evicted: bool,
}

impl Slot {
    /// The connection waits for its client: it may be closed to make room.
    pub fn wait(&mut self) {
        if self.waiting.is_some() || self.evicted {
            return;
        }
        let mut g = self.slots.lock();
        let seq = g.next;
        g.next += 1;
        g.waiting.insert(seq, self.kick.clone());
        let full = g.live >= self.slots.max;
        drop(g);
        self.waiting = Some(seq);
        if full {
            self.slots.changed.notify_one();
        }
    }

    /// The connection has work to do; `false` if it was evicted meanwhile.
    pub fn busy(&mut self) -> bool {
        if let Some(seq) = self.waiting.take() {
            if self.slots.lock().waiting.remove(&seq).is_none() {
                self.evicted = true;
            }
        }
        !self.evicted
    }

    /// Resolves when this connection was chosen to make room (also if that happened before
    /// the call).
    pub async fn evicted(&self) {
        self.kick.notified().await;
    }

    /// [`Slot::evicted`] as a future that does not borrow the slot.
    pub fn eviction(&self) -> impl Future<Output = ()> + Send + 'static {
        let kick = self.kick.clone();
        async move { kick.notified().await }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.busy() {
            // Eviction already gave the slot away.
            return;
        }
        self.slots.lock().live -= 1;
        self.slots.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_longest_waiting_connection_makes_room_and_busy_ones_are_waited_for() {
        let slots = Slots::new(2);
        let never = std::future::pending::<()>;
        let mut a = slots.claim(never()).await.unwrap();
        let mut b = slots.claim(never()).await.unwrap();
        a.wait();
        b.wait();
        // At the limit: `a` waited longest and goes.
        let mut c = slots.claim(never()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), a.evicted())
            .await
            .expect("a evicted");
        assert!(!a.busy());
        drop(a);
        assert_eq!(slots.live(), 2);
        // Both busy: a new connection waits until one starts waiting.
        assert!(b.busy() && c.busy());
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.claim(std::future::pending()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        c.wait();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("claimed once c waits")
            .unwrap()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), c.evicted())
            .await
            .expect("c evicted");
        drop(c);
        assert_eq!(slots.live(), 1);
        // Every slot busy again: stopping ends the wait.
        let d = slots.claim(never()).await.unwrap();
        assert!(slots.claim(async {}).await.is_none());
        drop((b, d));
        assert_eq!(slots.live(), 0);
    }
}
