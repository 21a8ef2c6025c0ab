//! A bounded `tokio::sync::mpsc` channel whose slots hold a box of each message rather than the
//! message itself (crosstalk's patch).
//!
//! tokio allocates a channel's slots 32 at a time, and the first 32 when the channel is made.
//! rmcp's JSON-RPC messages are about 500 bytes, so each channel a session or a request holds
//! cost 16 KiB before it carried anything, and a streamable-HTTP session holds about seven
//! (its worker's three, its event and common channels, its peer's and its sink proxy's). Boxed,
//! a channel's first slots are 256 bytes and a message costs one allocation of its size while
//! it is queued. The methods are tokio's, by the same names, so the code that uses a channel
//! reads as before.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tokio::sync::mpsc;

pub use tokio::sync::mpsc::error;

/// A bounded channel of `buffer` messages, each boxed while it waits.
pub fn channel<T>(buffer: usize) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = mpsc::channel(buffer);
    (Sender { inner: tx }, Receiver { inner: rx })
}

pub struct Sender<T> {
    inner: mpsc::Sender<Box<T>>,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender {
            inner: self.inner.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl<T> Sender<T> {
    pub async fn send(&self, value: T) -> Result<(), error::SendError<T>> {
        self.inner
            .send(Box::new(value))
            .await
            .map_err(|error::SendError(b)| error::SendError(*b))
    }

    pub fn try_send(&self, value: T) -> Result<(), error::TrySendError<T>> {
        self.inner.try_send(Box::new(value)).map_err(|e| match e {
            error::TrySendError::Full(b) => error::TrySendError::Full(*b),
            error::TrySendError::Closed(b) => error::TrySendError::Closed(*b),
        })
    }

    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }


    pub fn capacity(&self) -> usize {
        self.inner.capacity()
    }

}

pub struct Receiver<T> {
    inner: mpsc::Receiver<Box<T>>,
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

impl<T> Receiver<T> {
    pub async fn recv(&mut self) -> Option<T> {
        self.inner.recv().await.map(|b| *b)
    }


    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.inner.poll_recv(cx).map(|m| m.map(|b| *b))
    }

    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

}

/// A receiver is a stream of its messages, as tokio-stream's `ReceiverStream` makes one.
impl<T> futures::Stream for Receiver<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.get_mut().poll_recv(cx)
    }
}
