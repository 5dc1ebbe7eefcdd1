//! [`Tokio`]: tokio's readiness API and timer as the shared node's runtime.

use std::future::Future;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use cohort_driver_core::node::Runtime;
use tokio::io::AsyncWrite;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// tokio's runtime for `cohort_driver_core::node::Node`: tokio sockets
/// through their readiness API (readiness is cached and cleared when a
/// `try_*` call would block), a `Sleep` reset to each deadline, and
/// `tokio::spawn`.
#[derive(Debug, Clone, Copy)]
pub struct Tokio;

impl Runtime for Tokio {
    type Stream = TcpStream;
    type Listener = TcpListener;
    type Timer = Pin<Box<Sleep>>;

    fn listener(listener: std::net::TcpListener) -> io::Result<TcpListener> {
        TcpListener::from_std(listener)
    }

    fn poll_accept(
        listener: &TcpListener,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        listener.poll_accept(cx)
    }

    async fn resolve(addr: String) -> io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host(addr).await?.collect())
    }

    fn connect(addr: SocketAddr) -> impl Future<Output = io::Result<TcpStream>> + Send + 'static {
        TcpStream::connect(addr)
    }

    fn poll_read_ready(stream: &TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        stream.poll_read_ready(cx)
    }

    fn poll_write_ready(stream: &TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        stream.poll_write_ready(cx)
    }

    fn try_read(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        stream.try_read(buf)
    }

    fn try_write(stream: &TcpStream, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        stream.try_write_vectored(bufs)
    }

    /// tokio's `poll_shutdown` on a `TcpStream` is `shutdown(Write)` on the
    /// socket, done at once: it never waits, so no waker is needed.
    fn shutdown_write(stream: &mut TcpStream) -> io::Result<()> {
        match Pin::new(stream).poll_shutdown(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn set_nodelay(stream: &TcpStream) -> io::Result<()> {
        stream.set_nodelay(true)
    }

    fn timer() -> Self::Timer {
        // Only polled once set to a deadline.
        Box::pin(tokio::time::sleep(Duration::from_secs(24 * 3600)))
    }

    fn set_timer(timer: &mut Self::Timer, at: Instant) {
        timer.as_mut().reset(tokio::time::Instant::from_std(at));
    }

    fn poll_timer(timer: &mut Self::Timer, cx: &mut Context<'_>) -> Poll<()> {
        timer.as_mut().poll(cx)
    }

    fn spawn(task: impl Future<Output = ()> + Send + 'static) {
        tokio::spawn(task);
    }
}
