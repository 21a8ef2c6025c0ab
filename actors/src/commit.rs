//! Group commit. Channel actors append batches to the store (in memory until flushed) and then
//! ask the committer for durability; one thread flushes for every request that arrived before
//! the flush began, so concurrent writers on any channel share one fsync.

use crate::store::{EventStore, StoreError};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// After the store has flushed it (default): written to the disk with sled's flush, so an
    /// acknowledged write survives a crash of the process. sled's flush on Linux is
    /// `sync_file_range`, which neither flushes the drive's cache nor commits file metadata;
    /// sled fsyncs in the background every 500 ms.
    Flush,
    /// After the flush and an `fdatasync` of the store's log: an acknowledged write also
    /// survives a power loss on hardware that honours cache flushes. Slower.
    Fsync,
    /// As soon as it is in the store's memory; the store flushes in the background every
    /// 500 ms, so a crash can lose up to that much acknowledged data. For throwaway relays.
    Relaxed,
}

type Waiter = oneshot::Sender<Result<(), StoreError>>;

/// A handle to the flusher thread. Cloning it is cheap; the thread ends when every handle is gone.
#[derive(Clone)]
pub struct Committer {
    tx: Option<mpsc::Sender<Waiter>>,
}

impl Committer {
    pub fn start(store: Arc<dyn EventStore>, durability: Durability) -> std::io::Result<Self> {
        if durability == Durability::Relaxed {
            return Ok(Committer { tx: None });
        }
        let (tx, rx) = mpsc::channel::<Waiter>();
        std::thread::Builder::new()
            .name("crosstalk-commit".into())
            .spawn(move || {
                let mut waiters = Vec::new();
                while let Ok(first) = rx.recv() {
                    // Everything queued now was appended before this flush starts: one flush
                    // makes all of it durable.
                    waiters.push(first);
                    waiters.extend(rx.try_iter());
                    let result = if durability == Durability::Fsync {
                        store.sync()
                    } else {
                        store.flush()
                    };
                    if let Err(e) = &result {
                        tracing::error!(error = %e, "flush failed; writes are not acknowledged");
                    }
                    for w in waiters.drain(..) {
                        let _ = w.send(result.clone());
                    }
                }
            })?;
        Ok(Committer { tx: Some(tx) })
    }

    /// Resolves once everything appended before this call is durable.
    pub fn durable(&self) -> oneshot::Receiver<Result<(), StoreError>> {
        let (tx, rx) = oneshot::channel();
        match &self.tx {
            Some(queue) => {
                if let Err(mpsc::SendError(w)) = queue.send(tx) {
                    let _ = w.send(Err(StoreError::Io("the committer has stopped".into())));
                }
            }
            None => {
                let _ = tx.send(Ok(()));
            }
        }
        rx
    }
}
