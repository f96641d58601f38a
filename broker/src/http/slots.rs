//! The API's connection slots: a general pool, and a reserve only the operator (its
//! token, or a dashboard login) may use once the general pool is full, so no crowd of
//! other clients locks the operator out.
//!
//! A connection gets a slot only once it has sent its first request head: until then
//! it waits among the *unproven* (`serve` reads its head), bounded apart, where a new
//! connection takes the place of the oldest when all are taken (which is closed).
//! Half-sent heads then only push each other out and never hold a slot; a client that
//! sends its head at once (every real one) gets in. A connection in
//! a reserve slot whose request is not the operator's is answered `overloaded` and
//! closed (`layers::guard`).
//!
//! Each connection's writes are watched too ([`Watched`]): one whose writes have made
//! no progress for the stall timeout (its client stopped reading a stream) is closed.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

/// Which pool a connection's slot is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pool {
    General,
    /// Kept for the operator: a request in it that is not the operator's is refused.
    Reserve,
}

/// One connection, as the slots and its requests see it (each request carries it in its
/// extensions).
#[derive(Debug)]
pub(super) struct Conn {
    id: u64,
    pub(super) pool: Pool,
    opened: Instant,
    /// Whether it has sent a whole request head: until then another may take its slot.
    proven: AtomicBool,
    /// Closes the connection (taken by a newer one, or its client stopped reading).
    pub(super) close: CancellationToken,
    /// Milliseconds after `opened` since which every write has waited (0: none waits).
    blocked_since: AtomicU64,
}

impl Conn {
    /// The connection sent a request head: its slot is its own until it closes.
    pub(super) fn proven(&self) {
        self.proven.store(true, Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// How long its writes have waited for the client to read, if they wait.
    pub(super) fn blocked_for(&self) -> Option<Duration> {
        match self.blocked_since.load(Ordering::Relaxed) {
            0 => None,
            since => Some(Duration::from_millis(self.now_ms().saturating_sub(since))),
        }
    }

    fn write_waits(&self) {
        let now = self.now_ms();
        let _ = self
            .blocked_since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    fn write_moved(&self) {
        self.blocked_since.store(0, Ordering::Relaxed);
    }
}

/// The slots of one listener.
pub(super) struct Slots {
    general: usize,
    reserve: usize,
    conns: Mutex<Vec<Arc<Conn>>>,
    next: AtomicU64,
}

/// A connection's slot, given back when dropped.
pub(super) struct Slot {
    slots: Arc<Slots>,
    pub(super) conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let id = self.conn.id;
        self.slots.lock().retain(|c| c.id != id);
    }
}

impl Slots {
    pub(super) fn new(general: usize, reserve: usize) -> Arc<Slots> {
        Arc::new(Slots {
            general,
            reserve,
            conns: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection: a free general one; else the general slot of the
    /// oldest unproven connection; else a free reserve one; else the reserve slot of the
    /// oldest unproven one. `None`: every slot is held by a proven connection.
    pub(super) fn admit(self: &Arc<Slots>) -> Option<Slot> {
        let mut conns = self.lock();
        let used = |conns: &Vec<Arc<Conn>>, pool| conns.iter().filter(|c| c.pool == pool).count();
        // The general pool first, the reserve last; in each, a free slot or else an
        // unproven connection's.
        let pool = [Pool::General, Pool::Reserve].into_iter().find(|&pool| {
            let size = match pool {
                Pool::General => self.general,
                Pool::Reserve => self.reserve,
            };
            used(&conns, pool) < size || take_oldest_unproven(&mut conns, pool)
        })?;
        let conn = Arc::new(Conn {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            pool,
            opened: Instant::now(),
            proven: AtomicBool::new(false),
            close: CancellationToken::new(),
            blocked_since: AtomicU64::new(0),
        });
        conns.push(conn.clone());
        Some(Slot {
            slots: self.clone(),
            conn,
        })
    }
}

/// Closes the oldest unproven connection of `pool` and frees its slot; false if there
/// is none.
fn take_oldest_unproven(conns: &mut Vec<Arc<Conn>>, pool: Pool) -> bool {
    let oldest = conns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.pool == pool && !c.proven.load(Ordering::Relaxed))
        .min_by_key(|(_, c)| c.opened)
        .map(|(i, _)| i);
    match oldest {
        Some(i) => {
            let taken = conns.swap_remove(i);
            taken.close.cancel();
            true
        }
        None => false,
    }
}

/// A connection's socket with the bytes read from it before it was served (its request
/// head, read while it waited for a slot) given back first.
pub(super) struct Prefixed<S> {
    pub(super) prefix: bytes::Bytes,
    pub(super) inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connection's socket, noting in its [`Conn`] when writes wait for the client.
pub(super) struct Watched<S> {
    pub(super) inner: S,
    pub(super) conn: Arc<Conn>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> Watched<S> {
    fn note<T>(&self, polled: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        match &polled {
            Poll::Pending => self.conn.write_waits(),
            Poll::Ready(_) => self.conn.write_moved(),
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn unproven_connections_give_way_and_the_reserve_comes_last() {
        let slots = Slots::new(2, 1);
        let a = slots.admit().unwrap();
        let b = slots.admit().unwrap();
        assert_eq!((a.conn.pool, b.conn.pool), (Pool::General, Pool::General));
        b.conn.proven();
        // a is unproven: the next one takes its general slot, and a is closed.
        let c = slots.admit().unwrap();
        assert_eq!(c.conn.pool, Pool::General);
        assert!(a.conn.close.is_cancelled());
        c.conn.proven();
        // Every general slot proven: the reserve.
        let d = slots.admit().unwrap();
        assert_eq!(d.conn.pool, Pool::Reserve);
        d.conn.proven();
        assert!(slots.admit().is_none(), "every slot is proven");
        drop(b);
        assert_eq!(slots.admit().unwrap().conn.pool, Pool::General);
        // The closed one's slot was given already: dropping it frees nothing more.
        drop(a);
        assert_eq!(slots.lock().len(), 2);
    }
}
